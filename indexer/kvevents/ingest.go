package kvevents

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"github.com/kvgate/kvgate/indexer"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// This file feeds the index from engines: one ZMQ SUB listener per
// registered publisher of a worker rank, with gap detection and replay over
// a DEALER (docs/kv-events.md), decoding (wire.go) and hashing.

// Registration names one KV event publisher of a worker rank.
type Registration struct {
	Key       indexer.Key // the index (model, tenant) the worker serves
	BlockSize int         // tokens per block of that index
	Worker    uint64      // instance id
	Rank      uint32      // data-parallel rank (a batch's own rank overrides it)
	// Endpoint is the engine's PUB socket, e.g. "tcp://10.0.0.5:5557".
	Endpoint string
	// ReplayEndpoint is the engine's replay ROUTER socket; "" when it has
	// none, and gaps are then counted, not recovered.
	ReplayEndpoint string
	Topic          string // subscription prefix; "" receives everything
}

// ListenerStatus is the state of one listener.
type ListenerStatus string

// The listener states. A listener starts pending, becomes active once
// connected, goes back to pending when the connection breaks and to failed
// after repeated failed attempts (it keeps retrying); paused listeners are
// disconnected until resumed.
const (
	StatusPending ListenerStatus = "pending"
	StatusActive  ListenerStatus = "active"
	StatusFailed  ListenerStatus = "failed"
	StatusPaused  ListenerStatus = "paused"
)

// ListenerInfo describes one listener, for the worker views.
type ListenerInfo struct {
	Registration
	Status    ListenerStatus
	LastError string // why the last connection attempt or receive failed
	// Seq is the last batch sequence number applied; HasSeq is false until
	// one was.
	Seq    uint64
	HasSeq bool
}

// IngestOptions configure an Ingester. Zero values take the defaults.
type IngestOptions struct {
	Logger  *slog.Logger // default slog.Default()
	Metrics *Metrics     // default: NewMetrics(nil)
	// MinBackoff and MaxBackoff bound the wait between connection
	// attempts, doubling from min to max. Defaults 100ms and 5s.
	MinBackoff, MaxBackoff time.Duration
	// FailAfter is how many consecutive failed connection attempts turn a
	// listener from pending to failed. Default 3.
	FailAfter int
	// DialTimeout bounds one TCP connection attempt. Default 2s.
	DialTimeout time.Duration
	// ReplayTimeout bounds one replay request, from dial to end marker.
	// Default 5s.
	ReplayTimeout time.Duration
	// LogEvery is the minimum interval between two log lines of the same
	// kind from one listener (malformed payloads, gaps). Default 10s.
	LogEvery time.Duration
}

// ErrRegistration: a registration is invalid or conflicts with another.
var ErrRegistration = errors.New("invalid registration")

// Ingester owns the listeners that feed a Set from engines' KV events. It is
// safe for concurrent use.
type Ingester struct {
	set  *indexer.Set
	opts IngestOptions
	m    *Metrics
	log  *slog.Logger

	ctx    context.Context // ends at Close
	cancel context.CancelFunc

	mu        sync.Mutex
	closed    bool
	listeners map[listenerKey]*listener
	// marks keeps each publisher's sequence watermark across unregister and
	// register, as the spec requires.
	marks map[listenerKey]*mark

	gen atomic.Uint64 // bumped on every listener state change; see Generation
}

// Generation returns a number that changes whenever a listener is added,
// removed or changes state, so that callers can cache what they derive from
// Listeners.
func (g *Ingester) Generation() uint64 { return g.gen.Load() }

// listenerKey identifies a listener: one publisher of one worker rank.
type listenerKey struct {
	worker   uint64
	rank     uint32
	endpoint string
}

