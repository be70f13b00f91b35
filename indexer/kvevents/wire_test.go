package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/indexer"
	"github.com/zeebo/xxh3"
)

// mp builds msgpack bytes by hand, so the decoder's tests do not depend on
// an encoder library's choices.
type mp []byte

func (b mp) arr(n int) mp {
	switch {
	case n < 16:
		return append(b, 0x90|byte(n))
	case n < 1<<16:
		return binary.BigEndian.AppendUint16(append(b, 0xdc), uint16(n))
	}
	return binary.BigEndian.AppendUint32(append(b, 0xdd), uint32(n))
}

func (b mp) mapN(n int) mp {
	if n < 16 {
		return append(b, 0x80|byte(n))
	}
	return binary.BigEndian.AppendUint16(append(b, 0xde), uint16(n))
}

func (b mp) str(s string) mp {
	switch {
	case len(s) < 32:
		b = append(b, 0xa0|byte(len(s)))
	case len(s) < 256:
		b = append(b, 0xd9, byte(len(s)))
	default:
		b = binary.BigEndian.AppendUint16(append(b, 0xda), uint16(len(s)))
	}
	return append(b, s...)
}

func (b mp) bin(p []byte) mp { return append(append(b, 0xc4, byte(len(p))), p...) }
func (b mp) nil() mp         { return append(b, 0xc0) }
func (b mp) f64(f float64) mp {
	return binary.BigEndian.AppendUint64(append(b, 0xcb), math.Float64bits(f))
}

func (b mp) uint(v uint64) mp {
	switch {
	case v < 128:
		return append(b, byte(v))
	case v < 256:
		return append(b, 0xcc, byte(v))
	case v < 1<<16:
		return binary.BigEndian.AppendUint16(append(b, 0xcd), uint16(v))
	case v < 1<<32:
		return binary.BigEndian.AppendUint32(append(b, 0xce), uint32(v))
	}
	return binary.BigEndian.AppendUint64(append(b, 0xcf), v)
}

func (b mp) int(v int64) mp {
	if v >= 0 {
		return b.uint(uint64(v))
	}
	if v >= -32 {
		return append(b, byte(int8(v)))
	}
	return binary.BigEndian.AppendUint64(append(b, 0xd3), uint64(v))
}

func (b mp) uints(vs ...uint64) mp {
	b = b.arr(len(vs))
	for _, v := range vs {
		b = b.uint(v)
	}
	return b
}

func (b mp) tokens(ts []uint32) mp {
	b = b.arr(len(ts))
	for _, t := range ts {
		b = b.uint(uint64(t))
	}
	return b
}

func seqTokens(start, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(start + i)
	}
	return out
}

const big1 = uint64(1)<<63 + 12345 // an id above MaxInt64: msgpack 0xcf

