package scheduler

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/indexer"
	"github.com/kvgate/kvgate/scheduler/catalog"
)

// These tests drive Scheduler.Select (docs/scheduling.md, "Cost of
// sending a new request to (worker, rank)"). Expected costs are worked out
// by hand from the spec's formula, never read back from the code:
//
//	prefill_tokens = active_prefill + max(0, isl - effective_overlap * block_size)
//	decode_blocks  = active_decode + (request_blocks - prompt blocks already held)
//	cost           = w * prefill_tokens / block_size + decode_blocks
//	effective_overlap = device + host_w*(host - device) + disk_w*(disk - host)
//
// with w = 1, host_w = 0.8 and disk_w = 0.5 unless a case says otherwise.

// selRig is a catalog (see rig) whose workers register DP ranges, so they
// are schedulable without listeners, and whose KV blocks are applied
// straight to the index.
type selRig struct {
	*rig
	key indexer.Key
	bs  int
}

func newSelRig(tb testing.TB, blockSize int, o rigOptions) *selRig {
	return &selRig{rig: newRig(tb, o), key: loadKey, bs: blockSize}
}

// ranks registers worker id with DP ranks 0 .. size-1.
func (s *selRig) ranks(id uint64, size uint32) {
	s.t.Helper()
	must(s.t, s.cat.RegisterRange(catalog.RangeRegistration{WorkerKey: catalog.WorkerKey{Key: s.key, ID: id}, BlockSize: s.bs, DPSize: size, Source: catalog.SourceAPI}))
}

// store stores blocks lo .. hi-1 of prompt (local hashes) on tier for r,
// chained to block lo-1. A block's engine id is its position + 1.
func (s *selRig) store(r indexer.WorkerRank, tier indexer.Tier, prompt []uint64, lo, hi int) {
	s.t.Helper()
	ev := indexer.Event{Kind: indexer.Stored, Worker: r, Tier: tier}
	for i := lo; i < hi; i++ {
		ev.Blocks = append(ev.Blocks, indexer.Block{ID: uint64(i + 1), Local: prompt[i]})
	}
	if lo > 0 {
		ev.Parent, ev.HasParent = uint64(lo), true
	}
	ix, err := s.set.Index(s.key, s.bs)
	if err == nil {
		_, err = ix.Apply(ev)
	}
	must(s.t, err)
}

func (s *selRig) scheduler(seed uint64, opts CostOptions) *Scheduler {
	return NewScheduler(s.cat, s.set, s.loads, opts, seed, nil)
}

// promptOf returns n local block hashes of prompt p.
func promptOf(p, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = uint64(p+1)<<40 | uint64(i)*0x9e3779b97f4a7c15>>24 | 1
	}
	return out
}

func ptrTo[T any](v T) *T { return &v }

// costPrompt is the prompt of the cost rig: 10 blocks of 4 tokens (isl 40).
var costPrompt = promptOf(0, 10)

// newCostRig builds the state the cost cases below are worked out on
// (block size 4, costPrompt):
//
//	worker 1:   device 7 blocks                    eff 7: new prefill 40-28 = 12
//	worker 2:   device 1, host 6, disk 8 (cumul.)  eff 1 + 0.8*5 + 0.5*2 = 6: new prefill 16
//	worker 3:   nothing cached; request "busy": 8 prefill tokens, holding
//	            blocks 0..2 of the prompt and 2 others (5 decode blocks)
//	worker 4:   device 10; request "same" (this prompt, 40 prefill tokens)
//	worker 5:   DP 2; rank 1 device 4, rank 0 nothing
//	worker 6,7: nothing
//	worker 8:   full prompt on device, but its listener is pending (a
//	            closed port): not schedulable
//	worker 9:   full prompt on device in the index, not in the catalog
func newCostRig(t testing.TB, o rigOptions) *selRig {
	s := newSelRig(t, testBS, o)
	for id := uint64(1); id <= 7; id++ {
		size := uint32(1)
		if id == 5 {
			size = 2
		}
		s.ranks(id, size)
	}
	must(t, s.cat.RegisterRank(catalog.RankRegistration{WorkerKey: catalog.WorkerKey{Key: s.key, ID: 8}, BlockSize: testBS,
		Publisher: catalog.Publisher{Endpoint: closedPort(t)}, Source: catalog.SourceAPI}))
	p := costPrompt
	seq := indexer.SequenceHashes(nil, p)
	s.store(rk(1, 0), indexer.TierDevice, p, 0, 7)
	s.store(rk(2, 0), indexer.TierDevice, p, 0, 1)
	s.store(rk(2, 0), indexer.TierHost, p, 1, 6)
	s.store(rk(2, 0), indexer.TierDisk, p, 6, 8)
	s.store(rk(4, 0), indexer.TierDevice, p, 0, 10)
	s.store(rk(5, 1), indexer.TierDevice, p, 0, 4)
	s.store(rk(8, 0), indexer.TierDevice, p, 0, 10)
	s.store(rk(9, 0), indexer.TierDevice, p, 0, 10)
	loads := s.loads
	must(t, loads.Add(s.key, Booking{ID: "busy", Worker: rk(3, 0), Hashes: append(slices.Clone(seq[:3]), 77, 78), PrefillTokens: 8}))
	must(t, loads.Add(s.key, Booking{ID: "same", Worker: rk(4, 0), Hashes: seq, PrefillTokens: 40}))
	if ws := s.cat.Workers("m", ""); len(ws) != 8 || s.cat.View().Schedulable(s.key)[8] {
		t.Fatalf("workers %+v: want 8, worker 8 not schedulable", ws)
	}
	return s
}

