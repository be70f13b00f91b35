package indexer

import (
	"errors"
	"slices"
)

// spanTree is one shard's prefix tree, path-compressed: a tree of spans,
// each a chain of blocks with consecutive ids, every block the only child
// of the one before, all held by the same worker ranks on the same tiers
// (an interned holder set). A span is split where a holder changes or a
// branch starts, and merged with its only child when their holders
// become equal and their ids follow on. A match looks up a span by the
// key (sequence hash) of its first block, crosses it with one comparison
// of the prompt's key at the span's end with the span's last (keys chain,
// so equal last keys mean equal prefixes), drops the candidates that the
// next span's holders lack (by the span's short list of ranks whose tiers
// differ from its parent's, or word by word where the two sets differ),
// and looks up the next span: a few dependent loads per span, whatever
// its length. Blocks live by value in one slab, free ranges of it reused;
// nothing in the tree holds a Go pointer but the holder sets' slices and
// the spans' lists, and the spare arrays kept for them (free sets keep
// theirs; see spanTree.diffs).

const noBlock = ^uint32(0)

// errTreeFull: a Stored event would take a spanTree past 1<<31 block ids.
var errTreeFull = errors.New("index shard full: 1<<31 block ids")

// blockRec is one block of a spanTree.
type blockRec struct {
	key   uint64 // sequence hash
	local uint64
	span  uint32 // freeBlock: free; pendingBlock: released, not yet free (see spanTree.release)
	// pins counts the engine ids, over all ranks, naming the block: a
	// block without holders stays while one does (see prune).
	pins uint32
}

// freeBlock, as a block's span, marks a free block.
const freeBlock = noBlock - 1

// pendingBlock, as a block's span, marks a block released and not yet
// free (see spanTree.release).
const pendingBlock = noBlock - 2

// span is a chain of blocks first..first+n-1.
type span struct {
	first, n uint32
	depth    uint32 // of first
	parent   uint32 // block id of first's parent, noBlock for a root
	kids     uint32 // child spans of the last block
	set      uint32 // holder set (spanTree.sets)
	end      uint64 // key of the last block
	// diff lists, as slot<<3|tiers here, the ranks of the parent span's
	// set whose tiers differ here, when the parent span's set was set
	// diffFrom of generation diffGen (see refreshDiff): a match crosses
	// into the span by looking at those ranks only. A stale diff is not
	// used.
	diff     []uint32
	diffFrom uint32
	diffGen  uint32
}

// holdSet is an interned set of (slot, tiers), as slot<<3|tiers, sorted.
type holdSet struct {
	elems []uint32
	// bits are the set's slots in each tier class, up to its last slot's
	// word: words words per class, one class after the other, so that a
	// match loads them together.
	bits  []uint64
	words int
	refs  int32
	hash  uint64
	// gen counts the uses of this id, so that a span's diff can tell a
	// set reused under the id from the one it was made from.
	gen uint32
	// same is the next set with the same hash (see spanTree.setIDs), 0 at
	// the end.
	same uint32
}

// rankHead is what Match reads of a rank (see spanTree.who), apart from
// rankInfo, so that a match reading hundreds of them reads little.
type rankHead struct {
	wr     WorkerRank
	blocks int32 // engine ids the rank holds, for Overlap.Blocks
}

// rankInfo is one worker rank of a spanTree.
type rankInfo struct {
	names blockTable // engine id -> block
}

// cacheLine is the size of a cache line, as far apart as fields must be
// so that a write to one does not take the other's line from another
// core: the fields of a shard that matches read lie that far from those
// that matches or writers write (see shard).
const cacheLine = 64

// view is what a match reads of a spanTree; a shard keeps two, and which
// parts they share is written down there (see shard).
type view struct {
	blocks blockSlab
	spans  []span
	sets   []holdSet
	who    []rankHead // by slot, as ranks
	heads  headTable  // key of a span's first block -> span
}

