package indexer

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
)

// This file feeds the index from engines: one ZMQ SUB listener per
// registered publisher of a worker rank, with gap detection and replay over
// a DEALER (docs/kv-events.md), decoding (wire.go) and hashing.

// Registration names one KV event publisher of a worker rank.
type Registration struct {
	Key       Key    // the index (model, tenant) the worker serves
	BlockSize int    // tokens per block of that index
	Worker    uint64 // instance id
	Rank      uint32 // data-parallel rank (a batch's own rank overrides it)
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
	set  *Set
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
func NewIngester(set *Set, opts IngestOptions) *Ingester {
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
		r.Key.Tenant = DefaultTenant
	}
	k := listenerKey{r.Worker, r.Rank, r.Endpoint}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return ErrClosed
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
func (g *Ingester) Unregister(ctx context.Context, key Key, worker uint64, rank *uint32) (bool, error) {
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
		ix.RemoveWorkerRank(WorkerRank{worker, *rank})
		for _, r := range ranks {
			ix.RemoveWorkerRank(WorkerRank{worker, r})
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
func (g *Ingester) Pause(key Key, worker uint64, rank *uint32) int {
	return len(g.stopMatching(func(l *listener) bool {
		return l.reg.Key == key && l.reg.Worker == worker && (rank == nil || l.reg.Rank == *rank) && l.running()
	}, false))
}

// Resume restarts paused listeners; see Pause.
func (g *Ingester) Resume(key Key, worker uint64, rank *uint32) int {
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

// mark is a publisher's replay cursor. Only the publisher's running
// listener writes it (one at a time: a listener is stopped before its
// successor starts); last may be read from anywhere.
type mark struct {
	next  atomic.Uint64 // 1 + last applied sequence number; 0: none yet
	epoch string        // SGLang's topic epoch, when it sends one
	// armed allows one full-buffer resync after an event with an unknown
	// parent; a new connection, a gap or a restart arm it, a resync
	// disarms it, so parents the engine no longer has cost one resync, not
	// one per batch.
	armed bool
	// unknown is 1 + the sequence number of the latest batch with an event
	// whose parent was unknown (set from the apply goroutines).
	unknown atomic.Uint64

	mu    sync.Mutex
	ranks map[uint32]bool // ranks the publisher's batches named
}

func (m *mark) addRank(r uint32) {
	m.mu.Lock()
	m.ranks[r] = true
	m.mu.Unlock()
}

func (m *mark) rankList() []uint32 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Sorted(maps.Keys(m.ranks))
}

func (m *mark) last() (seq uint64, ok bool) {
	n := m.next.Load()
	return n - 1, n > 0
}

// listener consumes one publisher.
type listener struct {
	g    *Ingester
	reg  Registration
	ix   *Index
	mark *mark

	mu        sync.Mutex
	status    ListenerStatus
	lastError string
	cancel    context.CancelFunc
	done      chan struct{}

	// Used only by the run goroutine.
	dec     Decoder
	objects map[uint64]object // Mooncake objects by key hash
	limiter logLimiter
}

// object is what a listener remembers of a Mooncake store object, to apply
// its BlockUpdateEvents, which name it by key only.
type object struct {
	block     Block
	parent    uint64
	hasParent bool
	tiers     Tier
}

func (l *listener) start() {
	ctx, cancel := context.WithCancel(l.g.ctx)
	done := make(chan struct{})
	l.mu.Lock()
	l.cancel, l.done = cancel, done
	l.mu.Unlock()
	go func() {
		defer close(done)
		l.run(ctx)
	}()
}

// stop stops the run goroutine, if any, and waits until it has exited,
// however many callers stop it at once. It returns the stopped
// goroutine's done channel (nil if none ran).
func (l *listener) stop() chan struct{} {
	l.mu.Lock()
	cancel, done := l.cancel, l.done
	l.mu.Unlock()
	if done == nil {
		return nil
	}
	cancel()
	<-done
	return done
}

// running reports whether a run goroutine exists and has not exited; one
// being stopped still counts, so it is never started twice.
func (l *listener) running() bool {
	l.mu.Lock()
	done := l.done
	l.mu.Unlock()
	if done == nil {
		return false
	}
	select {
	case <-done:
		return false
	default:
		return true
	}
}

// pausedAfter marks the listener paused, unless it was restarted after the
// goroutine of done stopped.
func (l *listener) pausedAfter(done chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.done == done {
		l.status = StatusPaused
		l.g.gen.Add(1)
	}
}

func (l *listener) setStatus(s ListenerStatus, lastError string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.status != s {
		l.g.m.transitions.WithLabelValues(string(s)).Inc()
		l.g.gen.Add(1)
	}
	l.status = s
	if s != StatusPaused {
		l.lastError = lastError
	}
}

func (l *listener) info() ListenerInfo {
	l.mu.Lock()
	info := ListenerInfo{Registration: l.reg, Status: l.status, LastError: l.lastError}
	l.mu.Unlock()
	info.Seq, info.HasSeq = l.mark.last()
	return info
}

// run connects, consumes until the connection breaks, and reconnects with
// backoff, until ctx ends.
func (l *listener) run(ctx context.Context) {
	failures := 0
	for {
		sub, err := l.dial(ctx)
		if ctx.Err() != nil {
			if err == nil {
				closeSocket(sub)
			}
			return
		}
		if err == nil {
			failures = 0
			l.setStatus(StatusActive, "")
			l.g.log.Info("kv event listener connected", "worker", l.reg.Worker, "rank", l.reg.Rank, "endpoint", l.reg.Endpoint)
			err = l.consume(ctx, sub)
			closeSocket(sub)
			if ctx.Err() != nil {
				return
			}
			l.g.m.reconnects.Inc()
			l.g.log.Warn("kv event listener disconnected", "worker", l.reg.Worker, "rank", l.reg.Rank, "endpoint", l.reg.Endpoint, "err", err)
		}
		failures++
		status := StatusPending
		if failures >= l.g.opts.FailAfter {
			status = StatusFailed
		}
		l.setStatus(status, err.Error())
		wait := l.g.opts.MinBackoff << min(failures-1, 20)
		if wait > l.g.opts.MaxBackoff || wait <= 0 {
			wait = l.g.opts.MaxBackoff
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// dial connects a SUB socket to the publisher and subscribes.
func (l *listener) dial(ctx context.Context) (zmq4.Socket, error) {
	hs := &handshake{timeout: l.g.opts.DialTimeout}
	sub := zmq4.NewSub(context.WithValue(ctx, handshakeKey{}, hs), zmq4.WithDialerMaxRetries(0),
		zmq4.WithDialerTimeout(l.g.opts.DialTimeout), zmq4.WithAutomaticReconnect(false))
	if err := sub.SetOption(zmq4.OptionSubscribe, l.reg.Topic); err != nil {
		closeSocket(sub)
		return nil, fmt.Errorf("subscribe %q: %w", l.reg.Topic, err)
	}
	if err := dialBounded(sub, hs, l.reg.Endpoint); err != nil {
		closeSocket(sub)
		return nil, fmt.Errorf("connect %s: %w", l.reg.Endpoint, err)
	}
	return sub, nil
}

// zmq4 v0.17.0's Dial waits for the peer's ZMTP greeting without a
// deadline, so a peer that accepts TCP connections and then says nothing
// (a wrong port, a hung engine) would block a listener, and its shutdown,
// forever. kvgate therefore dials tcp endpoints through its own transport,
// registered with zmq4 once, which puts a deadline on the connection until
// the handshake is done.

// boundedTCP is the zmq4 transport name of tcp with a bounded handshake.
const boundedTCP = "kvgate-tcp"

var registerBoundedTCP = sync.OnceValue(func() error {
	return zmq4.RegisterTransport(boundedTCP, boundedTransport{})
})

// handshake travels in the socket's context to the transport: the
// deadline to put on the connection, and the connection, to lift it.
type handshake struct {
	timeout time.Duration
	mu      sync.Mutex
	conn    net.Conn
}

type handshakeKey struct{}

type boundedTransport struct{}

func (boundedTransport) Dial(ctx context.Context, d transport.Dialer, addr string) (net.Conn, error) {
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	// Cancelling the socket's context (stopping the listener) interrupts a
	// handshake in progress; afterwards the socket's Close closes it anyway.
	context.AfterFunc(ctx, func() { conn.Close() })
	if hs, ok := ctx.Value(handshakeKey{}).(*handshake); ok && hs.timeout > 0 {
		if err := conn.SetDeadline(time.Now().Add(hs.timeout)); err != nil {
			conn.Close()
			return nil, err
		}
		hs.mu.Lock()
		hs.conn = conn
		hs.mu.Unlock()
	}
	return conn, nil
}

func (boundedTransport) Listen(context.Context, string) (net.Listener, error) {
	return nil, errors.New("kvgate-tcp is for dialling only")
}

func (boundedTransport) Addr(ep string) (string, error) {
	if _, _, err := net.SplitHostPort(ep); err != nil {
		return "", fmt.Errorf("invalid tcp address %q: %w", ep, err)
	}
	return ep, nil
}

// dialBounded dials endpoint on s, a socket created with hs in its
// context, bounding a tcp handshake by hs.timeout.
func dialBounded(s zmq4.Socket, hs *handshake, endpoint string) error {
	if rest, ok := strings.CutPrefix(endpoint, "tcp://"); ok {
		if err := registerBoundedTCP(); err != nil {
			return err
		}
		endpoint = boundedTCP + "://" + rest
	}
	if err := s.Dial(endpoint); err != nil {
		hs.mu.Lock()
		if hs.conn != nil {
			hs.conn.Close() // zmq4 leaves it open when the handshake fails
		}
		hs.mu.Unlock()
		return err
	}
	hs.mu.Lock()
	defer hs.mu.Unlock()
	if hs.conn != nil {
		// Connected: lift the deadline, also for the read already waiting.
		if err := hs.conn.SetDeadline(time.Time{}); err != nil {
			return fmt.Errorf("clear handshake deadline: %w", err)
		}
	}
	return nil
}

// closeSocket closes a zmq4 socket and drains what its reader goroutines
// may still be trying to hand over, so none of them stays blocked.
func closeSocket(s zmq4.Socket) {
	_ = s.Close()
	// On a closed socket Recv picks at random between failing and handing
	// over a queued message: drain until it has failed 64 times in a row.
	for misses := 0; misses < 64; {
		if _, err := s.Recv(); err != nil {
			misses++
		} else {
			misses = 0
		}
	}
}

// consume receives and applies live batches until the connection fails or
// ctx ends.
func (l *listener) consume(ctx context.Context, sub zmq4.Socket) error {
	fresh := true // the first batch of a connection
	for {
		msg, err := sub.Recv()
		if err != nil {
			return fmt.Errorf("receive: %w", err)
		}
		if ctx.Err() != nil {
			// Stopping: leave the batch to the replay after a restart.
			return ctx.Err()
		}
		m := l.g.m
		if len(msg.Frames) != 3 || len(msg.Frames[1]) != 8 {
			m.batchesReceived.Inc()
			m.decodeErrors.Inc()
			m.batchesDropped.WithLabelValues(DropMalformed).Inc()
			l.warn("frames", "kv event message is not [topic, seq(8 bytes), payload]", "frames", len(msg.Frames))
			continue
		}
		seq := binary.BigEndian.Uint64(msg.Frames[1])
		if fresh {
			l.mark.armed = true
		}
		l.handle(ctx, msg.Frames[0], seq, msg.Frames[2], fresh)
		fresh = false
	}
}

// sglEpoch is the marker SGLang appends to the topic to name its
// publisher's lifetime.
var sglEpoch = []byte("\x00sgl-kv-epoch=")

// handle applies one live batch after the gap and restart rules of the
// spec: a restarted engine's blocks are cleared first; a gap is replayed;
// a batch already applied (through replay) is skipped.
func (l *listener) handle(ctx context.Context, topic []byte, seq uint64, payload []byte, fresh bool) {
	m, mk := l.g.m, l.mark
	m.batchesReceived.Inc()
	epoch := ""
	if i := bytes.Index(topic, sglEpoch); i >= 0 {
		e := topic[i+len(sglEpoch):]
		if j := bytes.IndexByte(e, 0); j >= 0 {
			e = e[:j]
		}
		epoch = string(e)
	}
	last, has := mk.last()
	restarted := epoch != "" && mk.epoch != "" && epoch != mk.epoch
	if has && !restarted {
		// A publisher never resends a batch on a new connection, and counts
		// from 0 when it starts: either below the watermark means a restart.
		restarted = seq == 0 || (fresh && seq <= last)
	}
	if epoch != "" {
		mk.epoch = epoch
	}
	if restarted {
		m.restarts.Inc()
		l.g.log.Warn("kv event publisher restarted; clearing its blocks", "worker", l.reg.Worker, "rank", l.reg.Rank,
			"endpoint", l.reg.Endpoint, "seq", seq, "last_seq", last)
		if !l.clearRanks(ctx) {
			return // stopping; the next listener detects the restart again
		}
		mk.next.Store(0)
		mk.unknown.Store(0)
		mk.armed = true
		last, has = 0, false
	}
	if has && seq <= last {
		m.batchesDuplicate.Inc()
		return
	}
	want := uint64(0)
	if has {
		want = last + 1
	}
	lost := LostGap
	if !has {
		lost = LostBeforeJoin
	}
	if u := mk.unknown.Load(); u > 0 && u-1 <= last && mk.armed && l.reg.ReplayEndpoint != "" && has {
		// An event's parent was unknown: events were missed before the
		// cursor. Replay the engine's whole buffer, once until re-armed.
		m.resyncs.Inc()
		mk.armed = false
		l.replay(ctx, 0, true, lost)
		last, has = mk.last()
		want = last + 1
	}
	if seq > want {
		m.gaps.Inc()
		mk.armed = true
		if l.reg.ReplayEndpoint != "" {
			l.replay(ctx, want, false, lost)
			if last, has = mk.last(); has {
				want = last + 1
			}
		}
		if seq > want {
			m.batchesLost.WithLabelValues(lost).Add(float64(seq - want))
			l.warn("gap", "kv event batches missed", "from_seq", want, "to_seq", seq-1, "replay", l.reg.ReplayEndpoint != "")
		}
	}
	if last, has = mk.last(); has && seq <= last {
		m.batchesDuplicate.Inc() // the replay already delivered it
		return
	}
	l.apply(ctx, seq, payload)
}

// clearRanks queues the removal of every block of the ranks this publisher
// reported.
func (l *listener) clearRanks(ctx context.Context) bool {
	l.mark.addRank(l.reg.Rank)
	for _, r := range l.mark.rankList() {
		ev := Event{Kind: Cleared, Worker: WorkerRank{l.reg.Worker, r}, Tier: AllTiers}
		if !l.submit(ctx, ev, 0) {
			return false
		}
	}
	clear(l.objects)
	return true
}

// replay asks the publisher's replay socket for every buffered batch from
// seq from and applies those after the cursor (all of them when resync is
// set), until the end marker, an error or the timeout. Batches the buffer
// no longer holds are counted lost, for reason lost.
func (l *listener) replay(ctx context.Context, from uint64, resync bool, lost string) {
	m := l.g.m
	rctx, cancel := context.WithTimeout(ctx, l.g.opts.ReplayTimeout)
	defer cancel()
	hs := &handshake{timeout: l.g.opts.DialTimeout}
	dealer := zmq4.NewDealer(context.WithValue(rctx, handshakeKey{}, hs), zmq4.WithDialerMaxRetries(0),
		zmq4.WithDialerTimeout(l.g.opts.DialTimeout))
	defer closeSocket(dealer)
	fail := func(err error) {
		m.replayFailures.Inc()
		l.warn("replay", "kv event replay failed", "replay_endpoint", l.reg.ReplayEndpoint, "from_seq", from, "err", err)
	}
	if err := dialBounded(dealer, hs, l.reg.ReplayEndpoint); err != nil {
		fail(err)
		return
	}
	var req [8]byte
	binary.BigEndian.PutUint64(req[:], from)
	if err := dealer.SendMulti(zmq4.NewMsgFrom([]byte{}, req[:])); err != nil {
		fail(err)
		return
	}
	// A resync re-applies batches at or below the cursor: it is applied
	// only once the end marker came, so that a partial one never brings
	// back blocks whose removal it did not get to.
	type held struct {
		seq     uint64
		payload []byte
	}
	var resyncs []held
	for {
		msg, err := dealer.Recv()
		if err != nil {
			fail(err)
			return
		}
		if ctx.Err() != nil {
			return // stopping
		}
		seq, payload, end, ok := parseReply(msg.Frames)
		if !ok {
			m.decodeErrors.Inc()
			m.batchesDropped.WithLabelValues(DropMalformed).Inc()
			l.warn("frames", "malformed replay reply", "frames", len(msg.Frames))
			continue
		}
		if end {
			for _, h := range resyncs {
				m.batchesReplayed.Inc()
				if !l.apply(ctx, h.seq, h.payload) {
					return
				}
			}
			return
		}
		if seq < from {
			continue
		}
		if resync {
			resyncs = append(resyncs, held{seq, payload}) // zmq4 frames are not reused
			continue
		}
		last, has := l.mark.last()
		if has && seq <= last && !resync {
			continue
		}
		if next := max(from, last+1); !resync && seq > next {
			m.batchesLost.WithLabelValues(lost).Add(float64(seq - next))
			l.warn("gap", "kv event batches no longer in the replay buffer", "from_seq", next, "to_seq", seq-1)
		}
		m.batchesReplayed.Inc()
		if !l.apply(ctx, seq, payload) {
			return
		}
	}
}

// parseReply reads one replay reply: ["", topic, seq8, payload] (vLLM >=
// 0.26) or ["", seq8, payload] (older vLLM, SGLang), with or without the
// leading delimiter. An empty payload or an all-0xFF sequence ends the
// replay.
func parseReply(frames [][]byte) (seq uint64, payload []byte, end, ok bool) {
	if len(frames) > 0 && len(frames[0]) == 0 && len(frames) >= 3 {
		frames = frames[1:]
	}
	switch len(frames) {
	case 2: // seq8, payload
	case 3: // topic, seq8, payload
		frames = frames[1:]
	default:
		return 0, nil, false, false
	}
	if len(frames[0]) != 8 {
		return 0, nil, false, false
	}
	seq = binary.BigEndian.Uint64(frames[0])
	if seq == ^uint64(0) || len(frames[1]) == 0 {
		return seq, nil, true, true
	}
	return seq, frames[1], false, true
}

// apply decodes a batch, hashes its events and queues them, then advances
// the cursor to seq. A batch that does not decode is counted and skipped.
// It reports false, leaving the cursor, when the listener is stopping and
// not every event could be queued: the batch is replayed when it resumes.
func (l *listener) apply(ctx context.Context, seq uint64, payload []byte) bool {
	m, mk := l.g.m, l.mark
	advance := func() bool {
		if seq+1 > mk.next.Load() {
			mk.next.Store(seq + 1)
		}
		return true
	}
	b, err := l.dec.Decode(payload)
	if err != nil {
		m.decodeErrors.Inc()
		m.batchesDropped.WithLabelValues(DropMalformed).Inc()
		l.warn("decode", "malformed kv event batch", "seq", seq, "err", err)
		return advance()
	}
	rank := l.reg.Rank
	if b.HasRank {
		rank = b.Rank
	}
	mk.addRank(rank)
	wr := WorkerRank{l.reg.Worker, rank}
	for i := range b.Events {
		we := &b.Events[i]
		m.eventsReceived.WithLabelValues(we.Kind.String()).Inc()
		if we.Skip != "" {
			m.eventsIgnored.WithLabelValues(we.Skip).Inc()
			continue
		}
		for _, ev := range l.convert(wr, we) {
			if !l.submit(ctx, ev, seq) {
				return false
			}
		}
	}
	return advance()
}

// submit queues ev; seq is its batch, for unknown-parent tracking. It
// reports false when ctx ended first (the event is counted dropped).
func (l *listener) submit(ctx context.Context, ev Event, seq uint64) bool {
	m, mk := l.g.m, l.mark
	kind := ev.Kind.String()
	err := l.g.set.Submit(ctx, l.ix, ev, func(res ApplyResult, err error) {
		m.blocksStored.Add(float64(res.Stored))
		m.blocksRemoved.Add(float64(res.Removed))
		m.blocksUnknown.Add(float64(res.Unknown))
		switch {
		case err == nil:
			m.eventsApplied.WithLabelValues(kind).Inc()
		case errors.Is(err, ErrUnknownParent):
			m.eventsDropped.WithLabelValues(DropUnknownParent).Inc()
			for {
				old := mk.unknown.Load()
				if old >= seq+1 || mk.unknown.CompareAndSwap(old, seq+1) {
					break
				}
			}
		default:
			m.eventsDropped.WithLabelValues(DropInvalid).Inc()
		}
	})
	if err != nil {
		m.eventsDropped.WithLabelValues(DropShutdown).Inc()
		return false
	}
	return true
}

// convert turns a decoded event into index events: blocks hashed with the
// index's block size, Mooncake objects resolved.
func (l *listener) convert(wr WorkerRank, we *WireEvent) []Event {
	m := l.g.m
	switch we.Kind {
	case WireCleared:
		if we.Tier&TierDevice == 0 {
			clear(l.objects)
		}
		return []Event{{Kind: Cleared, Worker: wr, Tier: we.Tier}}
	case WireRemoved:
		hashes := slices.Clone(we.Hashes)
		if len(hashes) == 0 && we.HasObject {
			if o, ok := l.objects[we.Object]; ok {
				hashes = append(hashes, o.block.Hash)
				delete(l.objects, we.Object)
			}
		}
		if len(hashes) == 0 {
			m.eventsDropped.WithLabelValues(DropEmpty).Inc()
			return nil
		}
		return []Event{{Kind: Removed, Worker: wr, Tier: we.Tier, Hashes: hashes}}
	case WireMoved:
		return l.move(wr, we)
	}
	// Stored.
	if len(we.Hashes) == 0 {
		m.eventsDropped.WithLabelValues(DropEmpty).Inc()
		return nil
	}
	if len(we.Tokens) == 0 {
		// Ids only (Mooncake's store publisher): a tier for known blocks.
		return []Event{{Kind: Stored, Worker: wr, Tier: we.Tier, Hashes: slices.Clone(we.Hashes), ByID: true}}
	}
	bs := l.ix.BlockSize()
	if we.BlockSize != 0 && we.BlockSize != bs {
		m.eventsDropped.WithLabelValues(DropBlockSize).Inc()
		m.blocksDropped.WithLabelValues(DropBlockSize).Add(float64(len(we.Hashes)))
		l.warn("block_size", "kv event block size differs from the registered one", "event_block_size", we.BlockSize, "block_size", bs)
		return nil
	}
	n := min(len(we.Hashes), len(we.Tokens)/bs)
	if n < len(we.Hashes) {
		m.blocksDropped.WithLabelValues(DropPartialBlock).Add(float64(len(we.Hashes) - n))
	}
	if n == 0 {
		m.eventsDropped.WithLabelValues(DropPartialBlock).Inc()
		return nil
	}
	seed := LoRASeed(we.LoRA)
	blocks := make([]Block, n)
	for i := range blocks {
		var extra []uint64
		if i < len(we.Extra) {
			extra = we.Extra[i]
		}
		blocks[i] = Block{Hash: we.Hashes[i], Local: LocalHash(we.Tokens[i*bs:(i+1)*bs], seed, extra)}
	}
	if we.HasObject && n == 1 {
		if l.objects == nil {
			l.objects = make(map[uint64]object)
		}
		l.objects[we.Object] = object{block: blocks[0], parent: we.Parent, hasParent: we.HasParent, tiers: we.Tier}
	}
	return []Event{{Kind: Stored, Worker: wr, Tier: we.Tier, Parent: we.Parent, HasParent: we.HasParent, Blocks: blocks}}
}

// move applies a Mooncake BlockUpdateEvent: the object now occupies
// exactly the tiers of its replicas.
func (l *listener) move(wr WorkerRank, we *WireEvent) []Event {
	o, ok := l.objects[we.Object]
	if !ok {
		l.g.m.eventsDropped.WithLabelValues(DropUnknownObject).Inc()
		return nil
	}
	var evs []Event
	for _, t := range []Tier{TierHost, TierDisk} {
		switch {
		case o.tiers&t != 0 && we.Tier&t == 0:
			evs = append(evs, Event{Kind: Removed, Worker: wr, Tier: t, Hashes: []uint64{o.block.Hash}})
		case o.tiers&t == 0 && we.Tier&t != 0:
			evs = append(evs, Event{Kind: Stored, Worker: wr, Tier: t, Parent: o.parent, HasParent: o.hasParent, Blocks: []Block{o.block}})
		}
	}
	if we.Tier&(TierHost|TierDisk) == 0 {
		delete(l.objects, we.Object)
	} else {
		o.tiers = we.Tier & (TierHost | TierDisk)
		l.objects[we.Object] = o
	}
	return evs
}

// warn logs at most once per LogEvery per kind, with the count of lines
// suppressed since the last one.
func (l *listener) warn(kind, msg string, args ...any) {
	ok, suppressed := l.limiter.allow(kind, l.g.opts.LogEvery)
	if !ok {
		return
	}
	args = append(args, "worker", l.reg.Worker, "rank", l.reg.Rank, "endpoint", l.reg.Endpoint)
	if suppressed > 0 {
		args = append(args, "suppressed", suppressed)
	}
	l.g.log.Warn(msg, args...)
}

// logLimiter allows one log line per kind per interval.
type logLimiter struct {
	mu         sync.Mutex
	last       map[string]time.Time
	suppressed map[string]int
}

func (r *logLimiter) allow(kind string, every time.Duration) (bool, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	if r.last == nil {
		r.last, r.suppressed = make(map[string]time.Time), make(map[string]int)
	}
	if t, ok := r.last[kind]; ok && now.Sub(t) < every {
		r.suppressed[kind]++
		return false, 0
	}
	n := r.suppressed[kind]
	r.last[kind], r.suppressed[kind] = now, 0
	return true, n
}
