package httpapi

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/indexer"
	"github.com/kvgate/kvgate/indexer/kvevents"
	"github.com/kvgate/kvgate/internal/admin"
	"github.com/kvgate/kvgate/internal/stacktest"
	"github.com/kvgate/kvgate/scheduler/catalog"
	"github.com/kvgate/kvgate/scheduler/scrape"
)

// These tests drive the catalog's routes over real HTTP requests; see
// rig_test.go for the rig.

func TestRegisterIndexerShape(t *testing.T) {
	r := newRig(t, rigOptions{})
	e0, e1, e2 := deadEndpoint("w1-r0"), deadEndpoint("w1-r1"), deadEndpoint("other")
	w3 := rankBody("m", "", 3, 0, deadEndpoint("w3"))
	r.run(t, []step{
		{name: "first rank", path: "/register", body: rankBody("m", "", 1, 0, e0), status: 201},
		{name: "same rank and endpoint again", path: "/register", body: rankBody("m", "", 1, 0, e0), status: 201},
		{name: "second rank", path: "/register", body: rankBody("m", "", 1, 1, e1), status: 201},
		{name: "same rank, other endpoint", path: "/register", body: rankBody("m", "", 1, 1, e2), status: 409, errHas: []string{e1}},
		{name: "other block size", path: "/register", body: rankBody("m", "", 2, 0, e2).with("block_size", 32), status: 409, errHas: []string{"4", "32"}},
		{name: "other block size, default tenant named", path: "/register", body: rankBody("m", "default", 2, 0, e2).with("block_size", 32), status: 409, errHas: []string{"4", "32"}},
		{name: "other tenant, own block size", path: "/register", body: rankBody("m", "t", 2, 0, e2).with("block_size", 32), status: 201},
		{name: "udp endpoint", path: "/register", body: rankBody("m", "", 3, 0, "udp://127.0.0.1:5557"), status: 400, errHas: []string{"endpoint"}},
		{name: "no port", path: "/register", body: rankBody("m", "", 3, 0, "tcp://127.0.0.1"), status: 400, errHas: []string{"endpoint"}},
		{name: "empty port", path: "/register", body: rankBody("m", "", 3, 0, "tcp://127.0.0.1:"), status: 400, errHas: []string{"endpoint"}},
		{name: "bind address", path: "/register", body: rankBody("m", "", 3, 0, "tcp://*:5557"), status: 400, errHas: []string{"endpoint"}},
		{name: "no transport", path: "/register", body: rankBody("m", "", 3, 0, "127.0.0.1:5557"), status: 400, errHas: []string{"endpoint"}},
		{name: "bad replay endpoint", path: "/register", body: w3.with("replay_endpoint", "tcp://*:5558"), status: 400, errHas: []string{"replay_endpoint"}},
		{name: "no instance_id", path: "/register", body: w3.without("instance_id"), status: 400, errHas: []string{"instance_id"}},
		{name: "no model_name", path: "/register", body: w3.without("model_name"), status: 400, errHas: []string{"model_name"}},
		{name: "empty model_name", path: "/register", body: w3.with("model_name", ""), status: 400, errHas: []string{"model_name"}},
		{name: "no block_size", path: "/register", body: w3.without("block_size"), status: 400, errHas: []string{"block_size"}},
		{name: "no endpoint", path: "/register", body: w3.without("endpoint"), status: 400, errHas: []string{"endpoint"}},
		{name: "ids differ", path: "/register", body: w3.with("worker_id", 4), status: 400, errHas: []string{"instance_id", "worker_id"}},
		{name: "block_size 0", path: "/register", body: w3.with("block_size", 0), status: 400, errHas: []string{"block_size"}},
		{name: "negative block_size", path: "/register", body: w3.with("block_size", -16), status: 400, errHas: []string{"block_size"}},
		{name: "negative instance_id", path: "/register", body: w3.with("instance_id", -3), status: 400, errHas: []string{"instance_id"}},
		{name: "string instance_id", path: "/register", body: w3.with("instance_id", "3"), status: 400, errHas: []string{"instance_id"}},
		{name: "fractional block_size", path: "/register", body: w3.with("block_size", 4.5), status: 400, errHas: []string{"block_size"}},
		{name: "negative dp_rank", path: "/register", body: w3.with("dp_rank", -1), status: 400, errHas: []string{"dp_rank"}},
		{name: "malformed JSON", path: "/register", body: `{"instance_id": 3,`, status: 400},
		{name: "array body", path: "/register", body: `[]`, status: 400},
		{name: "empty body", path: "/register", body: ``, status: 400},
		{name: "trailing data", path: "/register", body: `{"instance_id": 3} {}`, status: 400},
		{name: "same ids, unknown fields", path: "/register", body: w3.with("worker_id", 3, "future_field", jsonObj{"x": 1}), status: 201},
	})

	ws := r.workers("")
	if len(ws) != 3 {
		t.Fatalf("workers %+v, want 3", ws)
	}
	w := ws[0]
	if w.ModelName != "m" || w.TenantID != "default" || w.InstanceID != 1 || w.WorkerID != 1 || w.BlockSize != testBS ||
		w.Source != "zmq" || w.RegisteredBy != catalog.SourceAPI {
		t.Errorf("worker 1: %+v", w)
	}
	if !slices.Equal(w.DPRanks, []uint32{0, 1}) || w.Endpoints["0"] != e0 || w.Endpoints["1"] != e1 || w.DPStart != 0 || w.DPSize != 2 {
		t.Errorf("worker 1 ranks %v endpoints %v range %d+%d, want ranks 0 and 1 on %s and %s", w.DPRanks, w.Endpoints, w.DPStart, w.DPSize, e0, e1)
	}
	if ws[1].InstanceID != 3 || ws[2].TenantID != "t" || ws[2].BlockSize != 32 {
		t.Errorf("workers 3 of m:default and 2 of m:t, got %+v and %+v", ws[1], ws[2])
	}
}

