// Package scheduler decides where a request goes. It owns the worker
// catalog (which workers serve which (model, tenant), where their requests
// and KV events go, whether they are ready; catalog.go, workers.go), the
// active load booked on each worker rank (load.go), the cost-based
// selection (select.go), the Dynamo slot tracker and selection service
// routes with reservations (service.go, http.go), replica sync of active
// load between kvgate replicas (replica.go), and the load each engine
// reports on its vLLM /metrics page (scrape.go), an optional correction of
// the cost. The protocols are in docs/http-api.md and docs/scheduling.md.
//
// It drives the indexer (an Ingester per process) to start and stop event
// listeners and drop a removed worker's blocks, and must not touch the
// index's internals, event wire formats or HTTP plumbing beyond its routes.
package scheduler

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/indexer"
	"github.com/kvgate/kvgate/indexer/kvevents"
)

// Errors of the catalog. The HTTP layer maps them to status codes.
var (
	ErrInvalid     = errors.New("invalid request")     // 400
	ErrNotFound    = errors.New("not found")           // 404
	ErrConflict    = errors.New("conflict")            // 409
	ErrUnavailable = errors.New("service unavailable") // 503
)

// Sources of a worker's registration.
const (
	SourceConfig = "config" // --workers
	SourceAPI    = "api"    // an HTTP registration
)

// WorkerKey identifies a worker: ids are scoped by (model, tenant).
type WorkerKey struct {
	indexer.Key
	ID uint64
}

func (k WorkerKey) String() string { return fmt.Sprintf("worker %d of %s", k.ID, k.Key) }

// Publisher is the KV event publisher of one worker rank.
type Publisher struct {
	Endpoint string // ZMQ PUB endpoint
	Replay   string // ZMQ ROUTER replay endpoint, "" for none
	Topic    string
}

// Worker is one catalog entry.
type Worker struct {
	WorkerKey
	BlockSize int
	// Endpoint is where the gateway sends the worker's requests
	// (host:port or URL); "" when only its events are known.
	Endpoint string
	Ranks    []uint32             // data-parallel ranks, sorted
	Events   map[uint32]Publisher // KV event publisher by rank
	Source   string
}

// Status is a worker's aggregated listener state.
type Status = kvevents.ListenerStatus

// RankRegistration registers one DP rank of a worker by its KV event
// publisher (the standalone indexer's /register).
type RankRegistration struct {
	WorkerKey
	BlockSize int
	Rank      uint32
	Publisher
	Source string
}

// MaxDPSize bounds a registered DP range: each rank is tracked on its own.
const MaxDPSize = 4096

// RangeRegistration registers a worker's DP range without event endpoints
// (the slot tracker's /register).
type RangeRegistration struct {
	WorkerKey
	BlockSize       int
	DPStart, DPSize uint32
	Source          string
}

// CatalogOptions configure a Catalog.
type CatalogOptions struct {
	Logger *slog.Logger
	// MinInitialWorkers is how many workers must be active at once before
	// the catalog first reports ready (a startup gate that stays open).
	MinInitialWorkers int
	// UnregisterTimeout bounds the removal of a worker's blocks. Default 30s.
	UnregisterTimeout time.Duration
	// Loads is the active-load accounting the catalog keeps in step with
	// its workers' ranks; default a new one (see Catalog.Loads).
	Loads *Loads
}

// Catalog is the process's one worker catalog. It is safe for concurrent
// use; registrations and removals are serialized.
type Catalog struct {
	set    *indexer.Set
	ingest *kvevents.Ingester
	opts   CatalogOptions
	log    *slog.Logger

	// opMu serializes changes (a change may wait for the index); mu guards
	// the fields below, briefly, so that reads never wait for a change.
	opMu    sync.Mutex
	mu      sync.Mutex
	workers map[WorkerKey]*Worker
	open    bool   // the startup gate opened
	holdFor string // why readiness is held ("" when not)

	loads *Loads
	gen   atomic.Uint64 // bumped on every change of workers
	sched atomic.Pointer[schedCache]
	// scrape keeps what the Scraper read of the workers' engines; an
	// entry goes with its worker (or rank).
	scrape scrapeStore
}

