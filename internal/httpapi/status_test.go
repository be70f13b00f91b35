package httpapi

import (
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/indexer"
	"github.com/kvgate/kvgate/indexer/kvevents"
	"github.com/kvgate/kvgate/internal/poll"
	"github.com/kvgate/kvgate/scheduler/catalog"
)

// These tests drive the catalog's states over its routes: listener and
// worker status, pausing, the kvgate_workers gauges, readiness and
// concurrent changes.

func TestWorkerStatusWithAClosedPort(t *testing.T) {
	// Rank 0 of the worker publishes; rank 1 points at a closed port and
	// fails every attempt: the worker is pending while the listener keeps
	// trying, failed once it has failed FailAfter times in a row.
	for _, tc := range []struct {
		name      string
		failAfter int
		want      catalog.Status
	}{
		{"retrying", 1 << 30, pending},
		{"given up", 2, failed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, rigOptions{ingest: kvevents.IngestOptions{FailAfter: tc.failAfter}})
			r.follow("m", "", 1, 0)
			r.register(rankBody("m", "", 1, 1, closedPort(t)))
			w := r.waitWorker("m", "default", 1, "rank 0 active, rank 1 failing", func(w workerView) bool {
				dead := w.Listeners["1"]
				return w.Listeners["0"].Status == active && dead.LastError != "" && (tc.want == pending || dead.Status == failed)
			})
			if got := w.Listeners["1"].Status; got != tc.want {
				t.Errorf("closed port listener %s, want %s", got, tc.want)
			}
			if w.Status != tc.want {
				t.Errorf("worker %s, want %s: %+v", w.Status, tc.want, w.Listeners)
			}
			if err := checkView(w); err != nil {
				t.Error(err)
			}
		})
	}
}

func TestPauseResumeListener(t *testing.T) {
	r := newRig(t, rigOptions{testRoutes: true})
	key := indexer.Key{Model: "m", Tenant: "default"}
	p0 := r.follow("m", "", 1, 0)
	r.follow("m", "", 1, 1)
	r.waitWorker("m", "default", 1, "both ranks active", func(w workerView) bool {
		return w.Listeners["0"].Status == active && w.Listeners["1"].Status == active
	})
	tokens := r.storeBlocks(p0, key, indexer.WorkerRank{Worker: 1, Rank: 0}, 10, 3)
	listeners := func(rep reply, want int) {
		t.Helper()
		if n, _ := rep.expect(t, http.StatusOK)["listeners"].(float64); int(n) != want {
			t.Errorf("%s changed %v listeners, want %d", rep.body, n, want)
		}
	}
	statuses := func(want ...catalog.Status) {
		t.Helper()
		w, _ := r.worker("m", "default", 1)
		if got := []catalog.Status{w.Listeners["0"].Status, w.Listeners["1"].Status, w.Status}; !slices.Equal(got, want) {
			t.Errorf("ranks 0, 1 and worker %v, want %v", got, want)
		}
	}

	// Pausing waits for the listener to stop: the state shows at once.
	listeners(r.post("/test/pause_listener", jsonObj{"instance_id": 1, "dp_rank": 0}), 1)
	statuses(paused, active, active)
	listeners(r.post("/test/pause_listener", jsonObj{"worker_id": 1}), 1) // rank 1: rank 0 is paused already
	statuses(paused, paused, paused)
	if got := r.matched(key, tokens)[indexer.WorkerRank{Worker: 1, Rank: 0}]; got != 3 {
		t.Errorf("paused worker matches %d blocks, want its 3", got)
	}
	listeners(r.post("/test/resume_listener", jsonObj{"instance_id": 1, "dp_rank": 1}), 1)
	r.waitWorker("m", "default", 1, "rank 1 resumed", func(w workerView) bool { return w.Listeners["1"].Status == active })
	statuses(paused, active, active)
	listeners(r.post("/test/resume_listener", jsonObj{"instance_id": 1}), 1)
	r.waitWorker("m", "default", 1, "active again", func(w workerView) bool { return w.Status == active && w.Listeners["0"].Status == active })

	r.run(t, []step{
		{name: "pause unknown worker", path: "/test/pause_listener", body: jsonObj{"instance_id": 2}, status: 404},
		{name: "resume unknown rank", path: "/test/resume_listener", body: jsonObj{"instance_id": 1, "dp_rank": 5}, status: 404},
		{name: "pause without id", path: "/test/pause_listener", body: jsonObj{"dp_rank": 0}, status: 400, errHas: []string{"instance_id"}},
	})
}