// spanTree is the tree of one shard. Its view is the writers' own;
// matches read the one the shard published last (see shard).
type spanTree struct {
	view
	free []uint32 // free span ids
	// setIDs maps a hash to the first of the sets with that hash, which
	// holdSet.same chains. Free set ids keep their sets' arrays, which
	// intern reuses: writers then allocate only as the sets grow in
	// number or size (an allocation can make them help the garbage
	// collector meanwhile).
	setIDs map[uint64]uint32
	freeS  []uint32 // free set ids
	// freeHead heads, per size class (floor log2 of the length), a
	// doubly linked list of free ranges of blocks (see release).
	freeHead  [32]uint32
	ranks     []rankInfo
	freeSlots []uint32 // slots of removed ranks, to reuse
	live      int      // blocks in spans
	// yield, if set, is called between the steps of an operation, where
	// the tree is whole, with the blocks the step applied.
	yield  func(blocks int)
	slotOf map[WorkerRank]uint32
	tmp    []uint32 // with's scratch
	// diffs are spare arrays for span diffs, freed by spans, each with
	// room for diffCap()+1 entries as of when it was freed (spareDiff
	// lets go of those the ranks outgrew since): spans split,
	// merge and go all the time, and their diffs then need no new
	// memory, so that writers do not allocate (an allocation can make
	// them help the garbage collector meanwhile).
	diffs [][]uint32

	// What the writers changed in their view since the shard last
	// published it (see catchUp): the spans written (marked, in
	// spanMark, with the publication count gen), and the heads put and
	// deleted, in order.
	dirty    []uint32
	spanMark []uint32
	gen      uint32
	headLog  []headOp
	// pend is what writers let go of since the last publication, which
	// the published view may still reach: freed by catchUp (see shard).
	pend struct {
		diffs  [][]uint32
		sets   []uint32
		blocks [][2]uint32 // first, n
	}
}

// headOp is a put (del false) or del of a span's head.
type headOp struct {
	key uint64
	val uint32
	del bool
}

// spanForWrite returns span s for writing, marking it changed since the last
// publication.
func (t *spanTree) spanForWrite(s uint32) *span {
	if int(s) >= len(t.spanMark) {
		t.spanMark = append(t.spanMark, make([]uint32, int(s)+1-len(t.spanMark))...)
	}
	if t.spanMark[s] != t.gen+1 {
		t.spanMark[s] = t.gen + 1
		t.dirty = append(t.dirty, s)
	}
	return &t.spans[s]
}

func (t *spanTree) putHead(k uint64, v uint32) {
	t.heads.put(k, v)
	t.headLog = append(t.headLog, headOp{key: k, val: v})
}

func (t *spanTree) delHead(k uint64) {
	t.heads.del(k)
	t.headLog = append(t.headLog, headOp{key: k, del: true})
}

// catchUp makes old, the view the shard published before pub (its
// arrays, which no match reads any more), the writers' view, brought up
// to pub, and frees what writers let go of before pub (freePending).
func (t *spanTree) catchUp(pub, old *view) {
	t.spans = old.spans
	if n := len(t.spans); cap(t.spans) < len(pub.spans) {
		t.spans = append(make([]span, 0, cap(pub.spans)), pub.spans...)
	} else {
		t.spans = t.spans[:len(pub.spans)]
		copy(t.spans[n:], pub.spans[n:])
		for _, s := range t.dirty {
			if int(s) < n {
				t.spans[s] = pub.spans[s]
			}
		}
	}
	t.heads = old.heads
	for _, op := range t.headLog {
		if op.del {
			t.heads.del(op.key)
		} else {
			t.heads.put(op.key, op.val)
		}
	}
	t.who = append(old.who[:0], pub.who...)
	t.dirty, t.headLog = t.dirty[:0], t.headLog[:0]
	if t.gen++; t.gen == ^uint32(0) {
		clear(t.spanMark) // no mark is gen+1
		t.gen = 0
	}
	t.freePending()
}

// freePending frees what writers let go of (see spanTree.pend): called
// once no match reads a copy of the view that may reach it.
func (t *spanTree) freePending() {
	for _, d := range t.pend.diffs {
		if cap(d) > t.diffCap() {
			t.diffs = append(t.diffs, d[:0])
		}
	}
	for _, id := range t.pend.sets {
		s := &t.sets[id]
		*s = holdSet{elems: s.elems[:0], bits: s.bits[:0], gen: s.gen}
		t.freeS = append(t.freeS, id)
	}
	for _, r := range t.pend.blocks {
		t.freeRange(r[0], r[1])
	}
	clear(t.pend.diffs)
	t.pend.diffs, t.pend.sets, t.pend.blocks = t.pend.diffs[:0], t.pend.sets[:0], t.pend.blocks[:0]
}

func newSpanTree() *spanTree {
	t := &spanTree{setIDs: make(map[uint64]uint32), slotOf: make(map[WorkerRank]uint32)}
	t.sets = append(t.sets, holdSet{refs: 1}) // 0: the empty set, never freed
	for c := range t.freeHead {
		t.freeHead[c] = noBlock
	}
	return t
}

func tiersOfElem(e uint32) Tier { return Tier(e & 7) }

func hashElems(es []uint32) uint64 {
	h := uint64(14695981039346656037)
	for _, e := range es {
		h = (h ^ uint64(e)) * 1099511628211
	}
	return h
}

