package indexer

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"pgregory.net/rapid"
)

// fatalHelper is what the invariant checks need of *testing.T and
// *rapid.T.
type fatalHelper interface {
	Helper()
	Fatalf(format string, args ...any)
}

// checkSetIDs checks that the sets in use, and only they, are each
// chained once from their hash in setIDs, and that the others are empty
// and listed free once each.
func checkSetIDs(t fatalHelper, tr *spanTree) {
	t.Helper()
	free := make(map[uint32]bool)
	for _, id := range tr.freeS {
		if id == 0 || free[id] {
			t.Fatalf("set %d listed free twice, or the empty set listed", id)
		}
		free[id] = true
	}
	for _, id := range tr.pend.sets { // let go of, freed once no match reads them
		if id == 0 || free[id] {
			t.Fatalf("set %d pending twice, or free, or the empty set pending", id)
		}
		free[id] = true
	}
	seen := make(map[uint32]bool)
	for h, first := range tr.setIDs {
		if first == 0 {
			t.Fatalf("hash %x names no set", h)
		}
		for id := first; id != 0; id = tr.sets[id].same {
			if seen[id] || tr.sets[id].hash != h || tr.sets[id].refs <= 0 {
				t.Fatalf("set %d (hash %x, %d refs) chained from hash %x, seen before %v", id, tr.sets[id].hash, tr.sets[id].refs, h, seen[id])
			}
			seen[id] = true
		}
	}
	for id := 1; id < len(tr.sets); id++ {
		if s := &tr.sets[id]; s.refs > 0 != seen[uint32(id)] || s.refs > 0 == free[uint32(id)] || s.refs == 0 && !slices.Contains(tr.pend.sets, uint32(id)) && (len(s.elems) != 0 || len(s.bits) != 0 || s.same != 0) {
			t.Fatalf("set %d: %d refs, chained %v, listed free %v, %d elems", id, s.refs, seen[uint32(id)], free[uint32(id)], len(s.elems))
		}
	}
}

