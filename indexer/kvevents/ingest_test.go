package kvevents

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/bench/engine"
	"github.com/kvgate/kvgate/bench/engine/enginetest"
	"github.com/kvgate/kvgate/indexer"
	"github.com/kvgate/kvgate/internal/poll"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

const testBS = 4 // tokens per block in these tests

var testKey = indexer.Key{Model: "m", Tenant: indexer.DefaultTenant}

// rig is an Ingester on a fresh Set with fast backoff, for tests.
type rig struct {
	t   testing.TB
	set *indexer.Set
	g   *Ingester
	m   *Metrics
	reg *prometheus.Registry
}

func newRig(t testing.TB, opts IngestOptions) *rig {
	t.Helper()
	r := &rig{t: t, set: indexer.NewSet(indexer.Options{EventThreads: 2}), reg: prometheus.NewRegistry()}
	r.m = NewMetrics(r.reg)
	opts.Metrics = r.m
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if opts.MinBackoff == 0 {
		opts.MinBackoff, opts.MaxBackoff = 5*time.Millisecond, 50*time.Millisecond
	}
	r.g = NewIngester(r.set, opts)
	t.Cleanup(func() {
		r.g.Close()
		r.set.Close()
	})
	return r
}

func (r *rig) register(worker uint64, rank uint32, p *engine.Publisher, replay bool) Registration {
	r.t.Helper()
	reg := Registration{Key: testKey, BlockSize: testBS, Worker: worker, Rank: rank, Endpoint: p.Endpoint()}
	if replay {
		reg.ReplayEndpoint = p.ReplayEndpoint()
	}
	if err := r.g.Register(reg); err != nil {
		r.t.Fatal(err)
	}
	return reg
}

// follow starts a publisher with cfg, registers it as rank 0 of worker
// (with its replay endpoint, if it has one) and waits for the subscription.
func (r *rig) follow(cfg engine.Config, worker uint64) *engine.Publisher {
	r.t.Helper()
	p := enginetest.Start(r.t, cfg)
	r.register(worker, 0, p, cfg.ReplayEndpoint != "")
	subscribed(r.t, p)
	return p
}

func (r *rig) listener(worker uint64, rank uint32) (ListenerInfo, bool) {
	for _, l := range r.g.Listeners() {
		if l.Worker == worker && l.Rank == rank {
			return l, true
		}
	}
	return ListenerInfo{}, false
}

// waitApplied waits until the listener of (worker, rank) has handled batch
// seq and the Set has applied every event queued for worker.
func (r *rig) waitApplied(worker uint64, rank uint32, seq uint64) {
	r.t.Helper()
	poll.Until(r.t, fmt.Sprintf("worker %d rank %d at seq %d", worker, rank, seq), func() bool {
		l, ok := r.listener(worker, rank)
		return ok && l.HasSeq && l.Seq >= seq
	})
	r.flush(worker)
}

func (r *rig) flush(worker uint64) {
	r.t.Helper()
	if err := r.set.Do(context.Background(), worker, func() {}); err != nil {
		r.t.Fatal(err)
	}
}

func (r *rig) waitStatus(worker uint64, rank uint32, want ListenerStatus) ListenerInfo {
	r.t.Helper()
	var l ListenerInfo
	poll.Until(r.t, fmt.Sprintf("worker %d rank %d %s", worker, rank, want), func() bool {
		var ok bool
		l, ok = r.listener(worker, rank)
		return ok && l.Status == want
	})
	return l
}

func subscribed(t testing.TB, p *engine.Publisher) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.WaitSubscribed(ctx); err != nil {
		t.Fatal(err)
	}
}

// sync publishes empty batches until the listener of (worker, rank) has
// handled one, for when a publisher may still list a closed subscriber's
// subscription (WaitSubscribed cannot tell the two apart). It returns the
// last sequence number published.
func (r *rig) sync(p *engine.Publisher, worker uint64, rank uint32) uint64 {
	r.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		seq := publish(r.t, p)
		probe := time.Now().Add(100 * time.Millisecond)
		for time.Now().Before(probe) {
			if l, ok := r.listener(worker, rank); ok && l.HasSeq && l.Seq >= seq {
				r.flush(worker)
				return seq
			}
			time.Sleep(2 * time.Millisecond)
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("worker %d rank %d never received batch %d", worker, rank, seq)
		}
	}
}

