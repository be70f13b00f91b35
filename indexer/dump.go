package indexer

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// dumpRec is one (block, worker rank) entry copied out of the index.
type dumpRec struct {
	hash, key, local, parent uint64
	tiers                    Tier
	depth                    int // -1: not reachable from the root through the rank's own blocks
}

// Dump returns the index as Stored events of one block each, parents before
// children (breadth-first by depth), so that loading them into an empty index
// with Load reproduces every Match answer. It is a weakly consistent
// snapshot: each worker rank is copied atomically, ranks one after another.
//
// Blocks a rank holds whose parent it no longer holds (the engine evicted a
// block before its child) cannot be expressed as a Stored event; they are
// invisible to Match and are left out, so BlockCounts after a Load may be
// lower by their number.
func (ix *Index) Dump() []Event {
	var ranks []WorkerRank
	for _, s := range ix.shards {
		ranks = s.ranks(ranks)
	}
	slices.SortFunc(ranks, cmpWorkerRank)

	type placed struct {
		wr WorkerRank
		dumpRec
	}
	var all []placed
	var recs []dumpRec
	for _, wr := range ranks {
		recs = ix.shardFor(wr.Worker).copyRank(wr, recs[:0])
		for _, r := range rankDepths(recs) {
			all = append(all, placed{wr, r})
		}
	}
	// Stable: within a depth, ranks stay in order and, per rank, blocks in
	// the order rankDepths gave them.
	slices.SortStableFunc(all, func(a, b placed) int { return a.depth - b.depth })

	parentOf := make(map[WorkerRank]map[uint64]uint64, len(ranks)) // key -> engine id, per rank
	events := make([]Event, 0, len(all))
	for _, p := range all {
		byKey := parentOf[p.wr]
		if byKey == nil {
			byKey = make(map[uint64]uint64)
			parentOf[p.wr] = byKey
		}
		byKey[p.key] = p.hash
		for _, t := range []Tier{TierDevice, TierHost, TierDisk} {
			if p.tiers&t == 0 {
				continue
			}
			ev := Event{Kind: Stored, Worker: p.wr, Tier: t, Blocks: []Block{{ID: p.hash, Local: p.local}}}
			if p.depth > 0 {
				ev.Parent, ev.HasParent = byKey[p.parent], true
			}
			events = append(events, ev)
		}
	}
	return events
}

// ranks appends the shard's worker ranks to dst.
func (ix *shard) ranks(dst []WorkerRank) []WorkerRank {
	ix.write.Lock()
	defer ix.write.Unlock()
	return ix.tree.rankList(dst)
}

// copyRank appends the entries of one worker rank to dst, in the
// writers' turn.
func (ix *shard) copyRank(wr WorkerRank, dst []dumpRec) []dumpRec {
	ix.write.Lock()
	defer ix.write.Unlock()
	return ix.tree.copyRank(wr, dst)
}

// rankDepths sets the depth of every record of one rank (a root block has
// key == local) and returns those reachable from the root through the
// rank's own blocks, sorted by engine id for a deterministic dump.
func rankDepths(recs []dumpRec) []dumpRec {
	const unknown, visiting = -2, -3
	byKey := make(map[uint64]int, len(recs))
	for i, r := range recs {
		byKey[r.key] = i
	}
	var path []int
	for i := range recs {
		// Follow the parent chain up to a record whose depth is known.
		path = path[:0]
		j := i
		for recs[j].depth == unknown {
			r := &recs[j]
			if r.key == r.local {
				r.depth = 0
				break
			}
			p, ok := byKey[r.parent]
			if !ok {
				r.depth = -1
				break
			}
			r.depth = visiting
			path = append(path, j)
			j = p
		}
		d := recs[j].depth
		if d == visiting { // a cycle: only possible with a hash collision
			d = -1
		}
		for k := len(path) - 1; k >= 0; k-- {
			if d >= 0 {
				d++
			}
			recs[path[k]].depth = d
		}
	}
	out := recs[:0]
	for _, r := range recs {
		if r.depth >= 0 {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b dumpRec) int {
		if a.depth != b.depth {
			return a.depth - b.depth
		}
		return cmp.Compare(a.hash, b.hash)
	})
	return out
}

// Load applies the Stored events of a dump in order. Events that cannot be
// placed (their parent is missing: the dump was taken while the source
// changed) are skipped and counted; any other error stops the load.
func (ix *Index) Load(events []Event) (skipped int, err error) {
	for i, ev := range events {
		if _, err := ix.Apply(ev); err != nil {
			if errors.Is(err, ErrUnknownParent) {
				skipped++
				continue
			}
			return skipped, fmt.Errorf("load event %d: %w", i, err)
		}
	}
	return skipped, nil
}

func cmpWorkerRank(a, b WorkerRank) int {
	return cmp.Or(cmp.Compare(a.Worker, b.Worker), cmp.Compare(a.Rank, b.Rank))
}

// Hash is a 64-bit block hash in JSON. It encodes as an unsigned integer
// and decodes from an unsigned integer, a negative signed 64-bit integer
// (reinterpreted bit for bit, as Dynamo's clients send values >= 2^63), or
// a decimal string of either. It never passes through float64.
type Hash uint64

