package scheduler

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/bench/engine"
	"github.com/kvgate/kvgate/bench/engine/enginetest"
	"github.com/kvgate/kvgate/indexer"
	"github.com/kvgate/kvgate/internal/admin"
	"github.com/kvgate/kvgate/internal/poll"
)

// This file holds the test rig (a catalog behind a real admin HTTP server)
// and the tests of the catalog's own logic: status aggregation, readiness,
// metrics and concurrent changes. http_test.go tests the HTTP views.

const testBS = 4 // tokens per block of the indexes the tests publish to

var (
	quiet  = slog.New(slog.DiscardHandler)
	active = StatusActive
	paused = StatusPaused
	failed = StatusFailed
	// pending is the initial state of a listener.
	pending = StatusPending
)

type rigOptions struct {
	set     indexer.Options
	catalog CatalogOptions
	loads   LoadOptions // the catalog's clock is the loads'
	ingest  indexer.IngestOptions
	token   string
	// inProcess serves requests by calling the admin handler, without a
	// TCP listener (for fuzzing, where every input gets a fresh rig).
	inProcess bool
}

// rig is a catalog on a fresh Set and Ingester, with loads following it,
// served by an admin Server.
type rig struct {
	t       testing.TB
	set     *indexer.Set
	ing     *indexer.Ingester
	cat     *Catalog
	loads   *Loads
	reg     *prometheus.Registry
	handler http.Handler
	ts      *httptest.Server // nil when in process
	token   string
}

func newRig(t testing.TB, o rigOptions) *rig {
	t.Helper()
	if o.set.EventThreads == 0 {
		o.set.EventThreads = 2
	}
	r := &rig{t: t, set: indexer.NewSet(o.set), reg: prometheus.NewRegistry(), token: o.token}
	if o.ingest.Logger == nil {
		o.ingest.Logger = quiet
	}
	if o.ingest.MinBackoff == 0 {
		o.ingest.MinBackoff, o.ingest.MaxBackoff = 5*time.Millisecond, 50*time.Millisecond
	}
	if o.ingest.FailAfter == 0 {
		o.ingest.FailAfter = 2
	}
	r.ing = indexer.NewIngester(r.set, o.ingest)
	if o.catalog.Logger == nil {
		o.catalog.Logger = quiet
	}
	if o.catalog.Now == nil {
		o.catalog.Now = o.loads.Now
	}
	r.cat = NewCatalog(r.set, ingestListeners{r.ing}, r.reg, o.catalog)
	r.loads = NewLoads(o.loads)
	r.cat.Watch(r.loads.Follow)
	srv := admin.New(admin.Options{Token: o.token, Registerer: r.reg})
	srv.Handle(r.cat.Routes()...)
	r.handler = srv
	if !o.inProcess {
		r.ts = httptest.NewServer(srv)
	}
	t.Cleanup(func() {
		if r.ts != nil {
			r.ts.Close()
		}
		r.ing.Close() // listeners stop submitting before the Set closes
		r.set.Close()
	})
	return r
}

// obj is a JSON request body.
type obj map[string]any

// with returns a copy of o with the key/value pairs kv added.
func (o obj) with(kv ...any) obj {
	out := maps.Clone(o)
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i].(string)] = kv[i+1]
	}
	return out
}

// without returns a copy of o without keys.
func (o obj) without(keys ...string) obj {
	out := maps.Clone(o)
	for _, k := range keys {
		delete(out, k)
	}
	return out
}

// who is the identity part of a body, in the indexer's words; tenant ""
// leaves tenant_id out.
func who(model, tenant string, id uint64) obj {
	o := obj{"instance_id": id, "model_name": model}
	if tenant != "" {
		o["tenant_id"] = tenant
	}
	return o
}

// rankBody is the indexer's /register body for one rank.
func rankBody(model, tenant string, id uint64, rank uint32, endpoint string) obj {
	return who(model, tenant, id).with("block_size", testBS, "dp_rank", rank, "endpoint", endpoint)
}

// rangeBody is the slot tracker's /register body.
func rangeBody(model, tenant string, id uint64, start, size uint32) obj {
	return who(model, tenant, id).without("instance_id").with("worker_id", id, "block_size", testBS, "dp_start", start, "dp_size", size)
}

// deadEndpoint is an ipc endpoint in a directory that does not exist:
// listeners on it never connect, and nothing else can ever bind it.
func deadEndpoint(name string) string { return "ipc:///nonexistent/kvgate-scheduler-test/" + name }

