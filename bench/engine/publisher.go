package engine

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
)

// ReplyStyle selects the framing of replay replies.
type ReplyStyle int

const (
	// ReplyWithTopic frames each replayed batch as ["", topic, seq8,
	// payload] and ends with ["", "", 0xFF*8, ""] (vLLM >= 0.26).
	ReplyWithTopic ReplyStyle = iota
	// ReplyLegacy frames each replayed batch as ["", seq8, payload] and ends
	// with ["", 0xFF*8, ""] (older vLLM, SGLang).
	ReplyLegacy
)

func (s ReplyStyle) String() string {
	switch s {
	case ReplyWithTopic:
		return "with-topic"
	case ReplyLegacy:
		return "legacy"
	}
	return fmt.Sprintf("ReplyStyle(%d)", int(s))
}

// DefaultBufferSteps is the replay ring size when Config.BufferSteps is 0,
// vLLM's default.
const DefaultBufferSteps = 10000

// EndSeq is the sequence number of the end marker that closes a replay.
const EndSeq = ^uint64(0)

// ErrClosed is returned by a Publisher's methods after Close.
var ErrClosed = errors.New("engine: publisher closed")

// Config describes one engine publisher: where it binds and how it encodes.
type Config struct {
	// Endpoint is the PUB socket's bind address, e.g. "tcp://127.0.0.1:0"
	// (port 0 picks a free port, "*" binds all interfaces).
	Endpoint string
	// ReplayEndpoint is the ROUTER socket's bind address; "" means no
	// replay socket.
	ReplayEndpoint string
	// Topic is the first frame of every live message (and of every
	// ReplyWithTopic reply).
	Topic string
	// BufferSteps is the number of batches kept for replay; 0 means
	// DefaultBufferSteps.
	BufferSteps int

	Encoding     Encoding
	ReplyStyle   ReplyStyle
	HashEncoding HashEncoding

	// Rank is written as the batch's third element, data_parallel_rank;
	// nil writes nil.
	Rank *int
	// TwoElementBatch writes batches as [ts, events], as older engines do;
	// Rank is then ignored.
	TwoElementBatch bool
	// OmitDefaults leaves nil fields out of map-encoded events and trims
	// trailing nil fields from array-encoded ones, as msgspec's
	// omit_defaults does. extra_keys and group_idx are left out when nil
	// either way.
	OmitDefaults bool

	// Drop, if set, is called with each live batch's sequence number while
	// the publisher's lock is held; when it returns true the batch is not
	// sent on the PUB socket but is still kept for replay, simulating a
	// lossy link. It must not call the Publisher.
	Drop func(seq uint64) bool
	// Now is the clock for batch timestamps; nil means time.Now.
	Now func() time.Time
}

// Publisher is one engine's KV-event publisher: a PUB socket for live
// batches and, optionally, a ROUTER socket replaying recent ones. Its
// methods are safe for concurrent use.
type Publisher struct {
	cfg            Config
	pub            zmq4.Socket
	router         zmq4.Socket // nil without a replay endpoint
	endpoint       string
	replayEndpoint string
	cancel         context.CancelFunc // ends the sockets' context
	replayer       sync.WaitGroup     // the replay goroutine

	mu     sync.Mutex
	next   uint64
	ring   ring
	closed bool
}

// NewPublisher binds cfg.Endpoint (and cfg.ReplayEndpoint, if set) and
// starts serving replay requests. ctx bounds only the setup; the publisher
// lives until Close.
func NewPublisher(ctx context.Context, cfg Config) (*Publisher, error) {
	p, err := newPublisher(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("engine: new publisher: %w", err)
	}
	return p, nil
}

