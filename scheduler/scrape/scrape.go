// Package scrape reads the load each worker's engine reports on its vLLM
// /metrics page (docs/epp-protocol.md, "vLLM metrics"): requests waiting
// in its queue and running, the fraction of its KV cache in use and, when
// it says, the cache's size in blocks. A Scraper fetches the page of every
// catalog worker with a request endpoint, periodically, and keeps, per
// worker, the last values by DP rank and the last error (GET /workers
// shows them: Scraper.Worker); decisions read them as
// scheduler.EngineReports (Scraper.ReadReports), to add the load an engine
// reports beyond the load tracked locally
// (scheduler.CostOptions.MetricsWeight).
//
// It follows the catalog's workers through their changes
// (catalog.Catalog.Watch) and must not touch the loads, the cost or the
// index.
package scrape

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
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/indexer"
	"github.com/kvgate/kvgate/scheduler"
	"github.com/kvgate/kvgate/scheduler/catalog"
)

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

// Defaults of Options.
const (
	defaultTimeout     = 5 * time.Second
	defaultConcurrency = 8
	defaultMaxBytes    = 8 << 20
	// defaultStaleScrapes is how many intervals a scrape counts for.
	defaultStaleScrapes = 3
)

// Options configure a Scraper.
type Options struct {
	// Interval is the period of the scrapes of every worker; 0 turns
	// scraping off (Run returns at once).
	Interval time.Duration
	// Timeout bounds one page's scrape. Default: the interval, at most 5s.
	Timeout time.Duration
	// StaleAfter is the age at which a successful scrape stops counting in
	// the cost (a failed one stops at once). Default 3 intervals (or 15s
	// when the interval is 0).
	StaleAfter time.Duration
	// Concurrency bounds the scrapes in flight. Default 8.
	Concurrency int
	// MaxBytes bounds a page; a longer one is an error. Default 8 MiB.
	MaxBytes int64
	// Client sends the requests. Default: a client of the Scraper's own,
	// whose idle connections Run closes when it returns.
	Client *http.Client
	Logger *slog.Logger
	// Now is the clock of the scrapes and of their freshness; default
	// time.Now. Decisions compare it with their loads' clock.
	Now func() time.Time
}

func unknownLoad() scheduler.EngineLoad {
	return scheduler.EngineLoad{Waiting: math.NaN(), Running: math.NaN(), KVUsage: math.NaN(), KVBlocks: math.NaN()}
}

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
	Ranks map[uint32]scheduler.EngineLoad
}

// store keeps the workers' scrapes: per worker for Worker, and per rank
// for decisions (ReadReports). It follows the catalog's workers (follow),
// and keeps only what their registrations cover.
type store struct {
	mu sync.RWMutex
	// targets are the catalog's workers, as followed.
	targets map[catalog.WorkerKey]target
	workers map[catalog.WorkerKey]*workerScrape
	// ranks holds, per (model, tenant), the ranks of the workers whose
	// last scrape succeeded; a key without one has no entry.
	ranks map[indexer.Key]map[indexer.WorkerRank]scheduler.EngineReport
}

// target is what the store knows of a catalog worker.
type target struct {
	endpoint string
	ranks    []uint32 // sorted
}

type workerScrape struct {
	WorkerScrape // but Fresh
	endpoint     string
	until        time.Time // ScrapedAt + StaleAfter; zero after a failure
}

func newStore() *store {
	return &store{targets: make(map[catalog.WorkerKey]target), workers: make(map[catalog.WorkerKey]*workerScrape),
		ranks: make(map[indexer.Key]map[indexer.WorkerRank]scheduler.EngineReport)}
}