// gauges returns the kvgate_workers gauges by status.
func (r *rig) gauges() map[string]float64 {
	r.t.Helper()
	mfs, err := r.reg.Gather()
	if err != nil {
		r.t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "kvgate_workers" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "status" {
					out[l.GetValue()] = m.GetGauge().GetValue()
				}
			}
		}
	}
	return out
}

// waitGauges waits until the kvgate_workers gauges count the workers
// active, pending, failed and paused given.
func (r *rig) waitGauges(nActive, nPending, nFailed, nPaused float64) {
	r.t.Helper()
	want := map[string]float64{"active": nActive, "pending": nPending, "failed": nFailed, "paused": nPaused}
	var got map[string]float64
	defer func() {
		if r.t.Failed() {
			r.t.Logf("last kvgate_workers gauges: %v", got)
		}
	}()
	poll.Until(r.t, fmt.Sprintf("kvgate_workers gauges %v", want), func() bool {
		got = r.gauges()
		return maps.Equal(got, want)
	})
}

func TestWorkerGauges(t *testing.T) {
	// A peer that accepts TCP connections and never answers keeps a
	// listener connecting, hence pending, for DialTimeout.
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := newRig(t, rigOptions{ingest: kvevents.IngestOptions{DialTimeout: time.Hour}, testRoutes: true})
	t.Cleanup(func() { _ = silent.Close() }) // before the rig's cleanup
	r.waitGauges(0, 0, 0, 0)

	r.register(rangeBody("m", "", 1, 0, 2))
	r.follow("m", "", 2, 0)
	r.register(rankBody("m", "", 3, 0, "tcp://"+silent.Addr().String()))
	r.register(rankBody("m", "other", 4, 0, closedPort(t)))
	r.waitGauges(2, 1, 1, 0)

	r.post("/test/pause_listener", jsonObj{"instance_id": 2}).expect(t, http.StatusOK)
	r.waitGauges(1, 1, 1, 1)
	r.unregister(who("m", "", 1), who("m", "", 2), who("m", "", 3), who("m", "other", 4))
	r.waitGauges(0, 0, 0, 0)
}

// checkHold checks that HoldReady(reason) holds readiness back, with the
// given worker counts, until HoldReady(""), and that /ready was 200 before.
func (r *rig) checkHold(reason string, workers, activeWorkers int) {
	r.t.Helper()
	r.wantReady(true, "", workers, activeWorkers)
	r.cat.HoldReady(reason)
	r.wantReady(false, reason, workers, activeWorkers)
	r.cat.HoldReady("")
	r.wantReady(true, "", workers, activeWorkers)
}

// readiness returns GET /ready's status and body.
func (r *rig) readiness() (int, map[string]any) {
	r.t.Helper()
	rep := r.do(http.MethodGet, "/ready", nil)
	m, err := rep.object()
	if err != nil {
		r.t.Fatal(err)
	}
	return rep.status, m
}

// wantReady checks GET /ready: 200 {"status": "ready"}, or 503 with an
// error containing reason; and the worker counts.
func (r *rig) wantReady(ready bool, reason string, workers, activeWorkers int) {
	r.t.Helper()
	status, m := r.readiness()
	msg, _ := m["error"].(string)
	switch {
	case ready && (status != http.StatusOK || m["status"] != "ready"):
		r.t.Errorf("GET /ready: %d %v, want 200 ready", status, m)
	case !ready && (status != http.StatusServiceUnavailable || msg == "" || !strings.Contains(msg, reason)):
		r.t.Errorf("GET /ready: %d %v, want 503 with an error about %q", status, m, reason)
	}
	if m["workers"] != float64(workers) || m["active_workers"] != float64(activeWorkers) {
		r.t.Errorf("GET /ready: %v, want %d workers, %d active", m, workers, activeWorkers)
	}
}