// checkSpanTree checks the tree's invariants: every block in a span names
// it, every span's head names it in the head table, its end key is its
// last block's, its depth follows its parent's, which ends its span; kids
// counts are exact; a span without holders or kids ends in a block an
// engine id names; set references and pins are counted exactly; what
// Match reads of each rank agrees with the rank; no two spans, nor a
// span and the spare diff arrays, share a diff array, and free spans
// have none; and free blocks are listed (see checkFreeBlocks).
func checkSpanTree(t fatalHelper, tr *spanTree) {
	t.Helper()
	refs := make(map[uint32]int32)
	freeSpan := make(map[uint32]bool)
	for _, s := range tr.free {
		freeSpan[s] = true
	}
	kids := make(map[uint32]uint32)
	for s := range tr.spans {
		if freeSpan[uint32(s)] {
			continue
		}
		S := tr.spans[s]
		refs[S.set]++
		for b := S.first; b < S.first+S.n; b++ {
			if tr.blocks.at(b).span != uint32(s) {
				t.Fatalf("block %d names span %d, is in %d", b, tr.blocks.at(b).span, s)
			}
		}
		if got, _ := tr.heads.get(tr.blocks.at(S.first).key); got != uint32(s) {
			t.Fatalf("head of span %d names %d", s, got)
		}
		if tr.blocks.at(S.first+S.n-1).key != S.end {
			t.Fatalf("span %d end key", s)
		}
		if S.set == 0 && S.kids == 0 && tr.blocks.at(S.first+S.n-1).pins == 0 {
			t.Fatalf("span %d has no holders, no kids and its last block no engine id", s)
		}
		if S.parent != noBlock {
			ps := tr.spans[tr.blocks.at(S.parent).span].set
			if S.diffFrom == ps && S.diffGen == tr.sets[ps].gen {
				if want := tr.diffOf(ps, S.set, nil, math.MaxInt); !slices.Equal(S.diff, want) {
					t.Fatalf("span %d: diff %v from set %d, want %v", s, S.diff, ps, want)
				}
			}
			kids[tr.blocks.at(S.parent).span]++
			P := tr.spans[tr.blocks.at(S.parent).span]
			if P.first+P.n-1 != S.parent {
				t.Fatalf("span %d's parent %d is not the end of its span", s, S.parent)
			}
			if P.depth+P.n != S.depth {
				t.Fatalf("span %d depth %d under parent span ending at %d", s, S.depth, P.depth+P.n-1)
			}
		}
	}
	for s := range tr.spans {
		if !freeSpan[uint32(s)] && tr.spans[s].kids != kids[uint32(s)] {
			t.Fatalf("span %d counts %d kids, has %d", s, tr.spans[s].kids, kids[uint32(s)])
		}
	}
	type held struct {
		from, to uintptr // the memory a diff's array may use
		who      string
	}
	var arrays []held
	own := func(d []uint32, who string) {
		if cap(d) > 0 {
			p := uintptr(unsafe.Pointer(unsafe.SliceData(d)))
			arrays = append(arrays, held{p, p + uintptr(cap(d))*4, who})
		}
	}
	for s := range tr.spans {
		switch d := tr.spans[s].diff; {
		case !freeSpan[uint32(s)]:
			own(d, fmt.Sprintf("span %d", s))
		case d != nil:
			t.Fatalf("free span %d keeps a diff array", s)
		}
	}
	for i, d := range tr.diffs {
		if len(d) != 0 || cap(d) == 0 {
			t.Fatalf("spare diff array %d has %d entries and room for %d", i, len(d), cap(d))
		}
		own(d, fmt.Sprintf("spare diff array %d", i))
	}
	slices.SortFunc(arrays, func(a, b held) int { return cmp.Compare(a.from, b.from) })
	for i := 1; i < len(arrays); i++ {
		if arrays[i].from < arrays[i-1].to {
			t.Fatalf("%s and %s share a diff array", arrays[i-1].who, arrays[i].who)
		}
	}
	checkSetIDs(t, tr)
	for id := 1; id < len(tr.sets); id++ {
		if tr.sets[id].refs != refs[uint32(id)] {
			t.Fatalf("set %d has %d refs, used by %d spans", id, tr.sets[id].refs, refs[uint32(id)])
		}
	}
	checkFreeBlocks(t, tr)
	for wr, slot := range tr.slotOf {
		if h, r := tr.who[slot], &tr.ranks[slot]; h.wr != wr || int(h.blocks) != r.names.len() {
			t.Fatalf("slot %d: match sees %v with %d blocks, rank is %v with %d", slot, h.wr, h.blocks, wr, r.names.len())
		}
	}
	for _, slot := range tr.freeSlots {
		if h := tr.who[slot]; h != (rankHead{}) || tr.ranks[slot].names.len() != 0 {
			t.Fatalf("free slot %d: match sees %v with %d blocks, %d engine ids", slot, h.wr, h.blocks, tr.ranks[slot].names.len())
		}
	}
	pins := make(map[uint32]uint32)
	for slot, r := range tr.ranks {
		r.names.each(func(_ uint64, b uint32) {
			if tr.blocks.at(b).span >= pendingBlock {
				t.Fatalf("an engine id of slot %d names free block %d", slot, b)
			}
			pins[b]++
		})
	}
	for b := range tr.blocks.n {
		if tr.blocks.at(b).span < pendingBlock && tr.blocks.at(b).pins != pins[uint32(b)] {
			t.Fatalf("block %d has %d pins, %d engine ids name it", b, tr.blocks.at(b).pins, pins[uint32(b)])
		}
	}
	if tr.heads.len() != len(tr.spans)-len(tr.free) {
		t.Fatalf("%d heads for %d spans", tr.heads.len(), len(tr.spans)-len(tr.free))
	}
}

// TestHeadTableMatchesMap puts, deletes and gets random keys, many of
// them colliding, in a headTable and a Go map.
func TestHeadTableMatchesMap(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var h headTable
		want := make(map[uint64]uint32)
		genKey := rapid.Uint64Range(0, 40)
		for i := range rapid.IntRange(1, 300).Draw(t, "ops") {
			k := genKey.Draw(t, "key")
			switch rapid.IntRange(0, 2).Draw(t, "op") {
			case 0:
				h.put(k, uint32(i))
				want[k] = uint32(i)
			case 1:
				h.del(k)
				delete(want, k)
			}
			for k := range uint64(41) {
				got, ok := h.get(k)
				w, wok := want[k]
				if ok != wok || got != w {
					t.Fatalf("op %d: get(%d) = %d, %v; want %d, %v", i, k, got, ok, w, wok)
				}
			}
			if h.len() != len(want) {
				t.Fatalf("op %d: len %d, want %d", i, h.len(), len(want))
			}
		}
	})
}