func TestRegisterSlotTrackerShape(t *testing.T) {
	r := newRig(t, rigOptions{})
	w7 := rangeBody("llama", "default", 7, 0, 2)
	r.run(t, []step{
		{name: "range", path: "/register", body: w7, status: 201},
		{name: "same range again", path: "/register", body: w7, status: 201},
		{name: "dp_size 0", path: "/register", body: w7.with("dp_size", 0), status: 400, errHas: []string{"dp_size"}},
		{name: "negative dp_size", path: "/register", body: w7.with("dp_size", -1), status: 400, errHas: []string{"dp_size"}},
		{name: "dp_start without dp_size", path: "/register", body: w7.without("dp_size"), status: 400, errHas: []string{"dp_size"}},
		{name: "overflowing range", path: "/register", body: w7.with("dp_start", uint32(1<<32-1), "dp_size", 2), status: 400},
		{name: "dp_size over the limit", path: "/register", body: w7.with("dp_size", catalog.MaxDPSize+1), status: 400, errHas: []string{"dp_size", "4096"}},
		{name: "dp_rank with a range", path: "/register", body: w7.with("dp_rank", 1), status: 400, errHas: []string{"dp_rank"}},
		{name: "replay_endpoint with a range", path: "/register", body: w7.with("replay_endpoint", "tcp://127.0.0.1:1"), status: 400, errHas: []string{"replay_endpoint"}},
		{name: "dp_start too big", path: "/register", body: w7.with("dp_start", uint64(1<<32)), status: 400, errHas: []string{"dp_start"}},
		{name: "endpoint and range", path: "/register", body: w7.with("endpoint", deadEndpoint("w7")), status: 400, errHas: []string{"endpoint"}},
		{name: "other block size", path: "/register", body: w7.with("worker_id", 8, "block_size", 16), status: 409, errHas: []string{"4", "16"}},
		{name: "last rank", path: "/register", body: rangeBody("llama", "", 8, 1<<32-1, 1), status: 201},
		{name: "rank with events", path: "/register", body: rankBody("llama", "", 9, 3, deadEndpoint("w9-r3")), status: 201},
		{name: "range without the rank with events", path: "/register", body: rangeBody("llama", "", 9, 0, 2), status: 409, errHas: []string{"3"}},
		{name: "range ending before it", path: "/register", body: rangeBody("llama", "", 9, 0, 3), status: 409},
		{name: "range starting after it", path: "/register", body: rangeBody("llama", "", 9, 4, 1), status: 409},
		{name: "range with the rank with events", path: "/register", body: rangeBody("llama", "", 9, 2, 2), status: 201},
	})

	ws := r.workers("?model_name=llama")
	want := []struct {
		id          uint64
		start, size uint32
		ranks       []uint32
		listeners   int
	}{{7, 0, 2, []uint32{0, 1}, 0}, {8, 1<<32 - 1, 1, []uint32{1<<32 - 1}, 0}, {9, 2, 2, []uint32{2, 3}, 1}}
	if len(ws) != len(want) {
		t.Fatalf("workers %+v, want %d", ws, len(want))
	}
	for i, wt := range want {
		w := ws[i]
		if w.WorkerID != wt.id || w.DPStart != wt.start || w.DPSize != wt.size || !slices.Equal(w.DPRanks, wt.ranks) || len(w.Listeners) != wt.listeners {
			t.Errorf("worker %d: %+v, want range %d+%d ranks %v, %d listeners", wt.id, w, wt.start, wt.size, wt.ranks, wt.listeners)
		}
		if err := checkView(w); err != nil {
			t.Error(err)
		}
	}
}

