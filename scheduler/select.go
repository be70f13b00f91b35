package scheduler

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/indexer"
	"github.com/kvgate/kvgate/scheduler/catalog"
)

// This file is the decision (docs/scheduling.md): for a prompt,
// each schedulable rank's cached overlap from the index and active load
// from Loads give a cost; the cheapest rank wins (or one is sampled with a
// temperature), and may be booked in the same step. The load a rank's
// engine reports on its /metrics page (EngineReports) may correct the cost
// (see CostOptions.MetricsWeight); it is off by default. The gateway's
// decisions also pay for the cached prefix they give up (see
// CostOptions.ReuseWeight and SelectRequest.ChargeReuse); the
// Dynamo-compatible routes do not, and answer with the spec's cost.

// CostOptions are the scheduler's defaults; a request may override the
// overlap weight and the temperature.
type CostOptions struct {
	// OverlapWeight weighs prefill against decode load. Default 1.0; set
	// NoOverlapWeight to use 0.
	OverlapWeight float64
	// Temperature 0 picks the cheapest rank; T > 0 samples with
	// p ∝ exp(-(cost/(max-min))/T).
	Temperature float64
	// HostWeight and DiskWeight discount overlap found only in host memory
	// or only on disk/external storage, as a fraction of a device block.
	// Defaults 0.8 and 0.5; NoDiscount gives 0.
	HostWeight, DiskWeight float64
	// MetricsWeight weighs the load a rank's engine reports (Engines)
	// beyond the load tracked locally; 0, the default, ignores it and
	// leaves every decision as without it. It must be finite and not
	// negative (other values count as 0). The reported load is expressed
	// in the cost's units, as if the router had booked the engine's
	// requests itself:
	//
	//	reported = (w + 1) * waiting * b + used_blocks
	//	tracked  = w * active_prefill_tokens / block_size + active_decode_blocks
	//	cost    += MetricsWeight * max(0, reported - tracked)
	//
	// with w the overlap weight of the decision: each waiting request is
	// a prompt of b blocks, none cached, so b blocks of prefill and b
	// decode blocks; used_blocks are the KV blocks in use
	// (kv_cache_usage_perc * num_gpu_blocks, or running * b when the
	// engine does not say its cache's size). Only the excess counts: the
	// router's own requests are in both terms, and with weight 1 a rank
	// costs as much as the larger of the two loads. A rank whose scrape
	// failed or is stale has no correction. The correction is not
	// negative and does not depend on the new prompt's blocks held by the
	// rank, so it keeps the bounds of decide. Decision.Cost includes it.
	MetricsWeight float64
	// MetricsRequestBlocks is b, in blocks; 0 (the default) takes the
	// size of the prompt being placed (isl / block size, at least 1).
	MetricsRequestBlocks float64
	// Engines are the reports MetricsWeight weighs; nil: none, no
	// correction.
	Engines EngineReports
	// ReuseWeight, R, charges the decisions made with
	// SelectRequest.ChargeReuse (the gateway's KV-aware routing) for the
	// cached prefix they give up:
	//
	//	cost += R * w * (new_prefill - least_new_prefill) / block_size
	//
	// with new_prefill the prompt's tokens the rank must compute (after
	// cache credit, as booked) and least_new_prefill the least of them
	// over the candidate ranks: the rank holding the longest cached
	// prefix pays nothing, a rank holding none pays R times that prefix.
	//
	// The spec's cost is the request's own wait: its rank's queued
	// prefill plus its own. It leaves the rank holding the prompt's prefix
	// as soon as that rank's queue is longer than the prefix, by the
	// cost's other terms. But the prefill a choice adds is not this
	// request's wait alone: the requests queued behind it on that rank,
	// and those running there (their decode steps share the engine with
	// it), wait for it too, and in a prefill-bound fleet the lost reuse
	// is lost throughput. R counts those requests: a decision leaves the
	// rank with the longest prefix only when that rank's extra load
	// outweighs (1 + R) times the prefix it would recompute elsewhere.
	// Prompts with no cached prefix anywhere (no charge anywhere), and
	// prefixes held alike by several ranks, are placed by load as before.
	// Default DefaultReuseWeight; NoReuseWeight gives 0, the spec's cost.
	// It must be finite (other values count as 0).
	ReuseWeight float64
}

// DefaultReuseWeight is CostOptions.ReuseWeight's default, chosen by
// measurement (BENCHMARKS.md, "Routing quality"): from 8 on, the gateway
// keeps more than 90 % of the reusable prefix on the Mooncake traces,
// while a rank holding a hot prefix still sheds load once its queue
// exceeds 17 times that prefix.
const DefaultReuseWeight = 16.0