// schedCache is the set of schedulable workers, valid while neither the
// catalog nor the ingester's listeners changed.
type schedCache struct {
	gen, ingestGen uint64
	set            map[indexer.Key]map[uint64]bool // schedulable worker ids per index
	targets        map[indexer.Key][]Target        // the same workers, sorted by id
}

// NewCatalog returns an empty catalog whose workers' events feed set
// through ingest. reg, if not nil, receives the kvgate_workers gauges and
// the count of expired requests of its Loads.
func NewCatalog(set *indexer.Set, ingest *kvevents.Ingester, reg prometheus.Registerer, opts CatalogOptions) *Catalog {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.UnregisterTimeout <= 0 {
		opts.UnregisterTimeout = 30 * time.Second
	}
	if opts.Loads == nil {
		opts.Loads = NewLoads(LoadOptions{})
	}
	c := &Catalog{set: set, ingest: ingest, opts: opts, log: opts.Logger, workers: make(map[WorkerKey]*Worker), loads: opts.Loads}
	if reg != nil {
		for _, s := range []Status{kvevents.StatusActive, kvevents.StatusPending, kvevents.StatusFailed, kvevents.StatusPaused} {
			reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name:        "kvgate_workers",
				Help:        "Workers in the catalog, by aggregated status.",
				ConstLabels: prometheus.Labels{"status": string(s)},
			}, func() float64 { return float64(c.countStatus(s)) }))
		}
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "kvgate_scheduler_expired_requests_total",
			Help: "Active requests freed because they outlived the request TTL: their free never came.",
		}, func() float64 { return float64(c.loads.Expired()) }))
	}
	return c
}

// checkIndex fails with ErrConflict when key's index exists with another
// block size, and with ErrInvalid for a non-positive one.
func (c *Catalog) checkIndex(key indexer.Key, blockSize int) error {
	if key.Model == "" {
		return fmt.Errorf("%w: model_name is required", ErrInvalid)
	}
	if blockSize <= 0 {
		return fmt.Errorf("%w: block_size must be positive, not %d", ErrInvalid, blockSize)
	}
	if ix := c.set.Lookup(key); ix != nil && ix.BlockSize() != blockSize {
		return fmt.Errorf("%w: model_name %q tenant_id %q has block_size %d, not %d", ErrConflict, key.Model, key.Tenant, ix.BlockSize(), blockSize)
	}
	return nil
}

func normKey(k WorkerKey) WorkerKey {
	if k.Tenant == "" {
		k.Tenant = indexer.DefaultTenant
	}
	return k
}

// lock takes opMu and mu for a registration of wk and returns wk's entry,
// nil if none, after checking that blockSize agrees with wk's index and
// entry. The caller must call unlock, also on error.
func (c *Catalog) lock(wk WorkerKey, blockSize int) (*Worker, error) {
	c.opMu.Lock()
	c.mu.Lock()
	if err := c.checkIndex(wk.Key, blockSize); err != nil {
		return nil, err
	}
	w := c.workers[wk]
	if w != nil && w.BlockSize != blockSize {
		return nil, fmt.Errorf("%w: %s has block_size %d, not %d", ErrConflict, wk, w.BlockSize, blockSize)
	}
	return w, nil
}

func (c *Catalog) unlock() {
	c.gen.Add(1)
	c.scrape.retain(c.workers) // a change may move a worker or drop ranks
	c.mu.Unlock()
	c.opMu.Unlock()
}

// Loads returns the active-load accounting of the catalog's workers.
func (c *Catalog) Loads() *Loads { return c.loads }

// Target is a schedulable worker as a gateway sees it.
type Target struct {
	ID uint64
	// Endpoint is where its requests go (host:port or URL), "" if unknown.
	Endpoint string
	// Ranks is its number of data-parallel ranks.
	Ranks int
}