func TestRegisterSamePublisherInTwoTenants(t *testing.T) {
	// Whether one publisher may feed two tenants' indexes is the
	// catalog's choice; either way a refusal must change nothing.
	r := newRig(t, rigOptions{})
	ep := deadEndpoint("shared")
	r.register(rankBody("m", "a", 1, 0, ep))
	for _, body := range []jsonObj{rankBody("m", "b", 1, 0, ep), rankBody("m2", "a", 1, 0, ep)} {
		before := r.state()
		rep := r.post("/register", body)
		m, err := rep.object()
		switch {
		case err != nil:
			t.Error(err)
		case rep.status == http.StatusCreated:
			if _, ok := r.worker(body["model_name"].(string), body["tenant_id"].(string), 1); !ok {
				t.Errorf("%v: 201, but the worker is not listed", body)
			}
		case rep.status/100 == 4:
			if after := r.state(); after != before {
				t.Errorf("%v: %d %v, and the state changed\nbefore:\n%s\nafter:\n%s", body, rep.status, m, before, after)
			}
		default:
			t.Errorf("%v: %d %s", body, rep.status, rep.body)
		}
	}
}

func TestUnregisterWhatWasRegistered(t *testing.T) {
	// The body that registered a worker unregisters it.
	for _, tc := range []struct {
		name string
		body jsonObj
	}{
		{"rank, tenant omitted", rankBody("m", "", 1, 0, deadEndpoint("rt"))},
		{"rank, default tenant", rankBody("m", "default", 1, 0, deadEndpoint("rt"))},
		{"rank, other tenant", rankBody("m", "t", 1, 0, deadEndpoint("rt"))},
		{"rank, empty tenant", rankBody("m", "", 1, 0, deadEndpoint("rt")).with("tenant_id", "")},
		{"range, tenant omitted", rangeBody("m", "", 1, 0, 2)},
		{"range, empty tenant", rangeBody("m", "", 1, 0, 2).with("tenant_id", "")},
		{"range, other tenant", rangeBody("m", "t", 1, 0, 2)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, rigOptions{})
			r.register(tc.body)
			if rep := r.post("/unregister", tc.body.without("dp_rank")); rep.status != http.StatusOK {
				t.Errorf("unregister with the registration's body %v: %d %s", tc.body, rep.status, rep.body)
			}
			if ws := r.workers(""); len(ws) != 0 {
				t.Errorf("left: %+v", ws)
			}
		})
	}
}

