// Package catalog is the worker catalog: which workers serve which (model,
// tenant), where their requests and KV events go, and whether they may be
// sent requests (catalog.go); workers.go registers them in the selection
// service's shape. Through its Listeners interface (internal/listeners
// adapts the indexer's; main wires them) it starts and stops the KV event
// listeners of its workers' publishers, which also drop a removed worker's
// blocks; it tells its watchers of every worker added, changed or removed
// (Catalog.Watch): that is how the loads and the engine metrics follow it.
// Its View says which workers are schedulable.
//
// It must not touch the loads, the cost, the index's internals, event wire
// formats or HTTP, and imports nothing of the indexer's listener layer.
package catalog

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
)

// Errors of the catalog, which the scheduler shares. The HTTP layer maps
// them to status codes.
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
	// NotSchedulable says why the registration is incomplete (the
	// selection service's not_schedulable_reasons); nil when complete. An
	// incomplete worker has StatusIncomplete and is never a target.
	NotSchedulable []string
}

// Status is the state of a listener, or a worker's aggregated state.
type Status string

// The listener states. A listener starts pending, becomes active once
// connected, goes back to pending when the connection breaks and to failed
// after repeated failed attempts (it keeps retrying); paused listeners are
// disconnected until resumed.
const (
	StatusPending Status = "pending"
	StatusActive  Status = "active"
	StatusFailed  Status = "failed"
	StatusPaused  Status = "paused"
	// StatusIncomplete is a worker's, never a listener's: its registration
	// lacks what a request needs (see Worker.NotSchedulable).
	StatusIncomplete Status = "incomplete"
)

// Listener names the KV event listener of one publisher of a worker rank.
type Listener struct {
	WorkerKey
	Rank      uint32
	BlockSize int // of the worker's index
	Publisher
}

// ListenerState is a listener as the Listeners report it.
type ListenerState struct {
	Listener
	Status    Status
	LastError string // why the last connection attempt or receive failed
	// Seq is the last batch sequence number applied; HasSeq is false until
	// one was.
	Seq    uint64
	HasSeq bool
}

// Listeners are the KV event listeners the catalog starts and stops for
// its workers' publishers. They must be safe for concurrent use.
type Listeners interface {
	// CheckEndpoint checks that endpoint is a publisher endpoint the
	// listeners can connect to.
	CheckEndpoint(endpoint string) error
	// Listen starts the listener of l, or updates it (replay endpoint,
	// topic), creating the index of l.Key with l.BlockSize if needed, and
	// returns without waiting for it to connect. On error nothing changes:
	// an error wrapping ErrUnavailable says the listeners are shut down,
	// any other that l conflicts with a listener or index.
	Listen(l Listener) error
	// Stop stops the listeners of worker wk (of one rank when rank is not
	// nil) and removes the blocks of what it stopped from the index, after
	// the events already queued.
	Stop(ctx context.Context, wk WorkerKey, rank *uint32) error
	// Pause disconnects the listeners of worker wk (one rank when rank is
	// not nil) without forgetting them or their blocks; Resume reconnects
	// them. Both report how many listeners they changed.
	Pause(wk WorkerKey, rank *uint32) int
	Resume(wk WorkerKey, rank *uint32) int
	// States returns the state of every listener.
	States() []ListenerState
	// Generation returns a number that changes whenever a listener is
	// added, removed or changes state.
	Generation() uint64
}

// ChangeKind says what a Change did to a worker.
type ChangeKind uint8

// The kinds of change.
const (
	Added ChangeKind = iota + 1
	Changed
	Removed
)

// Change is one change of a worker in the catalog (see Catalog.Watch).
type Change struct {
	Kind ChangeKind
	// Worker is the worker after the change; when removed, as it was.
	// Watchers must not modify it.
	Worker Worker
	// Gone are the ranks the worker lost: all of them when removed.
	Gone []uint32
}

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

// Options configure a Catalog.
type Options struct {
	Logger *slog.Logger
	// MinInitialWorkers is how many workers must be active at once before
	// the catalog first reports ready (a startup gate that stays open).
	MinInitialWorkers int
	// UnregisterTimeout bounds the removal of a worker's blocks. Default 30s.
	UnregisterTimeout time.Duration
}

// Catalog is the process's one worker catalog. It is safe for concurrent
// use; registrations and removals are serialized.
type Catalog struct {
	set       *indexer.Set
	listeners Listeners
	opts      Options
	log       *slog.Logger

	// opMu serializes changes (a change may wait for the index); mu guards
	// the fields below, briefly, so that reads never wait for a change.
	opMu     sync.Mutex
	mu       sync.Mutex
	workers  map[WorkerKey]*Worker
	open     bool   // the startup gate opened
	holdFor  string // why readiness is held ("" when not)
	watchers []func(Change)

	gen  atomic.Uint64 // bumped on every change of workers
	view atomic.Pointer[View]
}