func TestDecodeVariants(t *testing.T) {
	toks := seqTokens(100, 8)
	storedArray := mp{}.arr(9).str("BlockStored").uints(big1, 7).nil().tokens(toks).uint(4).nil().str("CPU").str("adapter").
		arr(2).nil().arr(2).uint(99).str("salt")
	storedMap := mp{}.mapN(8).str("type").str("BlockStored").str("block_hashes").uints(1, 2).str("parent_block_hash").uint(big1).
		str("token_ids").tokens(toks).str("block_size").uint(4).str("medium").str("DISK").
		str("future_field").mapN(1).str("x").arr(2).uint(1).nil().str("lora_name").nil()
	removedArray := mp{}.arr(3).str("BlockRemoved").uints(7).str("GPU")
	removedMap := mp{}.mapN(3).str("type").str("BlockRemoved").str("block_hashes").uints(big1).str("medium").str("cpu_pinned")
	cleared := mp{}.arr(1).str("AllBlocksCleared")
	clearedMap := mp{}.mapN(1).str("type").str("AllBlocksCleared")

	type want struct {
		rank    uint32
		hasRank bool
		events  []wireEvent
	}
	storedArrayEv := wireEvent{Kind: wireStored, Tier: indexer.TierHost, IDs: []uint64{big1, 7}, Tokens: toks, BlockSize: 4,
		LoRA: "adapter", Extra: [][]uint64{nil, {99, xxh3.HashString("salt")}}}
	storedMapEv := wireEvent{Kind: wireStored, Tier: indexer.TierDisk, IDs: []uint64{1, 2}, Parent: big1, HasParent: true, Tokens: toks, BlockSize: 4}
	tests := []struct {
		name    string
		payload mp
		want    want
	}{
		{"three-element array batch, mixed event forms",
			mp{}.arr(3).f64(1.5).arr(6).raw(storedArray).raw(storedMap).raw(removedArray).raw(removedMap).raw(cleared).raw(clearedMap).uint(2),
			want{2, true, []wireEvent{storedArrayEv, storedMapEv,
				{Kind: wireRemoved, Tier: indexer.TierDevice, IDs: []uint64{7}},
				{Kind: wireRemoved, Tier: indexer.TierHost, IDs: []uint64{big1}},
				{Kind: wireCleared, Tier: indexer.AllTiers}, {Kind: wireCleared, Tier: indexer.AllTiers}}}},
		{"two-element batch (older engines)",
			mp{}.arr(2).f64(1).arr(1).raw(removedArray),
			want{0, false, []wireEvent{{Kind: wireRemoved, Tier: indexer.TierDevice, IDs: []uint64{7}}}}},
		{"nil rank",
			mp{}.arr(3).f64(1).arr(0).nil(),
			want{0, false, nil}},
		{"map batch with data_parallel_rank",
			mp{}.mapN(3).str("ts").f64(2).str("events").arr(1).raw(cleared).str("data_parallel_rank").uint(3),
			want{3, true, []wireEvent{{Kind: wireCleared, Tier: indexer.AllTiers}}}},
		{"map batch with SGLang's attn_dp_rank and an unknown key",
			mp{}.mapN(4).str("attn_dp_rank").uint(1).str("new").arr(1).nil().str("events").arr(0).str("ts").uint(5),
			want{1, true, nil}},
		{"extra trailing batch elements ignored",
			mp{}.arr(5).f64(1).arr(0).uint(0).str("future").nil(),
			want{0, true, nil}},
		{"SGLang negative int64 hashes",
			mp{}.arr(3).f64(1).arr(1).arr(6).str("BlockStored").arr(2).int(-5).int(-1 << 62).int(-7).tokens(toks).uint(4).nil().uint(0),
			want{0, true, []wireEvent{{Kind: wireStored, Tier: indexer.TierDevice, IDs: []uint64{uint64(1<<64 - 5), uint64(1<<64 - 1<<62)},
				Parent: uint64(1<<64 - 7), HasParent: true, Tokens: toks, BlockSize: 4}}}},
		{"bytes hashes: last 8 bytes big-endian",
			mp{}.arr(2).f64(1).arr(1).arr(3).str("BlockRemoved").arr(2).bin(append(make([]byte, 24), 0, 0, 0, 0, 0, 0, 1, 2)).bin([]byte{3}).nil(),
			want{0, false, []wireEvent{{Kind: wireRemoved, Tier: indexer.TierDevice, IDs: []uint64{0x0102, 3}}}}},
		{"trimmed array event: defaults for missing fields",
			mp{}.arr(2).f64(1).arr(1).arr(4).str("BlockStored").uints(5).nil().tokens(toks[:4]),
			want{0, false, []wireEvent{{Kind: wireStored, Tier: indexer.TierDevice, IDs: []uint64{5}, Tokens: toks[:4]}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := mustDecode(t, tt.payload)
			if b.Rank != tt.want.rank || b.HasRank != tt.want.hasRank {
				t.Errorf("rank = %d,%v, want %d,%v", b.Rank, b.HasRank, tt.want.rank, tt.want.hasRank)
			}
			checkEvents(t, b.Events, tt.want.events)
		})
	}
}

func (b mp) raw(p mp) mp { return append(b, p...) }

// mustDecode decodes msg with a fresh decoder, failing the test on error.
func mustDecode(t *testing.T, msg []byte) wireBatch {
	t.Helper()
	var d decoder
	b, err := d.Decode(msg)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func checkEvents(t *testing.T, got, want []wireEvent) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d events, want %d: %+v", len(got), len(want), got)
	}
	for i := range got {
		g, w := got[i], want[i]
		g.kindSet = false
		if len(g.Tokens) == 0 {
			g.Tokens = nil
		}
		if len(g.IDs) == 0 {
			g.IDs = nil
		}
		if fmt.Sprint(g) != fmt.Sprint(w) {
			t.Errorf("event %d:\n got %+v\nwant %+v", i, g, w)
		}
	}
}