// Zero-value markers for CostOptions fields whose default is not zero.
const (
	NoOverlapWeight = -1.0 // OverlapWeight 0
	NoDiscount      = -1.0 // HostWeight / DiskWeight 0
	NoReuseWeight   = -1.0 // ReuseWeight 0: the spec's cost everywhere
)

// uncached returns the tokens of isl a rank with overlap ov (in blocks of
// bs tokens) must compute: the cache credit, with host-only and disk-only
// blocks discounted. It is the prefill booked for a request.
func (o CostOptions) uncached(ov *indexer.Overlap, isl int64, bs int) int64 {
	if ov.Disk == ov.Device { // no host or disk extension: nothing to discount
		return max(0, isl-int64(ov.Device)*int64(bs))
	}
	return max(0, isl-int64(math.Round(o.effective(ov)*float64(bs))))
}

// effective returns the overlap ov counts for, in blocks: its device
// blocks, and its host-only and disk-only ones discounted.
func (o CostOptions) effective(ov *indexer.Overlap) float64 {
	return float64(ov.Device) + o.HostWeight*float64(ov.Host-ov.Device) + o.DiskWeight*float64(ov.Disk-ov.Host)
}

// overlapsByRank indexes Match's answer by worker rank, into m (cleared
// first; a new map when nil).
func overlapsByRank(m map[indexer.WorkerRank]indexer.Overlap, os []indexer.Overlap) map[indexer.WorkerRank]indexer.Overlap {
	if m == nil {
		m = make(map[indexer.WorkerRank]indexer.Overlap, len(os))
	}
	clear(m)
	for _, o := range os {
		m[o.Worker] = o
	}
	return m
}

// scratch is one decision's working memory, reused between decisions so
// that a decision over thousands of ranks allocates next to nothing.
type scratch struct {
	match    []uint64
	overlaps []indexer.Overlap
	cands    []candidate
	bounded  []int // indexes in cands of candidates whose cost is a bound
	weights  []float64
	ties     []int
	trees    []int // per tie, its tree size
	// prompt counts the prompt's hashes (refs: occurrences), when a
	// decision bounds costs and needs them (promptReady; see counted).
	prompt      hashRefs
	promptReady bool
}

// counted returns the prompt's hash counts (sc.prompt), counting seq first
// if this decision has not.
func (sc *scratch) counted(seq []uint64) *hashRefs {
	if !sc.promptReady {
		sc.countPrompt(seq)
	}
	return &sc.prompt
}

// countPrompt fills sc.prompt with seq and reports whether a hash occurs
// twice in it.
func (sc *scratch) countPrompt(seq []uint64) (repeats bool) {
	sc.prompt.clear()
	sc.promptReady = true
	for _, h := range seq {
		if _, first := sc.prompt.inc(h); !first {
			repeats = true
		}
	}
	return repeats
}

func (o CostOptions) withDefaults() CostOptions {
	def := func(v *float64, d float64) {
		switch {
		case *v == 0:
			*v = d
		case *v < 0:
			*v = 0
		}
	}
	def(&o.OverlapWeight, 1)
	def(&o.HostWeight, 0.8)
	def(&o.DiskWeight, 0.5)
	def(&o.ReuseWeight, DefaultReuseWeight)
	if math.IsNaN(o.ReuseWeight) || math.IsInf(o.ReuseWeight, 0) {
		o.ReuseWeight = 0
	}
	for _, v := range []*float64{&o.MetricsWeight, &o.MetricsRequestBlocks} {
		if !(*v > 0 && *v <= math.MaxFloat64) { // negative, NaN, infinite
			*v = 0
		}
	}
	return o
}

// SelectRequest asks for a rank for one prompt.
type SelectRequest struct {
	Key indexer.Key
	// Local are the prompt's local block hashes (one per full block): the
	// index is matched on the sequence hashes derived from them. Seq, when
	// not nil, are the client's sequence hashes, used to account the
	// request's blocks (derived from Local when nil; and matched when
	// Local is nil).
	Local []uint64
	Seq   []uint64
	// ISL is the prompt length in tokens; 0 means len(Local) * block size.
	ISL int64
	// OverlapWeight and Temperature override the defaults when not nil.
	OverlapWeight, Temperature *float64
	// Workers, when not empty, restricts the choice to these worker ids.
	Workers []uint64
	// Reserve books the request on the chosen rank, atomically with the
	// choice, under ReservationID.
	Reserve       bool
	ReservationID string
	// ChargeReuse adds the charge for the cached prefix given up
	// (CostOptions.ReuseWeight) to every rank's cost. The gateway's
	// KV-aware routing sets it; the Dynamo-compatible routes (/select,
	// /select_and_reserve) do not: their answers are the spec's.
	ChargeReuse bool
}