// follow applies a change of the catalog: what is kept of a worker goes
// with it, or with its endpoint, and of a rank with the rank.
func (st *store) follow(ch catalog.Change) {
	st.mu.Lock()
	defer st.mu.Unlock()
	w := ch.Worker
	ws := st.workers[w.WorkerKey]
	if ch.Kind == catalog.Removed {
		delete(st.targets, w.WorkerKey)
		st.forget(w.WorkerKey, ws)
		return
	}
	st.targets[w.WorkerKey] = target{endpoint: w.Endpoint, ranks: w.Ranks}
	if ws == nil {
		return
	}
	if ws.endpoint != w.Endpoint {
		st.forget(w.WorkerKey, ws)
		return
	}
	for rank := range ws.Ranks {
		if _, found := slices.BinarySearch(w.Ranks, rank); !found {
			st.dropRank(w.WorkerKey, ws, rank)
		}
	}
}

// record stores a scrape of t's page url at time at: its loads by rank
// (only the worker's ranks are kept), or its error. It keeps nothing, and
// reports false, when t left the catalog or changed endpoint meanwhile.
func (st *store) record(t scrapeTarget, url string, at time.Time, loads map[uint32]scheduler.EngineLoad, err error, stale time.Duration) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	cur, ok := st.targets[t.WorkerKey]
	if !ok || cur.endpoint != t.endpoint {
		return false
	}
	wk := t.WorkerKey
	ws := st.workers[wk]
	if ws == nil || ws.URL != url {
		st.dropRanks(wk, ws)
		ws = &workerScrape{WorkerScrape: WorkerScrape{URL: url}}
		st.workers[wk] = ws
	}
	ws.endpoint, ws.AttemptedAt = cur.endpoint, at
	st.dropRanks(wk, ws) // a failure stops counting at once
	if err != nil {
		ws.LastError, ws.until = err.Error(), time.Time{}
		return true
	}
	ws.LastError, ws.ScrapedAt, ws.until = "", at, at.Add(stale)
	ws.Ranks = make(map[uint32]scheduler.EngineLoad, len(loads))
	rm := st.ranks[wk.Key]
	for rank, l := range loads {
		if _, found := slices.BinarySearch(cur.ranks, rank); !found {
			continue
		}
		if rm == nil {
			rm = make(map[indexer.WorkerRank]scheduler.EngineReport)
			st.ranks[wk.Key] = rm
		}
		ws.Ranks[rank] = l
		rm[indexer.WorkerRank{Worker: wk.ID, Rank: rank}] = scheduler.EngineReport{EngineLoad: l, Until: ws.until}
	}
	return true
}

