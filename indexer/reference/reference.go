// Package reference is a plain KV block index: maps under one mutex, each
// worker rank on its own, no tree and nothing shared between ranks. It
// implements indexer.Interface as plainly as it can be written, so that
// tests can run indexer.Index, the optimised one, against it on every
// step. It is slow on purpose: a match looks up every rank. It imports
// nothing of kvgate but package indexer, and nothing outside tests should
// import it.
package reference

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/kvgate/kvgate/indexer"
)

// Index is a KV block index of one (model, tenant), safe for concurrent
// use: every call holds its mutex.
type Index struct {
	blockSize int

	mu    sync.Mutex
	ranks map[indexer.WorkerRank]*rank
}

var _ indexer.Interface = (*Index)(nil)

// rank is what one worker rank holds. A block is named by its sequence
// hash, its key.
type rank struct {
	// names maps each engine id the rank uses to the key of the block it
	// names. A name outlives the rank's last tier of its block only where
	// another name of the same block took that tier off.
	names map[uint64]uint64
	// held is the tiers the rank holds each block on; no entry is 0.
	held map[uint64]indexer.Tier
	// blocks is every block the rank ever stored, for dumps: a block's
	// local hash and parent follow from its key, so they never go stale.
	blocks map[uint64]block
}

// block is what a dump needs of a block.
type block struct {
	local  uint64
	parent uint64 // the parent's key, if not root
	root   bool
}

// New returns an empty index for blocks of blockSize tokens.
func New(blockSize int) *Index {
	return &Index{blockSize: blockSize, ranks: make(map[indexer.WorkerRank]*rank)}
}

// BlockSize returns the number of tokens per block.
func (ix *Index) BlockSize() int { return ix.blockSize }

