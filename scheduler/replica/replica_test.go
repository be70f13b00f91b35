package replica

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/vmihailenco/msgpack/v5"
	"go.uber.org/goleak"

	"github.com/kvgate/kvgate/bench/engine"
	"github.com/kvgate/kvgate/indexer"
	"github.com/kvgate/kvgate/internal/poll"
	"github.com/kvgate/kvgate/internal/stacktest"
	"github.com/kvgate/kvgate/scheduler"
	"github.com/kvgate/kvgate/scheduler/catalog"
)

// Tests of replica sync over real ZMQ sockets on the loopback interface.
// Readiness is waited for, never slept for: a PUB socket delivers to a
// subscriber only once its subscription has arrived, which replicaSubscribed
// observes.

var quiet = slog.New(slog.DiscardHandler)

// closedPort returns a tcp endpoint on a loopback port nobody listens on.
func closedPort(t testing.TB) string { return stacktest.ClosedPort(t) }

var replicaKey = indexer.Key{Model: "m", Tenant: indexer.DefaultTenant}

func replicaWR(w uint64, r uint32) indexer.WorkerRank { return indexer.WorkerRank{Worker: w, Rank: r} }

// newTestReplica starts a replica over loads on 127.0.0.1, closed at the
// end of the test.
func newTestReplica(t *testing.T, loads *scheduler.Loads, opts Options) *Replica {
	t.Helper()
	opts.BindHost = "127.0.0.1"
	if opts.Timeout == 0 {
		opts.Timeout = 500 * time.Millisecond
	}
	opts.MinBackoff, opts.MaxBackoff = 5*time.Millisecond, 50*time.Millisecond
	opts.Logger = quiet
	r, err := New(loads, prometheus.NewRegistry(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.Close(); err != nil {
			t.Error(err)
		}
	})
	return r
}

// addRanks makes ranks of key known to l, with block size bs, as a
// catalog registering their workers does.
func addRanks(l *scheduler.Loads, key indexer.Key, bs int, wrs ...indexer.WorkerRank) {
	for _, wr := range wrs {
		l.Follow(catalog.Change{Kind: catalog.Changed, Worker: catalog.Worker{
			WorkerKey: catalog.WorkerKey{Key: key, ID: wr.Worker}, BlockSize: bs, Ranks: []uint32{wr.Rank}}})
	}
}

// replicaLoads returns loads knowing worker 1 (ranks 0 and 1) and worker 2
// (rank 0) of replicaKey, with block size 4.
func replicaLoads() *scheduler.Loads {
	l := scheduler.NewLoads(scheduler.LoadOptions{})
	addRanks(l, replicaKey, 4, replicaWR(1, 0), replicaWR(1, 1), replicaWR(2, 0))
	return l
}

// replicaSubscribed reports whether a subscriber's subscription reached r's
// PUB socket: what r publishes from now on reaches it.
func replicaSubscribed(r *Replica) bool {
	return slices.Contains(r.pub.(zmq4.Topics).Topics(), syncTopic)
}

func replicaWaitSubscribed(t *testing.T, rs ...*Replica) {
	t.Helper()
	for _, r := range rs {
		poll.Until(t, "a subscriber of "+r.Endpoint(), func() bool { return replicaSubscribed(r) })
	}
}

func replicaCount(c prometheus.Collector) float64 { return testutil.ToFloat64(c) }

func replicaDropped(r *Replica, reason string) float64 {
	return replicaCount(r.m.dropped.WithLabelValues(reason))
}

// loadOf returns the load of wr in l's snapshot of replicaKey.
func replicaLoadOf(l *scheduler.Loads, wr indexer.WorkerRank) scheduler.Load {
	for _, ld := range l.Snapshot(replicaKey.Model, replicaKey.Tenant) {
		if ld.Worker == wr {
			return ld
		}
	}
	return scheduler.Load{}
}

func replicaWaitLoad(t *testing.T, name string, l *scheduler.Loads, wr indexer.WorkerRank, requests int, prefill int64, decode float64) {
	t.Helper()
	poll.Until(t, fmt.Sprintf("%s: worker %v with %d requests, %d prefill tokens, %v decode blocks", name, wr, requests, prefill, decode), func() bool {
		ld := replicaLoadOf(l, wr)
		return ld.Requests == requests && ld.PrefillTokens == prefill && ld.DecodeBlocks == decode
	})
}

