package engine

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// Encoding selects how events are laid out inside a batch.
type Encoding int

const (
	// MapEncoding writes each event as a msgpack map whose "type" key names
	// the event, followed by its fields by name (vLLM since mid-2026, SGLang
	// since autumn 2026).
	MapEncoding Encoding = iota
	// ArrayEncoding writes each event as a msgpack array whose first element
	// is the type name, then the fields in their fixed order (older engines):
	//
	//	["BlockStored", block_hashes, parent_block_hash, token_ids, block_size,
	//	 lora_id, medium, lora_name, extra_keys, group_idx]
	//	["BlockRemoved", block_hashes, medium]
	//	["AllBlocksCleared"]
	//
	// extra_keys and group_idx are trimmed when nil.
	ArrayEncoding
)

func (e Encoding) String() string {
	switch e {
	case MapEncoding:
		return "map"
	case ArrayEncoding:
		return "array"
	}
	return fmt.Sprintf("Encoding(%d)", int(e))
}

// HashEncoding selects how block hashes (block_hashes, parent_block_hash)
// are written.
type HashEncoding int

const (
	// HashUint64 writes hashes as msgpack unsigned integers in their
	// shortest form; values >= 2^63 become uint64 (0xcf).
	HashUint64 HashEncoding = iota
	// HashInt64 writes hashes as signed integers, as SGLang does, so values
	// >= 2^63 become negative int64 (0xd3).
	HashInt64
	// HashBytes writes each hash as a 32-byte bin whose last 8 bytes are the
	// id big-endian, as vLLM does when its hashes are not ints. The first 24
	// bytes are filler (see HashBytesOf), so a decoder that reads the wrong
	// end gets a wrong id.
	HashBytes
)

func (h HashEncoding) String() string {
	switch h {
	case HashUint64:
		return "uint64"
	case HashInt64:
		return "int64"
	case HashBytes:
		return "bytes"
	}
	return fmt.Sprintf("HashEncoding(%d)", int(h))
}

// Event is one KV-cache event: BlockStored, BlockRemoved or
// AllBlocksCleared (or a pointer to one).
type Event interface {
	isEvent()
}

// BlockStored reports blocks newly stored by the engine.
type BlockStored struct {
	// BlockHashes are the engine's ids of the stored blocks, parent first.
	BlockHashes []uint64
	// Parent is the id of the block before the first stored one; nil for a
	// sequence that starts at the root.
	Parent *uint64
	// TokenIDs are all stored blocks' tokens, flattened.
	TokenIDs []uint32
	// BlockSize is the number of tokens per block.
	BlockSize int
	// LoRAID is the deprecated numeric adapter id; nil is written as nil.
	LoRAID *int
	// Medium is the storage tier ("GPU", "CPU", ...); "" is written as nil.
	Medium string
	// LoRAName is the adapter name; "" is written as nil.
	LoRAName string
	// ExtraKeys holds one entry per block: nil or a value (int, string,
	// []any, ...) encoded generically. A nil slice leaves the field nil or
	// absent.
	ExtraKeys []any
	// GroupIdx is the hybrid-attention KV cache group; nil leaves the field
	// nil or absent.
	GroupIdx *int
}

// BlockRemoved reports blocks evicted by the engine.
type BlockRemoved struct {
	BlockHashes []uint64
	Medium      string // "" is written as nil
}

// AllBlocksCleared reports that the engine dropped its whole cache.
type AllBlocksCleared struct{}

func (BlockStored) isEvent()      {}
func (BlockRemoved) isEvent()     {}
func (AllBlocksCleared) isEvent() {}

// EncodeBatch returns the msgpack payload of one event batch,
// [ts, events, data_parallel_rank], laid out as cfg's Encoding,
// HashEncoding, Rank, TwoElementBatch and OmitDefaults say. The socket
// fields of cfg are not used.
//
// EncodeBatch does not validate events (token counts, extra_keys length,
// ...): it encodes what it is given, so that tests can build malformed input.
func EncodeBatch(ts float64, events []Event, cfg Config) ([]byte, error) {
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	enc.UseCompactInts(true) // shortest integer forms, as Python encoders write
	w := batchWriter{enc: enc, cfg: &cfg}
	if err := w.batch(ts, events); err != nil {
		return nil, fmt.Errorf("engine: encode batch: %w", err)
	}
	return buf.Bytes(), nil
}

// batchWriter encodes one batch; every method returns the first encoder
// error.
type batchWriter struct {
	enc *msgpack.Encoder
	cfg *Config
}

func (w batchWriter) batch(ts float64, events []Event) error {
	n := 3
	if w.cfg.TwoElementBatch {
		n = 2
	}
	if err := w.enc.EncodeArrayLen(n); err != nil {
		return err
	}
	if err := w.enc.EncodeFloat64(ts); err != nil {
		return err
	}
	if err := w.enc.EncodeArrayLen(len(events)); err != nil {
		return err
	}
	for i, ev := range events {
		if err := w.event(ev); err != nil {
			return fmt.Errorf("event %d: %w", i, err)
		}
	}
	if w.cfg.TwoElementBatch {
		return nil
	}
	return w.optInt(w.cfg.Rank)
}

func (w batchWriter) event(ev Event) error {
	switch ev := ev.(type) {
	case BlockStored:
		return w.stored(&ev)
	case *BlockStored:
		if ev != nil {
			return w.stored(ev)
		}
	case BlockRemoved:
		return w.removed(&ev)
	case *BlockRemoved:
		if ev != nil {
			return w.removed(ev)
		}
	case AllBlocksCleared, *AllBlocksCleared:
		return w.cleared()
	}
	// Every event type is handled above, so only nil remains.
	return fmt.Errorf("nil event (%T)", ev)
}