// Targets returns the schedulable workers of key, by id. The slice is
// shared until the catalog or a listener changes: do not modify it.
func (c *Catalog) Targets(key indexer.Key) []Target {
	return c.schedView().targets[key]
}

// schedView returns the schedulable workers, recomputed only when the
// catalog or the ingester's listeners changed.
func (c *Catalog) schedView() *schedCache {
	gen, ig := c.gen.Load(), c.ingest.Generation()
	if sc := c.sched.Load(); sc != nil && sc.gen == gen && sc.ingestGen == ig {
		return sc
	}
	sc := &schedCache{gen: gen, ingestGen: ig, set: make(map[indexer.Key]map[uint64]bool), targets: make(map[indexer.Key][]Target)}
	for _, w := range c.Workers("", "") { // sorted by id within a key
		if !Schedulable(w.Status) {
			continue
		}
		if sc.set[w.Key] == nil {
			sc.set[w.Key] = make(map[uint64]bool)
		}
		sc.set[w.Key][w.ID] = true
		sc.targets[w.Key] = append(sc.targets[w.Key], Target{ID: w.ID, Endpoint: w.Endpoint, Ranks: len(w.Ranks)})
	}
	c.sched.Store(sc)
	return sc
}

// endpoint returns where wk's requests go ("" if unknown).
func (c *Catalog) endpoint(wk WorkerKey) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if w := c.workers[wk]; w != nil {
		return w.Endpoint
	}
	return ""
}

// add returns the entry of wk, created if needed. Call with mu held.
func (c *Catalog) add(w *Worker, wk WorkerKey, blockSize int, source string) *Worker {
	if w == nil {
		w = &Worker{WorkerKey: wk, BlockSize: blockSize, Events: make(map[uint32]Publisher), Source: source}
		c.workers[wk] = w
	}
	return w
}

// RegisterRank adds one DP rank of a worker with its event publisher and
// starts its listener, creating the worker if needed. Registering the
// same rank again with the same endpoint updates its replay endpoint and
// topic; with another endpoint it is a conflict (unregister the rank
// first). On error nothing changes.
func (c *Catalog) RegisterRank(r RankRegistration) error {
	r.WorkerKey = normKey(r.WorkerKey)
	if err := kvevents.ValidateEndpoint(r.Endpoint); err != nil {
		return fmt.Errorf("%w: endpoint: %w", ErrInvalid, err)
	}
	if r.Replay != "" {
		if err := kvevents.ValidateEndpoint(r.Replay); err != nil {
			return fmt.Errorf("%w: replay_endpoint: %w", ErrInvalid, err)
		}
	}
	w, err := c.lock(r.WorkerKey, r.BlockSize)
	defer c.unlock()
	if err != nil {
		return err
	}
	if w != nil {
		if p, ok := w.Events[r.Rank]; ok && p.Endpoint != r.Endpoint {
			return fmt.Errorf("%w: %s rank %d already publishes on %s; unregister the rank first", ErrConflict, r.WorkerKey, r.Rank, p.Endpoint)
		}
	}
	err = c.ingest.Register(kvevents.Registration{
		Key: r.Key, BlockSize: r.BlockSize, Worker: r.ID, Rank: r.Rank,
		Endpoint: r.Endpoint, ReplayEndpoint: r.Replay, Topic: r.Topic,
	})
	switch {
	case errors.Is(err, indexer.ErrBlockSizeConflict), errors.Is(err, kvevents.ErrRegistration):
		return fmt.Errorf("%w: %w", ErrConflict, err)
	case errors.Is(err, indexer.ErrClosed):
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	case err != nil:
		return err
	}
	w = c.add(w, r.WorkerKey, r.BlockSize, r.Source)
	w.Events[r.Rank] = r.Publisher
	if i, found := slices.BinarySearch(w.Ranks, r.Rank); !found {
		w.Ranks = slices.Insert(w.Ranks, i, r.Rank)
	}
	c.loads.AddRanks(r.Key, r.BlockSize, indexer.WorkerRank{Worker: r.ID, Rank: r.Rank})
	c.log.Info("registered worker rank", "model", r.Key.Model, "tenant", r.Key.Tenant, "worker", r.ID, "rank", r.Rank,
		"endpoint", r.Endpoint, "replay_endpoint", r.Replay, "source", r.Source)
	return nil
}