func TestReplicaSyncLifecycle(t *testing.T) {
	la, lb := replicaLoads(), replicaLoads()
	a := newTestReplica(t, la, Options{})
	b := newTestReplica(t, lb, Options{Peers: []string{a.Endpoint()}})
	if _, err := a.AddPeer(b.Endpoint()); err != nil {
		t.Fatal(err)
	}
	replicaWaitSubscribed(t, a, b)

	// A books, completes the prefill, grows an output block, frees.
	if err := la.Add(replicaKey, scheduler.Booking{ID: "r1", Worker: replicaWR(1, 1), Hashes: []uint64{11, 12, 13}, PrefillTokens: 10}); err != nil {
		t.Fatal(err)
	}
	replicaWaitLoad(t, "B after A's add", lb, replicaWR(1, 1), 1, 10, 3)
	if err := la.OutputBlock(replicaKey, "r1", 0); err != nil {
		t.Fatal(err)
	}
	if err := la.PrefillComplete(replicaKey, "r1"); err != nil {
		t.Fatal(err)
	}
	// Events arrive in order: had the output block been synced, B would
	// count it (4 decode blocks) once the prefill completion is in.
	replicaWaitLoad(t, "B after A's prefill completion", lb, replicaWR(1, 1), 1, 0, 3)
	if got := replicaLoadOf(la, replicaWR(1, 1)); got.DecodeBlocks != 4 {
		t.Errorf("A's decode blocks = %v, want 4 (3 prompt blocks + 1 output block)", got.DecodeBlocks)
	}

	// B books too: both directions work, and each sees both.
	if err := lb.Add(replicaKey, scheduler.Booking{ID: "r2", Worker: replicaWR(2, 0), Hashes: []uint64{21}, PrefillTokens: 4}); err != nil {
		t.Fatal(err)
	}
	replicaWaitLoad(t, "A after B's add", la, replicaWR(2, 0), 1, 4, 1)

	if _, err := la.Free(replicaKey, "r1"); err != nil {
		t.Fatal(err)
	}
	if _, err := lb.Free(replicaKey, "r2"); err != nil {
		t.Fatal(err)
	}
	for _, l := range []*scheduler.Loads{la, lb} {
		for _, wr := range []indexer.WorkerRank{replicaWR(1, 0), replicaWR(1, 1), replicaWR(2, 0)} {
			replicaWaitLoad(t, "after the frees", l, wr, 0, 0, 0)
		}
	}

	for _, c := range []struct {
		name string
		got  prometheus.Collector
		want float64
	}{
		{"A published adds", a.m.published.WithLabelValues("add"), 1},
		{"A published prefill completions", a.m.published.WithLabelValues("prefill_complete"), 1},
		{"A published frees", a.m.published.WithLabelValues("free"), 1},
		{"B applied adds", b.m.applied.WithLabelValues("add"), 1},
		{"B applied prefill completions", b.m.applied.WithLabelValues("prefill_complete"), 1},
		{"B applied frees", b.m.applied.WithLabelValues("free"), 1},
		{"A applied adds", a.m.applied.WithLabelValues("add"), 1},
		{"A applied frees", a.m.applied.WithLabelValues("free"), 1},
		{"B received", b.m.received, 3},
		{"A received", a.m.received, 2},
	} {
		if got := replicaCount(c.got); got != c.want {
			t.Errorf("%s = %v, want %v", c.name, got, c.want)
		}
	}
	// Applied remote events are not published again.
	if got := replicaCount(b.m.published.WithLabelValues("add")); got != 1 {
		t.Errorf("B published %v adds, want 1 (its own)", got)
	}
}

func TestReplicaIgnoresOwnEvents(t *testing.T) {
	l := replicaLoads()
	r := newTestReplica(t, l, Options{})
	if _, err := r.AddPeer(r.Endpoint()); err != nil {
		t.Fatal(err)
	}
	replicaWaitSubscribed(t, r)
	if err := l.Add(replicaKey, scheduler.Booking{ID: "own", Worker: replicaWR(1, 0), Hashes: []uint64{1}}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, "the own event dropped", func() bool { return replicaDropped(r, replicaDropOwn) == 1 })
	if got := replicaDropped(r, replicaDropDuplicate); got != 0 {
		t.Errorf("duplicates dropped = %v: the own event was applied", got)
	}
	if got := replicaLoadOf(l, replicaWR(1, 0)).Requests; got != 1 {
		t.Errorf("requests = %d, want 1", got)
	}
}

