package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unsafe"

	"github.com/kvgate/kvgate/indexer"
	"github.com/kvgate/kvgate/internal/msgpack"
	"github.com/zeebo/xxh3"
)

// This file decodes the KV events engines publish (vLLM, SGLang, Mooncake's
// store), as described in docs/kv-events.md, into wireBatch values,
// and turns those into index Events. Decoding is defensive: every length is
// checked against the bytes present, unknown fields are skipped, and a
// malformed payload is an error, never a panic.

// wireBatch is one decoded EventBatch. Its slices alias the decoder's
// buffers and stay valid until the decoder's next Decode.
type wireBatch struct {
	TS float64 // timestamp as sent (seconds, or milliseconds from Mooncake)
	// Rank is the batch's data_parallel_rank (vLLM) or attn_dp_rank
	// (SGLang); HasRank is false when the batch carries none, and the
	// listener's registered rank applies.
	Rank    uint32
	HasRank bool
	Events  []wireEvent
}

// wireKind says what a wireEvent does.
type wireKind uint8

// The kinds of wireEvent.
const (
	wireStored  wireKind = iota + 1 // blocks stored (BlockStored, Mooncake BlockStoreEvent / "stored")
	wireRemoved                     // blocks removed (BlockRemoved, Mooncake "removed")
	wireCleared                     // everything on Tier dropped (AllBlocksCleared, RemoveAllEvent, "cleared")
	wireMoved                       // a Mooncake object's replicas changed (BlockUpdateEvent)
)

func (k wireKind) String() string {
	switch k {
	case wireStored:
		return "stored"
	case wireRemoved:
		return "removed"
	case wireCleared:
		return "cleared"
	case wireMoved:
		return "moved"
	}
	return fmt.Sprintf("wireKind(%d)", uint8(k))
}

// wireEvent is one decoded event, not yet hashed for the index.
type wireEvent struct {
	Kind wireKind
	// Tier is the storage tier of a Stored or Removed event (from its
	// medium or replica locations), the tiers a Cleared event empties, or
	// the tiers a Moved object now occupies (0: none, it is gone).
	Tier indexer.Tier
	// IDs are the engine's block ids: the stored blocks in order, or the
	// removed ones.
	IDs       []uint64
	Parent    uint64 // engine id of the block before IDs[0]
	HasParent bool
	Tokens    []uint32 // Stored: all blocks' tokens, flattened
	BlockSize int      // Stored: tokens per block as the engine states it (0: not sent)
	LoRA      string   // adapter name; "" for the base model
	// Extra holds per-block extra hash keys (Extra[i] for block i); nil
	// when the event has none.
	Extra [][]uint64
	// Object is the XXH3-64 of a Mooncake object key (mooncake_key), when
	// the event names one: BlockUpdateEvent refers to objects only by key.
	Object    uint64
	HasObject bool
	// Skip, when not empty, says why the router ignores this event: a
	// hybrid-attention model's non-full-attention group ("other_group"), or
	// blocks held remotely ("remote").
	Skip string

	kindSet bool // kv_cache_spec_kind was sent: it decides, not group_idx
}

// errDecode wraps every decoding error.
var errDecode = errors.New("decode kv event batch")

// decoder decodes event batches, reusing its buffers between calls. It is
// not safe for concurrent use; each listener owns one.
type decoder struct {
	r      msgpack.Reader
	events []wireEvent
	hashes []uint64
	tokens []uint32
	extras [][]uint64
	keys   []uint64
	spans  []eventSpans
}

// eventSpans records where an event's slices live in the decoder's buffers
// while they may still move (append), to be resolved at the end.
type eventSpans struct {
	hashLo, hashHi   int
	tokLo, tokHi     int
	extraLo, extraHi int
	hasExtra         bool
}

// keySpan is the position of one block's extra keys in decoder.keys,
// encoded in an extras entry until resolution.
type keySpan struct{ lo, hi int }

