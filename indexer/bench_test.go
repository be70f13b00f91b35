package indexer

import (
	"math/rand/v2"
	"runtime"
	"testing"
)

// benchIndex builds an index where workers ranks share a prefix of shared
// blocks and each then holds its own chain of own blocks, and returns it
// with the sequence hashes of a query matching rank 0's whole chain.
func benchIndex(b *testing.B, workers, shared, own int) (*Index, []uint64) {
	ix := NewIndex(16)
	var query []uint64
	for w := range workers {
		local := make([]uint64, 0, shared+own)
		for i := range shared + own {
			if i < shared {
				local = append(local, uint64(i)*0x9e3779b97f4a7c15+1)
			} else {
				local = append(local, uint64(w+1)<<32|uint64(i))
			}
		}
		blocks := make([]Block, len(local))
		for i, l := range local {
			blocks[i] = Block{ID: uint64(w)<<40 | uint64(i), Local: l}
		}
		if _, err := ix.Apply(Event{Kind: Stored, Worker: WorkerRank{Worker: uint64(w)}, Tier: TierDevice, Blocks: blocks}); err != nil {
			b.Fatal(err)
		}
		if w == 0 {
			query = SequenceHashes(nil, local)
		}
	}
	return ix, query
}

func BenchmarkMatchShallow(b *testing.B) { benchMatch(b, 256, 1, 24) }
func BenchmarkMatchDeep(b *testing.B)    { benchMatch(b, 256, 32, 736) }
func BenchmarkMatchFewWorkers(b *testing.B) {
	benchMatch(b, 8, 32, 736)
}

func benchMatch(b *testing.B, workers, shared, own int) {
	ix, q := benchIndex(b, workers, shared, own)
	dst := make([]Overlap, 0, workers)
	b.ReportAllocs()
	for b.Loop() {
		dst = ix.Match(q, dst[:0])
	}
	if len(dst) != workers || int(dst[0].Device) != shared+own {
		b.Fatalf("match = %d ranks, first %+v", len(dst), dst[0])
	}
}

// BenchmarkStoreRemove stores a 64-block chain under a shared prefix and
// removes it again; ns/op covers 128 block operations.
func BenchmarkStoreRemove(b *testing.B) {
	ix, _ := benchIndex(b, 64, 32, 64)
	w := WorkerRank{Worker: 1000}
	mustApply(b, ix, Event{Kind: Stored, Worker: w, Tier: TierDevice, Blocks: longChain(0, 0, 32)})
	blocks := make([]Block, 64)
	hashes := make([]uint64, 64)
	for i := range blocks {
		blocks[i] = Block{ID: 1000 + uint64(i), Local: 7<<50 | uint64(i)}
		hashes[len(hashes)-1-i] = blocks[i].ID
	}
	b.ReportAllocs()
	for b.Loop() {
		mustApply(b, ix, Event{Kind: Stored, Worker: w, Tier: TierDevice, Parent: 31, HasParent: true, Blocks: blocks})
		mustApply(b, ix, Event{Kind: Removed, Worker: w, Tier: TierDevice, IDs: hashes})
	}
}

// benchOwnChain returns benchIndex(b, 64, 32, 64), a chain of 96 blocks
// whose first 32 are its workers' shared prefix, and the engine ids of
// the other 64, last first.
func benchOwnChain(b *testing.B) (*Index, []Block, []uint64) {
	ix, _ := benchIndex(b, 64, 32, 64)
	blocks := longChain(0, 0, 96)
	hashes := make([]uint64, 64)
	for i := 32; i < len(blocks); i++ {
		blocks[i].Local = 7<<50 | uint64(i)
		hashes[len(blocks)-1-i] = blocks[i].ID
	}
	return ix, blocks, hashes
}

// mustApply applies ev, failing b if it cannot.
func mustApply(b *testing.B, ix *Index, ev Event) {
	if _, err := ix.Apply(ev); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkCopyToHost copies a 64-block chain a rank holds in device
// memory to host memory and removes that copy again, as an engine that
// offloads blocks does; ns/op covers 128 block operations.
func BenchmarkCopyToHost(b *testing.B) {
	ix, blocks, hashes := benchOwnChain(b)
	w := WorkerRank{Worker: 1000}
	mustApply(b, ix, Event{Kind: Stored, Worker: w, Tier: TierDevice, Blocks: blocks})
	b.ReportAllocs()
	for b.Loop() {
		mustApply(b, ix, Event{Kind: Stored, Worker: w, Tier: TierHost, Parent: 31, HasParent: true, Blocks: blocks[32:]})
		mustApply(b, ix, Event{Kind: Removed, Worker: w, Tier: TierHost, IDs: hashes})
	}
}

// BenchmarkEvictShared evicts, last block first, a 64-block chain that
// another rank holds too, and stores it back, as ranks serving the same
// conversations do; ns/op covers 128 block operations.
func BenchmarkEvictShared(b *testing.B) {
	ix, blocks, hashes := benchOwnChain(b)
	w := WorkerRank{Worker: 1000}
	for _, wr := range []WorkerRank{w, {Worker: 1001}} {
		mustApply(b, ix, Event{Kind: Stored, Worker: wr, Tier: TierDevice, Blocks: blocks})
	}
	b.ReportAllocs()
	for b.Loop() {
		mustApply(b, ix, Event{Kind: Removed, Worker: w, Tier: TierDevice, IDs: hashes})
		mustApply(b, ix, Event{Kind: Stored, Worker: w, Tier: TierDevice, Parent: 31, HasParent: true, Blocks: blocks[32:]})
	}
}

// BenchmarkRemoveRank stores a 4 096-block chain for a rank, of which
// another rank holds the first half, and removes the rank, as a worker
// that leaves; ns/op covers 8 192 block operations.
func BenchmarkRemoveRank(b *testing.B) {
	ix := NewIndex(16)
	blocks := longChain(0, 0, 4096)
	mustApply(b, ix, Event{Kind: Stored, Worker: WorkerRank{Worker: 1}, Tier: TierDevice, Blocks: blocks[:2048]})
	w := WorkerRank{Worker: 2}
	b.ReportAllocs()
	for b.Loop() {
		mustApply(b, ix, Event{Kind: Stored, Worker: w, Tier: TierDevice, Blocks: blocks})
		ix.RemoveWorkerRank(w)
	}
}

// BenchmarkDependentLoad measures the machine rather than the index: the
// time of a load that misses every cache and whose address comes from the
// load before, over a table of 256 MiB (the size of bench/indexload's
// index with 16-token blocks). Match and apply are chains of such loads
// (a head table slot, then its span, then its holder set), so this is the
// unit their costs are counted in: a match of p99 10 µs may make about
// 10µs/(ns/op) of them in a row.
func BenchmarkDependentLoad(b *testing.B) {
	next := make([]uint32, 256<<20/4)
	for i := range next {
		next[i] = uint32(i)
	}
	// Sattolo's shuffle: one cycle through every entry, in random order.
	rng := rand.New(rand.NewPCG(1, 2))
	for i := len(next) - 1; i > 0; i-- {
		j := rng.IntN(i)
		next[i], next[j] = next[j], next[i]
	}
	x := uint32(0)
	for b.Loop() {
		x = next[x]
	}
	runtime.KeepAlive(x)
}