// TestReplicaDrops follows A from B and sends what B must drop.
func TestReplicaDrops(t *testing.T) {
	la, lb := replicaLoads(), replicaLoads()
	other := indexer.Key{Model: "only-on-a", Tenant: indexer.DefaultTenant}
	sized := indexer.Key{Model: "sized", Tenant: "t"}
	addRanks(la, replicaKey, 4, replicaWR(9, 0)) // a worker B does not know
	addRanks(la, other, 4, replicaWR(1, 0))
	addRanks(la, sized, 4, replicaWR(1, 0))
	addRanks(lb, sized, 8, replicaWR(1, 0))
	a := newTestReplica(t, la, Options{})
	b := newTestReplica(t, lb, Options{Peers: []string{a.Endpoint()}})
	replicaWaitSubscribed(t, a)

	steps := []struct {
		name   string
		do     func() error
		reason string
	}{
		{"add on a worker B does not know", func() error {
			return la.Add(replicaKey, scheduler.Booking{ID: "w9", Worker: replicaWR(9, 0), Hashes: []uint64{1}})
		}, replicaDropUnknownWorker},
		{"add for a model B does not know", func() error {
			return la.Add(other, scheduler.Booking{ID: "o1", Worker: replicaWR(1, 0)})
		}, replicaDropUnknownWorker},
		{"prefill completion of a request B dropped", func() error { return la.PrefillComplete(replicaKey, "w9") }, replicaDropUnknownRequest},
		{"free of a request B dropped", func() error { _, err := la.Free(replicaKey, "w9"); return err }, replicaDropUnknownRequest},
		{"add with another block size", func() error {
			return la.Add(sized, scheduler.Booking{ID: "s1", Worker: replicaWR(1, 0), Hashes: []uint64{1}})
		}, replicaDropBlockSize},
		{"add of a request B has already", func() error {
			if err := lb.Add(replicaKey, scheduler.Booking{ID: "dup", Worker: replicaWR(2, 0), PrefillTokens: 7}); err != nil {
				return err
			}
			return la.Add(replicaKey, scheduler.Booking{ID: "dup", Worker: replicaWR(1, 0), PrefillTokens: 3})
		}, replicaDropDuplicate},
	}
	want := map[string]float64{}
	for _, s := range steps {
		if err := s.do(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		want[s.reason]++
		poll.Until(t, s.name+" dropped as "+s.reason, func() bool { return replicaDropped(b, s.reason) == want[s.reason] })
	}
	if got := replicaCount(b.m.received); got != float64(len(steps)) {
		t.Errorf("received = %v, want %d", got, len(steps))
	}
	for _, k := range []string{"add", "prefill_complete", "free"} {
		if got := replicaCount(b.m.applied.WithLabelValues(k)); got != 0 {
			t.Errorf("applied %s = %v, want 0", k, got)
		}
	}
	// B's own booking of "dup" is untouched.
	if got := replicaLoadOf(lb, replicaWR(2, 0)); got.Requests != 1 || got.PrefillTokens != 7 {
		t.Errorf("B's dup booking = %+v", got)
	}
	if got := replicaLoadOf(lb, replicaWR(1, 0)); got.Requests != 0 {
		t.Errorf("B's worker 1 = %+v, want idle", got)
	}
}

// replicaRawPub is a bare PUB socket standing in for a peer, to send any message.
type replicaRawPub struct {
	zmq4.Socket
	ep string
}

func newReplicaRawPub(t *testing.T) *replicaRawPub {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := zmq4.NewPub(ctx)
	if err := s.Listen("tcp://127.0.0.1:0"); err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = s.Close()
		cancel()
	})
	return &replicaRawPub{Socket: s, ep: "tcp://" + s.Addr().String()}
}

func (p *replicaRawPub) send(t *testing.T, frames ...[]byte) {
	t.Helper()
	if err := p.SendMulti(zmq4.NewMsgFrom(frames...)); err != nil {
		t.Fatal(err)
	}
}