// Decode decodes one msgpack EventBatch payload. The result aliases the
// decoder's buffers (and strings may alias payload) until the next call.
func (d *decoder) Decode(payload []byte) (wireBatch, error) {
	b, err := d.decode(payload)
	if err != nil {
		return wireBatch{}, fmt.Errorf("%w: %w", errDecode, err)
	}
	return b, nil
}

func (d *decoder) decode(payload []byte) (wireBatch, error) {
	d.r = msgpack.NewReader(payload)
	d.events, d.hashes, d.tokens, d.keys, d.spans = d.events[:0], d.hashes[:0], d.tokens[:0], d.keys[:0], d.spans[:0]
	d.extras = d.extras[:0]
	var spans []keySpan
	var b wireBatch
	var err error
	switch d.r.Peek() {
	case msgpack.Array:
		err = d.batchArray(&b, &spans)
	case msgpack.Map:
		err = d.batchMap(&b, &spans)
	default:
		return b, d.r.TypeError("event batch (array or map)")
	}
	if err != nil {
		return b, err
	}
	if !d.r.Done() {
		return b, fmt.Errorf("%d trailing bytes after the batch", d.r.Len())
	}
	// Resolve spans now that the buffers no longer move.
	for i := range d.events {
		ev, sp := &d.events[i], d.spans[i]
		ev.IDs = d.hashes[sp.hashLo:sp.hashHi:sp.hashHi]
		ev.Tokens = d.tokens[sp.tokLo:sp.tokHi:sp.tokHi]
		if sp.hasExtra {
			ev.Extra = d.extras[sp.extraLo:sp.extraHi:sp.extraHi]
		}
	}
	for i, s := range spans {
		if s.hi > s.lo {
			d.extras[i] = d.keys[s.lo:s.hi:s.hi]
		} else {
			d.extras[i] = nil
		}
	}
	b.Events = d.events
	return b, nil
}

// batchArray decodes [ts, events] or [ts, events, rank, ...].
func (d *decoder) batchArray(b *wireBatch, spans *[]keySpan) error {
	n, err := d.r.ArrayLen()
	if err != nil {
		return err
	}
	if n < 2 {
		return fmt.Errorf("event batch array has %d elements, want at least 2", n)
	}
	if b.TS, err = d.ts(); err != nil {
		return fmt.Errorf("batch ts: %w", err)
	}
	if err = d.eventList(spans); err != nil {
		return err
	}
	if n >= 3 {
		if err = d.rank(b); err != nil {
			return err
		}
	}
	for i := 3; i < n; i++ {
		if err = d.r.Skip(); err != nil {
			return err
		}
	}
	return nil
}

// batchMap decodes {"ts", "events", "data_parallel_rank" | "attn_dp_rank"}.
func (d *decoder) batchMap(b *wireBatch, spans *[]keySpan) error {
	n, err := d.r.MapLen()
	if err != nil {
		return err
	}
	sawEvents := false
	for range n {
		key, err := d.key()
		if err != nil {
			return err
		}
		switch key {
		case "ts", "timestamp":
			if b.TS, err = d.ts(); err != nil {
				return fmt.Errorf("batch ts: %w", err)
			}
		case "events":
			sawEvents = true
			err = d.eventList(spans)
		case "data_parallel_rank", "attn_dp_rank", "dp_rank":
			err = d.rank(b)
		default:
			err = d.r.Skip()
		}
		if err != nil {
			return err
		}
	}
	if !sawEvents {
		return errors.New(`event batch map has no "events"`)
	}
	return nil
}

func (d *decoder) ts() (float64, error) {
	if d.r.Nil() {
		return 0, nil
	}
	return d.r.Float()
}

func (d *decoder) rank(b *wireBatch) error {
	if d.r.Nil() {
		return nil
	}
	v, err := d.upTo(1<<31, "batch dp rank")
	b.Rank, b.HasRank = uint32(v), err == nil
	return err
}

// upTo reads an integer that must lie in [0, max]; what names it in errors.
func (d *decoder) upTo(max int64, what string) (int64, error) {
	v, big, err := d.r.Int()
	if err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	if big || v < 0 || v > max {
		return 0, fmt.Errorf("%s %d out of range", what, v)
	}
	return v, nil
}