// NewIngester returns an Ingester feeding set. Close stops its listeners.
func NewIngester(set *indexer.Set, opts IngestOptions) *Ingester {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Metrics == nil {
		opts.Metrics = NewMetrics(nil)
	}
	if opts.MinBackoff <= 0 {
		opts.MinBackoff = 100 * time.Millisecond
	}
	if opts.MaxBackoff < opts.MinBackoff {
		opts.MaxBackoff = max(5*time.Second, opts.MinBackoff)
	}
	if opts.FailAfter <= 0 {
		opts.FailAfter = 3
	}
	if opts.DialTimeout <= 0 {
		opts.DialTimeout = 2 * time.Second
	}
	if opts.ReplayTimeout <= 0 {
		opts.ReplayTimeout = 5 * time.Second
	}
	if opts.LogEvery <= 0 {
		opts.LogEvery = 10 * time.Second
	}
	g := &Ingester{
		set:       set,
		opts:      opts,
		m:         opts.Metrics,
		log:       opts.Logger,
		listeners: make(map[listenerKey]*listener),
		marks:     make(map[listenerKey]*mark),
	}
	g.ctx, g.cancel = context.WithCancel(context.Background())
	g.m.bindListeners(g.statusCounts)
	return g
}

// ValidateEndpoint checks that endpoint is a ZMQ endpoint kvgate can
// connect to: tcp://host:port or ipc://path.
func ValidateEndpoint(endpoint string) error {
	scheme, addr, ok := strings.Cut(endpoint, "://")
	if !ok || addr == "" {
		return fmt.Errorf("endpoint %q is not transport://address", truncate(endpoint, 80))
	}
	switch scheme {
	case "tcp":
		i := strings.LastIndexByte(addr, ':')
		if i <= 0 || i == len(addr)-1 {
			return fmt.Errorf("endpoint %q has no host:port", truncate(endpoint, 80))
		}
		if strings.Contains(addr[:i], "*") {
			return fmt.Errorf("endpoint %q is a bind address; give the engine's host", truncate(endpoint, 80))
		}
	case "ipc":
	default:
		return fmt.Errorf("endpoint %q: transport %q not supported (tcp, ipc)", truncate(endpoint, 80), scheme)
	}
	return nil
}

// Register starts a listener for r and returns without waiting for it to
// connect. Registering the same publisher again with the same settings is a
// no-op; with other settings (replay endpoint, topic) it restarts the
// listener. The index of r.Key is created with r.BlockSize if needed; a
// block size conflict is an error wrapping ErrBlockSizeConflict. A failed
// registration changes nothing.
func (g *Ingester) Register(r Registration) error {
	if err := ValidateEndpoint(r.Endpoint); err != nil {
		return fmt.Errorf("%w: worker %d rank %d: %w", ErrRegistration, r.Worker, r.Rank, err)
	}
	if r.ReplayEndpoint != "" {
		if err := ValidateEndpoint(r.ReplayEndpoint); err != nil {
			return fmt.Errorf("%w: worker %d rank %d replay: %w", ErrRegistration, r.Worker, r.Rank, err)
		}
	}
	if r.Key.Model == "" {
		return fmt.Errorf("%w: worker %d: model name is empty", ErrRegistration, r.Worker)
	}
	if r.Key.Tenant == "" {
		r.Key.Tenant = indexer.DefaultTenant
	}
	k := listenerKey{r.Worker, r.Rank, r.Endpoint}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return indexer.ErrClosed
	}
	old := g.listeners[k]
	if old != nil {
		if old.reg == r {
			return nil
		}
		if old.reg.Key != r.Key {
			return fmt.Errorf("%w: worker %d rank %d endpoint %s is registered for %s, not %s",
				ErrRegistration, r.Worker, r.Rank, r.Endpoint, old.reg.Key, r.Key)
		}
	}
	// Only now, with every check passed, may the index come into being.
	ix, err := g.set.Index(r.Key, r.BlockSize)
	if err != nil {
		return fmt.Errorf("register worker %d rank %d: %w", r.Worker, r.Rank, err)
	}
	if old != nil {
		old.stop()
	}
	mk := g.marks[k]
	if mk == nil {
		mk = &mark{ranks: make(map[uint32]bool)}
		g.marks[k] = mk
	}
	l := &listener{g: g, reg: r, ix: ix, mark: mk, status: StatusPending}
	g.listeners[k] = l
	g.gen.Add(1)
	l.start()
	return nil
}