// View is the set of schedulable workers at one time: View returns the
// same *View until the catalog or a listener changes.
type View struct {
	gen, listenGen uint64
	set            map[indexer.Key]map[uint64]bool // schedulable worker ids per index
	targets        map[indexer.Key][]Target        // the same workers, sorted by id
}

// New returns an empty catalog of the indexes of set, whose workers'
// events feed them through listeners. reg, if not nil, receives the
// kvgate_workers gauges.
func New(set *indexer.Set, listeners Listeners, reg prometheus.Registerer, opts Options) *Catalog {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.UnregisterTimeout <= 0 {
		opts.UnregisterTimeout = 30 * time.Second
	}
	c := &Catalog{set: set, listeners: listeners, opts: opts, log: opts.Logger, workers: make(map[WorkerKey]*Worker)}
	if reg != nil {
		for _, s := range []Status{StatusActive, StatusPending, StatusFailed, StatusPaused} {
			reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name:        "kvgate_workers",
				Help:        "Workers in the catalog, by aggregated status.",
				ConstLabels: prometheus.Labels{"status": string(s)},
			}, func() float64 { return float64(c.countStatus(s)) }))
		}
	}
	return c
}

// Watch calls f with a change Added for every worker already in the
// catalog, then with every change of a worker, in order. f runs under the
// catalog's lock, in the goroutine making the change: it must be quick and
// must not call the catalog.
func (c *Catalog) Watch(f func(Change)) {
	c.opMu.Lock()
	defer c.opMu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range slices.SortedFunc(maps.Keys(c.workers), cmpWorkerKey) {
		f(Change{Kind: Added, Worker: snapshot(c.workers[k])})
	}
	c.watchers = append(c.watchers, f)
}

func cmpWorkerKey(a, b WorkerKey) int {
	return cmp.Or(strings.Compare(a.Model, b.Model), strings.Compare(a.Tenant, b.Tenant), cmp.Compare(a.ID, b.ID))
}

// snapshot returns a copy of w that shares nothing with it.
func snapshot(w *Worker) Worker {
	out := *w
	out.Ranks = slices.Clone(w.Ranks)
	out.Events = maps.Clone(w.Events)
	return out
}

// emit tells the watchers that w changed (kind), losing ranks gone. Call
// with mu held.
func (c *Catalog) emit(kind ChangeKind, w *Worker, gone []uint32) {
	if len(c.watchers) == 0 {
		return
	}
	ch := Change{Kind: kind, Worker: snapshot(w), Gone: gone}
	if kind == Removed && len(gone) == 0 {
		ch.Gone = ch.Worker.Ranks
	}
	for _, f := range c.watchers {
		f(ch)
	}
}

// listenError maps an error of Listeners.Listen to the catalog's.
func listenError(err error) error {
	if errors.Is(err, ErrUnavailable) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrConflict, err)
}

// checkIndex fails with ErrConflict when key's index exists with another
// block size, and with ErrInvalid for one outside 1..indexer.MaxBlockSize.
func (c *Catalog) checkIndex(key indexer.Key, blockSize int) error {
	if key.Model == "" {
		return fmt.Errorf("%w: model_name is required", ErrInvalid)
	}
	if err := checkBlockSize(blockSize); err != nil {
		return err
	}
	if ix := c.set.Lookup(key); ix != nil && ix.BlockSize() != blockSize {
		return fmt.Errorf("%w: model_name %q tenant_id %q has block_size %d, not %d", ErrConflict, key.Model, key.Tenant, ix.BlockSize(), blockSize)
	}
	return nil
}

// checkBlockSize fails with ErrInvalid for a block size outside
// 1..indexer.MaxBlockSize.
func checkBlockSize(n int) error {
	if n < 1 || n > indexer.MaxBlockSize {
		return fmt.Errorf("%w: block_size must be between 1 and %d, not %d", ErrInvalid, indexer.MaxBlockSize, n)
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
	c.mu.Unlock()
	c.opMu.Unlock()
}

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
	return c.View().targets[key]
}

// Schedulable returns the ids of the schedulable workers of key (nil when
// none). Do not modify the map.
func (v *View) Schedulable(key indexer.Key) map[uint64]bool { return v.set[key] }