func publish(t testing.TB, p *engine.Publisher, evs ...engine.Event) uint64 {
	t.Helper()
	seq, err := p.Publish(evs...)
	if err != nil {
		t.Fatal(err)
	}
	return seq
}

// root stores n blocks starting at the root, ids id0, id0+1, ..., tokens
// derived from id0 so that different chains differ.
func root(id0 uint64, n int) engine.BlockStored {
	return engine.BlockStored{BlockHashes: ids(id0, n), TokenIDs: tokensOf(id0, n), BlockSize: testBS}
}

func child(parent, id0 uint64, n int) engine.BlockStored {
	ev := root(id0, n)
	ev.Parent = &parent
	return ev
}

func ids(id0 uint64, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = id0 + uint64(i)
	}
	return out
}

func tokensOf(id0 uint64, n int) []uint32 {
	out := make([]uint32, n*testBS)
	for i := range out {
		out[i] = uint32(id0*1000) + uint32(i)
	}
	return out
}

// snapshot is an index's content as its dump shows it: per worker rank,
// engine id -> (sequence hash, tiers), and how many blocks each rank holds
// (blocks whose parent was evicted are not in the dump but are counted).
type snapshot map[indexer.WorkerRank]map[uint64]string

func snap(x *indexer.Index) snapshot {
	out := snapshot{}
	keys := map[indexer.WorkerRank]map[uint64]uint64{} // engine id -> sequence hash
	for _, ev := range x.Dump() {
		b := ev.Blocks[0]
		if keys[ev.Worker] == nil {
			keys[ev.Worker], out[ev.Worker] = map[uint64]uint64{}, map[uint64]string{}
		}
		key := b.Local
		if ev.HasParent {
			key = indexer.NextSequenceHash(keys[ev.Worker][ev.Parent], b.Local)
		}
		keys[ev.Worker][b.ID] = key
		tiers := ev.Tier
		if prev, ok := out[ev.Worker][b.ID]; ok {
			var t indexer.Tier
			fmt.Sscanf(prev[strings.IndexByte(prev, '/')+1:], "%d", &t)
			tiers |= t
		}
		out[ev.Worker][b.ID] = fmt.Sprintf("%x/%d", key, tiers)
	}
	for wr, n := range x.BlockCounts() {
		if n > 0 {
			if out[wr] == nil {
				out[wr] = map[uint64]string{}
			}
			out[wr][^uint64(0)] = fmt.Sprintf("%d blocks", n)
		}
	}
	return out
}