// Decision is the chosen rank and why.
type Decision struct {
	Worker    indexer.WorkerRank
	BlockSize int
	// Overlap is the chosen rank's cached prefix, in blocks, per tier
	// (cumulative), and per rank of the chosen worker on device (DP).
	Overlap indexer.Overlap
	DP      map[uint32]int
	// BestDevice is the longest device-tier prefix any rank holds: what
	// the load term of the cost gave up when it exceeds Overlap.Device.
	BestDevice int
	// EffectivePrefillTokens is the prefill the request costs the rank
	// after cache credit (host and disk overlap discounted): the value
	// booked.
	EffectivePrefillTokens int64
	// Cost is the chosen rank's cost, ReuseCharge (with
	// SelectRequest.ChargeReuse: the charge for the reuse given up) and
	// the metrics correction included.
	Cost        float64
	ReuseCharge float64
	Endpoint    string
}

// Scheduler decides where requests go. It is safe for concurrent use.
type Scheduler struct {
	cat   Workers
	set   *indexer.Set
	loads *Loads
	opts  CostOptions

	randMu sync.Mutex
	rand   *rand.Rand

	scratch sync.Pool // of *scratch

	m schedMetrics
}

type schedMetrics struct {
	selections *prometheus.CounterVec
	latency    prometheus.Histogram
}

// NewScheduler returns a scheduler over the catalog's workers, the index set
// and the loads (which must follow the catalog: see Loads.Follow). seed
// seeds tie-breaking and sampling (tests fix it). reg, if not nil, receives
// kvgate_scheduler_* metrics.
func NewScheduler(cat Workers, set *indexer.Set, loads *Loads, opts CostOptions, seed uint64, reg prometheus.Registerer) *Scheduler {
	s := &Scheduler{cat: cat, set: set, loads: loads, opts: opts.withDefaults(), rand: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		m: schedMetrics{
			selections: prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: "kvgate_scheduler_selections_total", Help: "Selections, by model, tenant and chosen worker.",
			}, []string{"model", "tenant", "worker"}),
			latency: prometheus.NewHistogram(prometheus.HistogramOpts{
				Name: "kvgate_scheduler_decision_duration_seconds", Help: "Time to decide (index lookup, loads, cost), booking included.",
				Buckets: prometheus.ExponentialBuckets(1e-6, 2.5, 16),
			}),
		}}
	if reg != nil {
		reg.MustRegister(s.m.selections, s.m.latency, loadCollector{loads},
			prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name: "kvgate_scheduler_expired_requests_total",
				Help: "Active requests freed because they outlived the request TTL: their free never came.",
			}, func() float64 { return float64(loads.expiredTotal()) }))
	}
	return s
}

// Loads returns the active-load accounting the scheduler books on.
func (s *Scheduler) Loads() *Loads { return s.loads }

// CreditBlocks returns the blocks of a rank's overlap ov that a decision
// credits as cached: its device blocks, and its host-only and disk-only
// ones discounted by the cost options.
func (s *Scheduler) CreditBlocks(ov indexer.Overlap) float64 { return s.opts.effective(&ov) }

// candidate is one rank's inputs and cost, kept small: a decision costs
// thousands.
type candidate struct {
	rl      *rankLoad
	prefill int64 // effective new prefill tokens
	cost    float64
	// held counts the prompt's blocks the rank's active requests hold;
	// while bound, it is only an upper bound, and cost a lower bound.
	held  int32
	bound bool
	// extra is what the cost adds to the spec's: the reuse charge (see
	// costing.chargeOf) and the metrics correction. Neither depends on
	// held blocks.
	extra float64
}

// costOf returns the cost (docs/scheduling.md) of sending a prompt
// of n blocks to rl, with c's new prefill, held blocks and extra (reuse
// charge and metrics correction), at overlap weight w and block size bs.
func costOf(rl *rankLoad, c *candidate, n int, w float64, bs int) float64 {
	prefill := float64(addTokens(rl.prefill, c.prefill))
	decode := float64(rl.blocks()) + rl.output + float64(n-int(c.held))
	return w*prefill/float64(bs) + decode + c.extra
}

// choice is the outcome of decide.
type choice struct {
	wr           indexer.WorkerRank
	ov           indexer.Overlap
	prefill      int64
	cost, charge float64
}