// Apply applies one event.
func (ix *Index) Apply(ev indexer.Event) (indexer.ApplyResult, error) {
	if err := check(ev); err != nil {
		return indexer.ApplyResult{}, err
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	r := ix.ranks[ev.Worker]
	switch {
	case ev.Kind == indexer.Stored && ev.ByID:
		return r.addTier(ev.Tier, ev.IDs), nil
	case ev.Kind == indexer.Stored:
		return ix.store(ev)
	case ev.Kind == indexer.Removed:
		return r.remove(ev.Tier, ev.IDs), nil
	default: // Cleared
		if r == nil {
			return indexer.ApplyResult{}, nil
		}
		res := r.remove(ev.Tier, slices.Collect(maps.Keys(r.names)))
		res.Unknown = 0 // ids whose blocks were on none of the tiers
		return res, nil
	}
}

// check returns ErrBadEvent for a malformed event.
func check(ev indexer.Event) error {
	one := ev.Tier == indexer.TierDevice || ev.Tier == indexer.TierHost || ev.Tier == indexer.TierDisk
	switch {
	case ev.Kind == indexer.Stored && !one, ev.Kind == indexer.Removed && !one:
		return fmt.Errorf("%w: %s event with tier %s", indexer.ErrBadEvent, ev.Kind, ev.Tier)
	case ev.Kind == indexer.Cleared && (ev.Tier == 0 || ev.Tier&^indexer.AllTiers != 0):
		return fmt.Errorf("%w: cleared event with tier %s", indexer.ErrBadEvent, ev.Tier)
	case ev.Kind != indexer.Stored && ev.Kind != indexer.Removed && ev.Kind != indexer.Cleared:
		return fmt.Errorf("%w: kind %d", indexer.ErrBadEvent, ev.Kind)
	}
	return nil
}

// store applies a Stored event that names its blocks with their tokens'
// hashes: block i is the child of block i-1, block 0 of the block the
// rank names Parent (or a root). A rank's first Stored event makes it.
func (ix *Index) store(ev indexer.Event) (indexer.ApplyResult, error) {
	var res indexer.ApplyResult
	r := ix.ranks[ev.Worker]
	var prev uint64
	if ev.HasParent {
		key, ok := uint64(0), false
		if r != nil {
			key, ok = r.names[ev.Parent]
		}
		if !ok {
			return res, fmt.Errorf("%w %d for %s", indexer.ErrUnknownParent, ev.Parent, ev.Worker)
		}
		prev = key
	}
	if r == nil {
		r = &rank{names: make(map[uint64]uint64), held: make(map[uint64]indexer.Tier), blocks: make(map[uint64]block)}
		ix.ranks[ev.Worker] = r
	}
	for i, b := range ev.Blocks {
		root := i == 0 && !ev.HasParent
		key := b.Local
		if !root {
			key = indexer.NextSequenceHash(prev, b.Local)
		}
		r.blocks[key] = block{local: b.Local, parent: prev, root: root}
		if old, ok := r.names[b.ID]; ok && old != key {
			// The engine reused the id for other content: the block it
			// named is gone from every tier.
			res.Removed += tiers(r.held[old])
			delete(r.held, old)
		}
		r.names[b.ID] = key
		if r.held[key]&ev.Tier == 0 {
			r.held[key] |= ev.Tier
			res.Stored++
		}
		prev = key
	}
	return res, nil
}

// tiers returns how many tiers t has.
func tiers(t indexer.Tier) int {
	n := 0
	for _, one := range []indexer.Tier{indexer.TierDevice, indexer.TierHost, indexer.TierDisk} {
		if t&one != 0 {
			n++
		}
	}
	return n
}

// addTier applies a Stored event that names blocks by engine id only:
// tier is added to the blocks those ids name, where the rank holds them
// on some tier; the other ids are counted unknown.
func (r *rank) addTier(tier indexer.Tier, ids []uint64) indexer.ApplyResult {
	var res indexer.ApplyResult
	for _, id := range ids {
		var have indexer.Tier
		key, ok := uint64(0), false
		if r != nil {
			key, ok = r.names[id]
			have = r.held[key]
		}
		switch {
		case !ok || have == 0:
			res.Unknown++
		case have&tier == 0:
			r.held[key] |= tier
			res.Stored++
		}
	}
	return res
}

// remove takes tiers off the blocks ids name, one id after the other,
// and drops each id whose block the rank then holds on no tier. Removed
// counts the (block, tier) entries that went for a single tier, or ids
// for a Removed event, whose tier is one; Unknown the others.
func (r *rank) remove(tiersOff indexer.Tier, ids []uint64) indexer.ApplyResult {
	var res indexer.ApplyResult
	for _, id := range ids {
		key, ok := uint64(0), false
		if r != nil {
			key, ok = r.names[id]
		}
		if !ok {
			res.Unknown++
			continue
		}
		have := r.held[key]
		gone := tiers(have & tiersOff)
		if left := have &^ tiersOff; left != 0 {
			r.held[key] = left
		} else {
			delete(r.held, key)
			delete(r.names, id)
		}
		if gone == 0 {
			res.Unknown++
		}
		res.Removed += gone
	}
	return res
}

// Match appends to dst one Overlap per worker rank that holds seq[0] on
// some tier, in the order of the ranks: for each tier class, how many of
// seq's blocks, from the first, the rank holds on a tier of that class.
func (ix *Index) Match(seq []uint64, dst []indexer.Overlap) []indexer.Overlap {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if len(seq) == 0 {
		return dst
	}
	for _, wr := range ix.sortedRanks() {
		r := ix.ranks[wr]
		if r.held[seq[0]] == 0 {
			continue
		}
		o := indexer.Overlap{Worker: wr, Blocks: int32(len(r.names))}
		o.Device = prefix(r, seq, indexer.TierDevice)
		o.Host = prefix(r, seq, indexer.TierDevice|indexer.TierHost)
		o.Disk = prefix(r, seq, indexer.AllTiers)
		dst = append(dst, o)
	}
	return dst
}

// prefix returns how many of seq's blocks, from the first, r holds on
// one of tiers.
func prefix(r *rank, seq []uint64, tiers indexer.Tier) int32 {
	n := int32(0)
	for _, key := range seq {
		if r.held[key]&tiers == 0 {
			break
		}
		n++
	}
	return n
}

// sortedRanks returns the index's worker ranks in order.
func (ix *Index) sortedRanks() []indexer.WorkerRank {
	return slices.SortedFunc(maps.Keys(ix.ranks), cmpRank)
}

func cmpRank(a, b indexer.WorkerRank) int {
	return cmp.Or(cmp.Compare(a.Worker, b.Worker), cmp.Compare(a.Rank, b.Rank))
}

// RemoveWorker drops every rank of worker.
func (ix *Index) RemoveWorker(worker uint64) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	for wr := range ix.ranks {
		if wr.Worker == worker {
			delete(ix.ranks, wr)
		}
	}
}