type costCase struct {
	name    string
	opts    CostOptions
	req     SelectRequest // Key and Local default to the rig's key and costPrompt
	err     error
	worker  indexer.WorkerRank
	cost    float64
	prefill int64 // EffectivePrefillTokens
	overlap *indexer.Overlap
	dp      map[uint32]int
}

func TestSelectCost(t *testing.T) {
	s := newCostRig(t, rigOptions{})
	seq := indexer.SequenceHashes(nil, costPrompt)
	inf := math.Inf(1)
	tests := []costCase{
		// Costs: 1: 12/4 + 10 = 13; 2: 16/4 + 10 = 14; 3: (8+40)/4 + 5 +
		// (10-3) = 24; 4: (40+0)/4 + 10 + (10-10) = 20; 5.0: 40/4 + 10 = 20;
		// 5.1: 24/4 + 10 = 16; 6, 7: 20. 8 and 9 (10) are not candidates.
		{name: "argmin", worker: rk(1, 0), cost: 13, prefill: 12,
			overlap: &indexer.Overlap{Worker: rk(1, 0), Device: 7, Host: 7, Disk: 7, Blocks: 7}, dp: map[uint32]int{0: 7}},
		{name: "sequence hashes given", req: SelectRequest{Seq: seq}, worker: rk(1, 0), cost: 13, prefill: 12},
		{name: "host and disk discounted", req: SelectRequest{Workers: []uint64{2}}, worker: rk(2, 0), cost: 14, prefill: 16,
			overlap: &indexer.Overlap{Worker: rk(2, 0), Device: 1, Host: 6, Disk: 8, Blocks: 8}, dp: map[uint32]int{0: 1}},
		{name: "active prefill and partly held blocks", req: SelectRequest{Workers: []uint64{3}}, worker: rk(3, 0), cost: 24, prefill: 40,
			overlap: &indexer.Overlap{Worker: rk(3, 0)}, dp: map[uint32]int{0: 0}},
		{name: "prompt already running there", req: SelectRequest{Workers: []uint64{4}}, worker: rk(4, 0), cost: 20, prefill: 0},
		{name: "best rank of a DP worker", req: SelectRequest{Workers: []uint64{5}}, worker: rk(5, 1), cost: 16, prefill: 24,
			overlap: &indexer.Overlap{Worker: rk(5, 1), Device: 4, Host: 4, Disk: 4, Blocks: 4}, dp: map[uint32]int{1: 4}},
		{name: "cold worker", req: SelectRequest{Workers: []uint64{6}}, worker: rk(6, 0), cost: 20, prefill: 40},
		{name: "candidate subset", req: SelectRequest{Workers: []uint64{3, 2, 42}}, worker: rk(2, 0), cost: 14, prefill: 16},
		// isl 42: the partial block's 2 tokens are prefill too, but no
		// block: 1: (42-28)/4 + 10 = 13.5; 2: (42-24)/4 + 10 = 14.5.
		{name: "isl with a partial block", req: SelectRequest{ISL: 42}, worker: rk(1, 0), cost: 13.5, prefill: 14},
		// isl 20 is shorter than the 28 cached tokens: no new prefill.
		{name: "isl below the overlap", req: SelectRequest{ISL: 20, Workers: []uint64{1}}, worker: rk(1, 0), cost: 10, prefill: 0},
		// w = 0: every cost is its decode blocks: 1, 2, 4, 5.0, 5.1: 10;
		// 3: 12. Ties go to the smaller tree: 5.0 holds no block.
		{name: "overlap weight 0 balances load", req: SelectRequest{OverlapWeight: ptrTo(0.0), Workers: []uint64{1, 2, 3, 4, 5}}, worker: rk(5, 0), cost: 10, prefill: 40},
		// Trees: 1 holds 7 blocks, 2 holds 8, 4 holds 10.
		{name: "overlap weight 0, tie to the smaller tree", req: SelectRequest{OverlapWeight: ptrTo(0.0), Workers: []uint64{4, 2, 1}}, worker: rk(1, 0), cost: 10, prefill: 12},
		{name: "overlap weight 0 by default", opts: CostOptions{OverlapWeight: NoOverlapWeight}, req: SelectRequest{Workers: []uint64{4, 2, 1}}, worker: rk(1, 0), cost: 10, prefill: 12},
		// w = 2: 1: 2*12/4 + 10 = 16; 2: 18; 5.1: 22; 4, 5.0, 6, 7: 30; 3: 36.
		{name: "overlap weight 2", req: SelectRequest{OverlapWeight: ptrTo(2.0)}, worker: rk(1, 0), cost: 16, prefill: 12},
		{name: "overlap weight 2 by default", opts: CostOptions{OverlapWeight: 2}, req: SelectRequest{Workers: []uint64{5}}, worker: rk(5, 1), cost: 22, prefill: 24},
		// w = 0.5: 1: 1.5 + 10 = 11.5; 2: 2 + 10 = 12; 5.1: 3 + 10 = 13.
		{name: "overlap weight 0.5", req: SelectRequest{OverlapWeight: ptrTo(0.5)}, worker: rk(1, 0), cost: 11.5, prefill: 12},
		{name: "request weight overrides the default", opts: CostOptions{OverlapWeight: 2}, req: SelectRequest{OverlapWeight: ptrTo(1.0)}, worker: rk(1, 0), cost: 13, prefill: 12},
		// No discount credit: worker 2's effective overlap is 1: 36/4 + 10.
		{name: "host and disk not credited", opts: CostOptions{HostWeight: NoDiscount, DiskWeight: NoDiscount}, req: SelectRequest{Workers: []uint64{2}}, worker: rk(2, 0), cost: 19, prefill: 36},
		// Host only: 1 + 0.8*5 = 5 blocks: 20/4 + 10 = 15.
		{name: "disk not credited", opts: CostOptions{DiskWeight: NoDiscount}, req: SelectRequest{Workers: []uint64{2}}, worker: rk(2, 0), cost: 15, prefill: 20},
		// Full credit: worker 2's overlap is 8 blocks: 8/4 + 10 = 12 < 13.
		{name: "host and disk fully credited", opts: CostOptions{HostWeight: 1, DiskWeight: 1}, worker: rk(2, 0), cost: 12, prefill: 8},
		{name: "temperature 0 overrides the default", opts: CostOptions{Temperature: 5}, req: SelectRequest{Temperature: ptrTo(0.0)}, worker: rk(1, 0), cost: 13, prefill: 12},

		{name: "pending worker only", req: SelectRequest{Workers: []uint64{8}}, err: ErrUnavailable},
		{name: "worker only in the index", req: SelectRequest{Workers: []uint64{9}}, err: ErrUnavailable},
		{name: "unknown worker", req: SelectRequest{Workers: []uint64{42}}, err: ErrUnavailable},
		{name: "unknown model", req: SelectRequest{Key: indexer.Key{Model: "nope", Tenant: indexer.DefaultTenant}}, err: ErrNotFound},
		{name: "unknown tenant", req: SelectRequest{Key: indexer.Key{Model: "m", Tenant: "t"}}, err: ErrNotFound},
		{name: "negative overlap weight", req: SelectRequest{OverlapWeight: ptrTo(-1.0)}, err: ErrInvalid},
		{name: "infinite overlap weight", req: SelectRequest{OverlapWeight: &inf}, err: ErrInvalid},
		{name: "NaN temperature", req: SelectRequest{Temperature: ptrTo(math.NaN())}, err: ErrInvalid},
		{name: "negative temperature", req: SelectRequest{Temperature: ptrTo(-0.5)}, err: ErrInvalid},
	}
	before := loadsOf(s.loads, s.key)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Several seeds: a decision at temperature 0 without a tie
			// must not depend on the seed.
			for seed := range uint64(4) {
				s.checkCase(t, s.scheduler(seed, tt.opts), tt)
			}
		})
	}
	if after := loadsOf(s.loads, s.key); !mapsEqual(before, after) {
		t.Errorf("selecting without reserving changed the loads:\nbefore %v\nafter  %v", before, after)
	}
}

