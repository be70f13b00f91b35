package scheduler

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kvgate/kvgate/indexer"
)

// BenchmarkSelect decides for 8000-token prompts (500 blocks of 16 tokens)
// over 256 workers of 8 DP ranks each (2048 candidate ranks):
//
//   - the index: 4 shared prompts; every rank holds a prefix of one of them,
//     0 to 500 blocks long, on device, and every 7th rank 40 more blocks in
//     host memory;
//   - active load: 512 requests, one on every 4th rank, each holding a
//     prefix (100 to 499 blocks) of one of the prompts, half still in
//     prefill, booked as the gateway books its own (Booking.Chained);
//   - the requests: prompt i%4, whole (so most ranks match part of it), or
//     with its last 100 blocks replaced by blocks of its own (i%2 == 1).
//
// "select" decides without booking; "reserve+free" books the decision and
// frees it again (the pair is timed); "index-match-only" is Index.Match
// alone on the same index and prompts, to tell the index's share. Besides ns/op, it reports the p50 and
// p99 of the per-operation durations (issue target: p99 <= 50 µs).
func BenchmarkSelect(b *testing.B) {
	const workers, dp, blocks, nPrompts, bs = 256, 8, 500, 4, 16
	s := newSelRig(b, bs, rigOptions{})
	for id := range uint64(workers) {
		s.ranks(id+1, dp)
	}
	prompts := make([][]uint64, nPrompts)
	for p := range prompts {
		prompts[p] = promptOf(p, blocks)
	}
	loads := s.loads
	for w := range workers {
		for r := range dp {
			i := w*dp + r
			rank := rk(uint64(w+1), uint32(r))
			p := prompts[(w+r)%nPrompts]
			n := i * 61 % (blocks + 1)
			if n > 0 {
				s.store(rank, indexer.TierDevice, p, 0, n)
			}
			if i%7 == 0 && n+40 <= blocks {
				s.store(rank, indexer.TierHost, p, n, n+40)
			}
			if i%4 == 0 {
				seq := indexer.SequenceHashes(nil, p[:100+i%400])
				prefill := int64(0)
				if i/4%2 == 0 {
					prefill = int64(bs * (i % 300))
				}
				must(b, loads.Add(s.key, Booking{ID: fmt.Sprintf("load-%d", i), Worker: rank, Hashes: seq, PrefillTokens: prefill, Chained: true}))
			}
		}
	}
	reqs := make([][]uint64, 64)
	for i := range reqs {
		reqs[i] = slices.Clone(prompts[i%nPrompts])
		if i%2 == 1 {
			for j := blocks - 100; j < blocks; j++ {
				reqs[i][j] = uint64(i+1)<<50 | uint64(j)
			}
		}
	}
	sch := s.scheduler(1, CostOptions{})

	b.Run("select", func(b *testing.B) {
		timeOps(b, func(i int) {
			if _, err := sch.Select(SelectRequest{Key: s.key, Local: reqs[i%len(reqs)]}); err != nil {
				b.Fatal(err)
			}
		})
	})
	// For reference: the index lookup alone (Index.Match), the first step
	// of every decision.
	ix := s.set.Lookup(s.key)
	seqs := make([][]uint64, len(reqs))
	for i, r := range reqs {
		seqs[i] = indexer.SequenceHashes(nil, r)
	}
	b.Run("index-match-only", func(b *testing.B) {
		var dst []indexer.Overlap
		timeOps(b, func(i int) { dst = ix.Match(seqs[i%len(seqs)], dst[:0]) })
	})
	ids := make([]string, 1024)
	for i := range ids {
		ids[i] = fmt.Sprintf("bench-%d", i)
	}
	b.Run("reserve+free", func(b *testing.B) {
		timeOps(b, func(i int) {
			id := ids[i%len(ids)]
			if _, err := sch.Select(SelectRequest{Key: s.key, Local: reqs[i%len(reqs)], Reserve: true, ReservationID: id}); err != nil {
				b.Fatal(err)
			}
			if freed, err := loads.Free(s.key, id); !freed || err != nil {
				b.Fatalf("free %s: %v %v", id, freed, err)
			}
		})
	})
}

// timeOps runs op(0), op(1), ... b.N times, timing each call, and reports
// the median and 99th percentile as p50-ns and p99-ns.
func timeOps(b *testing.B, op func(i int)) {
	durs := make([]time.Duration, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range durs {
		start := time.Now()
		op(i)
		durs[i] = time.Since(start)
	}
	b.StopTimer()
	slices.Sort(durs)
	b.ReportMetric(float64(durs[len(durs)/2]), "p50-ns")
	b.ReportMetric(float64(durs[len(durs)*99/100]), "p99-ns")
}