// Unregister stops the listeners of worker in key (of one rank when rank is
// not nil, else of all its ranks) and removes the worker's blocks of those
// ranks from the index, after every event already queued. It reports
// whether anything was registered.
func (g *Ingester) Unregister(ctx context.Context, key indexer.Key, worker uint64, rank *uint32) (bool, error) {
	stopped := g.stopMatching(func(l *listener) bool {
		return l.reg.Key == key && l.reg.Worker == worker && (rank == nil || l.reg.Rank == *rank)
	}, true)
	ix := g.set.Lookup(key)
	if ix == nil {
		return len(stopped) > 0, nil
	}
	// Ranks this rank's publishers reported through batch overrides.
	var ranks []uint32
	for _, l := range stopped {
		ranks = append(ranks, l.mark.rankList()...)
	}
	err := g.set.Do(ctx, worker, func() {
		if rank == nil {
			ix.RemoveWorker(worker)
			return
		}
		ix.RemoveWorkerRank(indexer.WorkerRank{Worker: worker, Rank: *rank})
		for _, r := range ranks {
			ix.RemoveWorkerRank(indexer.WorkerRank{Worker: worker, Rank: r})
		}
	})
	if err != nil {
		return len(stopped) > 0, fmt.Errorf("unregister worker %d: %w", worker, err)
	}
	return len(stopped) > 0, nil
}

// Pause disconnects the listeners of a worker (one rank when rank is not
// nil) without forgetting them or their blocks; Resume reconnects them, and
// the gap left while paused is replayed. Both report how many listeners
// they changed.
func (g *Ingester) Pause(key indexer.Key, worker uint64, rank *uint32) int {
	return len(g.stopMatching(func(l *listener) bool {
		return l.reg.Key == key && l.reg.Worker == worker && (rank == nil || l.reg.Rank == *rank) && l.running()
	}, false))
}

// Resume restarts paused listeners; see Pause.
func (g *Ingester) Resume(key indexer.Key, worker uint64, rank *uint32) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, l := range g.listeners {
		if l.reg.Key == key && l.reg.Worker == worker && (rank == nil || l.reg.Rank == *rank) && !l.running() && !g.closed {
			l.setStatus(StatusPending, "")
			l.start()
			n++
		}
	}
	return n
}

// stopMatching stops the listeners for which match is true and waits for
// them; forget removes them, otherwise they stay as paused.
func (g *Ingester) stopMatching(match func(*listener) bool, forget bool) []*listener {
	g.mu.Lock()
	var hit []*listener
	for k, l := range g.listeners {
		if match(l) {
			hit = append(hit, l)
			if forget {
				delete(g.listeners, k)
				g.gen.Add(1)
			}
		}
	}
	g.mu.Unlock()
	for _, l := range hit {
		if stopped := l.stop(); !forget && stopped != nil {
			l.pausedAfter(stopped)
		}
	}
	return hit
}

// Listeners returns every listener, sorted by key, worker, rank and endpoint.
func (g *Ingester) Listeners() []ListenerInfo {
	g.mu.Lock()
	out := make([]ListenerInfo, 0, len(g.listeners))
	for _, l := range g.listeners {
		out = append(out, l.info())
	}
	g.mu.Unlock()
	slices.SortFunc(out, func(a, b ListenerInfo) int {
		return cmp.Or(
			strings.Compare(a.Key.String(), b.Key.String()),
			cmp.Compare(a.Worker, b.Worker),
			cmp.Compare(a.Rank, b.Rank),
			strings.Compare(a.Endpoint, b.Endpoint))
	})
	return out
}

func (g *Ingester) statusCounts() map[ListenerStatus]int {
	counts := make(map[ListenerStatus]int, 4)
	g.mu.Lock()
	for _, l := range g.listeners {
		l.mu.Lock()
		counts[l.status]++
		l.mu.Unlock()
	}
	g.mu.Unlock()
	return counts
}

// Close stops every listener and waits for them. Events they already
// queued stay queued on the Set.
func (g *Ingester) Close() {
	g.mu.Lock()
	g.closed = true
	ls := slices.Collect(maps.Values(g.listeners))
	g.mu.Unlock()
	g.cancel()
	for _, l := range ls {
		l.stop()
	}
}

// truncate shortens outside input quoted in an error message.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