func mapsEqual[K comparable, V comparable](a, b map[K]V) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// fill defaults req's key and prompt to the rig's.
func (s *selRig) fill(req SelectRequest) SelectRequest {
	if req.Key == (indexer.Key{}) {
		req.Key = s.key
	}
	if req.Local == nil && req.Seq == nil {
		req.Local = costPrompt
	}
	return req
}

func (s *selRig) checkCase(t *testing.T, sch *Scheduler, tt costCase) {
	t.Helper()
	d, err := sch.Select(s.fill(tt.req))
	if tt.err != nil {
		if !errors.Is(err, tt.err) {
			t.Fatalf("error %v, want %v", err, tt.err)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	if d.Worker != tt.worker || d.Cost != tt.cost || d.EffectivePrefillTokens != tt.prefill || d.BlockSize != testBS {
		t.Errorf("decision %s cost %v effective prefill %d block size %d, want %s cost %v effective prefill %d block size %d",
			d.Worker, d.Cost, d.EffectivePrefillTokens, d.BlockSize, tt.worker, tt.cost, tt.prefill, testBS)
	}
	if tt.overlap != nil && d.Overlap != *tt.overlap {
		t.Errorf("overlap %+v, want %+v", d.Overlap, *tt.overlap)
	}
	if tt.dp != nil && !mapsEqual(d.DP, tt.dp) {
		t.Errorf("dp overlaps %v, want %v", d.DP, tt.dp)
	}
}

// TestSelectSeed002Example books seed 002's /add example and selects for
// its /potential_loads request: rank 0 of worker 7 costs (48+48)/16 +
// (3+1) = 10, idle rank 1 costs 48/16 + 4 = 7.
func TestSelectSeed002Example(t *testing.T) {
	s := newSelRig(t, 16, rigOptions{})
	s.ranks(7, 2)
	neg22 := uint64(1<<64 - 22)
	must(t, s.loads.Add(s.key, Booking{ID: "req-123", Worker: rk(7, 0), Hashes: []uint64{101, neg22, 303}, PrefillTokens: 48}))
	sch := s.scheduler(1, CostOptions{})
	d, err := sch.Select(SelectRequest{Key: s.key, Seq: []uint64{101, neg22, 303, 404}, ISL: 48})
	if err != nil || d.Worker != rk(7, 1) || d.Cost != 7 || d.EffectivePrefillTokens != 48 {
		t.Errorf("decision %+v, %v; want rank 1, cost 7, 48 tokens", d, err)
	}
	// Pure load balancing: rank 0 holds 3 blocks of the 4: 3 + 1 = 4 for
	// both ranks; the tie is random.
	seen := map[indexer.WorkerRank]bool{}
	for seed := range uint64(32) {
		d, err := s.scheduler(seed, CostOptions{}).Select(SelectRequest{Key: s.key, Seq: []uint64{101, neg22, 303, 404}, ISL: 48, OverlapWeight: ptrTo(0.0)})
		if err != nil || d.Cost != 4 {
			t.Fatalf("seed %d: %+v, %v; want cost 4", seed, d, err)
		}
		seen[d.Worker] = true
	}
	if !seen[rk(7, 0)] || !seen[rk(7, 1)] {
		t.Errorf("tie over 32 seeds went to %v only", seen)
	}
}

func TestSelectTies(t *testing.T) {
	s := newCostRig(t, rigOptions{})
	// 6 and 7 tie at 20 with empty trees; 3 costs 24.
	req := s.fill(SelectRequest{Workers: []uint64{3, 6, 7}})
	seen := map[indexer.WorkerRank]int{}
	for seed := range uint64(64) {
		d, err := s.scheduler(seed, CostOptions{}).Select(req)
		must(t, err)
		seen[d.Worker]++
		if d.Cost != 20 {
			t.Errorf("seed %d: cost %v, want 20", seed, d.Cost)
		}
	}
	if seen[rk(6, 0)] == 0 || seen[rk(7, 0)] == 0 || seen[rk(3, 0)] != 0 || len(seen) != 2 {
		t.Errorf("winners over 64 seeds: %v; want 6 and 7 both, never 3", seen)
	}
	// One scheduler: the tie goes both ways as its random stream advances.
	clear(seen)
	sch := s.scheduler(1, CostOptions{})
	for range 64 {
		d, err := sch.Select(req)
		must(t, err)
		seen[d.Worker]++
	}
	if seen[rk(6, 0)] == 0 || seen[rk(7, 0)] == 0 || len(seen) != 2 {
		t.Errorf("winners over 64 selections: %v; want 6 and 7 both", seen)
	}
	// The same seed makes the same choices.
	a, b := s.scheduler(99, CostOptions{}), s.scheduler(99, CostOptions{})
	for i := range 32 {
		da, _ := a.Select(req)
		db, _ := b.Select(req)
		if da.Worker != db.Worker {
			t.Fatalf("selection %d: seed 99 chose %s and %s", i, da.Worker, db.Worker)
		}
	}
	// A tie between trees of different sizes is never random: w = 0
	// makes 1 (7 blocks cached) and 2 (8) tie at 10.
	req = s.fill(SelectRequest{Workers: []uint64{1, 2}, OverlapWeight: ptrTo(0.0)})
	for seed := range uint64(64) {
		if d, err := s.scheduler(seed, CostOptions{}).Select(req); err != nil || d.Worker != rk(1, 0) {
			t.Fatalf("seed %d: %s, %v; want worker 1 (the smaller tree)", seed, d.Worker, err)
		}
	}
}

// sample selects n times with sch and returns the share of each rank.
func sample(t *testing.T, sch *Scheduler, req SelectRequest, n int) map[indexer.WorkerRank]float64 {
	t.Helper()
	out := map[indexer.WorkerRank]float64{}
	for range n {
		d, err := sch.Select(req)
		must(t, err)
		out[d.Worker] += 1 / float64(n)
	}
	return out
}

func checkShares(t *testing.T, what string, got, want map[indexer.WorkerRank]float64, tol float64) {
	t.Helper()
	for r, p := range want {
		if math.Abs(got[r]-p) > tol {
			t.Errorf("%s: %s chosen %.3f of the time, want %.3f ± %.2f (all: %v)", what, r, got[r], p, tol, got)
		}
	}
	for r := range got {
		if _, ok := want[r]; !ok {
			t.Errorf("%s: %s chosen, not a candidate", what, r)
		}
	}
}

func TestSelectTemperature(t *testing.T) {
	s := newCostRig(t, rigOptions{})
	// Costs 13, 14 and 24 (see TestSelectCost); max - min = 11.
	// p_i ∝ exp(-(cost_i / 11) / T).
	costs := map[indexer.WorkerRank]float64{rk(1, 0): 13, rk(2, 0): 14, rk(3, 0): 24}
	softmax := func(temp float64) map[indexer.WorkerRank]float64 {
		out, sum := map[indexer.WorkerRank]float64{}, 0.0
		for r, c := range costs {
			out[r] = math.Exp(-(c / 11) / temp)
			sum += out[r]
		}
		for r := range out {
			out[r] /= sum
		}
		return out
	}
	const n = 6000 // a share's standard deviation is at most 0.0065
	for _, temp := range []float64{0.5, 2} {
		req := s.fill(SelectRequest{Workers: []uint64{1, 2, 3}, Temperature: ptrTo(temp)})
		got := sample(t, s.scheduler(7, CostOptions{}), req, n)
		checkShares(t, fmt.Sprintf("T=%v", temp), got, softmax(temp), 0.03)
		// The default temperature samples the same way.
		req.Temperature = nil
		got = sample(t, s.scheduler(8, CostOptions{Temperature: temp}), req, n)
		checkShares(t, fmt.Sprintf("default T=%v", temp), got, softmax(temp), 0.03)
	}
	// Equal costs: uniform.
	req := s.fill(SelectRequest{Workers: []uint64{6, 7}, Temperature: ptrTo(1.0)})
	got := sample(t, s.scheduler(9, CostOptions{}), req, 2000)
	checkShares(t, "equal costs", got, map[indexer.WorkerRank]float64{rk(6, 0): 0.5, rk(7, 0): 0.5}, 0.05)
	// Given the seed, sampling is deterministic.
	req = s.fill(SelectRequest{Temperature: ptrTo(1.0)})
	a, b := s.scheduler(3, CostOptions{}), s.scheduler(3, CostOptions{})
	for i := range 100 {
		da, errA := a.Select(req)
		db, errB := b.Select(req)
		if errA != nil || errB != nil || da.Worker != db.Worker || da.Cost != db.Cost {
			t.Fatalf("selection %d with seed 3: %+v (%v) and %+v (%v)", i, da, errA, db, errB)
		}
		if da.Worker.Worker >= 8 {
			t.Fatalf("selection %d: %s is not schedulable", i, da.Worker)
		}
	}
}

func TestSelectNoSchedulableWorker(t *testing.T) {
	s := newSelRig(t, testBS, rigOptions{})
	must(t, s.cat.RegisterRank(catalog.RankRegistration{WorkerKey: catalog.WorkerKey{Key: s.key, ID: 8}, BlockSize: testBS,
		Publisher: catalog.Publisher{Endpoint: closedPort(t)}, Source: catalog.SourceAPI}))
	s.store(rk(8, 0), indexer.TierDevice, costPrompt, 0, 10)
	sch := s.scheduler(1, CostOptions{})
	if _, err := sch.Select(s.fill(SelectRequest{})); !errors.Is(err, ErrUnavailable) {
		t.Errorf("only a pending worker: %v, want ErrUnavailable", err)
	}
	if _, err := sch.Select(s.fill(SelectRequest{Reserve: true, ReservationID: "r"})); !errors.Is(err, ErrUnavailable) {
		t.Errorf("only a pending worker, reserving: %v, want ErrUnavailable", err)
	}
	s.ranks(1, 1)
	if d, err := sch.Select(s.fill(SelectRequest{})); err != nil || d.Worker != rk(1, 0) {
		t.Errorf("with worker 1: %+v, %v", d, err)
	}
	if _, err := s.cat.Unregister("m", nil, 1, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := sch.Select(s.fill(SelectRequest{})); !errors.Is(err, ErrUnavailable) {
		t.Errorf("worker 1 unregistered: %v, want ErrUnavailable", err)
	}
	checkIdle(t, s.loads)
}

func TestSelectReserve(t *testing.T) {
	clk := newFakeClock()
	s := newCostRig(t, rigOptions{loads: LoadOptions{Now: clk.Now}})
	loads := s.loads
	rec := observe(loads)
	sch := s.scheduler(1, CostOptions{})
	seq := indexer.SequenceHashes(nil, costPrompt)
	sel := func(req SelectRequest) (Decision, error) { return sch.Select(s.fill(req)) }
	unchanged := func(what string, before map[indexer.WorkerRank]load) {
		t.Helper()
		if after := loadsOf(loads, s.key); !mapsEqual(before, after) {
			t.Errorf("%s changed the loads:\nbefore %v\nafter  %v", what, before, after)
		}
		if evs := rec.take(); len(evs) != 0 {
			t.Errorf("%s was observed: %+v", what, evs)
		}
	}

	base := loadsOf(loads, s.key)
	d, err := sel(SelectRequest{Reserve: true, ReservationID: "r1"})
	if err != nil || d.Worker != rk(1, 0) || d.Cost != 13 || d.EffectivePrefillTokens != 12 {
		t.Fatalf("reserve r1: %+v, %v; want worker 1, cost 13, 12 tokens", d, err)
	}
	want := base
	want[rk(1, 0)] = load{12, 10, 1} // the booked effective prefill and the prompt's 10 blocks
	if got := loadsOf(loads, s.key); !mapsEqual(got, want) {
		t.Errorf("after reserving r1: %v, want %v", got, want)
	}
	evs := rec.take()
	if len(evs) != 1 || evs[0].Kind != LifecycleAdd || evs[0].Key != s.key || evs[0].Booking.ID != "r1" ||
		evs[0].Booking.Worker != rk(1, 0) || evs[0].Booking.PrefillTokens != 12 || !slices.Equal(evs[0].Booking.Hashes, seq) {
		t.Errorf("observed %+v, want one add of r1 on worker 1 with 12 tokens and the prompt's hashes", evs)
	}

	// Refusals book nothing and are not observed.
	if _, err := sel(SelectRequest{Reserve: true, ReservationID: "r1"}); !errors.Is(err, ErrConflict) {
		t.Errorf("reserve r1 again: %v, want ErrConflict", err)
	}
	unchanged("a duplicate reservation", want)
	if _, err := sel(SelectRequest{Reserve: true, ReservationID: "busy", Workers: []uint64{2}}); !errors.Is(err, ErrConflict) {
		t.Errorf("reserve an id booked with Add: %v, want ErrConflict", err)
	}
	unchanged("a reservation under an active id", want)
	if _, err := sel(SelectRequest{Reserve: true}); !errors.Is(err, ErrInvalid) {
		t.Errorf("reserve without an id: %v, want ErrInvalid", err)
	}
	unchanged("a reservation without id", want)
	if _, err := sel(SelectRequest{Reserve: true, ReservationID: "r9", Key: indexer.Key{Model: "nope", Tenant: "default"}}); !errors.Is(err, ErrNotFound) {
		t.Errorf("reserve for an unknown model: %v, want ErrNotFound", err)
	}
	unchanged("a reservation for an unknown model", want)

	// Worker 1 now costs (12+12)/4 + 10 + (10-10) = 16: worker 2 (14) wins.
	if d, err := sel(SelectRequest{}); err != nil || d.Worker != rk(2, 0) || d.Cost != 14 {
		t.Errorf("select after r1: %+v, %v; want worker 2 at 14", d, err)
	}
	if d, err := sel(SelectRequest{Workers: []uint64{1}}); err != nil || d.Cost != 16 || d.EffectivePrefillTokens != 12 {
		t.Errorf("worker 1 after r1: %+v, %v; want cost 16", d, err)
	}
	// Prefill done: 12/4 + 10 = 13 again.
	must(t, loads.PrefillComplete(s.key, "r1"))
	if d, err := sel(SelectRequest{Workers: []uint64{1, 2}}); err != nil || d.Worker != rk(1, 0) || d.Cost != 13 {
		t.Errorf("after r1's prefill: %+v, %v; want worker 1 at 13", d, err)
	}
	rec.take()

	// A reservation sweeps expired requests first: r1, busy and same are
	// 301 s old.
	clk.Advance(301 * time.Second)
	if d, err := sel(SelectRequest{Reserve: true, ReservationID: "r2", Workers: []uint64{2}}); err != nil || d.Cost != 14 {
		t.Fatalf("reserve r2: %+v, %v", d, err)
	}
	for r, l := range loadsOf(loads, s.key) {
		if w := (load{16, 10, 1}); r == rk(2, 0) && l != w || r != rk(2, 0) && l != (load{}) {
			t.Errorf("after the sweep: %s %+v", r, l)
		}
	}
	if freed, err := loads.Free(s.key, "r2"); !freed || err != nil {
		t.Errorf("free r2: %v %v", freed, err)
	}
	checkIdle(t, loads)
}

// TestConcurrentSelect books, completes and frees thousands of requests
// from many goroutines while another reads the loads; in the end nothing
// may be left.
func TestConcurrentSelect(t *testing.T) {
	const goroutines, perG, window = 16, 500, 4
	s := newSelRig(t, testBS, rigOptions{})
	for id := uint64(1); id <= 4; id++ {
		s.ranks(id, 2)
	}
	prompts := [][]uint64{promptOf(1, 16), promptOf(2, 16), promptOf(3, 16)}
	for w := range uint64(4) {
		for r := range uint32(2) {
			n := int(w*2+uint64(r)) * 2
			if n > 0 {
				s.store(rk(w+1, r), indexer.TierDevice, prompts[(int(w)+int(r))%3], 0, n)
			}
		}
	}
	loads := s.loads
	var adds, completes, frees atomic.Int64
	loads.Observe(func(ev Lifecycle) {
		switch ev.Kind {
		case LifecycleAdd:
			adds.Add(1)
		case LifecyclePrefillComplete:
			completes.Add(1)
		case LifecycleFree:
			frees.Add(1)
		}
	})
	sch := s.scheduler(1, CostOptions{})
	mine := []uint64{1, 2, 3, 4}

	done := make(chan struct{})
	var reader sync.WaitGroup
	reader.Go(func() { // reads alongside
		for i := 0; ; i++ {
			select {
			case <-done:
				return
			default:
			}
			loads.Snapshot("", "")
			if _, err := loads.potentials(s.key, indexer.SequenceHashes(nil, prompts[i%3]), 16); err != nil {
				t.Errorf("potentials: %v", err)
				return
			}
			loads.Expire()
			if _, err := sch.Select(SelectRequest{Key: s.key, Local: prompts[i%3], Temperature: ptrTo(1.0)}); err != nil {
				t.Errorf("select: %v", err)
				return
			}
		}
	})
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			var open []string
			finish := func(id string) bool {
				if err := loads.PrefillComplete(s.key, id); err != nil {
					t.Errorf("prefill complete %s: %v", id, err)
					return false
				}
				if freed, err := loads.Free(s.key, id); !freed || err != nil {
					t.Errorf("free %s: %v %v", id, freed, err)
					return false
				}
				return true
			}
			for i := range perG {
				p := prompts[(g+i)%3]
				local := append(slices.Clone(p[:4+i%13]), uint64(g)<<32|uint64(i)) // a shared prefix and an own block
				id := fmt.Sprintf("g%d-%d", g, i)
				req := SelectRequest{Key: s.key, Local: local, Workers: mine, Reserve: true, ReservationID: id, ChargeReuse: i%2 == 1}
				if i%3 == 0 {
					req.Temperature = ptrTo(0.5)
				}
				if _, err := sch.Select(req); err != nil {
					t.Errorf("select %s: %v", id, err)
					return
				}
				if i%2 == 0 {
					if err := errors.Join(loads.PrefillComplete(s.key, id), loads.OutputBlock(s.key, id, 0.25)); err != nil {
						t.Errorf("%s: %v", id, err)
						return
					}
				}
				if open = append(open, id); len(open) > window {
					if !finish(open[0]) {
						return
					}
					open = open[1:]
				}
			}
			for _, id := range open {
				if !finish(id) {
					return
				}
			}
		})
	}
	wg.Wait()
	close(done)
	reader.Wait()

	checkIdle(t, loads)
	if got := len(loads.Snapshot("m", "")); got != 8 {
		t.Errorf("%d ranks left, want 8", got)
	}
	const n = goroutines * perG
	if adds.Load() != n || frees.Load() != n || completes.Load() < n {
		t.Errorf("observed %d adds, %d prefill completions, %d frees; want %d, at least %d, %d", adds.Load(), completes.Load(), frees.Load(), n, n, n)
	}
	for g := range goroutines {
		if freed, err := loads.Free(s.key, fmt.Sprintf("g%d-%d", g, perG-1)); freed || err != nil {
			t.Errorf("a request of goroutine %d is still active (%v)", g, err)
		}
	}
}