// intern returns the id of the set es (sorted), taking a reference.
func (t *spanTree) intern(es []uint32) uint32 {
	if len(es) == 0 {
		return 0
	}
	return t.internAs(es, hashElems(es))
}

// internAs is intern of es, not empty, whose hash is h.
func (t *spanTree) internAs(es []uint32, h uint64) uint32 {
	first := t.setIDs[h]
	for id := first; id != 0; id = t.sets[id].same {
		if slices.Equal(t.sets[id].elems, es) {
			t.sets[id].refs++
			return id
		}
	}
	id := reuse(&t.sets, &t.freeS)
	old := &t.sets[id]
	words := int(es[len(es)-1]>>3)/64 + 1
	bits := slices.Grow(old.bits[:0], nClasses*words)[:nClasses*words]
	clear(bits)
	set := holdSet{elems: append(old.elems[:0], es...), bits: bits, words: words, refs: 1, hash: h, gen: old.gen + 1, same: first}
	for _, e := range es {
		s, tiers := e>>3, tiersOfElem(e)
		for c := range nClasses {
			if tiers&classTiers[c] != 0 {
				set.bits[c*words+int(s>>6)] |= 1 << (s & 63)
			}
		}
	}
	t.sets[id] = set
	t.setIDs[h] = id
	return id
}

func (t *spanTree) ref(id uint32) { t.sets[id].refs++ }

func (t *spanTree) unref(id uint32) {
	if id == 0 {
		return
	}
	s := &t.sets[id]
	if s.refs--; s.refs > 0 {
		return
	}
	switch first := t.setIDs[s.hash]; {
	case first != id:
		p := first
		for t.sets[p].same != id {
			p = t.sets[p].same
		}
		t.sets[p].same = s.same
	case s.same != 0:
		t.setIDs[s.hash] = s.same
	default:
		delete(t.setIDs, s.hash)
	}
	t.pend.sets = append(t.pend.sets, id)
}

// slotIndex returns where slot's element is, or would go, in es, sorted
// elements slot<<3|tiers, and whether it is there.
func slotIndex(es []uint32, slot uint32) (int, bool) {
	return slices.BinarySearchFunc(es, slot, func(e, s uint32) int { return int(e>>3) - int(s) })
}

// tiersIn returns the tiers slot holds in set id.
func (t *spanTree) tiersIn(id uint32, slot uint32) Tier {
	es := t.sets[id].elems
	i, ok := slotIndex(es, slot)
	if !ok {
		return 0
	}
	return tiersOfElem(es[i])
}

// with returns the interned set id with slot's tiers set to tiers (0:
// removed), taking a reference.
func (t *spanTree) with(id uint32, slot uint32, tiers Tier) uint32 {
	es := t.sets[id].elems
	i, ok := slotIndex(es, slot)
	t.tmp = append(t.tmp[:0], es[:i]...)
	if tiers != 0 {
		t.tmp = append(t.tmp, slot<<3|uint32(tiers))
	}
	if ok {
		i++
	}
	t.tmp = append(t.tmp, es[i:]...)
	return t.intern(t.tmp)
}

// setSpanSet gives span s the set id, which differs from its set in
// slot's tiers only, those being tiers in id, and brings the diffs that
// depend on it up to date: its own, and that of the child span next in
// the slab (others go stale: see span.diff).
func (t *spanTree) setSpanSet(s, id, slot uint32, tiers Tier) {
	S := t.spanForWrite(s)
	old := S.set
	child := t.chainedChild(S)
	childFresh := child != noBlock && t.freshDiff(child, old)
	S.set = id
	if S.parent != noBlock {
		if p := t.spans[t.blocks.at(S.parent).span].set; t.freshDiff(s, p) {
			t.setDiff(S, adjustDiff(t.roomyDiff(S), slot, t.tiersIn(p, slot), tiers), p)
		} else {
			t.refreshDiff(s)
		}
	}
	if child != noBlock {
		if C := t.spanForWrite(child); childFresh {
			t.setDiff(C, adjustDiff(t.roomyDiff(C), slot, tiers, t.tiersIn(C.set, slot)), id)
		} else {
			t.refreshDiff(child)
		}
	}
	t.unref(old)
}

// freshDiff reports whether span s's diff is from set p, as it is now.
func (t *view) freshDiff(s, p uint32) bool {
	S := &t.spans[s]
	return S.diffFrom == p && S.diffGen == t.sets[p].gen
}