// UnmarshalJSON implements json.Unmarshaler.
func (h *Hash) UnmarshalJSON(b []byte) error {
	s := string(bytes.TrimSpace(b))
	if len(s) >= 2 && s[0] == '"' && s[len(s)-1] == '"' {
		s = s[1 : len(s)-1]
	}
	v, err := ParseHash(s)
	if err != nil {
		return err
	}
	*h = Hash(v)
	return nil
}

// ParseHash parses a decimal 64-bit hash, signed or unsigned.
func ParseHash(s string) (uint64, error) {
	if strings.HasPrefix(s, "-") {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("hash %q is not a 64-bit integer", s)
		}
		return uint64(v), nil
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("hash %q is not a 64-bit integer", truncate(s, 40))
	}
	return v, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// The JSON shapes of a dump (Dynamo's RouterEvent).
type (
	jsonDump  map[string]jsonIndex
	jsonIndex struct {
		BlockSize int               `json:"block_size"`
		Events    []jsonRouterEvent `json:"events"`
	}
	jsonRouterEvent struct {
		WorkerID    uint64       `json:"worker_id"`
		StorageTier string       `json:"storage_tier,omitempty"`
		Event       jsonKVCEvent `json:"event"`
	}
	jsonKVCEvent struct {
		EventID uint64        `json:"event_id"`
		Data    jsonEventData `json:"data"`
		DPRank  uint32        `json:"dp_rank"`
	}
	jsonEventData struct {
		Stored  *jsonStored  `json:"stored,omitempty"`
		Removed *jsonRemoved `json:"removed,omitempty"`
		Cleared bool         `json:"-"`
		// ClearedObj accepts {"cleared": ...}, the object spelling of "cleared".
		ClearedObj json.RawMessage `json:"cleared,omitempty"`
	}
	jsonStored struct {
		ParentHash *Hash        `json:"parent_hash"`
		Blocks     []jsonStBlck `json:"blocks"`
	}
	jsonStBlck struct {
		BlockHash  Hash `json:"block_hash"`
		TokensHash Hash `json:"tokens_hash"`
	}
	jsonRemoved struct {
		BlockHashes []Hash `json:"block_hashes"`
	}
)

// MarshalJSON writes "cleared" for a Cleared event, else the object form.
func (d jsonEventData) MarshalJSON() ([]byte, error) {
	if d.Cleared {
		return []byte(`"cleared"`), nil
	}
	type plain jsonEventData
	return json.Marshal(plain(d))
}

// UnmarshalJSON accepts "cleared" (any case) or {"stored": ...} / {"removed": ...}.
func (d *jsonEventData) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		if !strings.EqualFold(s, "cleared") {
			return fmt.Errorf("unknown event data %q", truncate(s, 40))
		}
		*d = jsonEventData{Cleared: true}
		return nil
	}
	type plain jsonEventData
	var p plain
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	*d = jsonEventData(p)
	d.Cleared, d.ClearedObj = d.ClearedObj != nil, nil
	if d.Stored == nil && d.Removed == nil && !d.Cleared {
		return errors.New(`event data has none of "stored", "removed", "cleared"`)
	}
	return nil
}

// ParseTier maps a tier name from a dump or an API ("device", "host_pinned",
// "disk", "external", and the engines' medium names) to a Tier. The empty
// string is the device tier.
func ParseTier(s string) (Tier, error) {
	switch strings.ToLower(s) {
	case "", "device", "gpu", "npu", "g1":
		return TierDevice, nil
	case "host_pinned", "host", "cpu", "cpu_pinned", "cpu_tier1", "g2":
		return TierHost, nil
	case "disk", "external", "cpu_tier2", "nvme", "storage", "network", "remote", "shared", "g3":
		return TierDisk, nil
	}
	return 0, fmt.Errorf("unknown storage tier %q", truncate(s, 40))
}

func toJSONEvent(ev Event) jsonRouterEvent {
	je := jsonRouterEvent{WorkerID: ev.Worker.Worker, StorageTier: ev.Tier.String()}
	je.Event.DPRank = ev.Worker.Rank
	switch ev.Kind {
	case Stored:
		st := &jsonStored{Blocks: make([]jsonStBlck, len(ev.Blocks))}
		if ev.HasParent {
			p := Hash(ev.Parent)
			st.ParentHash = &p
		}
		for i, b := range ev.Blocks {
			st.Blocks[i] = jsonStBlck{BlockHash: Hash(b.ID), TokensHash: Hash(b.Local)}
		}
		je.Event.Data.Stored = st
	case Removed:
		rm := &jsonRemoved{BlockHashes: make([]Hash, len(ev.IDs))}
		for i, h := range ev.IDs {
			rm.BlockHashes[i] = Hash(h)
		}
		je.Event.Data.Removed = rm
	case Cleared:
		je.Event.Data.Cleared = true
		if ev.Tier == AllTiers {
			je.StorageTier = ""
		}
	}
	return je
}

