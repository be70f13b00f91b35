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

// TestUnlockedMatchRunsAgainOnAFault checks that a match whose reads
// fault (here, a span naming a holder set past the end) is not run
// through, and that a match on a whole tree is, with the locked answer.
func TestUnlockedMatchRunsAgainOnAFault(t *testing.T) {
	ix, seq, want := handIndex(t, 0) // answered on the quiescent tree
	sh := ix.shards[0]
	m := &matcher{ix: sh, seq: seq}
	if !m.tryUnlocked() || !slices.Equal(m.dst, want) {
		t.Fatalf("unlocked match on a whole tree: ran through %v, %v; want %v", m.dst != nil, m.dst, want)
	}
	s, ok := sh.tree.childSpan(noBlock, seq[0])
	if !ok {
		t.Fatal("no root span for the prompt")
	}
	set := sh.tree.spans[s].set
	sh.tree.spans[s].set = uint32(len(sh.tree.sets)) + 1<<20
	m.dst = nil
	if m.tryUnlocked() {
		t.Errorf("unlocked match on a torn tree ran through, with %v", m.dst)
	}
	sh.tree.spans[s].set = set
	if got := ix.Match(seq, nil); !slices.Equal(got, want) {
		t.Errorf("match after the fault = %v, want %v", got, want)
	}
}

// TestUnlockedMatchesWhileApplying runs unlocked matches while writers
// apply events: none may crash the process or hang, and once the writers
// are done the answers are those of an index built the same way and
// matched after.
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