// checkFreeBlocks checks that every block not in a span is in exactly one
// listed free range, that free ranges do not touch, and that the last
// block is not free.
func checkFreeBlocks(t fatalHelper, tr *spanTree) {
	t.Helper()
	listed := make(map[uint32]uint32) // range start -> length
	for c, a := range tr.freeHead {
		prev := noBlock
		for ; a != noBlock; a = tr.freeNext(a) {
			n := uint32(tr.blocks.at(a).key)
			if freeClass(n) != c {
				t.Fatalf("free range %d of %d blocks in list %d", a, n, c)
			}
			if tr.freePrev(a) != prev {
				t.Fatalf("free range %d: previous %d, want %d", a, tr.freePrev(a), prev)
			}
			if _, dup := listed[a]; dup {
				t.Fatalf("free range %d listed twice", a)
			}
			listed[a] = n
			prev = a
		}
	}
	pending := make(map[uint32]bool)
	for _, r := range tr.pend.blocks {
		for b := r[0]; b < r[0]+r[1]; b++ {
			if pending[b] {
				t.Fatalf("block %d pending twice", b)
			}
			pending[b] = true
		}
	}
	for b := uint32(0); b < tr.blocks.n; {
		if (tr.blocks.at(b).span == pendingBlock) != pending[b] {
			t.Fatalf("block %d: marked pending %v, listed %v", b, tr.blocks.at(b).span == pendingBlock, pending[b])
		}
		if tr.blocks.at(b).span != freeBlock {
			if tr.blocks.at(b).span == noBlock {
				t.Fatalf("block %d is neither free nor in a span", b)
			}
			b++
			continue
		}
		n, ok := listed[b]
		if !ok {
			t.Fatalf("free block %d starts no listed range", b)
		}
		delete(listed, b)
		for i := uint32(0); i < n; i++ {
			if tr.blocks.at(b+i).span != freeBlock {
				t.Fatalf("block %d of free range %d is not free", b+i, b)
			}
		}
		if uint32(tr.blocks.at(b+n-1).key) != n {
			t.Fatalf("free range %d: last block says %d blocks, want %d", b, tr.blocks.at(b+n-1).key, n)
		}
		b += n
		if b == tr.blocks.n {
			t.Fatalf("free range ends the blocks")
		}
		if tr.blocks.at(b).span == freeBlock {
			t.Fatalf("free ranges touch at block %d", b)
		}
	}
	if len(listed) > 0 {
		t.Fatalf("listed free ranges not found: %v", listed)
	}
}

// TestSpansAcrossSlabChunks stores chains longer than a chunk of the
// block slab, so that spans run across chunk boundaries, and checks
// matches, removals from the tail and the tree's invariants.
func TestSpansAcrossSlabChunks(t *testing.T) {
	const n = 5<<slabBits/2 + 7 // two and a half chunks
	seq := longChainSeq(n)
	ix := NewIndex(16)
	a, b := wr(1, 0), wr(2, 0)
	for _, ev := range []Event{
		{Kind: Stored, Worker: a, Tier: TierDevice, Blocks: longChain(1, 0, n)},
		{Kind: Stored, Worker: b, Tier: TierDevice, Blocks: longChain(2, 0, n-(1<<slabBits))},
	} {
		if _, err := ix.Apply(ev); err != nil {
			t.Fatal(err)
		}
	}
	check := func(when string, want ...Overlap) {
		t.Helper()
		checkInvariants(t, ix)
		got := trees(t, ix, ix.Match(seq, nil))
		sortOverlaps(got)
		if !slices.Equal(got, want) {
			t.Fatalf("%s: match = %v, want %v", when, got, want)
		}
	}
	check("stored", ov(a, n, n, n), ov(b, n-1<<slabBits, n-1<<slabBits, n-1<<slabBits))
	tail := make([]uint64, 0, 1<<slabBits+5)
	for i := n - 1; i >= n-(1<<slabBits+5); i-- {
		tail = append(tail, 1<<40|uint64(i))
	}
	if _, err := ix.Apply(removed(a, TierDevice, tail...)); err != nil {
		t.Fatal(err)
	}
	k := n - (1<<slabBits + 5)
	check("a's tail evicted", ov(a, k, k, k), ov(b, n-1<<slabBits, n-1<<slabBits, n-1<<slabBits))
	ix.RemoveWorker(1)
	check("a removed", ov(b, n-1<<slabBits, n-1<<slabBits, n-1<<slabBits))
}