func newPublisher(ctx context.Context, cfg Config) (*Publisher, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if cfg.Endpoint == "" {
		return nil, errors.New("empty endpoint")
	}
	switch {
	case cfg.BufferSteps < 0:
		return nil, fmt.Errorf("negative buffer steps %d", cfg.BufferSteps)
	case cfg.BufferSteps == 0:
		cfg.BufferSteps = DefaultBufferSteps
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}

	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	p := &Publisher{
		cfg:    cfg,
		cancel: cancel,
		ring:   ring{size: cfg.BufferSteps},
	}
	p.pub = zmq4.NewPub(sctx)
	if err := p.pub.Listen(cfg.Endpoint); err != nil {
		_ = p.pub.Close()
		cancel()
		return nil, fmt.Errorf("bind PUB: %w", err)
	}
	p.endpoint = boundEndpoint(cfg.Endpoint, p.pub.Addr())

	if cfg.ReplayEndpoint == "" {
		return p, nil
	}
	p.router = zmq4.NewRouter(sctx)
	if err := p.router.Listen(cfg.ReplayEndpoint); err != nil {
		_ = p.router.Close()
		_ = p.pub.Close()
		cancel()
		return nil, fmt.Errorf("bind replay ROUTER: %w", err)
	}
	p.replayEndpoint = boundEndpoint(cfg.ReplayEndpoint, p.router.Addr())
	p.replayer.Go(p.serveReplays)
	return p, nil
}

// boundEndpoint returns the address clients should dial for a socket bound
// at configured: for TCP the listener's actual address, with a wildcard host
// replaced by 127.0.0.1; otherwise configured itself.
func boundEndpoint(configured string, addr net.Addr) string {
	ta, ok := addr.(*net.TCPAddr)
	if !strings.HasPrefix(configured, "tcp://") || !ok {
		return configured
	}
	host := ta.IP.String()
	if ta.IP == nil || ta.IP.IsUnspecified() {
		host = "127.0.0.1"
	}
	return "tcp://" + net.JoinHostPort(host, strconv.Itoa(ta.Port))
}

// Endpoint returns the address the PUB socket is bound to, e.g.
// "tcp://127.0.0.1:41234".
func (p *Publisher) Endpoint() string { return p.endpoint }

// ReplayEndpoint returns the address the replay ROUTER is bound to, or ""
// when there is none.
func (p *Publisher) ReplayEndpoint() string { return p.replayEndpoint }

// Seq returns the sequence number the next batch will get.
func (p *Publisher) Seq() (next uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.next
}

// Publish encodes events as one batch stamped with the current time and
// publishes it as PublishRaw does.
func (p *Publisher) Publish(events ...Event) (seq uint64, err error) {
	now := p.cfg.Now()
	ts := float64(now.Unix()) + float64(now.Nanosecond())/1e9
	payload, err := EncodeBatch(ts, events, p.cfg)
	if err != nil {
		return 0, err
	}
	return p.publish(payload)
}

// PublishRaw publishes payload as one batch: it takes the next sequence
// number, keeps the batch for replay and, unless Config.Drop says
// otherwise, sends [topic, seq (8 bytes big-endian), payload] on the PUB
// socket. The send is queued; PublishRaw does not wait for the wire.
func (p *Publisher) PublishRaw(payload []byte) (seq uint64, err error) {
	return p.publish(bytes.Clone(payload))
}

func (p *Publisher) publish(payload []byte) (uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return 0, ErrClosed
	}
	seq := p.next
	p.next++
	p.ring.push(batch{seq: seq, payload: payload})
	if p.cfg.Drop != nil && p.cfg.Drop(seq) {
		return seq, nil
	}
	msg := zmq4.NewMsgFrom([]byte(p.cfg.Topic), seqBytes(seq), payload)
	if err := p.pub.SendMulti(msg); err != nil {
		return seq, fmt.Errorf("engine: send batch %d: %w", seq, err)
	}
	return seq, nil
}

