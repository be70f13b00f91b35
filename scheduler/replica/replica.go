// Package replica is replica sync (docs/scheduling.md, "Selection service
// semantics"): kvgate replicas share the admissions, prefill completions
// and frees of their active-load accounting (scheduler.Loads), so that each
// one routes with the load the others booked. Every replica binds a ZMQ PUB
// socket and subscribes to its peers' with SUB sockets.
//
// It owns the wire format and the transport; it must not touch the cost,
// the catalog or HTTP (internal/httpapi serves its peer routes).
package replica

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
	"github.com/kvgate/kvgate/internal/msgpack"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/indexer"
	"github.com/kvgate/kvgate/scheduler"
)

// Replica sync is best effort: no sequencing, acknowledgement, replay or
// resynchronization; output-block updates stay local; events for workers
// this replica does not know are dropped.
//
// Wire format: one two-frame ZMQ message per event,
//
//	["kvgate.replica_sync.v1", msgpack map]
//
// whose map has the keys of replicaMessage: replica_id (uint64, random per
// process, so a replica ignores its own events), kind ("add",
// "prefill_complete" or "free"), model, tenant, request_id and, for an
// add, worker_id, dp_rank, block_size, hashes (the prompt's sequence
// hashes, uint64) and prefill_tokens. Unknown keys are ignored. An add
// whose block_size differs from the receiver's for the (model, tenant) is
// dropped; 0 (unknown to the sender) is not checked.

// syncTopic is the first frame of every replica sync message; SUB
// sockets subscribe to it.
const syncTopic = "kvgate.replica_sync.v1"

// Reasons of kvgate_replica_sync_events_dropped_total.
const (
	replicaDropOwn            = "own"             // an event this replica published
	replicaDropMalformed      = "malformed"       // not a well-formed message
	replicaDropUnknownWorker  = "unknown_worker"  // unknown (model, tenant) or worker rank
	replicaDropUnknownRequest = "unknown_request" // prefill complete / free of a request not active here
	replicaDropDuplicate      = "duplicate"       // an add of a request already active here
	replicaDropBlockSize      = "block_size"      // the (model, tenant) has another block size here
	replicaDropQueueFull      = "queue_full"      // a local event the send queue had no room for
	replicaDropSendError      = "send_error"      // a local event the PUB socket refused
)

var replicaDropReasons = []string{replicaDropOwn, replicaDropMalformed, replicaDropUnknownWorker, replicaDropUnknownRequest,
	replicaDropDuplicate, replicaDropBlockSize, replicaDropQueueFull, replicaDropSendError}

// replicaKinds names the lifecycle kinds on the wire.
var replicaKinds = map[scheduler.LifecycleKind]string{scheduler.LifecycleAdd: "add", scheduler.LifecyclePrefillComplete: "prefill_complete", scheduler.LifecycleFree: "free"}

// Options configure a Replica.
type Options struct {
	// Port is the TCP port of the PUB socket; 0 picks a free one (tests).
	Port int
	// BindHost is the interface the PUB socket binds: "*" (the default)
	// for all of them, "127.0.0.1" for tests.
	BindHost string
	// Peers are the PUB endpoints (tcp://host:port) of the other replicas
	// to subscribe to from the start.
	Peers []string
	// QueueSize bounds the local events waiting to be published; beyond
	// it events are dropped (and counted). Default 4096.
	QueueSize int
	// Timeout bounds a TCP connect and a ZMTP handshake, in both
	// directions, and one write to a subscriber: a peer that stops reading
	// is disconnected instead of stalling the others. Default 2s.
	Timeout time.Duration
	// MinBackoff and MaxBackoff bound the wait between two connection
	// attempts to a peer. Defaults 100ms and 5s.
	MinBackoff, MaxBackoff time.Duration
	Logger                 *slog.Logger
}

// Replica shares the lifecycle events of a scheduler.Loads with other kvgate
// replicas and applies theirs. It is safe for concurrent use.
type Replica struct {
	loads    *scheduler.Loads
	id       uint64
	opts     Options
	log      *slog.Logger
	m        replicaMetrics
	pub      zmq4.Socket
	endpoint string

	ctx    context.Context // ends at Close; parent of every goroutine's
	cancel context.CancelFunc
	queue  chan scheduler.Lifecycle
	wg     sync.WaitGroup // the sender and every peer's goroutine

	mu     sync.Mutex
	peers  map[string]*replicaPeer
	closed bool
	once   sync.Once
}

