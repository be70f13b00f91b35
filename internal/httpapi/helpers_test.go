package httpapi

import (
	"slices"
	"testing"

	"github.com/kvgate/kvgate/indexer"
)

func wr(w uint64, r uint32) indexer.WorkerRank { return indexer.WorkerRank{Worker: w, Rank: r} }

// ov is an expected overlap; its tree size is checked by trees.
func ov(w indexer.WorkerRank, dev, host, disk int) indexer.Overlap {
	return indexer.Overlap{Worker: w, Device: int32(dev), Host: int32(host), Disk: int32(disk)}
}

// trees checks each overlap's tree size against ix.RankBlocks and returns
// the overlaps without it, to compare with ov's.
func trees(t testing.TB, ix *indexer.Index, got []indexer.Overlap) []indexer.Overlap {
	t.Helper()
	out := slices.Clone(got)
	for i := range out {
		if n := ix.RankBlocks(out[i].Worker); int(out[i].Blocks) != n {
			t.Errorf("%v: overlap says %d blocks, RankBlocks %d", out[i].Worker, out[i].Blocks, n)
		}
		out[i].Blocks = 0
	}
	return out
}