// WaitSubscribed returns once at least one subscriber has subscribed to a
// prefix of the topic, so that batches published afterwards reach it. It
// polls the PUB socket's subscriptions until ctx ends.
func (p *Publisher) WaitSubscribed(ctx context.Context) error {
	topics, ok := p.pub.(zmq4.Topics)
	if !ok {
		return fmt.Errorf("engine: PUB socket %T does not list subscriptions", p.pub)
	}
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for {
		p.mu.Lock()
		closed := p.closed
		p.mu.Unlock()
		if closed {
			return ErrClosed
		}
		for _, t := range topics.Topics() {
			if strings.HasPrefix(p.cfg.Topic, t) {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("engine: wait for a subscriber to %q: %w", p.cfg.Topic, ctx.Err())
		case <-tick.C:
		}
	}
}

// Close stops the replay goroutine and closes both sockets. Batches still
// queued on the PUB socket may be lost. Close is idempotent.
func (p *Publisher) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.mu.Unlock()

	var errs []error
	if p.router != nil {
		// Closing the ROUTER ends its context, which fails a pending Recv,
		// and closes its connections, which fails a reply being written.
		if err := closeSocket(p.router); err != nil {
			errs = append(errs, fmt.Errorf("close replay ROUTER: %w", err))
		}
	}
	p.replayer.Wait()
	if err := closeSocket(p.pub); err != nil {
		errs = append(errs, fmt.Errorf("close PUB: %w", err))
	}
	p.cancel()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("engine: close %s: %w", p.endpoint, err)
	}
	return nil
}

// closeSocket closes s. zmq4 reports an error for a connection its peer
// already closed (it is closed, just not yet reaped); that is not a failure.
func closeSocket(s zmq4.Socket) error {
	if err := s.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		return err
	}
	return nil
}

// replayRequest is a well-formed replay request.
type replayRequest struct {
	id    []byte // the requester's ROUTER identity
	start uint64
}

// serveReplays answers replay requests, in order, until the ROUTER is
// closed.
func (p *Publisher) serveReplays() {
	for {
		// zmq4's ROUTER Recv fails only once the socket's context has
		// ended, i.e. after Close.
		msg, err := p.router.Recv()
		if err != nil {
			drainClosed(p.router)
			return
		}
		if req, ok := parseReplayRequest(msg.Frames); ok {
			// An error means the requester went away mid-reply, or Close
			// closed its connection: either way only its replies are lost,
			// and after Close the next Recv fails.
			_ = p.replay(req)
		}
	}
}

// drainClosed empties the receive queue of a closed zmq4 socket, so that a
// connection reader blocked on the full queue (10 messages) can go on, see
// the closed connection and exit. On a closed socket Recv picks at random
// between the ended context and a queued message, so the queue is taken as
// empty after 64 failures in a row: the chance that a full queue survives
// that is 2^-64. A message left in a queue that is not full blocks nobody.
func drainClosed(s zmq4.Socket) {
	for misses := 0; misses < 64; {
		if _, err := s.Recv(); err != nil {
			misses++
		} else {
			misses = 0
		}
	}
}

// parseReplayRequest parses [identity, "", start seq (8 bytes)] as the
// ROUTER delivers a request. Anything else, including a request without the
// empty delimiter, is rejected, as vLLM does.
func parseReplayRequest(frames [][]byte) (replayRequest, bool) {
	if len(frames) != 3 || len(frames[1]) != 0 || len(frames[2]) != 8 {
		return replayRequest{}, false
	}
	return replayRequest{id: frames[0], start: binary.BigEndian.Uint64(frames[2])}, true
}

// replay sends the kept batches with seq >= req.start, then the end marker.
func (p *Publisher) replay(req replayRequest) error {
	p.mu.Lock()
	batches := p.ring.from(req.start)
	p.mu.Unlock()
	topic := []byte(p.cfg.Topic)
	for _, b := range batches {
		if err := p.router.Send(p.reply(req.id, topic, seqBytes(b.seq), b.payload)); err != nil {
			return fmt.Errorf("engine: replay batch %d: %w", b.seq, err)
		}
	}
	// The end marker's topic is empty.
	if err := p.router.Send(p.reply(req.id, nil, seqBytes(EndSeq), nil)); err != nil {
		return fmt.Errorf("engine: replay end marker: %w", err)
	}
	return nil
}

