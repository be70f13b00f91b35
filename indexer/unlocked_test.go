//go:build unlockedmatch

package indexer

import (
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
)

// Built with -tags unlockedmatch, matches read the tree without the lock
// (see unlocked.go). That is a data race by design: these tests run
// without -race (see the Makefile's test target).

// TestUnlockedMatchFaults checks that an unlocked match that faults (a
// span naming a holder set past the end), or walks a cycle of spans, does
// not run through; that one that faults on every run is run under mu at
// last, which shows the fault, rather than again for ever; and that a
// match on a whole tree runs through, with the locked answer.
func TestUnlockedMatchFaults(t *testing.T) {
	ix, seq, want := handIndex(t, 0) // answered on the quiescent tree
	sh := ix.shards[0]
	m := &matcher{ix: sh, seq: seq}
	if ok := m.tryUnlocked(); !ok || !slices.Equal(m.dst, want) {
		t.Fatalf("unlocked match on a whole tree: ran through %v, with %v; want %v", ok, m.dst, want)
	}
	s, ok := sh.tree.childSpan(noBlock, seq[0])
	if !ok {
		t.Fatal("no root span for the prompt")
	}
	S := &sh.tree.spans[s]

	set := S.set
	S.set = uint32(len(sh.tree.sets)) + 1<<20
	m.dst = nil
	if m.tryUnlocked() {
		t.Errorf("unlocked match on a span with no set ran through, with %v", m.dst)
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("a match that faults on every run returned")
			}
		}()
		ix.Match(seq, nil)
	}()
	if !sh.mu.TryLock() {
		t.Fatal("mu still held after the match that faulted under it")
	}
	sh.mu.Unlock()
	S.set = set

	// A cycle: the prompt's last span gets a child E, a copy of itself
	// under the key of one more block, and E is its own child.
	last := noBlock
	for _, k := range seq {
		last = sh.tree.next(last, k)
	}
	E := sh.tree.spans[sh.tree.blocks.at(last).span]
	E.parent = last
	e := uint32(len(sh.tree.spans))
	sh.tree.spans = append(sh.tree.spans, E)
	longer := append(slices.Clone(seq), NextSequenceHash(seq[len(seq)-1], 99))
	sh.tree.heads.put(longer[len(seq)], e)
	if c, ok := sh.tree.childSpan(last, longer[len(seq)]); !ok || c != e {
		t.Fatalf("the cycle is not made: the span after the prompt is %d, %v; want %d", c, ok, e)
	}
	if c, ok := sh.tree.childSpan(E.first+E.n-1, longer[len(seq)]); !ok || c != e {
		t.Fatalf("the cycle is not made: E's child is %d, %v; want E, %d", c, ok, e)
	}
	m.seq, m.dst = longer, nil
	if m.tryUnlocked() {
		t.Errorf("unlocked match through a cycle of spans ran through, with %v", m.dst)
	}
	sh.tree.heads.del(longer[len(seq)])
	sh.tree.spans = sh.tree.spans[:e]
	if got := ix.Match(seq, nil); !slices.Equal(got, want) {
		t.Errorf("match after the faults = %v, want %v", got, want)
	}
}

// TestUnlockedMatchesWhileApplying runs unlocked matches while writers
// apply events: none may crash the process or hang (their answers may be
// wrong: they are not checked), and once the writers are done the
// answers are those of an index built the same way.
func TestUnlockedMatchesWhileApplying(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	paths := []string{"0123012301", "0123321", "01", "2301230", "3210", "012330"}
	var events []Event
	for range 4000 {
		w := wr(uint64(rng.IntN(6)+1), uint32(rng.IntN(2)))
		p := paths[rng.IntN(len(paths))]
		p = p[:1+rng.IntN(len(p))]
		if rng.IntN(3) == 0 {
			events = append(events, removed(w, TierDevice, pathID(p)))
		} else {
			events = append(events, stored(w, TierDevice, nil, blocksOf("", p)))
		}
	}
	ix, ref := NewIndex(4), NewIndex(4)
	for _, ev := range events {
		ref.Apply(ev) // errors (unknown parents, say) leave both unchanged
	}
	var wg sync.WaitGroup
	done := make(chan struct{})
	wg.Go(func() {
		defer close(done)
		for _, ev := range events {
			ix.Apply(ev)
		}
	})
	wg.Go(func() {
		var dst []Overlap
		for {
			select {
			case <-done:
				return
			default:
			}
			for _, p := range paths {
				dst = ix.Match(seqOf(p), dst[:0])
			}
		}
	})
	wg.Wait()
	for _, p := range paths {
		if got, want := matchSorted(ix, p), matchSorted(ref, p); !slices.Equal(got, want) {
			t.Errorf("match %q after the writers = %v, want %v", p, got, want)
		}
	}
}