// closedPort returns a tcp endpoint on a loopback port nobody listens on.
func closedPort(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ep := "tcp://" + ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	return ep
}

// reply is an HTTP answer.
type reply struct {
	status int
	header http.Header
	body   []byte
}

// exchange sends a request with body (nil: none; string or []byte: raw;
// else JSON) and Authorization header auth ("" for none).
func (r *rig) exchange(method, path string, body any, auth string) (reply, error) {
	var rd io.Reader = http.NoBody
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	case string:
		rd = strings.NewReader(b)
	default:
		data, err := json.Marshal(b)
		if err != nil {
			return reply{}, err
		}
		rd = bytes.NewReader(data)
	}
	if r.ts == nil {
		req := httptest.NewRequest(method, path, rd)
		setAuth(req, auth)
		rec := httptest.NewRecorder()
		r.handler.ServeHTTP(rec, req)
		return reply{rec.Code, rec.Header(), rec.Body.Bytes()}, nil
	}
	req, err := http.NewRequest(method, r.ts.URL+path, rd)
	if err != nil {
		return reply{}, err
	}
	setAuth(req, auth)
	resp, err := r.ts.Client().Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, resp.Header, data}, err
}

func setAuth(req *http.Request, auth string) {
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
}

// do sends a request with the rig's token, if any.
func (r *rig) do(method, path string, body any) reply {
	r.t.Helper()
	auth := ""
	if r.token != "" {
		auth = "Bearer " + r.token
	}
	rep, err := r.exchange(method, path, body, auth)
	if err != nil {
		r.t.Fatalf("%s %s: %v", method, path, err)
	}
	return rep
}

func (r *rig) post(path string, body any) reply {
	r.t.Helper()
	return r.do(http.MethodPost, path, body)
}

// register registers bodies, which must succeed.
func (r *rig) register(bodies ...obj) {
	r.t.Helper()
	r.postAll("/register", http.StatusCreated, bodies)
}

// unregister unregisters bodies, which must succeed.
func (r *rig) unregister(bodies ...obj) {
	r.t.Helper()
	r.postAll("/unregister", http.StatusOK, bodies)
}

func (r *rig) postAll(path string, status int, bodies []obj) {
	r.t.Helper()
	for _, b := range bodies {
		r.post(path, b).expect(r.t, status)
	}
}

