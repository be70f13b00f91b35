package scheduler

import (
	"fmt"
	"testing"

	"github.com/kvgate/kvgate/indexer"
)

// These tests drive the reuse charge (CostOptions.ReuseWeight, applied
// with SelectRequest.ChargeReuse): on top of the spec's cost (see
// select_test.go), every rank pays
//
//	charge = R * w * (new_prefill - least_new_prefill) / block_size
//
// with least_new_prefill the least new prefill of any candidate rank.
// Expected costs are worked out by hand, never read back from the code.

// newReuseRig builds the state the reuse cases are worked out on (block
// size 4, costPrompt: 10 blocks, isl 40), with a request of busy prefill
// tokens and no blocks booked on worker 1:
//
//	worker 1:  device 6 blocks   new prefill 40 - 24 = 16   (busy)
//	worker 2:  nothing           new prefill 40
//	worker 3:  device 6 blocks   new prefill 16
//	worker 4:  device 2 blocks   new prefill 32
//	worker 5:  host 5 blocks     new prefill 40 - round(0.8*5*4) = 24
//
// Every idle rank's decode term is the prompt's 10 blocks; worker 1's too
// (its request holds no block).
func newReuseRig(t *testing.T, busy int64) *selRig {
	s := newSelRig(t, testBS, rigOptions{})
	for id := uint64(1); id <= 5; id++ {
		s.ranks(id, 1)
	}
	p := costPrompt
	s.store(rk(1, 0), indexer.TierDevice, p, 0, 6)
	s.store(rk(3, 0), indexer.TierDevice, p, 0, 6)
	s.store(rk(4, 0), indexer.TierDevice, p, 0, 2)
	s.store(rk(5, 0), indexer.TierHost, p, 0, 5)
	if busy > 0 {
		must(t, s.loads.Add(s.key, Booking{ID: "busy", Worker: rk(1, 0), PrefillTokens: busy}))
	}
	return s
}

