package scheduler

import (
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/kvgate/kvgate/indexer"
)

// These tests drive the metrics correction of the cost
// (CostOptions.MetricsWeight) over fixed engine reports; scheduler/scrape
// tests it over scraped pages. Expected costs are worked out by hand from
// the formula of CostOptions.MetricsWeight:
//
//	reported = (w + 1) * waiting * b + used_blocks   (used: usage * num_gpu_blocks, else running * b)
//	tracked  = w * active_prefill / block_size + active_decode_blocks
//	cost    += weight * max(0, reported - tracked)

// fixedReports are engine reports set by the test, counting for an hour.
type fixedReports map[indexer.Key]map[indexer.WorkerRank]EngineReport

func (f fixedReports) set(key indexer.Key, wr indexer.WorkerRank, l EngineLoad) {
	if f[key] == nil {
		f[key] = map[indexer.WorkerRank]EngineReport{}
	}
	f[key][wr] = EngineReport{EngineLoad: l, Until: time.Now().Add(time.Hour)}
}

func (f fixedReports) ReadReports(key indexer.Key, read func(map[indexer.WorkerRank]EngineReport)) {
	read(f[key])
}

var nan = math.NaN()

// engLoad returns an EngineLoad; pass NaN for a value not reported.
func engLoad(waiting, running, usage, blocks float64) EngineLoad {
	return EngineLoad{Waiting: waiting, Running: running, KVUsage: usage, KVBlocks: blocks}
}

// TestMetricsWeightZeroIsIdentical: with weight 0, decisions on a catalog
// whose every rank reports a load (one that would change them) are those
// made without reports, bit for bit, at every temperature.
func TestMetricsWeightZeroIsIdentical(t *testing.T) {
	s := newCostRig(t, rigOptions{})
	type query struct {
		name string
		req  SelectRequest
	}
	var queries []query
	for _, ws := range [][]uint64{nil, {2, 3}, {4, 5, 6}} {
		for _, temp := range []float64{0, 0.5, 2} {
			for _, w := range []float64{1, 0, 2.5} {
				for _, p := range [][]uint64{costPrompt, promptOf(3, 6)} {
					queries = append(queries, query{fmt.Sprintf("workers %v temperature %v weight %v prompt %d", ws, temp, w, len(p)),
						SelectRequest{Key: s.key, Local: p, Workers: ws, Temperature: ptrTo(temp), OverlapWeight: ptrTo(w)}})
				}
			}
		}
	}
	decide := func(opts CostOptions) []Decision {
		var out []Decision
		for _, q := range queries {
			for seed := range uint64(4) {
				d, err := s.scheduler(seed, opts).Select(q.req)
				if err != nil {
					t.Fatalf("%s: %v", q.name, err)
				}
				out = append(out, d)
			}
		}
		return out
	}
	before := decide(CostOptions{})
	rnd := rand.New(rand.NewPCG(1, 2))
	reports := fixedReports{}
	for _, w := range s.cat.Workers(s.key.Model, s.key.Tenant) {
		for _, r := range w.Ranks {
			reports.set(s.key, rk(w.ID, r), engLoad(float64(rnd.IntN(8)), float64(rnd.IntN(8)), rnd.Float64(), float64(16+rnd.IntN(64))))
		}
	}
	after := decide(CostOptions{MetricsWeight: 0, Engines: reports})
	for i := range before {
		a, b := before[i], after[i]
		if !reflect.DeepEqual(a, b) || math.Float64bits(a.Cost) != math.Float64bits(b.Cost) {
			t.Fatalf("%s seed %d: %+v before the scrapes, %+v after", queries[i/4].name, i%4, a, b)
		}
	}
	// The scrapes do change decisions when weighed: the test can fail.
	if weighed := decide(CostOptions{MetricsWeight: 1, Engines: reports}); reflect.DeepEqual(before, weighed) {
		t.Fatal("weight 1 changed no decision: the scraped loads are not read")
	}
}

