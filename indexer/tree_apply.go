package indexer

import (
	"math/bits"
	"slices"
)

// This file applies events to a spanTree: stores, removals, clears and
// a rank's removal, step by step.

// maxStretch bounds the blocks that one step of a store, a removal or an
// id-only store takes at once (see store, run). Unbounded steps apply
// events faster, but lengthen the tail of the matches that run meanwhile
// (docs/design.md); a writer may give up its core between steps (see
// spanTree.yield).
const maxStretch = 16

// step reports a step of n blocks to yield, if set.
func (t *spanTree) step(n int) {
	if t.yield != nil {
		t.yield(n)
	}
}

// isolate splits spans so that blocks b..b+k-1, all in one span, are a
// span of their own, and returns it.
func (t *spanTree) isolate(b, k uint32) uint32 {
	s := t.blocks.at(b).span
	S := t.spans[s]
	o := b - S.first
	if o+k < S.n {
		t.split(s, o+k)
	}
	if o > 0 {
		t.split(t.blocks.at(b).span, o)
	}
	return t.blocks.at(b).span
}

// setTiers makes slot hold blocks b..b+k-1 (in one span) on exactly
// tiers, which differ from the tiers it holds them on.
func (t *spanTree) setTiers(b, k, slot uint32, tiers Tier) {
	s := t.isolate(b, k)
	t.setSpanSet(s, t.with(t.spans[s].set, slot, tiers), slot, tiers)
	t.tidy(s)
}

func (t *spanTree) depthOf(b uint32) uint32 {
	S := &t.spans[t.blocks.at(b).span]
	return S.depth + b - S.first
}

func (t *spanTree) rank(wr WorkerRank) uint32 {
	if s, ok := t.slotOf[wr]; ok {
		return s
	}
	i := reuse(&t.ranks, &t.freeSlots)
	if int(i) == len(t.who) {
		t.who = append(t.who, rankHead{})
	}
	t.who[i] = rankHead{wr: wr}
	t.slotOf[wr] = i
	return i
}

// blockTiers returns the tiers slot holds block b on.
func (t *spanTree) blockTiers(slot, b uint32) Tier {
	return t.tiersIn(t.spans[t.blocks.at(b).span].set, slot)
}

// unpin drops an engine id's pin of block b.
func (t *spanTree) unpin(b uint32) {
	if t.blocks.at(b).pins--; t.blocks.at(b).pins == 0 {
		if s := t.blocks.at(b).span; t.spans[s].set == 0 && t.spans[s].kids == 0 {
			t.prune(s)
		}
	}
}

// detach takes tiers off the block that engine id h of slot names, and
// drops h where the rank then holds that block on no tier (or did not
// hold it). It returns the (block, tier) entries that removed.
func (t *spanTree) detach(slot uint32, h uint64, tiers Tier) int {
	_, removed := t.detachRun(slot, []uint64{h}, tiers)
	return removed
}

// detachRun detaches (see detach) the engine ids that begin hs: a run of
// them (see run), where the rank holds their blocks on some of tiers, at
// once, as where an engine evicts a request's blocks from one tier while
// another tier or rank keeps them; else the first alone. It returns how
// many ids it took and the (block, tier) entries they removed.
func (t *spanTree) detachRun(slot uint32, hs []uint64, tiers Tier) (int, int) {
	names := &t.ranks[slot].names
	i, ok := names.lookup(hs[0])
	if !ok {
		return 1, 0
	}
	b := names.wordAt(i)
	sp := t.blocks.at(b).span
	S := &t.spans[sp]
	before := t.tiersIn(S.set, slot)
	left := before &^ tiers
	removed := bits.OnesCount8(uint8(before & tiers))
	if left == 0 && b == S.first+S.n-1 && S.kids == 0 && t.blocks.at(b).pins == 1 && len(t.sets[S.set].elems) == 1 {
		// The tail of a chain only this rank holds (h alone names it,
		// so its one holder is this rank), as engines evict: the span
		// gets shorter, rather than setTiers splitting the block off.
		t.unname(names, slot, i, b) // no prune: the span has a holder
		t.prune(sp)
		return 1, removed
	}
	if left == before {
		if left == 0 {
			t.unname(names, slot, i, b)
		}
		return 1, 0
	}
	// Where the rank keeps none of the run's tiers, its ids go before
	// setTiers, whose tidy prunes the blocks that then go: the span has
	// the rank as holder until then, so that unpin prunes nothing.
	if left == 0 {
		t.unname(names, slot, i, b)
	}
	k, lo := t.run(names, hs, b, slot, left == 0)
	t.setTiers(lo, uint32(k), slot, left)
	return k, k * removed
}

