package sim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/bench/engine"
	"github.com/kvgate/kvgate/indexer"
	"github.com/kvgate/kvgate/indexer/kvevents"
	"github.com/kvgate/kvgate/internal/poll"
	"github.com/prometheus/client_golang/prometheus"
)

// startFleet starts a fleet on loopback with free ports, closed at cleanup.
func startFleet(t *testing.T, cfg Config) *Fleet {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f, err := Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := f.Close(); err != nil {
			t.Errorf("close fleet: %v", err)
		}
	})
	return f
}

// follower is kvgate's event path (ingester and index set) subscribed to
// every rank of a fleet.
type follower struct {
	set *indexer.Set
	g   *kvevents.Ingester
	reg *prometheus.Registry
	ix  *indexer.Index
}

func follow(t *testing.T, f *Fleet) *follower {
	t.Helper()
	cfg := f.Config()
	fl := &follower{set: indexer.NewSet(indexer.Options{EventThreads: 2}), reg: prometheus.NewRegistry()}
	fl.g = kvevents.NewIngester(fl.set, kvevents.IngestOptions{
		Logger:     slog.New(slog.NewTextHandler(io.Discard, nil)),
		Metrics:    kvevents.NewMetrics(fl.reg),
		MinBackoff: 5 * time.Millisecond, MaxBackoff: 50 * time.Millisecond,
	})
	t.Cleanup(func() {
		fl.g.Close()
		fl.set.Close()
	})
	key := indexer.Key{Model: cfg.Model, Tenant: indexer.DefaultTenant}
	for _, w := range f.Workers() {
		for r := range w.Ranks() {
			err := fl.g.Register(kvevents.Registration{
				Key: key, BlockSize: cfg.Engine.BlockSize, Worker: w.ID, Rank: uint32(r),
				Endpoint: w.EventEndpoints()[r], ReplayEndpoint: w.ReplayEndpoints()[r], Topic: cfg.Topic,
			})
			if err != nil {
				t.Fatal(err)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		if err := w.WaitSubscribed(ctx); err != nil {
			t.Fatal(err)
		}
		cancel()
	}
	var err error
	if fl.ix, err = fl.set.Index(key, cfg.Engine.BlockSize); err != nil {
		t.Fatal(err)
	}
	return fl
}

func (fl *follower) counter(t *testing.T, name string) float64 {
	t.Helper()
	mfs, err := fl.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			sum := 0.0
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
			return sum
		}
	}
	return 0
}

// agrees reports whether kvgate's index, fed only by the fleet's events,
// knows exactly what every rank caches: the same number of blocks per
// rank, and for every prompt the same cached prefix per rank.
func (fl *follower) agrees(f *Fleet, prompts []Request) (bool, string) {
	for _, w := range f.Workers() {
		for r, rk := range w.Ranks() {
			wr := indexer.WorkerRank{Worker: w.ID, Rank: uint32(r)}
			if got, want := fl.ix.RankBlocks(wr), rk.Stats().CachedBlocks; got != want {
				return false, fmt.Sprintf("%v: index has %d blocks, cache %d", wr, got, want)
			}
		}
	}
	var dst []indexer.Overlap
	for i, p := range prompts {
		dst = fl.ix.MatchTokens(p.Prompt, p.LoRA, dst[:0])
		got := map[indexer.WorkerRank]int{}
		for _, o := range dst {
			got[o.Worker] = int(o.Device)
		}
		for _, w := range f.Workers() {
			for r, rk := range w.Ranks() {
				wr := indexer.WorkerRank{Worker: w.ID, Rank: uint32(r)}
				if want := rk.cachedPrefix(p.Prompt, p.LoRA); got[wr] != want {
					return false, fmt.Sprintf("prompt %d on %v: index matches %d blocks, cache holds %d", i, wr, got[wr], want)
				}
			}
		}
	}
	return true, ""
}