// Select chooses a rank for req, and books it when req.Reserve.
func (s *Scheduler) Select(req SelectRequest) (Decision, error) {
	start := time.Now()
	defer func() { s.m.latency.Observe(time.Since(start).Seconds()) }()
	ix := s.set.Lookup(req.Key)
	t := s.loads.tracker(req.Key)
	if ix == nil || t == nil {
		return Decision{}, fmt.Errorf("%w: no worker registered for model_name %q tenant_id %q", ErrNotFound, req.Key.Model, req.Key.Tenant)
	}
	bs := ix.BlockSize()
	// The index is matched on hashes derived from the local ones
	// (docs/hashing.md); the client's own sequence hashes, when
	// given, are what active requests are accounted by.
	sc, _ := s.scratch.Get().(*scratch)
	if sc == nil {
		sc = new(scratch)
	}
	defer s.release(sc)
	match := req.Seq
	if req.Local != nil || match == nil {
		sc.match = indexer.SequenceHashes(sc.match[:0], req.Local)
		match = sc.match
	}
	seq := req.Seq
	if seq == nil {
		seq = match
	}
	isl := req.ISL
	if isl == 0 {
		isl = int64(len(seq) * bs)
	}
	w, temp := s.opts.OverlapWeight, s.opts.Temperature
	if req.OverlapWeight != nil {
		w = *req.OverlapWeight
	}
	if req.Temperature != nil {
		temp = *req.Temperature
	}
	if w < 0 || temp < 0 || math.IsNaN(w) || math.IsNaN(temp) || math.IsInf(w, 0) || math.IsInf(temp, 0) {
		return Decision{}, fmt.Errorf("%w: overlap weight and temperature must be finite and >= 0", ErrInvalid)
	}
	sc.overlaps = ix.Match(match, sc.overlaps[:0])
	overlaps := sc.overlaps
	view := s.cat.View()
	var b *Booking
	if req.Reserve {
		// The booking keeps its hashes: never the scratch's.
		b = &Booking{ID: req.ReservationID, Hashes: seq, Chained: req.Seq == nil}
		if req.Seq == nil {
			b.Hashes = slices.Clone(seq)
		}
	}
	var c choice
	var err error
	if s.opts.MetricsWeight > 0 && s.opts.Engines != nil {
		c, err = s.decideReporting(sc, t, ix, req, overlaps, seq, isl, w, temp, view, b)
	} else {
		c, err = s.decide(sc, t, ix, req, overlaps, seq, isl, w, temp, view, b, nil)
	}
	if err != nil {
		return Decision{}, err
	}
	// No tracker lock from here on: the catalog's lock is taken while
	// holding it elsewhere (its changes add ranks to the tracker: see
	// Loads.Follow).
	if b != nil {
		s.loads.notify(Lifecycle{Kind: LifecycleAdd, Key: req.Key, Booking: *b})
	}
	d := Decision{Worker: c.wr, BlockSize: bs, Overlap: c.ov, EffectivePrefillTokens: c.prefill, Cost: c.cost, ReuseCharge: c.charge, DP: map[uint32]int{}}
	d.Overlap.Worker = c.wr
	for _, o := range overlaps {
		if o.Worker.Worker == d.Worker.Worker {
			d.DP[o.Worker.Rank] = int(o.Device)
		}
		d.BestDevice = max(d.BestDevice, int(o.Device))
	}
	d.DP[d.Worker.Rank] = int(c.ov.Device) // present even with no overlap
	d.Endpoint = s.cat.Endpoint(catalog.WorkerKey{Key: req.Key, ID: d.Worker.Worker})
	s.m.selections.WithLabelValues(req.Key.Model, req.Key.Tenant, strconv.FormatUint(d.Worker.Worker, 10)).Inc()
	return d, nil
}

// Potentials projects the load of every known rank of key with a prompt
// of seq (sequence hashes) and newPrefill uncached tokens added, sorted by
// worker and rank: its prefill grows by newPrefill, its decode blocks by
// the prompt blocks its active requests do not already hold. With isl not
// nil, each rank's new prefill also grows by the *isl tokens of the prompt
// less its cached prefix, credited as a decision credits it.
func (s *Scheduler) Potentials(key indexer.Key, seq []uint64, newPrefill int64, isl *int64) ([]Potential, error) {
	pots, err := s.loads.potentials(key, seq, newPrefill)
	if err != nil {
		return nil, err
	}
	slices.SortFunc(pots, func(a, b Potential) int { return cmpRank(a.Worker, b.Worker) })
	if isl == nil {
		return pots, nil
	}
	var cached map[indexer.WorkerRank]indexer.Overlap
	bs := 1
	if ix := s.set.Lookup(key); ix != nil {
		bs, cached = ix.BlockSize(), overlapsByRank(nil, ix.Match(seq, nil))
	}
	for i := range pots {
		ov := cached[pots[i].Worker]
		pots[i].PrefillTokens = addTokens(pots[i].PrefillTokens, s.opts.uncached(&ov, *isl, bs))
	}
	return pots, nil
}