func TestUnregisterTenants(t *testing.T) {
	r := newRig(t, rigOptions{})
	r.register(
		rangeBody("m", "a", 5, 0, 1), rangeBody("m", "b", 5, 0, 1), rankBody("m", "", 5, 0, deadEndpoint("m-5")),
		rangeBody("m2", "a", 5, 0, 1), rangeBody("m", "a", 6, 0, 1), rangeBody("m", "b", 6, 0, 1),
	)
	ids := func() []string {
		var out []string
		for _, w := range r.workers("") {
			out = append(out, fmt.Sprintf("%s:%s:%d", w.ModelName, w.TenantID, w.InstanceID))
		}
		return out
	}
	for _, tc := range []struct {
		name string
		body jsonObj
		want []string
	}{
		{"every tenant of the model", who("m", "", 5), []string{"m:a:6", "m:b:6", "m2:a:5"}},
		{"one tenant", who("m", "b", 6), []string{"m:a:6", "m2:a:5"}},
		{"other model", who("m2", "a", 5), []string{"m:a:6"}},
	} {
		r.unregister(tc.body)
		if got := ids(); !slices.Equal(got, tc.want) {
			t.Errorf("after unregistering %s: %v, want %v", tc.name, got, tc.want)
		}
	}
	if ls := r.ing.Listeners(); len(ls) != 0 {
		t.Errorf("listeners left: %+v", ls)
	}
	r.run(t, []step{
		{name: "removed worker", path: "/unregister", body: who("m", "", 5), status: 404, errHas: []string{"5"}},
		{name: "removed tenant", path: "/unregister", body: who("m", "b", 6), status: 404},
		{name: "unknown model", path: "/unregister", body: who("m3", "", 6), status: 404},
		{name: "unknown rank", path: "/unregister", body: who("m", "a", 6).with("dp_rank", 1), status: 404},
		{name: "no id", path: "/unregister", body: who("m", "a", 6).without("instance_id"), status: 400, errHas: []string{"instance_id"}},
		{name: "no model", path: "/unregister", body: who("m", "a", 6).without("model_name"), status: 400, errHas: []string{"model_name"}},
		{name: "ids differ", path: "/unregister", body: who("m", "a", 6).with("worker_id", 7), status: 400},
		{name: "malformed", path: "/unregister", body: `{"instance_id":`, status: 400},
	})
}

