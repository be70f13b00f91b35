package scheduler

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvgate/kvgate/indexer"
)

// This file reads the load each worker's engine reports on its vLLM
// /metrics page (docs/epp-protocol.md, "vLLM metrics"): requests
// waiting in its queue and running, the fraction of its KV cache in use
// and, when it says, the cache's size in blocks. A Scraper fetches the
// page of every catalog worker with a request endpoint, periodically; the
// catalog keeps, per worker, the last values by DP rank and the last error
// (GET /workers), and the cost function may add the load an engine reports
// beyond the load tracked locally (CostOptions.MetricsWeight,
// costing.engineExtra).

// The vLLM metrics read.
const (
	metricWaiting = "vllm:num_requests_waiting"
	metricRunning = "vllm:num_requests_running"
	metricUsage   = "vllm:kv_cache_usage_perc"
	// metricUsageOld is the name of metricUsage before vLLM 0.10; read
	// when a page has no metricUsage.
	metricUsageOld    = "vllm:gpu_cache_usage_perc"
	metricCacheConfig = "vllm:cache_config_info" // label num_gpu_blocks
)

// Defaults of ScrapeOptions.
const (
	DefaultScrapeTimeout     = 5 * time.Second
	DefaultScrapeConcurrency = 8
	DefaultMaxMetricsBytes   = 8 << 20
	// DefaultStaleScrapes is how many intervals a scrape counts for.
	DefaultStaleScrapes = 3
)

// ScrapeOptions configure a Scraper.
type ScrapeOptions struct {
	// Interval is the period of the scrapes of every worker; 0 turns
	// scraping off (Run returns at once).
	Interval time.Duration
	// Timeout bounds one page's scrape. Default: the interval, at most
	// DefaultScrapeTimeout.
	Timeout time.Duration
	// StaleAfter is the age at which a successful scrape stops counting in
	// the cost (a failed one stops at once). Default DefaultStaleScrapes
	// intervals (or of DefaultScrapeTimeout when the interval is 0).
	StaleAfter time.Duration
	// Concurrency bounds the scrapes in flight. Default
	// DefaultScrapeConcurrency.
	Concurrency int
	// MaxBytes bounds a page; a longer one is an error. Default
	// DefaultMaxMetricsBytes.
	MaxBytes int64
	// Client sends the requests. Default: a client of the Scraper's own,
	// whose idle connections Run closes when it returns.
	Client *http.Client
	Logger *slog.Logger
}

// EngineLoad is the load one DP rank's engine reported. A value it did not
// report is NaN.
type EngineLoad struct {
	Waiting float64 // vllm:num_requests_waiting
	Running float64 // vllm:num_requests_running
	// KVUsage is vllm:kv_cache_usage_perc: the fraction (0..1) of the KV
	// cache's blocks in use.
	KVUsage float64
	// KVBlocks is the KV cache's size in blocks: vllm:cache_config_info's
	// num_gpu_blocks label.
	KVBlocks float64
}

func unknownLoad() EngineLoad { return EngineLoad{math.NaN(), math.NaN(), math.NaN(), math.NaN()} }

// WorkerScrape is what the scrapes of a worker's /metrics page found.
type WorkerScrape struct {
	URL string // the page
	// ScrapedAt is the time of the last successful scrape (zero: none),
	// AttemptedAt of the last one; LastError is its error ("" if none).
	ScrapedAt, AttemptedAt time.Time
	LastError              string
	// Fresh says whether Ranks count in the cost: the last scrape
	// succeeded, less than StaleAfter ago.
	Fresh bool
	// Ranks are the values of the last successful scrape, by DP rank.
	Ranks map[uint32]EngineLoad
}

// scrapeStore keeps the workers' scrapes: per worker for GET /workers,
// and per rank for decisions. Its lock is taken after the catalog's (mu)
// or a tracker's, never before either.
type scrapeStore struct {
	mu      sync.RWMutex
	workers map[WorkerKey]*workerScrape
	// ranks holds, per (model, tenant), the ranks of the workers whose
	// last scrape succeeded; a key without one has no entry.
	ranks map[indexer.Key]map[indexer.WorkerRank]rankEngine
}

