package indexer

import (
	"errors"
	"math/bits"
	"slices"
	"unsafe"
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

// view is what a match reads of a spanTree: the shard publishes a copy
// of it (see shard.publish), which writers leave alone while matches
// read it. The slab's chunks and the sets' array are shared by every
// copy: writers change only blocks and sets that no copy reaches (see
// spanTree.pend). The spans, heads and who arrays are each copy's own.
// A copy is published after whole operations only, so a match never
// sees a rank half removed.
type view struct {
	blocks blockSlab
	spans  []span
	sets   []holdSet
	who    []rankHead // by slot, as ranks
	heads  headTable  // key of a span's first block -> span
}

// spanTree is the tree of one shard. Its view is the writers' own copy;
// matches read the one the shard published last.
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
	// the copy matches read may still reach: freed only once no match
	// reads that copy (see catchUp).
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

// w returns span s for writing, marking it changed since the last
// publication.
func (t *spanTree) w(s uint32) *span {
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
	S := t.w(s)
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
		if C := t.w(child); childFresh {
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
	S := t.w(s)
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
	*t.w(id) = sp
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
		p := t.w(s)
		p.first, p.n, p.depth, p.parent = S.first+k, S.n-k, S.depth+k, S.first+k-1
		p.diff, p.diffFrom, p.diffGen = nil, S.set, t.sets[S.set].gen // its parent has its set
		t.putHead(t.blocks.at(p.first).key, s)
		return
	}
	ns := t.newSpan(span{first: S.first + k, n: S.n - k, depth: S.depth + k, parent: S.first + k - 1, kids: S.kids, set: S.set, end: S.end,
		diffFrom: S.set, diffGen: t.sets[S.set].gen})
	t.relabel(S.first+k, S.n-k, ns)
	t.putHead(t.blocks.at(S.first+k).key, ns)
	p := t.w(s)
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
		p := t.w(a)
		p.n += B.n
		p.end, p.kids = B.end, B.kids
		t.freeSpan(b)
		return a
	}
	t.relabel(A.first, A.n, b)
	t.delHead(t.blocks.at(B.first).key)
	t.putHead(t.blocks.at(A.first).key, b)
	p := t.w(b)
	p.first, p.depth, p.parent = A.first, A.depth, A.parent
	p.diff, p.diffFrom, p.diffGen = A.diff, A.diffFrom, A.diffGen
	p.n += A.n
	t.w(a).diff = B.diff // a, freed, gives back b's array, not its own
	t.freeSpan(a)
	return b
}

// freeSpan frees span s, keeping its diff array for spareDiff.
func (t *spanTree) freeSpan(s uint32) {
	t.dropDiff(t.spans[s].diff)
	*t.w(s) = span{}
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
				p := t.w(s)
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
		P := t.w(s)
		P.kids--
		if P.kids > 0 || P.set != 0 {
			if P.kids == 1 {
				t.tidy(s)
			}
			return
		}
	}
}

