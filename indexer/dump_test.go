package indexer

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestDumpIsBreadthFirstAndReplayable(t *testing.T) {
	ix := NewIndex(4)
	a, b := wr(1, 0), wr(2, 3)
	for _, ev := range []Event{
		stored(a, TierDevice, nil, chain(100, prompt...)),
		stored(a, TierHost, nil, chain(100, prompt[:8]...)),
		stored(b, TierDisk, nil, chain(500, prompt[:12]...)),
		removed(a, TierDevice, 102), // a's block 3 becomes device-unreachable
	} {
		if _, err := ix.Apply(ev); err != nil {
			t.Fatal(err)
		}
	}
	events := ix.Dump()
	// Parents before children: every event's parent was stored earlier.
	seen := map[WorkerRank]map[uint64]bool{}
	for i, ev := range events {
		if ev.Kind != Stored || len(ev.Blocks) != 1 || !ev.Tier.single() {
			t.Fatalf("event %d is not a one-block stored event: %+v", i, ev)
		}
		if seen[ev.Worker] == nil {
			seen[ev.Worker] = map[uint64]bool{}
		}
		if ev.HasParent && !seen[ev.Worker][ev.Parent] {
			t.Fatalf("event %d comes before its parent %d", i, ev.Parent)
		}
		seen[ev.Worker][ev.Blocks[0].ID] = true
	}
	loaded := NewIndex(4)
	if skipped, err := loaded.Load(events); err != nil || skipped != 0 {
		t.Fatalf("load: %d, %v", skipped, err)
	}
	for n := 0; n <= len(prompt); n += 4 {
		if got, want := trees(t, loaded, loaded.MatchTokens(prompt[:n], "", nil)), trees(t, ix, ix.MatchTokens(prompt[:n], "", nil)); !slices.Equal(got, want) {
			t.Fatalf("prefix %d: loaded %v, original %v", n, got, want)
		}
	}
	// Block 103 of a is an orphan (its parent 102 was evicted): it cannot be
	// dumped, so the loaded a holds one block less.
	if got, want := loaded.BlockCounts(), map[WorkerRank]int{a: 2, b: 3}; !mapsEqual(got, want) {
		t.Fatalf("block counts %v, want %v", got, want)
	}
	if ix.BlockCounts()[a] != 3 {
		t.Fatalf("original holds %d blocks", ix.BlockCounts()[a])
	}
}