func TestDecodeHybridAndExtraKeys(t *testing.T) {
	mmHash := strings.Repeat("ab", 32) // 64 hex digits
	stored := func(fields ...func(mp) mp) mp {
		b := mp{}.mapN(3 + len(fields)).str("type").str("BlockStored").str("block_hashes").uints(1).str("token_ids").tokens(seqTokens(0, 4))
		for _, f := range fields {
			b = f(b)
		}
		return mp{}.arr(2).f64(0).arr(1).raw(b)
	}
	tests := []struct {
		name  string
		msg   mp
		skip  string
		extra [][]uint64
	}{
		{"group 0 indexed", stored(func(b mp) mp { return b.str("group_idx").uint(0) }), "", nil},
		{"group 1 ignored", stored(func(b mp) mp { return b.str("group_idx").uint(1) }), skipOtherGroup, nil},
		{"sliding window ignored", stored(func(b mp) mp { return b.str("kv_cache_spec_kind").str("sliding_window") }), skipOtherGroup, nil},
		{"kind decides over group, either order",
			stored(func(b mp) mp { return b.str("kv_cache_spec_kind").str("mla_attention") }, func(b mp) mp { return b.str("group_idx").uint(2) }), "", nil},
		{"kind decides over group",
			stored(func(b mp) mp { return b.str("group_idx").uint(2) }, func(b mp) mp { return b.str("kv_cache_spec_kind").str("full_attention") }), "", nil},
		{"remote locality ignored", stored(func(b mp) mp { return b.str("locality").str("REMOTE") }), skipRemote, nil},
		{"local locality indexed", stored(func(b mp) mp { return b.str("locality").str("LOCAL") }), "", nil},
		{"extra keys: mm hash, [id, offset], int, salt, nil block",
			stored(func(b mp) mp {
				return b.str("extra_keys").arr(3).arr(3).str(mmHash).arr(2).str("img-1").uint(17).int(-2).nil().arr(1).str("salt")
			}),
			"", [][]uint64{{0xabababababababab, xxh3.HashString("img-1"), uint64(1<<64 - 2)}, nil, {xxh3.HashString("salt")}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := mustDecode(t, tt.msg)
			ev := b.Events[0]
			if ev.Skip != tt.skip {
				t.Errorf("skip = %q, want %q", ev.Skip, tt.skip)
			}
			if fmt.Sprint(ev.Extra) != fmt.Sprint(tt.extra) {
				t.Errorf("extra = %v, want %v", ev.Extra, tt.extra)
			}
		})
	}
}

