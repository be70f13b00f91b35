package reference

import (
	"errors"
	"maps"
	"slices"
	"testing"

	"github.com/kvgate/kvgate/indexer"
)

// TestContract walks the reference and indexer.Index through the
// contract's cases by hand: a chain and its match, a block evicted before
// its child, what a dump then leaves out, an unknown parent, and an
// engine id reused for other content. Package indexer checks the two
// against each other on random events (differential_test.go).
func TestContract(t *testing.T) {
	for name, empty := range map[string]func() indexer.Interface{
		"reference": func() indexer.Interface { return New(16) },
		"index":     func() indexer.Interface { return indexer.NewShardedIndex(16, 2) },
	} {
		t.Run(name, func(t *testing.T) { contract(t, empty) })
	}
}

func contract(t *testing.T, empty func() indexer.Interface) {
	w := indexer.WorkerRank{Worker: 7, Rank: 1}
	local := []uint64{11, 12, 13}
	seq := indexer.SequenceHashes(nil, local)
	blocks := []indexer.Block{{ID: 1, Local: 11}, {ID: 2, Local: 12}, {ID: 3, Local: 13}}
	ix := empty()
	apply := func(ev indexer.Event, want indexer.ApplyResult) {
		t.Helper()
		if got, err := ix.Apply(ev); err != nil || got != want {
			t.Fatalf("apply %+v: %+v, %v; want %+v", ev, got, err, want)
		}
	}
	match := func(ix indexer.Interface, want ...indexer.Overlap) {
		t.Helper()
		if got := ix.Match(seq, nil); !slices.Equal(got, want) {
			t.Fatalf("match = %+v, want %+v", got, want)
		}
	}

	apply(indexer.Event{Kind: indexer.Stored, Worker: w, Tier: indexer.TierDevice, Blocks: blocks}, indexer.ApplyResult{Stored: 3})
	apply(indexer.Event{Kind: indexer.Stored, Worker: w, Tier: indexer.TierHost, Parent: 1, HasParent: true, Blocks: blocks[1:]}, indexer.ApplyResult{Stored: 2})
	match(ix, indexer.Overlap{Worker: w, Device: 3, Host: 3, Disk: 3, Blocks: 3})

	// Block 2 leaves both tiers before its child: the match stops at it.
	apply(indexer.Event{Kind: indexer.Removed, Worker: w, Tier: indexer.TierDevice, IDs: []uint64{2, 99}}, indexer.ApplyResult{Removed: 1, Unknown: 1})
	match(ix, indexer.Overlap{Worker: w, Device: 1, Host: 3, Disk: 3, Blocks: 3})
	apply(indexer.Event{Kind: indexer.Cleared, Worker: w, Tier: indexer.TierHost}, indexer.ApplyResult{Removed: 2})
	match(ix, indexer.Overlap{Worker: w, Device: 1, Host: 1, Disk: 1, Blocks: 2})

	// The dump leaves block 3 out: no match of the rank reaches it.
	loaded := empty()
	if skipped, err := loaded.Load(ix.Dump()); skipped != 0 || err != nil {
		t.Fatalf("load: skipped %d, %v", skipped, err)
	}
	match(loaded, indexer.Overlap{Worker: w, Device: 1, Host: 1, Disk: 1, Blocks: 1})
	if got := loaded.BlockCounts(); !maps.Equal(got, map[indexer.WorkerRank]int{w: 1}) {
		t.Fatalf("loaded block counts %v", got)
	}

	// An unknown parent changes nothing; a reused id takes its block off
	// every tier.
	if _, err := ix.Apply(indexer.Event{Kind: indexer.Stored, Worker: w, Tier: indexer.TierDevice, Parent: 2, HasParent: true, Blocks: blocks[2:]}); !errors.Is(err, indexer.ErrUnknownParent) {
		t.Fatalf("stored under a removed parent: err %v", err)
	}
	apply(indexer.Event{Kind: indexer.Stored, Worker: w, Tier: indexer.TierDisk, Blocks: []indexer.Block{{ID: 1, Local: 21}}}, indexer.ApplyResult{Stored: 1, Removed: 1})
	match(ix)
	if st := ix.Stats(); st.Workers != 1 || st.Entries != 2 {
		t.Fatalf("stats %+v, want 1 rank with 2 engine ids", st)
	}
}
