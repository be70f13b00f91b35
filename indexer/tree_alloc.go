package indexer

import (
	"math/bits"
	"unsafe"
)

// This file allocates a spanTree's blocks (the slab and its free ranges),
// warms the cache for an event (warm), trims the ranks' tables, and reads
// a rank's blocks for dumps.

// freeClass is the free list of ranges of n blocks.
func freeClass(n uint32) int { return bits.Len32(n) - 1 }

// alloc returns the first of k consecutive block ids, not free and not in
// any span (see taken), reusing a free range where one is long enough.
func (t *spanTree) alloc(k uint32) uint32 {
	for c := freeClass(k); c < len(t.freeHead); c++ {
		a := t.freeHead[c]
		if a == noBlock {
			continue
		}
		n := uint32(t.blocks.at(a).key)
		if n < k {
			continue // only in k's own class; longer ones are above
		}
		t.unlinkFree(a, n)
		if n > k {
			t.linkFree(a+k, n-k)
		}
		t.taken(a, k)
		return a
	}
	a := t.blocks.grow(k)
	t.taken(a, k)
	return a
}

// taken accounts for k blocks from a allocated. Only the range's ends are
// marked as neither free nor in a span, as release looks at a freed
// range's neighbours only; the caller writes each block before it puts
// it in a span, and marks the first of those it keeps pending (see store).
func (t *spanTree) taken(a, k uint32) {
	t.live += int(k)
	t.blocks.at(a).span = noBlock
	t.blocks.at(a + k - 1).span = noBlock
}

// release lets go of blocks a..a+n-1, which left their span: it marks
// them pending, and frees them (freeRange) once no view that may reach
// them is read (see spanTree.pend), as freeing rewrites their keys.
func (t *spanTree) release(a, n uint32) {
	t.live -= int(n)
	for b := a; b < a+n; b++ {
		t.blocks.at(b).span = pendingBlock
	}
	t.pend.blocks = append(t.pend.blocks, [2]uint32{a, n})
}

// freeRange frees blocks a..a+n-1, released (see release) before the
// last publication, joining them with free neighbours, and gives a range
// at the end back by shortening blocks. No two free ranges touch, so
// every free range is whole in one list.
func (t *spanTree) freeRange(a, n uint32) {
	for b := a; b < a+n; b++ {
		*t.blocks.at(b) = blockRec{span: freeBlock}
	}
	if a > 0 && t.blocks.at(a-1).span == freeBlock {
		l := uint32(t.blocks.at(a - 1).key) // the left range's last block holds its length
		t.unlinkFree(a-l, l)
		a, n = a-l, n+l
	}
	if e := a + n; int(e) < t.blocks.len() && t.blocks.at(e).span == freeBlock {
		r := uint32(t.blocks.at(e).key)
		t.unlinkFree(e, r)
		n += r
	}
	if int(a+n) == t.blocks.len() {
		t.blocks.n = a
		return
	}
	t.linkFree(a, n)
}

// linkFree lists the free range a..a+n-1: its first block keeps its
// length (key) and its list links (local: previous<<32 | next), its last
// block its length too.
func (t *spanTree) linkFree(a, n uint32) {
	c := freeClass(n)
	next := t.freeHead[c]
	*t.blocks.at(a) = blockRec{key: uint64(n), local: uint64(noBlock)<<32 | uint64(next), span: freeBlock}
	t.blocks.at(a+n-1).key, t.blocks.at(a+n-1).span = uint64(n), freeBlock
	if next != noBlock {
		t.setFreeLinks(next, a, t.freeNext(next))
	}
	t.freeHead[c] = a
}

func (t *spanTree) freePrev(a uint32) uint32 { return uint32(t.blocks.at(a).local >> 32) }
func (t *spanTree) freeNext(a uint32) uint32 { return uint32(t.blocks.at(a).local) }

func (t *spanTree) setFreeLinks(a, prev, next uint32) {
	t.blocks.at(a).local = uint64(prev)<<32 | uint64(next)
}