func TestUnregisterRemovesBlocks(t *testing.T) {
	r := newRig(t, rigOptions{})
	key := indexer.Key{Model: "m", Tenant: "default"}
	wr := func(id uint64, rank uint32) indexer.WorkerRank { return indexer.WorkerRank{Worker: id, Rank: rank} }
	p1 := r.follow("m", "", 1, 0)
	p2 := r.follow("m", "", 2, 0)
	p30 := r.follow("m", "", 3, 0)
	p31 := r.follow("m", "", 3, 1)
	t1 := r.storeBlocks(p1, key, wr(1, 0), 100, 3)
	t2 := r.storeBlocks(p2, key, wr(2, 0), 200, 2)
	t30 := r.storeBlocks(p30, key, wr(3, 0), 300, 2)
	t31 := r.storeBlocks(p31, key, wr(3, 1), 310, 4)
	wantBlocks := func(when string, want map[indexer.WorkerRank]int) {
		t.Helper()
		got := map[indexer.WorkerRank]int{}
		for k, n := range r.blocks(key) {
			if n > 0 {
				got[k] = n
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: blocks %v, want %v", when, got, want)
		}
		for _, c := range []struct {
			tokens []uint32
			wr     indexer.WorkerRank
		}{{t1, wr(1, 0)}, {t2, wr(2, 0)}, {t30, wr(3, 0)}, {t31, wr(3, 1)}} {
			if got, want := r.matched(key, c.tokens)[c.wr], want[c.wr]; got != want {
				t.Errorf("%s: %s matches %d blocks of its prompt, want %d", when, c.wr, got, want)
			}
		}
	}
	wantBlocks("registered", map[indexer.WorkerRank]int{wr(1, 0): 3, wr(2, 0): 2, wr(3, 0): 2, wr(3, 1): 4})

	// Removal is done when /unregister answers.
	r.unregister(who("m", "", 1))
	wantBlocks("worker 1 removed", map[indexer.WorkerRank]int{wr(2, 0): 2, wr(3, 0): 2, wr(3, 1): 4})
	r.unregister(who("m", "", 3).with("dp_rank", 1))
	wantBlocks("rank 1 of worker 3 removed", map[indexer.WorkerRank]int{wr(2, 0): 2, wr(3, 0): 2})
	w, ok := r.worker("m", "default", 3)
	if !ok || !slices.Equal(w.DPRanks, []uint32{0}) || len(w.Listeners) != 1 {
		t.Errorf("worker 3 after removing rank 1: %+v (listed: %t), want rank 0 only", w, ok)
	}
	r.run(t, []step{
		{name: "removed rank", path: "/unregister", body: who("m", "", 3).with("dp_rank", 1), status: 404},
		{name: "removed worker", path: "/unregister", body: who("m", "", 1), status: 404},
		{name: "other tenant", path: "/unregister", body: who("m", "t", 2), status: 404},
	})
	r.unregister(who("m", "", 3).with("dp_rank", 0))
	wantBlocks("last rank of worker 3 removed", map[indexer.WorkerRank]int{wr(2, 0): 2})
	if _, ok := r.worker("m", "default", 3); ok {
		t.Error("worker 3 is still listed without ranks")
	}
	var left []string
	for _, l := range r.ing.Listeners() {
		left = append(left, fmt.Sprintf("worker %d rank %d", l.Worker, l.Rank))
	}
	if !slices.Equal(left, []string{"worker 2 rank 0"}) {
		t.Errorf("listeners %v, want worker 2's only", left)
	}
}

func TestWorkersView(t *testing.T) {
	r := newRig(t, rigOptions{})
	key := indexer.Key{Model: "m", Tenant: "default"}
	p := r.follow("m", "", 1, 0)
	seq := p.Seq() // of the batch storeBlocks publishes
	r.storeBlocks(p, key, indexer.WorkerRank{Worker: 1}, 10, 1)
	shared, own := deadEndpoint("replay"), deadEndpoint("own-replay")
	r.register(
		rankBody("m", "", 1, 2, deadEndpoint("w1-r2")).with("replay_endpoint", shared),
		rankBody("m", "", 2, 0, deadEndpoint("w2-r0")).with("replay_endpoint", shared),
		rankBody("m", "", 2, 1, deadEndpoint("w2-r1")).with("replay_endpoint", shared),
		rankBody("m", "", 3, 0, deadEndpoint("w3-r0")).with("replay_endpoint", shared),
		rankBody("m", "", 3, 1, deadEndpoint("w3-r1")).with("replay_endpoint", own),
		rangeBody("m", "", 4, 2, 3),
	)

	rep := r.do(http.MethodGet, "/workers", nil)
	var raw []map[string]json.RawMessage
	if err := json.Unmarshal(rep.body, &raw); err != nil || len(raw) != 4 {
		t.Fatalf("GET /workers: %s (%v), want 4 workers", rep.body, err)
	}
	fields := []string{"instance_id", "worker_id", "model_name", "tenant_id", "block_size", "dp_start", "dp_size",
		"data_parallel_start_rank", "data_parallel_size", "dp_ranks", "endpoints", "kv_events_endpoints", "source", "registered_by", "status", "listeners"}
	for i, w := range raw {
		for _, f := range fields {
			if _, ok := w[f]; !ok {
				t.Errorf("worker %d has no %s: %s", i, f, rep.body)
			}
		}
		if _, ok := w["engine_metrics"]; ok {
			t.Errorf("worker %d has engine_metrics, but was never scraped: %s", i, rep.body)
		}
	}
	r.checkViews()
	for _, w := range r.workers("") {
		want := ""
		if w.InstanceID == 2 { // the only worker whose ranks share one replay endpoint
			want = shared
		}
		if w.ReplayEndpoint != want {
			t.Errorf("worker %d replay_endpoint %q, want %q", w.InstanceID, w.ReplayEndpoint, want)
		}
		for rs, l := range w.Listeners {
			if l.Status == "" {
				t.Errorf("worker %d listener %s without status", w.InstanceID, rs)
			}
			if w.InstanceID != 1 && l.ReplayEndpoint == "" {
				t.Errorf("worker %d listener %s without its replay_endpoint", w.InstanceID, rs)
			}
		}
	}
	w1 := r.waitWorker("m", "default", 1, "rank 2 failing", func(w workerView) bool { return w.Listeners["2"].LastError != "" })
	l0 := w1.Listeners["0"]
	if l0.Status != active || l0.LastError != "" || l0.LastSeq == nil || *l0.LastSeq != seq || l0.Endpoint != p.Endpoint() {
		t.Errorf("live listener %+v, want active on %s at last_seq %d", l0, p.Endpoint(), seq)
	}
	if l2 := w1.Listeners["2"]; l2.LastSeq != nil || l2.ReplayEndpoint != shared {
		t.Errorf("dead listener %+v, want no last_seq and replay %s", l2, shared)
	}
	if !slices.Equal(w1.DPRanks, []uint32{0, 2}) {
		t.Errorf("worker 1 ranks %v, want 0 and 2", w1.DPRanks)
	}
	w4, _ := r.worker("m", "default", 4)
	if w4.Status != active || len(w4.Listeners) != 0 || len(w4.Endpoints) != 0 || !slices.Equal(w4.DPRanks, []uint32{2, 3, 4}) {
		t.Errorf("range worker %+v, want active ranks 2..4 without listeners", w4)
	}
}

// metricsPage is a vLLM /metrics page whose answer the test changes.
type metricsPage struct {
	ts     *httptest.Server
	mu     sync.Mutex
	status int
	body   string
}

func newMetricsPage(t *testing.T, path string) *metricsPage {
	p := &metricsPage{status: http.StatusOK}
	p.ts = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != path {
			http.NotFound(w, r)
			return
		}
		p.mu.Lock()
		status, body := p.status, p.body
		p.mu.Unlock()
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		w.WriteHeader(status)
		_, _ = w.Write([]byte(body))
	}))
	t.Cleanup(p.ts.Close)
	return p
}