// reply builds one replay message addressed to id in the configured style;
// ReplyLegacy has no topic frame.
func (p *Publisher) reply(id, topic, seq, payload []byte) zmq4.Msg {
	if p.cfg.ReplyStyle == ReplyLegacy {
		return zmq4.NewMsgFrom(id, nil, seq, payload)
	}
	return zmq4.NewMsgFrom(id, nil, topic, seq, payload)
}

func seqBytes(seq uint64) []byte {
	return binary.BigEndian.AppendUint64(nil, seq)
}

// batch is one published batch kept for replay.
type batch struct {
	seq     uint64
	payload []byte
}

// ring keeps the last size batches in publish order.
type ring struct {
	size int
	buf  []batch
	head int // index of the oldest batch once buf is full
}

func (r *ring) push(b batch) {
	if len(r.buf) < r.size {
		r.buf = append(r.buf, b)
		return
	}
	r.buf[r.head] = b
	r.head = (r.head + 1) % r.size
}

// from returns the kept batches with seq >= start, oldest first.
func (r *ring) from(start uint64) []batch {
	var out []batch
	for i := range r.buf {
		b := r.buf[(r.head+i)%len(r.buf)]
		if b.seq >= start {
			out = append(out, b)
		}
	}
	return out
}

// Ranks starts one publisher per data-parallel rank r in [0, n), each with
// Rank = r. An Endpoint or ReplayEndpoint with an explicit port binds rank
// r at port+r, vLLM's offset rule (see OffsetEndpoint); with port 0 each
// rank picks a free port. On error the publishers already started are
// closed.
func Ranks(ctx context.Context, cfg Config, n int) ([]*Publisher, error) {
	if n < 1 {
		return nil, fmt.Errorf("engine: ranks: need at least one rank, got %d", n)
	}
	pubs := make([]*Publisher, 0, n)
	fail := func(err error) ([]*Publisher, error) {
		for _, p := range pubs {
			_ = p.Close()
		}
		return nil, err
	}
	for r := range n {
		c := cfg
		rank := r
		c.Rank = &rank
		var err error
		if c.Endpoint, err = offsetEndpoint(cfg.Endpoint, r); err != nil {
			return fail(fmt.Errorf("engine: rank %d: %w", r, err))
		}
		if cfg.ReplayEndpoint != "" {
			if c.ReplayEndpoint, err = offsetEndpoint(cfg.ReplayEndpoint, r); err != nil {
				return fail(fmt.Errorf("engine: rank %d: %w", r, err))
			}
		}
		p, err := newPublisher(ctx, c)
		if err != nil {
			return fail(fmt.Errorf("engine: rank %d: %w", r, err))
		}
		pubs = append(pubs, p)
	}
	return pubs, nil
}

// OffsetEndpoint returns the endpoint data-parallel rank uses for the base
// endpoint ep, as vLLM derives it: a TCP endpoint's port plus rank (a port
// of 0 or "*" is kept, so every rank picks a free port), an ipc or inproc
// endpoint with "_dp<rank>" appended.
func OffsetEndpoint(ep string, rank int) (string, error) {
	s, err := offsetEndpoint(ep, rank)
	if err != nil {
		return "", fmt.Errorf("engine: %w", err)
	}
	return s, nil
}

func offsetEndpoint(ep string, rank int) (string, error) {
	scheme, addr, ok := strings.Cut(ep, "://")
	if !ok {
		return "", fmt.Errorf("endpoint %q: no transport", ep)
	}
	switch scheme {
	case "tcp":
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			return "", fmt.Errorf("endpoint %q: %w", ep, err)
		}
		if port == "0" || port == "*" {
			return ep, nil
		}
		n, err := strconv.Atoi(port)
		if err != nil {
			return "", fmt.Errorf("endpoint %q: port: %w", ep, err)
		}
		return "tcp://" + net.JoinHostPort(host, strconv.Itoa(n+rank)), nil
	case "ipc", "inproc":
		return fmt.Sprintf("%s_dp%d", ep, rank), nil
	}
	return "", fmt.Errorf("endpoint %q: unsupported transport %q", ep, scheme)
}
