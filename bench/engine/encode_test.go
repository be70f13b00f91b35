package engine

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"reflect"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// decode decodes payload with vmihailenco's generic decoder and normalises
// integers: every integer that fits int64 becomes int64, larger ones uint64.
// Bin stays []byte and str stays string, so hash encodings stay apart.
func decode(t *testing.T, payload []byte) any {
	t.Helper()
	dec := msgpack.NewDecoder(bytes.NewReader(payload))
	v, err := dec.DecodeInterface()
	if err != nil {
		t.Fatalf("decode %x: %v", payload, err)
	}
	if _, err := dec.DecodeInterface(); err == nil {
		t.Fatalf("decode %x: trailing data", payload)
	}
	return normalize(v)
}

func normalize(v any) any {
	switch v := v.(type) {
	case int8:
		return int64(v)
	case int16:
		return int64(v)
	case int32:
		return int64(v)
	case uint8:
		return int64(v)
	case uint16:
		return int64(v)
	case uint32:
		return int64(v)
	case uint64:
		if v <= math.MaxInt64 {
			return int64(v)
		}
		return v
	case []any:
		for i := range v {
			v[i] = normalize(v[i])
		}
		return v
	case map[string]any:
		for k := range v {
			v[k] = normalize(v[k])
		}
		return v
	}
	return v
}

func ptr[T any](v T) *T { return &v }

const big = uint64(1)<<63 + 5 // a block id >= 2^63