// replicaPeer is the subscription to one peer.
type replicaPeer struct {
	cancel    context.CancelFunc
	done      chan struct{}
	connected atomic.Bool
}

type replicaMetrics struct {
	received  prometheus.Counter
	applied   *prometheus.CounterVec
	published *prometheus.CounterVec
	dropped   *prometheus.CounterVec
}

// New binds the PUB socket, subscribes to opts.Peers and starts
// publishing the local lifecycle events of loads (it takes the place of
// any observer set with loads.Observe). reg, if not nil, receives the
// kvgate_replica_sync_* metrics. Close releases it all.
func New(loads *scheduler.Loads, reg prometheus.Registerer, opts Options) (*Replica, error) {
	if opts.Port < 0 || opts.Port > 65535 {
		return nil, fmt.Errorf("replica sync port %d is not between 0 and 65535", opts.Port)
	}
	if opts.BindHost == "" {
		opts.BindHost = "*"
	}
	if opts.QueueSize <= 0 {
		opts.QueueSize = 4096
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 2 * time.Second
	}
	if opts.MinBackoff <= 0 {
		opts.MinBackoff = 100 * time.Millisecond
	}
	if opts.MaxBackoff <= 0 {
		opts.MaxBackoff = 5 * time.Second
	}
	opts.MaxBackoff = max(opts.MaxBackoff, opts.MinBackoff)
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	peers := make([]string, 0, len(opts.Peers))
	for _, p := range opts.Peers {
		ep, err := NormalizeEndpoint(p)
		if err != nil {
			return nil, err
		}
		peers = append(peers, ep)
	}
	if err := registerReplicaTransport(); err != nil {
		return nil, err
	}

	r := &Replica{loads: loads, id: randomReplicaID(), opts: opts, log: opts.Logger,
		queue: make(chan scheduler.Lifecycle, opts.QueueSize), peers: make(map[string]*replicaPeer)}
	r.m = newReplicaMetrics()
	r.ctx, r.cancel = context.WithCancel(context.Background())

	// The PUB socket's context is not r.ctx: the sender must be done with
	// it before it closes.
	pctx := context.WithValue(context.Background(), replicaTimeoutKey{}, opts.Timeout)
	r.pub = zmq4.NewPub(pctx, zmq4.WithLogger(slog.NewLogLogger(r.log.Handler(), slog.LevelDebug)))
	// zmq4 queues sends without bound while a subscriber is slow; the
	// high-water mark bounds that queue (zmq4 drops beyond it, uncounted).
	if err := r.pub.SetOption(zmq4.OptionHWM, 4*opts.QueueSize); err != nil {
		_ = r.pub.Close()
		r.cancel()
		return nil, fmt.Errorf("replica sync PUB: %w", err)
	}
	bind := net.JoinHostPort(opts.BindHost, strconv.Itoa(opts.Port))
	if err := r.pub.Listen(replicaTransport + "://" + bind); err != nil {
		_ = r.pub.Close()
		r.cancel()
		if inner := errors.Unwrap(err); inner != nil {
			err = inner // zmq4's wrapping names the internal transport
		}
		return nil, fmt.Errorf("replica sync: bind tcp://%s: %w", bind, err)
	}
	r.endpoint = replicaBoundEndpoint(opts.BindHost, r.pub.Addr())

	if reg != nil {
		reg.MustRegister(r.m.received, r.m.applied, r.m.published, r.m.dropped,
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "kvgate_replica_sync_peers", Help: "Replica sync peers configured.",
			}, func() float64 { n, _ := r.peerCounts(); return float64(n) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "kvgate_replica_sync_peers_connected", Help: "Replica sync peers whose PUB socket this replica is subscribed to.",
			}, func() float64 { _, n := r.peerCounts(); return float64(n) }))
	}

	r.wg.Go(r.send)
	for _, ep := range peers {
		r.addPeer(ep)
	}
	loads.Observe(r.observe)
	r.log.Info("replica sync started", "bind", "tcp://"+bind, "endpoint", r.endpoint, "replica_id", fmt.Sprintf("%016x", r.id), "peers", len(peers))
	return r, nil
}