type workerScrape struct {
	WorkerScrape // but Fresh
	endpoint     string
	until        time.Time // ScrapedAt + StaleAfter; zero after a failure
}

// rankEngine is a rank's load as a decision reads it: used while the
// decision's clock is before until.
type rankEngine struct {
	EngineLoad
	until time.Time
}

// record stores a scrape of w's page url at time at: its loads by rank
// (only w's ranks are kept), or its error.
func (st *scrapeStore) record(w *Worker, url string, at time.Time, loads map[uint32]EngineLoad, err error, stale time.Duration) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.workers == nil {
		st.workers = make(map[WorkerKey]*workerScrape)
		st.ranks = make(map[indexer.Key]map[indexer.WorkerRank]rankEngine)
	}
	ws := st.workers[w.WorkerKey]
	if ws == nil || ws.URL != url {
		st.dropRanks(w.WorkerKey, ws)
		ws = &workerScrape{WorkerScrape: WorkerScrape{URL: url}}
		st.workers[w.WorkerKey] = ws
	}
	ws.endpoint, ws.AttemptedAt = w.Endpoint, at
	st.dropRanks(w.WorkerKey, ws) // a failure stops counting at once
	if err != nil {
		ws.LastError, ws.until = err.Error(), time.Time{}
		return
	}
	ws.LastError, ws.ScrapedAt, ws.until = "", at, at.Add(stale)
	ws.Ranks = make(map[uint32]EngineLoad, len(loads))
	rm := st.ranks[w.Key]
	for rank, l := range loads {
		if _, found := slices.BinarySearch(w.Ranks, rank); !found {
			continue
		}
		if rm == nil {
			rm = make(map[indexer.WorkerRank]rankEngine)
			st.ranks[w.Key] = rm
		}
		ws.Ranks[rank] = l
		rm[indexer.WorkerRank{Worker: w.ID, Rank: rank}] = rankEngine{l, ws.until}
	}
}

// dropRanks removes the decision entries of ws (worker wk, may be nil).
// Call with mu held.
func (st *scrapeStore) dropRanks(wk WorkerKey, ws *workerScrape) {
	rm := st.ranks[wk.Key]
	if ws == nil || rm == nil {
		return
	}
	for rank := range ws.Ranks {
		delete(rm, indexer.WorkerRank{Worker: wk.ID, Rank: rank})
	}
	if len(rm) == 0 {
		delete(st.ranks, wk.Key)
	}
}

// forget drops what is kept of worker wk: of one rank when rank is not
// nil, else all of it.
func (st *scrapeStore) forget(wk WorkerKey, rank *uint32) {
	st.mu.Lock()
	defer st.mu.Unlock()
	ws := st.workers[wk]
	switch {
	case ws == nil:
	case rank == nil:
		st.dropRanks(wk, ws)
		delete(st.workers, wk)
	default:
		st.dropRank(wk, ws, *rank)
	}
}

// dropRank drops what is kept of rank of ws (worker wk). Call with mu
// held.
func (st *scrapeStore) dropRank(wk WorkerKey, ws *workerScrape, rank uint32) {
	if rm := st.ranks[wk.Key]; rm != nil {
		delete(rm, indexer.WorkerRank{Worker: wk.ID, Rank: rank})
		if len(rm) == 0 {
			delete(st.ranks, wk.Key)
		}
	}
	delete(ws.Ranks, rank)
}