func TestDumpJSONShape(t *testing.T) {
	ix := NewIndex(2)
	local := LocalHashes(nil, []uint32{1, 2, 3, 4}, 2, BaseSeed, nil)
	big := uint64(1) << 63
	if _, err := ix.Apply(stored(wr(7, 1), TierHost, nil, []Block{{ID: big, Local: local[0]}, {ID: 5, Local: local[1]}})); err != nil {
		t.Fatal(err)
	}
	data, err := MarshalDump([]IndexDump{{Key: Key{"org/m:v1", "default"}, BlockSize: 2, Events: ix.Dump()}})
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]struct {
		BlockSize int `json:"block_size"`
		Events    []struct {
			WorkerID    uint64 `json:"worker_id"`
			StorageTier string `json:"storage_tier"`
			Event       struct {
				EventID uint64 `json:"event_id"`
				DPRank  uint32 `json:"dp_rank"`
				Data    struct {
					Stored struct {
						ParentHash *uint64 `json:"parent_hash"`
						Blocks     []struct {
							BlockHash  uint64 `json:"block_hash"`
							TokensHash uint64 `json:"tokens_hash"`
						} `json:"blocks"`
					} `json:"stored"`
				} `json:"data"`
			} `json:"event"`
		} `json:"events"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatalf("%v in %s", err, data)
	}
	d, ok := doc["org/m:v1:default"]
	if !ok || d.BlockSize != 2 || len(d.Events) != 2 {
		t.Fatalf("dump = %s", data)
	}
	e0, e1 := d.Events[0], d.Events[1]
	if e0.WorkerID != 7 || e0.Event.DPRank != 1 || e0.StorageTier != "host_pinned" || e0.Event.Data.Stored.ParentHash != nil ||
		e0.Event.Data.Stored.Blocks[0].BlockHash != big || e0.Event.Data.Stored.Blocks[0].TokensHash != local[0] {
		t.Fatalf("first event: %+v", e0)
	}
	if p := e1.Event.Data.Stored.ParentHash; p == nil || *p != big || e1.Event.EventID != 1 {
		t.Fatalf("second event: %+v", e1)
	}
}

func TestUnmarshalDump(t *testing.T) {
	const good = `{"m:default": {"block_size": 2, "events": [
		{"worker_id": 1, "storage_tier": "device", "event": {"event_id": 0, "dp_rank": 0,
			"data": {"stored": {"parent_hash": null, "blocks": [{"block_hash": -1, "tokens_hash": 18446744073709551615}]}}}},
		{"worker_id": 1, "event": {"event_id": 1, "dp_rank": 0,
			"data": {"stored": {"parent_hash": "18446744073709551615", "blocks": [{"block_hash": 2, "tokens_hash": -9223372036854775808}]}}}},
		{"worker_id": 1, "storage_tier": "disk", "event": {"event_id": 2, "data": {"removed": {"block_hashes": [2]}}}},
		{"worker_id": 1, "event": {"event_id": 3, "data": "cleared"}},
		{"worker_id": 1, "storage_tier": "host_pinned", "event": {"event_id": 4, "data": "Cleared"}, "unknown_field": 1}
	]}}`
	dumps, err := UnmarshalDump([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	evs := dumps[0].Events
	if len(dumps) != 1 || dumps[0].Key != (Key{"m", "default"}) || len(evs) != 5 {
		t.Fatalf("dumps = %+v", dumps)
	}
	max := ^uint64(0)
	if evs[0].Blocks[0] != (Block{ID: max, Local: max}) || evs[0].HasParent {
		t.Errorf("event 0 = %+v", evs[0])
	}
	if !evs[1].HasParent || evs[1].Parent != max || evs[1].Blocks[0].Local != 1<<63 || evs[1].Tier != TierDevice {
		t.Errorf("event 1 = %+v", evs[1])
	}
	if evs[2].Kind != Removed || evs[2].Tier != TierDisk || !slices.Equal(evs[2].IDs, []uint64{2}) {
		t.Errorf("event 2 = %+v", evs[2])
	}
	if evs[3].Kind != Cleared || evs[3].Tier != AllTiers || evs[4].Kind != Cleared || evs[4].Tier != TierHost {
		t.Errorf("cleared events = %+v, %+v", evs[3], evs[4])
	}
	// It round-trips through MarshalDump.
	again, err := MarshalDump(dumps)
	if err != nil {
		t.Fatal(err)
	}
	dumps2, err := UnmarshalDump(again)
	if err != nil || !slices.EqualFunc(dumps2[0].Events, evs, eventsEqual) {
		t.Fatalf("round trip: %v\n%s", err, again)
	}

	bad := []struct{ name, in, msg string }{
		{"not json", `{`, "decode dump"},
		{"trailing data", `{} {}`, "trailing"},
		{"bad key", `{"nokey": {"block_size": 2, "events": []}}`, "model:tenant"},
		{"zero block size", `{"m:t": {"block_size": 0, "events": []}}`, "block_size"},
		{"block size over the bound", `{"m:t": {"block_size": 65537, "events": []}}`, "block_size 65537 out of range 1..65536"},
		{"unknown tier", `{"m:t": {"block_size": 2, "events": [{"worker_id": 1, "storage_tier": "tape", "event": {"data": "cleared"}}]}}`, "tape"},
		{"no data", `{"m:t": {"block_size": 2, "events": [{"worker_id": 1, "event": {"event_id": 0, "data": {}}}]}}`, "none of"},
		{"unknown data string", `{"m:t": {"block_size": 2, "events": [{"worker_id": 1, "event": {"data": "exploded"}}]}}`, "exploded"},
		{"float hash", `{"m:t": {"block_size": 2, "events": [{"worker_id": 1, "event": {"data": {"removed": {"block_hashes": [1.5]}}}}]}}`, "not a 64-bit integer"},
		{"hash too large", `{"m:t": {"block_size": 2, "events": [{"worker_id": 1, "event": {"data": {"removed": {"block_hashes": [18446744073709551616]}}}}]}}`, "not a 64-bit integer"},
		{"cleared only as a value", `{"m:t": {"block_size": 2, "events": [{"worker_id": 1, "event": {"data": {"note": "cleared"}}}]}}`, "none of"},
		{"negative worker", `{"m:t": {"block_size": 2, "events": [{"worker_id": -1, "event": {"data": "cleared"}}]}}`, "worker_id"},
	}
	for _, tt := range bad {
		if _, err := UnmarshalDump([]byte(tt.in)); err == nil || !strings.Contains(err.Error(), tt.msg) {
			t.Errorf("%s: err = %v, want it to mention %q", tt.name, err, tt.msg)
		}
	}
}

// TestUnmarshalDumpLeavesOutBadIndexes: an invalid index of a dump is left
// out with a *DumpError naming it; the valid ones are returned.
func TestUnmarshalDumpLeavesOutBadIndexes(t *testing.T) {
	const in = `{"huge:default": {"block_size": 9223372036854775807, "events": []},
		"ok:default": {"block_size": 2, "events": [{"worker_id": 1, "event": {"data": "cleared"}}]},
		"badevent:t": {"block_size": 2, "events": [{"worker_id": 1, "event": {"data": {}}}]},
		"nokey": {"block_size": 2, "events": []}}`
	dumps, err := UnmarshalDump([]byte(in))
	if len(dumps) != 1 || dumps[0].Key != (Key{"ok", "default"}) || len(dumps[0].Events) != 1 {
		t.Errorf("dumps %+v, want ok:default alone", dumps)
	}
	var names []string
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		var de *DumpError
		if !errors.As(e, &de) {
			t.Fatalf("%v is not a *DumpError", e)
		}
		names = append(names, de.Index)
	}
	if want := []string{"badevent:t", "huge:default", "nokey"}; !slices.Equal(names, want) {
		t.Errorf("left out %v, want %v (err %v)", names, want, err)
	}
	if !strings.Contains(err.Error(), "block_size 9223372036854775807") {
		t.Errorf("err %v does not say why huge:default was left out", err)
	}
	if _, err := UnmarshalDump([]byte(`[]`)); err == nil || errors.As(err, new(*DumpError)) {
		t.Errorf("not a dump: err %v, want a document error", err)
	}
}

func TestMarshalDumpClearedTiers(t *testing.T) {
	w := wr(3, 1)
	in := []Event{
		{Kind: Cleared, Worker: w, Tier: TierDevice | TierDisk},
		{Kind: Cleared, Worker: w, Tier: AllTiers},
		{Kind: Cleared, Worker: w, Tier: TierHost},
	}
	data, err := MarshalDump([]IndexDump{{Key: Key{"m", "t"}, BlockSize: 4, Events: in}})
	if err != nil {
		t.Fatal(err)
	}
	dumps, err := UnmarshalDump(data)
	if err != nil {
		t.Fatalf("%v in %s", err, data)
	}
	var got []Tier
	for _, ev := range dumps[0].Events {
		if ev.Kind != Cleared || ev.Worker != w {
			t.Fatalf("event %+v", ev)
		}
		got = append(got, ev.Tier)
	}
	if want := []Tier{TierDevice, TierDisk, AllTiers, TierHost}; !slices.Equal(got, want) {
		t.Fatalf("tiers %v, want %v", got, want)
	}
	// The object spelling {"cleared": ...} is accepted too.
	obj := `{"m:t": {"block_size": 4, "events": [{"worker_id": 3, "event": {"dp_rank": 1, "data": {"cleared": {}}}}]}}`
	if d, err := UnmarshalDump([]byte(obj)); err != nil || d[0].Events[0].Kind != Cleared || d[0].Events[0].Tier != AllTiers {
		t.Fatalf("object form: %+v, %v", d, err)
	}
}

func eventsEqual(a, b Event) bool {
	return a.Kind == b.Kind && a.Worker == b.Worker && a.Tier == b.Tier && a.Parent == b.Parent &&
		a.HasParent == b.HasParent && slices.Equal(a.Blocks, b.Blocks) && slices.Equal(a.IDs, b.IDs)
}

func TestSetDumpLoad(t *testing.T) {
	src := NewSet(Options{})
	defer src.Close()
	a, _ := src.Index(Key{"m", "t1"}, 4)
	b, _ := src.Index(Key{"m", "t2"}, 4)
	a.Apply(stored(wr(1, 0), TierDevice, nil, chain(1, prompt...)))
	b.Apply(stored(wr(2, 0), TierHost, nil, chain(1, prompt[:8]...)))
	data, err := MarshalDump(src.Dump())
	if err != nil {
		t.Fatal(err)
	}
	dumps, err := UnmarshalDump(data)
	if err != nil {
		t.Fatal(err)
	}
	dst := NewSet(Options{})
	defer dst.Close()
	if skipped, err := dst.Load(dumps); err != nil || skipped != 0 {
		t.Fatalf("load: %d, %v", skipped, err)
	}
	for _, k := range src.Keys() {
		if got, want := trees(t, dst.Lookup(k), dst.Lookup(k).MatchTokens(prompt, "", nil)), trees(t, src.Lookup(k), src.Lookup(k).MatchTokens(prompt, "", nil)); !slices.Equal(got, want) {
			t.Errorf("%s: %v, want %v", k, got, want)
		}
	}
	// A dump whose block size conflicts with an existing index fails.
	dumps[0].BlockSize = 8
	if _, err := dst.Load(dumps); err == nil {
		t.Error("conflicting block size loaded")
	}
}

// FuzzUnmarshalDump feeds arbitrary bytes to the dump decoder (a peer's
// /dump is outside input): it must never panic, and whatever it accepts must
// load into a Set without panicking and re-encode to something it accepts.
func FuzzUnmarshalDump(f *testing.F) {
	ix := NewIndex(4)
	ix.Apply(stored(wr(1, 0), TierDevice, nil, chain(1, prompt...)))
	ix.Apply(stored(wr(2, 1), TierDisk, nil, chain(1, prompt[:8]...)))
	seed, _ := MarshalDump([]IndexDump{{Key: Key{"m", "default"}, BlockSize: 4, Events: ix.Dump()}})
	f.Add(seed)
	f.Add([]byte(`{"m:t": {"block_size": 2, "events": [{"worker_id": 1, "event": {"data": "cleared"}}]}}`))
	f.Add([]byte(`{"a:b:c": {"block_size": 1, "events": [{"worker_id": 3, "storage_tier": "cpu", "event": {"data": {"removed": {"block_hashes": [-5, "7"]}}}}]}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		dumps, err := UnmarshalDump(data)
		if err != nil {
			return
		}
		s := NewSet(Options{EventThreads: 1})
		defer s.Close()
		if _, err := s.Load(dumps); err != nil {
			return
		}
		out, err := MarshalDump(s.Dump())
		if err != nil {
			t.Fatalf("marshal: %v", err)
		}
		if _, err := UnmarshalDump(out); err != nil && !bytes.Equal(out, []byte("{}")) {
			t.Fatalf("re-encoded dump rejected: %v\n%s", err, out)
		}
	})
}