func (s snapshot) String() string {
	var lines []string
	for wr, m := range s {
		for id, v := range m {
			lines = append(lines, fmt.Sprintf("%s id %d: %s", wr, id, v))
		}
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

// expect applies events directly to a fresh index, as the listener should.
func expect(t testing.TB, evs ...indexer.Event) snapshot {
	t.Helper()
	ix := indexer.NewIndex(testBS)
	for _, ev := range evs {
		if _, err := ix.Apply(ev); err != nil {
			t.Fatal(err)
		}
	}
	return snap(ix)
}

func indexEvent(w indexer.WorkerRank, tier indexer.Tier, ev engine.BlockStored) indexer.Event {
	blocks := make([]indexer.Block, len(ev.BlockHashes))
	for i, h := range ev.BlockHashes {
		blocks[i] = indexer.Block{ID: h, Local: indexer.LocalHash(ev.TokenIDs[i*testBS:(i+1)*testBS], indexer.LoRASeed(ev.LoRAName), nil)}
	}
	out := indexer.Event{Kind: indexer.Stored, Worker: w, Tier: tier, Blocks: blocks}
	if ev.Parent != nil {
		out.Parent, out.HasParent = *ev.Parent, true
	}
	return out
}

func (r *rig) check(want snapshot) {
	r.t.Helper()
	got := snap(r.set.Lookup(testKey))
	if got.String() != want.String() {
		r.t.Fatalf("index:\n%s\nwant:\n%s", got, want)
	}
}

func counter(t testing.TB, c prometheus.Collector) float64 {
	t.Helper()
	return testutil.ToFloat64(c)
}

func TestIngestLive(t *testing.T) {
	for _, enc := range []engine.Encoding{engine.MapEncoding, engine.ArrayEncoding} {
		for _, he := range []engine.HashEncoding{engine.HashUint64, engine.HashInt64, engine.HashBytes} {
			t.Run(fmt.Sprintf("%s/%s", enc, he), func(t *testing.T) {
				r := newRig(t, IngestOptions{})
				p := r.follow(engine.Config{Encoding: enc, HashEncoding: he}, 1)
				big := uint64(1<<63 + 10)
				a := root(big, 3)
				b := child(big+2, 50, 2)
				c := root(90, 1)
				c.Medium = "CPU"
				publish(t, p, a, b)
				publish(t, p, c, engine.BlockRemoved{BlockHashes: []uint64{51}})
				last := publish(t, p, engine.BlockRemoved{BlockHashes: []uint64{90}, Medium: "CPU_PINNED"})
				r.waitApplied(1, 0, last)
				w := indexer.WorkerRank{Worker: 1, Rank: 0}
				r.check(expect(t, indexEvent(w, indexer.TierDevice, a), indexEvent(w, indexer.TierDevice, b), removed(w, indexer.TierDevice, 51)))
				if got := counter(t, r.m.eventsApplied.WithLabelValues("stored")); got != 3 {
					t.Errorf("stored events applied = %v, want 3", got)
				}
				if l := r.waitStatus(1, 0, StatusActive); l.LastError != "" {
					t.Errorf("active listener has last error %q", l.LastError)
				}
			})
		}
	}
}

func TestIngestGapReplay(t *testing.T) {
	for _, style := range []engine.ReplyStyle{engine.ReplyWithTopic, engine.ReplyLegacy} {
		t.Run(style.String(), func(t *testing.T) {
			r := newRig(t, IngestOptions{})
			drop := map[uint64]bool{0: true, 2: true, 3: true}
			p := enginetest.Start(t, engine.Config{ReplayEndpoint: "tcp://127.0.0.1:0", ReplyStyle: style, Topic: "kv",
				Drop: func(seq uint64) bool { return drop[seq] }})
			reg := r.register(1, 0, p, true)
			_ = reg
			subscribed(t, p)
			w := indexer.WorkerRank{Worker: 1, Rank: 0}
			var want []indexer.Event
			var prev uint64
			for i := range 6 {
				ev := root(uint64(100*(i+1)), 2)
				if i > 0 {
					ev = child(prev, uint64(100*(i+1)), 2)
				}
				prev = ev.BlockHashes[1]
				publish(t, p, ev)
				want = append(want, indexEvent(w, indexer.TierDevice, ev))
			}
			r.waitApplied(1, 0, 5)
			r.check(expect(t, want...))
			// How many batches one replay returns depends on how far the
			// publisher got meanwhile; at least the dropped ones.
			if got := counter(t, r.m.gaps); got < 1 {
				t.Errorf("gaps = %v, want >= 1", got)
			}
			if got := counter(t, r.m.batchesReplayed); got < 3 {
				t.Errorf("replayed = %v, want >= 3", got)
			}
			if got := counter(t, r.m.batchesLost.WithLabelValues(lostGap)) + counter(t, r.m.batchesLost.WithLabelValues(lostBeforeJoin)); got != 0 {
				t.Errorf("lost = %v, want 0", got)
			}
		})
	}
}

func TestIngestGapWithoutReplay(t *testing.T) {
	r := newRig(t, IngestOptions{})
	p := r.follow(engine.Config{Drop: func(seq uint64) bool { return seq == 1 }}, 1)
	w := indexer.WorkerRank{Worker: 1, Rank: 0}
	a, b, c := root(10, 1), root(20, 1), root(30, 1)
	publish(t, p, a)
	publish(t, p, b)
	publish(t, p, c)
	r.waitApplied(1, 0, 2)
	r.check(expect(t, indexEvent(w, indexer.TierDevice, a), indexEvent(w, indexer.TierDevice, c)))
	if got := counter(t, r.m.batchesLost.WithLabelValues(lostGap)); got != 1 {
		t.Errorf("lost = %v, want 1", got)
	}
}

func TestIngestLateJoinReplaysFromZero(t *testing.T) {
	r := newRig(t, IngestOptions{})
	// Batches 0-3 are published before anyone listens. They are kept for
	// replay but not sent: the PUB socket sends from a queue, and a batch
	// still queued when the listener subscribes would reach it after all.
	p := enginetest.Start(t, engine.Config{ReplayEndpoint: "tcp://127.0.0.1:0", BufferSteps: 3,
		Drop: func(seq uint64) bool { return seq < 4 }})
	w := indexer.WorkerRank{Worker: 1, Rank: 0}
	// 0 and 1 fall out of the 3-batch buffer, 2 and 3 are replayed.
	evs := []engine.BlockStored{root(10, 1), root(20, 1), root(30, 1), root(40, 1), root(50, 1)}
	for _, ev := range evs[:4] {
		publish(t, p, ev)
	}
	r.register(1, 0, p, true)
	subscribed(t, p)
	publish(t, p, evs[4])
	r.waitApplied(1, 0, 4)
	r.check(expect(t, indexEvent(w, indexer.TierDevice, evs[2]), indexEvent(w, indexer.TierDevice, evs[3]), indexEvent(w, indexer.TierDevice, evs[4])))
	if got := counter(t, r.m.batchesLost.WithLabelValues(lostBeforeJoin)); got != 2 {
		t.Errorf("lost before join = %v, want 2", got)
	}
}

func TestIngestPublisherRestart(t *testing.T) {
	r := newRig(t, IngestOptions{})
	p := r.follow(engine.Config{}, 1)
	w := indexer.WorkerRank{Worker: 1, Rank: 0}
	publish(t, p, root(10, 2))
	publish(t, p, root(20, 2))
	r.waitApplied(1, 0, 1)
	endpoint := p.Endpoint()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	// The listener notices the broken connection and keeps redialling.
	r.waitStatus(1, 0, StatusPending)
	p2 := enginetest.Start(t, engine.Config{Endpoint: endpoint})
	r.waitStatus(1, 0, StatusActive)
	subscribed(t, p2)
	fresh := root(30, 1)
	if seq := publish(t, p2, fresh); seq != 0 {
		t.Fatalf("restarted publisher at seq %d", seq)
	}
	poll.Until(t, "restart detected", func() bool { return counter(t, r.m.restarts) == 1 })
	r.waitApplied(1, 0, 0)
	r.check(expect(t, indexEvent(w, indexer.TierDevice, fresh)))
}

func TestIngestWatermarkSurvivesReregister(t *testing.T) {
	r := newRig(t, IngestOptions{})
	// Batches 1 and 2 go out while nobody listens: kept for replay, not
	// sent (a queued send could reach the next listener; see
	// TestIngestLateJoinReplaysFromZero).
	p := r.follow(engine.Config{ReplayEndpoint: "tcp://127.0.0.1:0", Drop: func(seq uint64) bool { return seq == 1 || seq == 2 }}, 1)
	w := indexer.WorkerRank{Worker: 1, Rank: 0}
	publish(t, p, root(10, 1))
	r.waitApplied(1, 0, 0)
	if ok, err := r.g.Unregister(context.Background(), testKey, 1, nil); err != nil || !ok {
		t.Fatalf("unregister: %v %v", ok, err)
	}
	r.check(snapshot{})
	// Nobody listens to 1 and 2; re-registering replays them from seq 1.
	b, c, d := root(20, 1), root(30, 1), root(40, 1)
	publish(t, p, b)
	publish(t, p, c)
	r.register(1, 0, p, true)
	r.sync(p, 1, 0) // its first batch is at seq 3: 1 and 2 are replayed
	last := publish(t, p, d)
	r.waitApplied(1, 0, last)
	r.check(expect(t, indexEvent(w, indexer.TierDevice, b), indexEvent(w, indexer.TierDevice, c), indexEvent(w, indexer.TierDevice, d)))
	if got := counter(t, r.m.batchesReplayed); got < 2 {
		t.Errorf("replayed = %v, want >= 2", got)
	}
}

func TestIngestStatusTransitions(t *testing.T) {
	r := newRig(t, IngestOptions{FailAfter: 2})
	// A port nobody listens on, yet.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	endpoint := "tcp://" + ln.Addr().String()
	_ = ln.Close()
	if err := r.g.Register(Registration{Key: testKey, BlockSize: testBS, Worker: 5, Endpoint: endpoint}); err != nil {
		t.Fatal(err)
	}
	l := r.waitStatus(5, 0, StatusFailed)
	if !strings.Contains(l.LastError, "connect") {
		t.Errorf("last error %q does not say why", l.LastError)
	}
	p := enginetest.Start(t, engine.Config{Endpoint: endpoint})
	if l := r.waitStatus(5, 0, StatusActive); l.LastError != "" {
		t.Errorf("active with last error %q", l.LastError)
	}
	subscribed(t, p)
	publish(t, p, root(1, 1))
	r.waitApplied(5, 0, 0)

	if n := r.g.Pause(testKey, 5, nil); n != 1 {
		t.Fatalf("paused %d listeners", n)
	}
	r.waitStatus(5, 0, StatusPaused)
	if n := r.g.Resume(testKey, 5, nil); n != 1 {
		t.Fatalf("resumed %d listeners", n)
	}
	r.waitStatus(5, 0, StatusActive)
	if got := testutil.CollectAndCount(r.reg, "kvgate_kv_event_listeners"); got != 4 {
		t.Errorf("%d listener state series, want 4", got)
	}
}

func TestIngestRankOverrideAndUnregisterRank(t *testing.T) {
	r := newRig(t, IngestOptions{})
	three := 3
	p := enginetest.Start(t, engine.Config{Rank: &three})
	r.register(1, 0, p, false)
	q := enginetest.Start(t, engine.Config{})
	r.register(1, 1, q, false)
	subscribed(t, p)
	subscribed(t, q)
	a, b := root(10, 2), root(20, 2)
	publish(t, p, a)
	publish(t, q, b)
	r.waitApplied(1, 0, 0)
	r.waitApplied(1, 1, 0)
	r.check(expect(t, indexEvent(indexer.WorkerRank{Worker: 1, Rank: 3}, indexer.TierDevice, a), indexEvent(indexer.WorkerRank{Worker: 1, Rank: 1}, indexer.TierDevice, b)))
	// Unregistering rank 0 also drops the rank its batches named.
	rank0 := uint32(0)
	if ok, err := r.g.Unregister(context.Background(), testKey, 1, &rank0); err != nil || !ok {
		t.Fatalf("unregister rank 0: %v %v", ok, err)
	}
	r.check(expect(t, indexEvent(indexer.WorkerRank{Worker: 1, Rank: 1}, indexer.TierDevice, b)))
	if got := len(r.g.Listeners()); got != 1 {
		t.Errorf("%d listeners left, want 1", got)
	}
}

func TestIngestMalformedAndMismatched(t *testing.T) {
	r := newRig(t, IngestOptions{})
	p := r.follow(engine.Config{}, 1)
	w := indexer.WorkerRank{Worker: 1, Rank: 0}
	if _, err := p.PublishRaw([]byte{0xc1, 0x00}); err != nil {
		t.Fatal(err)
	}
	wrongSize := root(10, 1)
	wrongSize.BlockSize = 8
	short := root(20, 3)
	short.TokenIDs = short.TokenIDs[:2*testBS+1] // the third block is partial
	orphan := child(999, 30, 1)
	lora := root(40, 1)
	lora.LoRAName = "adapter"
	last := publish(t, p, wrongSize, short, orphan, lora)
	r.waitApplied(1, 0, last)
	shortFixed := short
	shortFixed.BlockHashes = short.BlockHashes[:2]
	r.check(expect(t, indexEvent(w, indexer.TierDevice, shortFixed), indexEvent(w, indexer.TierDevice, lora)))
	for reason, want := range map[string]float64{dropBlockSize: 1, dropUnknownParent: 1} {
		if got := counter(t, r.m.eventsDropped.WithLabelValues(reason)); got != want {
			t.Errorf("dropped %s = %v, want %v", reason, got, want)
		}
	}
	if got := counter(t, r.m.blocksDropped.WithLabelValues(dropPartialBlock)); got != 1 {
		t.Errorf("partial blocks dropped = %v, want 1", got)
	}
	if got := counter(t, r.m.decodeErrors); got != 1 {
		t.Errorf("decode errors = %v, want 1", got)
	}
	// The LoRA block matches only with its adapter's seed.
	ix := r.set.Lookup(testKey)
	if got := ix.MatchTokens(lora.TokenIDs, "adapter", nil); len(got) != 1 || got[0].Device != 1 {
		t.Errorf("adapter match = %+v", got)
	}
	if got := ix.MatchTokens(lora.TokenIDs, "", nil); len(got) != 0 {
		t.Errorf("base model matched adapter blocks: %+v", got)
	}
}

func TestRegisterErrors(t *testing.T) {
	r := newRig(t, IngestOptions{})
	base := Registration{Key: testKey, BlockSize: testBS, Worker: 1, Endpoint: "tcp://127.0.0.1:1"}
	if err := r.g.Register(base); err != nil {
		t.Fatal(err)
	}
	if err := r.g.Register(base); err != nil {
		t.Errorf("re-register identical: %v", err)
	}
	for name, mod := range map[string]func(*Registration){
		"bad endpoint":        func(r *Registration) { r.Endpoint = "localhost:5557" },
		"bind address":        func(r *Registration) { r.Endpoint = "tcp://*:5557" },
		"bad replay":          func(r *Registration) { r.Worker, r.ReplayEndpoint = 2, "nope" },
		"empty model":         func(r *Registration) { r.Worker, r.Key.Model = 3, "" },
		"block size conflict": func(r *Registration) { r.Worker, r.BlockSize = 4, 8 },
		"other model":         func(r *Registration) { r.Key.Model = "other" },
	} {
		reg := base
		mod(&reg)
		if err := r.g.Register(reg); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if got := len(r.g.Listeners()); got != 1 {
		t.Errorf("%d listeners after failed registrations, want 1", got)
	}
}

// TestIngestManyPublishers streams from 64 publishers at once, dropping
// random live batches; replay recovers them all, and the index ends up
// exactly as if every event had been applied in order.
func TestIngestManyPublishers(t *testing.T) {
	const publishers, batches = 64, 40
	r := newRig(t, IngestOptions{})
	rng := rand.New(rand.NewPCG(1, 2))
	type pubState struct {
		p      *engine.Publisher
		events [][]engine.Event
	}
	pubs := make([]pubState, publishers)
	var want []indexer.Event
	for i := range pubs {
		w := indexer.WorkerRank{Worker: uint64(i + 1), Rank: 0}
		drops := map[uint64]bool{}
		for s := range uint64(batches - 1) { // never the last: a gap shows at the next batch
			if rng.IntN(4) == 0 {
				drops[s] = true
			}
		}
		pubs[i].p = enginetest.Start(t, engine.Config{ReplayEndpoint: "tcp://127.0.0.1:0", Encoding: engine.Encoding(i % 2),
			Drop: func(seq uint64) bool { return drops[seq] }})
		// A simulated cache: chains grow from stored blocks, some removed.
		var live []uint64
		next := uint64(i+1) << 32
		for range batches {
			var evs []engine.Event
			for range 1 + rng.IntN(3) {
				switch {
				case len(live) > 0 && rng.IntN(3) == 0:
					k := rng.IntN(len(live))
					id := live[k]
					live = slices.Delete(live, k, k+1)
					evs = append(evs, engine.BlockRemoved{BlockHashes: []uint64{id}})
					want = append(want, removed(w, indexer.TierDevice, id))
				default:
					n := 1 + rng.IntN(3)
					ev := root(next, n)
					if len(live) > 0 && rng.IntN(2) == 0 {
						ev = child(live[rng.IntN(len(live))], next, n)
					}
					next += uint64(n)
					live = append(live, ev.BlockHashes...)
					evs = append(evs, ev)
					want = append(want, indexEvent(w, indexer.TierDevice, ev))
				}
			}
			pubs[i].events = append(pubs[i].events, evs)
		}
		r.register(w.Worker, 0, pubs[i].p, true)
	}
	var wg sync.WaitGroup
	for i := range pubs {
		wg.Go(func() {
			subscribed(t, pubs[i].p)
			for _, evs := range pubs[i].events {
				if _, err := pubs[i].p.Publish(evs...); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	for i := range pubs {
		r.waitApplied(uint64(i+1), 0, batches-1)
	}
	r.check(expect(t, want...))
	if got := counter(t, r.m.batchesLost.WithLabelValues(lostGap)); got != 0 {
		t.Errorf("%v batches lost", got)
	}
	if counter(t, r.m.gaps) == 0 {
		t.Error("no gaps: the drops did not happen")
	}
}

// TestMooncakeObjects follows Mooncake store objects through the listener's
// conversion: stored in host memory, offloaded to disk, dropped from
// memory, gone; and the ids-only events of the newer store publisher.
func TestMooncakeObjects(t *testing.T) {
	r := newRig(t, IngestOptions{})
	ix, err := r.set.Index(testKey, testBS)
	if err != nil {
		t.Fatal(err)
	}
	l := &listener{g: r.g, reg: Registration{Key: testKey, BlockSize: testBS, Worker: 1}, ix: ix, mark: &mark{ranks: map[uint32]bool{}}}
	w := indexer.WorkerRank{Worker: 1, Rank: 0}
	toks := tokensOf(7, 1)
	apply := func(msg mp) {
		t.Helper()
		b, err := l.dec.Decode(msg)
		if err != nil {
			t.Fatal(err)
		}
		for i := range b.Events {
			for _, ev := range l.convert(w, &b.Events[i]) {
				if _, err := ix.Apply(ev); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	tiers := func() indexer.Tier { // of block 0x70
		var t indexer.Tier
		for _, ev := range ix.Dump() {
			if ev.Worker == w && ev.Blocks[0].ID == 0x70 {
				t |= ev.Tier
			}
		}
		return t
	}
	replica := func(b mp, kinds ...string) mp {
		b = b.arr(len(kinds))
		for _, k := range kinds {
			b = b.arr(2).str(k).str("loc")
		}
		return b
	}
	store := replica(mp{}.arr(2).f64(1).arr(1).arr(8).str("BlockStoreEvent").str("obj"), "memory").
		str("m").uint(testBS).str("0x70").str("").tokens(toks)
	update := func(kinds ...string) mp {
		return replica(mp{}.arr(2).f64(1).arr(1).arr(3).str("BlockUpdateEvent").str("obj"), kinds...)
	}
	apply(store)
	if got := tiers(); got != indexer.TierHost {
		t.Fatalf("after store: %s", got)
	}
	apply(update("memory", "disk"))
	if got := tiers(); got != indexer.TierHost|indexer.TierDisk {
		t.Fatalf("after offload: %s", got)
	}
	apply(update("disk"))
	if got := tiers(); got != indexer.TierDisk {
		t.Fatalf("after eviction from memory: %s", got)
	}
	apply(update())
	if got := tiers(); got != 0 {
		t.Fatalf("after removal: %s", got)
	}
	apply(update("memory")) // unknown now: counted, ignored
	if got := counter(t, r.m.eventsDropped.WithLabelValues(dropUnknownObject)); got != 1 {
		t.Errorf("unknown object updates = %v", got)
	}

	// The newer store publisher names blocks the engine already reported.
	dev := engine.BlockStored{BlockHashes: []uint64{0x70}, TokenIDs: toks, BlockSize: testBS}
	if _, err := ix.Apply(indexEvent(w, indexer.TierDevice, dev)); err != nil {
		t.Fatal(err)
	}
	ids := func(typ, medium string, id uint64) mp {
		return mp{}.arr(3).uint(1).arr(1).mapN(3).str("event_type").str(typ).str("medium").str(medium).str("seq_hashes").uints(id).uint(0)
	}
	apply(ids("stored", "cpu", 0x70))
	apply(ids("stored", "disk", 0x99)) // not held: Unknown
	if got := tiers(); got != indexer.TierDevice|indexer.TierHost {
		t.Fatalf("after store-publisher stored: %s", got)
	}
	apply(ids("removed", "cpu", 0x70))
	if got := tiers(); got != indexer.TierDevice {
		t.Fatalf("after store-publisher removed: %s", got)
	}
	apply(mp{}.arr(2).uint(1).arr(1).mapN(1).str("event_type").str("cleared")) // host and disk only
	if got := tiers(); got != indexer.TierDevice {
		t.Fatalf("store clear dropped device blocks: %s", got)
	}
}

// TestIngestUnknownParentResync re-registers a worker whose blocks were
// removed: its next event names a parent only the engine's replay buffer
// still has, and one full-buffer replay restores it.
func TestIngestUnknownParentResync(t *testing.T) {
	r := newRig(t, IngestOptions{})
	p := r.follow(engine.Config{ReplayEndpoint: "tcp://127.0.0.1:0"}, 1)
	w := indexer.WorkerRank{Worker: 1, Rank: 0}
	a := root(10, 2)
	publish(t, p, a)
	r.waitApplied(1, 0, 0)
	if _, err := r.g.Unregister(context.Background(), testKey, 1, nil); err != nil {
		t.Fatal(err)
	}
	r.register(1, 0, p, true)
	r.sync(p, 1, 0)
	b := child(11, 20, 1) // under a's second block, which the index no longer has
	publish(t, p, b)
	// The resync runs when the next batch arrives after the failed apply.
	poll.Until(t, "a resync", func() bool {
		r.sync(p, 1, 0)
		return counter(t, r.m.resyncs) >= 1
	})
	last := r.sync(p, 1, 0)
	r.waitApplied(1, 0, last)
	r.check(expect(t, indexEvent(w, indexer.TierDevice, a), indexEvent(w, indexer.TierDevice, b)))
	if got := counter(t, r.m.resyncs); got != 1 {
		t.Errorf("resyncs = %v, want exactly 1", got)
	}
}

// TestSGLangEpochRestart: a new epoch in SGLang's topic means a new
// publisher, even when the sequence numbers do not go back.
func TestSGLangEpochRestart(t *testing.T) {
	r := newRig(t, IngestOptions{})
	ix, err := r.set.Index(testKey, testBS)
	if err != nil {
		t.Fatal(err)
	}
	l := &listener{g: r.g, reg: Registration{Key: testKey, BlockSize: testBS, Worker: 1}, ix: ix, mark: &mark{ranks: map[uint32]bool{}}}
	w := indexer.WorkerRank{Worker: 1, Rank: 0}
	batch := func(ev engine.BlockStored) []byte {
		payload, err := engine.EncodeBatch(1, []engine.Event{ev}, engine.Config{})
		if err != nil {
			t.Fatal(err)
		}
		return payload
	}
	a, b := root(10, 1), root(20, 1)
	ctx := context.Background()
	l.handle(ctx, []byte("kv\x00sgl-kv-epoch=1"), 0, batch(a), true)
	l.handle(ctx, []byte("kv\x00sgl-kv-epoch=1"), 1, batch(root(30, 1)), false)
	l.handle(ctx, []byte("kv\x00sgl-kv-epoch=2"), 5, batch(b), false)
	r.flush(1)
	r.check(expect(t, indexEvent(w, indexer.TierDevice, b)))
	if got := counter(t, r.m.restarts); got != 1 {
		t.Errorf("restarts = %v, want 1", got)
	}
	if got := counter(t, r.m.batchesLost.WithLabelValues(lostBeforeJoin)); got != 5 {
		t.Errorf("lost = %v, want 5 (seq 0-4 of the new epoch)", got)
	}
}

// TestIngestSilentPeer: an endpoint that accepts connections and never
// speaks ZMTP leaves the listener retrying, not hung, and unregistering
// it returns.
func TestIngestSilentPeer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns sync.WaitGroup
	var mu sync.Mutex
	var held []net.Conn
	conns.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	})
	t.Cleanup(func() {
		ln.Close()
		conns.Wait()
		for _, c := range held {
			c.Close()
		}
	})
	r := newRig(t, IngestOptions{DialTimeout: 50 * time.Millisecond, FailAfter: 2})
	endpoint := "tcp://" + ln.Addr().String()
	if err := r.g.Register(Registration{Key: testKey, BlockSize: testBS, Worker: 1, Endpoint: endpoint, ReplayEndpoint: endpoint}); err != nil {
		t.Fatal(err)
	}
	l := r.waitStatus(1, 0, StatusFailed)
	if !strings.Contains(l.LastError, "timeout") {
		t.Errorf("last error %q does not say the handshake timed out", l.LastError)
	}
	if ok, err := r.g.Unregister(context.Background(), testKey, 1, nil); !ok || err != nil {
		t.Fatalf("unregister: %v %v", ok, err)
	}
}

// TestIngestConcurrentControl pauses, resumes, re-registers and
// unregisters one worker from several goroutines while its publisher
// streams: the race detector and goleak check that no listener runs twice
// and none is left behind.
func TestIngestConcurrentControl(t *testing.T) {
	r := newRig(t, IngestOptions{})
	p := enginetest.Start(t, engine.Config{ReplayEndpoint: "tcp://127.0.0.1:0"})
	reg := r.register(1, 0, p, true)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := uint64(0); ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			publish(t, p, root(1000+i, 1))
		}
	})
	ops := []func(){
		func() { r.g.Pause(testKey, 1, nil) },
		func() { r.g.Resume(testKey, 1, nil) },
		func() {
			if err := r.g.Register(reg); err != nil {
				t.Error(err)
			}
		},
		func() {
			if _, err := r.g.Unregister(context.Background(), testKey, 1, nil); err != nil {
				t.Error(err)
			}
		},
	}
	var ctl sync.WaitGroup
	for g := range 4 {
		ctl.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 9))
			for range 30 {
				ops[rng.IntN(len(ops))]()
			}
		})
	}
	ctl.Wait()
	close(stop)
	wg.Wait()
	// Whatever the interleaving, the worker ends registered and consuming.
	if err := r.g.Register(reg); err != nil {
		t.Fatal(err)
	}
	r.g.Resume(testKey, 1, nil)
	r.sync(p, 1, 0)
	if n := len(r.g.Listeners()); n != 1 {
		t.Errorf("%d listeners, want 1", n)
	}
}

func removed(w indexer.WorkerRank, t indexer.Tier, hashes ...uint64) indexer.Event {
	return indexer.Event{Kind: indexer.Removed, Worker: w, Tier: t, IDs: hashes}
}
