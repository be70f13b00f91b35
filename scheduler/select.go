package scheduler

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/indexer"
)

// This file is the decision (shared/spec/scheduling.md): for a prompt,
// each schedulable rank's cached overlap from the index and active load
// from Loads give a cost; the cheapest rank wins (or one is sampled with a
// temperature), and may be booked in the same step.

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
}

// Zero-value markers for CostOptions fields whose default is not zero.
const (
	NoOverlapWeight = -1.0 // OverlapWeight 0
	NoDiscount      = -1.0 // HostWeight / DiskWeight 0
)

// uncached returns the tokens of isl a rank with overlap ov (in blocks of
// bs tokens) must compute: the cache credit, with host-only and disk-only
// blocks discounted. It is the prefill booked for a request.
func (o CostOptions) uncached(ov indexer.Overlap, isl int64, bs int) int64 {
	eff := float64(ov.Device) + o.HostWeight*float64(ov.Host-ov.Device) + o.DiskWeight*float64(ov.Disk-ov.Host)
	return max(0, isl-int64(math.Round(eff*float64(bs))))
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
	byRank   map[indexer.WorkerRank]indexer.Overlap
	cands    []candidate
	weights  []float64
	ties     []int
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
}

// Decision is the chosen rank and why.
type Decision struct {
	Worker    indexer.WorkerRank
	BlockSize int
	// Overlap is the chosen rank's cached prefix, in blocks, per tier
	// (cumulative), and per rank of the chosen worker on device (DP).
	Overlap indexer.Overlap
	DP      map[uint32]int
	// EffectivePrefillTokens is the prefill the request costs the rank
	// after cache credit (host and disk overlap discounted): the value
	// booked.
	EffectivePrefillTokens int64
	Cost                   float64
	Endpoint               string
}

// Scheduler decides where requests go. It is safe for concurrent use.
type Scheduler struct {
	cat   *Catalog
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
// and the loads. seed seeds tie-breaking and sampling (tests fix it).
// reg, if not nil, receives kvgate_scheduler_* metrics.
func NewScheduler(cat *Catalog, set *indexer.Set, loads *Loads, opts CostOptions, seed uint64, reg prometheus.Registerer) *Scheduler {
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
		reg.MustRegister(s.m.selections, s.m.latency, loadCollector{loads})
	}
	return s
}

// candidate is one rank's inputs and cost.
type candidate struct {
	rl      *rankLoad
	ov      indexer.Overlap
	prefill int64 // effective new prefill tokens
	cost    float64
	tree    int
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
	// (shared/spec/hashing.md); the client's own sequence hashes, when
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
	sc.byRank = overlapsByRank(sc.byRank, overlaps)
	sched := s.cat.schedulable()[req.Key]
	var b *Booking
	if req.Reserve {
		// The booking keeps its hashes: never the scratch's.
		b = &Booking{ID: req.ReservationID, Hashes: seq}
		if req.Seq == nil {
			b.Hashes = slices.Clone(seq)
		}
	}
	c, err := s.decide(sc, t, ix, req, seq, isl, w, temp, sched, b)
	if err != nil {
		return Decision{}, err
	}
	// No tracker lock from here on: the catalog's lock is taken while
	// holding it elsewhere (registration adds ranks to the tracker).
	if b != nil {
		s.loads.notify(Lifecycle{Kind: LifecycleAdd, Key: req.Key, Booking: *b})
	}
	d := Decision{Worker: c.rl.wr, BlockSize: bs, Overlap: c.ov, EffectivePrefillTokens: c.prefill, Cost: c.cost, DP: map[uint32]int{}}
	d.Overlap.Worker = c.rl.wr
	for _, o := range overlaps {
		if o.Worker.Worker == d.Worker.Worker {
			d.DP[o.Worker.Rank] = o.Device
		}
	}
	d.DP[d.Worker.Rank] = c.ov.Device // present even with no overlap
	d.Endpoint = s.cat.endpoint(WorkerKey{req.Key, d.Worker.Worker})
	s.m.selections.WithLabelValues(req.Key.Model, req.Key.Tenant, strconv.FormatUint(d.Worker.Worker, 10)).Inc()
	return d, nil
}

// decide costs every schedulable rank of t and picks one, under t's lock;
// with book not nil it also books the request there (filling in book's
// Worker and PrefillTokens), in the same critical section.
func (s *Scheduler) decide(sc *scratch, t *tracker, ix *indexer.Index, req SelectRequest, seq []uint64, isl int64, w, temp float64,
	sched map[uint64]bool, book *Booking) (candidate, error) {
	bs := ix.BlockSize()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.countHeld(seq)
	cands, byRank := sc.cands[:0], sc.byRank
	for _, rl := range t.order {
		wr := rl.wr
		if !sched[wr.Worker] || (len(req.Workers) > 0 && !slices.Contains(req.Workers, wr.Worker)) {
			continue
		}
		c := candidate{rl: rl, ov: byRank[wr]}
		c.prefill = s.opts.uncached(c.ov, isl, bs)
		prefill := float64(rl.prefill + c.prefill)
		decode := float64(rl.blocks) + rl.output + float64(len(seq)-t.held(rl))
		c.cost = w*prefill/float64(bs) + decode
		cands = append(cands, c)
	}
	sc.cands = cands
	if len(cands) == 0 {
		return candidate{}, fmt.Errorf("%w: no schedulable worker for model_name %q tenant_id %q", ErrUnavailable, req.Key.Model, req.Key.Tenant)
	}
	c := cands[s.pick(sc, cands, temp, ix)]
	if book != nil {
		book.Worker, book.PrefillTokens = c.rl.wr, c.prefill
		now := s.loads.now()
		t.sweep(now.Add(-s.loads.ttl))
		if err := t.add(*book, now); err != nil {
			return candidate{}, err
		}
	}
	return c, nil
}

// pick returns the index of the chosen candidate: the cheapest (ties: the
// smaller tree, then random) at temperature 0, else a softmax sample.
func (s *Scheduler) pick(sc *scratch, cands []candidate, temp float64, ix *indexer.Index) int {
	s.randMu.Lock()
	defer s.randMu.Unlock()
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, c := range cands {
		lo, hi = min(lo, c.cost), max(hi, c.cost)
	}
	if temp > 0 {
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
		if c.cost == lo {
			ties = append(ties, i)
		}
	}
	if len(ties) > 1 {
		small := math.MaxInt
		for _, i := range ties {
			cands[i].tree = ix.RankBlocks(cands[i].rl.wr)
			small = min(small, cands[i].tree)
		}
		ties = slices.DeleteFunc(ties, func(i int) bool { return cands[i].tree != small })
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
