package indexer

import (
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// Symbols are block contents; a path is a string of symbols '0'..'3'.
func symLocal(c byte) uint64 {
	s := uint32(c - '0')
	return LocalHash([]uint32{s, s + 10, s + 20, s + 30}, BaseSeed, nil)
}

// pathID is the engine id of a path: content-derived, as vLLM's are.
func pathID(path string) uint64 {
	return LocalHash([]uint32{uint32(len(path))}, 99, []uint64{uint64(len(path))}) ^ hashString(path)
}

func hashString(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h = (h ^ uint64(s[i])) * 1099511628211
	}
	return h
}

func sortOverlaps(o []Overlap) {
	slices.SortFunc(o, func(a, b Overlap) int { return cmpWorkerRank(a.Worker, b.Worker) })
}

func seqOf(path string) []uint64 {
	local := make([]uint64, len(path))
	for i := range path {
		local[i] = symLocal(path[i])
	}
	return SequenceHashes(nil, local)
}

func blocksOf(base, blocks string) []Block {
	out := make([]Block, len(blocks))
	for i := range blocks {
		out[i] = Block{ID: pathID(base + blocks[:i+1]), Local: symLocal(blocks[i])}
	}
	return out
}

func matchSorted(ix *Index, query string) []Overlap {
	got := ix.Match(seqOf(query), nil)
	sortOverlaps(got)
	return got
}

func mapsEqual(a, b map[WorkerRank]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestEngineIDCollisions applies random events whose engine ids come from
// a small pool, so that one block gets several ids in a rank and one id is
// reused for other content (TestTreeMatchesReference compares such events
// with the reference too): after every step the index's invariants hold
// (pins count the engine ids naming each block, blocks no rank holds are
// kept only while named), and at the end load(dump(x)) answers
// every query like x.
func TestEngineIDCollisions(t *testing.T) {
	genPath := rapid.StringOfN(rapid.RuneFrom([]rune("012")), 1, 6, -1)
	genID := rapid.Uint64Range(0, 9) // 0 is kept aside by the tables
	rapid.Check(t, func(t *rapid.T) {
		ix := NewShardedIndex(4, rapid.IntRange(1, 3).Draw(t, "shards"))
		var queries []string
		steps := rapid.IntRange(1, 40).Draw(t, "steps")
		for step := 0; step < steps; step++ {
			w := WorkerRank{Worker: rapid.Uint64Range(1, 3).Draw(t, "worker")}
			tier := rapid.SampledFrom([]Tier{TierDevice, TierHost, TierDisk}).Draw(t, "tier")
			path := genPath.Draw(t, "path")
			switch op := rapid.IntRange(0, 9).Draw(t, "op"); {
			case op < 6:
				blocks := blocksOf("", path)
				for i := range blocks {
					blocks[i].ID = genID.Draw(t, "id")
				}
				var parent *uint64
				if rapid.Bool().Draw(t, "under a parent") {
					parent = ptr(genID.Draw(t, "parent"))
				}
				// An unknown parent is an error that changes nothing.
				_, _ = ix.Apply(stored(w, tier, parent, blocks))
			case op < 8:
				var ids []uint64
				for range rapid.IntRange(1, 4).Draw(t, "removals") {
					ids = append(ids, genID.Draw(t, "removed id"))
				}
				ix.Apply(removed(w, tier, ids...))
			case op < 9:
				ix.Apply(Event{Kind: Cleared, Worker: w, Tier: tier})
			default:
				ix.RemoveWorkerRank(w)
			}
			queries = append(queries, path)
			checkInvariants(t, ix)
		}
		loaded := NewShardedIndex(4, rapid.IntRange(1, 3).Draw(t, "loadedShards"))
		if _, err := loaded.Load(ix.Dump()); err != nil {
			t.Fatalf("load: %v", err)
		}
		checkInvariants(t, loaded)
		for _, q := range queries {
			got, want := matchSorted(loaded, q), matchSorted(ix, q)
			for i := range got {
				got[i].Blocks = 0 // a dump leaves out blocks no query reaches
			}
			for i := range want {
				want[i].Blocks = 0
			}
			if !slices.Equal(got, want) {
				t.Fatalf("match %q: loaded %v, original %v", q, got, want)
			}
		}
	})
}