// store applies a Stored event (not ByID). Stretches of blocks along one
// span, under engine ids that name them or nothing yet, and of new
// blocks, under engine ids the rank does not use, are stored up to
// maxStretch at a time; other blocks one by one (see storeOne).
func (t *spanTree) store(ev Event) (ApplyResult, error) {
	if t.blocks.len()+len(ev.Blocks) > 1<<31 {
		return ApplyResult{}, errTreeFull
	}
	slot, known := t.slotOf[ev.Worker]
	cur := noBlock
	var prev uint64
	if ev.HasParent {
		if !known {
			return ApplyResult{}, ErrUnknownParent
		}
		b, ok := t.ranks[slot].names.get(ev.Parent)
		if !ok {
			return ApplyResult{}, ErrUnknownParent
		}
		cur, prev = b, t.blocks.at(b).key
	}
	if !known {
		slot = t.rank(ev.Worker)
	}
	names := &t.ranks[slot].names
	var res ApplyResult
	var pend, pendN uint32 // ids allocated for new blocks and not used yet
	keyOf := func(i int) uint64 {
		if i == 0 && cur == noBlock {
			return ev.Blocks[0].Local
		}
		return NextSequenceHash(prev, ev.Blocks[i].Local)
	}
	for i := 0; i < len(ev.Blocks); {
		key := keyOf(i)
		nxt := t.next(cur, key)
		k, at := 0, nxt // at: the first of the k blocks claimed
		if nxt != noBlock {
			// Along nxt's span, whose blocks the rank holds on the same
			// tiers (none, or others, as where an engine copies blocks
			// to host memory), while each engine id names its block
			// or nothing yet.
			S := &t.spans[t.blocks.at(nxt).span]
			last := S.first + S.n - 1
			before := t.tiersIn(S.set, slot)
			for kk := key; ; {
				if !t.own(names, slot, ev.Blocks[i+k].ID, nxt+uint32(k), len(ev.Blocks)-i-k) {
					break
				}
				prev = kk
				if k++; i+k == len(ev.Blocks) || nxt+uint32(k) > last || k == maxStretch {
					break
				}
				if kk = NextSequenceHash(kk, ev.Blocks[i+k].Local); t.blocks.at(nxt+uint32(k)).key != kk {
					break
				}
			}
			if k > 0 && before&ev.Tier == 0 {
				t.setTiers(nxt, uint32(k), slot, before|ev.Tier)
				res.Stored += k
			}
		} else {
			// New blocks: all that follow are new too. They take ids
			// from one range, allocated for all of them, each one, so
			// that the event uses it up; an engine id already in use
			// ends the stretch (storeOne takes it).
			if pendN == 0 {
				pendN = uint32(len(ev.Blocks) - i)
				pend = t.alloc(pendN)
			}
			first := pend
			at = first
			for kk := key; ; {
				*t.blocks.at(first + uint32(k)) = blockRec{key: kk, local: ev.Blocks[i+k].Local, span: noBlock}
				if !t.claim(names, slot, ev.Blocks[i+k].ID, first+uint32(k), len(ev.Blocks)-i-k) {
					break
				}
				prev = kk
				if k++; i+k == len(ev.Blocks) || k == maxStretch {
					break
				}
				kk = NextSequenceHash(kk, ev.Blocks[i+k].Local)
			}
			pend, pendN = pend+uint32(k), pendN-uint32(k)
			if pendN > 0 {
				t.blocks.at(pend).span = noBlock // the ends of what is pending stay marked
			}
			if k > 0 {
				t.attach(cur, first, uint32(k), slot, ev.Tier)
				res.Stored += k
			}
		}
		if k > 0 {
			i += k
			cur = at + uint32(k) - 1
			t.step(k)
			continue
		}
		if nxt == noBlock {
			// A new block whose engine id names another: it is pend,
			// written above, held by storeOne.
			nxt = pend
			t.attachSet(cur, nxt, 1, 0)
			if pend, pendN = pend+1, pendN-1; pendN > 0 {
				t.blocks.at(pend).span = noBlock
			}
		}
		added, removed := t.storeOne(slot, nxt, ev.Blocks[i], ev.Tier)
		cur = nxt
		res.Stored += added
		res.Removed += removed
		prev = key
		i++
		t.step(1)
	}
	return res, nil
}

// own makes engine id h of slot, in names, name block b, if h names
// nothing yet (see claim), and reports whether h names b.
func (t *spanTree) own(names *blockTable, slot uint32, h uint64, b uint32, left int) bool {
	if t.claim(names, slot, h, b, left) {
		return true
	}
	named, _ := names.get(h)
	return named == b
}