// key reads a map key, which must be a string. The result aliases the
// payload; compare it, do not keep it.
func (d *decoder) key() (string, error) {
	if t := d.r.Peek(); t != msgpack.Str {
		return "", d.r.TypeError("string map key")
	}
	p, err := d.r.Raw()
	return unsafeString(p), err
}

func (d *decoder) eventList(spans *[]keySpan) error {
	n, err := d.r.ArrayLen()
	if err != nil {
		return fmt.Errorf("events: %w", err)
	}
	for i := range n {
		if err := d.event(spans); err != nil {
			return fmt.Errorf("event %d: %w", i, err)
		}
	}
	return nil
}

// event decodes one event in map or array form, decided by its own type.
func (d *decoder) event(spans *[]keySpan) error {
	ev := wireEvent{}
	sp := eventSpans{hashLo: len(d.hashes), tokLo: len(d.tokens)}
	var err error
	switch d.r.Peek() {
	case msgpack.Array:
		err = d.eventArray(&ev, &sp, spans)
	case msgpack.Map:
		err = d.eventMap(&ev, &sp, spans)
	default:
		return d.r.TypeError("event (array or map)")
	}
	if err != nil {
		return err
	}
	sp.hashHi, sp.tokHi = len(d.hashes), len(d.tokens)
	d.events = append(d.events, ev)
	d.spans = append(d.spans, sp)
	return nil
}

// kindOf maps an event type name to its kind and whether it is one of
// Mooncake's store events (whose objects live in host memory or on disk).
func kindOf(name string) (kind wireKind, mooncake bool, ok bool) {
	switch name {
	case "BlockStored":
		return wireStored, false, true
	case "BlockRemoved":
		return wireRemoved, false, true
	case "AllBlocksCleared":
		return wireCleared, false, true
	case "BlockStoreEvent", "stored":
		return wireStored, true, true
	case "removed":
		return wireRemoved, true, true
	case "RemoveAllEvent", "cleared":
		return wireCleared, true, true
	case "BlockUpdateEvent":
		return wireMoved, true, true
	}
	return 0, false, false
}

// eventArray decodes the positional (older) forms:
//
//	["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name, extra_keys, group_idx, kv_cache_spec_kind, ...]
//	["BlockRemoved", block_hashes, medium, group_idx, ...]
//	["AllBlocksCleared", ...]
//	["BlockStoreEvent", mooncake_key, replicas, model_name, block_size, block_hash, parent_block_hash, token_ids, ...]
//	["BlockUpdateEvent", mooncake_key, replicas, ...]
//	["RemoveAllEvent", ...]
func (d *decoder) eventArray(ev *wireEvent, sp *eventSpans, spans *[]keySpan) error {
	n, err := d.r.ArrayLen()
	if err != nil {
		return err
	}
	if n == 0 {
		return errors.New("empty event array")
	}
	tag, err := d.str()
	if err != nil {
		return fmt.Errorf("event type: %w", err)
	}
	kind, mooncake, ok := kindOf(tag)
	if !ok {
		return fmt.Errorf("unknown event type %q", truncate(tag, 40))
	}
	ev.Kind, ev.Tier = kind, indexer.TierDevice
	var fields []func() error
	switch {
	case mooncake:
		ev.Tier = indexer.TierHost
		fields = []func() error{
			func() error { return d.objectKey(ev) },
			func() error { return d.replicas(ev) },
			d.r.Skip, // model_name: the listener's registration names the model
			func() error { return d.blockSize(ev) },
			d.hashList,
			func() error { return d.parent(ev) },
			d.tokenList,
		}
	case kind == wireStored:
		fields = []func() error{
			d.hashList,
			func() error { return d.parent(ev) },
			d.tokenList,
			func() error { return d.blockSize(ev) },
			func() error { return d.loraID(ev) },
			func() error { return d.medium(ev) },
			func() error { return d.loraName(ev) },
			func() error { return d.extraKeys(sp, spans) },
			func() error { return d.group(ev) },
			func() error { return d.specKind(ev) },
		}
	case kind == wireRemoved:
		fields = []func() error{
			d.hashList,
			func() error { return d.medium(ev) },
			func() error { return d.group(ev) },
		}
	}
	for i := 1; i < n; i++ {
		f := d.r.Skip
		if i-1 < len(fields) {
			f = fields[i-1]
		}
		if err := f(); err != nil {
			return fmt.Errorf("%s field %d: %w", tag, i, err)
		}
	}
	return d.finish(ev, sp, spans, mooncake, false)
}