// RegisterRange registers a worker's DP range [DPStart, DPStart+DPSize),
// creating the worker or replacing its range. Ranks that publish events
// must stay inside the range. On error nothing changes.
func (c *Catalog) RegisterRange(r RangeRegistration) error {
	r.WorkerKey = normKey(r.WorkerKey)
	if r.DPSize == 0 || r.DPSize > MaxDPSize {
		return fmt.Errorf("%w: dp_size must be between 1 and %d, not %d", ErrInvalid, MaxDPSize, r.DPSize)
	}
	if uint64(r.DPStart)+uint64(r.DPSize) > 1<<32 {
		return fmt.Errorf("%w: dp range %d+%d overflows", ErrInvalid, r.DPStart, r.DPSize)
	}
	w, err := c.lock(r.WorkerKey, r.BlockSize)
	defer c.unlock()
	if err != nil {
		return err
	}
	if w != nil {
		for rank := range w.Events {
			if rank < r.DPStart || rank-r.DPStart >= r.DPSize {
				return fmt.Errorf("%w: %s rank %d publishes events outside dp range %d..%d; unregister it first",
					ErrConflict, r.WorkerKey, rank, r.DPStart, r.DPStart+r.DPSize-1)
			}
		}
	}
	if _, err := c.set.Index(r.Key, r.BlockSize); err != nil {
		return fmt.Errorf("%w: %w", ErrConflict, err)
	}
	w = c.add(w, r.WorkerKey, r.BlockSize, r.Source)
	for _, rank := range w.Ranks {
		if rank < r.DPStart || rank-r.DPStart >= r.DPSize {
			c.loads.RemoveRanks(r.Key, r.ID, &rank)
		}
	}
	w.Ranks = w.Ranks[:0]
	wrs := make([]indexer.WorkerRank, 0, r.DPSize)
	for i := range r.DPSize {
		w.Ranks = append(w.Ranks, r.DPStart+i)
		wrs = append(wrs, indexer.WorkerRank{Worker: r.ID, Rank: r.DPStart + i})
	}
	c.loads.AddRanks(r.Key, r.BlockSize, wrs...)
	c.log.Info("registered worker", "model", r.Key.Model, "tenant", r.Key.Tenant, "worker", r.ID,
		"dp_start", r.DPStart, "dp_size", r.DPSize, "source", r.Source)
	return nil
}