// decideReporting is decide with the engines' reports of req's key, which
// stay unchanged while it reads them. It is apart from Select, and books a
// copy of book, so that its closure moves nothing of Select's to the heap.
func (s *Scheduler) decideReporting(sc *scratch, t *tracker, ix *indexer.Index, req SelectRequest, overlaps []indexer.Overlap, seq []uint64,
	isl int64, w, temp float64, view *catalog.View, book *Booking) (choice, error) {
	var bk *Booking
	if book != nil {
		cp := *book
		bk = &cp
	}
	var c choice
	var err error
	s.opts.Engines.ReadReports(req.Key, func(eng map[indexer.WorkerRank]EngineReport) {
		c, err = s.decide(sc, t, ix, req, overlaps, seq, isl, w, temp, view, bk, eng)
	})
	if book != nil {
		*book = *bk
	}
	return c, err
}

// decide costs every schedulable rank of t and picks one, under t's lock;
// with book not nil it also books the request there (filling in book's
// Worker and PrefillTokens), in the same critical section. eng are the
// engines' reports of key's ranks, for the metrics correction (nil: none).
//
// Counting the prompt's blocks held by every busy rank's requests is the
// costly part. At temperature 0 only the cheapest ranks matter, so a busy
// rank is first costed with an upper bound of its held blocks (a lower
// bound of its cost), and counted exactly only if that bound does not
// exceed the best exact cost so far (see countBounded). And no rank
// without cached blocks can cost less than such a rank would idle (see
// costing.cold): when a rank with cached blocks costs less, the others
// are not even looked at. The same bound, from a rank's overlap alone
// (costing.floor), skips the ranks with cached blocks that cannot win
// before their load is looked up. The metrics correction (CostOptions.MetricsWeight)
// is not negative and does not depend on held blocks: it keeps both bounds.
// Nor does the reuse charge (CostOptions.ReuseWeight), which cold adds
// for a rank without cached blocks.
func (s *Scheduler) decide(sc *scratch, t *tracker, ix *indexer.Index, req SelectRequest, overlaps []indexer.Overlap, seq []uint64,
	isl int64, w, temp float64, view *catalog.View, book *Booking, eng map[indexer.WorkerRank]EngineReport) (choice, error) {
	bs := ix.BlockSize()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.begin()
	sc.promptReady = false
	// Hashes derived from local ones are chained (see Booking.Chained):
	// they do not repeat, and a chained booking's hashes past its first
	// difference with them need no lookup.
	chained := req.Seq == nil
	k := costing{s: s, t: t, req: req, overlaps: overlaps, view: view, sched: view.Schedulable(req.Key), isl: isl, w: w, bs: bs, n: len(seq), counted: temp > 0,
		cands: sc.cands[:0], bounded: sc.bounded[:0]}
	if req.ChargeReuse && s.opts.ReuseWeight > 0 {
		k.reuse = s.opts.ReuseWeight
		k.leastNew = k.leastPrefill()
	}
	if mw := s.opts.MetricsWeight; mw > 0 && eng != nil {
		k.eng, k.mw, k.now = eng, mw, s.loads.now()
		k.reqBlocks = s.opts.MetricsRequestBlocks
		if k.reqBlocks == 0 {
			k.reqBlocks = max(1, float64(isl)/float64(bs))
		}
	}
	k.reset()
	if k.counted { // sampling weighs every cost: count every rank's blocks
		t.countHeld(seq)
	} else if len(t.reqs) > 0 && !chained {
		k.repeats = sc.countPrompt(seq)
	}
	done := false
	if !k.counted && !k.repeats && t.negative == 0 {
		// The ranks with cached blocks first. A rank whose floor (see
		// costing.floor) exceeds the least exact cost so far cannot win:
		// it is not even looked up.
		for i := range overlaps {
			o := &overlaps[i]
			prefill := s.opts.uncached(o, isl, bs)
			if k.floor(prefill) > k.best {
				continue
			}
			if rl := t.find.get(o.Worker); rl != nil {
				rl.ovAt, rl.ovMark = int32(i), t.pass
				k.add(rl)
			}
		}
		if len(k.bounded) > 0 {
			k.best = t.countBounded(k.cands, k.bounded, seq, sc, false, chained, k.budget, k.best, w, bs)
		}
		if done = k.best < k.cold(); done {
			// In the order of the ranks, as when every rank is costed:
			// the ties are then the same, and so is the choice.
			slices.SortFunc(k.cands, func(a, b candidate) int { return cmp.Compare(a.rl.pos, b.rl.pos) })
		} else {
			k.reset()
		}
	}
	if !done {
		k.mark()
		for _, rl := range t.order {
			k.add(rl)
		}
		if k.schedulable == 0 {
			sc.cands, sc.bounded = k.cands, k.bounded
			return choice{}, fmt.Errorf("%w: no schedulable worker for model_name %q tenant_id %q", ErrUnavailable, req.Key.Model, req.Key.Tenant)
		}
		if len(k.bounded) > 0 {
			k.best = t.countBounded(k.cands, k.bounded, seq, sc, k.repeats, chained, k.budget, k.best, w, bs)
		}
	}
	sc.cands, sc.bounded = k.cands, k.bounded
	c := k.cands[s.pick(sc, k.cands, temp, k.best, ix, overlaps, t.pass)]
	ch := choice{wr: c.rl.wr, prefill: c.prefill, cost: c.cost, charge: k.chargeOf(c.prefill)}
	if c.rl.ovMark == t.pass {
		ch.ov = overlaps[c.rl.ovAt]
	} else {
		ch.ov.Blocks = int32(ix.RankBlocks(c.rl.wr))
	}
	if book != nil {
		book.Worker, book.PrefillTokens = c.rl.wr, c.prefill
		now := s.loads.now()
		t.sweep(now.Add(-s.loads.ttl))
		if err := t.add(*book, now); err != nil {
			return choice{}, err
		}
	}
	return ch, nil
}