func replicaMsgpack(t *testing.T, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestReplicaWireFormat sends hand-built messages in the documented format
// from a bare PUB socket: the well-formed one is applied, the others are
// counted as malformed.
func TestReplicaWireFormat(t *testing.T) {
	l := replicaLoads()
	r := newTestReplica(t, l, Options{})
	pub := newReplicaRawPub(t)
	if _, err := r.AddPeer(pub.ep); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, "the replica subscribed", func() bool { return slices.Contains(pub.Socket.(zmq4.Topics).Topics(), syncTopic) })

	topic := []byte(syncTopic)
	add := map[string]any{"replica_id": uint64(42), "kind": "add", "model": "m", "tenant": "default", "request_id": "x1",
		"worker_id": uint64(1), "dp_rank": uint32(1), "block_size": 4, "hashes": []uint64{1 << 63, 2}, "prefill_tokens": int64(8),
		"some_future_key": "ignored"}
	with := func(k string, v any) map[string]any {
		m := map[string]any{}
		for kk, vv := range add {
			m[kk] = vv
		}
		if v == nil {
			delete(m, k)
		} else {
			m[k] = v
		}
		return m
	}
	malformed := [][][]byte{
		{topic},
		{topic, []byte{0xc1}},
		{topic, replicaMsgpack(t, []any{1, 2})},
		{topic, append(replicaMsgpack(t, add), 0)},
		{topic, replicaMsgpack(t, with("kind", "explode"))},
		{topic, replicaMsgpack(t, with("replica_id", nil))},
		{topic, replicaMsgpack(t, with("model", ""))},
		{topic, replicaMsgpack(t, with("request_id", nil))},
		{topic, replicaMsgpack(t, with("prefill_tokens", int64(-1)))},
		{topic, replicaMsgpack(t, with("prefill_tokens", int64(scheduler.MaxTokens+1)))},
		{topic, replicaMsgpack(t, with("prefill_tokens", int64(math.MaxInt64)))},
		{topic, replicaMsgpack(t, with("hashes", "not hashes"))},
		{[]byte(syncTopic + ".v2"), replicaMsgpack(t, add)},
		{topic, replicaMsgpack(t, add), []byte("extra")},
	}
	for _, frames := range malformed {
		pub.send(t, frames...)
	}
	pub.send(t, topic, replicaMsgpack(t, add))
	// Tenant "" is the default tenant; a prefill completion names no worker.
	pub.send(t, topic, replicaMsgpack(t, map[string]any{"replica_id": uint64(42), "kind": "prefill_complete", "model": "m", "tenant": "", "request_id": "x1"}))

	poll.Until(t, "every message received", func() bool { return replicaCount(r.m.received) == float64(len(malformed)+2) })
	if got := replicaDropped(r, replicaDropMalformed); got != float64(len(malformed)) {
		t.Errorf("malformed = %v, want %d", got, len(malformed))
	}
	if got := replicaLoadOf(l, replicaWR(1, 1)); got.Requests != 1 || got.PrefillTokens != 0 || got.DecodeBlocks != 2 {
		t.Errorf("worker 1 rank 1 = %+v, want 1 request, 0 prefill tokens (completed), 2 decode blocks", got)
	}
	if got := replicaCount(r.m.applied.WithLabelValues("prefill_complete")); got != 1 {
		t.Errorf("applied prefill completions = %v, want 1", got)
	}
}

// TestReplicaPublishesDocumentedFormat decodes what a replica publishes.
func TestReplicaPublishesDocumentedFormat(t *testing.T) {
	l := replicaLoads()
	r := newTestReplica(t, l, Options{})
	sub := zmq4.NewSub(context.Background())
	defer closeReplicaSocket(sub)
	if err := sub.SetOption(zmq4.OptionSubscribe, syncTopic); err != nil {
		t.Fatal(err)
	}
	if err := sub.Dial(r.Endpoint()); err != nil {
		t.Fatal(err)
	}
	replicaWaitSubscribed(t, r)
	hashes := []uint64{1<<64 - 1, 5}
	if err := l.Add(replicaKey, scheduler.Booking{ID: "p1", Worker: replicaWR(1, 1), Hashes: hashes, PrefillTokens: 9}); err != nil {
		t.Fatal(err)
	}
	hashes[0] = 0 // the event was copied
	if _, err := l.Free(replicaKey, "p1"); err != nil {
		t.Fatal(err)
	}
	want := []map[string]any{
		{"replica_id": r.id, "kind": "add", "model": "m", "tenant": "default", "request_id": "p1",
			"worker_id": uint64(1), "dp_rank": uint64(1), "block_size": uint64(4), "hashes": []any{uint64(1<<64 - 1), uint64(5)}, "prefill_tokens": uint64(9)},
		{"replica_id": r.id, "kind": "free", "model": "m", "tenant": "default", "request_id": "p1"},
	}
	for i, w := range want {
		msg, err := sub.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if len(msg.Frames) != 2 || string(msg.Frames[0]) != syncTopic {
			t.Fatalf("message %d: frames %q", i, msg.Frames)
		}
		var got map[string]any
		dec := msgpack.NewDecoder(strings.NewReader(string(msg.Frames[1])))
		dec.UseLooseInterfaceDecoding(true) // every integer as (u)int64
		if err := dec.Decode(&got); err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(got) != fmt.Sprint(w) {
			t.Errorf("message %d = %v\nwant        %v", i, got, w)
		}
	}
}