// unlinkFree takes the free range a..a+n-1 off its list.
func (t *spanTree) unlinkFree(a, n uint32) {
	prev, next := t.freePrev(a), t.freeNext(a)
	if prev != noBlock {
		t.setFreeLinks(prev, t.freePrev(prev), next)
	} else {
		t.freeHead[freeClass(n)] = next
	}
	if next != noBlock {
		t.setFreeLinks(next, prev, t.freeNext(next))
	}
}

// warm reads, for each block of ev, the slot of its rank's engine id
// table where a lookup of its engine id starts, and, for a Removed event,
// the block that id names, so that applying ev finds them in the cache.
// It only reads the tree, and the loads of one pass are independent of
// each other, so the processor makes them at once rather than one miss
// after the other.
func (t *spanTree) warm(ev Event) uint64 {
	slot, ok := t.slotOf[ev.Worker]
	if !ok || ev.ByID || ev.Kind != Stored && ev.Kind != Removed {
		return 0
	}
	names := &t.ranks[slot].names
	tab := names.tab
	size := len(tab)
	if size == 0 {
		return 0
	}
	var sum uint64
	if ev.Kind == Stored {
		for _, b := range ev.Blocks {
			sum += uint64(tab[home(mix(b.ID), size)].lo)
		}
		return sum
	}
	for _, h := range ev.IDs {
		sum += uint64(names.tab[home(mix(h), size)].lo)
	}
	for _, h := range ev.IDs {
		if w, ok := names.get(h); ok {
			sum += uint64(t.blocks.at(w).span)
		}
	}
	return sum
}

// trim shrinks the engine id table of wr, if removals left it below
// trimBelow.
func (t *spanTree) trim(wr WorkerRank) {
	if slot, ok := t.slotOf[wr]; ok {
		if tab := t.ranks[slot].names.trimmed(); tab != nil {
			t.ranks[slot].names.tab = tab
		}
	}
}

// rankList appends the tree's worker ranks to dst.
func (t *spanTree) rankList(dst []WorkerRank) []WorkerRank {
	for wr := range t.slotOf {
		dst = append(dst, wr)
	}
	return dst
}

// copyRank appends the entries of one worker rank to dst.
func (t *spanTree) copyRank(wr WorkerRank, dst []dumpRec) []dumpRec {
	slot, ok := t.slotOf[wr]
	if !ok {
		return dst
	}
	t.ranks[slot].names.each(func(h uint64, x uint32) {
		b := t.blocks.at(x)
		S := &t.spans[b.span]
		tiers := t.tiersIn(S.set, slot)
		if tiers == 0 {
			return // a name of a block the rank no longer holds
		}
		parent := uint64(0)
		if x != S.first {
			parent = t.blocks.at(x - 1).key
		} else if S.parent != noBlock {
			parent = t.blocks.at(S.parent).key
		}
		dst = append(dst, dumpRec{hash: h, key: b.key, local: b.local, parent: parent, tiers: tiers, depth: -2})
	})
	return dst
}

// slabBits sets the blocks per chunk of a blockSlab: 1<<14, 384 KB.
const slabBits = 14

// blockSlab holds a tree's blocks by value, in chunks that never move, so
// that growing it copies nothing, and both views share them (see view).
type blockSlab struct {
	n      uint32       // ids below n are in use or free (see release)
	chunks [][]blockRec // each of 1<<slabBits blocks
}

// at returns block b, which must be below n.
func (s *blockSlab) at(b uint32) *blockRec { return &s.chunks[b>>slabBits][b&(1<<slabBits-1)] }

func (s *blockSlab) len() int { return int(s.n) }

// grow makes k more ids usable and returns the first.
func (s *blockSlab) grow(k uint32) uint32 {
	a := s.n
	for uint64(a)+uint64(k) > uint64(len(s.chunks))<<slabBits {
		s.chunks = append(s.chunks, newChunk())
	}
	s.n += k
	return a
}

// newChunk returns a chunk of blocks whose pages are all written: the
// memory of a new chunk comes from the system on its first write, a page
// at a time, at once rather than a fault now and then.
func newChunk() []blockRec {
	c := make([]blockRec, 1<<slabBits)
	step := max(1, 4096/int(unsafe.Sizeof(blockRec{})))
	for i := 0; i < len(c); i += step {
		c[i] = blockRec{}
	}
	return c
}