// retain drops what is kept of the workers that their registrations in
// workers no longer cover: everything of a worker gone or whose endpoint
// changed, else the ranks it lost. Call with the catalog's mu held.
func (st *scrapeStore) retain(workers map[WorkerKey]*Worker) {
	st.mu.Lock()
	defer st.mu.Unlock()
	for wk, ws := range st.workers {
		w := workers[wk]
		if w == nil || w.Endpoint != ws.endpoint {
			st.dropRanks(wk, ws)
			delete(st.workers, wk)
			continue
		}
		for rank := range ws.Ranks {
			if _, found := slices.BinarySearch(w.Ranks, rank); !found {
				st.dropRank(wk, ws, rank)
			}
		}
	}
}

// view returns a copy of what is kept of w at time now, nil if it was
// never scraped.
func (st *scrapeStore) view(w *Worker, now time.Time) *WorkerScrape {
	st.mu.RLock()
	defer st.mu.RUnlock()
	ws := st.workers[w.WorkerKey]
	if ws == nil {
		return nil
	}
	v := ws.WorkerScrape
	v.Fresh = ws.LastError == "" && now.Before(ws.until)
	v.Ranks = maps.Clone(ws.Ranks)
	return &v
}

// engineExtra returns the metrics correction of rl's cost (see
// CostOptions.MetricsWeight): the load rl's engine reported, in the
// cost's units, beyond the load tracked locally, times the weight; 0
// when rl was not scraped, or its scrape failed or is stale. It is
// never negative, nor NaN, and does not depend on the prompt's blocks
// held by rl, so that a cost bound without it (costing.cold, a bounded
// candidate) stays a bound with it.
func (k *costing) engineExtra(rl *rankLoad) float64 {
	e, ok := k.eng[rl.wr]
	if !ok || !k.now.Before(e.until) {
		return 0
	}
	b := k.reqBlocks
	reported := 0.0
	if e.Waiting > 0 { // false for NaN
		reported += (k.w + 1) * e.Waiting * b
	}
	switch {
	case e.KVUsage >= 0 && e.KVBlocks > 0:
		reported += e.KVUsage * e.KVBlocks
	case e.Running > 0:
		reported += e.Running * b
	}
	tracked := k.w*float64(rl.prefill)/float64(k.bs) + float64(rl.blocks()) + rl.output
	if !(reported > tracked) {
		return 0
	}
	return min(k.mw*(reported-tracked), math.MaxFloat64) // finite
}

// Outcomes of a scrape (label outcome of kvgate_scrape_total).
const (
	outcomeSuccess  = "success"
	outcomeTimeout  = "timeout"
	outcomeError    = "error"       // no answer: connection refused, reset...
	outcomeStatus   = "http_status" // an answer other than 200
	outcomeTooLarge = "too_large"
	outcomeInvalid  = "invalid" // not the text format, or no load metric in it
)

// Reasons a series is dropped (label reason of kvgate_scrape_dropped_total).
const (
	dropInvalidValue  = "invalid_value"  // NaN, negative, too large (above 1 for a usage)
	dropUnknownEngine = "unknown_engine" // an engine label that is none of the worker's ranks
	dropWorkerChanged = "worker_changed" // the worker left or changed endpoint during the scrape
)

// Scraper scrapes the vLLM /metrics page of every catalog worker with a
// request endpoint (host:port -> http://host:port/metrics; a URL ->
// <URL>/metrics, less a trailing /v1) and keeps the values in the catalog,
// by DP rank: a series with label engine="<i>" is rank i's (or, when none
// of the page's engines is a rank of the worker but there are as many,
// the i-th engine is the worker's i-th rank); one without applies to every
// rank. Series whose model_name is the worker's model are preferred. A
// page serving several workers (in other tenants, say) is fetched once.
type Scraper struct {
	cat    *Catalog
	opts   ScrapeOptions
	log    *slog.Logger
	client *http.Client
	own    bool // the client is the Scraper's

	mu      sync.Mutex
	failing map[string]string // pages whose last scrape failed: the error

	m scrapeMetrics
}

type scrapeMetrics struct {
	scrapes  *prometheus.CounterVec
	duration prometheus.Histogram
	dropped  *prometheus.CounterVec
	targets  prometheus.Gauge
}