func TestReadyNeedsASchedulableWorker(t *testing.T) {
	r := newRig(t, rigOptions{testRoutes: true})
	r.wantReady(false, "", 0, 0)
	r.register(rankBody("m", "", 1, 0, deadEndpoint("ready")))
	r.wantReady(false, "", 1, 0)
	r.register(rangeBody("m", "", 2, 0, 1))
	r.checkHold("recovering the index from peers", 2, 1)

	// Paused workers can be scheduled; pending ones cannot.
	r.follow("m", "", 3, 0)
	r.waitWorker("m", "default", 3, "active", func(w workerView) bool { return w.Status == active })
	r.post("/test/pause_listener", who("m", "", 3)).expect(t, http.StatusOK)
	r.unregister(who("m", "", 2))
	r.wantReady(true, "", 2, 0)
	r.unregister(who("m", "", 3))
	r.wantReady(false, "", 1, 0)
}

func TestReadyStartupGate(t *testing.T) {
	r := newRig(t, rigOptions{catalog: catalog.Options{MinInitialWorkers: 2}})
	r.wantReady(false, "", 0, 0)
	if _, m := r.readiness(); m["min_initial_workers"] != float64(2) {
		t.Errorf("GET /ready %v does not say it waits for 2 workers", m)
	}
	r.register(rangeBody("m", "", 1, 0, 1))
	r.wantReady(false, "", 1, 1)
	// A worker whose listener never connects is not active.
	r.register(rankBody("m", "", 2, 0, deadEndpoint("gate")))
	r.wantReady(false, "", 2, 1)
	r.cat.HoldReady("held")
	r.register(rangeBody("m", "t", 3, 0, 1))
	r.wantReady(false, "held", 3, 2)
	r.cat.HoldReady("")
	r.wantReady(true, "", 3, 2)
	// The gate stays open when workers leave.
	r.unregister(who("m", "", 1), who("m", "", 2))
	r.checkHold("held again", 1, 1)
}

func TestUnregisteringWorkerIsNotActive(t *testing.T) {
	// A held Set keeps /unregister waiting to drop the worker's blocks,
	// after it stopped the worker's listeners: the worker is leaving.
	r := newRig(t, rigOptions{set: indexer.Options{Hold: true}, catalog: catalog.Options{MinInitialWorkers: 1}})
	r.register(rankBody("m", "", 1, 0, deadEndpoint("leaving")))
	r.wantReady(false, "", 1, 0)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer r.set.Release()
	wg.Go(func() {
		if rep, err := r.exchange(http.MethodPost, "/unregister", who("m", "", 1), ""); err != nil || rep.status != http.StatusOK {
			t.Errorf("unregister: %d %s %v", rep.status, rep.body, err)
		}
	})
	poll.Until(t, "the leaving worker's listener to stop", func() bool { return len(r.ing.Listeners()) == 0 })
	// Its listener never connected: whether still listed or not, it must
	// not count as active, nor open the startup gate.
	if w, ok := r.worker("m", "default", 1); ok {
		if err := checkView(w); err != nil || w.Status == active {
			t.Errorf("leaving worker listed as %s (%v)", w.Status, err)
		}
	}
	if rd := r.cat.Ready(); rd.ActiveWorkers != 0 || rd.Ready {
		t.Errorf("while a worker that never connected leaves: %+v", rd)
	}
}