func (p *metricsPage) set(status int, body string) {
	p.mu.Lock()
	p.status, p.body = status, body
	p.mu.Unlock()
}

// fakeClock is a clock the tests move by hand.
type fakeClock = stacktest.Clock

func newFakeClock() *fakeClock { return stacktest.NewClock() }

// twoEngines is a page of model m's engines 2 (waiting 3, running 5,
// usage 0.5, 2048 blocks) and 3 (waiting 0, usage 0.25, nothing else).
const twoEngines = `# HELP vllm:num_requests_waiting help
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m",engine="2"} 3
vllm:num_requests_waiting{model_name="m",engine="3"} 0
# HELP vllm:num_requests_running help
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m",engine="2"} 5
# HELP vllm:kv_cache_usage_perc help
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="m",engine="2"} 0.5
vllm:kv_cache_usage_perc{model_name="m",engine="3"} 0.25
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",model_name="m",engine="2",num_gpu_blocks="2048"} 1.0
`

// TestWorkersEngineMetrics checks the engine_metrics of GET /workers: the
// values a scrape found, by rank, each left out when not reported, and the
// state of the scrapes.
func TestWorkersEngineMetrics(t *testing.T) {
	clock := newFakeClock()
	p := newMetricsPage(t, "/w1/metrics")
	r := newRig(t, rigOptions{scrape: &scrape.Options{Interval: 10 * time.Second, Logger: quiet, Now: clock.Now}})
	must(t, r.cat.PutWorker(catalog.WorkerSpec{WorkerKey: catalog.WorkerKey{Key: indexer.Key{Model: "m", Tenant: indexer.DefaultTenant}, ID: 1},
		BlockSize: testBS, Endpoint: p.ts.URL + "/w1/v1", DPStart: 2, DPSize: 2, Source: catalog.SourceAPI}))
	p.set(http.StatusOK, twoEngines)
	must(t, r.sc.ScrapeOnce(t.Context()))
	at := clock.Now().UTC().Format(time.RFC3339Nano)
	url := p.ts.URL + "/w1/metrics"
	engineJSON := func() string {
		t.Helper()
		rep := r.do(http.MethodGet, "/workers", nil)
		var raw []map[string]json.RawMessage
		if err := json.Unmarshal(rep.body, &raw); err != nil || len(raw) != 1 {
			t.Fatalf("GET /workers: %s (%v)", rep.body, err)
		}
		return string(raw[0]["engine_metrics"])
	}
	want := `{"url":"` + url + `","scraped_at":"` + at + `","attempted_at":"` + at + `","fresh":true,"ranks":{` +
		`"2":{"num_requests_waiting":3,"num_requests_running":5,"kv_cache_usage_perc":0.5,"num_gpu_blocks":2048},` +
		`"3":{"num_requests_waiting":0,"kv_cache_usage_perc":0.25}}}`
	if got := engineJSON(); got != want {
		t.Errorf("engine_metrics\n%s\nwant\n%s", got, want)
	}
	clock.Advance(30 * time.Second) // 3 intervals: stale
	if got, want := engineJSON(), strings.Replace(want, `"fresh":true`, `"fresh":false`, 1); got != want {
		t.Errorf("stale engine_metrics\n%s\nwant\n%s", got, want)
	}
	p.set(http.StatusServiceUnavailable, "starting")
	must(t, r.sc.ScrapeOnce(t.Context()))
	failedAt := clock.Now().UTC().Format(time.RFC3339Nano)
	want = `{"url":"` + url + `","scraped_at":"` + at + `","attempted_at":"` + failedAt + `",` +
		`"last_error":"scrape ` + url + `: 503 Service Unavailable: \"starting\"","fresh":false,"ranks":{` +
		`"2":{"num_requests_waiting":3,"num_requests_running":5,"kv_cache_usage_perc":0.5,"num_gpu_blocks":2048},` +
		`"3":{"num_requests_waiting":0,"kv_cache_usage_perc":0.25}}}`
	if got := engineJSON(); got != want {
		t.Errorf("engine_metrics after a failure\n%s\nwant\n%s", got, want)
	}
	r.checkViews()
}