// costing is the state of one decision's costing of ranks (see decide).
type costing struct {
	s                *Scheduler
	t                *tracker
	req              SelectRequest
	overlaps         []indexer.Overlap // Match's answer; rankLoad.ovAt indexes it
	view             *catalog.View
	sched            map[uint64]bool // view's schedulable workers of the key
	isl              int64
	w                float64
	bs, n            int  // block size, prompt blocks
	counted, repeats bool // t.countHeld was run; a hash occurs twice in the prompt
	// The metrics correction's inputs (see engineExtra): the scraped ranks
	// (nil: no correction), its weight, the clock and the blocks of a
	// request.
	eng           map[indexer.WorkerRank]EngineReport
	mw, reqBlocks float64
	now           time.Time
	// The reuse charge (see CostOptions.ReuseWeight): R (0: none), and
	// the least new prefill of any candidate rank.
	reuse    float64
	leastNew int64

	cands       []candidate // at temperature 0, only those that may win
	bounded     []int       // indexes in cands of candidates whose cost is a bound
	best        float64     // the least exact cost
	budget      int         // what a countHeld pass would cost, about
	schedulable int         // ranks costed
}

func (k *costing) reset() {
	k.cands, k.bounded = k.cands[:0], k.bounded[:0]
	k.best, k.budget, k.schedulable = math.Inf(1), k.n, 0
}

// cold returns a lower bound of the cost of every rank without cached
// blocks (Overlap zero): the cost of such a rank with no load, its reuse
// charge included. A loaded one costs no less: its active prefill and
// output are not negative, and its active requests hold at least as many
// blocks as they hold of the prompt, when no hash occurs twice in the
// prompt; and its metrics correction is not negative. So it is valid
// when !k.repeats and k.t.negative is 0.
func (k *costing) cold() float64 { return k.floor(max(0, k.isl)) }

// floor returns a lower bound of the cost of a rank whose new prefill is
// prefill tokens: the cost with no active prefill, no output and no block
// beyond the prompt's, its charges included. It is valid when !k.repeats
// and k.t.negative is 0 (see cold). A rank whose floor exceeds the least
// exact cost so far cannot win, nor tie.
func (k *costing) floor(prefill int64) float64 {
	return k.w*float64(prefill)/float64(k.bs) + float64(k.n) + k.chargeOf(prefill)
}

// mark records on every rank of k.overlaps its place there (see
// rankLoad.ovAt).
func (k *costing) mark() {
	for i := range k.overlaps {
		if rl := k.t.find.get(k.overlaps[i].Worker); rl != nil {
			rl.ovAt, rl.ovMark = int32(i), k.t.pass
		}
	}
}