// eventMap decodes the map forms: vLLM's and SGLang's {"type": ...},
// Mooncake's and the newer store publisher's {"event_type": "stored" |
// "removed" | "cleared", ...}. Fields are looked up by name; unknown ones
// are skipped.
func (d *decoder) eventMap(ev *wireEvent, sp *eventSpans, spans *[]keySpan) error {
	n, err := d.r.MapLen()
	if err != nil {
		return err
	}
	ev.Tier = indexer.TierDevice
	var tag, eventType string
	mediumSet := false
	for range n {
		k, err := d.key()
		if err != nil {
			return err
		}
		switch k {
		case "type":
			tag, err = d.optStr()
		case "event_type":
			eventType, err = d.optStr()
		case "block_hashes", "seq_hashes", "block_hash":
			if k == "block_hashes" && len(d.hashes) > sp.hashLo {
				// Mooncake sends seq_hashes and a legacy copy in block_hashes.
				err = d.r.Skip()
				break
			}
			err = d.hashList()
		case "parent_block_hash", "parent_hash":
			err = d.parent(ev)
		case "token_ids", "token_id":
			err = d.tokenList()
		case "block_size":
			err = d.blockSize(ev)
		case "lora_id":
			err = d.loraID(ev)
		case "lora_name":
			err = d.loraName(ev)
		case "medium":
			mediumSet = true
			err = d.medium(ev)
		case "extra_keys":
			err = d.extraKeys(sp, spans)
		case "group_idx":
			err = d.group(ev)
		case "kv_cache_spec_kind":
			err = d.specKind(ev)
		case "locality":
			err = d.locality(ev)
		case "mooncake_key", "object_key":
			err = d.objectKey(ev)
		case "replicas", "replica_list", "addr_list":
			mediumSet = true
			err = d.replicas(ev)
		default:
			err = d.r.Skip()
		}
		if err != nil {
			return fmt.Errorf("field %q: %w", truncate(k, 40), err)
		}
	}
	// The newer Mooncake store publisher sends both: event_type is the
	// authority, type a legacy copy.
	mooncake := eventType != ""
	name := tag
	if mooncake {
		name = eventType
	}
	if name == "" {
		return errors.New(`event map has no "type"`)
	}
	kind, mc, ok := kindOf(name)
	if !ok {
		return fmt.Errorf("unknown event type %q", truncate(name, 40))
	}
	ev.Kind = kind
	return d.finish(ev, sp, spans, mooncake || mc, mediumSet)
}

// finish applies the defaults that depend on the whole event.
func (d *decoder) finish(ev *wireEvent, sp *eventSpans, spans *[]keySpan, mooncake, mediumSet bool) error {
	if mooncake && !mediumSet && ev.Tier == indexer.TierDevice {
		// Mooncake store objects live in host memory unless their medium
		// or a replica location says disk.
		ev.Tier = indexer.TierHost
	}
	if (ev.Kind == wireStored || ev.Kind == wireRemoved) && (ev.Tier == 0 || ev.Tier == indexer.TierHost|indexer.TierDisk) {
		// No replica yet (or both kinds): account the object to host memory,
		// where Mooncake puts it first.
		ev.Tier = indexer.TierHost
	}
	switch ev.Kind {
	case wireCleared:
		if mooncake {
			ev.Tier = indexer.TierHost | indexer.TierDisk // the store never holds device blocks
		} else {
			ev.Tier = indexer.AllTiers
		}
	case wireMoved:
		if !ev.HasObject {
			return errors.New("BlockUpdateEvent without mooncake_key")
		}
	case wireStored:
		if len(d.hashes) == sp.hashLo && ev.HasObject {
			// No block hash: the object key is the block's identity.
			d.hashes = append(d.hashes, ev.Object)
		}
	}
	return nil
}