func TestConcurrentRegistrations(t *testing.T) {
	r := newRig(t, rigOptions{})
	models, tenants := []string{"m1", "m2"}, []string{"a", "b"}
	const ids, ranks, goroutines, ops = 3, 3, 8, 60
	// A rank of a worker always publishes on the same endpoint, so rank
	// registrations never conflict; a range may exclude a rank with
	// events (409), and a removal may find nothing (404).
	type op struct {
		path string
		body jsonObj
		ok   []int
	}
	pick := func(rng *rand.Rand) op {
		model, tenant := models[rng.IntN(len(models))], tenants[rng.IntN(len(tenants))]
		id, rank := uint64(1+rng.IntN(ids)), uint32(rng.IntN(ranks))
		switch n := rng.IntN(10); {
		case n < 4:
			ep := deadEndpoint(fmt.Sprintf("%s-%s-%d-%d", model, tenant, id, rank))
			return op{"/register", rankBody(model, tenant, id, rank, ep), []int{201}}
		case n < 6:
			return op{"/register", rangeBody(model, tenant, id, 0, uint32(1+rng.IntN(ranks))), []int{201, 409}}
		case n < 8:
			u := who(model, tenant, id).with("dp_rank", rank)
			return op{"/unregister", u, []int{200, 404}}
		case n < 9:
			return op{"/unregister", who(model, tenant, id), []int{200, 404}}
		}
		return op{"/unregister", who(model, "", id), []int{200, 404}}
	}

	done := make(chan struct{})
	inconsistent := 0 // views, written by the reader
	var readers, writers sync.WaitGroup
	readers.Go(func() {
		// Views read during the changes must be consistent.
		for {
			select {
			case <-done:
				return
			default:
			}
			rep, err := r.exchange(http.MethodGet, "/workers", nil, "")
			var ws []workerView
			if err == nil {
				err = json.Unmarshal(rep.body, &ws)
			}
			if err != nil {
				t.Errorf("GET /workers: %v", err)
				return
			}
			for _, w := range ws {
				if err := checkView(w); err != nil {
					if inconsistent++; inconsistent <= 3 {
						t.Errorf("during changes: %v", err)
					}
				}
			}
			r.gauges()
			r.cat.Ready()
		}
	})
	for g := range goroutines {
		writers.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			for range ops {
				o := pick(rng)
				rep, err := r.exchange(http.MethodPost, o.path, o.body, "")
				if err != nil {
					t.Errorf("POST %s: %v", o.path, err)
					return
				}
				if !slices.Contains(o.ok, rep.status) {
					t.Errorf("POST %s %v: %d %s, want one of %v", o.path, o.body, rep.status, rep.body, o.ok)
				}
			}
		})
	}
	writers.Wait()
	close(done)
	readers.Wait()
	if inconsistent > 3 {
		t.Errorf("%d inconsistent views in all", inconsistent)
	}

	// The catalog and the ingester agree: one listener per event endpoint.
	var want, got []string
	for _, w := range r.cat.Workers("", "") {
		for rank, p := range w.Events {
			if !slices.Contains(w.Ranks, rank) {
				t.Errorf("%s publishes on rank %d outside its ranks %v", w.WorkerKey, rank, w.Ranks)
			}
			want = append(want, fmt.Sprintf("%s worker %d rank %d %s", w.Key, w.ID, rank, p.Endpoint))
		}
	}
	for _, l := range r.ing.Listeners() {
		got = append(got, fmt.Sprintf("%s worker %d rank %d %s", l.Key, l.Worker, l.Rank, l.Endpoint))
	}
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("listeners:\n%s\nwant (catalog):\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	r.checkViews()
	t.Logf("%d workers, %d listeners left", len(r.workers("")), len(got))
}

// TestTestRoutesOff checks that Dynamo's test routes are 404 unless
// mounted (--enable-test-routes), and change nothing.
func TestTestRoutesOff(t *testing.T) {
	r := newRig(t, rigOptions{})
	r.follow("m", "", 1, 0)
	before := r.state()
	for _, path := range []string{"/test/pause_listener", "/test/resume_listener"} {
		r.post(path, jsonObj{"instance_id": 1}).expect(t, http.StatusNotFound)
	}
	if after := r.state(); after != before {
		t.Errorf("test routes changed the state:\n%s\nthen:\n%s", before, after)
	}
}