// claim makes engine id h of slot, in names, name block b, if h names
// nothing yet (else it reports false), growing names for left more ids if
// it is full.
func (t *spanTree) claim(names *blockTable, slot uint32, h uint64, b uint32, left int) bool {
	if !names.add(h, b, left) {
		return false
	}
	t.who[slot].blocks++
	t.blocks.at(b).pins++
	return true
}

// unname drops the engine id at i in names (see blockTable.lookup) of
// slot, which names block b.
func (t *spanTree) unname(names *blockTable, slot uint32, i int, b uint32) {
	names.delAt(i)
	t.who[slot].blocks--
	t.unpin(b)
}

// next returns the block with key under block cur (noBlock: a root), or
// noBlock.
func (t *spanTree) next(cur uint32, key uint64) uint32 {
	if cur == noBlock {
		if s, ok := t.childSpan(noBlock, key); ok {
			return t.spans[s].first
		}
		return noBlock
	}
	S := &t.spans[t.blocks.at(cur).span]
	if cur != S.first+S.n-1 {
		if t.blocks.at(cur+1).key == key {
			return cur + 1
		}
		return noBlock
	}
	if S.kids > 0 {
		if s, ok := t.childSpan(cur, key); ok {
			return t.spans[s].first
		}
	}
	return noBlock
}

// childSpan returns the span under block parent (noBlock: a root) whose
// first block has key.
func (t *view) childSpan(parent uint32, key uint64) (uint32, bool) {
	s, ok := t.heads.get(key)
	return s, ok && t.spans[s].parent == parent
}

// storeOne stores block nxt, which is in a span, for slot, whatever its
// engine id (bl's) named before, and returns the (block, tier) entries
// added and removed.
func (t *spanTree) storeOne(slot, nxt uint32, bl Block, tier Tier) (int, int) {
	r := &t.ranks[slot]
	old, had := r.names.get(bl.ID)
	removed := 0
	if had && old != nxt {
		// The engine reused an id for other content: the old block is
		// gone. (nxt, and its parent, stay: the parent has nxt as
		// child, and nxt is pinned or held, or is new and held below.)
		t.blocks.at(nxt).pins++ // keeps a new nxt through the detach
		removed = t.detach(slot, bl.ID, AllTiers)
		t.blocks.at(nxt).pins--
		had = false
	}
	if !had {
		t.claim(&r.names, slot, bl.ID, nxt, 1) // h names nothing now
	}
	added := 0
	if before := t.blockTiers(slot, nxt); before&tier == 0 {
		t.setTiers(nxt, 1, slot, before|tier)
		added = 1
	}
	return added, removed
}

// attach makes blocks first..first+k-1, new and chained, a span under cur
// (noBlock: a root) held by slot on tier alone, or extends cur's span with
// them where it can.
func (t *spanTree) attach(cur, first, k, slot uint32, tier Tier) {
	t.attachSet(cur, first, k, t.with(0, slot, tier))
}

// attachSet makes blocks first..first+k-1, new and chained, a span of set
// (whose reference it takes) under cur (noBlock: a root), or extends
// cur's span with them where it can.
func (t *spanTree) attachSet(cur, first, k, set uint32) {
	end := t.blocks.at(first + k - 1).key
	depth := uint32(0)
	if cur != noBlock {
		s := t.blocks.at(cur).span
		if S := &t.spans[s]; cur != S.first+S.n-1 {
			t.split(s, cur-S.first+1)
			s = t.blocks.at(cur).span
		}
		S := t.spanForWrite(s)
		if S.kids == 0 && S.first+S.n == first && S.set == set {
			S.n += k
			S.end = end
			t.relabel(first, k, s)
			t.unref(set)
			return
		}
		S.kids++
		depth = t.depthOf(cur) + 1
	}
	ns := t.newSpan(span{first: first, n: k, depth: depth, parent: cur, set: set, end: end})
	t.relabel(first, k, ns)
	t.putHead(t.blocks.at(first).key, ns)
	t.refreshDiff(ns)
}

// remove applies a Removed event.
func (t *spanTree) remove(ev Event) ApplyResult {
	var res ApplyResult
	slot, ok := t.slotOf[ev.Worker]
	if !ok {
		res.Unknown = len(ev.IDs)
		return res
	}
	for hs := ev.IDs; len(hs) > 0; {
		k, removed := t.detachRun(slot, hs, ev.Tier)
		if removed > 0 {
			res.Removed += k
		} else {
			res.Unknown += k
		}
		hs = hs[k:]
		t.step(k)
	}
	return res
}