// adjustDiff returns diff with slot's entry for tiers from in the parent
// span's set and here in the span's. diff has room for one more entry.
func adjustDiff(diff []uint32, slot uint32, from, here Tier) []uint32 {
	i, ok := slotIndex(diff, slot)
	switch {
	case from == 0 || from == here:
		if ok {
			diff = slices.Delete(diff, i, i+1)
		}
	case ok:
		diff[i] = slot<<3 | uint32(here)
	default:
		diff = slices.Insert(diff, i, slot<<3|uint32(here))
	}
	return diff
}

// refreshDiff computes span s's diff from its parent span's set, or
// leaves it stale if it would be longer than matches use (see diffCap).
func (t *spanTree) refreshDiff(s uint32) {
	S := t.spanForWrite(s)
	t.dropDiff(S.diff)
	S.diff = nil
	if S.parent == noBlock {
		return
	}
	p := t.spans[t.blocks.at(S.parent).span].set
	t.setDiff(S, t.diffOf(p, S.set, t.roomyDiff(S), t.diffCap()+1), p)
}

// roomyDiff returns span S's diff, moved first to a spare array with room
// for diffCap()+1 entries (a diff as long as matches use and one more,
// which adjustDiff may insert or diffOf append): a diff array is never
// changed in place, as the published view may share it (see view).
func (t *spanTree) roomyDiff(S *span) []uint32 {
	old := S.diff
	S.diff = append(t.spareDiff(), old...)
	t.dropDiff(old)
	return S.diff
}

// spareDiff returns an empty array with room for diffCap()+1 entries: one
// a span freed, if any is that large (diffCap grows with the ranks), or a
// new one.
func (t *spanTree) spareDiff() []uint32 {
	for n := len(t.diffs); n > 0; n-- {
		d := t.diffs[n-1]
		t.diffs = t.diffs[:n-1]
		if cap(d) > t.diffCap() {
			return d
		}
	}
	return make([]uint32, 0, t.diffCap()+1)
}

// dropDiff keeps d, a diff array no span of the writers' view uses any
// more, for spareDiff, if it is as large as spareDiff's, once no view
// reaches it (see spanTree.pend).
func (t *spanTree) dropDiff(d []uint32) {
	if cap(d) > t.diffCap() {
		t.pend.diffs = append(t.pend.diffs, d)
	}
}

// setDiff makes d span S's diff from set p, or leaves S's diff stale if d
// is longer than matches use (see diffCap).
func (t *spanTree) setDiff(S *span, d []uint32, p uint32) {
	if len(d) > t.diffCap() {
		S.diff, S.diffFrom = d[:0], noBlock
		return
	}
	S.diff, S.diffFrom, S.diffGen = d, p, t.sets[p].gen
}

// diffCap is the longest diff a match crosses a span by (see match): two
// per bit-set word of the ranks' slots. Longer ones are not kept.
func (t *spanTree) diffCap() int { return 2 * ((len(t.ranks) + 63) / 64) }

// diffOf appends to dst, as slot<<3|tiers in set c, the ranks of set p
// whose tiers in c differ, up to limit of them, and returns it.
func (t *spanTree) diffOf(p, c uint32, dst []uint32, limit int) []uint32 {
	pe, ce := t.sets[p].elems, t.sets[c].elems
	j := 0
	for _, e := range pe {
		for j < len(ce) && ce[j]>>3 < e>>3 {
			j++
		}
		here := e >> 3 << 3 // not in c: tiers 0
		if j < len(ce) && ce[j]>>3 == e>>3 {
			here = ce[j]
		}
		if here != e {
			if len(dst) == limit {
				break
			}
			dst = append(dst, here)
		}
	}
	return dst
}

func (t *spanTree) newSpan(sp span) uint32 {
	id := reuse(&t.spans, &t.free)
	*t.spanForWrite(id) = sp
	return id
}

// reuse returns the index in s of an element to use: the last of free, if
// any, taken off it, or a new one appended.
func reuse[T any](s *[]T, free *[]uint32) uint32 {
	if n := len(*free); n > 0 {
		id := (*free)[n-1]
		*free = (*free)[:n-1]
		return id
	}
	var zero T
	*s = append(*s, zero)
	return uint32(len(*s) - 1)
}

func (t *spanTree) relabel(first, n, s uint32) {
	for b := first; b < first+n; b++ {
		t.blocks.at(b).span = s
	}
}