// waitAgree waits until the index agrees with the caches, or fails the
// test saying where they last differed.
func (fl *follower) waitAgree(t *testing.T, f *Fleet, reqs []Request) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ok, why := fl.agrees(f, reqs)
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the index never agreed with the caches: %s", why)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// runRequests submits reqs round robin over the fleet's ranks, n at a time, and
// waits for all to finish.
func runRequests(t *testing.T, f *Fleet, reqs []Request) {
	t.Helper()
	var ranks []*Rank
	for _, w := range f.Workers() {
		ranks = append(ranks, w.Ranks()...)
	}
	var wg sync.WaitGroup
	errs := make(chan error, len(reqs))
	for i, req := range reqs {
		s, err := ranks[i%len(ranks)].Submit(req)
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			for {
				p, err := s.Wait(context.Background())
				if err != nil {
					errs <- err
					return
				}
				if p.Done {
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// workload is requests over a few shared prefixes, with adapters, under
// cache pressure.
func workload(seed uint64, n int) []Request {
	rng := rand.New(rand.NewPCG(seed, seed))
	bases := [][]uint32{prompt(1, 400), prompt(2, 400), prompt(3, 400), prompt(4, 400)}
	var reqs []Request
	for i := range n {
		base := bases[rng.IntN(len(bases))]
		p := append(slices.Clone(base[:rng.IntN(len(base))+1]), prompt(1000+i, rng.IntN(80))...)
		lora := ""
		if i%7 == 0 {
			lora = "adapter"
		}
		reqs = append(reqs, Request{Prompt: p, LoRA: lora, MaxTokens: rng.IntN(40) + 1, Seed: uint64(i)})
	}
	return reqs
}

// TestEventsReproduceCache drives a fleet (2 workers x 2 ranks, small
// caches, both event encodings) and checks that kvgate's own ZMQ
// listeners and decoders, fed by nothing but the published events, end up
// knowing exactly what each rank caches.
func TestEventsReproduceCache(t *testing.T) {
	for _, enc := range []engine.Encoding{engine.MapEncoding, engine.ArrayEncoding} {
		t.Run(enc.String(), func(t *testing.T) {
			f := startFleet(t, Config{
				Workers: 2, DPSize: 2, LoRA: []string{"adapter"}, Encoding: enc, Topic: "kv",
				Engine: EngineConfig{NumBlocks: 120, MaxModelLen: 1000, Speedup: 1e6},
			})
			fl := follow(t, f)
			reqs := workload(1, 120)
			runRequests(t, f, reqs)
			fl.waitAgree(t, f, reqs)
			if fl.counter(t, "kvgate_kv_event_blocks_removed_total") == 0 {
				t.Error("no eviction reached the index: the workload is too small for the cache")
			}
			// A prefix cache reset reaches the index as AllBlocksCleared.
			for _, w := range f.Workers() {
				for _, rk := range w.Ranks() {
					if !rk.ResetPrefixCache() {
						t.Fatal("reset refused on an idle rank")
					}
				}
			}
			poll.Until(t, "the index to empty after the resets", func() bool {
				for _, w := range f.Workers() {
					for r := range w.Ranks() {
						if fl.ix.RankBlocks(indexer.WorkerRank{Worker: w.ID, Rank: uint32(r)}) != 0 {
							return false
						}
					}
				}
				return true
			})
		})
	}
}

// TestReplayAfterDroppedEvents drops about a third of the live batches;
// kvgate's listeners detect the gaps and replay them from the ranks'
// replay sockets, and still end up agreeing with the caches.
func TestReplayAfterDroppedEvents(t *testing.T) {
	f := startFleet(t, Config{
		Workers: 1, DPSize: 2, Seed: 3,
		Faults: Faults{DropEvents: 0.3},
		Engine: EngineConfig{NumBlocks: 120, MaxModelLen: 1000, Speedup: 1e6},
	})
	fl := follow(t, f)
	reqs := workload(2, 80)
	runRequests(t, f, reqs)
	// A gap is seen only when a later batch arrives: keep the ranks busy
	// with one more small request each until the index has caught up.
	extra := 0
	poll.Until(t, "the index to agree with the caches after drops", func() bool {
		if ok, _ := fl.agrees(f, reqs); ok {
			return true
		}
		more := Request{Prompt: prompt(5000+extra, 40), MaxTokens: 1, Seed: uint64(extra)}
		extra++
		runRequests(t, f, []Request{more, more})
		reqs = append(reqs, more)
		return false
	})
	if fl.counter(t, "kvgate_kv_event_gaps_total") == 0 || fl.counter(t, "kvgate_kv_event_batches_replayed_total") == 0 {
		t.Errorf("gaps %v, replayed %v: the drops did not exercise replay",
			fl.counter(t, "kvgate_kv_event_gaps_total"), fl.counter(t, "kvgate_kv_event_batches_replayed_total"))
	}
}

// TestRestart restarts a worker: requests in flight fail with
// ErrRestarted, the cache is empty, the publishers come back on the same
// ports numbering from 0, and kvgate (detecting the restart) follows.
func TestRestart(t *testing.T) {
	// Real time (Speedup 1), so that the long request below is still
	// running when the restart comes: its 900 decode steps take seconds.
	f := startFleet(t, Config{Workers: 1, Engine: EngineConfig{NumBlocks: 200, MaxModelLen: 1000, Speedup: 1}})
	fl := follow(t, f)
	w := f.Workers()[0]
	reqs := workload(4, 6)
	runRequests(t, f, reqs)
	fl.waitAgree(t, f, reqs)
	endpoints := slices.Clone(w.EventEndpoints())

	// A long request is in flight while the worker restarts.
	slow := startFleetSlowRequest(t, w)
	if err := w.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := waitDone(slow); !errors.Is(err, ErrRestarted) {
		t.Errorf("request in flight: %v, want ErrRestarted", err)
	}
	if st := w.Ranks()[0].Stats(); st.CachedBlocks != 0 || st.Running != 0 {
		t.Errorf("after restart: %d cached, %d running", st.CachedBlocks, st.Running)
	}
	if !slices.Equal(endpoints, w.EventEndpoints()) {
		t.Errorf("endpoints moved: %v -> %v", endpoints, w.EventEndpoints())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := w.WaitSubscribed(ctx); err != nil {
		t.Fatal(err)
	}
	after := workload(5, 4)
	runRequests(t, f, after)
	fl.waitAgree(t, f, append(slices.Clone(reqs), after...))
}

func startFleetSlowRequest(t *testing.T, w *Worker) *Seq {
	t.Helper()
	rk := w.Ranks()[0]
	s, err := rk.Submit(Request{Prompt: prompt(77, 100), MaxTokens: 900})
	if err != nil {
		t.Fatal(err)
	}
	// Wait for its first token: it is running.
	if _, err := s.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s
}

func waitDone(s *Seq) (Progress, error) {
	for {
		p, err := s.Wait(context.Background())
		if err != nil || p.Done {
			return p, err
		}
	}
}

func TestConfigValidation(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"negative workers", Config{Workers: -1}, "workers"},
		{"port overflow", Config{Workers: 10, BasePort: 65530}, "base port"},
		{"drop fraction", Config{Faults: Faults{DropEvents: 1.5}}, "drop events"},
		{"fail rate", Config{Faults: Faults{FailRate: -0.1}}, "fail rate"},
		{"negative delay", Config{Faults: Faults{Delay: -time.Second}}, "delay"},
		{"engine", Config{Engine: EngineConfig{Watermark: 2}}, "watermark"},
		{"tokenizer", Config{Tokenizer: "/nonexistent"}, "nonexistent"},
		{"mean output tokens", Config{MeanOutputTokens: 0.5}, "mean output tokens"},
		{"mean output tokens NaN", Config{MeanOutputTokens: math.NaN()}, "mean output tokens"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := Start(context.Background(), tc.cfg)
			if err == nil {
				f.Close()
				t.Fatal("Start accepted the configuration")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not mention %q", err, tc.want)
			}
		})
	}
}

// TestFixedPorts places a fleet on explicit base ports: the i-th worker
// (0-based; id FirstID+i) has its HTTP server on base+i, rank r's
// publisher on eventBase+i*dp+r (vLLM's port-plus-rank rule) and its
// replay socket likewise.
func TestFixedPorts(t *testing.T) {
	var f *Fleet
	var base, events, replay int
	for attempt := 0; f == nil; attempt++ {
		// Free ports from the OS; the ranges after them are very likely free.
		base, events, replay = freePort(t), freePort(t), freePort(t)
		var err error
		f, err = Start(context.Background(), Config{Workers: 2, DPSize: 2, FirstID: 5, BasePort: base, EventBasePort: events, ReplayBasePort: replay})
		if err != nil {
			if attempt == 5 || !strings.Contains(err.Error(), "in use") {
				t.Fatal(err)
			}
			continue
		}
		t.Cleanup(func() { f.Close() })
	}
	for i, w := range f.Workers() {
		if want := fmt.Sprintf("http://127.0.0.1:%d", base+i); w.URL() != want {
			t.Errorf("worker %d url %s, want %s", w.ID, w.URL(), want)
		}
		for r := range 2 {
			if want := fmt.Sprintf("tcp://127.0.0.1:%d", events+2*i+r); w.EventEndpoints()[r] != want {
				t.Errorf("worker %d rank %d events %s, want %s", w.ID, r, w.EventEndpoints()[r], want)
			}
			if want := fmt.Sprintf("tcp://127.0.0.1:%d", replay+2*i+r); w.ReplayEndpoints()[r] != want {
				t.Errorf("worker %d rank %d replay %s, want %s", w.ID, r, w.ReplayEndpoints()[r], want)
			}
		}
	}
	// The first worker, id FirstID, has the base ports: ports follow the
	// worker's place in the fleet, not its id.
	if ids := []uint64{f.Workers()[0].ID, f.Workers()[1].ID}; !slices.Equal(ids, []uint64{5, 6}) {
		t.Errorf("ids %v", ids)
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// TestRestartEvery: with Faults.RestartEvery the fleet restarts its
// workers in turn, each coming back serving requests.
func TestRestartEvery(t *testing.T) {
	f := startFleet(t, Config{Workers: 2, Faults: Faults{RestartEvery: 5 * time.Millisecond},
		Engine: EngineConfig{NumBlocks: 64, Speedup: 1e6}})
	restarts := func(w *Worker) int {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.restart
	}
	poll.Until(t, "both workers to restart", func() bool {
		return restarts(f.Workers()[0]) > 0 && restarts(f.Workers()[1]) > 0
	})
	// A request may meet a restart; a later one gets through.
	poll.Until(t, "a request to complete between restarts", func() bool {
		s, err := f.Workers()[0].Ranks()[0].Submit(Request{Prompt: prompt(1, 20), MaxTokens: 1})
		if err != nil {
			t.Fatal(err)
		}
		_, err = waitDone(s)
		return err == nil
	})
}