func fromJSONEvent(je jsonRouterEvent) (Event, error) {
	ev := Event{Worker: WorkerRank{Worker: je.WorkerID, Rank: je.Event.DPRank}}
	tier, err := ParseTier(je.StorageTier)
	if err != nil {
		return ev, err
	}
	ev.Tier = tier
	d := je.Event.Data
	switch {
	case d.Stored != nil:
		ev.Kind = Stored
		if d.Stored.ParentHash != nil {
			ev.Parent, ev.HasParent = uint64(*d.Stored.ParentHash), true
		}
		ev.Blocks = make([]Block, len(d.Stored.Blocks))
		for i, b := range d.Stored.Blocks {
			ev.Blocks[i] = Block{ID: uint64(b.BlockHash), Local: uint64(b.TokensHash)}
		}
	case d.Removed != nil:
		ev.Kind = Removed
		ev.IDs = make([]uint64, len(d.Removed.BlockHashes))
		for i, h := range d.Removed.BlockHashes {
			ev.IDs[i] = uint64(h)
		}
	case d.Cleared:
		ev.Kind = Cleared
		if je.StorageTier == "" {
			ev.Tier = AllTiers
		}
	}
	return ev, nil
}

// IndexDump is the dump of one index.
type IndexDump struct {
	Key       Key
	BlockSize int
	Events    []Event
}

// MarshalDump encodes dumps in the /dump JSON format:
// {"<model>:<tenant>": {"block_size": N, "events": [RouterEvent...]}}.
func MarshalDump(dumps []IndexDump) ([]byte, error) {
	doc := make(jsonDump, len(dumps))
	for _, d := range dumps {
		ji := jsonIndex{BlockSize: d.BlockSize, Events: make([]jsonRouterEvent, 0, len(d.Events))}
		for _, ev := range d.Events {
			// The format names one tier per event, or none for all tiers:
			// a Cleared event of some tiers becomes one event per tier.
			if ev.Kind == Cleared && ev.Tier != AllTiers && !ev.Tier.single() {
				for _, t := range []Tier{TierDevice, TierHost, TierDisk} {
					if ev.Tier&t != 0 {
						one := ev
						one.Tier = t
						ji.Events = append(ji.Events, toJSONEvent(one))
					}
				}
				continue
			}
			ji.Events = append(ji.Events, toJSONEvent(ev))
		}
		for i := range ji.Events {
			ji.Events[i].Event.EventID = uint64(i)
		}
		doc[d.Key.String()] = ji
	}
	return json.Marshal(doc)
}

// A DumpError is an index of a dump that UnmarshalDump left out: its key,
// block size or one of its events is invalid.
type DumpError struct {
	Index string // the index's name in the dump ("<model>:<tenant>")
	Err   error
}

func (e *DumpError) Error() string { return fmt.Sprintf("dump %q: %v", e.Index, e.Err) }

func (e *DumpError) Unwrap() error { return e.Err }

// UnmarshalDump decodes the /dump JSON format, sorted by key. It validates
// every key, block size and event. A document that is not a dump is an
// error and no indexes; an invalid index is left out, the others returned
// with an error joining a *DumpError for each index left out (the first
// problem found in it), in key order.
func UnmarshalDump(data []byte) ([]IndexDump, error) {
	var doc map[string]json.RawMessage // each index decoded on its own
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("decode dump: %w", err)
	}
	if dec.More() {
		return nil, errors.New("decode dump: trailing data after the JSON object")
	}
	out := make([]IndexDump, 0, len(doc))
	var bad []*DumpError
	for name, raw := range doc {
		d, err := decodeIndex(name, raw)
		if err != nil {
			bad = append(bad, &DumpError{Index: name, Err: err})
			continue
		}
		out = append(out, d)
	}
	slices.SortFunc(out, func(a, b IndexDump) int { return strings.Compare(a.Key.String(), b.Key.String()) })
	if len(bad) == 0 {
		return out, nil
	}
	slices.SortFunc(bad, func(a, b *DumpError) int { return strings.Compare(a.Index, b.Index) })
	errs := make([]error, len(bad))
	for i, e := range bad {
		errs[i] = e
	}
	return out, errors.Join(errs...)
}

// decodeIndex decodes and validates the index named name of a dump.
func decodeIndex(name string, raw json.RawMessage) (IndexDump, error) {
	key, err := ParseKey(name)
	if err != nil {
		return IndexDump{}, err
	}
	var ji jsonIndex
	if err := json.Unmarshal(raw, &ji); err != nil {
		return IndexDump{}, fmt.Errorf("decode: %w", err)
	}
	if ji.BlockSize < 1 || ji.BlockSize > MaxBlockSize {
		return IndexDump{}, fmt.Errorf("block_size %d out of range 1..%d", ji.BlockSize, MaxBlockSize)
	}
	d := IndexDump{Key: key, BlockSize: ji.BlockSize, Events: make([]Event, len(ji.Events))}
	for i, je := range ji.Events {
		if d.Events[i], err = fromJSONEvent(je); err != nil {
			return IndexDump{}, fmt.Errorf("event %d: %w", i, err)
		}
		if d.Events[i].Kind == 0 {
			return IndexDump{}, fmt.Errorf("event %d: no event data", i)
		}
	}
	return d, nil
}