// TestSelectWhileRegistering selects while a worker of the same (model,
// tenant) registers and unregisters.
func TestSelectWhileRegistering(t *testing.T) {
	s := newSelRig(t, testBS, rigOptions{})
	s.ranks(1, 2)
	sch := s.scheduler(1, CostOptions{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := range 200 {
			if err := s.cat.RegisterRange(catalog.RangeRegistration{WorkerKey: catalog.WorkerKey{Key: s.key, ID: 9}, BlockSize: testBS, DPSize: uint32(1 + i%3)}); err != nil {
				t.Errorf("register 9: %v", err)
				return
			}
			if _, err := s.cat.Unregister("m", nil, 9, nil); err != nil {
				t.Errorf("unregister 9: %v", err)
				return
			}
		}
	})
	for i := range 2000 {
		id := fmt.Sprint(i)
		d, err := sch.Select(SelectRequest{Key: s.key, Local: costPrompt, Reserve: true, ReservationID: id})
		if err != nil {
			t.Fatalf("select %d: %v", i, err)
		}
		if freed, err := s.loads.Free(s.key, id); !freed && d.Worker.Worker == 1 || err != nil {
			t.Fatalf("free %d on %s: %v %v", i, d.Worker, freed, err)
		}
	}
	wg.Wait()
	checkIdle(t, s.loads)
}