// Unregister removes worker id of model: of one tenant, or of every tenant
// when tenant is nil; one DP rank when rank is not nil, else all of them.
// It stops the listeners and drops the blocks of what it removes; a worker
// left with no rank is removed. It reports how many workers it changed;
// none is ErrNotFound.
func (c *Catalog) Unregister(model string, tenant *string, id uint64, rank *uint32) (int, error) {
	if tenant != nil && *tenant == "" {
		def := indexer.DefaultTenant
		tenant = &def
	}
	c.opMu.Lock()
	defer c.opMu.Unlock()
	c.mu.Lock()
	var hit []*Worker
	for k, w := range c.workers {
		if k.Model != model || k.ID != id || (tenant != nil && k.Tenant != *tenant) {
			continue
		}
		if rank != nil && !slices.Contains(w.Ranks, *rank) {
			continue
		}
		hit = append(hit, w)
	}
	c.mu.Unlock()
	if len(hit) == 0 {
		what := fmt.Sprintf("worker %d of model_name %q", id, model)
		if tenant != nil {
			what += fmt.Sprintf(" tenant_id %q", *tenant)
		}
		if rank != nil {
			what += fmt.Sprintf(" dp_rank %d", *rank)
		}
		return 0, fmt.Errorf("%w: %s is not registered", ErrNotFound, what)
	}
	// The request's own context may end early (a client hanging up); the
	// removal must not stop half way, so it runs on its own deadline.
	ctx, cancel := context.WithTimeout(context.Background(), c.opts.UnregisterTimeout)
	defer cancel()
	var errs []error
	for _, w := range hit {
		if _, err := c.ingest.Unregister(ctx, w.Key, w.ID, rank); err != nil {
			errs = append(errs, err)
		}
		c.loads.RemoveRanks(w.Key, w.ID, rank)
		c.mu.Lock()
		c.gen.Add(1)
		if rank == nil {
			delete(c.workers, w.WorkerKey)
			c.scrape.forget(w.WorkerKey, nil)
		} else {
			delete(w.Events, *rank)
			if i, found := slices.BinarySearch(w.Ranks, *rank); found {
				w.Ranks = slices.Delete(w.Ranks, i, i+1)
			}
			c.scrape.forget(w.WorkerKey, rank)
			if len(w.Ranks) == 0 {
				delete(c.workers, w.WorkerKey)
				c.scrape.forget(w.WorkerKey, nil)
			}
		}
		c.mu.Unlock()
		c.log.Info("unregistered worker", "model", w.Key.Model, "tenant", w.Key.Tenant, "worker", w.ID, "rank", rankAttr(rank))
	}
	if err := errors.Join(errs...); err != nil {
		return len(hit), fmt.Errorf("%w: removed, but dropping its blocks failed: %w", ErrUnavailable, err)
	}
	return len(hit), nil
}

func rankAttr(rank *uint32) any {
	if rank == nil {
		return "all"
	}
	return *rank
}

// SetListeners pauses (pause true) or resumes the listeners of worker id,
// in every model and tenant, of one rank when rank is not nil. It reports
// how many listeners changed; a worker with no such rank is ErrNotFound.
func (c *Catalog) SetListeners(id uint64, rank *uint32, pause bool) (int, error) {
	c.opMu.Lock()
	defer c.opMu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	found, n := false, 0
	for k, w := range c.workers {
		if k.ID != id || (rank != nil && !slices.Contains(w.Ranks, *rank)) {
			continue
		}
		found = true
		if pause {
			n += c.ingest.Pause(k.Key, id, rank)
		} else {
			n += c.ingest.Resume(k.Key, id, rank)
		}
	}
	if !found {
		return 0, fmt.Errorf("%w: worker %d (dp_rank %v) is not registered", ErrNotFound, id, rankAttr(rank))
	}
	return n, nil
}

// WorkerState is a catalog entry with its listeners' states.
type WorkerState struct {
	Worker
	Status    Status
	Listeners map[uint32]kvevents.ListenerInfo // by rank
	// Scrape is what the Scraper read of its engine; nil if never scraped.
	Scrape *WorkerScrape
}