// leastPrefill returns the least new prefill of any eligible rank, for the
// reuse charge: that of the eligible rank with the longest effective
// cached prefix (the new prefill falls as it grows), or the whole prompt
// when none has one. The ranks tied at the longest prefix are looked at
// first; every rank only when none of them is eligible.
func (k *costing) leastPrefill() int64 {
	o := k.s.opts
	eligibleAt := func(i int) bool {
		rl := k.t.find.get(k.overlaps[i].Worker)
		return rl != nil && k.eligible(rl)
	}
	var top float64
	for i := range k.overlaps {
		top = max(top, o.effective(&k.overlaps[i]))
	}
	best := -1
	if top > 0 {
		for i := range k.overlaps {
			if o.effective(&k.overlaps[i]) == top && eligibleAt(i) {
				best = i
				break
			}
		}
	}
	if best < 0 {
		var bestEff float64
		for i := range k.overlaps {
			if eff := o.effective(&k.overlaps[i]); eff > bestEff && eligibleAt(i) {
				bestEff, best = eff, i
			}
		}
	}
	if best < 0 {
		return max(0, k.isl)
	}
	return o.uncached(&k.overlaps[best], k.isl, k.bs)
}

// chargeOf returns the reuse charge of a rank whose new prefill is
// prefill tokens: R * w * (prefill - least) / block size.
func (k *costing) chargeOf(prefill int64) float64 {
	if k.reuse == 0 {
		return 0
	}
	return k.reuse * k.w * float64(prefill-k.leastNew) / float64(k.bs)
}

// eligible reports whether rl may be chosen: its worker is schedulable
// and, when the request names workers, one of them. When it names none,
// the answer is kept on the rank for the catalog's View; when
// it does, it is worked out once per pass, on the worker's first rank.
func (k *costing) eligible(rl *rankLoad) bool {
	if len(k.req.Workers) == 0 { // schedulable is all it takes
		if rl.schedView != k.view {
			rl.schedView, rl.schedulable = k.view, k.sched[rl.wr.Worker]
		}
		return rl.schedulable
	}
	h := rl.head
	if h.eligMark != k.t.pass {
		w := rl.wr.Worker
		h.eligMark, h.eligible = k.t.pass, k.sched[w] && (len(k.req.Workers) == 0 || slices.Contains(k.req.Workers, w))
	}
	return h.eligible
}

// add costs rl, if eligible, and keeps it unless it cannot win.
func (k *costing) add(rl *rankLoad) {
	if !k.eligible(rl) {
		return
	}
	k.schedulable++
	c := candidate{rl: rl, prefill: max(0, k.isl)} // no overlap
	if rl.ovMark == k.t.pass {
		c.prefill = k.s.opts.uncached(&k.overlaps[rl.ovAt], k.isl, k.bs)
	}
	switch blocks := rl.blocks(); {
	case k.counted:
		c.held = int32(k.t.held(rl))
	case blocks > 0:
		c.held, c.bound = int32(min(k.n, blocks)), true
		if k.repeats {
			c.held = int32(k.n)
		}
		k.budget += min(k.n, blocks)
	}
	c.extra = k.chargeOf(c.prefill)
	c.cost = costOf(rl, &c, k.n, k.w, k.bs)
	if k.eng != nil && (k.counted || c.cost <= k.best) {
		// Not negative: a rank that cannot win without it cannot with it.
		m := k.engineExtra(rl)
		c.extra += m
		c.cost += m // as costOf adds it
	}
	if !k.counted && c.cost > k.best {
		return
	}
	if c.bound {
		k.bounded = append(k.bounded, len(k.cands))
	} else {
		k.best = min(k.best, c.cost)
	}
	k.cands = append(k.cands, c)
}

// countBounded makes exact the costs of the bounded candidates (indexes in
// cands) whose lower bound does not exceed best, the least exact cost,
// cheapest bound first; the others keep their bound, above the least cost.
// Each is counted on its own (see rankLoad.heldOf; prompt counts seq,
// repeats says whether a hash occurs twice in it) until that would have
// cost more than a countHeld pass over every holder of the prompt's
// hashes, about budget (a lookup of heldOf counting for perLookup of its
// steps). It returns the least exact cost. Call with t.mu held.
func (t *tracker) countBounded(cands []candidate, bounded []int, seq []uint64, sc *scratch, repeats, chained bool, budget int, best, w float64, bs int) float64 {
	bounded = slices.DeleteFunc(bounded, func(i int) bool { return cands[i].cost > best })
	slices.SortFunc(bounded, func(a, b int) int { return cmp.Compare(cands[a].cost, cands[b].cost) })
	counted, spent := false, 0
	for _, i := range bounded {
		c := &cands[i]
		if c.cost > best {
			break // so are the rest
		}
		if !counted {
			if spent += perLookup * c.rl.heldCost(seq); spent > budget {
				t.countHeld(seq)
				counted = true
			}
		}
		if counted {
			c.held = int32(t.held(c.rl))
		} else {
			c.held = int32(c.rl.heldOf(seq, sc, repeats, chained))
		}
		c.bound = false
		c.cost = costOf(c.rl, c, len(seq), w, bs)
		best = min(best, c.cost)
	}
	return best
}