// dropRanks removes the decision entries of ws (worker wk, may be nil).
// Call with mu held.
func (st *store) dropRanks(wk catalog.WorkerKey, ws *workerScrape) {
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

// forget drops everything kept of worker wk (ws, may be nil). Call with
// mu held.
func (st *store) forget(wk catalog.WorkerKey, ws *workerScrape) {
	st.dropRanks(wk, ws)
	delete(st.workers, wk)
}

// dropRank drops what is kept of rank of ws (worker wk). Call with mu
// held.
func (st *store) dropRank(wk catalog.WorkerKey, ws *workerScrape, rank uint32) {
	if rm := st.ranks[wk.Key]; rm != nil {
		delete(rm, indexer.WorkerRank{Worker: wk.ID, Rank: rank})
		if len(rm) == 0 {
			delete(st.ranks, wk.Key)
		}
	}
	delete(ws.Ranks, rank)
}

// scrapeTargets returns the workers with a request endpoint.
func (st *store) scrapeTargets() []scrapeTarget {
	st.mu.RLock()
	defer st.mu.RUnlock()
	var out []scrapeTarget
	for wk, t := range st.targets {
		if t.endpoint != "" && len(t.ranks) > 0 {
			out = append(out, scrapeTarget{WorkerKey: wk, endpoint: t.endpoint, ranks: slices.Clone(t.ranks)})
		}
	}
	return out
}

// view returns a copy of what is kept of wk at time now, nil if it was
// never scraped.
func (st *store) view(wk catalog.WorkerKey, now time.Time) *WorkerScrape {
	st.mu.RLock()
	defer st.mu.RUnlock()
	ws := st.workers[wk]
	if ws == nil {
		return nil
	}
	v := ws.WorkerScrape
	v.Fresh = ws.LastError == "" && now.Before(ws.until)
	v.Ranks = maps.Clone(ws.Ranks)
	return &v
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
// <URL>/metrics, less a trailing /v1) and keeps the values by DP rank: a series with label engine="<i>" is rank i's (or, when none
// of the page's engines is a rank of the worker but there are as many,
// the i-th engine is the worker's i-th rank); one without applies to every
// rank. Series whose model_name is the worker's model are preferred. A
// page serving several workers (in other tenants, say) is fetched once.
type Scraper struct {
	st     *store
	opts   Options
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

// Catalog is what a Scraper needs of the worker catalog
// (*catalog.Catalog): its workers' changes.
type Catalog interface {
	Watch(func(catalog.Change))
}

// New returns a scraper of cat's workers, following them from now on.
// reg, if not nil, receives the kvgate_scrape_* metrics.
func New(cat Catalog, opts Options, reg prometheus.Registerer) *Scraper {
	if opts.Timeout <= 0 {
		opts.Timeout = defaultTimeout
		if opts.Interval > 0 {
			opts.Timeout = min(opts.Interval, defaultTimeout)
		}
	}
	if opts.StaleAfter <= 0 {
		opts.StaleAfter = defaultStaleScrapes * cmp.Or(max(opts.Interval, 0), defaultTimeout)
	}
	if opts.Concurrency <= 0 {
		opts.Concurrency = defaultConcurrency
	}
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = defaultMaxBytes
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	s := &Scraper{st: newStore(), opts: opts, log: opts.Logger, client: opts.Client, failing: make(map[string]string),
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
	cat.Watch(s.st.follow)
	return s
}

// Worker returns what the scrapes of worker wk's page found; nil if it was
// never scraped (since it last registered its request endpoint).
func (s *Scraper) Worker(wk catalog.WorkerKey) *WorkerScrape {
	return s.st.view(wk, s.opts.Now())
}

// ReadReports calls f with what the last successful scrapes of key's
// ranks found, each counting until it is stale (scheduler.EngineReports).
func (s *Scraper) ReadReports(key indexer.Key, f func(map[indexer.WorkerRank]scheduler.EngineReport)) {
	s.st.mu.RLock()
	defer s.st.mu.RUnlock()
	f(s.st.ranks[key])
}

// Run scrapes every worker each interval, the first time at once, until
// ctx ends; then it returns nil. With a zero interval it returns at once.
func (s *Scraper) Run(ctx context.Context) error {
	if s.opts.Interval < 0 {
		return fmt.Errorf("%w: scrape interval %s is negative", catalog.ErrInvalid, s.opts.Interval)
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
	catalog.WorkerKey
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
	at := s.opts.Now()
	for _, t := range s.st.scrapeTargets() {
		u, err := metricsURL(t.endpoint)
		if err != nil {
			s.st.record(t, "", at, nil, err, s.opts.StaleAfter)
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
	at := s.opts.Now()
	for _, t := range ts {
		var loads map[uint32]scheduler.EngineLoad
		werr := err
		if err == nil {
			var dropped int
			loads, dropped = p.resolve(t.Key.Model, t.ranks)
			s.m.dropped.WithLabelValues(dropUnknownEngine).Add(float64(dropped))
			if len(loads) == 0 {
				werr = fmt.Errorf("scrape %s: no series for dp ranks %v (engine labels %v)", u, t.ranks, p.engines())
			}
		}
		if !s.st.record(t, u, at, loads, werr, s.opts.StaleAfter) {
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
	if err := catalog.CheckRequestEndpoint(endpoint); err != nil {
		return "", err
	}
	if !strings.Contains(endpoint, "://") {
		return "http://" + endpoint + "/metrics", nil
	}
	u, err := url.Parse(endpoint)
	if err != nil {
		return "", fmt.Errorf("%w: endpoint %.80q: %w", catalog.ErrInvalid, endpoint, err)
	}
	p := strings.TrimSuffix(strings.TrimRight(u.Path, "/"), "/v1")
	v := url.URL{Scheme: u.Scheme, User: u.User, Host: u.Host, Path: p + "/metrics"}
	return v.String(), nil
}