func TestDecodeMooncake(t *testing.T) {
	toks := seqTokens(0, 4)
	key := func(s string) uint64 { return xxh3.HashString(s) }
	tests := []struct {
		name string
		msg  mp
		want []wireEvent
	}{
		{"conductor array form, memory replica, hex and empty hash strings",
			mp{}.arr(2).f64(1).arr(1).arr(8).str("BlockStoreEvent").str("k1").arr(1).arr(2).str("memory").str("10.0.0.1:1234").
				str("model").uint(4).str("0x41").str("").tokens(toks),
			[]wireEvent{{Kind: wireStored, Tier: indexer.TierHost, IDs: []uint64{0x41}, Tokens: toks, BlockSize: 4, Object: key("k1"), HasObject: true}}},
		{"disk replica, decimal parent, opaque hash string",
			mp{}.arr(2).f64(1).arr(1).arr(8).str("BlockStoreEvent").str("k2").arr(1).arr(2).str("disk").str("/mnt/x").
				nil().uint(4).str("blk-a").str("12345").tokens(toks),
			[]wireEvent{{Kind: wireStored, Tier: indexer.TierDisk, IDs: []uint64{key("blk-a")}, Parent: 12345, HasParent: true, Tokens: toks, BlockSize: 4, Object: key("k2"), HasObject: true}}},
		{"update and remove all",
			mp{}.arr(2).f64(1).arr(2).arr(3).str("BlockUpdateEvent").str("k1").arr(2).arr(2).str("memory").str("a").arr(2).str("local_disk").str("b").
				arr(1).str("RemoveAllEvent"),
			[]wireEvent{{Kind: wireMoved, Tier: indexer.TierHost | indexer.TierDisk, Object: key("k1"), HasObject: true}, {Kind: wireCleared, Tier: indexer.TierHost | indexer.TierDisk}}},
		{"update to no replicas",
			mp{}.arr(2).f64(1).arr(1).arr(3).str("BlockUpdateEvent").str("k1").arr(0),
			[]wireEvent{{Kind: wireMoved, Tier: 0, Object: key("k1"), HasObject: true}}},
		{"store publisher maps: ids only, medium, legacy copies",
			mp{}.arr(3).uint(1700000000000).arr(3).
				mapN(9).str("event_id").uint(1).str("timestamp").uint(1700000000000).str("event_type").str("stored").str("type").str("BlockStored").
				str("medium").str("disk").str("seq_hashes").uints(big1).str("block_hashes").uints(big1).str("token_ids").nil().str("parent_hash").nil().
				mapN(4).str("event_type").str("removed").str("medium").str("cpu").str("seq_hashes").uints(9).str("block_hashes").uints(9).
				mapN(2).str("event_type").str("cleared").str("medium").nil().
				uint(0),
			[]wireEvent{{Kind: wireStored, Tier: indexer.TierDisk, IDs: []uint64{big1}}, {Kind: wireRemoved, Tier: indexer.TierHost, IDs: []uint64{9}},
				{Kind: wireCleared, Tier: indexer.TierHost | indexer.TierDisk}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := mustDecode(t, tt.msg)
			checkEvents(t, b.Events, tt.want)
		})
	}
}

func TestDecodeErrors(t *testing.T) {
	tests := []struct {
		name string
		msg  mp
		want string
	}{
		{"empty", mp{}, "event batch"},
		{"scalar", mp{}.uint(1), "event batch"},
		{"short batch", mp{}.arr(1).f64(1), "at least 2"},
		{"events not a list", mp{}.arr(2).f64(1).str("x"), "events"},
		{"unknown event type", mp{}.arr(2).f64(1).arr(1).arr(1).str("BlockMoved"), "unknown event type"},
		{"event type not a string", mp{}.arr(2).f64(1).arr(1).arr(1).uint(3), "event type"},
		{"map event without type", mp{}.arr(2).f64(1).arr(1).mapN(1).str("block_hashes").arr(0), "no \"type\""},
		{"token id out of range", mp{}.arr(2).f64(1).arr(1).arr(4).str("BlockStored").uints(1).nil().arr(1).int(-1), "token id"},
		{"hash of wrong type", mp{}.arr(2).f64(1).arr(1).arr(2).str("BlockRemoved").arr(1).f64(1), "block hash"},
		{"truncated array", mp{}.arr(2).f64(1).arr(3), "truncated"},
		{"huge length prefix", mp{}.arr(2).f64(1).raw(mp{0xdd, 0xff, 0xff, 0xff, 0xff}), "truncated"},
		{"trailing bytes", mp{}.arr(2).f64(1).arr(0).uint(1), "trailing"},
		{"map batch without events", mp{}.mapN(1).str("ts").f64(1), "no \"events\""},
		{"negative rank", mp{}.arr(3).f64(1).arr(0).int(-1), "rank"},
		{"non-string map key", mp{}.arr(2).f64(1).arr(1).mapN(1).uint(1).uint(1), "map key"},
		{"update without key", mp{}.arr(2).f64(1).arr(1).arr(1).str("BlockUpdateEvent"), "mooncake_key"},
		{"deep nesting in unknown field", deepNest(200), "deeper"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var d decoder
			_, err := d.Decode(tt.msg)
			if err == nil {
				t.Fatal("no error")
			}
			if !errors.Is(err, errDecode) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q, want errDecode mentioning %q", err, tt.want)
			}
		})
	}
}