// TestSelectMatchesBruteForce compares decisions with costs worked out
// naively from the spec's formula, with the reuse charge or without, over
// random loads: every rank's held
// blocks are the set union of its active requests' hashes, counted over
// the prompt's positions. Loads mix idle and busy ranks, requests holding
// a prefix of a prompt or other hashes, several per rank, sharing hashes
// or not, and hashes repeated in prompts and requests, so that decide's
// cost bounds, its per-rank counts (heldOf, each way) and its fallback to
// countHeld must all agree with the naive count.
func TestSelectMatchesBruteForce(t *testing.T) {
	const bs = 4
	tests := []struct {
		name        string
		workers, dp int
		busyEvery   int // every n-th rank runs requests
		perRank     int // requests per busy rank, at most
		promptLen   int
		other       int  // hashes of a request for no prompt, at most
		pad         int  // if not 0, every busy rank also runs a request of pad other hashes, one twice
		repeats     bool // prompts and requests repeat hashes
		same        bool // every request is the same prompt's, whole: ranks tie
		// chained books the prompt prefixes (with or without an own tail)
		// as Booking.Chained, as the gateway's own bookings are
		chained bool
	}{
		{"few busy ranks", 16, 4, 5, 1, 40, 40, 0, false, false, false},
		{"every rank busy", 12, 2, 1, 3, 30, 30, 0, false, false, false},
		{"requests sharing prefixes", 8, 4, 2, 6, 24, 24, 0, false, false, false},
		{"repeated hashes", 8, 2, 2, 3, 20, 20, 0, true, false, false},
		{"short prompts, long requests", 6, 2, 1, 3, 3, 80, 40, true, false, false},
		{"busy ranks alike", 10, 4, 1, 1, 30, 1, 0, false, true, false},
		{"chained bookings", 12, 4, 1, 6, 30, 30, 0, false, false, true},
		{"chained bookings, long requests", 6, 2, 1, 4, 3, 80, 0, false, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for seed := range uint64(6) {
				bruteForceCase(t, seed, bs, tt.workers, tt.dp, tt.busyEvery, tt.perRank, tt.promptLen, tt.other, tt.pad, tt.repeats, tt.same, tt.chained)
			}
		})
	}
}