// View returns the schedulable workers, recomputed only when the catalog
// or its listeners changed.
func (c *Catalog) View() *View {
	gen, ig := c.gen.Load(), c.listeners.Generation()
	if sc := c.view.Load(); sc != nil && sc.gen == gen && sc.listenGen == ig {
		return sc
	}
	sc := &View{gen: gen, listenGen: ig, set: make(map[indexer.Key]map[uint64]bool), targets: make(map[indexer.Key][]Target)}
	for _, w := range c.Workers("", "") { // sorted by id within a key
		if !schedulable(w.Status) {
			continue
		}
		if sc.set[w.Key] == nil {
			sc.set[w.Key] = make(map[uint64]bool)
		}
		sc.set[w.Key][w.ID] = true
		sc.targets[w.Key] = append(sc.targets[w.Key], Target{ID: w.ID, Endpoint: w.Endpoint, Ranks: len(w.Ranks)})
	}
	c.view.Store(sc)
	return sc
}

// Endpoint returns where wk's requests go ("" if unknown).
func (c *Catalog) Endpoint(wk WorkerKey) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if w := c.workers[wk]; w != nil {
		return w.Endpoint
	}
	return ""
}

// NotSchedulable returns why wk's registration is incomplete (nil when
// complete or unknown).
func (c *Catalog) NotSchedulable(wk WorkerKey) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if w := c.workers[normKey(wk)]; w != nil {
		return slices.Clone(w.NotSchedulable)
	}
	return nil
}

// Lookup returns the keys under which worker id is registered, of tenant
// ("" matches any), sorted by model and tenant: a worker id the caller
// scopes to no model may be registered under several.
func (c *Catalog) Lookup(id uint64, tenant string) []WorkerKey {
	c.mu.Lock()
	var out []WorkerKey
	for k := range c.workers {
		if k.ID == id && (tenant == "" || k.Tenant == tenant) {
			out = append(out, k)
		}
	}
	c.mu.Unlock()
	slices.SortFunc(out, cmpWorkerKey)
	return out
}

// add returns the entry of wk, created if needed, and the kind of change
// its registration is. Call with mu held.
func (c *Catalog) add(w *Worker, wk WorkerKey, blockSize int, source string) (*Worker, ChangeKind) {
	if w == nil {
		w = &Worker{WorkerKey: wk, BlockSize: blockSize, Events: make(map[uint32]Publisher), Source: source}
		c.workers[wk] = w
		return w, Added
	}
	return w, Changed
}

// RegisterRank adds one DP rank of a worker with its event publisher and
// starts its listener, creating the worker if needed. Registering the
// same rank again with the same endpoint updates its replay endpoint and
// topic; with another endpoint it is a conflict (unregister the rank
// first). On error nothing changes.
func (c *Catalog) RegisterRank(r RankRegistration) error {
	r.WorkerKey = normKey(r.WorkerKey)
	if err := c.listeners.CheckEndpoint(r.Endpoint); err != nil {
		return fmt.Errorf("%w: endpoint: %w", ErrInvalid, err)
	}
	if r.Replay != "" {
		if err := c.listeners.CheckEndpoint(r.Replay); err != nil {
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
	if err := c.listeners.Listen(Listener{WorkerKey: r.WorkerKey, Rank: r.Rank, BlockSize: r.BlockSize, Publisher: r.Publisher}); err != nil {
		return listenError(err)
	}
	w, kind := c.add(w, r.WorkerKey, r.BlockSize, r.Source)
	w.Events[r.Rank] = r.Publisher
	if i, found := slices.BinarySearch(w.Ranks, r.Rank); !found {
		w.Ranks = slices.Insert(w.Ranks, i, r.Rank)
	}
	c.emit(kind, w, nil)
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
	w, kind := c.add(w, r.WorkerKey, r.BlockSize, r.Source)
	var gone []uint32
	for _, rank := range w.Ranks {
		if rank < r.DPStart || rank-r.DPStart >= r.DPSize {
			gone = append(gone, rank)
		}
	}
	w.Ranks = w.Ranks[:0]
	for i := range r.DPSize {
		w.Ranks = append(w.Ranks, r.DPStart+i)
	}
	c.emit(kind, w, gone)
	c.log.Info("registered worker", "model", r.Key.Model, "tenant", r.Key.Tenant, "worker", r.ID,
		"dp_start", r.DPStart, "dp_size", r.DPSize, "source", r.Source)
	return nil
}

// Unregister removes worker id of model: of one tenant, or of every tenant
// when tenant is nil; one DP rank when rank is not nil, else all of them.
// It stops the listeners and drops the blocks of what it removes; a worker
// left with no rank is removed, and the index of a (model, tenant) left
// with no worker goes with it. It reports how many workers it changed;
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
		if err := c.listeners.Stop(ctx, w.WorkerKey, rank); err != nil {
			errs = append(errs, err)
		}
		c.mu.Lock()
		c.gen.Add(1)
		if rank == nil {
			delete(c.workers, w.WorkerKey)
			c.emit(Removed, w, nil)
		} else {
			was := snapshot(w)
			delete(w.Events, *rank)
			if i, found := slices.BinarySearch(w.Ranks, *rank); found {
				w.Ranks = slices.Delete(w.Ranks, i, i+1)
			}
			if len(w.Ranks) == 0 {
				delete(c.workers, w.WorkerKey)
				c.emit(Removed, &was, nil)
			} else {
				c.emit(Changed, w, []uint32{*rank})
			}
		}
		if c.workers[w.WorkerKey] == nil && !c.keyInUse(w.Key) && c.set.Remove(w.Key) {
			c.log.Info("removed index: its last worker is gone", "model", w.Key.Model, "tenant", w.Key.Tenant)
		}
		c.mu.Unlock()
		c.log.Info("unregistered worker", "model", w.Key.Model, "tenant", w.Key.Tenant, "worker", w.ID, "rank", rankAttr(rank))
	}
	if err := errors.Join(errs...); err != nil {
		return len(hit), fmt.Errorf("%w: removed, but dropping its blocks failed: %w", ErrUnavailable, err)
	}
	return len(hit), nil
}