// str reads a string (or bin) value; the result aliases the payload.
func (d *decoder) str() (string, error) {
	t := d.r.Peek()
	if t != msgpack.Str && t != msgpack.Bin {
		return "", d.r.TypeError("string")
	}
	p, err := d.r.Raw()
	return unsafeString(p), err
}

// optStr reads a string or nil.
func (d *decoder) optStr() (string, error) {
	if d.r.Nil() {
		return "", nil
	}
	return d.str()
}

// hashValue reads one block id: an integer (uint64, or negative int64 as
// SGLang sends), bytes (the last 8, big-endian, as vLLM's non-int hashes
// are read), or a string (Mooncake): decimal or 0x-hex when it parses,
// otherwise the XXH3-64 of the string, which is as good an opaque id. ok
// is false for an empty string or bytes, Mooncake's "unset".
func (d *decoder) hashValue() (h uint64, ok bool, err error) {
	switch d.r.Peek() {
	case msgpack.Int:
		h, err = d.r.Uint64Bits()
		return h, err == nil, err
	case msgpack.Bin, msgpack.Str:
		isStr := d.r.Peek() == msgpack.Str
		p, err := d.r.Raw()
		if err != nil || len(p) == 0 {
			return 0, false, err
		}
		if isStr {
			s := unsafeString(p)
			if u, err := strconv.ParseUint(s, 0, 64); err == nil {
				return u, true, nil
			}
			if v, err := strconv.ParseInt(s, 10, 64); err == nil {
				return uint64(v), true, nil
			}
			return xxh3.Hash(p), true, nil
		}
		if len(p) >= 8 {
			return binary.BigEndian.Uint64(p[len(p)-8:]), true, nil
		}
		var buf [8]byte
		copy(buf[8-len(p):], p)
		return binary.BigEndian.Uint64(buf[:]), true, nil
	}
	return 0, false, d.r.TypeError("block hash")
}

// hashList appends the block ids of a list, or of one bare id, to d.hashes.
func (d *decoder) hashList() error {
	if d.r.Nil() {
		return nil
	}
	n := 1
	if d.r.Peek() == msgpack.Array {
		var err error
		if n, err = d.r.ArrayLen(); err != nil {
			return err
		}
	}
	for range n {
		h, ok, err := d.hashValue()
		if err != nil {
			return fmt.Errorf("block hash: %w", err)
		}
		if ok {
			d.hashes = append(d.hashes, h)
		}
	}
	return nil
}

func (d *decoder) parent(ev *wireEvent) error {
	if d.r.Nil() {
		return nil
	}
	h, ok, err := d.hashValue()
	if err != nil {
		return fmt.Errorf("parent block hash: %w", err)
	}
	ev.Parent, ev.HasParent = h, ok
	return nil
}

func (d *decoder) tokenList() error {
	if d.r.Nil() {
		return nil
	}
	n, err := d.r.ArrayLen()
	if err != nil {
		return fmt.Errorf("token ids: %w", err)
	}
	for range n {
		v, err := d.upTo(1<<32-1, "token id")
		if err != nil {
			return err
		}
		d.tokens = append(d.tokens, uint32(v))
	}
	return nil
}

func (d *decoder) blockSize(ev *wireEvent) error {
	if d.r.Nil() {
		return nil
	}
	v, err := d.upTo(1<<20, "block size")
	ev.BlockSize = int(v)
	return err
}

// loraID reads the deprecated numeric adapter id. Like Dynamo, kvgate
// identifies adapters by lora_name only: vLLM sends both, and an id is not
// stable across engines.
func (d *decoder) loraID(*wireEvent) error {
	if d.r.Nil() {
		return nil
	}
	_, _, err := d.r.Int()
	if err != nil {
		return fmt.Errorf("lora id: %w", err)
	}
	return nil
}