// NewScraper returns a scraper of cat's workers. reg, if not nil, receives
// the kvgate_scrape_* metrics.
func NewScraper(cat *Catalog, opts ScrapeOptions, reg prometheus.Registerer) *Scraper {
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultScrapeTimeout
		if opts.Interval > 0 {
			opts.Timeout = min(opts.Interval, DefaultScrapeTimeout)
		}
	}
	if opts.StaleAfter <= 0 {
		opts.StaleAfter = DefaultStaleScrapes * cmp.Or(max(opts.Interval, 0), DefaultScrapeTimeout)
	}
	if opts.Concurrency <= 0 {
		opts.Concurrency = DefaultScrapeConcurrency
	}
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = DefaultMaxMetricsBytes
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	s := &Scraper{cat: cat, opts: opts, log: opts.Logger, client: opts.Client, failing: make(map[string]string),
		m: scrapeMetrics{
			scrapes: prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: "kvgate_scrape_total", Help: "Scrapes of workers' vLLM /metrics pages, by outcome.",
			}, []string{"outcome"}),
			duration: prometheus.NewHistogram(prometheus.HistogramOpts{
				Name: "kvgate_scrape_duration_seconds", Help: "Time to fetch and parse a worker's /metrics page.",
				Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 12),
			}),
			dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: "kvgate_scrape_dropped_total", Help: "Scraped series (or whole scrapes) not kept, by reason.",
			}, []string{"reason"}),
			targets: prometheus.NewGauge(prometheus.GaugeOpts{
				Name: "kvgate_scrape_targets", Help: "Pages scraped in the last round.",
			}),
		}}
	if s.client == nil {
		s.client, s.own = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}, true
	}
	for _, o := range []string{outcomeSuccess, outcomeTimeout, outcomeError, outcomeStatus, outcomeTooLarge, outcomeInvalid} {
		s.m.scrapes.WithLabelValues(o)
	}
	for _, r := range []string{dropInvalidValue, dropUnknownEngine, dropWorkerChanged} {
		s.m.dropped.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(s.m.scrapes, s.m.duration, s.m.dropped, s.m.targets)
	}
	return s
}

// Run scrapes every worker each interval, the first time at once, until
// ctx ends; then it returns nil. With a zero interval it returns at once.
func (s *Scraper) Run(ctx context.Context) error {
	if s.opts.Interval < 0 {
		return fmt.Errorf("%w: scrape interval %s is negative", ErrInvalid, s.opts.Interval)
	}
	if s.opts.Interval == 0 {
		return nil
	}
	if s.own {
		defer s.client.CloseIdleConnections()
	}
	t := time.NewTicker(s.opts.Interval)
	defer t.Stop()
	for {
		if s.ScrapeOnce(ctx) != nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// scrapeTarget is a worker whose page is scraped.
type scrapeTarget struct {
	WorkerKey
	endpoint string
	ranks    []uint32
}

// ScrapeOnce scrapes the page of every catalog worker with a request
// endpoint once, at most Concurrency at a time, and returns when all are
// done: nil, or ctx's error if it ended first (what was scraped is kept).
// A worker's failure is kept as its LastError, not returned.
func (s *Scraper) ScrapeOnce(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	byURL := make(map[string][]scrapeTarget)
	at := s.cat.opts.Now()
	for _, t := range s.cat.scrapeTargets() {
		u, err := metricsURL(t.endpoint)
		if err != nil {
			s.cat.recordScrape(t, "", at, nil, err, s.opts.StaleAfter)
			continue
		}
		byURL[u] = append(byURL[u], t)
	}
	urls := slices.Sorted(maps.Keys(byURL))
	s.m.targets.Set(float64(len(urls)))
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(s.opts.Concurrency, len(urls)) {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1)) - 1
				if i >= len(urls) {
					return
				}
				s.scrape(ctx, urls[i], byURL[urls[i]])
			}
		})
	}
	wg.Wait()
	s.mu.Lock()
	maps.DeleteFunc(s.failing, func(u, _ string) bool { _, ok := byURL[u]; return !ok })
	s.mu.Unlock()
	return ctx.Err()
}