// TestMetricsCorrectionMatchesBruteForce compares decisions with a
// correction to costs worked out naively for every rank, from the loads'
// own views (Potentials, Snapshot) and the formula, over random loads,
// caches and reported values: decide's cost bounds, its per-rank counts
// and its shortcut past uncached ranks must stay exact with a correction.
func TestMetricsCorrectionMatchesBruteForce(t *testing.T) {
	const bs = 4
	for seed := range uint64(12) {
		rnd := rand.New(rand.NewPCG(seed, 99))
		s := newSelRig(t, bs, rigOptions{})
		const promptLen = 12
		prompts := [][]uint64{promptOf(1, promptLen), promptOf(2, promptLen)}
		scraped := map[indexer.WorkerRank]EngineLoad{}
		reports := fixedReports{}
		id := 0
		for w := range 10 {
			dp := uint32(1 + rnd.IntN(3))
			s.ranks(uint64(w+1), dp)
			for r := range dp {
				wr := rk(uint64(w+1), r)
				p := prompts[rnd.IntN(len(prompts))]
				if n := rnd.IntN(promptLen + 1); n > 0 && rnd.IntN(2) == 0 {
					s.store(wr, indexer.TierDevice, p, 0, n)
				}
				for range rnd.IntN(3) {
					seq := indexer.SequenceHashes(nil, prompts[rnd.IntN(len(prompts))])
					hashes := append(seq[:rnd.IntN(len(seq))], rnd.Uint64N(1<<62))
					id++
					must(t, s.loads.Add(s.key, Booking{ID: fmt.Sprint(id), Worker: wr, Hashes: hashes, PrefillTokens: int64(rnd.IntN(5) * bs)}))
				}
				if rnd.IntN(4) > 0 {
					l := engLoad(float64(rnd.IntN(4)), float64(rnd.IntN(4)), float64(rnd.IntN(5))/4, nan)
					if rnd.IntN(2) == 0 {
						l.KVBlocks = float64(8 * rnd.IntN(5))
					}
					scraped[wr] = l
					reports.set(s.key, wr, l)
				}
			}
		}
		ix := s.set.Lookup(s.key)
		snap := map[indexer.WorkerRank]Load{}
		for _, l := range s.loads.Snapshot(s.key.Model, s.key.Tenant) {
			snap[l.Worker] = l
		}
		for pi, p := range prompts {
			seq := indexer.SequenceHashes(nil, p)
			isl := int64(len(seq) * bs)
			pots, err := s.loads.potentials(s.key, seq, 0)
			must(t, err)
			overlaps := overlapsByRank(nil, ix.Match(seq, nil))
			for _, ow := range []float64{1, 0, 2.5} {
				for _, mw := range []float64{0.5, 1, 3} {
					costs := map[indexer.WorkerRank]float64{}
					least := math.Inf(1)
					for _, pot := range pots {
						ov := overlaps[pot.Worker]
						unc := max(0, isl-int64(math.Round(float64(ov.Device)*bs)))
						cost := ow*float64(pot.PrefillTokens+unc)/bs + pot.DecodeBlocks
						if e, ok := scraped[pot.Worker]; ok {
							b := float64(isl) / bs
							reported := (ow+1)*e.Waiting*b + e.Running*b
							if e.KVBlocks > 0 {
								reported = (ow+1)*e.Waiting*b + e.KVUsage*e.KVBlocks
							}
							l := snap[pot.Worker]
							if tracked := ow*float64(l.PrefillTokens)/bs + l.DecodeBlocks; reported > tracked {
								cost += mw * (reported - tracked)
							}
						}
						costs[pot.Worker] = cost
						least = min(least, cost)
					}
					smallest := math.MaxInt
					for wr, c := range costs {
						if c == least {
							smallest = min(smallest, ix.RankBlocks(wr))
						}
					}
					what := fmt.Sprintf("seed %d prompt %d overlap weight %v metrics weight %v", seed, pi, ow, mw)
					req := SelectRequest{Key: s.key, Local: p, OverlapWeight: ptrTo(ow)}
					d, err := s.scheduler(seed, CostOptions{MetricsWeight: mw, Engines: reports}).Select(req)
					if err != nil {
						t.Fatalf("%s: %v", what, err)
					}
					if d.Cost != least || costs[d.Worker] != least || ix.RankBlocks(d.Worker) != smallest {
						t.Fatalf("%s: chose %s at cost %v (naive %v, tree %d), want the least cost %v, tree %d",
							what, d.Worker, d.Cost, costs[d.Worker], ix.RankBlocks(d.Worker), least, smallest)
					}
					req.Temperature = ptrTo(1.0)
					if d, err := s.scheduler(seed, CostOptions{MetricsWeight: mw, Engines: reports}).Select(req); err != nil || d.Cost != costs[d.Worker] {
						t.Fatalf("%s, sampled: chose %s at cost %v (%v), naive cost %v", what, d.Worker, d.Cost, err, costs[d.Worker])
					}
				}
			}
		}
	}
}