func (d *decoder) loraName(ev *wireEvent) error {
	s, err := d.optStr()
	if err != nil {
		return fmt.Errorf("lora name: %w", err)
	}
	ev.LoRA = strings.Clone(s)
	return nil
}

func (d *decoder) medium(ev *wireEvent) error {
	s, err := d.optStr()
	if err != nil {
		return fmt.Errorf("medium: %w", err)
	}
	ev.Tier = tierOfMedium(s)
	return nil
}

// tierOfMedium maps an engine's medium name to a tier: GPU, NPU, DEVICE,
// empty and unknown names to device; CPU, CPU_PINNED, CPU_TIER1 (and
// Mooncake's MEMORY) to host; DISK, CPU_TIER2, NVME, SSD, STORAGE and
// external storage (EXTERNAL, NETWORK, REMOTE, SHARED) to disk. Case is
// ignored.
func tierOfMedium(medium string) indexer.Tier {
	switch strings.ToUpper(medium) {
	case "CPU", "CPU_PINNED", "CPU_TIER1", "HOST", "HOST_PINNED", "MEMORY":
		return indexer.TierHost
	case "DISK", "CPU_TIER2", "NVME", "SSD", "STORAGE", "LOCAL_DISK",
		"EXTERNAL", "NETWORK", "REMOTE", "SHARED":
		return indexer.TierDisk
	}
	return indexer.TierDevice
}

// extraKeys reads per-block extra keys: a list with, per block, nil or a
// tuple of items. Each item becomes one uint64 key: a 64-hex-digit string
// (a multimodal content hash) its first 16 hex digits, as Dynamo reads it;
// any other string (cache salt, other identifiers) and bytes their XXH3-64;
// an integer its bits; a [identifier, offset] pair its identifier only.
// Floats, booleans and nils add nothing.
func (d *decoder) extraKeys(sp *eventSpans, spans *[]keySpan) error {
	if d.r.Nil() {
		return nil
	}
	n, err := d.r.ArrayLen()
	if err != nil {
		return fmt.Errorf("extra keys: %w", err)
	}
	sp.hasExtra, sp.extraLo = true, len(d.extras)
	for range n {
		lo := len(d.keys)
		if err := d.extraValue(0); err != nil {
			return fmt.Errorf("extra keys: %w", err)
		}
		*spans = append(*spans, keySpan{lo, len(d.keys)})
		d.extras = append(d.extras, nil)
	}
	sp.extraHi = len(d.extras)
	return nil
}

func (d *decoder) extraValue(depth int) error {
	if depth > msgpack.MaxSkipDepth {
		return errors.New("nested too deep")
	}
	switch d.r.Peek() {
	case msgpack.Int:
		u, err := d.r.Uint64Bits()
		if err != nil {
			return err
		}
		d.keys = append(d.keys, u)
		return nil
	case msgpack.Str, msgpack.Bin:
		isStr := d.r.Peek() == msgpack.Str
		p, err := d.r.Raw()
		if err != nil {
			return err
		}
		if len(p) == 0 {
			return nil
		}
		if isStr && len(p) == 64 {
			if u, err := strconv.ParseUint(unsafeString(p[:16]), 16, 64); err == nil && isHex(p) {
				d.keys = append(d.keys, u)
				return nil
			}
		}
		d.keys = append(d.keys, xxh3.Hash(p))
		return nil
	case msgpack.Array:
		n, err := d.r.ArrayLen()
		if err != nil {
			return err
		}
		if n == 2 && (d.r.Peek() == msgpack.Str || d.r.Peek() == msgpack.Bin) {
			// [identifier, offset]: the offset locates the item in the
			// prompt, which the tokens already encode.
			if err := d.extraValue(depth + 1); err != nil {
				return err
			}
			return d.r.Skip()
		}
		for range n {
			if err := d.extraValue(depth + 1); err != nil {
				return err
			}
		}
		return nil
	}
	return d.r.SkipDepth(depth)
}