func deepNest(depth int) mp {
	b := mp{}.arr(2).f64(1).arr(1).mapN(2).str("type").str("AllBlocksCleared").str("x")
	for range depth {
		b = b.arr(1)
	}
	return b.nil()
}

func TestTierOfMedium(t *testing.T) {
	for medium, want := range map[string]indexer.Tier{
		"": indexer.TierDevice, "GPU": indexer.TierDevice, "NPU": indexer.TierDevice, "DEVICE": indexer.TierDevice, "TPU": indexer.TierDevice,
		"CPU": indexer.TierHost, "CPU_PINNED": indexer.TierHost, "cpu_tier1": indexer.TierHost,
		"DISK": indexer.TierDisk, "CPU_TIER2": indexer.TierDisk, "NVME": indexer.TierDisk, "STORAGE": indexer.TierDisk,
		"EXTERNAL": indexer.TierDisk, "NETWORK": indexer.TierDisk, "REMOTE": indexer.TierDisk, "SHARED": indexer.TierDisk,
	} {
		if got := tierOfMedium(medium); got != want {
			t.Errorf("tierOfMedium(%q) = %s, want %s", medium, got, want)
		}
	}
}

func TestParseReply(t *testing.T) {
	seq8 := func(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }
	ff := seq8(math.MaxUint64)
	tests := []struct {
		name    string
		frames  [][]byte
		seq     uint64
		payload string
		end, ok bool
	}{
		{"vLLM >= 0.26", [][]byte{{}, []byte("t"), seq8(5), []byte("p")}, 5, "p", false, true},
		{"vLLM >= 0.26 end", [][]byte{{}, {}, ff, {}}, math.MaxUint64, "", true, true},
		{"legacy", [][]byte{{}, seq8(6), []byte("q")}, 6, "q", false, true},
		{"legacy end", [][]byte{{}, ff, {}}, math.MaxUint64, "", true, true},
		{"empty payload ends", [][]byte{{}, seq8(9), {}}, 9, "", true, true},
		{"no delimiter", [][]byte{seq8(7), []byte("r")}, 7, "r", false, true},
		{"bad seq", [][]byte{{}, []byte("abc"), []byte("r")}, 0, "", false, false},
		{"one frame", [][]byte{seq8(1)}, 0, "", false, false},
	}
	for _, tt := range tests {
		seq, payload, end, ok := parseReply(tt.frames)
		if ok != tt.ok || (ok && (seq != tt.seq || string(payload) != tt.payload || end != tt.end)) {
			t.Errorf("%s: got %d %q %v %v", tt.name, seq, payload, end, ok)
		}
	}
}