// keyInUse reports whether a worker of key is in the catalog. Call with
// mu held.
func (c *Catalog) keyInUse(key indexer.Key) bool {
	for k := range c.workers {
		if k.Key == key {
			return true
		}
	}
	return false
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
			n += c.listeners.Pause(k, rank)
		} else {
			n += c.listeners.Resume(k, rank)
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
	Listeners map[uint32]ListenerState // by rank
}

// Workers returns the workers of model and tenant ("" matches any),
// sorted by model, tenant and id, with their listeners' states. Status
// aggregates the listeners: failed > pending > active > paused; a worker
// without listeners is active.
func (c *Catalog) Workers(model, tenant string) []WorkerState {
	byWorker := make(map[WorkerKey][]ListenerState)
	for _, l := range c.listeners.States() {
		byWorker[l.WorkerKey] = append(byWorker[l.WorkerKey], l)
	}
	c.mu.Lock()
	out := make([]WorkerState, 0, len(c.workers))
	for k, w := range c.workers {
		if (model != "" && k.Model != model) || (tenant != "" && k.Tenant != tenant) {
			continue
		}
		ws := WorkerState{Worker: *w, Listeners: make(map[uint32]ListenerState)}
		ws.Ranks = slices.Clone(w.Ranks)
		ws.Events = maps.Clone(w.Events)
		for _, l := range byWorker[k] {
			if p, ok := w.Events[l.Rank]; ok && p.Endpoint == l.Endpoint {
				ws.Listeners[l.Rank] = l
			}
		}
		ws.Status = aggregate(ws.Listeners)
		if len(ws.Listeners) < len(w.Events) && statusRank[ws.Status] < statusRank[StatusPending] {
			// A rank whose listener is gone (being unregistered) or not
			// yet visible is not active.
			ws.Status = StatusPending
		}
		if len(w.NotSchedulable) > 0 {
			ws.Status = StatusIncomplete
			ws.NotSchedulable = slices.Clone(w.NotSchedulable)
		}
		out = append(out, ws)
	}
	c.mu.Unlock()
	slices.SortFunc(out, func(a, b WorkerState) int { return cmpWorkerKey(a.WorkerKey, b.WorkerKey) })
	return out
}

// statusRank orders listener states for aggregation: the highest wins.
var statusRank = map[Status]int{StatusPaused: 1, StatusActive: 2, StatusPending: 3, StatusFailed: 4, StatusIncomplete: 5}

func aggregate(ls map[uint32]ListenerState) Status {
	s := StatusActive
	if len(ls) > 0 {
		s = StatusPaused
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
	Ready  bool
	Reason string // why not ready ("" when ready)
	// Workers counts the workers, ActiveWorkers those whose listeners are
	// all active, Schedulable those that may be sent requests.
	Workers, ActiveWorkers, Schedulable int
	MinInitialWorkers                   int
}

// schedulable reports whether requests may be sent to a worker in status
// s: its events flow (active), or were deliberately paused.
func schedulable(s Status) bool { return s == StatusActive || s == StatusPaused }

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
		if w.Status == StatusActive {
			r.ActiveWorkers++
		}
		if schedulable(w.Status) {
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