func newReplicaMetrics() replicaMetrics {
	m := replicaMetrics{
		received: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvgate_replica_sync_events_received_total",
			Help: "Replica sync messages received from peers, well-formed or not.",
		}),
		applied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_replica_sync_events_applied_total",
			Help: "Peers' lifecycle events applied to the local active-load accounting, by kind.",
		}, []string{"kind"}),
		published: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_replica_sync_events_published_total",
			Help: "Local lifecycle events handed to the replica sync PUB socket, by kind.",
		}, []string{"kind"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_replica_sync_events_dropped_total",
			Help: "Replica sync events dropped, by reason: received (own, malformed, unknown_worker, unknown_request, duplicate, block_size) or local (queue_full, send_error).",
		}, []string{"reason"}),
	}
	for _, k := range replicaKinds {
		m.applied.WithLabelValues(k)
		m.published.WithLabelValues(k)
	}
	for _, reason := range replicaDropReasons {
		m.dropped.WithLabelValues(reason)
	}
	return m
}

// randomReplicaID returns a random non-zero id.
func randomReplicaID() uint64 {
	for {
		var b [8]byte
		_, _ = rand.Read(b[:]) // never fails (crypto/rand, Go >= 1.24)
		if id := binary.LittleEndian.Uint64(b[:]); id != 0 {
			return id
		}
	}
}

// Endpoint returns the PUB socket's address for peers to subscribe to,
// tcp://host:port (a wildcard bind host reads as 127.0.0.1).
func (r *Replica) Endpoint() string { return r.endpoint }

func replicaBoundEndpoint(host string, addr net.Addr) string {
	port := 0
	if ta, ok := addr.(*net.TCPAddr); ok {
		port = ta.Port
	}
	if ip := net.ParseIP(host); host == "*" || host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return "tcp://" + net.JoinHostPort(host, strconv.Itoa(port))
}

// NormalizeEndpoint checks that s is a replica sync peer endpoint,
// tcp://host:port with a host name or address (not a wildcard) and a port
// in 1..65535, and returns it with the host in lower case.
func NormalizeEndpoint(s string) (string, error) {
	s = strings.TrimSpace(s)
	bad := func(why string) error {
		q := s
		if len(q) > 100 {
			q = q[:100] + "..."
		}
		return fmt.Errorf("replica sync endpoint %q is not tcp://host:port: %s", q, why)
	}
	rest, ok := strings.CutPrefix(s, "tcp://")
	if !ok {
		return "", bad("want the tcp:// scheme")
	}
	host, port, err := net.SplitHostPort(rest)
	if err != nil {
		return "", bad("no host:port")
	}
	switch {
	case host == "":
		return "", bad("empty host")
	case strings.ContainsAny(host, "*/?#@ "):
		return "", bad("host " + strconv.Quote(host) + " is not a host name or address")
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 || strconv.Itoa(n) != port {
		return "", bad("port " + strconv.Quote(port) + " is not between 1 and 65535")
	}
	return "tcp://" + net.JoinHostPort(strings.ToLower(host), port), nil
}

// AddPeer subscribes to the PUB socket at endpoint (see
// NormalizeEndpoint), connecting in the background and reconnecting
// with backoff. Adding a peer already present does nothing. It reports
// whether the peer was added, false when it was present already.
func (r *Replica) AddPeer(endpoint string) (bool, error) {
	ep, err := NormalizeEndpoint(endpoint)
	if err != nil {
		return false, fmt.Errorf("%w: %w", scheduler.ErrInvalid, err)
	}
	added, open := r.addPeer(ep)
	if !open {
		return false, fmt.Errorf("%w: replica sync is closed", scheduler.ErrUnavailable)
	}
	return added, nil
}

// addPeer starts following ep unless it is followed already, and reports
// whether it did; open is false after Close.
func (r *Replica) addPeer(ep string) (added, open bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false, false
	}
	if r.peers[ep] != nil {
		return false, true
	}
	ctx, cancel := context.WithCancel(r.ctx)
	p := &replicaPeer{cancel: cancel, done: make(chan struct{})}
	r.peers[ep] = p
	r.wg.Go(func() {
		defer close(p.done)
		r.follow(ctx, ep, p)
	})
	r.log.Info("replica sync peer added", "peer", ep)
	return true, true
}

// RemovePeer unsubscribes from endpoint and waits until its connection is
// closed. It reports whether the peer was present.
func (r *Replica) RemovePeer(endpoint string) (bool, error) {
	ep, err := NormalizeEndpoint(endpoint)
	if err != nil {
		return false, fmt.Errorf("%w: %w", scheduler.ErrInvalid, err)
	}
	r.mu.Lock()
	p := r.peers[ep]
	delete(r.peers, ep)
	r.mu.Unlock()
	if p == nil {
		return false, nil
	}
	p.cancel()
	<-p.done
	r.log.Info("replica sync peer removed", "peer", ep)
	return true, nil
}