// field is one named event field; value writes it.
type field struct {
	name  string
	isNil bool
	value func() error
}

// fields writes an event of the given type with its fields in order: a map
// with "type" first, or an array with the type name first. Callers leave
// fields that are absent (not merely nil) out of fs. With OmitDefaults, nil
// fields are left out of maps and trimmed from the end of arrays.
func (w batchWriter) fields(typ string, fs []field) error {
	switch w.cfg.Encoding {
	case MapEncoding:
		n := 1
		for _, f := range fs {
			if !(f.isNil && w.cfg.OmitDefaults) {
				n++
			}
		}
		if err := w.enc.EncodeMapLen(n); err != nil {
			return err
		}
		if err := w.enc.EncodeString("type"); err != nil {
			return err
		}
		if err := w.enc.EncodeString(typ); err != nil {
			return err
		}
		for _, f := range fs {
			if f.isNil && w.cfg.OmitDefaults {
				continue
			}
			if err := w.enc.EncodeString(f.name); err != nil {
				return err
			}
			if err := f.value(); err != nil {
				return fmt.Errorf("%s: %w", f.name, err)
			}
		}
		return nil
	case ArrayEncoding:
		if w.cfg.OmitDefaults {
			for len(fs) > 0 && fs[len(fs)-1].isNil {
				fs = fs[:len(fs)-1]
			}
		}
		if err := w.enc.EncodeArrayLen(1 + len(fs)); err != nil {
			return err
		}
		if err := w.enc.EncodeString(typ); err != nil {
			return err
		}
		for _, f := range fs {
			if err := f.value(); err != nil {
				return fmt.Errorf("%s: %w", f.name, err)
			}
		}
		return nil
	}
	return fmt.Errorf("unknown encoding %v", w.cfg.Encoding)
}

func (w batchWriter) stored(ev *BlockStored) error {
	fs := []field{
		{"block_hashes", false, func() error { return w.hashes(ev.BlockHashes) }},
		{"parent_block_hash", ev.Parent == nil, func() error {
			if ev.Parent == nil {
				return w.enc.EncodeNil()
			}
			return w.hash(*ev.Parent)
		}},
		{"token_ids", false, func() error {
			if err := w.enc.EncodeArrayLen(len(ev.TokenIDs)); err != nil {
				return err
			}
			for _, t := range ev.TokenIDs {
				if err := w.enc.EncodeUint(uint64(t)); err != nil {
					return err
				}
			}
			return nil
		}},
		{"block_size", false, func() error { return w.enc.EncodeInt(int64(ev.BlockSize)) }},
		{"lora_id", ev.LoRAID == nil, func() error { return w.optInt(ev.LoRAID) }},
		{"medium", ev.Medium == "", func() error { return w.optString(ev.Medium) }},
		{"lora_name", ev.LoRAName == "", func() error { return w.optString(ev.LoRAName) }},
	}
	// extra_keys and group_idx are newer fields: absent when unset, but an
	// array that carries group_idx needs the extra_keys slot before it.
	extra := field{"extra_keys", ev.ExtraKeys == nil, func() error {
		if ev.ExtraKeys == nil {
			return w.enc.EncodeNil()
		}
		if err := w.enc.EncodeArrayLen(len(ev.ExtraKeys)); err != nil {
			return err
		}
		for i, k := range ev.ExtraKeys {
			if err := w.enc.Encode(k); err != nil {
				return fmt.Errorf("block %d: %w", i, err)
			}
		}
		return nil
	}}
	group := field{"group_idx", ev.GroupIdx == nil, func() error { return w.optInt(ev.GroupIdx) }}
	switch {
	case ev.GroupIdx != nil:
		fs = append(fs, extra, group)
	case ev.ExtraKeys != nil:
		fs = append(fs, extra)
	}
	return w.fields("BlockStored", fs)
}

func (w batchWriter) removed(ev *BlockRemoved) error {
	return w.fields("BlockRemoved", []field{
		{"block_hashes", false, func() error { return w.hashes(ev.BlockHashes) }},
		{"medium", ev.Medium == "", func() error { return w.optString(ev.Medium) }},
	})
}

func (w batchWriter) cleared() error {
	return w.fields("AllBlocksCleared", nil)
}

func (w batchWriter) hashes(hs []uint64) error {
	if err := w.enc.EncodeArrayLen(len(hs)); err != nil {
		return err
	}
	for _, h := range hs {
		if err := w.hash(h); err != nil {
			return err
		}
	}
	return nil
}

func (w batchWriter) hash(h uint64) error {
	switch w.cfg.HashEncoding {
	case HashUint64:
		return w.enc.EncodeUint(h)
	case HashInt64:
		return w.enc.EncodeInt(int64(h))
	case HashBytes:
		return w.enc.EncodeBytes(HashBytesOf(h))
	}
	return fmt.Errorf("unknown hash encoding %v", w.cfg.HashEncoding)
}

// HashBytesOf returns the 32-byte form HashBytes writes for id: 24 bytes of
// filler, then id big-endian. Filler byte i is (0x5a+i) XOR the id's low
// byte, so it is never all zero and its first 8 bytes never equal the id.
func HashBytesOf(id uint64) []byte {
	b := make([]byte, 32)
	for i := range 24 {
		b[i] = byte(0x5a+i) ^ byte(id)
	}
	binary.BigEndian.PutUint64(b[24:], id)
	return b
}

func (w batchWriter) optInt(v *int) error {
	if v == nil {
		return w.enc.EncodeNil()
	}
	return w.enc.EncodeInt(int64(*v))
}

func (w batchWriter) optString(s string) error {
	if s == "" {
		return w.enc.EncodeNil()
	}
	return w.enc.EncodeString(s)
}