// run returns how many of the engine ids that begin hs, the first naming
// block b, name consecutive blocks of b's span, in either order, up to
// maxStretch, and the lowest of those blocks. With drop, it drops from
// names, slot's, each id but the first that it counts (see detachRun).
func (t *spanTree) run(names *blockTable, hs []uint64, b, slot uint32, drop bool) (int, uint32) {
	S := &t.spans[t.blocks.at(b).span]
	k, lo, hi := 1, b, b
	for ; k < len(hs) && k < maxStretch; k++ {
		j, ok := names.lookup(hs[k])
		if !ok {
			break
		}
		nb := names.wordAt(j)
		if nb+1 == lo && nb >= S.first && hi == b {
			lo = nb
		} else if nb == hi+1 && nb < S.first+S.n && lo == b {
			hi = nb
		} else {
			break
		}
		if drop {
			t.unname(names, slot, j, nb)
		}
	}
	return k, lo
}

// storeByID applies a Stored event with ByID: Tier is added to the blocks
// whose engine ids the rank holds on some tier; to a run of them at once
// (see run), as Mooncake's store publisher names a request's blocks.
func (t *spanTree) storeByID(ev Event) ApplyResult {
	var res ApplyResult
	slot, known := t.slotOf[ev.Worker]
	for hs := ev.IDs; len(hs) > 0; {
		k, b, before := 1, uint32(0), Tier(0)
		if known {
			if named, ok := t.ranks[slot].names.get(hs[0]); ok {
				b, before = named, t.blockTiers(slot, named)
			}
		}
		switch {
		case before == 0:
			res.Unknown++
		case before&ev.Tier == 0:
			k, b = t.run(&t.ranks[slot].names, hs, b, slot, false)
			t.setTiers(b, uint32(k), slot, before|ev.Tier)
			res.Stored += k
		}
		hs = hs[k:]
		t.step(k)
	}
	return res
}

// clear applies a Cleared event of rank wr, whose engine ids are ids,
// listed before the tree changes (see clearOrder).
func (t *spanTree) clear(wr WorkerRank, tiers Tier, ids []uint64) ApplyResult {
	var res ApplyResult
	slot, ok := t.slotOf[wr]
	if !ok {
		return res
	}
	for hs := ids; len(hs) > 0; {
		k, removed := t.detachRun(slot, hs, tiers)
		res.Removed += removed
		hs = hs[k:]
		t.step(k)
	}
	return res
}

// clearOrder returns the engine ids of slot in the order clear takes
// them: by the blocks they name, last first, so that a chain's blocks
// go in runs (see detachRun), and those of a chain only the rank holds
// from its tail. It only reads the tree.
func (t *spanTree) clearOrder(slot uint32) []uint64 {
	names := &t.ranks[slot].names
	ids := make([]uint64, 0, names.len())
	keys := make([]uint64, 0, names.len()) // block<<32 | index in ids
	names.each(func(h uint64, b uint32) {
		keys = append(keys, uint64(b)<<32|uint64(len(ids)))
		ids = append(ids, h)
	})
	slices.Sort(keys)
	out := make([]uint64, len(ids))
	for i, k := range keys {
		out[len(out)-1-i] = ids[uint32(k)]
	}
	return out
}

// removeRank forgets wr, whose engine ids are ids (see clear).
func (t *spanTree) removeRank(wr WorkerRank, ids []uint64) {
	slot, ok := t.slotOf[wr]
	if !ok {
		return
	}
	t.clear(wr, AllTiers, ids)
	t.ranks[slot] = rankInfo{}
	t.who[slot] = rankHead{}
	delete(t.slotOf, wr)
	t.freeSlots = append(t.freeSlots, slot)
}

// rankIDs is a rank with its engine ids.
type rankIDs struct {
	wr  WorkerRank
	ids []uint64
}

// leaving returns the ranks for which gone is true, with their engine ids
// (see removeRank). It only reads the tree.
func (t *spanTree) leaving(gone func(WorkerRank) bool) []rankIDs {
	var out []rankIDs
	for wr, slot := range t.slotOf {
		if gone(wr) {
			out = append(out, rankIDs{wr, t.clearOrder(slot)})
		}
	}
	return out
}

// apply applies ev.
func (t *spanTree) apply(ev Event) (ApplyResult, error) {
	switch {
	case ev.Kind == Stored && ev.ByID:
		return t.storeByID(ev), nil
	case ev.Kind == Stored:
		return t.store(ev)
	case ev.Kind == Removed:
		return t.remove(ev), nil
	case ev.Kind == Cleared:
		slot, ok := t.slotOf[ev.Worker]
		if !ok {
			return ApplyResult{}, nil
		}
		return t.clear(ev.Worker, ev.Tier, t.clearOrder(slot)), nil
	}
	return ApplyResult{}, ErrBadEvent
}