// perLookup is what a lookup of heldOf costs, in steps of countHeld.
const perLookup = 2

// pick returns the index of the chosen candidate: the cheapest (ties: the
// smaller tree, then random) at temperature 0, where least is the least
// cost (the bounded candidates and those left out by decide cost more),
// else a softmax sample over every schedulable rank.
func (s *Scheduler) pick(sc *scratch, cands []candidate, temp, least float64, ix *indexer.Index, overlaps []indexer.Overlap, pass uint64) int {
	s.randMu.Lock()
	defer s.randMu.Unlock()
	if temp > 0 {
		lo, hi := math.Inf(1), math.Inf(-1)
		for _, c := range cands {
			lo, hi = min(lo, c.cost), max(hi, c.cost)
		}
		if hi == lo {
			return s.rand.IntN(len(cands))
		}
		weights := slices.Grow(sc.weights[:0], len(cands))[:len(cands)]
		sc.weights = weights
		var sum float64
		for i, c := range cands {
			// Shifted by the minimum so the largest weight is 1.
			weights[i] = math.Exp(-((c.cost - lo) / (hi - lo)) / temp)
			sum += weights[i]
		}
		x := s.rand.Float64() * sum
		for i, wt := range weights {
			if x < wt {
				return i
			}
			x -= wt
		}
		return len(cands) - 1
	}
	ties := sc.ties[:0]
	defer func() { sc.ties = ties }()
	for i, c := range cands {
		if c.cost == least {
			ties = append(ties, i)
		}
	}
	if len(ties) > 1 {
		trees := slices.Grow(sc.trees[:0], len(ties))[:len(ties)]
		sc.trees = trees
		small := math.MaxInt
		for k, i := range ties {
			if rl := cands[i].rl; rl.ovMark == pass {
				trees[k] = int(overlaps[rl.ovAt].Blocks) // as of the match
			} else {
				trees[k] = ix.RankBlocks(rl.wr)
			}
			small = min(small, trees[k])
		}
		n := 0
		for k, i := range ties {
			if trees[k] == small {
				ties[n] = i
				n++
			}
		}
		ties = ties[:n]
	}
	return ties[s.rand.IntN(len(ties))]
}

// release returns sc to the pool, dropping its references to loads.
func (s *Scheduler) release(sc *scratch) {
	clear(sc.cands)
	s.scratch.Put(sc)
}

// loadCollector reports active loads per worker rank at scrape time.
type loadCollector struct{ l *Loads }

var (
	loadPrefill = prometheus.NewDesc("kvgate_scheduler_active_prefill_tokens", "Prefill tokens of active requests, per worker rank.", []string{"model", "tenant", "worker", "dp_rank"}, nil)
	loadDecode  = prometheus.NewDesc("kvgate_scheduler_active_decode_blocks", "Unique prompt blocks plus output blocks of active requests, per worker rank.", []string{"model", "tenant", "worker", "dp_rank"}, nil)
	loadReqs    = prometheus.NewDesc("kvgate_scheduler_active_requests", "Active requests, per worker rank.", []string{"model", "tenant", "worker", "dp_rank"}, nil)
)

func (c loadCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- loadPrefill
	ch <- loadDecode
	ch <- loadReqs
}

func (c loadCollector) Collect(ch chan<- prometheus.Metric) {
	for _, l := range c.l.Snapshot("", "") {
		labels := []string{l.Key.Model, l.Key.Tenant, fmt.Sprint(l.Worker.Worker), fmt.Sprint(l.Worker.Rank)}
		ch <- prometheus.MustNewConstMetric(loadPrefill, prometheus.GaugeValue, float64(l.PrefillTokens), labels...)
		ch <- prometheus.MustNewConstMetric(loadDecode, prometheus.GaugeValue, l.DecodeBlocks, labels...)
		ch <- prometheus.MustNewConstMetric(loadReqs, prometheus.GaugeValue, float64(l.Requests), labels...)
	}
}