func bruteForceCase(t *testing.T, seed uint64, bs, workers, dp, busyEvery, perRank, promptLen, other, pad int, repeats, same, chained bool) {
	rnd := rand.New(rand.NewPCG(seed, 77))
	s := newSelRig(t, bs, rigOptions{})
	prompts := [][]uint64{promptOf(1, promptLen), promptOf(2, promptLen), promptOf(3, promptLen)}
	if repeats {
		for _, p := range prompts {
			p[len(p)-1] = p[0] // a local hash twice: distinct sequence hashes, still
		}
	}
	type rankState struct {
		held    map[uint64]bool
		prefill int64
		output  float64
	}
	state := map[indexer.WorkerRank]*rankState{}
	loads := s.loads
	id := 0
	for w := range workers {
		s.ranks(uint64(w+1), uint32(dp))
		for r := range dp {
			wr := rk(uint64(w+1), uint32(r))
			st := &rankState{held: map[uint64]bool{}}
			state[wr] = st
			p := prompts[rnd.IntN(len(prompts))]
			if n := rnd.IntN(promptLen + 1); n > 0 {
				s.store(wr, indexer.TierDevice, p, 0, n)
				if m := min(promptLen, n+rnd.IntN(4)); rnd.IntN(3) == 0 && m > n {
					s.store(wr, indexer.TierHost, p, n, m)
				}
			}
			if (w*dp+r)%busyEvery != 0 {
				continue
			}
			reqs := 1 + rnd.IntN(perRank)
			for k := range reqs + min(pad, 1) {
				var hashes []uint64
				own := false // the hashes are chained: a prompt's prefix and an own tail
				switch kind := rnd.IntN(4); {
				case k == reqs: // the padding
					for range pad {
						hashes = append(hashes, rnd.Uint64N(1<<62))
					}
					hashes = append(hashes, hashes[0])
				case kind == 0: // other hashes
					for range 1 + rnd.IntN(other) {
						hashes = append(hashes, rnd.Uint64N(1<<62))
					}
				case kind == 1: // some hashes of a prompt, in any order
					seq := indexer.SequenceHashes(nil, prompts[rnd.IntN(len(prompts))])
					rnd.Shuffle(len(seq), func(i, j int) { seq[i], seq[j] = seq[j], seq[i] })
					hashes = append(seq[:rnd.IntN(len(seq))], rnd.Uint64N(1<<62))
				default: // a prefix of a prompt, perhaps with an own tail
					p := prompts[rnd.IntN(len(prompts))]
					hashes = indexer.SequenceHashes(nil, p[:1+rnd.IntN(promptLen)])
					for range rnd.IntN(3) {
						hashes = append(hashes, rnd.Uint64N(1<<62))
					}
					own = chained
				}
				if repeats && rnd.IntN(2) == 0 {
					hashes = append(hashes, hashes[rnd.IntN(len(hashes))])
				}
				b := Booking{Worker: wr, Hashes: hashes, PrefillTokens: int64(rnd.IntN(4) * bs), Chained: own}
				if same {
					b.Hashes, b.PrefillTokens = indexer.SequenceHashes(nil, prompts[0]), 0
				}
				id++
				b.ID = fmt.Sprint("r", id)
				must(t, loads.Add(s.key, b))
				for _, h := range b.Hashes {
					st.held[h] = true
				}
				st.prefill += b.PrefillTokens
				if !same && rnd.IntN(3) == 0 {
					must(t, loads.OutputBlock(s.key, b.ID, 0.5))
					st.output += 0.5
				}
			}
		}
	}
	ix := s.set.Lookup(s.key)
	// The queries: each prompt, whole or with an own tail, by local hashes
	// or by sequence hashes with one repeated.
	type query struct {
		req SelectRequest
		seq []uint64
	}
	var queries []query
	for i, p := range prompts {
		local := slices.Clone(p)
		if i == 1 {
			local[len(local)-1] = 99
		}
		seq := indexer.SequenceHashes(nil, local)
		queries = append(queries, query{SelectRequest{Key: s.key, Local: local}, seq})
		if repeats {
			seq := slices.Clone(seq)
			seq[len(seq)-1] = seq[0]
			queries = append(queries, query{SelectRequest{Key: s.key, Seq: seq}, seq})
		}
	}
	for qi, q := range queries {
		overlaps := overlapsByRank(nil, ix.Match(q.seq, nil))
		for _, c := range []struct{ weight, reuse float64 }{{1, 0}, {0, 0}, {2.5, 0}, {1, 16}, {2.5, 3}} {
			weight := c.weight
			costs := map[indexer.WorkerRank]float64{}
			prefills := map[indexer.WorkerRank]int64{}
			least := math.Inf(1)
			leastNew := int64(len(q.seq) * bs)
			for wr := range state {
				ov := overlaps[wr]
				eff := float64(ov.Device) + 0.8*float64(ov.Host-ov.Device) + 0.5*float64(ov.Disk-ov.Host)
				leastNew = min(leastNew, max(0, int64(len(q.seq)*bs)-int64(math.Round(eff*float64(bs)))))
			}
			for wr, st := range state {
				ov := overlaps[wr]
				eff := float64(ov.Device) + 0.8*float64(ov.Host-ov.Device) + 0.5*float64(ov.Disk-ov.Host)
				prefills[wr] = max(0, int64(len(q.seq)*bs)-int64(math.Round(eff*float64(bs))))
				held := 0
				for _, h := range q.seq {
					if st.held[h] {
						held++
					}
				}
				decode := float64(len(st.held)) + st.output + float64(len(q.seq)-held)
				costs[wr] = weight*float64(st.prefill+prefills[wr])/float64(bs) + decode
				if c.reuse > 0 {
					costs[wr] += c.reuse * weight * float64(prefills[wr]-leastNew) / float64(bs)
				}
				least = min(least, costs[wr])
			}
			smallest := math.MaxInt
			for wr, c := range costs {
				if c == least {
					smallest = min(smallest, ix.RankBlocks(wr))
				}
			}
			what := fmt.Sprintf("seed %d query %d weight %v reuse %v", seed, qi, weight, c.reuse)
			req := q.req
			req.OverlapWeight, req.ChargeReuse = ptrTo(weight), c.reuse > 0
			opts := CostOptions{ReuseWeight: c.reuse}
			d, err := s.scheduler(seed, opts).Select(req)
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			bestDevice := 0
			for _, ov := range overlaps {
				bestDevice = max(bestDevice, int(ov.Device))
			}
			if d.BestDevice != bestDevice {
				t.Fatalf("%s: best device overlap %d, want %d", what, d.BestDevice, bestDevice)
			}
			if d.Cost != least || costs[d.Worker] != least || ix.RankBlocks(d.Worker) != smallest || d.EffectivePrefillTokens != prefills[d.Worker] {
				t.Fatalf("%s: chose %s at cost %v (naive %v, tree %d, prefill %d), want the least cost %v, tree %d, prefill %d",
					what, d.Worker, d.Cost, costs[d.Worker], ix.RankBlocks(d.Worker), d.EffectivePrefillTokens, least, smallest, prefills[d.Worker])
			}
			req.Temperature = ptrTo(1.0)
			if d, err := s.scheduler(seed, opts).Select(req); err != nil || d.Cost != costs[d.Worker] {
				t.Fatalf("%s, sampled: chose %s at cost %v (%v), naive cost %v", what, d.Worker, d.Cost, err, costs[d.Worker])
			}
		}
	}
}