// Peers returns the peer endpoints, sorted.
func (r *Replica) Peers() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, 0, len(r.peers))
	for ep := range r.peers {
		out = append(out, ep)
	}
	slices.Sort(out)
	return out
}

func (r *Replica) peerCounts() (all, connected int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range r.peers {
		if p.connected.Load() {
			connected++
		}
	}
	return len(r.peers), connected
}

// Close stops publishing, closes every subscription and the PUB socket,
// and waits for the goroutines it started (but zmq4's PUB writer, which
// zmq4 v0.17.0 never stops). It is idempotent.
func (r *Replica) Close() error {
	var err error
	r.once.Do(func() {
		r.loads.Observe(func(scheduler.Lifecycle) {}) // Observe(nil) would make notify call a nil func
		r.mu.Lock()
		r.closed = true
		r.peers = map[string]*replicaPeer{}
		r.mu.Unlock()
		r.cancel()
		r.wg.Wait()
		if e := r.pub.Close(); e != nil && !errors.Is(e, net.ErrClosed) {
			err = fmt.Errorf("replica sync: close PUB: %w", e)
		}
		r.log.Info("replica sync stopped", "endpoint", r.endpoint)
	})
	return err
}

// observe is the scheduler.Loads observer: it queues a local event for the sender,
// dropping it when the queue is full, so that the request path never
// waits for replica sync.
func (r *Replica) observe(ev scheduler.Lifecycle) {
	if ev.Kind == scheduler.LifecycleAdd {
		// The caller may reuse its hashes once the call returns.
		ev.Booking.Hashes = slices.Clone(ev.Booking.Hashes)
	}
	select {
	case r.queue <- ev:
	default:
		r.m.dropped.WithLabelValues(replicaDropQueueFull).Inc()
	}
}

// send publishes queued events until Close.
func (r *Replica) send() {
	for {
		select {
		case <-r.ctx.Done():
			return
		case ev := <-r.queue:
			r.publish(ev)
		}
	}
}

func (r *Replica) publish(ev scheduler.Lifecycle) {
	kind := replicaKinds[ev.Kind]
	msg := replicaMessage{ReplicaID: r.id, Kind: kind, Model: ev.Key.Model, Tenant: ev.Key.Tenant, RequestID: ev.Booking.ID}
	if ev.Kind == scheduler.LifecycleAdd {
		b := ev.Booking
		msg.WorkerID, msg.DPRank, msg.Hashes, msg.PrefillTokens = b.Worker.Worker, b.Worker.Rank, b.Hashes, b.PrefillTokens
		msg.BlockSize, _ = r.loads.BlockSize(ev.Key)
	}
	err := r.pub.SendMulti(zmq4.NewMsgFrom([]byte(syncTopic), msg.append(nil)))
	if err != nil {
		r.m.dropped.WithLabelValues(replicaDropSendError).Inc()
		r.log.Debug("replica sync: publish failed", "kind", kind, "request_id", ev.Booking.ID, "err", err)
		return
	}
	r.m.published.WithLabelValues(kind).Inc()
}

// replicaMessage is the msgpack payload of a replica sync message: a map
// with these keys, the ones after request_id only when not zero.
type replicaMessage struct {
	ReplicaID     uint64   // replica_id
	Kind          string   // kind
	Model         string   // model
	Tenant        string   // tenant
	RequestID     string   // request_id
	WorkerID      uint64   // worker_id
	DPRank        uint32   // dp_rank
	BlockSize     int      // block_size
	Hashes        []uint64 // hashes
	PrefillTokens int64    // prefill_tokens
}