func TestReplicaReconnects(t *testing.T) {
	la, lb := replicaLoads(), replicaLoads()
	a := newTestReplica(t, la, Options{})
	b := newTestReplica(t, lb, Options{Peers: []string{a.Endpoint()}})
	replicaWaitSubscribed(t, a)
	poll.Until(t, "B connected", func() bool { _, n := b.peerCounts(); return n == 1 })
	port := a.pub.Addr().(*net.TCPAddr).Port
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, "B disconnected", func() bool { _, n := b.peerCounts(); return n == 0 })

	la2 := replicaLoads()
	a2 := newTestReplica(t, la2, Options{Port: port})
	if a2.Endpoint() != a.Endpoint() {
		t.Fatalf("restarted on %s, want %s", a2.Endpoint(), a.Endpoint())
	}
	replicaWaitSubscribed(t, a2)
	if err := la2.Add(replicaKey, scheduler.Booking{ID: "after", Worker: replicaWR(2, 0), PrefillTokens: 1}); err != nil {
		t.Fatal(err)
	}
	replicaWaitLoad(t, "B after the restart", lb, replicaWR(2, 0), 1, 1, 0)
}

// TestReplicaSilentPeers: a peer that accepts and never speaks neither
// blocks the replica nor its Close, and a client that connects to the PUB
// socket and never speaks does not keep subscribers out.
func TestReplicaSilentPeers(t *testing.T) {
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	accepted := make(chan net.Conn, 16)
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	defer func() {
		silent.Close()
		for c := range accepted {
			c.Close()
		}
	}()

	la, lb := replicaLoads(), replicaLoads()
	a := newTestReplica(t, la, Options{Timeout: 100 * time.Millisecond})
	mute, err := net.Dial("tcp", strings.TrimPrefix(a.Endpoint(), "tcp://"))
	if err != nil {
		t.Fatal(err)
	}
	defer mute.Close()
	b := newTestReplica(t, lb, Options{Peers: []string{"tcp://" + silent.Addr().String(), a.Endpoint()}, Timeout: 100 * time.Millisecond})
	replicaWaitSubscribed(t, a)
	if err := la.Add(replicaKey, scheduler.Booking{ID: "through", Worker: replicaWR(1, 0)}); err != nil {
		t.Fatal(err)
	}
	replicaWaitLoad(t, "B", lb, replicaWR(1, 0), 1, 0, 0)
	if all, connected := b.peerCounts(); all != 2 || connected != 1 {
		t.Errorf("B's peers: %d, %d connected; want 2, 1", all, connected)
	}
	done := make(chan error)
	go func() { done <- b.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Error(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close blocked on a silent peer")
	}
}

func TestReplicaRemovePeer(t *testing.T) {
	a := newTestReplica(t, replicaLoads(), Options{})
	b := newTestReplica(t, replicaLoads(), Options{Peers: []string{a.Endpoint()}})
	replicaWaitSubscribed(t, a)
	found, err := b.RemovePeer(" " + a.Endpoint() + " ")
	if err != nil || !found {
		t.Fatalf("RemovePeer = %v, %v", found, err)
	}
	poll.Until(t, "A's subscriber gone", func() bool { return !replicaSubscribed(a) })
	if found, err := b.RemovePeer(a.Endpoint()); found || err != nil {
		t.Errorf("second RemovePeer = %v, %v; want false, nil", found, err)
	}
}

func TestReplicaQueueFull(t *testing.T) {
	// No sender runs: the queue fills and stays full.
	r := &Replica{queue: make(chan scheduler.Lifecycle, 1), m: newReplicaMetrics()}
	hashes := []uint64{1, 2}
	r.observe(scheduler.Lifecycle{Kind: scheduler.LifecycleAdd, Key: replicaKey, Booking: scheduler.Booking{ID: "a", Hashes: hashes}})
	r.observe(scheduler.Lifecycle{Kind: scheduler.LifecycleFree, Key: replicaKey, Booking: scheduler.Booking{ID: "a"}})
	r.observe(scheduler.Lifecycle{Kind: scheduler.LifecycleFree, Key: replicaKey, Booking: scheduler.Booking{ID: "b"}})
	if got := replicaDropped(r, replicaDropQueueFull); got != 2 {
		t.Errorf("queue_full = %v, want 2", got)
	}
	hashes[0] = 9
	if ev := <-r.queue; ev.Booking.ID != "a" || !slices.Equal(ev.Booking.Hashes, []uint64{1, 2}) {
		t.Errorf("queued %+v, want add a with its own copy of [1 2]", ev)
	}
}

func TestNormalizeEndpoint(t *testing.T) {
	for _, tc := range []struct{ in, want, err string }{
		{in: "tcp://127.0.0.1:9092", want: "tcp://127.0.0.1:9092"},
		{in: " tcp://Selector-B:9092 ", want: "tcp://selector-b:9092"},
		{in: "tcp://[::1]:9092", want: "tcp://[::1]:9092"},
		{in: "selector-b:9092", err: "want the tcp:// scheme"},
		{in: "http://b:9092", err: "want the tcp:// scheme"},
		{in: "ipc:///tmp/x", err: "want the tcp:// scheme"},
		{in: "tcp://b", err: "no host:port"},
		{in: "tcp://:9092", err: "empty host"},
		{in: "tcp://*:9092", err: "is not a host name"},
		{in: "tcp://b:0", err: "port \"0\""},
		{in: "tcp://b:65536", err: "port \"65536\""},
		{in: "tcp://b:+1", err: "port \"+1\""},
		{in: "tcp://b:x", err: "port \"x\""},
		{in: "", err: "want the tcp:// scheme"},
	} {
		got, err := NormalizeEndpoint(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("NormalizeEndpoint(%q) = %q, %v; want error with %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("NormalizeEndpoint(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

func TestZMTPStream(t *testing.T) {
	greeting := make([]byte, zmtpGreetingLen)
	short := append([]byte{0x04, 3}, "abc"...)
	long := append([]byte{0x06, 0, 0, 0, 0, 0, 0, 1, 0}, make([]byte, 256)...)
	for _, tc := range []struct {
		name   string
		in     []byte
		frames int
	}{
		{"short command", append(slices.Clone(greeting), short...), 1},
		{"long command", append(slices.Clone(greeting), long...), 1},
		{"empty command", append(slices.Clone(greeting), 0x04, 0), 1},
		{"command and frames", slices.Concat(greeting, short, long, []byte{0x01, 0, 0x00, 2, 'h', 'i'}), 4},
	} {
		for _, chunk := range []int{1, 7, len(tc.in)} {
			z := zmtpStream{left: zmtpGreetingLen, max: 256}
			for i := 0; i < len(tc.in); i += chunk {
				if tc.frames == 1 && z.handshakeDone() {
					t.Fatalf("%s in chunks of %d: handshake done after %d of %d bytes", tc.name, chunk, i, len(tc.in))
				}
				if err := z.consume(tc.in[i:min(i+chunk, len(tc.in))]); err != nil {
					t.Fatalf("%s in chunks of %d: %v", tc.name, chunk, err)
				}
			}
			if !z.handshakeDone() || z.frames != tc.frames || z.stage != 1 {
				t.Errorf("%s in chunks of %d: %d frames, stage %d; want %d frames, stage 1", tc.name, chunk, z.frames, z.stage, tc.frames)
			}
		}
	}
	z := zmtpStream{left: zmtpGreetingLen, max: 255}
	if err := z.consume(slices.Concat(greeting, long[:8])); err != nil {
		t.Fatalf("size incomplete: %v", err)
	}
	var ne net.Error
	if err := z.consume(long[8:9]); err == nil || !errors.As(err, &ne) || ne.Timeout() {
		t.Errorf("a 256-byte frame with max 255: %v, want a net.Error that is no timeout", err)
	}
}

// TestReplicaOversizedFrame: a client of the PUB socket that announces a
// huge frame is disconnected before zmq4 allocates it; others go on.
func TestReplicaOversizedFrame(t *testing.T) {
	la, lb := replicaLoads(), replicaLoads()
	a := newTestReplica(t, la, Options{})
	conn, err := net.Dial("tcp", strings.TrimPrefix(a.Endpoint(), "tcp://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	greeting := make([]byte, zmtpGreetingLen)
	greeting[0], greeting[9], greeting[10] = 0xff, 0x7f, 3
	copy(greeting[12:], "NULL")
	// The greeting, then a command frame claiming 1 TiB.
	if _, err := conn.Write(append(greeting, 0x06, 0, 0, 1, 0, 0, 0, 0, 0)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, conn); err != nil {
		t.Fatalf("reading until the replica hangs up: %v", err)
	}
	newTestReplica(t, lb, Options{Peers: []string{a.Endpoint()}})
	replicaWaitSubscribed(t, a)
	if err := la.Add(replicaKey, scheduler.Booking{ID: "after", Worker: replicaWR(1, 0), PrefillTokens: 2}); err != nil {
		t.Fatal(err)
	}
	replicaWaitLoad(t, "B", lb, replicaWR(1, 0), 1, 2, 0)
}

func TestReplicaMetricsRegistered(t *testing.T) {
	reg := prometheus.NewRegistry()
	r, err := New(replicaLoads(), reg, Options{BindHost: "127.0.0.1", Logger: quiet, Peers: []string{closedPort(t)}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	want := `
# HELP kvgate_replica_sync_peers Replica sync peers configured.
# TYPE kvgate_replica_sync_peers gauge
kvgate_replica_sync_peers 1
# HELP kvgate_replica_sync_peers_connected Replica sync peers whose PUB socket this replica is subscribed to.
# TYPE kvgate_replica_sync_peers_connected gauge
kvgate_replica_sync_peers_connected 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "kvgate_replica_sync_peers", "kvgate_replica_sync_peers_connected"); err != nil {
		t.Error(err)
	}
	n, err := testutil.GatherAndCount(reg, "kvgate_replica_sync_events_dropped_total")
	if err != nil || n != len(replicaDropReasons) {
		t.Errorf("dropped series = %d, %v; want one per reason (%d)", n, err, len(replicaDropReasons))
	}
}

func TestNewReplicaErrors(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	for _, tc := range []struct {
		opts Options
		want string
	}{
		{Options{Port: -1}, "not between 0 and 65535"},
		{Options{Port: busy.Addr().(*net.TCPAddr).Port}, "bind"},
		{Options{Peers: []string{"tcp://b"}}, "no host:port"},
	} {
		tc.opts.BindHost, tc.opts.Logger = "127.0.0.1", quiet
		r, err := New(scheduler.NewLoads(scheduler.LoadOptions{}), nil, tc.opts)
		if err == nil {
			r.Close()
			t.Errorf("New(%+v) succeeded", tc.opts)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v) = %v, want %q", tc.opts, err, tc.want)
		}
	}
}

// TestReplicaCloseLeavesNoGoroutines closes connected replicas, one with a
// peer that cannot be reached, and checks that only zmq4's PUB writers
// remain.
func TestReplicaCloseLeavesNoGoroutines(t *testing.T) {
	ignore := []goleak.Option{goleak.IgnoreCurrent(), goleak.IgnoreAnyFunction(engine.LeakedGoroutine)}
	la, lb := replicaLoads(), replicaLoads()
	open := func(l *scheduler.Loads, peers ...string) *Replica {
		r, err := New(l, nil, Options{BindHost: "127.0.0.1", Logger: quiet, Peers: peers, MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	a := open(la, closedPort(t))
	b := open(lb, a.Endpoint())
	if _, err := a.AddPeer(b.Endpoint()); err != nil {
		t.Fatal(err)
	}
	replicaWaitSubscribed(t, a, b)
	if err := la.Add(replicaKey, scheduler.Booking{ID: "g", Worker: replicaWR(1, 0)}); err != nil {
		t.Fatal(err)
	}
	replicaWaitLoad(t, "B", lb, replicaWR(1, 0), 1, 0, 0)
	for _, r := range []*Replica{b, a} {
		if err := r.Close(); err != nil {
			t.Error(err)
		}
		if err := r.Close(); err != nil {
			t.Errorf("second Close: %v", err)
		}
	}
	goleak.VerifyNone(t, ignore...)
	// Closed: local events are no longer queued.
	if _, err := la.Free(replicaKey, "g"); err != nil {
		t.Fatal(err)
	}
	if n := len(a.queue); n != 0 {
		t.Errorf("%d events queued after Close", n)
	}
}
