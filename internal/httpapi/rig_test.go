package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/bench/engine"
	"github.com/kvgate/kvgate/bench/engine/enginetest"
	"github.com/kvgate/kvgate/indexer"
	"github.com/kvgate/kvgate/indexer/kvevents"
	"github.com/kvgate/kvgate/internal/admin"
	"github.com/kvgate/kvgate/internal/poll"
	"github.com/kvgate/kvgate/internal/stacktest"
	"github.com/kvgate/kvgate/scheduler"
	"github.com/kvgate/kvgate/scheduler/catalog"
	"github.com/kvgate/kvgate/scheduler/scrape"
)

// This file holds the test rig of the scheduler's routes (a catalog and
// the loads following it, behind a real admin HTTP server) and its checks
// of GET /workers views. workers_test.go and status_test.go test the
// catalog's routes, service_test.go the slot tracker and selection
// service's, replica_test.go replica sync's.

const testBS = 4 // tokens per block of the indexes the tests publish to

var (
	quiet  = slog.New(slog.DiscardHandler)
	active = catalog.StatusActive
	paused = catalog.StatusPaused
	failed = catalog.StatusFailed
	// pending is the initial state of a listener.
	pending = catalog.StatusPending
)

type rigOptions struct {
	set     indexer.Options
	catalog catalog.Options
	loads   scheduler.LoadOptions
	ingest  kvevents.IngestOptions
	token   string
	// scrape, when not nil, configures the scraper GET /workers shows.
	scrape *scrape.Options
	// testRoutes mounts ListenerTestRoutes (--enable-test-routes).
	testRoutes bool
	// inProcess serves requests by calling the admin handler, without a
	// TCP listener (for fuzzing, where every input gets a fresh rig).
	inProcess bool
}

// rig is a catalog on a fresh Set and Ingester, with loads following it,
// served by an admin Server with the catalog's routes.
type rig struct {
	t       testing.TB
	set     *indexer.Set
	ing     *kvevents.Ingester
	cat     *catalog.Catalog
	loads   *scheduler.Loads
	sc      *scrape.Scraper // nil unless rigOptions.scrape
	reg     *prometheus.Registry
	handler http.Handler
	ts      *httptest.Server // nil when in process
	token   string
}

func newRig(t testing.TB, o rigOptions) *rig {
	t.Helper()
	r := &rig{t: t, reg: prometheus.NewRegistry(), token: o.token}
	st := stacktest.New(t, stacktest.Options{Set: o.set, Ingest: o.ingest, Catalog: o.catalog, Registry: r.reg})
	r.set, r.ing, r.cat = st.Set, st.Ingester, st.Catalog
	r.loads = scheduler.NewLoads(o.loads)
	r.cat.Watch(r.loads.Follow)
	srv := admin.New(admin.Options{Token: o.token, Registerer: r.reg})
	if o.scrape != nil {
		r.sc = scrape.New(r.cat, *o.scrape, r.reg)
	}
	srv.Handle(WorkerRoutes(r.cat, r.sc)...)
	if o.testRoutes {
		srv.Handle(ListenerTestRoutes(r.cat)...)
	}
	r.handler = srv
	if !o.inProcess {
		r.ts = httptest.NewServer(srv)
	}
	t.Cleanup(func() { // before the stack's, registered earlier
		if r.ts != nil {
			r.ts.Close()
		}
	})
	return r
}

// jsonObj is a JSON request body.
type jsonObj map[string]any

// with returns a copy of o with the key/value pairs kv added.
func (o jsonObj) with(kv ...any) jsonObj {
	out := maps.Clone(o)
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i].(string)] = kv[i+1]
	}
	return out
}

// without returns a copy of o without keys.
func (o jsonObj) without(keys ...string) jsonObj {
	out := maps.Clone(o)
	for _, k := range keys {
		delete(out, k)
	}
	return out
}

// who is the identity part of a body, in the indexer's words; tenant ""
// leaves tenant_id out.
func who(model, tenant string, id uint64) jsonObj {
	o := jsonObj{"instance_id": id, "model_name": model}
	if tenant != "" {
		o["tenant_id"] = tenant
	}
	return o
}

// rankBody is the indexer's /register body for one rank.
func rankBody(model, tenant string, id uint64, rank uint32, endpoint string) jsonObj {
	return who(model, tenant, id).with("block_size", testBS, "dp_rank", rank, "endpoint", endpoint)
}

// rangeBody is the slot tracker's /register body.
func rangeBody(model, tenant string, id uint64, start, size uint32) jsonObj {
	return who(model, tenant, id).without("instance_id").with("worker_id", id, "block_size", testBS, "dp_start", start, "dp_size", size)
}

// deadEndpoint is an ipc endpoint in a directory that does not exist:
// listeners on it never connect, and nothing else can ever bind it.
func deadEndpoint(name string) string { return "ipc:///nonexistent/kvgate-httpapi-test/" + name }

// closedPort returns a tcp endpoint on a loopback port nobody listens on.
func closedPort(t testing.TB) string { return stacktest.ClosedPort(t) }

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
func (r *rig) register(bodies ...jsonObj) {
	r.t.Helper()
	r.postAll("/register", http.StatusCreated, bodies)
}

// unregister unregisters bodies, which must succeed.
func (r *rig) unregister(bodies ...jsonObj) {
	r.t.Helper()
	r.postAll("/unregister", http.StatusOK, bodies)
}

func (r *rig) postAll(path string, status int, bodies []jsonObj) {
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

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func rk(worker uint64, rank uint32) indexer.WorkerRank {
	return indexer.WorkerRank{Worker: worker, Rank: rank}
}

// highest is the aggregate of the states of a GET /workers entry's
// listeners, for checking views: failed > pending > active > paused;
// active without listeners.
func highest(ls map[string]listenerView) catalog.Status {
	if len(ls) == 0 {
		return active
	}
	seen := map[catalog.Status]bool{}
	for _, l := range ls {
		seen[l.Status] = true
	}
	for _, s := range []catalog.Status{failed, pending, active} {
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