// maxStretch bounds the blocks a store applies in one step (see
// spanTree.yield).
const maxStretch = 16

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
// maxStretch at a time; other blocks one by one (see storeOne). A rank
// the event makes takes tab, resizeFor's, as its engine-id table.
func (t *spanTree) store(ev Event, tab []blockEntry) (ApplyResult, error) {
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
		t.ranks[slot].names.tab = tab
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
				if !t.own(names, slot, ev.Blocks[i+k].Hash, nxt+uint32(k), len(ev.Blocks)-i-k) {
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
				if !t.claim(names, slot, ev.Blocks[i+k].Hash, first+uint32(k), len(ev.Blocks)-i-k) {
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
	old, had := r.names.get(bl.Hash)
	removed := 0
	if had && old != nxt {
		// The engine reused an id for other content: the old block is
		// gone. (nxt, and its parent, stay: the parent has nxt as
		// child, and nxt is pinned or held, or is new and held below.)
		t.blocks.at(nxt).pins++ // keeps a new nxt through the detach
		removed = t.detach(slot, bl.Hash, AllTiers)
		t.blocks.at(nxt).pins--
		had = false
	}
	if !had {
		t.claim(&r.names, slot, bl.Hash, nxt, 1) // h names nothing now
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
		S := t.w(s)
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
		res.Unknown = len(ev.Hashes)
		return res
	}
	for hs := ev.Hashes; len(hs) > 0; {
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
	for hs := ev.Hashes; len(hs) > 0; {
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

// clear applies a Cleared event of rank wr, whose engine ids are ids: a
// writer lists them before it changes the tree (see prepare, leaving).
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

// apply applies ev, with g, which prepare made for it, put in place
// first.
func (t *spanTree) apply(ev Event, g growth) (ApplyResult, error) {
	t.use(ev.Worker, g)
	switch {
	case ev.Kind == Stored && ev.ByID:
		return t.storeByID(ev), nil
	case ev.Kind == Stored:
		return t.store(ev, g.names)
	case ev.Kind == Removed:
		return t.remove(ev), nil
	case ev.Kind == Cleared:
		return t.clear(ev.Worker, ev.Tier, g.ids), nil
	}
	return ApplyResult{}, ErrBadEvent
}

// classTiers are the tiers of each tier class: device; device or host;
// any.
var classTiers = [nClasses]Tier{TierDevice, TierDevice | TierHost, AllTiers}

// runMatch is the state of one match on a spanTree.
type runMatch struct {
	cands [nClasses][]uint64
	reach [nClasses][]int32 // per slot, where it dropped out of each class
	all   []uint64
}

func (m *runMatch) reset(slots int) {
	w := (slots + 63) / 64
	for c := range nClasses {
		m.cands[c] = slices.Grow(m.cands[c][:0], w)[:w]
		clear(m.cands[c])
	}
	for c := range nClasses {
		m.reach[c] = slices.Grow(m.reach[c][:0], slots)[:slots]
	}
	m.all = slices.Grow(m.all[:0], w)[:w]
}

// match appends to dst the Overlap of every rank holding seq[0], lapping
// clock's phases.
func (t *view) match(seq []uint64, m *runMatch, dst []Overlap, clock *phaseClock) []Overlap {
	if len(seq) == 0 {
		return dst
	}
	s, ok := t.childSpan(noBlock, seq[0])
	if !ok {
		return dst
	}
	m.reset(len(t.who))
	S := &t.spans[s]
	first := &t.sets[S.set]
	for c := range nClasses {
		copy(m.cands[c], first.classBits(c))
	}
	copy(m.all, m.cands[classAny])
	// A rank not in a class from the first block has 0 in it; others get
	// the depth where they drop out (in reach), or the match's end.
	for c := range nClasses {
		for i, x := range m.all {
			for x &^= m.cands[c][i]; x != 0; x &= x - 1 {
				m.reach[c][i*64+bits.TrailingZeros64(x)] = 0
			}
		}
	}
	clock.lap(phaseStart)
	live := 0 // ranks in cands[classAny]
	for _, x := range m.cands[classAny] {
		live += bits.OnesCount64(x)
	}
	n := live // ranks emitted: all of m.all
	last := uint32(len(seq) - 1)
	var reached uint32 // where the ranks still in cands end
	for {
		end := S.depth + S.n - 1
		hi := min(end, last)
		key := S.end
		if hi != end {
			key = t.blocks.at(S.first + hi - S.depth).key
		}
		if seq[hi] != key {
			reached = t.diverge(seq, S, hi) + 1
			break
		}
		if hi == last {
			reached = last + 1
			break
		}
		c, ok := t.childSpan(S.first+S.n-1, seq[end+1])
		if !ok {
			reached = end + 1
			break
		}
		fromID := S.set
		S = &t.spans[c]
		if S.set == fromID {
			continue
		}
		if t.freshDiff(c, fromID) {
			// The ranks whose tiers differ here, and only they: at most
			// two per bit-set word (see diffCap).
			for _, e := range S.diff {
				s, here := e>>3, tiersOfElem(e)
				i, bit := s>>6, uint64(1)<<(s&63)
				for k := range nClasses {
					if here&classTiers[k] == 0 && m.cands[k][i]&bit != 0 {
						m.cands[k][i] &^= bit
						m.reach[k][s] = int32(end + 1)
						if k == classAny {
							live--
						}
					}
				}
			}
		} else {
			// Candidates are within from's ranks: only words where the
			// two sets differ can drop any.
			from, set := &t.sets[fromID], &t.sets[S.set]
			for k := range nClasses {
				fb, cb := from.classBits(k), set.classBits(k)
				reach := m.reach[k]
				for i, x := range m.cands[k] {
					var f, in uint64
					if i < len(fb) {
						f = fb[i]
					}
					if i < len(cb) {
						in = cb[i]
					}
					if f == in {
						continue
					}
					d := x &^ in
					if d == 0 {
						continue
					}
					m.cands[k][i] = x &^ d
					if k == classAny {
						live -= bits.OnesCount64(d)
					}
					for ; d != 0; d &= d - 1 {
						reach[i*64+bits.TrailingZeros64(d)] = int32(end + 1)
					}
				}
			}
		}
		if live == 0 {
			break // reached is not read: no rank is left in cands
		}
	}
	clock.lap(phaseWalk)
	at := len(dst)
	dst = slices.Grow(dst, n)[:at+n]
	out := dst[at:]
	k := 0
	rd, rh, ra := m.reach[classDev], m.reach[classHost], m.reach[classAny]
	end := int32(reached)
	for i, x := range m.all {
		cd, ch, ca := m.cands[classDev][i], m.cands[classHost][i], m.cands[classAny][i]
		for ; x != 0; x &= x - 1 {
			j := bits.TrailingZeros64(x)
			s := i*64 + j
			r := &t.who[s]
			o := &out[k]
			k++
			o.Worker, o.Blocks = r.wr, r.blocks
			o.Device, o.Host, o.Disk = rd[s], rh[s], ra[s]
			if cd>>j&1 != 0 {
				o.Device = end
			}
			if ch>>j&1 != 0 {
				o.Host = end
			}
			if ca>>j&1 != 0 {
				o.Disk = end
			}
		}
	}
	clock.lap(phaseEmit)
	return dst
}

// classBits returns the set's bit-set words of tier class c.
func (h *holdSet) classBits(c int) []uint64 { return h.bits[c*h.words : (c+1)*h.words] }

// diverge returns the depth of the last block of span S that seq matches,
// given that it matches S's first and not depth hi: the probes of a round
// are independent loads, so that their cache misses overlap.
func (t *view) diverge(seq []uint64, S *span, hi uint32) uint32 {
	lo := S.depth
	at := func(d uint32) uint64 { return t.blocks.at(S.first + d - S.depth).key }
	for hi-lo > 4 {
		q := (hi - lo) / 4
		d1, d2, d3 := lo+q, lo+2*q, lo+3*q
		k1, k2, k3 := at(d1), at(d2), at(d3)
		switch {
		case seq[d3] == k3:
			lo = d3
		case seq[d2] == k2:
			lo, hi = d2, d3
		case seq[d1] == k1:
			lo, hi = d1, d2
		default:
			hi = d1
		}
	}
	for lo+1 < hi && seq[lo+1] == at(lo+1) {
		lo++
	}
	return lo
}

// blockCounts sets, in out, how many engine ids each rank holds.
func (t *spanTree) blockCounts(out map[WorkerRank]int) {
	for wr, slot := range t.slotOf {
		out[wr] = t.ranks[slot].names.len()
	}
}

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

// growth is what a writer builds for an event before it changes the
// tree (see spanTree.prepare) and puts in place as it starts to
// (spanTree.use): the arrays the event may outgrow, copied into larger
// ones at once rather than one append at a time.
type growth struct {
	names []blockEntry // the rank's engine-id table, or a new rank's first (see resizeFor, trimmed)
	ids   []uint64     // the rank's engine ids, for a Cleared event (see clear)
	spans []span
	sets  []holdSet
	heads []headSlot
}

// prepare returns the growth ev may need, and makes the slab's chunks for
// its new blocks. It reads the tree and writes only the slab's spare
// chunks, which no view reaches. An event that needs more than prepare
// foresaw grows what it needs as it goes (blockTable.add, headTable.put,
// append): a Cleared event gets room for two spans only, as each of its
// runs splits off at most two, and most merge back with the next run
// (room for two a block would grow the arrays for nothing).
func (t *spanTree) prepare(ev Event) growth {
	var g growth
	k := len(ev.Blocks) + len(ev.Hashes)
	if ev.Kind == Stored && !ev.ByID {
		g.names = t.resizeFor(ev)
		t.blocks.reserve(k)
	}
	if ev.Kind == Cleared {
		if slot, ok := t.slotOf[ev.Worker]; ok {
			g.ids = t.clearOrder(slot)
		}
	}
	// An event makes at most two spans a block (isolate's splits), and as
	// many sets and heads, but where a stored block also takes an engine
	// id from another (see storeOne): those few grow as they go.
	room := 2*k + 2
	g.spans = roomFor(t.spans, len(t.free), room)
	g.sets = roomFor(t.sets, len(t.freeS), room)
	g.heads = t.heads.grownFor(room)
	return g
}

// roomFor returns s copied into an array with room for n more elements
// than it and free have, if they do not have it, or nil.
func roomFor[T any](s []T, free, n int) []T {
	if cap(s)-len(s)+free >= n {
		return nil
	}
	g := make([]T, len(s), max(2*cap(s), len(s)+n))
	copy(g, s)
	return g
}

// use puts g, prepared for the event about to be applied to rank wr, in
// place; but a new rank's table, which the event makes the rank with (see
// store).
func (t *spanTree) use(wr WorkerRank, g growth) {
	if g.names != nil {
		if slot, ok := t.slotOf[wr]; ok {
			t.ranks[slot].names.tab = g.names
		}
	}
	if g.spans != nil {
		t.spans = g.spans
	}
	if g.sets != nil {
		t.sets = g.sets
	}
	if g.heads != nil {
		t.heads.slots = g.heads
	}
}

// resizeFor returns the engine id table of ev's rank grown, if it must
// be, for the engine ids the Stored event ev adds, as the ids of its first
// writeChunk blocks suggest: none for a copy of held blocks to another
// tier; or, for a rank ev makes, its first table, sized for all of ev's
// ids. It only reads the tree: a writer puts it in place with use, or
// store.
func (t *spanTree) resizeFor(ev Event) []blockEntry {
	if len(ev.Blocks) == 0 {
		return nil
	}
	slot, ok := t.slotOf[ev.Worker]
	if !ok {
		if ev.HasParent {
			return nil // ErrUnknownParent
		}
		var empty blockTable
		return make([]blockEntry, empty.reserveSize(len(ev.Blocks)))
	}
	bt := &t.ranks[slot].names
	if bt.reserveSize(len(ev.Blocks)) == 0 {
		return nil // counted only when the table could be too small
	}
	first := ev.Blocks[:min(writeChunk, len(ev.Blocks))]
	fresh := 0
	for _, b := range first {
		if _, ok := bt.get(b.Hash); !ok {
			fresh++
		}
	}
	if fresh == 0 {
		return nil
	}
	if size := bt.reserveSize((fresh*len(ev.Blocks) + len(first) - 1) / len(first)); size > 0 {
		return bt.resized(size)
	}
	return nil
}

// warm reads, for each block of ev, the slot of its rank's engine id
// table where a lookup of its engine id starts, and, for a Removed event,
// the block that id names, so that applying ev finds them in the cache.
// grown is the table prepare made for ev, if any, which applying ev will
// use instead. It only reads the tree (see resizeFor), and the loads of
// one pass are independent of each other, so the processor makes them at
// once rather than one miss after the other.
func (t *spanTree) warm(ev Event, grown []blockEntry) uint64 {
	slot, ok := t.slotOf[ev.Worker]
	if !ok || ev.ByID || ev.Kind != Stored && ev.Kind != Removed {
		return 0
	}
	names := &t.ranks[slot].names
	tab := names.tab
	if grown != nil {
		tab = grown
	}
	size := len(tab)
	if size == 0 {
		return 0
	}
	var sum uint64
	if ev.Kind == Stored {
		for _, b := range ev.Blocks {
			sum += uint64(tab[home(mix(b.Hash), size)].lo)
		}
		return sum
	}
	for _, h := range ev.Hashes {
		sum += uint64(names.tab[home(mix(h), size)].lo)
	}
	for _, h := range ev.Hashes {
		if w, ok := names.get(h); ok {
			sum += uint64(t.blocks.at(w).span)
		}
	}
	return sum
}

// trimmed returns the engine id table of wr shrunk, if removals left it
// below trimBelow, or nil. It only reads the tree (see resizeFor).
func (t *spanTree) trimmed(wr WorkerRank) []blockEntry {
	slot, ok := t.slotOf[wr]
	if !ok {
		return nil
	}
	return t.ranks[slot].names.trimmed()
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
	spare  [][]blockRec // chunks made ahead (see reserve)
	n      uint32       // ids below n are in use or free (see release)
	chunks [][]blockRec // each of 1<<slabBits blocks
}

// at returns block b, which must be below n.
func (s *blockSlab) at(b uint32) *blockRec { return &s.chunks[b>>slabBits][b&(1<<slabBits-1)] }

func (s *blockSlab) len() int { return int(s.n) }

// grow makes k more ids usable and returns the first. It takes the chunks
// it needs from spare, made by reserve, if it can.
func (s *blockSlab) grow(k uint32) uint32 {
	a := s.n
	for uint64(a)+uint64(k) > uint64(len(s.chunks))<<slabBits {
		if n := len(s.spare); n > 0 {
			s.chunks = append(s.chunks, s.spare[n-1])
			s.spare = s.spare[:n-1]
		} else {
			s.chunks = append(s.chunks, newChunk())
		}
	}
	s.n += k
	return a
}

// reserve makes spare chunks, if needed, for k more ids: the memory of a
// new chunk comes from the system on its first write, a page at a time,
// so a writer makes it, and writes it, ahead of the event.
func (s *blockSlab) reserve(k int) {
	for uint64(s.n)+uint64(k) > uint64(len(s.chunks)+len(s.spare))<<slabBits {
		s.spare = append(s.spare, newChunk())
	}
}

// newChunk returns a chunk of blocks whose pages are all written.
func newChunk() []blockRec {
	c := make([]blockRec, 1<<slabBits)
	step := max(1, 4096/int(unsafe.Sizeof(blockRec{})))
	for i := 0; i < len(c); i += step {
		c[i] = blockRec{}
	}
	return c
}