// RemoveWorkerRank drops one rank.
func (ix *Index) RemoveWorkerRank(wr indexer.WorkerRank) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	delete(ix.ranks, wr)
}

// BlockCounts returns how many engine ids each rank uses.
func (ix *Index) BlockCounts() map[indexer.WorkerRank]int {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	out := make(map[indexer.WorkerRank]int, len(ix.ranks))
	for wr, r := range ix.ranks {
		out[wr] = len(r.names)
	}
	return out
}

// Stats returns the index's size. Nodes counts the blocks some rank holds
// or names, once each.
func (ix *Index) Stats() indexer.Stats {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	st := indexer.Stats{Workers: len(ix.ranks)}
	nodes := make(map[uint64]bool)
	for _, r := range ix.ranks {
		st.Entries += len(r.names)
		for _, key := range r.names {
			nodes[key] = true
		}
		for key := range r.held {
			nodes[key] = true
		}
	}
	st.Nodes = len(nodes)
	return st
}

// Dump returns, rank by rank, a Stored event of one block for each (engine
// id, tier) of a block the rank holds on that tier and reaches from a root
// through blocks it holds, parents first.
func (ix *Index) Dump() []indexer.Event {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	var events []indexer.Event
	for _, wr := range ix.sortedRanks() {
		r := ix.ranks[wr]
		type named struct {
			id    uint64
			depth int
		}
		var dumped []named
		for id, key := range r.names {
			if d, ok := r.depth(key); ok {
				dumped = append(dumped, named{id, d})
			}
		}
		slices.SortFunc(dumped, func(a, b named) int { return cmp.Or(cmp.Compare(a.depth, b.depth), cmp.Compare(a.id, b.id)) })
		idOf := make(map[uint64]uint64) // key -> an id naming it, dumped before
		for _, n := range dumped {
			key := r.names[n.id]
			b := r.blocks[key]
			for _, t := range []indexer.Tier{indexer.TierDevice, indexer.TierHost, indexer.TierDisk} {
				if r.held[key]&t == 0 {
					continue
				}
				ev := indexer.Event{Kind: indexer.Stored, Worker: wr, Tier: t, Blocks: []indexer.Block{{ID: n.id, Local: b.local}}}
				if !b.root {
					ev.Parent, ev.HasParent = idOf[b.parent], true
				}
				events = append(events, ev)
			}
			idOf[key] = n.id
		}
	}
	return events
}

// depth returns the depth of block key, if the rank holds it and every
// block from a root to it.
func (r *rank) depth(key uint64) (int, bool) {
	d := 0
	for seen := 0; seen <= len(r.held); seen++ { // a cycle: only with a hash collision
		if r.held[key] == 0 {
			return 0, false
		}
		b := r.blocks[key]
		if b.root {
			return d, true
		}
		key, d = b.parent, d+1
	}
	return 0, false
}

// Load applies the Stored events of a dump in order, skipping and counting
// those whose parent is missing.
func (ix *Index) Load(events []indexer.Event) (skipped int, err error) {
	for i, ev := range events {
		if _, err := ix.Apply(ev); err != nil {
			if errors.Is(err, indexer.ErrUnknownParent) {
				skipped++
				continue
			}
			return skipped, fmt.Errorf("load event %d: %w", i, err)
		}
	}
	return skipped, nil
}