// append appends the message's msgpack encoding to b.
func (m *replicaMessage) append(b []byte) []byte {
	n := 5
	for _, set := range []bool{m.WorkerID != 0, m.DPRank != 0, m.BlockSize != 0, len(m.Hashes) > 0, m.PrefillTokens != 0} {
		if set {
			n++
		}
	}
	b = msgpack.AppendMapHeader(b, n)
	b = msgpack.AppendUint(msgpack.AppendString(b, "replica_id"), m.ReplicaID)
	b = msgpack.AppendString(msgpack.AppendString(b, "kind"), m.Kind)
	b = msgpack.AppendString(msgpack.AppendString(b, "model"), m.Model)
	b = msgpack.AppendString(msgpack.AppendString(b, "tenant"), m.Tenant)
	b = msgpack.AppendString(msgpack.AppendString(b, "request_id"), m.RequestID)
	if m.WorkerID != 0 {
		b = msgpack.AppendUint(msgpack.AppendString(b, "worker_id"), m.WorkerID)
	}
	if m.DPRank != 0 {
		b = msgpack.AppendUint(msgpack.AppendString(b, "dp_rank"), uint64(m.DPRank))
	}
	if m.BlockSize != 0 {
		b = msgpack.AppendInt(msgpack.AppendString(b, "block_size"), int64(m.BlockSize))
	}
	if len(m.Hashes) > 0 {
		b = msgpack.AppendArrayHeader(msgpack.AppendString(b, "hashes"), len(m.Hashes))
		for _, h := range m.Hashes {
			b = msgpack.AppendUint(b, h)
		}
	}
	if m.PrefillTokens != 0 {
		b = msgpack.AppendInt(msgpack.AppendString(b, "prefill_tokens"), m.PrefillTokens)
	}
	return b
}

// decode reads a message from payload: unknown keys are skipped, nil reads
// as zero, and a number out of its field's range is an error.
func (m *replicaMessage) decode(payload []byte) error {
	r := msgpack.NewReader(payload)
	n, err := r.MapLen()
	if err != nil {
		return err
	}
	for range n {
		if r.Peek() != msgpack.Str {
			return r.TypeError("string key")
		}
		k, err := r.Raw()
		if err != nil {
			return err
		}
		var u uint64
		switch key := string(k); key {
		case "replica_id":
			m.ReplicaID, err = replicaUint(&r, key, math.MaxUint64)
		case "kind":
			m.Kind, err = replicaString(&r, key)
		case "model":
			m.Model, err = replicaString(&r, key)
		case "tenant":
			m.Tenant, err = replicaString(&r, key)
		case "request_id":
			m.RequestID, err = replicaString(&r, key)
		case "worker_id":
			m.WorkerID, err = replicaUint(&r, key, math.MaxUint64)
		case "dp_rank":
			u, err = replicaUint(&r, key, math.MaxUint32)
			m.DPRank = uint32(u)
		case "block_size":
			u, err = replicaUint(&r, key, math.MaxInt32)
			m.BlockSize = int(u)
		case "prefill_tokens":
			var big bool
			m.PrefillTokens, big, err = replicaInt(&r)
			if big {
				err = fmt.Errorf("prefill_tokens %d is out of range", uint64(m.PrefillTokens))
			}
		case "hashes":
			m.Hashes, err = replicaHashes(&r)
		default:
			err = r.Skip()
		}
		if err != nil {
			return fmt.Errorf("%s: %w", k, err)
		}
	}
	if !r.Done() {
		return fmt.Errorf("%d bytes after the message", r.Len())
	}
	return nil
}

func replicaString(r *msgpack.Reader, key string) (string, error) {
	if r.Nil() {
		return "", nil
	}
	if t := r.Peek(); t != msgpack.Str && t != msgpack.Bin {
		return "", r.TypeError("string")
	}
	p, err := r.Raw()
	return string(p), err
}

// replicaInt reads an integer or nil (0); see msgpack.Reader.Int for big.
func replicaInt(r *msgpack.Reader) (v int64, big bool, err error) {
	if r.Nil() {
		return 0, false, nil
	}
	return r.Int()
}

func replicaUint(r *msgpack.Reader, key string, limit uint64) (uint64, error) {
	v, big, err := replicaInt(r)
	switch {
	case err != nil:
		return 0, err
	case !big && v < 0 || uint64(v) > limit:
		return 0, fmt.Errorf("%s %d is out of range", key, v)
	}
	return uint64(v), nil
}

func replicaHashes(r *msgpack.Reader) ([]uint64, error) {
	if r.Nil() {
		return nil, nil
	}
	n, err := r.ArrayLen()
	if err != nil {
		return nil, err
	}
	hs := make([]uint64, n)
	for i := range hs {
		if hs[i], err = r.Uint64Bits(); err != nil {
			return nil, err
		}
	}
	return hs, nil
}