// scrape fetches page u and records what it says of each of ts.
func (s *Scraper) scrape(ctx context.Context, u string, ts []scrapeTarget) {
	start := time.Now()
	p, outcome, err := s.fetch(ctx, u)
	if ctx.Err() != nil {
		return // stopping: nothing was learnt of the worker
	}
	s.m.duration.Observe(time.Since(start).Seconds())
	s.m.scrapes.WithLabelValues(outcome).Inc()
	if p != nil && p.invalid > 0 {
		s.m.dropped.WithLabelValues(dropInvalidValue).Add(float64(p.invalid))
	}
	at := s.cat.opts.Now()
	for _, t := range ts {
		var loads map[uint32]EngineLoad
		werr := err
		if err == nil {
			var dropped int
			loads, dropped = p.resolve(t.Key.Model, t.ranks)
			s.m.dropped.WithLabelValues(dropUnknownEngine).Add(float64(dropped))
			if len(loads) == 0 {
				werr = fmt.Errorf("scrape %s: no series for dp ranks %v (engine labels %v)", u, t.ranks, p.engines())
			}
		}
		if !s.cat.recordScrape(t, u, at, loads, werr, s.opts.StaleAfter) {
			s.m.dropped.WithLabelValues(dropWorkerChanged).Inc()
		}
	}
	s.mu.Lock()
	prev, was := s.failing[u]
	if err != nil {
		s.failing[u] = err.Error()
	} else {
		delete(s.failing, u)
	}
	s.mu.Unlock()
	switch {
	case err != nil && (!was || prev != err.Error()):
		s.log.Warn("scraping worker metrics failed", "url", u, "outcome", outcome, "err", err)
	case err == nil && was:
		s.log.Info("scraping worker metrics recovered", "url", u)
	}
}