// split cuts span s after its first k blocks (0 < k < n); both parts
// share its set.
func (t *spanTree) split(s, k uint32) {
	S := t.spans[s]
	t.ref(S.set)
	if k <= S.n-k {
		ns := t.newSpan(span{first: S.first, n: k, depth: S.depth, parent: S.parent, kids: 1, set: S.set, end: t.blocks.at(S.first + k - 1).key,
			diff: S.diff, diffFrom: S.diffFrom, diffGen: S.diffGen})
		t.relabel(S.first, k, ns)
		t.putHead(t.blocks.at(S.first).key, ns)
		p := t.spanForWrite(s)
		p.first, p.n, p.depth, p.parent = S.first+k, S.n-k, S.depth+k, S.first+k-1
		p.diff, p.diffFrom, p.diffGen = nil, S.set, t.sets[S.set].gen // its parent has its set
		t.putHead(t.blocks.at(p.first).key, s)
		return
	}
	ns := t.newSpan(span{first: S.first + k, n: S.n - k, depth: S.depth + k, parent: S.first + k - 1, kids: S.kids, set: S.set, end: S.end,
		diffFrom: S.set, diffGen: t.sets[S.set].gen})
	t.relabel(S.first+k, S.n-k, ns)
	t.putHead(t.blocks.at(S.first+k).key, ns)
	p := t.spanForWrite(s)
	p.n, p.kids, p.end = k, 1, t.blocks.at(S.first+k-1).key
}

// merge joins b, the only child span of a, with a consecutive ids and
// the same set, into one span, and returns its id.
func (t *spanTree) merge(a, b uint32) uint32 {
	A, B := t.spans[a], t.spans[b]
	t.unref(B.set)
	if B.n <= A.n {
		t.relabel(B.first, B.n, a)
		t.delHead(t.blocks.at(B.first).key)
		p := t.spanForWrite(a)
		p.n += B.n
		p.end, p.kids = B.end, B.kids
		t.freeSpan(b)
		return a
	}
	t.relabel(A.first, A.n, b)
	t.delHead(t.blocks.at(B.first).key)
	t.putHead(t.blocks.at(A.first).key, b)
	p := t.spanForWrite(b)
	p.first, p.depth, p.parent = A.first, A.depth, A.parent
	p.diff, p.diffFrom, p.diffGen = A.diff, A.diffFrom, A.diffGen
	p.n += A.n
	t.spanForWrite(a).diff = B.diff // a, freed, gives back b's array, not its own
	t.freeSpan(a)
	return b
}

// freeSpan frees span s, keeping its diff array for spareDiff.
func (t *spanTree) freeSpan(s uint32) {
	t.dropDiff(t.spans[s].diff)
	*t.spanForWrite(s) = span{}
	t.free = append(t.free, s)
}

// chainedChild returns the child span of S whose first block is the one
// after S's last in the slab, or noBlock.
func (t *spanTree) chainedChild(S *span) uint32 {
	if nb := S.first + S.n; int(nb) < t.blocks.len() {
		if c := t.blocks.at(nb).span; c < pendingBlock && t.spans[c].parent == nb-1 {
			return c
		}
	}
	return noBlock
}

// tidy merges span s with its only child and its parent where they can
// be one span, or prunes it if it has no holders and no kids.
func (t *spanTree) tidy(s uint32) {
	S := &t.spans[s]
	if S.set == 0 && S.kids == 0 {
		t.prune(s)
		return
	}
	if S.kids == 1 {
		if c := t.chainedChild(S); c != noBlock && t.spans[c].set == S.set {
			s = t.merge(s, c)
			S = &t.spans[s]
		}
	}
	if pb := S.parent; pb != noBlock {
		ps := t.blocks.at(pb).span
		if P := &t.spans[ps]; P.kids == 1 && P.set == S.set && t.chainedChild(P) == s {
			t.merge(ps, s)
		}
	}
}

// prune frees the blocks of span s, which has no kids, from its end back
// to the last one an engine id names (all of them where s has no
// holders), and goes on with the parent span if s goes whole. Where s
// has holders, every block they hold is named, so only a tail no engine
// id names any more goes (see detach).
func (t *spanTree) prune(s uint32) {
	for {
		S := t.spans[s]
		k := S.n
		for k > 0 && t.blocks.at(S.first+k-1).pins == 0 {
			k--
		}
		if k > 0 {
			if k < S.n {
				t.release(S.first+k, S.n-k)
				p := t.spanForWrite(s)
				p.n, p.end = k, t.blocks.at(S.first+k-1).key
			}
			return
		}
		t.delHead(t.blocks.at(S.first).key)
		t.release(S.first, S.n)
		t.unref(S.set)
		t.freeSpan(s)
		if S.parent == noBlock {
			return
		}
		s = t.blocks.at(S.parent).span
		P := t.spanForWrite(s)
		P.kids--
		if P.kids > 0 || P.set != 0 {
			if P.kids == 1 {
				t.tidy(s)
			}
			return
		}
	}
}