// Workers returns the workers of model and tenant ("" matches any),
// sorted by model, tenant and id, with their listeners' states. Status
// aggregates the listeners: failed > pending > active > paused; a worker
// without listeners is active.
func (c *Catalog) Workers(model, tenant string) []WorkerState {
	byWorker := make(map[WorkerKey][]kvevents.ListenerInfo)
	for _, l := range c.ingest.Listeners() {
		k := WorkerKey{l.Key, l.Worker}
		byWorker[k] = append(byWorker[k], l)
	}
	now := c.loads.now()
	c.mu.Lock()
	out := make([]WorkerState, 0, len(c.workers))
	for k, w := range c.workers {
		if (model != "" && k.Model != model) || (tenant != "" && k.Tenant != tenant) {
			continue
		}
		ws := WorkerState{Worker: *w, Listeners: make(map[uint32]kvevents.ListenerInfo)}
		ws.Ranks = slices.Clone(w.Ranks)
		ws.Events = maps.Clone(w.Events)
		for _, l := range byWorker[k] {
			if p, ok := w.Events[l.Rank]; ok && p.Endpoint == l.Endpoint {
				ws.Listeners[l.Rank] = l
			}
		}
		ws.Scrape = c.scrape.view(w, now)
		ws.Status = aggregate(ws.Listeners)
		if len(ws.Listeners) < len(w.Events) && statusRank[ws.Status] < statusRank[kvevents.StatusPending] {
			// A rank whose listener is gone (being unregistered) or not
			// yet visible is not active.
			ws.Status = kvevents.StatusPending
		}
		out = append(out, ws)
	}
	c.mu.Unlock()
	slices.SortFunc(out, func(a, b WorkerState) int {
		return cmp.Or(strings.Compare(a.Key.Model, b.Key.Model), strings.Compare(a.Key.Tenant, b.Key.Tenant), cmp.Compare(a.ID, b.ID))
	})
	return out
}

// statusRank orders listener states for aggregation: the highest wins.
var statusRank = map[Status]int{kvevents.StatusPaused: 1, kvevents.StatusActive: 2, kvevents.StatusPending: 3, kvevents.StatusFailed: 4}

func aggregate(ls map[uint32]kvevents.ListenerInfo) Status {
	s := kvevents.StatusActive
	if len(ls) > 0 {
		s = kvevents.StatusPaused
	}
	for _, l := range ls {
		if statusRank[l.Status] > statusRank[s] {
			s = l.Status
		}
	}
	return s
}

func (c *Catalog) countStatus(s Status) int {
	n := 0
	for _, w := range c.Workers("", "") {
		if w.Status == s {
			n++
		}
	}
	return n
}

// Readiness explains Ready's answer.
type Readiness struct {
	Ready             bool   `json:"ready"`
	Reason            string `json:"reason,omitempty"`
	Workers           int    `json:"workers"`
	ActiveWorkers     int    `json:"active_workers"`
	Schedulable       int    `json:"schedulable_workers"`
	MinInitialWorkers int    `json:"min_initial_workers"`
}

// Schedulable reports whether requests may be sent to a worker in status
// s: its events flow (active), or were deliberately paused.
func Schedulable(s Status) bool { return s == kvevents.StatusActive || s == kvevents.StatusPaused }

// HoldReady keeps Ready false with reason until HoldReady("") (used while
// recovering the index from a peer).
func (c *Catalog) HoldReady(reason string) {
	c.mu.Lock()
	c.holdFor = reason
	c.mu.Unlock()
}

// Ready reports whether kvgate may serve (docs/scheduling.md): no
// hold, the startup gate open, and at least one schedulable worker. The
// gate opens, for good, once MinInitialWorkers workers are active at the
// same time.
func (c *Catalog) Ready() Readiness {
	ws := c.Workers("", "")
	r := Readiness{Workers: len(ws), MinInitialWorkers: c.opts.MinInitialWorkers}
	for _, w := range ws {
		if w.Status == kvevents.StatusActive {
			r.ActiveWorkers++
		}
		if Schedulable(w.Status) {
			r.Schedulable++
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.holdFor != "" {
		r.Reason = c.holdFor
		return r
	}
	if !c.open && r.ActiveWorkers >= c.opts.MinInitialWorkers {
		c.open = true
		c.log.Info("startup gate open", "active_workers", r.ActiveWorkers, "min_initial_workers", c.opts.MinInitialWorkers)
	}
	switch {
	case !c.open:
		r.Reason = fmt.Sprintf("waiting for %d active workers (%d active of %d registered)", c.opts.MinInitialWorkers, r.ActiveWorkers, r.Workers)
	case r.Schedulable == 0:
		r.Reason = fmt.Sprintf("no schedulable worker (%d registered, none active)", r.Workers)
	default:
		r.Ready = true
	}
	return r
}