// decodeReplicaMessage parses the frames of one message into an event and
// the publisher's replica id.
func decodeReplicaMessage(frames [][]byte) (scheduler.Lifecycle, replicaMessage, error) {
	var m replicaMessage
	if len(frames) != 2 || string(frames[0]) != syncTopic {
		return scheduler.Lifecycle{}, m, fmt.Errorf("want 2 frames [%s, payload], got %d", syncTopic, len(frames))
	}
	if err := m.decode(frames[1]); err != nil {
		return scheduler.Lifecycle{}, m, fmt.Errorf("payload: %w", err)
	}
	ev := scheduler.Lifecycle{Key: indexer.Key{Model: m.Model, Tenant: m.Tenant}, Booking: scheduler.Booking{ID: m.RequestID}}
	for k, name := range replicaKinds {
		if m.Kind == name {
			ev.Kind = k
		}
	}
	switch {
	case m.ReplicaID == 0:
		return ev, m, errors.New("replica_id is missing")
	case ev.Kind == 0:
		return ev, m, fmt.Errorf("kind %q is not add, prefill_complete or free", m.Kind)
	case m.Model == "":
		return ev, m, errors.New("model is missing")
	case m.RequestID == "":
		return ev, m, errors.New("request_id is missing")
	case m.PrefillTokens < 0 || m.PrefillTokens > scheduler.MaxTokens:
		return ev, m, fmt.Errorf("prefill_tokens %d is out of range 0..%d", m.PrefillTokens, int64(scheduler.MaxTokens))
	}
	if ev.Key.Tenant == "" {
		ev.Key.Tenant = indexer.DefaultTenant
	}
	if ev.Kind == scheduler.LifecycleAdd {
		ev.Booking.Worker = indexer.WorkerRank{Worker: m.WorkerID, Rank: m.DPRank}
		ev.Booking.Hashes = m.Hashes
		ev.Booking.PrefillTokens = m.PrefillTokens
	}
	return ev, m, nil
}

// receive applies one message from a peer, or counts why not.
func (r *Replica) receive(frames [][]byte) {
	r.m.received.Inc()
	ev, m, err := decodeReplicaMessage(frames)
	drop := func(reason string, args ...any) {
		r.m.dropped.WithLabelValues(reason).Inc()
		r.log.Debug("replica sync: event dropped", append([]any{"reason", reason, "kind", m.Kind, "request_id", m.RequestID}, args...)...)
	}
	switch {
	case err != nil:
		drop(replicaDropMalformed, "err", err)
		return
	case m.ReplicaID == r.id:
		drop(replicaDropOwn)
		return
	}
	bs, known := r.loads.BlockSize(ev.Key)
	switch {
	case !known:
		drop(replicaDropUnknownWorker, "model", ev.Key.Model, "tenant", ev.Key.Tenant)
		return
	case ev.Kind == scheduler.LifecycleAdd && m.BlockSize != 0 && m.BlockSize != bs:
		drop(replicaDropBlockSize, "block_size", m.BlockSize, "local_block_size", bs)
		return
	}
	changed, err := r.loads.Apply(ev)
	if ev.Kind == scheduler.LifecycleFree && err == nil && !changed {
		// Free is idempotent; a free of nothing is counted as a drop.
		drop(replicaDropUnknownRequest)
		return
	}
	if err != nil {
		switch {
		case errors.Is(err, scheduler.ErrConflict):
			drop(replicaDropDuplicate)
		case errors.Is(err, scheduler.ErrNotFound) && ev.Kind == scheduler.LifecycleAdd:
			drop(replicaDropUnknownWorker, "worker", ev.Booking.Worker.Worker, "dp_rank", ev.Booking.Worker.Rank)
		case errors.Is(err, scheduler.ErrNotFound):
			drop(replicaDropUnknownRequest)
		default:
			drop(replicaDropMalformed, "err", err)
		}
		return
	}
	r.m.applied.WithLabelValues(m.Kind).Inc()
}