// TestLeavingListsIDsInClearOrder applies events that grow a tree over
// two slab chunks, evict, copy and clear, and checks that leaving, for a
// rank's removal, lists the rank's engine ids, last block first, which
// removeRank takes (see TestClearTakesTheIDsGiven).
func TestLeavingListsIDsInClearOrder(t *testing.T) {
	const n = 3<<slabBits/2 + 11 // a chain over two chunks
	every3 := func(w uint64, from, to int) []uint64 {
		var hs []uint64
		for i := from; i < to; i += 3 {
			hs = append(hs, w<<40|uint64(i))
		}
		return hs
	}
	a, b, c := wr(1, 0), wr(2, 0), wr(3, 0)
	events := []struct {
		name string
		ev   Event
	}{
		{"a new chain", stored(a, TierDevice, nil, longChain(1, 0, n))},
		{"another rank along it", stored(b, TierDevice, nil, longChain(2, 0, 3000))},
		{"every third block of a stretch evicted", removed(a, TierDevice, every3(1, 100, 2500)...)},
		{"held blocks' ids copied to host", Event{Kind: Stored, ByID: true, Worker: a, Tier: TierHost, IDs: every3(1, 101, 2500)}},
		{"more of the chain, for a: its table grows", stored(a, TierDevice, ptr(1<<40|uint64(n-1)), longChain(1, n, 6000))},
		{"a third rank along b's", stored(c, TierDevice, nil, longChain(3, 0, 2000))},
		{"a's host tier cleared", Event{Kind: Cleared, Worker: a, Tier: TierHost}},
		{"b cleared", Event{Kind: Cleared, Worker: b, Tier: AllTiers}},
	}
	tr := newSpanTree()
	for _, e := range events {
		if _, err := tr.apply(e.ev); err != nil {
			t.Fatalf("%s: %v", e.name, err)
		}
		checkSpanTree(t, tr)
	}
	gone := tr.leaving(func(r WorkerRank) bool { return r == c })
	if len(gone) != 1 || gone[0].wr != c || !inClearOrder(tr, tr.slotOf[c], gone[0].ids) {
		t.Fatalf("leaving listed %v, want %s with its %d engine ids, last block first", gone, c, tr.ranks[tr.slotOf[c]].names.len())
	}
	tr.removeRank(c, gone[0].ids)
	checkSpanTree(t, tr)
	if _, ok := tr.slotOf[c]; ok || tr.live != n+6000 {
		t.Errorf("after removing %s: it is still known (%t), or the tree has %d blocks, not a's %d", c, ok, tr.live, n+6000)
	}
}

// TestClearTakesTheIDsGiven checks that clear takes the engine ids it is
// given (clearOrder's, for a Cleared event), and only those.
func TestClearTakesTheIDsGiven(t *testing.T) {
	a := wr(1, 0)
	tr := newSpanTree()
	if _, err := tr.apply(stored(a, TierDevice, nil, longChain(1, 0, 4))); err != nil {
		t.Fatal(err)
	}
	ids := tr.clearOrder(tr.slotOf[a])
	if !slices.Equal(ids, []uint64{1<<40 | 3, 1<<40 | 2, 1<<40 | 1, 1<<40 | 0}) {
		t.Fatalf("clearOrder listed %x, want a's ids last block first", ids)
	}
	res := tr.clear(a, AllTiers, ids[:2])
	if res != (ApplyResult{Removed: 2}) {
		t.Fatalf("clear with two of the ids: %+v; want 2 removed", res)
	}
	checkSpanTree(t, tr)
	if got := tr.who[tr.slotOf[a]].blocks; got != 2 {
		t.Errorf("a holds %d blocks after, want 2 (blocks 0 and 1)", got)
	}
}

// inClearOrder reports whether ids are the engine ids of slot, each once,
// by the blocks they name, last first (see clearOrder).
func inClearOrder(tr *spanTree, slot uint32, ids []uint64) bool {
	names := &tr.ranks[slot].names
	var all []uint64
	names.each(func(id uint64, _ uint32) { all = append(all, id) })
	slices.Sort(all)
	block := func(id uint64) uint32 { b, _ := names.get(id); return b }
	return slices.Equal(slices.Sorted(slices.Values(ids)), all) &&
		slices.IsSortedFunc(ids, func(x, y uint64) int { return cmp.Compare(block(y), block(x)) })
}