func TestWorkersSortedAndFiltered(t *testing.T) {
	r := newRig(t, rigOptions{})
	for _, k := range []string{"m2:a:1", "m1:b:2", "m1:a:10", "m1:a:2", "m1:default:5", "m1:x:y:a:3"} {
		i := strings.LastIndexByte(k, ':')
		key, err := indexer.ParseKey(k[:i])
		if err != nil {
			t.Fatal(err)
		}
		id, err := strconv.ParseUint(k[i+1:], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		r.register(rangeBody(key.Model, key.Tenant, id, 0, 1))
	}
	for _, tc := range []struct {
		query string
		want  string
	}{
		{"", "m1:a:2 m1:a:10 m1:b:2 m1:default:5 m1:x:y:a:3 m2:a:1"},
		{"?model_name=m1", "m1:a:2 m1:a:10 m1:b:2 m1:default:5"},
		{"?tenant_id=a", "m1:a:2 m1:a:10 m1:x:y:a:3 m2:a:1"},
		{"?model_name=m1&tenant_id=a", "m1:a:2 m1:a:10"},
		{"?model_name=m1:x:y", "m1:x:y:a:3"},
		{"?tenant_id=default", "m1:default:5"},
		{"?model_name=m3", ""},
		{"?model_name=m2&tenant_id=b", ""},
	} {
		var got []string
		for _, w := range r.workers(tc.query) {
			got = append(got, fmt.Sprintf("%s:%s:%d", w.ModelName, w.TenantID, w.InstanceID))
		}
		if strings.Join(got, " ") != tc.want {
			t.Errorf("GET /workers%s: %v, want %s", tc.query, got, tc.want)
		}
	}
	if rep := r.do(http.MethodGet, "/workers?model_name=none", nil); strings.TrimSpace(string(rep.body)) != "[]" {
		t.Errorf("no workers: %s, want []", rep.body)
	}
}

func TestBearerToken(t *testing.T) {
	r := newRig(t, rigOptions{token: "t0ken", testRoutes: true})
	r.follow("m", "", 1, 0) // with the token
	for _, rt := range []struct {
		path string
		body jsonObj
		ok   int
		then func(workerView) bool // the worker once the request was served
	}{
		{"/register", rangeBody("m", "", 2, 0, 1), 201, nil},
		{"/test/pause_listener", who("m", "", 1), 200, func(w workerView) bool { return w.Status == paused }},
		{"/test/resume_listener", who("m", "", 1), 200, func(w workerView) bool { return w.Status == active }},
		{"/unregister", who("m", "", 2), 200, nil},
	} {
		w1, _ := r.worker("m", "default", 1)
		for _, auth := range []string{"", "Bearer", "Bearer ", "Bearer wrong", "Bearer t0ken2", "Basic t0ken", "t0ken", "Bearer t0ke"} {
			before := r.state()
			rep, err := r.exchange(http.MethodPost, rt.path, rt.body, auth)
			if err != nil {
				t.Fatal(err)
			}
			if msg := rep.errorOf(t, http.StatusUnauthorized); !strings.Contains(strings.ToLower(msg), "token") {
				t.Errorf("POST %s with Authorization %q: error %q", rt.path, auth, msg)
			}
			if h := rep.header.Get("WWW-Authenticate"); !strings.HasPrefix(h, "Bearer") {
				t.Errorf("POST %s with Authorization %q: WWW-Authenticate %q", rt.path, auth, h)
			}
			if after := r.state(); after != before {
				t.Errorf("POST %s with Authorization %q changed the state:\n%s\nthen:\n%s", rt.path, auth, before, after)
			}
		}
		if w, _ := r.worker("m", "default", 1); w.Status != w1.Status {
			t.Errorf("unauthorized POST %s turned worker 1 from %s to %s", rt.path, w1.Status, w.Status)
		}
		r.post(rt.path, rt.body).expect(t, rt.ok)
		if rt.then != nil {
			r.waitWorker("m", "default", 1, "after "+rt.path, rt.then)
		}
	}
	if ws := r.workers(""); len(ws) != 1 {
		t.Errorf("workers %+v, want worker 1 only", ws)
	}
	for _, path := range []string{"/workers", "/ready"} {
		rep, err := r.exchange(http.MethodGet, path, nil, "")
		if err != nil || rep.status != http.StatusOK {
			t.Errorf("GET %s without a token: %d %s %v", path, rep.status, rep.body, err)
		}
	}
}

func TestWrongMethod(t *testing.T) {
	r := newRig(t, rigOptions{})
	for _, rq := range []struct{ method, path string }{
		{http.MethodGet, "/register"}, {http.MethodPut, "/unregister"}, {http.MethodDelete, "/workers"}, {http.MethodPost, "/ready"},
	} {
		rep := r.do(rq.method, rq.path, nil)
		rep.errorOf(t, http.StatusMethodNotAllowed)
		if rep.header.Get("Allow") == "" {
			t.Errorf("%s %s: 405 without Allow", rq.method, rq.path)
		}
	}
}

// loopback is the only kind of valid tcp endpoint a fuzz input may name:
// a listener dials what is registered.
var loopback = regexp.MustCompile(`^tcp://127\.0\.0\.1:[0-9]+$`)

// fuzzSkip says why the catalog should not be given body, or "".
func fuzzSkip(body []byte) string {
	var req registerRequest // what /register sees of it
	if admin.DecodeBytes(body, &req) != nil {
		return ""
	}
	for _, ep := range []*string{req.Endpoint, req.ReplayEndpoint} {
		if ep != nil && kvevents.ValidateEndpoint(*ep) == nil && !loopback.MatchString(*ep) {
			return "an endpoint off the loopback interface"
		}
	}
	return ""
}

// FuzzCatalogAPI sends arbitrary bodies to POST /register (route even) or
// POST /unregister (route odd) of a catalog with a few workers: no answer
// may be a 5xx or anything but a JSON object, and a refusal changes
// nothing.
func FuzzCatalogAPI(f *testing.F) {
	f.Fuzz(func(t *testing.T, route byte, body []byte) {
		path := "/register"
		if route%2 == 1 {
			path = "/unregister"
		}
		if why := fuzzSkip(body); why != "" && path == "/register" {
			t.Skip(why)
		}
		r := newRig(t, rigOptions{inProcess: true})
		r.register(rangeBody("m", "", 1, 0, 2), rangeBody("m", "t", 2, 4, 2), rangeBody("m2", "", 1, 0, 1))
		before := r.state()
		rep := r.post(path, body)
		if rep.status >= 500 {
			t.Fatalf("POST %s %q: %d %s", path, body, rep.status, rep.body)
		}
		if _, err := rep.object(); err != nil {
			t.Fatalf("POST %s %q: %d: %v", path, body, rep.status, err)
		}
		if rep.status/100 == 2 {
			return
		}
		if after := r.state(); after != before {
			t.Fatalf("POST %s %q failed (%d %s) and changed the state\nbefore:\n%s\nafter:\n%s", path, body, rep.status, rep.body, before, after)
		}
	})
}