func isHex(p []byte) bool {
	for _, c := range p {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
}

// group reads a hybrid-attention group index. Without a spec kind, only
// group 0 (full attention) is indexed.
func (d *decoder) group(ev *wireEvent) error {
	if d.r.Nil() {
		return nil
	}
	v, _, err := d.r.Int()
	if err != nil {
		return fmt.Errorf("group idx: %w", err)
	}
	if v != 0 && ev.Skip == "" && !ev.kindSet {
		ev.Skip = skipOtherGroup
	}
	return nil
}

// specKind reads kv_cache_spec_kind, which, when present, decides: only
// full-attention kinds are indexed.
func (d *decoder) specKind(ev *wireEvent) error {
	s, err := d.optStr()
	if err != nil || s == "" {
		return err
	}
	ev.kindSet = true
	switch strings.ToLower(s) {
	case "full_attention", "mla_attention", "sink_full_attention":
		if ev.Skip == skipOtherGroup {
			ev.Skip = ""
		}
	default:
		ev.Skip = skipOtherGroup
	}
	return nil
}

func (d *decoder) locality(ev *wireEvent) error {
	s, err := d.optStr()
	if err == nil && strings.EqualFold(s, "REMOTE") {
		ev.Skip = skipRemote
	}
	return err
}

// Reasons for wireEvent.Skip.
const (
	skipOtherGroup = "other_group" // not the full-attention KV cache group
	skipRemote     = "remote"      // blocks another instance holds
)

// objectKey reads a Mooncake object key.
func (d *decoder) objectKey(ev *wireEvent) error {
	s, err := d.optStr()
	if err != nil {
		return fmt.Errorf("object key: %w", err)
	}
	if s != "" {
		ev.Object, ev.HasObject = xxh3.HashString(s), true
	}
	return nil
}

// replicas reads a Mooncake replica list, each entry [kind, location] with
// kind "memory", "disk" or "local_disk" (maps and bare strings tolerated),
// and sets Tier to the tiers the replicas occupy (0 for none).
func (d *decoder) replicas(ev *wireEvent) error {
	ev.Tier = 0
	if d.r.Nil() {
		return nil
	}
	n, err := d.r.ArrayLen()
	if err != nil {
		return fmt.Errorf("replicas: %w", err)
	}
	for range n {
		t, err := d.replicaTier()
		if err != nil {
			return fmt.Errorf("replicas: %w", err)
		}
		ev.Tier |= t
	}
	return nil
}

// replicaTier reads one replica and returns its tier.
func (d *decoder) replicaTier() (indexer.Tier, error) {
	switch d.r.Peek() {
	case msgpack.Array:
		n, err := d.r.ArrayLen()
		if err != nil || n == 0 {
			return indexer.TierHost, err
		}
		var kind string
		if t := d.r.Peek(); t == msgpack.Str || t == msgpack.Bin {
			kind, err = d.str()
		} else {
			err = d.r.Skip()
		}
		for i := 1; i < n && err == nil; i++ {
			err = d.r.Skip()
		}
		return replicaKindTier(kind), err
	case msgpack.Map:
		n, err := d.r.MapLen()
		tier := indexer.TierHost
		for i := 0; i < n && err == nil; i++ {
			var k string
			if k, err = d.key(); err != nil {
				break
			}
			if k == "kind" || k == "type" || k == "medium" {
				var v string
				if v, err = d.optStr(); err == nil {
					tier = replicaKindTier(v)
				}
				continue
			}
			err = d.r.Skip()
		}
		return tier, err
	case msgpack.Str, msgpack.Bin:
		s, err := d.str()
		return replicaKindTier(s), err
	}
	return indexer.TierHost, d.r.Skip()
}

func replicaKindTier(kind string) indexer.Tier {
	switch strings.ToLower(kind) {
	case "disk", "local_disk", "ssd", "nvme", "file":
		return indexer.TierDisk
	}
	return indexer.TierHost
}

// unsafeString views p as a string without copying. The string must not
// outlive p's next modification; callers compare it or clone it.
func unsafeString(p []byte) string {
	if len(p) == 0 {
		return ""
	}
	return unsafe.String(&p[0], len(p))
}