// TestTierRuns copies a chain two ranks hold to host memory, by blocks
// and by engine ids only, and takes tiers off it again, in runs of
// consecutive blocks, in either order, broken by gaps, repeats, unknown
// ids and the ends of spans, as engines that offload blocks do. Each
// event must give what one block at a time gives (see TestRunsOfIDs for
// the runs taken at once); the tree must end as few spans as the holders
// make.
func TestTierRuns(t *testing.T) {
	const n = 40
	a, b := wr(1, 0), wr(2, 0)
	ids := func(w uint64, from, to int) []uint64 { // w's ids of blocks from..to, in that order
		var hs []uint64
		for i := from; ; {
			hs = append(hs, w<<40|uint64(i))
			if i == to {
				return hs
			}
			if from < to {
				i++
			} else {
				i--
			}
		}
	}
	steps := []struct {
		name string
		ev   Event
		want ApplyResult
		ov   []Overlap // a's, then b's
	}{
		{"a copies its chain to host", stored(a, TierHost, nil, longChain(1, 0, n)), ApplyResult{Stored: n}, []Overlap{ov(a, n, n, n), ov(b, n, n, n)}},
		{"and again: nothing new", stored(a, TierHost, nil, longChain(1, 0, 20)), ApplyResult{}, []Overlap{ov(a, n, n, n), ov(b, n, n, n)}},
		{"a evicts its tail from device, last first", removed(a, TierDevice, ids(1, n-1, 10)...), ApplyResult{Removed: n - 10}, []Overlap{ov(a, 10, n, n), ov(b, n, n, n)}},
		{"from host, first first, with a gap, a repeat and an unknown id", removed(a, TierHost, append(append(ids(1, 30, 34), ids(1, 36, 37)...), 1<<40|37, 99)...),
			ApplyResult{Removed: 7, Unknown: 2}, []Overlap{ov(a, 10, 30, 30), ov(b, n, n, n)}},
		// 39, 38; 37..30 gone but 35; 29..10 on host only, 9..0 on both.
		{"the rest of its host copy, last first", removed(a, TierHost, ids(1, n-1, 0)...),
			ApplyResult{Removed: n - 7, Unknown: 7}, []Overlap{ov(a, 10, 10, 10), ov(b, n, n, n)}},
		{"its device blocks, first first", removed(a, TierDevice, ids(1, 0, 9)...), ApplyResult{Removed: 10}, []Overlap{ov(b, n, n, n)}},
		{"a's gone ids named for disk (Mooncake's store publisher)", Event{Kind: Stored, ByID: true, Worker: a, Tier: TierDisk, IDs: ids(1, 0, 2)},
			ApplyResult{Unknown: 3}, []Overlap{ov(b, n, n, n)}},
		{"b's named for host, and an unknown id", Event{Kind: Stored, ByID: true, Worker: b, Tier: TierHost, IDs: append(ids(2, 0, n-1), 99)},
			ApplyResult{Stored: n, Unknown: 1}, []Overlap{ov(b, n, n, n)}},
		{"b's again, last first: nothing new", Event{Kind: Stored, ByID: true, Worker: b, Tier: TierHost, IDs: ids(2, n-1, 0)},
			ApplyResult{}, []Overlap{ov(b, n, n, n)}},
		{"b's last half named for disk", Event{Kind: Stored, ByID: true, Worker: b, Tier: TierDisk, IDs: ids(2, 20, n-1)},
			ApplyResult{Stored: 20}, []Overlap{ov(b, n, n, n)}},
		// A run ends where the span does: 19 | 20.
		{"b's middle taken off host, first first, across two spans", removed(b, TierHost, ids(2, 10, 29)...),
			ApplyResult{Removed: 20}, []Overlap{ov(b, n, n, n)}},
		{"and off device, last first, across two spans", removed(b, TierDevice, ids(2, 29, 10)...),
			ApplyResult{Removed: 20}, []Overlap{ov(b, 10, 10, 10)}},
	}
	ix := NewIndex(4)
	one := NewIndex(4) // the same, one id or block per event
	seq := longChainSeq(n)
	for _, x := range []*Index{ix, one} {
		for _, ev := range []Event{stored(a, TierDevice, nil, longChain(1, 0, n)), stored(b, TierDevice, nil, longChain(2, 0, n))} {
			if _, err := x.Apply(ev); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, st := range steps {
		got, err := ix.Apply(st.ev)
		if err != nil || got != st.want {
			t.Fatalf("%s: %+v, %v; want %+v", st.name, got, err, st.want)
		}
		var each ApplyResult
		for i := range len(st.ev.IDs) + len(st.ev.Blocks) {
			ev := st.ev
			if ev.IDs != nil {
				ev.IDs = ev.IDs[i : i+1]
			} else if ev.Blocks = ev.Blocks[i : i+1]; i > 0 {
				ev.Parent, ev.HasParent = st.ev.Blocks[i-1].ID, true
			}
			r, _ := one.Apply(ev)
			each.Stored, each.Removed, each.Unknown = each.Stored+r.Stored, each.Removed+r.Removed, each.Unknown+r.Unknown
		}
		if each != got {
			t.Errorf("%s: one at a time gives %+v, at once %+v", st.name, each, got)
		}
		checkInvariants(t, ix)
		for _, x := range []*Index{ix, one} {
			m := trees(t, x, x.Match(seq, nil))
			sortOverlaps(m)
			if !slices.Equal(m, st.ov) {
				t.Fatalf("%s: match = %v, want %v", st.name, m, st.ov)
			}
		}
	}
	// b: 0..9 on device and host, 10..19 on none (kept for the blocks
	// under them), 20..29 on disk, 30..39 on all three.
	if tr := ix.shards[0].tree; len(tr.spans)-len(tr.free) != 4 || tr.live != n {
		t.Errorf("left %d spans of %d blocks, want b's chain as four spans", len(tr.spans)-len(tr.free), tr.live)
	}
}

// TestRunsOfIDs checks the runs of engine ids that removals and
// id-only stores take at once (see spanTree.run): ids naming consecutive
// blocks of one span, in either order, up to maxStretch, ended by a gap,
// a repeat, an unknown id or the end of the span.
func TestRunsOfIDs(t *testing.T) {
	const n = 40
	a, b := wr(1, 0), wr(2, 0)
	tr := newSpanTree()
	for _, ev := range []Event{stored(a, TierDevice, nil, longChain(1, 0, n)), stored(b, TierDevice, nil, longChain(2, 0, n/2))} {
		if _, err := tr.apply(ev); err != nil {
			t.Fatal(err)
		}
	}
	ids := func(from, to int) []uint64 { // a's ids of blocks from..to, in that order
		var hs []uint64
		for i := from; ; {
			hs = append(hs, 1<<40|uint64(i))
			if i == to {
				return hs
			}
			if from < to {
				i++
			} else {
				i--
			}
		}
	}
	slot := tr.slotOf[a]
	names := &tr.ranks[slot].names
	for _, c := range []struct {
		name  string
		hs    []uint64
		k, lo int // the run's length, and the index in a's chain of its lowest block
	}{
		{"first first, up to maxStretch", ids(20, n-1), maxStretch, 20},
		{"last first, up to maxStretch", ids(n-1, 20), maxStretch, n - maxStretch},
		{"a gap", append(ids(30, 34), ids(36, 37)...), 5, 30},
		{"a repeat", append(ids(36, 37), 1<<40|37), 2, 36},
		{"an unknown id", append(ids(36, 37), 99), 2, 36},
		{"the end of a span", ids(10, 29), 10, 10},
		{"the start of a span, last first", ids(25, 15), 6, 20},
	} {
		b, ok := names.get(c.hs[0])
		if !ok {
			t.Fatalf("%s: a does not name %x", c.name, c.hs[0])
		}
		lo0, _ := names.get(1<<40 | uint64(c.lo))
		if k, lo := tr.run(names, c.hs, b, slot, false); k != c.k || lo != lo0 {
			t.Errorf("%s: run of %d from block %d, want %d from %d", c.name, k, lo, c.k, lo0)
		}
	}
}

// TestStoreReusedIDKeepsBlocksTogether stores a new chain whose first
// engine id names another block of the rank: the chain's blocks still
// come from one range and make one span.
func TestStoreReusedIDKeepsBlocksTogether(t *testing.T) {
	a := wr(1, 0)
	tr := newSpanTree()
	for _, ev := range []Event{
		stored(a, TierDevice, nil, chain(100, 1, 2, 3, 4, 5, 6, 7, 8)),
		stored(a, TierDevice, nil, append(chain(101, 9, 9, 9, 9)[:1], chain(201, 9, 9, 9, 9, 8, 8, 8, 8, 7, 7, 7, 7)[1:]...)),
	} {
		if _, err := tr.apply(ev); err != nil {
			t.Fatal(err)
		}
		checkSpanTree(t, tr)
	}
	// Block 101 is gone; 100 and the new chain remain, a span each.
	if spans := len(tr.spans) - len(tr.free); spans != 2 || tr.live != 4 || tr.blocks.len() != 5 {
		t.Errorf("%d spans of %d blocks, slab of %d, want 2 spans of 4 blocks, slab of 5 (block 101 freed)", spans, tr.live, tr.blocks.len())
	}
}

// TestSetsSharingAHash interns sets whose hashes are the same, as
// different sets' may be, and frees them in every position of the chain;
// and checks that a set made where another of its size was freed
// allocates nothing.
func TestSetsSharingAHash(t *testing.T) {
	sets := [][]uint32{{1<<3 | 1}, {2<<3 | 1}, {3<<3 | 1}, {2<<3 | 1, 3<<3 | 2}}
	for _, order := range [][]int{{0, 1, 2, 3}, {3, 2, 1, 0}, {1, 2, 0, 3}, {2, 0, 3, 1}} {
		tr := newSpanTree()
		ids := make([]uint32, len(sets))
		for i, es := range sets {
			ids[i] = tr.internAs(es, 7)
			checkSetIDs(t, tr)
		}
		if again := tr.internAs(sets[1], 7); again != ids[1] || tr.sets[again].refs != 2 {
			t.Fatalf("interning set 1 again gave %d with %d refs, want %d with 2", again, tr.sets[again].refs, ids[1])
		}
		tr.unref(ids[1])
		for k, i := range order {
			tr.unref(ids[i])
			checkSetIDs(t, tr)
			for _, j := range order[k+1:] {
				if got := tr.internAs(sets[j], 7); got != ids[j] {
					t.Fatalf("order %v: after freeing %v, set %d is %d, want %d", order, order[:k+1], j, got, ids[j])
				}
				tr.unref(ids[j])
			}
		}
		if len(tr.setIDs) != 0 {
			t.Fatalf("order %v: hashes left %v", order, tr.setIDs)
		}
	}
	tr := newSpanTree()
	es := [][]uint32{{5<<3 | 1, 70<<3 | 3}, {6<<3 | 2, 100<<3 | 1}} // 2 elements, 2 words each
	i := 0
	if n := testing.AllocsPerRun(100, func() { tr.unref(tr.internAs(es[i%2], 7)); tr.freePending(); i++ }); n != 0 {
		t.Errorf("a set made where another as large was freed allocated %v times", n)
	}
}

// TestSpanDiffsReuseArrays checks that spans splitting and merging again,
// as a rank drops a block in the middle of a chain another rank holds too
// and stores it back, take their diff arrays from those spans freed: the
// writer allocates nothing.
func TestSpanDiffsReuseArrays(t *testing.T) {
	const n = 100 // long enough that one id more or less resizes no table
	ix := NewIndex(4)
	path := strings.Repeat("0123", n/4)
	chain := blocksOf("", path)
	for _, w := range []WorkerRank{wr(1, 0), wr(2, 0)} {
		if _, err := ix.Apply(stored(w, TierDevice, nil, chain)); err != nil {
			t.Fatal(err)
		}
	}
	drop := removed(wr(2, 0), TierDevice, chain[n/2].ID)
	back := stored(wr(2, 0), TierDevice, &chain[n/2-1].ID, chain[n/2:n/2+1])
	cycle := func() {
		for _, ev := range []Event{drop, back} {
			if _, err := ix.Apply(ev); err != nil {
				t.Fatal(err)
			}
		}
	}
	cycle()
	if n := testing.AllocsPerRun(100, cycle); n != 0 {
		t.Errorf("a split and merge again allocated %v times", n)
	}
	checkSpanTree(t, ix.shards[0].tree)
}