// follow subscribes to the peer at ep, applies its events and reconnects
// with backoff, until ctx ends.
func (r *Replica) follow(ctx context.Context, ep string, p *replicaPeer) {
	failures := 0
	for {
		sub, err := r.dial(ctx, ep)
		if ctx.Err() != nil {
			if err == nil {
				closeReplicaSocket(sub)
			}
			return
		}
		if err == nil {
			failures = 0
			p.connected.Store(true)
			r.log.Info("replica sync peer connected", "peer", ep)
			err = r.consume(sub)
			p.connected.Store(false)
			closeReplicaSocket(sub)
			if ctx.Err() != nil {
				return
			}
			r.log.Warn("replica sync peer disconnected", "peer", ep, "err", err)
		} else if failures == 0 {
			r.log.Warn("replica sync peer unreachable; retrying with backoff", "peer", ep, "err", err)
		} else {
			r.log.Debug("replica sync peer still unreachable", "peer", ep, "err", err)
		}
		failures++
		wait := r.opts.MinBackoff << min(failures-1, 20)
		if wait > r.opts.MaxBackoff || wait <= 0 {
			wait = r.opts.MaxBackoff
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

// dial connects a SUB socket to ep and subscribes to syncTopic. The
// socket lives in ctx: cancelling it interrupts a connection attempt and
// a pending receive.
func (r *Replica) dial(ctx context.Context, ep string) (zmq4.Socket, error) {
	sub := zmq4.NewSub(context.WithValue(ctx, replicaTimeoutKey{}, r.opts.Timeout),
		zmq4.WithDialerMaxRetries(0), zmq4.WithDialerTimeout(r.opts.Timeout), zmq4.WithAutomaticReconnect(false),
		zmq4.WithLogger(slog.NewLogLogger(r.log.Handler(), slog.LevelDebug)))
	if err := sub.SetOption(zmq4.OptionSubscribe, syncTopic); err != nil {
		closeReplicaSocket(sub)
		return nil, fmt.Errorf("subscribe: %w", err)
	}
	if err := sub.Dial(replicaTransport + "://" + strings.TrimPrefix(ep, "tcp://")); err != nil {
		closeReplicaSocket(sub)
		return nil, fmt.Errorf("connect %s: %w", ep, err)
	}
	return sub, nil
}

// consume applies received messages until the connection fails or the
// socket's context ends.
func (r *Replica) consume(sub zmq4.Socket) error {
	for {
		msg, err := sub.Recv()
		if err != nil {
			return fmt.Errorf("receive: %w", err)
		}
		r.receive(msg.Frames)
	}
}

// closeReplicaSocket closes a zmq4 socket and drains what its reader
// goroutines may still be handing over, so none of them stays blocked: on
// a closed socket Recv picks at random between failing and handing over a
// queued message, so the queue is taken as empty after 64 failures in a
// row.
func closeReplicaSocket(s zmq4.Socket) {
	_ = s.Close()
	for misses := 0; misses < 64; {
		if _, err := s.Recv(); err != nil {
			misses++
		} else {
			misses = 0
		}
	}
}

// Transport. zmq4 v0.17.0 performs the ZMTP handshake without a deadline,
// on the dialling side in Dial and on the listening side in its accept
// loop: a peer that connects and then says nothing would block a
// subscription, or every later subscriber of the PUB socket, for good. And
// a subscriber that stops reading would stall the PUB socket's writer, and
// so every other subscriber. Replica sync therefore runs over its own tcp
// transport, whose connections read with a deadline until the peer's
// greeting and READY command are in, and write with a deadline always,
// closing the connection when one passes. They also bound the frames a
// peer may announce (see maxSubscriberFrame).

// replicaTransport is the zmq4 transport name of replica sync's tcp.
const replicaTransport = "kvgate-replica-tcp"

var registerReplicaTransport = sync.OnceValue(func() error {
	return zmq4.RegisterTransport(replicaTransport, replicaTCP{})
})

// replicaTimeoutKey carries the connection timeout in a socket's context.
type replicaTimeoutKey struct{}

func replicaTimeout(ctx context.Context) time.Duration {
	if d, ok := ctx.Value(replicaTimeoutKey{}).(time.Duration); ok && d > 0 {
		return d
	}
	return 2 * time.Second
}

type replicaTCP struct{}

func (replicaTCP) Dial(ctx context.Context, d transport.Dialer, addr string) (net.Conn, error) {
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	// Ending the socket's context interrupts a handshake in progress and
	// closes a connection zmq4 left open after a failed one.
	context.AfterFunc(ctx, func() { conn.Close() })
	return newReplicaConn(conn, replicaTimeout(ctx), maxPublisherFrame), nil
}

func (replicaTCP) Listen(ctx context.Context, addr string) (net.Listener, error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return replicaListener{Listener: ln, timeout: replicaTimeout(ctx)}, nil
}

func (replicaTCP) Addr(ep string) (string, error) {
	host, port, err := net.SplitHostPort(ep)
	if err != nil {
		return "", fmt.Errorf("invalid tcp address %q: %w", ep, err)
	}
	if host == "*" {
		host = ""
	}
	return net.JoinHostPort(host, port), nil
}

type replicaListener struct {
	net.Listener
	timeout time.Duration
}

func (l replicaListener) Accept() (net.Conn, error) {
	conn, err := l.Listener.Accept()
	if err != nil {
		if !errors.Is(err, net.ErrClosed) {
			// zmq4's accept loop retries at once: do not let a persistent
			// error (out of file descriptors) spin it.
			time.Sleep(50 * time.Millisecond)
		}
		return nil, err
	}
	return newReplicaConn(conn, l.timeout, maxSubscriberFrame), nil
}

// ZMTP frame size limits: zmq4 allocates the size a frame header declares
// before reading the frame, so an unchecked peer could make kvgate
// allocate without bound. A PUB socket reads only subscriptions from its
// subscribers; a SUB socket reads events.
const (
	maxSubscriberFrame = 64 << 10
	maxPublisherFrame  = 64 << 20
)

// replicaConn is a connection with a bounded handshake, bounded writes and
// bounded frames. Reads happen in one goroutine at a time (zmq4's
// handshake, then its reader), as do writes.
type replicaConn struct {
	net.Conn
	timeout time.Duration
	in      zmtpStream
}

func newReplicaConn(conn net.Conn, timeout time.Duration, maxFrame uint64) *replicaConn {
	_ = conn.SetReadDeadline(time.Now().Add(timeout))
	return &replicaConn{Conn: conn, timeout: timeout, in: zmtpStream{left: zmtpGreetingLen, max: maxFrame}}
}

func (c *replicaConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	shaking := !c.in.handshakeDone()
	if perr := c.in.consume(p[:n]); perr != nil {
		c.Conn.Close()
		return 0, perr
	}
	if shaking {
		switch {
		case c.in.handshakeDone():
			_ = c.Conn.SetReadDeadline(time.Time{})
		case err != nil:
			c.Conn.Close() // zmq4 leaves a connection whose handshake failed open
		}
	}
	return n, err
}

func (c *replicaConn) Write(p []byte) (int, error) {
	_ = c.Conn.SetWriteDeadline(time.Now().Add(c.timeout))
	n, err := c.Conn.Write(p)
	if err != nil {
		// A timed out write may have sent part of a frame, and zmq4 keeps
		// a connection after a timeout: close it, so that zmq4 drops it.
		c.Conn.Close()
	}
	return n, err
}

// zmtpGreetingLen is the length of a ZMTP 3 greeting.
const zmtpGreetingLen = 64

// zmtpStream follows the bytes a peer sends: the 64-byte greeting, then
// frames (flags byte, 1- or 8-byte size, body). The handshake is in once
// the first frame, the peer's READY command (NULL mechanism, the one zmq4
// uses), is.
type zmtpStream struct {
	stage  int    // 0 greeting, 1 flags, 2 size, 3 body
	left   uint64 // bytes left in the stage
	size   uint64 // the current frame's size
	frames int    // complete frames
	max    uint64 // largest frame accepted
}

func (z *zmtpStream) handshakeDone() bool { return z.frames > 0 }

// consume follows b, failing when a frame declares more than z.max bytes.
func (z *zmtpStream) consume(b []byte) error {
	for len(b) > 0 {
		switch z.stage {
		case 0, 3: // skip the greeting or the frame body
			k := min(z.left, uint64(len(b)))
			z.left -= k
			b = b[k:]
			if z.left == 0 {
				if z.stage == 3 {
					z.frames++
				}
				z.stage = 1
			}
		case 1:
			z.stage, z.left, z.size = 2, 1, 0
			if b[0]&0x02 != 0 { // long frame: 8-byte size
				z.left = 8
			}
			b = b[1:]
		case 2:
			z.size = z.size<<8 | uint64(b[0])
			b = b[1:]
			if z.left--; z.left > 0 {
				continue
			}
			if z.size > z.max {
				return frameTooLarge{size: z.size, max: z.max}
			}
			z.stage, z.left = 3, z.size
			if z.size == 0 {
				z.stage = 1
				z.frames++
			}
		}
	}
	return nil
}

// frameTooLarge is a net.Error that is not a timeout, so that zmq4 closes
// the connection.
type frameTooLarge struct{ size, max uint64 }

func (e frameTooLarge) Error() string {
	return fmt.Sprintf("replica sync: peer sent a ZMTP frame of %d bytes, more than %d", e.size, e.max)
}
func (frameTooLarge) Timeout() bool   { return false }
func (frameTooLarge) Temporary() bool { return false }