func TestEncodeBatch(t *testing.T) {
	full := BlockStored{
		BlockHashes: []uint64{7, big},
		Parent:      ptr(uint64(3)),
		TokenIDs:    []uint32{1, 2, 3, 70000},
		BlockSize:   2,
		LoRAID:      ptr(4),
		Medium:      "CPU",
		LoRAName:    "sql",
		ExtraKeys:   []any{nil, []any{"mm", 9}},
		GroupIdx:    ptr(0),
	}
	minimal := BlockStored{BlockHashes: []uint64{1}, TokenIDs: []uint32{5, 6}, BlockSize: 2}
	fullMap := map[string]any{
		"type":              "BlockStored",
		"block_hashes":      []any{int64(7), big},
		"parent_block_hash": int64(3),
		"token_ids":         []any{int64(1), int64(2), int64(3), int64(70000)},
		"block_size":        int64(2),
		"lora_id":           int64(4),
		"medium":            "CPU",
		"lora_name":         "sql",
		"extra_keys":        []any{nil, []any{"mm", int64(9)}},
		"group_idx":         int64(0),
	}
	minimalMap := map[string]any{
		"type":              "BlockStored",
		"block_hashes":      []any{int64(1)},
		"parent_block_hash": nil,
		"token_ids":         []any{int64(5), int64(6)},
		"block_size":        int64(2),
		"lora_id":           nil,
		"medium":            nil,
		"lora_name":         nil,
	}
	bigVar := big
	negBig := int64(bigVar) // the same 64 bits, signed

	tests := []struct {
		name   string
		cfg    Config
		events []Event
		want   any
	}{
		{
			name:   "map full fields, rank",
			cfg:    Config{Rank: ptr(3)},
			events: []Event{full},
			want:   []any{1.5, []any{fullMap}, int64(3)},
		},
		{
			name:   "map minimal, nil rank",
			events: []Event{minimal},
			want:   []any{1.5, []any{minimalMap}, nil},
		},
		{
			name:   "map removed and cleared",
			events: []Event{BlockRemoved{BlockHashes: []uint64{big}, Medium: "GPU"}, BlockRemoved{BlockHashes: []uint64{}}, AllBlocksCleared{}},
			want: []any{1.5, []any{
				map[string]any{"type": "BlockRemoved", "block_hashes": []any{big}, "medium": "GPU"},
				map[string]any{"type": "BlockRemoved", "block_hashes": []any{}, "medium": nil},
				map[string]any{"type": "AllBlocksCleared"},
			}, nil},
		},
		{
			name:   "map pointer events",
			events: []Event{&BlockRemoved{BlockHashes: []uint64{2}}, &AllBlocksCleared{}},
			want: []any{1.5, []any{
				map[string]any{"type": "BlockRemoved", "block_hashes": []any{int64(2)}, "medium": nil},
				map[string]any{"type": "AllBlocksCleared"},
			}, nil},
		},
		{
			name:   "map omit defaults",
			cfg:    Config{OmitDefaults: true},
			events: []Event{minimal, BlockRemoved{BlockHashes: []uint64{1}}},
			want: []any{1.5, []any{
				map[string]any{"type": "BlockStored", "block_hashes": []any{int64(1)}, "token_ids": []any{int64(5), int64(6)}, "block_size": int64(2)},
				map[string]any{"type": "BlockRemoved", "block_hashes": []any{int64(1)}},
			}, nil},
		},
		{
			name:   "int64 hashes are negative above 2^63",
			cfg:    Config{HashEncoding: HashInt64},
			events: []Event{BlockStored{BlockHashes: []uint64{1, big}, Parent: ptr(big), TokenIDs: []uint32{}, BlockSize: 16}, BlockRemoved{BlockHashes: []uint64{big}}},
			want: []any{1.5, []any{
				map[string]any{"type": "BlockStored", "block_hashes": []any{int64(1), negBig}, "parent_block_hash": negBig, "token_ids": []any{}, "block_size": int64(16), "lora_id": nil, "medium": nil, "lora_name": nil},
				map[string]any{"type": "BlockRemoved", "block_hashes": []any{negBig}, "medium": nil},
			}, nil},
		},
		{
			name:   "bytes hashes",
			cfg:    Config{HashEncoding: HashBytes, Encoding: ArrayEncoding},
			events: []Event{BlockStored{BlockHashes: []uint64{big}, Parent: ptr(uint64(9)), TokenIDs: []uint32{1}, BlockSize: 1}},
			want: []any{1.5, []any{
				[]any{"BlockStored", []any{HashBytesOf(big)}, HashBytesOf(9), []any{int64(1)}, int64(1), nil, nil, nil},
			}, nil},
		},
		{
			name:   "array full fields",
			cfg:    Config{Encoding: ArrayEncoding, Rank: ptr(0)},
			events: []Event{full},
			want: []any{1.5, []any{
				[]any{"BlockStored", []any{int64(7), big}, int64(3), []any{int64(1), int64(2), int64(3), int64(70000)}, int64(2), int64(4), "CPU", "sql", []any{nil, []any{"mm", int64(9)}}, int64(0)},
			}, int64(0)},
		},
		{
			name:   "array minimal keeps eight elements",
			cfg:    Config{Encoding: ArrayEncoding},
			events: []Event{minimal},
			want: []any{1.5, []any{
				[]any{"BlockStored", []any{int64(1)}, nil, []any{int64(5), int64(6)}, int64(2), nil, nil, nil},
			}, nil},
		},
		{
			name:   "array group without extra keys",
			cfg:    Config{Encoding: ArrayEncoding},
			events: []Event{BlockStored{BlockHashes: []uint64{1}, TokenIDs: []uint32{5}, BlockSize: 1, GroupIdx: ptr(1)}},
			want: []any{1.5, []any{
				[]any{"BlockStored", []any{int64(1)}, nil, []any{int64(5)}, int64(1), nil, nil, nil, nil, int64(1)},
			}, nil},
		},
		{
			name:   "array extra keys without group",
			cfg:    Config{Encoding: ArrayEncoding},
			events: []Event{BlockStored{BlockHashes: []uint64{1}, TokenIDs: []uint32{5}, BlockSize: 1, ExtraKeys: []any{"salt"}}},
			want: []any{1.5, []any{
				[]any{"BlockStored", []any{int64(1)}, nil, []any{int64(5)}, int64(1), nil, nil, nil, []any{"salt"}},
			}, nil},
		},
		{
			name:   "array removed and cleared",
			cfg:    Config{Encoding: ArrayEncoding},
			events: []Event{BlockRemoved{BlockHashes: []uint64{big}, Medium: "DISK"}, BlockRemoved{BlockHashes: []uint64{1}}, AllBlocksCleared{}},
			want: []any{1.5, []any{
				[]any{"BlockRemoved", []any{big}, "DISK"},
				[]any{"BlockRemoved", []any{int64(1)}, nil},
				[]any{"AllBlocksCleared"},
			}, nil},
		},
		{
			name:   "array omit defaults trims trailing nils",
			cfg:    Config{Encoding: ArrayEncoding, OmitDefaults: true},
			events: []Event{minimal, BlockStored{BlockHashes: []uint64{1}, TokenIDs: []uint32{5}, BlockSize: 1, Medium: "GPU"}, BlockRemoved{BlockHashes: []uint64{1}}},
			want: []any{1.5, []any{
				[]any{"BlockStored", []any{int64(1)}, nil, []any{int64(5), int64(6)}, int64(2)},
				[]any{"BlockStored", []any{int64(1)}, nil, []any{int64(5)}, int64(1), nil, "GPU"},
				[]any{"BlockRemoved", []any{int64(1)}},
			}, nil},
		},
		{
			name:   "two element batch ignores rank",
			cfg:    Config{TwoElementBatch: true, Rank: ptr(2)},
			events: []Event{AllBlocksCleared{}},
			want:   []any{1.5, []any{map[string]any{"type": "AllBlocksCleared"}}},
		},
		{
			name: "empty batch",
			want: []any{1.5, []any{}, nil},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			payload, err := EncodeBatch(1.5, tt.events, tt.cfg)
			if err != nil {
				t.Fatalf("EncodeBatch: %v", err)
			}
			if got := decode(t, payload); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("decoded\n got %#v\nwant %#v", got, tt.want)
			}
		})
	}
}