// fetch gets and parses page u, within the timeout. It reports the
// outcome with the error.
func (s *Scraper) fetch(ctx context.Context, u string) (*page, string, error) {
	ctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	fail := func(err error) (*page, string, error) {
		if errors.Is(err, context.DeadlineExceeded) {
			return nil, outcomeTimeout, fmt.Errorf("scrape %s: no answer within %s", u, s.opts.Timeout)
		}
		return nil, outcomeError, fmt.Errorf("scrape %s: %w", u, err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return fail(err)
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4;q=1,*/*;q=0.1")
	resp, err := s.client.Do(req)
	if err != nil {
		return fail(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		head, _ := io.ReadAll(io.LimitReader(resp.Body, 256))
		return nil, outcomeStatus, fmt.Errorf("scrape %s: %s: %q", u, resp.Status, bytes.TrimSpace(head))
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, s.opts.MaxBytes+1))
	if err != nil {
		return fail(err)
	}
	if int64(len(data)) > s.opts.MaxBytes {
		return nil, outcomeTooLarge, fmt.Errorf("scrape %s: page exceeds %d bytes", u, s.opts.MaxBytes)
	}
	p, err := parsePage(data)
	if err != nil {
		return nil, outcomeInvalid, fmt.Errorf("scrape %s: %w", u, err)
	}
	return p, outcomeSuccess, nil
}

// metricsURL returns the /metrics page of a request endpoint: host:port
// -> http://host:port/metrics, an http(s) URL -> <URL>/metrics, without
// its query and a trailing /v1 (the OpenAI routes' prefix, beside which
// vLLM serves /metrics).
func metricsURL(endpoint string) (string, error) {
	if err := checkRequestEndpoint(endpoint); err != nil {
		return "", err
	}
	if !strings.Contains(endpoint, "://") {
		return "http://" + endpoint + "/metrics", nil
	}
	u, err := url.Parse(endpoint)
	if err != nil {
		return "", fmt.Errorf("%w: endpoint %.80q: %w", ErrInvalid, endpoint, err)
	}
	p := strings.TrimSuffix(strings.TrimRight(u.Path, "/"), "/v1")
	v := url.URL{Scheme: u.Scheme, User: u.User, Host: u.Host, Path: p + "/metrics"}
	return v.String(), nil
}

// series is one series of a page.
type series struct {
	model, engine string
	hasEngine     bool
	value         float64
}

// page is what a /metrics page says of load: the series of each metric
// read, with valid values.
type page struct {
	waiting, running, usage, blocks []series
	invalid                         int // series dropped for their value
}

// Bounds of sane values: a page saying more is wrong, and its values would
// swamp every cost.
const (
	maxRequests = 1e9
	maxBlocks   = 1e12
)

// parsePage parses a page in the Prometheus text format. A page with
// neither waiting requests nor KV cache usage is an error.
func parsePage(data []byte) (*page, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("not a Prometheus text page: %w", err)
	}
	p := new(page)
	valid := func(hi float64) func(float64) bool {
		return func(v float64) bool { return v >= 0 && v <= hi } // false for NaN
	}
	p.waiting = p.samples(mfs[metricWaiting], valid(maxRequests))
	p.running = p.samples(mfs[metricRunning], valid(maxRequests))
	usage := mfs[metricUsage]
	if usage == nil {
		usage = mfs[metricUsageOld]
	}
	p.usage = p.samples(usage, valid(1))
	if mf := mfs[metricCacheConfig]; mf != nil {
		for _, m := range mf.GetMetric() {
			s := labelled(m)
			for _, l := range m.GetLabel() {
				if l.GetName() == "num_gpu_blocks" {
					// "None" until the engine sized its cache: unknown.
					if v, err := strconv.ParseFloat(l.GetValue(), 64); err == nil && v > 0 && v <= maxBlocks {
						s.value = v
						p.blocks = append(p.blocks, s)
					}
				}
			}
		}
	}
	if len(p.waiting) == 0 && len(p.usage) == 0 {
		return nil, fmt.Errorf("no valid %s or %s series", metricWaiting, metricUsage)
	}
	return p, nil
}

// labelled returns m's model_name and engine labels.
func labelled(m *dto.Metric) series {
	var s series
	for _, l := range m.GetLabel() {
		switch l.GetName() {
		case "model_name":
			s.model = l.GetValue()
		case "engine":
			s.engine, s.hasEngine = l.GetValue(), true
		}
	}
	return s
}

// samples returns the series of mf whose value is valid, counting the
// others in p.invalid.
func (p *page) samples(mf *dto.MetricFamily, valid func(float64) bool) []series {
	var out []series
	for _, m := range mf.GetMetric() {
		s := labelled(m)
		switch {
		case m.Gauge != nil:
			s.value = m.GetGauge().GetValue()
		case m.Untyped != nil:
			s.value = m.GetUntyped().GetValue()
		case m.Counter != nil:
			s.value = m.GetCounter().GetValue()
		default:
			s.value = math.NaN()
		}
		if !valid(s.value) {
			p.invalid++
			continue
		}
		out = append(out, s)
	}
	return out
}

// engines returns the engine labels of the page's series, sorted.
func (p *page) engines() []string {
	set := map[string]bool{}
	for _, ss := range [][]series{p.waiting, p.running, p.usage, p.blocks} {
		for _, s := range ss {
			if s.hasEngine {
				set[s.engine] = true
			}
		}
	}
	return slices.Sorted(maps.Keys(set))
}

// resolve returns the loads the page gives the ranks (sorted) of a worker
// of model, by rank, and how many series it dropped because their engine
// is none of the ranks. Series of model are used when there are any, else
// every series. Several series of a rank add up (counts) or give their
// maximum (usage, size); a series without engine label counts for every
// rank without one of its own. A rank without any value is left out.
func (p *page) resolve(model string, ranks []uint32) (map[uint32]EngineLoad, int) {
	pick := func(ss []series) []series {
		if slices.ContainsFunc(ss, func(s series) bool { return s.model == model }) {
			return slices.DeleteFunc(slices.Clone(ss), func(s series) bool { return s.model != model })
		}
		return ss
	}
	sets := [4][]series{pick(p.waiting), pick(p.running), pick(p.usage), pick(p.blocks)}
	// Map the engines to ranks: by number, or by position when none is a
	// rank but there are as many as ranks.
	type engine struct {
		label string
		n     uint32
	}
	var engines []engine
	seen := map[string]bool{}
	direct, numeric := false, true
	for _, ss := range sets {
		for _, s := range ss {
			if !s.hasEngine || seen[s.engine] {
				continue
			}
			seen[s.engine] = true
			n, err := strconv.ParseUint(s.engine, 10, 32)
			if err != nil {
				numeric = false
				continue
			}
			engines = append(engines, engine{s.engine, uint32(n)})
			if _, found := slices.BinarySearch(ranks, uint32(n)); found {
				direct = true
			}
		}
	}
	byEngine := map[string]uint32{} // the mapped engines' ranks
	if !direct && numeric && len(engines) == len(ranks) {
		slices.SortFunc(engines, func(a, b engine) int { return cmp.Compare(a.n, b.n) })
		for i, e := range engines {
			byEngine[e.label] = ranks[i]
		}
	} else {
		for _, e := range engines {
			if _, found := slices.BinarySearch(ranks, e.n); found {
				byEngine[e.label] = e.n
			}
		}
	}
	out := make(map[uint32]EngineLoad)
	dropped := 0
	for i, ss := range sets {
		perRank := map[uint32]float64{}
		worker, hasWorker := 0.0, false
		add := func(acc *float64, v float64) {
			if i < 2 {
				*acc += v
			} else {
				*acc = max(*acc, v)
			}
		}
		for _, s := range ss {
			switch {
			case !s.hasEngine:
				if !hasWorker {
					worker, hasWorker = s.value, true
				} else {
					add(&worker, s.value)
				}
			default:
				rank, ok := byEngine[s.engine]
				if !ok {
					dropped++
					continue
				}
				acc, had := perRank[rank]
				if !had {
					acc = s.value
				} else {
					add(&acc, s.value)
				}
				perRank[rank] = acc
			}
		}
		for _, rank := range ranks {
			v, ok := perRank[rank]
			if !ok {
				if !hasWorker {
					continue
				}
				v = worker
			}
			l, seen := out[rank]
			if !seen {
				l = unknownLoad()
			}
			switch i {
			case 0:
				l.Waiting = v
			case 1:
				l.Running = v
			case 2:
				l.KVUsage = v
			case 3:
				l.KVBlocks = v
			}
			out[rank] = l
		}
	}
	// A size alone says nothing of load.
	maps.DeleteFunc(out, func(_ uint32, l EngineLoad) bool {
		return math.IsNaN(l.Waiting) && math.IsNaN(l.Running) && math.IsNaN(l.KVUsage)
	})
	return out, dropped
}

// scrapeTargets returns the workers with a request endpoint.
func (c *Catalog) scrapeTargets() []scrapeTarget {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []scrapeTarget
	for k, w := range c.workers {
		if w.Endpoint != "" && len(w.Ranks) > 0 {
			out = append(out, scrapeTarget{WorkerKey: k, endpoint: w.Endpoint, ranks: slices.Clone(w.Ranks)})
		}
	}
	return out
}

// recordScrape keeps a scrape of t's page u (at time at: its loads by
// rank, or its error) unless t left the catalog or changed endpoint
// meanwhile (then it reports false).
func (c *Catalog) recordScrape(t scrapeTarget, u string, at time.Time, loads map[uint32]EngineLoad, err error, stale time.Duration) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	w := c.workers[t.WorkerKey]
	if w == nil || w.Endpoint != t.endpoint {
		return false
	}
	c.scrape.record(w, u, at, loads, err, stale)
	return true
}