// object decodes the body, which must be exactly one JSON object.
func (rep reply) object() (map[string]any, error) {
	var m map[string]any
	dec := json.NewDecoder(bytes.NewReader(rep.body))
	if err := dec.Decode(&m); err != nil || m == nil {
		return nil, fmt.Errorf("body %q is not a JSON object: %v", rep.body, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("body %q has data after its JSON object", rep.body)
	}
	return m, nil
}

// check reports how rep differs from a JSON object answer with status.
func (rep reply) check(status int) (map[string]any, error) {
	if rep.status != status {
		return nil, fmt.Errorf("status %d, want %d; body %s", rep.status, status, rep.body)
	}
	if ct := rep.header.Get("Content-Type"); ct != "application/json" {
		return nil, fmt.Errorf("Content-Type %q, want application/json", ct)
	}
	return rep.object()
}

// expect fails the test unless rep is a JSON object answer with status.
func (rep reply) expect(t testing.TB, status int) map[string]any {
	t.Helper()
	m, err := rep.check(status)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// errorOf returns the "error" of an error answer; it fails the test
// unless rep is {"error": "..."} with status.
func (rep reply) errorOf(t testing.TB, status int) string {
	t.Helper()
	msg, _ := rep.expect(t, status)["error"].(string)
	if msg == "" {
		t.Fatalf("error answer without an error: %s", rep.body)
	}
	return msg
}

// workers returns GET /workers with query ("?model_name=..." or "").
func (r *rig) workers(query string) []workerView {
	r.t.Helper()
	rep := r.do(http.MethodGet, "/workers"+query, nil)
	if rep.status != http.StatusOK {
		r.t.Fatalf("GET /workers%s: status %d: %s", query, rep.status, rep.body)
	}
	var ws []workerView
	if err := json.Unmarshal(rep.body, &ws); err != nil || ws == nil {
		r.t.Fatalf("GET /workers%s: %q is not a JSON array: %v", query, rep.body, err)
	}
	return ws
}

// worker returns the GET /workers entry of a worker.
func (r *rig) worker(model, tenant string, id uint64) (workerView, bool) {
	r.t.Helper()
	for _, w := range r.workers("") {
		if w.ModelName == model && w.TenantID == tenant && w.InstanceID == id {
			return w, true
		}
	}
	return workerView{}, false
}

// waitWorker polls GET /workers until the worker's entry satisfies cond
// and returns it.
func (r *rig) waitWorker(model, tenant string, id uint64, what string, cond func(workerView) bool) workerView {
	r.t.Helper()
	var w workerView
	poll.Until(r.t, fmt.Sprintf("worker %d of %s:%s: %s", id, model, tenant, what), func() bool {
		var ok bool
		w, ok = r.worker(model, tenant, id)
		return ok && cond(w)
	})
	return w
}

// state is everything a request could change: the workers as GET /workers
// shows them without the listeners' changing states, every index with its
// block counts, and every listener.
func (r *rig) state() string {
	r.t.Helper()
	var b strings.Builder
	for _, w := range r.workers("") {
		w.Status = ""
		for k, l := range w.Listeners {
			l.Status, l.LastError, l.LastSeq = "", "", nil
			w.Listeners[k] = l
		}
		data, err := json.Marshal(w)
		if err != nil {
			r.t.Fatal(err)
		}
		b.Write(data)
		b.WriteByte('\n')
	}
	for _, k := range r.set.Keys() {
		ix := r.set.Lookup(k)
		fmt.Fprintf(&b, "index %s block_size %d blocks %v\n", k, ix.BlockSize(), ix.BlockCounts())
	}
	for _, l := range r.ing.Listeners() {
		fmt.Fprintf(&b, "listener %s worker %d rank %d endpoint %s replay %s topic %q\n",
			l.Key, l.Worker, l.Rank, l.Endpoint, l.ReplayEndpoint, l.Topic)
	}
	return b.String()
}

// step is one request of a sequence run against one rig.
type step struct {
	name   string
	path   string // a POST route
	body   any
	status int
	errHas []string // substrings of the error of a failure
}

// run sends steps in order. A success must answer {"status": "ok"}; a
// failure must name what is wrong and change nothing.
func (r *rig) run(t *testing.T, steps []step) {
	t.Helper()
	for _, s := range steps {
		before := r.state()
		rep := r.post(s.path, s.body)
		m, err := rep.check(s.status)
		if err != nil {
			t.Errorf("%s: %v", s.name, err)
			continue
		}
		if s.status/100 == 2 {
			if m["status"] != "ok" {
				t.Errorf("%s: success answer %s, want status ok", s.name, rep.body)
			}
			continue
		}
		msg, _ := m["error"].(string)
		for _, sub := range s.errHas {
			if !strings.Contains(msg, sub) {
				t.Errorf("%s: error %q does not mention %q", s.name, msg, sub)
			}
		}
		if msg == "" {
			t.Errorf("%s: failure without an error: %s", s.name, rep.body)
		}
		if after := r.state(); after != before {
			t.Errorf("%s: the failed request changed the state\nbefore:\n%s\nafter:\n%s", s.name, before, after)
		}
	}
}

// follow registers rank of worker id with a new publisher's endpoint and
// waits until the worker's listener has subscribed to it.
func (r *rig) follow(model, tenant string, id uint64, rank uint32) *engine.Publisher {
	r.t.Helper()
	p := enginetest.Start(r.t, engine.Config{})
	r.register(rankBody(model, tenant, id, rank, p.Endpoint()))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.WaitSubscribed(ctx); err != nil {
		r.t.Fatal(err)
	}
	return p
}

// storeBlocks publishes n blocks from the root, engine ids id0, id0+1, ...,
// and waits until the index of key holds them for wr. It returns their
// tokens.
func (r *rig) storeBlocks(p *engine.Publisher, key indexer.Key, wr indexer.WorkerRank, id0 uint64, n int) []uint32 {
	r.t.Helper()
	ids := make([]uint64, n)
	tokens := make([]uint32, n*testBS)
	for i := range ids {
		ids[i] = id0 + uint64(i)
	}
	for i := range tokens {
		tokens[i] = uint32(id0*1000) + uint32(i)
	}
	if _, err := p.Publish(engine.BlockStored{BlockHashes: ids, TokenIDs: tokens, BlockSize: testBS}); err != nil {
		r.t.Fatal(err)
	}
	poll.Until(r.t, fmt.Sprintf("%d blocks of %s in %s", n, wr, key), func() bool { return r.blocks(key)[wr] == n })
	return tokens
}

// blocks returns the block counts of the index of key.
func (r *rig) blocks(key indexer.Key) map[indexer.WorkerRank]int {
	if ix := r.set.Lookup(key); ix != nil {
		return ix.BlockCounts()
	}
	return nil
}

// matched returns the worker ranks of the index of key holding a prefix
// of tokens, with the number of blocks matched on the device.
func (r *rig) matched(key indexer.Key, tokens []uint32) map[indexer.WorkerRank]int {
	out := map[indexer.WorkerRank]int{}
	if ix := r.set.Lookup(key); ix != nil {
		for _, o := range ix.MatchTokens(tokens, "", nil) {
			if o.Device > 0 {
				out[o.Worker] = int(o.Device)
			}
		}
	}
	return out
}

func TestAggregate(t *testing.T) {
	// Every set of listener states; the highest of failed > pending >
	// active > paused wins, and a worker without listeners is active.
	for _, tc := range []struct {
		states []Status
		want   Status
	}{
		{nil, active},
		{[]Status{paused}, paused},
		{[]Status{active}, active},
		{[]Status{pending}, pending},
		{[]Status{failed}, failed},
		{[]Status{paused, active}, active},
		{[]Status{paused, pending}, pending},
		{[]Status{paused, failed}, failed},
		{[]Status{active, pending}, pending},
		{[]Status{active, failed}, failed},
		{[]Status{pending, failed}, failed},
		{[]Status{paused, active, pending}, pending},
		{[]Status{paused, active, failed}, failed},
		{[]Status{paused, pending, failed}, failed},
		{[]Status{active, pending, failed}, failed},
		{[]Status{paused, active, pending, failed}, failed},
		{[]Status{paused, paused, paused}, paused},
		{[]Status{active, active, paused, paused}, active},
	} {
		// The order of the listeners must not matter.
		for shift := range max(len(tc.states), 1) {
			ls := map[uint32]ListenerState{}
			for i, s := range tc.states {
				rank := uint32((i + shift) % len(tc.states))
				ls[rank] = ListenerState{Listener: Listener{Rank: rank}, Status: s}
			}
			if got := aggregate(ls); got != tc.want {
				t.Errorf("aggregate(%v by rank, shifted %d) = %s, want %s", tc.states, shift, got, tc.want)
			}
		}
	}
}

// highest is the aggregate of the states of a GET /workers entry's
// listeners, for checking views: failed > pending > active > paused;
// active without listeners.
func highest(ls map[string]listenerView) Status {
	if len(ls) == 0 {
		return active
	}
	seen := map[Status]bool{}
	for _, l := range ls {
		seen[l.Status] = true
	}
	for _, s := range []Status{failed, pending, active} {
		if seen[s] {
			return s
		}
	}
	return paused
}

// checkView checks that a GET /workers entry is consistent with itself.
func checkView(w workerView) error {
	var errs []string
	fail := func(format string, args ...any) { errs = append(errs, fmt.Sprintf(format, args...)) }
	if w.InstanceID != w.WorkerID {
		fail("instance_id %d != worker_id %d", w.InstanceID, w.WorkerID)
	}
	if !slices.IsSorted(w.DPRanks) || len(slices.Compact(slices.Clone(w.DPRanks))) != len(w.DPRanks) {
		fail("dp_ranks %v not sorted and unique", w.DPRanks)
	}
	if w.DPStart != w.DataParallelStartRank || w.DPSize != w.DataParallelSize {
		fail("dp range %d+%d != data_parallel range %d+%d", w.DPStart, w.DPSize, w.DataParallelStartRank, w.DataParallelSize)
	}
	if n := len(w.DPRanks); n > 0 && (w.DPStart != w.DPRanks[0] || w.DPStart+w.DPSize-1 != w.DPRanks[n-1]) {
		fail("dp range %d+%d does not span dp_ranks %v", w.DPStart, w.DPSize, w.DPRanks)
	}
	if !maps.Equal(w.Endpoints, w.KVEventsEndpoints) {
		fail("endpoints %v != kv_events_endpoints %v", w.Endpoints, w.KVEventsEndpoints)
	}
	if len(w.Listeners) != len(w.Endpoints) {
		fail("listeners %v do not match endpoints %v", w.Listeners, w.Endpoints)
	}
	for rs, ep := range w.Endpoints {
		rank, err := strconv.ParseUint(rs, 10, 32)
		if err != nil || !slices.Contains(w.DPRanks, uint32(rank)) {
			fail("endpoint of rank %q not in dp_ranks %v", rs, w.DPRanks)
		}
		if l := w.Listeners[rs]; l.Endpoint != ep {
			fail("listener of rank %s on %q, endpoint %q", rs, l.Endpoint, ep)
		}
	}
	if want := highest(w.Listeners); w.Status != want {
		fail("status %s, but its listeners %v aggregate to %s", w.Status, w.Listeners, want)
	}
	if em := w.EngineMetrics; em != nil {
		for rs := range em.Ranks {
			if rank, err := strconv.ParseUint(rs, 10, 32); err != nil || !slices.Contains(w.DPRanks, uint32(rank)) {
				fail("engine_metrics of rank %q not in dp_ranks %v", rs, w.DPRanks)
			}
		}
		if em.Fresh && (em.LastError != "" || em.ScrapedAt == nil) {
			fail("engine_metrics fresh with error %q, scraped at %v", em.LastError, em.ScrapedAt)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("worker %d of %s:%s: %s", w.InstanceID, w.ModelName, w.TenantID, strings.Join(errs, "; "))
	}
	return nil
}

// checkViews checks every GET /workers entry with checkView.
func (r *rig) checkViews() {
	r.t.Helper()
	for _, w := range r.workers("") {
		if err := checkView(w); err != nil {
			r.t.Error(err)
		}
	}
}

func TestWorkerStatusWithAClosedPort(t *testing.T) {
	// Rank 0 of the worker publishes; rank 1 points at a closed port and
	// fails every attempt: the worker is pending while the listener keeps
	// trying, failed once it has failed FailAfter times in a row.
	for _, tc := range []struct {
		name      string
		failAfter int
		want      Status
	}{
		{"retrying", 1 << 30, pending},
		{"given up", 2, failed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, rigOptions{ingest: indexer.IngestOptions{FailAfter: tc.failAfter}})
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
	r := newRig(t, rigOptions{})
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
	statuses := func(want ...Status) {
		t.Helper()
		w, _ := r.worker("m", "default", 1)
		if got := []Status{w.Listeners["0"].Status, w.Listeners["1"].Status, w.Status}; !slices.Equal(got, want) {
			t.Errorf("ranks 0, 1 and worker %v, want %v", got, want)
		}
	}

	// Pausing waits for the listener to stop: the state shows at once.
	listeners(r.post("/test/pause_listener", obj{"instance_id": 1, "dp_rank": 0}), 1)
	statuses(paused, active, active)
	listeners(r.post("/test/pause_listener", obj{"worker_id": 1}), 1) // rank 1: rank 0 is paused already
	statuses(paused, paused, paused)
	if got := r.matched(key, tokens)[indexer.WorkerRank{Worker: 1, Rank: 0}]; got != 3 {
		t.Errorf("paused worker matches %d blocks, want its 3", got)
	}
	listeners(r.post("/test/resume_listener", obj{"instance_id": 1, "dp_rank": 1}), 1)
	r.waitWorker("m", "default", 1, "rank 1 resumed", func(w workerView) bool { return w.Listeners["1"].Status == active })
	statuses(paused, active, active)
	listeners(r.post("/test/resume_listener", obj{"instance_id": 1}), 1)
	r.waitWorker("m", "default", 1, "active again", func(w workerView) bool { return w.Status == active && w.Listeners["0"].Status == active })

	r.run(t, []step{
		{name: "pause unknown worker", path: "/test/pause_listener", body: obj{"instance_id": 2}, status: 404},
		{name: "resume unknown rank", path: "/test/resume_listener", body: obj{"instance_id": 1, "dp_rank": 5}, status: 404},
		{name: "pause without id", path: "/test/pause_listener", body: obj{"dp_rank": 0}, status: 400, errHas: []string{"instance_id"}},
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
	r := newRig(t, rigOptions{ingest: indexer.IngestOptions{DialTimeout: time.Hour}})
	t.Cleanup(func() { _ = silent.Close() }) // before the rig's cleanup
	r.waitGauges(0, 0, 0, 0)

	r.register(rangeBody("m", "", 1, 0, 2))
	r.follow("m", "", 2, 0)
	r.register(rankBody("m", "", 3, 0, "tcp://"+silent.Addr().String()))
	r.register(rankBody("m", "other", 4, 0, closedPort(t)))
	r.waitGauges(2, 1, 1, 0)

	r.post("/test/pause_listener", obj{"instance_id": 2}).expect(t, http.StatusOK)
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
	r := newRig(t, rigOptions{})
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
	r := newRig(t, rigOptions{catalog: CatalogOptions{MinInitialWorkers: 2}})
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
	r := newRig(t, rigOptions{set: indexer.Options{Hold: true}, catalog: CatalogOptions{MinInitialWorkers: 1}})
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
		body obj
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