// fuzzSeeds are real-format messages of every variant.
func fuzzSeeds() map[string]mp {
	toks := seqTokens(1, 16)
	return map[string]mp{
		"vllm_map": mp{}.arr(3).f64(1.7e9).arr(2).
			mapN(7).str("type").str("BlockStored").str("block_hashes").uints(big1, 2).str("parent_block_hash").nil().str("token_ids").tokens(toks).
			str("block_size").uint(8).str("medium").str("GPU").str("lora_name").nil().
			mapN(3).str("type").str("BlockRemoved").str("block_hashes").uints(big1).str("medium").str("GPU").uint(0),
		"vllm_array": mp{}.arr(3).f64(1.7e9).arr(3).arr(8).str("BlockStored").uints(1, 2).uint(9).tokens(toks).uint(8).nil().str("CPU").nil().
			arr(3).str("BlockRemoved").uints(1).str("CPU").arr(1).str("AllBlocksCleared").nil(),
		"sglang": mp{}.arr(3).f64(1).arr(1).arr(6).str("BlockStored").arr(1).int(-99).nil().tokens(toks[:8]).uint(8).nil().uint(1),
		"hybrid": mp{}.arr(2).f64(1).arr(1).arr(11).str("BlockStored").uints(1).nil().tokens(toks[:8]).uint(8).nil().nil().nil().
			arr(1).arr(2).str(strings.Repeat("0f", 32)).uint(0).uint(1).str("sliding_window"),
		"map_batch":      mp{}.mapN(3).str("ts").f64(1).str("events").arr(1).mapN(1).str("type").str("AllBlocksCleared").str("data_parallel_rank").uint(1),
		"mooncake_array": mp{}.arr(2).f64(1).arr(2).arr(8).str("BlockStoreEvent").str("key").arr(1).arr(2).str("disk").str("/p").str("m").uint(8).str("0x10").str("").tokens(toks[:8]).arr(3).str("BlockUpdateEvent").str("key").arr(0),
		"mooncake_maps": mp{}.arr(3).uint(1).arr(1).mapN(4).str("event_type").str("stored").str("medium").str("cpu").str("seq_hashes").uints(3).
			str("token_ids").nil().uint(0),
	}
}

// TestFuzzCorpus keeps testdata/fuzz/FuzzDecode in step with fuzzSeeds:
// KVGATE_UPDATE_CORPUS=1 rewrites it; otherwise every file must decode.
func TestFuzzCorpus(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzDecode")
	if os.Getenv("KVGATE_UPDATE_CORPUS") != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for name, msg := range fuzzSeeds() {
			body := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", []byte(msg))
			if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	names := slices.Sorted(maps.Keys(fuzzSeeds()))
	for _, name := range names {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Errorf("corpus file %s missing (run with KVGATE_UPDATE_CORPUS=1): %v", name, err)
		}
		var d decoder
		if _, err := d.Decode(fuzzSeeds()[name]); err != nil {
			t.Errorf("seed %s: %v", name, err)
		}
	}
}

func FuzzDecode(f *testing.F) {
	for _, msg := range fuzzSeeds() {
		f.Add([]byte(msg))
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		var d decoder
		b, err := d.Decode(payload)
		if err != nil {
			if !errors.Is(err, errDecode) {
				t.Fatalf("error %v does not wrap errDecode", err)
			}
			return
		}
		for _, ev := range b.Events {
			if ev.Kind < wireStored || ev.Kind > wireMoved {
				t.Fatalf("bad kind %d", ev.Kind)
			}
			if ev.Kind == wireStored && ev.Tier != indexer.TierDevice && ev.Tier != indexer.TierHost && ev.Tier != indexer.TierDisk && !ev.HasObject {
				t.Fatalf("stored event with tier %s", ev.Tier)
			}
		}
		// Decoding again with the reused buffers gives the same result.
		again, err := d.Decode(payload)
		if err != nil || fmt.Sprint(again) != fmt.Sprint(b) {
			t.Fatalf("second decode differs: %v", err)
		}
	})
}

func FuzzParseReply(f *testing.F) {
	f.Add([]byte{}, []byte("t"), binary.BigEndian.AppendUint64(nil, 3), []byte("p"))
	f.Add([]byte{}, []byte{}, binary.BigEndian.AppendUint64(nil, math.MaxUint64), []byte{})
	f.Fuzz(func(t *testing.T, a, b, c, d []byte) {
		for n := 0; n <= 4; n++ {
			frames := [][]byte{a, b, c, d}[:n]
			seq, payload, end, ok := parseReply(frames)
			if ok && !end && len(payload) == 0 {
				t.Fatalf("ok reply with empty payload not an end: %d", seq)
			}
		}
	})
}