func TestSelectReuseCharge(t *testing.T) {
	charged := func(workers ...uint64) SelectRequest { return SelectRequest{Workers: workers, ChargeReuse: true} }
	tests := []struct {
		name   string
		busy   int64 // worker 1's active prefill tokens
		opts   CostOptions
		req    SelectRequest
		worker indexer.WorkerRank
		cost   float64
		charge float64
	}{
		// Workers 1 and 2. The spec's cost: 1: (busy + 16)/4 + 10;
		// 2: 40/4 + 10 = 20. Worker 1 keeps the prompt while busy < 24,
		// the 24 tokens it has cached; at 24 they tie and the smaller
		// tree (worker 2, empty) wins.
		{name: "spec cost: cached rank below the boundary", busy: 23, req: SelectRequest{Workers: []uint64{1, 2}}, worker: rk(1, 0), cost: 19.75},
		{name: "spec cost: at the boundary the request leaves", busy: 24, req: SelectRequest{Workers: []uint64{1, 2}}, worker: rk(2, 0), cost: 20},
		{name: "spec cost without ChargeReuse, whatever ReuseWeight", busy: 24, opts: CostOptions{ReuseWeight: 64}, req: SelectRequest{Workers: []uint64{1, 2}}, worker: rk(2, 0), cost: 20},
		{name: "spec cost with ReuseWeight off", busy: 24, opts: CostOptions{ReuseWeight: NoReuseWeight}, req: charged(1, 2), worker: rk(2, 0), cost: 20},
		// Charged, R = 16 by default: worker 2 gives up 24 tokens and
		// pays 16 * 24/4 = 96: 116. Worker 1 pays nothing and keeps the
		// prompt while (busy + 16)/4 + 10 < 116, busy < 408 = 17 * 24.
		{name: "charged: the cached rank keeps it", busy: 24, req: charged(1, 2), worker: rk(1, 0), cost: 20},
		{name: "charged: just below the boundary", busy: 407, req: charged(1, 2), worker: rk(1, 0), cost: 115.75},
		{name: "charged: at the boundary (tie: smaller tree)", busy: 408, req: charged(1, 2), worker: rk(2, 0), cost: 116, charge: 96},
		{name: "charged: above the boundary", busy: 500, req: charged(1, 2), worker: rk(2, 0), cost: 116, charge: 96},
		// R = 4: worker 2 costs 20 + 4*24/4 = 44; the boundary is
		// busy = 5 * 24 = 120.
		{name: "R 4: below the boundary", busy: 119, opts: CostOptions{ReuseWeight: 4}, req: charged(1, 2), worker: rk(1, 0), cost: 43.75},
		{name: "R 4: at the boundary", busy: 120, opts: CostOptions{ReuseWeight: 4}, req: charged(1, 2), worker: rk(2, 0), cost: 44, charge: 24},
		// w = 2 scales the queue and the charge alike: 1: 2*(busy+16)/4
		// + 10; 2: 2*40/4 + 10 + 16*2*24/4 = 222. Same boundary, 408.
		{name: "overlap weight 2: below the boundary", busy: 407, req: SelectRequest{Workers: []uint64{1, 2}, ChargeReuse: true, OverlapWeight: ptrTo(2.0)}, worker: rk(1, 0), cost: 221.5},
		{name: "overlap weight 2: at the boundary", busy: 408, req: SelectRequest{Workers: []uint64{1, 2}, ChargeReuse: true, OverlapWeight: ptrTo(2.0)}, worker: rk(2, 0), cost: 222, charge: 192},
		// w = 0 weighs no prefill, cached or not: every cost is the 10
		// decode blocks, the smaller tree wins.
		{name: "overlap weight 0: no charge", busy: 500, req: SelectRequest{Workers: []uint64{1, 2}, ChargeReuse: true, OverlapWeight: ptrTo(0.0)}, worker: rk(2, 0), cost: 10},
		// Workers 1 and 3 hold the same prefix: neither pays, load
		// decides (3: 16/4 + 10 = 14).
		{name: "same prefix on two ranks: load decides", busy: 24, req: charged(1, 3), worker: rk(3, 0), cost: 14},
		// The least new prefill is that of the candidates: without
		// worker 1 or 3, worker 4's 32 is the least. 4: 32/4 + 10 = 18,
		// no charge (it would be 16*16/4 = 64 against worker 1's 16);
		// 2: 20 + 16*8/4 = 52.
		{name: "least over the candidates only", req: charged(2, 4), worker: rk(4, 0), cost: 18},
		// Host blocks count discounted, as in the cost: worker 5's new
		// prefill is 24, its charge 16*(24-16)/4 = 32: 24/4 + 10 + 32 =
		// 48, against worker 1's (1000+16)/4 + 10 = 264.
		{name: "host-tier overlap is charged its discount", busy: 1000, req: charged(1, 5), worker: rk(5, 0), cost: 48, charge: 32},
		// Every worker: 3 has the longest prefix, idle: 14.
		{name: "every worker", busy: 24, req: charged(), worker: rk(3, 0), cost: 14},
		// A prompt cached nowhere: no charge anywhere, the least loaded
		// empty tree wins: 2 (worker 1 is busy, 3, 4 and 5 have blocks,
		// 40/4 + 10 = 20 all).
		{name: "prompt cached nowhere: load decides", busy: 24, req: SelectRequest{ChargeReuse: true, Local: promptOf(7, 10)}, worker: rk(2, 0), cost: 20},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newReuseRig(t, tt.busy)
			before := loadsOf(s.loads, s.key)
			for seed := range uint64(4) {
				d, err := s.scheduler(seed, tt.opts).Select(s.fill(tt.req))
				if err != nil {
					t.Fatal(err)
				}
				if d.Worker != tt.worker || d.Cost != tt.cost || d.ReuseCharge != tt.charge {
					t.Errorf("seed %d: %s at cost %v (charge %v), want %s at cost %v (charge %v)", seed, d.Worker, d.Cost, d.ReuseCharge, tt.worker, tt.cost, tt.charge)
				}
			}
			if after := loadsOf(s.loads, s.key); !mapsEqual(before, after) {
				t.Errorf("selecting changed the loads: %v, then %v", before, after)
			}
		})
	}
}

// TestSelectReuseHotPrefix books the same prompt again and again, cached
// on worker 1 only (6 blocks), as a hot prefix would be: the charge keeps
// it there until worker 1's queue outweighs (1 + R) times the prefix, then
// it spills. Each request on worker 1 books 16 new prefill tokens and
// holds the prompt's 10 blocks (shared by all of them), so with k requests
// booked worker 1 costs (16k + 16)/4 + 10 = 4k + 14. An idle worker 2
// costs 20, plus 96 with R = 16: the first 26 requests (k = 0..25) stay
// on worker 1, the 27th spills. With the spec's cost only the first 2
// stay. Every booking is freed at the end.
func TestSelectReuseHotPrefix(t *testing.T) {
	for _, tt := range []struct {
		name   string
		charge bool
		stay   int
	}{{"charged", true, 26}, {"spec cost", false, 2}} {
		t.Run(tt.name, func(t *testing.T) {
			s := newReuseRig(t, 0)
			sch := s.scheduler(1, CostOptions{})
			var ids []string
			for i := range tt.stay + 1 {
				id := fmt.Sprint("hot-", i)
				d, err := sch.Select(SelectRequest{Key: s.key, Local: costPrompt, Workers: []uint64{1, 2}, ChargeReuse: tt.charge, Reserve: true, ReservationID: id})
				if err != nil {
					t.Fatal(err)
				}
				ids = append(ids, id)
				want := rk(1, 0)
				if i == tt.stay {
					want = rk(2, 0)
				}
				if d.Worker != want {
					t.Fatalf("request %d on %s, want %s", i, d.Worker, want)
				}
			}
			for _, id := range ids {
				if freed, err := s.loads.Free(s.key, id); !freed || err != nil {
					t.Errorf("free %s: %v %v", id, freed, err)
				}
			}
			checkIdle(t, s.loads)
		})
	}
}