// TestEncodeBatchWireForms checks the exact msgpack forms that the generic
// decoder would hide: the timestamp is a float64, large hashes are uint64
// (0xcf) or int64 (0xd3), bytes hashes are a 32-byte bin, event type names
// are str.
func TestEncodeBatchWireForms(t *testing.T) {
	be := func(code byte, v uint64) []byte { return binary.BigEndian.AppendUint64([]byte{code}, v) }
	ev := []Event{BlockRemoved{BlockHashes: []uint64{big}}}
	tests := []struct {
		name string
		cfg  Config
		want [][]byte // byte strings the payload must contain
	}{
		{"uint64", Config{}, [][]byte{be(0xcf, big)}},
		{"int64", Config{HashEncoding: HashInt64}, [][]byte{be(0xd3, big)}},
		{"bytes", Config{HashEncoding: HashBytes}, [][]byte{append([]byte{0xc4, 32}, HashBytesOf(big)...)}},
		{"type name is str", Config{Encoding: ArrayEncoding}, [][]byte{append([]byte{0xac}, "BlockRemoved"...)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			payload, err := EncodeBatch(1.5, ev, tt.cfg)
			if err != nil {
				t.Fatalf("EncodeBatch: %v", err)
			}
			if !bytes.HasPrefix(payload, append([]byte{0x93}, be(0xcb, math.Float64bits(1.5))...)) {
				t.Errorf("payload %x does not start with a 3-array and float64 1.5", payload)
			}
			for _, w := range tt.want {
				if !bytes.Contains(payload, w) {
					t.Errorf("payload %x lacks %x", payload, w)
				}
			}
		})
	}
}

func TestHashBytesOf(t *testing.T) {
	for _, id := range []uint64{0, 1, 0x5a, 0x61, big, math.MaxUint64} {
		t.Run(fmt.Sprint(id), func(t *testing.T) {
			b := HashBytesOf(id)
			if len(b) != 32 {
				t.Fatalf("len %d, want 32", len(b))
			}
			if got := binary.BigEndian.Uint64(b[24:]); got != id {
				t.Errorf("last 8 bytes %d, want %d", got, id)
			}
			if got := binary.BigEndian.Uint64(b[:8]); got == id {
				t.Errorf("first 8 bytes equal the id %d", id)
			}
			if bytes.Equal(b[:24], make([]byte, 24)) {
				t.Error("filler is all zero")
			}
		})
	}
}

func TestEncodeBatchErrors(t *testing.T) {
	tests := []struct {
		name   string
		cfg    Config
		events []Event
	}{
		{"nil event", Config{}, []Event{nil}},
		{"nil *BlockStored", Config{}, []Event{(*BlockStored)(nil)}},
		{"nil *BlockRemoved", Config{}, []Event{(*BlockRemoved)(nil)}},
		{"unknown encoding", Config{Encoding: Encoding(9)}, []Event{AllBlocksCleared{}}},
		{"unknown hash encoding", Config{HashEncoding: HashEncoding(9)}, []Event{BlockRemoved{BlockHashes: []uint64{1}}}},
		{"unencodable extra key", Config{}, []Event{BlockStored{ExtraKeys: []any{make(chan int)}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := EncodeBatch(0, tt.events, tt.cfg); err == nil {
				t.Error("EncodeBatch succeeded, want an error")
			}
		})
	}
}
