package httpapi

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/kvgate/kvgate/indexer"
	"github.com/kvgate/kvgate/indexer/kvevents"
	"github.com/kvgate/kvgate/internal/admin"
	"github.com/kvgate/kvgate/scheduler"
	"github.com/kvgate/kvgate/scheduler/catalog"
)

// These tests drive the slot tracker and selection service routes over
// real HTTP requests, on the rig of rig_test.go.

// newSvcRig is a rig whose admin server also serves a Service, over a
// scheduler with cost options cost and a fixed seed.
func newSvcRig(t testing.TB, o rigOptions, cost scheduler.CostOptions) *rig {
	t.Helper()
	inProcess := o.inProcess
	o.inProcess = true // the routes go in before any request is served
	r := newRig(t, o)
	sched := scheduler.NewScheduler(r.cat, r.set, r.loads, cost, 1, r.reg)
	r.handler.(*admin.Server).Handle(ServiceRoutes(r.cat, sched, r.set)...)
	if !inProcess {
		r.ts = httptest.NewServer(r.handler) // closed by the rig
	}
	return r
}

// svcStore stores blocks with local hashes locals, from the root, for
// worker id rank on tier in the index of model:default.
func (r *rig) svcStore(model string, id uint64, rank uint32, tier indexer.Tier, locals ...uint64) {
	r.t.Helper()
	seq := indexer.SequenceHashes(nil, locals)
	ev := indexer.Event{Kind: indexer.Stored, Worker: indexer.WorkerRank{Worker: id, Rank: rank}, Tier: tier}
	for i, l := range locals {
		ev.Blocks = append(ev.Blocks, indexer.Block{ID: seq[i], Local: l})
	}
	if _, err := r.set.Lookup(indexer.Key{Model: model, Tenant: indexer.DefaultTenant}).Apply(ev); err != nil {
		r.t.Fatal(err)
	}
}

// svcState is the rig's state with the loads.
func (r *rig) svcState() string {
	return r.state() + string(r.do(http.MethodGet, "/loads", nil).body)
}

// svcCall is one request of a contract table: method (default POST),
// path, body, the status answered and, for a failure, what its error names.
type svcCall struct {
	name, method, path string
	body               any
	status             int
	errHas             []string
}

// verify reports how rep is not c's answer: a JSON object with c's status
// and, for a failure, an error naming errHas.
func (c svcCall) verify(rep reply) error {
	m, err := rep.check(c.status)
	if err != nil || c.status/100 == 2 {
		return err
	}
	msg, _ := m["error"].(string)
	if msg == "" {
		return fmt.Errorf("failure without an error: %s", rep.body)
	}
	for _, sub := range c.errHas {
		if !strings.Contains(msg, sub) {
			return fmt.Errorf("error %q does not name %q", msg, sub)
		}
	}
	return nil
}

// svcCalls sends cs in order and verifies each answer; a failure must also
// change nothing.
func (r *rig) svcCalls(t *testing.T, cs []svcCall) {
	t.Helper()
	for _, c := range cs {
		before := r.svcState()
		if err := c.verify(r.do(cmp.Or(c.method, http.MethodPost), c.path, c.body)); err != nil {
			t.Errorf("%s: %v", c.name, err)
		} else if after := r.svcState(); c.status/100 != 2 && after != before {
			t.Errorf("%s: the failed request changed the state\nbefore:\n%s\nafter:\n%s", c.name, before, after)
		}
	}
}

// svcJSON fails unless rep is status with a body equal, as JSON, to want.
func svcJSON(t testing.TB, what string, rep reply, status int, want string) {
	t.Helper()
	var got, exp any
	if err := json.Unmarshal([]byte(want), &exp); err != nil {
		t.Fatalf("%s: want %s: %v", what, want, err)
	}
	if rep.status != status || json.Unmarshal(rep.body, &got) != nil || !reflect.DeepEqual(got, exp) {
		t.Errorf("%s: %d %s\nwant %d %s", what, rep.status, rep.body, status, want)
	}
}

func (r *rig) svcGet(path string) reply { r.t.Helper(); return r.do(http.MethodGet, path, nil) }

// The slot tracker seed's bodies (002_*).
var (
	svcSTWorker = jsonObj{"worker_id": 7, "model_name": "llama-3-8b", "tenant_id": "default", "block_size": 16, "dp_start": 0, "dp_size": 2}
	svcSTAdd    = jsonObj{"model_name": "llama-3-8b", "tenant_id": "default", "request_id": "req-123", "worker_id": 7, "dp_rank": 0,
		"sequence_hashes": []any{101, -22, 303}, "new_isl_tokens": 48}
	svcSTReq = jsonObj{"model_name": "llama-3-8b", "tenant_id": "default", "request_id": "req-123"}
)

func TestSlotTrackerLifecycle(t *testing.T) {
	r := newSvcRig(t, rigOptions{}, scheduler.CostOptions{})
	r.register(svcSTWorker)
	onRank1 := svcSTAdd.with("dp_rank", 1).without("new_isl_tokens")
	r.svcCalls(t, []svcCall{
		{name: "seed add", path: "/add", body: svcSTAdd, status: 201},
		{name: "duplicate request id", path: "/add", body: svcSTAdd, status: 409, errHas: []string{"req-123"}},
		{name: "unknown model", path: "/add", body: svcSTAdd.with("model_name", "nope"), status: 404, errHas: []string{"nope"}},
		{name: "unknown tenant", path: "/add", body: svcSTAdd.with("tenant_id", "t"), status: 404},
		{name: "unknown worker", path: "/add", body: svcSTAdd.with("request_id", "r2", "worker_id", 8), status: 404, errHas: []string{"8"}},
		{name: "unknown rank", path: "/add", body: svcSTAdd.with("request_id", "r2", "dp_rank", 2), status: 404, errHas: []string{"dp_rank 2"}},
		{name: "no sequence_hashes", path: "/add", body: svcSTAdd.with("request_id", "r2").without("sequence_hashes"), status: 400, errHas: []string{"sequence_hashes"}},
		{name: "no request_id", path: "/add", body: svcSTAdd.without("request_id"), status: 400, errHas: []string{"request_id"}},
		{name: "no model_name", path: "/add", body: svcSTAdd.with("request_id", "r2").without("model_name"), status: 400, errHas: []string{"model_name"}},
		{name: "no worker_id", path: "/add", body: svcSTAdd.with("request_id", "r2").without("worker_id"), status: 400, errHas: []string{"worker_id"}},
		{name: "negative new_isl_tokens", path: "/add", body: svcSTAdd.with("request_id", "r2", "new_isl_tokens", -1), status: 400, errHas: []string{"new_isl_tokens"}},
		{name: "fractional hash", path: "/add", body: `{"model_name":"llama-3-8b","request_id":"r2","worker_id":7,"sequence_hashes":[1.5]}`, status: 400},
		{name: "exponent hash", path: "/add", body: `{"model_name":"llama-3-8b","request_id":"r2","worker_id":7,"sequence_hashes":[1e3]}`, status: 400},
		{name: "hash over 64 bits", path: "/add", body: `{"model_name":"llama-3-8b","request_id":"r2","worker_id":7,"sequence_hashes":[18446744073709551616]}`, status: 400},
		{name: "malformed", path: "/add", body: `{"model_name":`, status: 400},
		{name: "array", path: "/add", body: `[]`, status: 400},
		{name: "empty", path: "/add", body: ``, status: 400},
		{name: "empty hashes, no new_isl_tokens", path: "/add", body: onRank1.with("request_id", "r-empty", "sequence_hashes", []any{}), status: 201},
		{name: "one hash signed and unsigned", path: "/add", body: onRank1.with("request_id", "r-twice", "sequence_hashes", []any{-22, "18446744073709551594"}), status: 201},
		{name: "unknown fields, default tenant", path: "/add", body: onRank1.with("request_id", "r-future", "future", jsonObj{"x": 1}, "new_isl_tokens", 5).without("tenant_id"), status: 201},
	})
	svcJSON(t, "loads", r.svcGet("/loads"), 200, `[
		{"model_name":"llama-3-8b","tenant_id":"default","worker_id":7,"dp_rank":0,"active_prefill_tokens":48,"active_decode_blocks":3},
		{"model_name":"llama-3-8b","tenant_id":"default","worker_id":7,"dp_rank":1,"active_prefill_tokens":5,"active_decode_blocks":3}]`)
	// -22 is 2^64-22: the projection counts the seed's blocks once.
	svcJSON(t, "potential loads", r.post("/potential_loads", jsonObj{"model_name": "llama-3-8b", "tenant_id": "default",
		"sequence_hashes": []any{101, uint64(1<<64 - 22), 303, 404}, "new_isl_tokens": 48}), 200, `[
		{"worker_id":7,"dp_rank":0,"potential_prefill_tokens":96,"potential_decode_blocks":4},
		{"worker_id":7,"dp_rank":1,"potential_prefill_tokens":53,"potential_decode_blocks":4}]`)

	r.svcCalls(t, []svcCall{
		{name: "prefill complete", path: "/prefill_complete", body: svcSTReq, status: 200},
		{name: "prefill complete again", path: "/prefill_complete", body: svcSTReq, status: 200},
		{name: "prefill complete, unknown request", path: "/prefill_complete", body: svcSTReq.with("request_id", "r9"), status: 404, errHas: []string{"r9"}},
		{name: "prefill complete, unknown model", path: "/prefill_complete", body: svcSTReq.with("model_name", "nope"), status: 404},
		{name: "prefill complete, no request_id", path: "/prefill_complete", body: svcSTReq.without("request_id"), status: 400, errHas: []string{"request_id"}},
	})
	svcJSON(t, "loads after prefill", r.svcGet("/loads?worker_id=7&model_name=llama-3-8b"), 200, `[
		{"model_name":"llama-3-8b","tenant_id":"default","worker_id":7,"dp_rank":0,"active_prefill_tokens":0,"active_decode_blocks":3},
		{"model_name":"llama-3-8b","tenant_id":"default","worker_id":7,"dp_rank":1,"active_prefill_tokens":5,"active_decode_blocks":3}]`)

	r.svcCalls(t, []svcCall{
		{name: "free", path: "/free", body: svcSTReq, status: 200},
		{name: "free again", path: "/free", body: svcSTReq, status: 200},
		{name: "free, unknown request", path: "/free", body: svcSTReq.with("request_id", "r9"), status: 200},
		{name: "free, unknown model", path: "/free", body: svcSTReq.with("model_name", "nope"), status: 404},
		{name: "free, no model_name", path: "/free", body: svcSTReq.without("model_name"), status: 400, errHas: []string{"model_name"}},
		{name: "free rank 1", path: "/free", body: svcSTReq.with("request_id", "r-empty"), status: 200},
		{name: "free rank 1 again", path: "/free", body: svcSTReq.with("request_id", "r-twice"), status: 200},
		{name: "free rank 1, default tenant", path: "/free", body: svcSTReq.with("request_id", "r-future").without("tenant_id"), status: 200},
	})
	svcJSON(t, "loads after free", r.svcGet("/loads"), 200, `[
		{"model_name":"llama-3-8b","tenant_id":"default","worker_id":7,"dp_rank":0,"active_prefill_tokens":0,"active_decode_blocks":0},
		{"model_name":"llama-3-8b","tenant_id":"default","worker_id":7,"dp_rank":1,"active_prefill_tokens":0,"active_decode_blocks":0}]`)
}

func TestLoadsFilteredAndSorted(t *testing.T) {
	r := newSvcRig(t, rigOptions{}, scheduler.CostOptions{})
	r.register(rangeBody("b", "t", 2, 0, 1), rangeBody("b", "", 3, 0, 1), rangeBody("a", "t", 9, 1, 1), rangeBody("b", "", 1, 0, 1))
	row := func(model, tenant string, id, rank int) string {
		return `{"model_name":"` + model + `","tenant_id":"` + tenant + `","worker_id":` + string(rune('0'+id)) +
			`,"dp_rank":` + string(rune('0'+rank)) + `,"active_prefill_tokens":0,"active_decode_blocks":0}`
	}
	a9, b1, b3, bt2 := row("a", "t", 9, 1), row("b", "default", 1, 0), row("b", "default", 3, 0), row("b", "t", 2, 0)
	for query, want := range map[string][]string{
		"": {a9, b1, b3, bt2}, "?model_name=b": {b1, b3, bt2}, "?tenant_id=t": {a9, bt2},
		"?model_name=b&tenant_id=default": {b1, b3}, "?model_name=c": {},
	} {
		svcJSON(t, "GET /loads"+query, r.svcGet("/loads"+query), 200, "["+strings.Join(want, ",")+"]")
	}
	r.svcCalls(t, []svcCall{
		{name: "potential loads, unknown model", path: "/potential_loads", body: jsonObj{"model_name": "c", "sequence_hashes": []any{}}, status: 404},
		{name: "potential loads, no hashes", path: "/potential_loads", body: jsonObj{"model_name": "b"}, status: 400, errHas: []string{"sequence_hashes"}},
		{name: "potential loads, negative isl", path: "/potential_loads", body: jsonObj{"model_name": "b", "sequence_hashes": []any{}, "new_isl_tokens": -1}, status: 400},
		{name: "potential loads, lengths differ", path: "/potential_loads", body: jsonObj{"model_name": "b", "sequence_hashes": []any{1}, "block_hashes": []any{1, 2}}, status: 400},
		{name: "wrong method", method: http.MethodPost, path: "/loads", body: jsonObj{}, status: 405},
	})
}

// The selection service seed's worker (003_*), without event publishers
// so that it is schedulable from the start.
var svcSSWorker = jsonObj{"worker_id": 1, "model_name": "model", "tenant_id": "default", "endpoint": "http://worker:8000",
	"block_size": 16, "data_parallel_start_rank": 0, "data_parallel_size": 2}

func TestWorkersSelectionShape(t *testing.T) {
	r := newSvcRig(t, rigOptions{}, scheduler.CostOptions{})
	e0, e1, e2, replay := deadEndpoint("w1-r0"), deadEndpoint("w1-r1"), deadEndpoint("w1-r1b"), deadEndpoint("w1-replay")
	seed := svcSSWorker.with("kv_events_endpoints", jsonObj{"0": e0, "1": e1}, "replay_endpoint", replay)
	p1 := "/workers/1?model_name=model"
	r.svcCalls(t, []svcCall{
		{name: "seed", path: "/workers", body: seed, status: 201},
		{name: "seed again", path: "/workers", body: seed, status: 201},
		{name: "no worker_id", path: "/workers", body: seed.without("worker_id"), status: 400, errHas: []string{"worker_id"}},
		{name: "negative worker_id", path: "/workers", body: seed.with("worker_id", -1), status: 400, errHas: []string{"worker_id"}},
		{name: "no block_size", path: "/workers", body: seed.without("block_size"), status: 400, errHas: []string{"block_size"}},
		{name: "other block_size", path: "/workers", body: seed.with("worker_id", 2, "block_size", 32, "kv_events_endpoints", nil), status: 409, errHas: []string{"16", "32"}},
		{name: "ftp endpoint", path: "/workers", body: seed.with("endpoint", "ftp://worker:21"), status: 400, errHas: []string{"endpoint"}},
		{name: "endpoint without port", path: "/workers", body: seed.with("endpoint", "worker"), status: 400, errHas: []string{"endpoint"}},
		{name: "dp size 0", path: "/workers", body: seed.with("data_parallel_size", 0), status: 400, errHas: []string{"data_parallel_size"}},
		{name: "dp size over the limit", path: "/workers", body: seed.with("data_parallel_size", catalog.MaxDPSize+1), status: 400, errHas: []string{"data_parallel_size"}},
		{name: "dp range overflows", path: "/workers", body: seed.with("data_parallel_start_rank", uint32(1<<32-1)), status: 400, errHas: []string{"overflows"}},
		{name: "rank not a number", path: "/workers", body: seed.with("kv_events_endpoints", jsonObj{"x": e0}), status: 400, errHas: []string{"kv_events_endpoints"}},
		{name: "rank given twice", path: "/workers", body: seed.with("kv_events_endpoints", jsonObj{"1": e1, "01": e2}), status: 400, errHas: []string{"twice"}},
		{name: "rank outside the range", path: "/workers", body: seed.with("kv_events_endpoints", jsonObj{"2": e2}), status: 400, errHas: []string{"rank 2"}},
		{name: "udp events endpoint", path: "/workers", body: seed.with("kv_events_endpoints", jsonObj{"0": "udp://127.0.0.1:1"}), status: 400, errHas: []string{"rank 0"}},
		{name: "bind replay endpoint", path: "/workers", body: seed.with("replay_endpoint", "tcp://*:5560"), status: 400, errHas: []string{"replay_endpoint"}},
		{name: "one events endpoint, two ranks", path: "/workers", body: seed.without("kv_events_endpoints").with("kv_events_endpoint", e0), status: 400, errHas: []string{"kv_events_endpoints"}},
		{name: "publisher of another tenant", path: "/workers", body: seed.with("tenant_id", "t"), status: 409, errHas: []string{e0}},
		{name: "default model, one events endpoint", path: "/workers", body: seed.without("model_name", "kv_events_endpoints", "data_parallel_size").with("worker_id", 3, "kv_events_endpoint", e2, "data_parallel_start_rank", 4), status: 201},
	})
	w, ok := r.worker("model", "default", 1)
	if !ok || w.Endpoint != "http://worker:8000" || w.BlockSize != 16 || w.DataParallelStartRank != 0 || w.DataParallelSize != 2 ||
		!reflect.DeepEqual(w.KVEventsEndpoints, map[string]string{"0": e0, "1": e1}) || w.ReplayEndpoint != replay || len(w.Listeners) != 2 {
		t.Errorf("worker 1: %+v", w)
	}
	if w, ok := r.worker("default", "default", 3); !ok || !reflect.DeepEqual(w.KVEventsEndpoints, map[string]string{"4": e2}) || !reflect.DeepEqual(w.DPRanks, []uint32{4}) {
		t.Errorf("worker 3 of the default model: %+v", w)
	}

	r.svcCalls(t, []svcCall{
		{name: "patch endpoint", method: http.MethodPatch, path: p1, body: jsonObj{"endpoint": "worker:9000"}, status: 200},
		{name: "patch nothing", method: http.MethodPatch, path: p1, status: 200},
		{name: "patch same block size, scope in the body", method: http.MethodPatch, path: "/workers/1", body: jsonObj{"model_name": "model", "block_size": 16}, status: 200},
		{name: "patch other block size", method: http.MethodPatch, path: p1, body: jsonObj{"block_size": 32}, status: 409, errHas: []string{"32"}},
		{name: "patch unknown worker", method: http.MethodPatch, path: "/workers/9?model_name=model", body: jsonObj{"endpoint": "worker:1"}, status: 404, errHas: []string{"worker 9"}},
		{name: "patch other tenant", method: http.MethodPatch, path: p1 + "&tenant_id=t", body: jsonObj{"endpoint": "worker:1"}, status: 404},
		{name: "patch bad id", method: http.MethodPatch, path: "/workers/x", body: jsonObj{}, status: 400, errHas: []string{"worker_id"}},
		{name: "patch ids differ", method: http.MethodPatch, path: p1, body: jsonObj{"worker_id": 2}, status: 400, errHas: []string{"worker_id"}},
		{name: "patch scopes differ", method: http.MethodPatch, path: p1, body: jsonObj{"model_name": "other"}, status: 400, errHas: []string{"model_name"}},
		{name: "patch empty endpoint", method: http.MethodPatch, path: p1, body: jsonObj{"endpoint": ""}, status: 400, errHas: []string{"endpoint"}},
		{name: "patch bad endpoint", method: http.MethodPatch, path: p1, body: jsonObj{"endpoint": "worker"}, status: 400, errHas: []string{"endpoint"}},
		{name: "patch rank outside", method: http.MethodPatch, path: p1, body: jsonObj{"kv_events_endpoints": jsonObj{"5": e2}}, status: 400, errHas: []string{"rank 5"}},
		{name: "patch bad replay", method: http.MethodPatch, path: p1, body: jsonObj{"replay_endpoint": "udp://x:1"}, status: 400, errHas: []string{"replay_endpoint"}},
		{name: "patch malformed", method: http.MethodPatch, path: p1, body: `{"endpoint"`, status: 400},
		{name: "patch rank 1's publisher", method: http.MethodPatch, path: p1, body: jsonObj{"kv_events_endpoints": jsonObj{"0": e0, "1": e2}}, status: 200},
	})
	w, _ = r.worker("model", "default", 1)
	if w.Endpoint != "worker:9000" || !reflect.DeepEqual(w.KVEventsEndpoints, map[string]string{"0": e0, "1": e2}) || w.ReplayEndpoint != replay {
		t.Errorf("patched worker 1: %+v", w)
	}
	if n := len(r.ing.Listeners()); n != 3 {
		t.Errorf("%d listeners, want 3 (worker 1 ranks 0 and 1, worker 3): %+v", n, r.ing.Listeners())
	}

	r.svcCalls(t, []svcCall{
		{name: "patch range", method: http.MethodPatch, path: p1, body: jsonObj{"data_parallel_size": 1, "replay_endpoint": ""}, status: 200},
		{name: "delete unknown", method: http.MethodDelete, path: "/workers/9?model_name=model", status: 404},
		{name: "delete bad id", method: http.MethodDelete, path: "/workers/-1", status: 400},
	})
	w, _ = r.worker("model", "default", 1)
	if !reflect.DeepEqual(w.DPRanks, []uint32{0}) || !reflect.DeepEqual(w.KVEventsEndpoints, map[string]string{"0": e0}) || w.ReplayEndpoint != "" {
		t.Errorf("worker 1 narrowed to rank 0: %+v", w)
	}
	svcJSON(t, "loads of the narrowed worker", r.svcGet("/loads?model_name=model"), 200,
		`[{"model_name":"model","tenant_id":"default","worker_id":1,"dp_rank":0,"active_prefill_tokens":0,"active_decode_blocks":0}]`)

	r.svcCalls(t, []svcCall{
		{name: "delete", method: http.MethodDelete, path: p1, status: 200},
		{name: "delete again", method: http.MethodDelete, path: p1, status: 404},
		{name: "delete the default model's", method: http.MethodDelete, path: "/workers/3", status: 200},
	})
	if ws, ls := r.workers(""), r.ing.Listeners(); len(ws) != 0 || len(ls) != 0 {
		t.Errorf("after the deletes: workers %+v, listeners %+v", ws, ls)
	}
	svcJSON(t, "loads after the deletes", r.svcGet("/loads"), 200, `[]`)
}

// An incomplete worker (no endpoint yet) is registered, listed with its
// lifecycle and reasons, never selected nor reservable, and becomes
// schedulable once a PATCH supplies the endpoint, as in Dynamo's
// selection service.
func TestIncompleteWorker(t *testing.T) {
	r := newSvcRig(t, rigOptions{}, scheduler.CostOptions{})
	pick := jsonObj{"model_name": "model", "block_hashes": []any{11, 12}, "isl_tokens": 32}
	only1 := pick.with("worker_ids", []any{1})
	book := func(id string) jsonObj {
		return jsonObj{"model_name": "model", "reservation_id": id, "worker_id": 1, "dp_rank": 0, "block_hashes": []any{11, 12}}
	}
	incomplete := map[string]any{"lifecycle": "incomplete", "not_schedulable_reasons": []any{"endpoint is required"}}
	schedulable := map[string]any{"lifecycle": "schedulable", "not_schedulable_reasons": []any{}}
	for _, c := range []struct {
		name, method, path string
		body               any
		status             int     // 0: any but 2xx
		want               jsonObj // fields of the answer
	}{
		{name: "register without endpoint", path: "/workers", body: svcSSWorker.without("endpoint"), status: 201,
			want: jsonObj{"worker_id": 1.0, "model_name": "model", "tenant_id": "default"}.with("lifecycle", "incomplete", "not_schedulable_reasons", incomplete["not_schedulable_reasons"])},
		{name: "register a complete worker", path: "/workers", body: svcSSWorker.with("worker_id", 2), status: 201, want: schedulable},
		{name: "select never picks it", path: "/select", body: pick, status: 200, want: jsonObj{"worker_id": 2.0}},
		{name: "select restricted to it", path: "/select", body: only1, status: 503},
		{name: "reservation naming it", path: "/reservations", body: book("r1"), status: 404},
		{name: "patch supplies the endpoint", method: http.MethodPatch, path: "/workers/1?model_name=model", body: jsonObj{"endpoint": "http://worker-1:8000"}, status: 200, want: schedulable},
		{name: "then selectable", path: "/select", body: only1, status: 200, want: jsonObj{"worker_id": 1.0, "endpoint": "http://worker-1:8000"}},
		{name: "then reservable", path: "/reservations", body: book("r2"), status: 201, want: jsonObj{"worker_id": 1.0}},
	} {
		rep := r.do(cmp.Or(c.method, http.MethodPost), c.path, c.body)
		if c.status == 0 {
			if rep.status/100 == 2 {
				t.Errorf("%s: %d %s, want a failure", c.name, rep.status, rep.body)
			}
			continue
		}
		m, err := rep.check(c.status)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		for k, v := range c.want {
			if !reflect.DeepEqual(m[k], v) {
				t.Errorf("%s: %s = %#v, want %#v (%s)", c.name, k, m[k], v, rep.body)
			}
		}
		if c.name == "register without endpoint" {
			w, ok := r.worker("model", "default", 1)
			if !ok || w.Lifecycle != "incomplete" || w.Status != catalog.StatusIncomplete ||
				!reflect.DeepEqual(w.NotSchedulableReasons, []string{"endpoint is required"}) {
				t.Errorf("GET /workers lists worker 1 as %+v", w)
			}
		}
	}
	if w, _ := r.worker("model", "default", 1); w.Lifecycle != "schedulable" || w.Status == catalog.StatusIncomplete {
		t.Errorf("patched worker 1 is listed as %+v", w)
	}
}

// svcSeedSelect is the selection service seed's /select_and_reserve body.
var svcSeedSelect = jsonObj{"selection_id": "select-123", "reservation_id": "request-123", "model_name": "model", "tenant_id": "default",
	"block_hashes": []any{11, 12, 13, 14, 15, 16, 17, 18}, "sequence_hashes": []any{21, 22, 23, 24, 25, 26, 27, 28}, "isl_tokens": 512}

// svcSelectRig serves the seed's worker 1 of "model", whose rank 0 holds
// blocks 11..14 on device, to 16 in host memory and to 18 on disk, and rank
// 1 blocks 11 and 12 on device: the seed's overlap.
func svcSelectRig(t *testing.T, cost scheduler.CostOptions) *rig {
	r := newSvcRig(t, rigOptions{}, cost)
	r.post("/workers", svcSSWorker).expect(t, http.StatusCreated)
	r.svcStore("model", 1, 0, indexer.TierDevice, 11, 12, 13, 14)
	r.svcStore("model", 1, 0, indexer.TierHost, 11, 12, 13, 14, 15, 16)
	r.svcStore("model", 1, 0, indexer.TierDisk, 11, 12, 13, 14, 15, 16, 17, 18)
	r.svcStore("model", 1, 1, indexer.TierDevice, 11, 12)
	return r
}

func TestSelectSeedExample(t *testing.T) {
	// Host and disk blocks credited in full, the seed's prefill is
	// 512 - 8*16 = 384 on rank 0.
	r := svcSelectRig(t, scheduler.CostOptions{HostWeight: 1, DiskWeight: 1})
	answer := `{"selection_id":"select-123","reservation_id":"request-123","model_name":"model","tenant_id":"default",
		"worker_id":1,"dp_rank":0,"endpoint":"http://worker:8000","block_size":16,
		"overlap":{"longest_matched":128,"gpu":64,"dp":{"0":64,"1":32},"cpu":96,"disk":128},"effective_prefill_tokens":384}`
	svcJSON(t, "select", r.post("/select", svcSeedSelect), 200, answer)
	svcJSON(t, "loads after select", r.svcGet("/loads"), 200, `[
		{"model_name":"model","tenant_id":"default","worker_id":1,"dp_rank":0,"active_prefill_tokens":0,"active_decode_blocks":0},
		{"model_name":"model","tenant_id":"default","worker_id":1,"dp_rank":1,"active_prefill_tokens":0,"active_decode_blocks":0}]`)
	svcJSON(t, "select and reserve", r.post("/select_and_reserve", svcSeedSelect), 200, answer)
	booked := `[
		{"model_name":"model","tenant_id":"default","worker_id":1,"dp_rank":0,"active_prefill_tokens":384,"active_decode_blocks":8},
		{"model_name":"model","tenant_id":"default","worker_id":1,"dp_rank":1,"active_prefill_tokens":0,"active_decode_blocks":0}]`
	svcJSON(t, "loads after select_and_reserve", r.svcGet("/loads"), 200, booked)
	r.svcCalls(t, []svcCall{{name: "duplicate reservation", path: "/select_and_reserve", body: svcSeedSelect, status: 409, errHas: []string{"request-123"}}})
	svcJSON(t, "overlap scores", r.post("/overlap_scores", jsonObj{"model_name": "model", "block_hashes": svcSeedSelect["block_hashes"]}), 200, `{"block_size":16,"num_blocks":8,"workers":[
		{"worker_id":1,"dp_rank":0,"device_blocks":4,"host_pinned_blocks":6,"disk_blocks":8,"host_pinned_extension_blocks":2,"disk_extension_blocks":2,"shared_beyond_device_blocks":null,"router_credit_blocks":8},
		{"worker_id":1,"dp_rank":1,"device_blocks":2,"host_pinned_blocks":2,"disk_blocks":2,"host_pinned_extension_blocks":0,"disk_extension_blocks":0,"shared_beyond_device_blocks":null,"router_credit_blocks":2}],
		"shared_cache":{"enabled":false,"total_hit_blocks":0,"ranges":[],"error":null}}`)
	svcJSON(t, "potential loads by isl_tokens", r.post("/potential_loads", svcSeedSelect), 200, `[
		{"worker_id":1,"dp_rank":0,"potential_prefill_tokens":768,"potential_decode_blocks":8},
		{"worker_id":1,"dp_rank":1,"potential_prefill_tokens":480,"potential_decode_blocks":8}]`)

	r.do(http.MethodDelete, "/reservations/request-123?model_name=model", nil).expect(t, http.StatusOK)
	svcJSON(t, "loads after delete", r.svcGet("/loads"), 200, strings.ReplaceAll(booked, `384,"active_decode_blocks":8`, `0,"active_decode_blocks":0`))

	// Without ids, the answer has neither; select_and_reserve makes one.
	bare := svcSeedSelect.without("selection_id", "reservation_id")
	made := map[string]bool{}
	for _, path := range []string{"/select", "/select_and_reserve", "/select_and_reserve"} {
		m := r.post(path, bare).expect(t, http.StatusOK)
		_, hasSel := m["selection_id"]
		id, hasRes := m["reservation_id"].(string)
		if hasSel || hasRes != (path == "/select_and_reserve") || (hasRes && (id == "" || made[id])) {
			t.Errorf("%s without ids: %v (ids made before: %v)", path, m, made)
		}
		made[id] = true
		if hasRes {
			r.do(http.MethodDelete, "/reservations/"+id+"?model_name=model", nil).expect(t, http.StatusOK)
			if l := r.loads.Snapshot("model", ""); l[0].Requests != 0 {
				t.Errorf("reservation %s not freed: %+v", id, l)
			}
		}
	}
}

func TestSelectThenReserve(t *testing.T) {
	r := svcSelectRig(t, scheduler.CostOptions{})
	m := r.post("/select", svcSeedSelect.without("reservation_id")).expect(t, http.StatusOK)
	eff := m["effective_prefill_tokens"]
	res := jsonObj{"reservation_id": "request-123", "model_name": "model", "tenant_id": "default", "worker_id": m["worker_id"], "dp_rank": m["dp_rank"],
		"sequence_hashes": svcSeedSelect["sequence_hashes"], "isl_tokens": 512, "effective_prefill_tokens": eff}
	svcJSON(t, "reserve", r.post("/reservations", res), 201, `{"status":"ok","reservation_id":"request-123","model_name":"model",
		"tenant_id":"default","worker_id":1,"dp_rank":0,"endpoint":"http://worker:8000"}`)
	life := "/reservations/request-123/"
	r.svcCalls(t, []svcCall{
		{name: "duplicate", path: "/reservations", body: res, status: 409, errHas: []string{"request-123"}},
		{name: "unknown rank", path: "/reservations", body: res.with("reservation_id", "r2", "dp_rank", 2), status: 404, errHas: []string{"dp_rank 2"}},
		{name: "unknown worker", path: "/reservations", body: res.with("reservation_id", "r2", "worker_id", 9), status: 404},
		{name: "unknown model", path: "/reservations", body: res.with("reservation_id", "r2", "model_name", "nope"), status: 404},
		{name: "prefill over isl", path: "/reservations", body: res.with("reservation_id", "r2", "effective_prefill_tokens", 513), status: 400, errHas: []string{"effective_prefill_tokens"}},
		{name: "negative prefill", path: "/reservations", body: res.with("reservation_id", "r2", "effective_prefill_tokens", -1), status: 400, errHas: []string{"effective_prefill_tokens"}},
		{name: "no id", path: "/reservations", body: res.without("reservation_id"), status: 400, errHas: []string{"reservation_id"}},
		{name: "no worker", path: "/reservations", body: res.with("reservation_id", "r2").without("worker_id"), status: 400, errHas: []string{"worker_id"}},
		{name: "no hashes", path: "/reservations", body: res.with("reservation_id", "r2").without("sequence_hashes"), status: 400, errHas: []string{"sequence_hashes"}},
		{name: "selection_id as the id, prefill = isl", path: "/reservations", body: res.without("reservation_id", "effective_prefill_tokens").with("selection_id", "s1", "dp_rank", 1), status: 201},
		{name: "isl from the blocks", path: "/reservations", body: res.without("isl_tokens", "effective_prefill_tokens").with("reservation_id", "r3", "dp_rank", 1, "sequence_hashes", []any{1}), status: 201},

		{name: "prefill complete", path: life + "prefill_complete?model_name=model", status: 200},
		{name: "prefill complete again, scope in the body", path: life + "prefill_complete", body: jsonObj{"model_name": "model"}, status: 200},
		{name: "prefill complete, unknown", path: "/reservations/r9/prefill_complete?model_name=model", status: 404, errHas: []string{"r9"}},
		{name: "prefill complete, unknown model", path: life + "prefill_complete?model_name=nope", status: 404},
		{name: "prefill complete, no model: the id is global", path: life + "prefill_complete", status: 200},
		{name: "prefill complete, no model, active nowhere", path: "/reservations/r9/prefill_complete", status: 404, errHas: []string{`reservation "r9" is not active`}},
		{name: "prefill complete, scopes differ", path: life + "prefill_complete?model_name=model", body: jsonObj{"model_name": "m"}, status: 400},
		{name: "output block", path: life + "output_block?model_name=model", body: jsonObj{"decay_fraction": 0.25}, status: 200},
		{name: "output block, no body", path: life + "output_block?model_name=model", status: 200},
		{name: "output block, decay over 1", path: life + "output_block?model_name=model", body: jsonObj{"decay_fraction": 1.5}, status: 400, errHas: []string{"decay_fraction"}},
		{name: "output block, negative decay", path: life + "output_block?model_name=model", body: jsonObj{"decay_fraction": -0.5}, status: 400, errHas: []string{"decay_fraction"}},
		{name: "output block, unknown", path: "/reservations/r9/output_block?model_name=model", status: 404},
		{name: "output block, malformed", path: life + "output_block?model_name=model", body: `{"decay_fraction":`, status: 400},
	})
	// Rank 0: the reservation's 8 blocks and 1.75 output blocks, prefill
	// done; rank 1: s1 (512 tokens, 8 blocks) and r3 (16 tokens, 1 block).
	svcJSON(t, "loads", r.svcGet("/loads"), 200, `[
		{"model_name":"model","tenant_id":"default","worker_id":1,"dp_rank":0,"active_prefill_tokens":0,"active_decode_blocks":9.75},
		{"model_name":"model","tenant_id":"default","worker_id":1,"dp_rank":1,"active_prefill_tokens":528,"active_decode_blocks":9}]`)
	r.svcCalls(t, []svcCall{
		{name: "free", method: http.MethodDelete, path: "/reservations/request-123?model_name=model", status: 200},
		{name: "free again", method: http.MethodDelete, path: "/reservations/request-123?model_name=model", status: 200},
		{name: "free s1", method: http.MethodDelete, path: "/reservations/s1?model_name=model", status: 200},
		{name: "free r3, scope in the body", method: http.MethodDelete, path: "/reservations/r3", body: jsonObj{"model_name": "model"}, status: 200},
		{name: "free, unknown model", method: http.MethodDelete, path: "/reservations/r3?model_name=nope", status: 404},
		{name: "free, no model, active nowhere", method: http.MethodDelete, path: "/reservations/r3", status: 200},
	})
	for _, l := range r.loads.Snapshot("", "") {
		if l.PrefillTokens != 0 || l.DecodeBlocks != 0 || l.Requests != 0 {
			t.Errorf("load left after the frees: %+v", l)
		}
	}
}

func TestSelectCandidatesAndErrors(t *testing.T) {
	r := svcSelectRig(t, scheduler.CostOptions{})
	r.post("/workers", svcSSWorker.with("worker_id", 2, "endpoint", "worker2:8000", "data_parallel_size", 1)).expect(t, http.StatusCreated)
	// Worker 3 of model m2 waits for its publisher: not schedulable.
	r.post("/workers", svcSSWorker.with("model_name", "m2", "worker_id", 3, "kv_events_endpoints", jsonObj{"0": deadEndpoint("w3")})).expect(t, http.StatusCreated)
	sel := svcSeedSelect.without("reservation_id", "selection_id")
	for _, tc := range []struct {
		name   string
		body   jsonObj
		worker float64
	}{
		{"cheapest", sel, 1},
		{"worker_ids", sel.with("worker_ids", []any{2}), 2},
		{"candidates", sel.with("candidates", []any{2, 9}), 2},
		{"allowed_worker_ids", sel.with("allowed_worker_ids", []any{2}), 2},
		{"temperature 0 by either name, weight by override", sel.with("temperature", 0, "router_config_override", jsonObj{"overlap_score_weight": 1}), 1},
	} {
		if m := r.post("/select", tc.body).expect(t, http.StatusOK); m["worker_id"] != tc.worker {
			t.Errorf("%s: %v, want worker %v", tc.name, m, tc.worker)
		}
	}
	if m := r.post("/select", sel.with("worker_ids", []any{2})).expect(t, http.StatusOK); !reflect.DeepEqual(m["overlap"], map[string]any{
		"longest_matched": 0.0, "gpu": 0.0, "cpu": 0.0, "disk": 0.0, "dp": map[string]any{"0": 0.0}}) || m["endpoint"] != "worker2:8000" {
		t.Errorf("worker 2 holds nothing: %v", m)
	}
	r.svcCalls(t, []svcCall{
		{name: "unknown candidate", path: "/select", body: sel.with("worker_ids", []any{9}), status: 503, errHas: []string{"9"}},
		{name: "unknown candidate, unknown model", path: "/select", body: sel.with("worker_ids", []any{9}, "model_name", "nope"), status: 503},
		{name: "no candidates", path: "/select", body: sel.with("worker_ids", []any{}), status: 400, errHas: []string{"worker_ids"}},
		{name: "two candidate lists", path: "/select", body: sel.with("worker_ids", []any{1}, "candidates", []any{2}), status: 400},
		{name: "none schedulable", path: "/select_and_reserve", body: sel.with("model_name", "m2"), status: 503, errHas: []string{"schedulable"}},
		{name: "unknown model", path: "/select_and_reserve", body: sel.with("model_name", "nope"), status: 503, errHas: []string{"nope"}},
		{name: "unknown tenant", path: "/select", body: sel.with("tenant_id", "t"), status: 503},
		{name: "default model", path: "/select", body: sel.without("model_name"), status: 503, errHas: []string{`"default"`}},
		{name: "no block_hashes", path: "/select", body: sel.without("block_hashes"), status: 400, errHas: []string{"block_hashes"}},
		{name: "hash lengths differ", path: "/select_and_reserve", body: sel.with("sequence_hashes", []any{1}), status: 400, errHas: []string{"sequence_hashes"}},
		{name: "negative isl", path: "/select", body: sel.with("isl_tokens", -1), status: 400, errHas: []string{"isl_tokens"}},
		{name: "negative temperature", path: "/select", body: sel.with("temperature", -1), status: 400, errHas: []string{"temperature"}},
		{name: "negative router_temperature", path: "/select_and_reserve", body: sel.with("router_temperature", -1), status: 400},
		{name: "negative weight", path: "/select", body: sel.with("overlap_score_weight", -1), status: 400},
		{name: "string worker id", path: "/select", body: sel.with("worker_ids", []any{"2"}), status: 400},
		{name: "float hash", path: "/select", body: sel.with("block_hashes", []any{1.5}), status: 400},
		{name: "overlap scores, unknown model", path: "/overlap_scores", body: jsonObj{"model_name": "nope", "block_hashes": []any{}}, status: 404},
		{name: "overlap scores, no prompt", path: "/overlap_scores", body: jsonObj{"model_name": "model"}, status: 400, errHas: []string{"block_hashes"}},
	})
	// token_ids: the local hashes of two blocks of 16 tokens.
	toks := make([]uint32, 32)
	for i := range toks {
		toks[i] = uint32(i)
	}
	r.svcStore("model", 2, 0, indexer.TierDevice, indexer.LocalHashes(nil, toks, 16, indexer.BaseSeed, nil)...)
	// Every schedulable rank has a row, with no overlap too; worker 3
	// (model m2), waiting for its publisher, has none.
	svcJSON(t, "overlap scores by tokens", r.post("/overlap_scores", jsonObj{"model_name": "model", "token_ids": toks, "lora_name": ""}), 200,
		`{"block_size":16,"num_blocks":2,"workers":[
		{"worker_id":1,"dp_rank":0,"device_blocks":0,"host_pinned_blocks":0,"disk_blocks":0,"host_pinned_extension_blocks":0,"disk_extension_blocks":0,"shared_beyond_device_blocks":null,"router_credit_blocks":0},
		{"worker_id":1,"dp_rank":1,"device_blocks":0,"host_pinned_blocks":0,"disk_blocks":0,"host_pinned_extension_blocks":0,"disk_extension_blocks":0,"shared_beyond_device_blocks":null,"router_credit_blocks":0},
		{"worker_id":2,"dp_rank":0,"device_blocks":2,"host_pinned_blocks":2,"disk_blocks":2,"host_pinned_extension_blocks":0,"disk_extension_blocks":0,"shared_beyond_device_blocks":null,"router_credit_blocks":2}],
		"shared_cache":{"enabled":false,"total_hit_blocks":0,"ranges":[],"error":null}}`)
	// cache_salt salts token_ids' hashes: worker 1 rank 1 holds the blocks
	// hashed with salt "t-a", and only the salted query finds them.
	r.svcStore("model", 1, 1, indexer.TierDevice, indexer.LocalHashes(nil, toks, 16, indexer.BlockSeed("", "t-a"), nil)...)
	svcJSON(t, "overlap scores by salted tokens", r.post("/overlap_scores", jsonObj{"model_name": "model", "token_ids": toks, "cache_salt": "t-a"}), 200,
		`{"block_size":16,"num_blocks":2,"workers":[
		{"worker_id":1,"dp_rank":0,"device_blocks":0,"host_pinned_blocks":0,"disk_blocks":0,"host_pinned_extension_blocks":0,"disk_extension_blocks":0,"shared_beyond_device_blocks":null,"router_credit_blocks":0},
		{"worker_id":1,"dp_rank":1,"device_blocks":2,"host_pinned_blocks":2,"disk_blocks":2,"host_pinned_extension_blocks":0,"disk_extension_blocks":0,"shared_beyond_device_blocks":null,"router_credit_blocks":2},
		{"worker_id":2,"dp_rank":0,"device_blocks":0,"host_pinned_blocks":0,"disk_blocks":0,"host_pinned_extension_blocks":0,"disk_extension_blocks":0,"shared_beyond_device_blocks":null,"router_credit_blocks":0}],
		"shared_cache":{"enabled":false,"total_hit_blocks":0,"ranges":[],"error":null}}`)
	for _, path := range []string{"/overlap_scores", "/select", "/potential_loads"} {
		rep := r.post(path, jsonObj{"model_name": "model", "block_hashes": []any{1}, "cache_salt": "t-a"})
		if rep.status != http.StatusBadRequest || !strings.Contains(string(rep.body), "cache_salt") {
			t.Errorf("%s with block_hashes and cache_salt: %d %s, want 400 naming cache_salt", path, rep.status, rep.body)
		}
	}
	svcJSON(t, "overlap scores, none schedulable", r.post("/overlap_scores", jsonObj{"model_name": "m2", "block_hashes": []any{1}}), 200,
		`{"block_size":16,"num_blocks":1,"workers":[],"shared_cache":{"enabled":false,"total_hit_blocks":0,"ranges":[],"error":null}}`)
}

func TestWorkersChangeWhileSelecting(t *testing.T) {
	r := svcSelectRig(t, scheduler.CostOptions{})
	r.post("/workers", svcSSWorker.with("worker_id", 2, "kv_events_endpoints", jsonObj{"0": deadEndpoint("w2-0")})).expect(t, http.StatusCreated)
	var wg sync.WaitGroup
	wg.Go(func() { // worker 1 (rank 0 stays) narrows and widens; worker 2 changes publisher
		for i := range 40 {
			for path, body := range map[string]jsonObj{
				"/workers/1?model_name=model": {"data_parallel_size": 1 + i%2},
				"/workers/2?model_name=model": {"kv_events_endpoints": jsonObj{"0": deadEndpoint(fmt.Sprint("w2-", i%2))}},
			} {
				if rep, err := r.exchange(http.MethodPatch, path, body, ""); err != nil || rep.status != http.StatusOK {
					t.Errorf("PATCH %s %v: %d %s %v", path, body, rep.status, rep.body, err)
					return
				}
			}
		}
	})
	for i := range 200 {
		id := fmt.Sprint("c", i)
		if m := r.post("/select_and_reserve", svcSeedSelect.with("reservation_id", id)).expect(t, http.StatusOK); m["worker_id"] != 1.0 {
			t.Errorf("%s on %v, want worker 1 (worker 2 waits for its publisher)", id, m)
		}
		r.do(http.MethodDelete, "/reservations/"+id+"?model_name=model", nil).expect(t, http.StatusOK)
	}
	wg.Wait()
	for _, l := range r.loads.Snapshot("", "") {
		if l.PrefillTokens != 0 || l.DecodeBlocks != 0 || l.Requests != 0 {
			t.Errorf("load left: %+v", l)
		}
	}
	if ls := r.ing.Listeners(); len(ls) != 1 || ls[0].Endpoint != deadEndpoint("w2-1") {
		t.Errorf("listeners %+v, want worker 2's last publisher only", ls)
	}
}

func TestServiceBearerToken(t *testing.T) {
	r := newSvcRig(t, rigOptions{token: "s3cret"}, scheduler.CostOptions{})
	for _, rq := range []struct {
		method, path string
		status       int
	}{
		{http.MethodPost, "/add", 401}, {http.MethodPost, "/free", 401}, {http.MethodPost, "/workers", 401},
		{http.MethodPatch, "/workers/1", 401}, {http.MethodDelete, "/workers/1", 401}, {http.MethodPost, "/select_and_reserve", 401},
		{http.MethodPost, "/reservations", 401}, {http.MethodDelete, "/reservations/r", 401}, {http.MethodPost, "/reservations/r/output_block", 401},
		{http.MethodGet, "/loads", 200}, {http.MethodPost, "/select", 400}, {http.MethodPost, "/potential_loads", 400}, {http.MethodPost, "/overlap_scores", 400},
	} {
		rep, err := r.exchange(rq.method, rq.path, nil, "")
		if err != nil || rep.status != rq.status {
			t.Errorf("%s %s without a token: %d %s %v, want %d", rq.method, rq.path, rep.status, rep.body, err, rq.status)
		}
	}
}

// svcFuzzRoutes are the POST routes FuzzServiceAPI sends bodies to.
var svcFuzzRoutes = []string{"/add", "/prefill_complete", "/free", "/potential_loads", "/workers", "/select", "/select_and_reserve",
	"/reservations", "/reservations/r1/prefill_complete", "/reservations/r1/output_block", "/overlap_scores"}

// svcFuzzSkip says why POST /workers should not be given body, or "".
func svcFuzzSkip(body []byte) string {
	var req workerRequest
	if admin.DecodeBytes(body, &req) != nil {
		return ""
	}
	eps := []*string{req.KVEventsEndpoint, req.ReplayEndpoint}
	for _, ep := range deref(req.KVEventsEndpoints) {
		eps = append(eps, &ep)
	}
	for _, ep := range eps {
		if ep != nil && kvevents.ValidateEndpoint(*ep) == nil && !loopback.MatchString(*ep) {
			return "an endpoint off the loopback interface"
		}
	}
	return ""
}

// FuzzServiceAPI sends an arbitrary body to one POST route (route picks
// it) of a service with schedulable workers, cached blocks and a booking:
// the answer must be a JSON object or array, never a 5xx but a 503 for
// candidates naming no worker, and a refusal changes nothing.
func FuzzServiceAPI(f *testing.F) {
	f.Fuzz(func(t *testing.T, route byte, body []byte) {
		path := svcFuzzRoutes[int(route)%len(svcFuzzRoutes)]
		if why := svcFuzzSkip(body); why != "" && path == "/workers" {
			t.Skip(why)
		}
		r := newSvcRig(t, rigOptions{inProcess: true}, scheduler.CostOptions{})
		r.register(rangeBody("m", "", 1, 0, 2), rangeBody("m", "t", 2, 4, 2), rangeBody("m", "", 3, 0, 1))
		r.svcStore("m", 1, 0, indexer.TierDevice, 1, 2, 3)
		r.svcStore("m", 3, 0, indexer.TierHost, 1, 2)
		r.post("/reservations", jsonObj{"reservation_id": "r1", "model_name": "m", "worker_id": 1, "sequence_hashes": []any{1}}).expect(t, http.StatusCreated)
		before := r.svcState()
		rep := r.post(path, body)
		legit := rep.status == http.StatusServiceUnavailable && strings.HasPrefix(path, "/select") && strings.Contains(string(rep.body), "none of worker ids")
		if rep.status >= 500 && !legit {
			t.Fatalf("POST %s %q: %d %s", path, body, rep.status, rep.body)
		}
		var v any
		if err := json.Unmarshal(rep.body, &v); err != nil || !strings.ContainsAny(string(rep.body[:1]), "{[") {
			t.Fatalf("POST %s %q: %d %q is not a JSON object or array: %v", path, body, rep.status, rep.body, err)
		}
		if rep.status/100 != 2 {
			if after := r.svcState(); after != before {
				t.Fatalf("POST %s %q failed (%d %s) and changed the state\nbefore:\n%s\nafter:\n%s", path, body, rep.status, rep.body, before, after)
			}
		}
	})
}

// TestSelectRoutesIgnoreReuseCharge: the Dynamo-compatible routes answer
// with the spec's cost even though the scheduler's ReuseWeight is the
// default, while the gateway's charged selection over the same state
// differs. The seed's rig: rank 0 holds 4 device blocks, 6 with host and
// 8 with disk (effective 4 + 0.8*2 + 0.5*2 = 6.6 blocks: 106 tokens cached,
// 406 of 512 new), rank 1 holds 2 (480 new). With 200 prefill tokens
// booked on rank 0 (no blocks): rank 0 costs (200 + 406)/16 + 8 = 45.875,
// rank 1 costs 480/16 + 8 = 38, plus 16 * 74/16 = 74 when charged.
func TestSelectRoutesIgnoreReuseCharge(t *testing.T) {
	r := svcSelectRig(t, scheduler.CostOptions{})
	key := indexer.Key{Model: "model", Tenant: indexer.DefaultTenant}
	must(t, r.loads.Add(key, scheduler.Booking{ID: "busy", Worker: rk(1, 0), PrefillTokens: 200}))
	sch := scheduler.NewScheduler(r.cat, r.set, r.loads, scheduler.CostOptions{}, 1, nil)
	req := scheduler.SelectRequest{Key: key, Local: []uint64{11, 12, 13, 14, 15, 16, 17, 18}, ISL: 512}
	if d, err := sch.Select(req); err != nil || d.Worker != rk(1, 1) || d.Cost != 38 {
		t.Errorf("uncharged: %s cost %v (%v), want rank 1 at 38", d.Worker, d.Cost, err)
	}
	req.ChargeReuse = true
	if d, err := sch.Select(req); err != nil || d.Worker != rk(1, 0) || d.Cost != 45.875 || d.EffectivePrefillTokens != 406 {
		t.Errorf("charged: %s cost %v prefill %d (%v), want rank 0 at 45.875, 406 tokens", d.Worker, d.Cost, d.EffectivePrefillTokens, err)
	}
	for _, path := range []string{"/select", "/select_and_reserve"} {
		m := r.post(path, svcSeedSelect).expect(t, http.StatusOK)
		if m["dp_rank"] != 1.0 || m["effective_prefill_tokens"] != 480.0 {
			t.Errorf("%s: %v, want dp_rank 1 and 480 tokens (the spec's cost)", path, m)
		}
	}
}

// TestGlobalIDs: worker and reservation ids are global in the selection
// service; without a model_name the routes find them in any (model,
// tenant), and an id two of them know is a 409 asking for model_name.
func TestGlobalIDs(t *testing.T) {
	r := svcSelectRig(t, scheduler.CostOptions{})
	w2 := jsonObj{"worker_id": 2, "model_name": "m2", "tenant_id": "t", "endpoint": "http://worker2:8000", "block_size": 16}
	r.post("/workers", w2).expect(t, http.StatusCreated)
	res := func(model, tenant string, worker int) jsonObj {
		return jsonObj{"reservation_id": "r1", "model_name": model, "tenant_id": tenant, "worker_id": worker,
			"sequence_hashes": []any{1}, "isl_tokens": 16}
	}
	r.post("/reservations", res("model", "default", 1)).expect(t, http.StatusCreated)
	r.svcCalls(t, []svcCall{
		{name: "patch, no model", method: http.MethodPatch, path: "/workers/2", body: jsonObj{"endpoint": "worker2:9000"}, status: 200},
		{name: "patch, no model, unknown", method: http.MethodPatch, path: "/workers/9", body: jsonObj{"endpoint": "worker:1"}, status: 404, errHas: []string{"worker 9 is not registered"}},
		{name: "patch, tenant only, other tenant", method: http.MethodPatch, path: "/workers/2?tenant_id=default", status: 404},
		{name: "prefill complete, no model", path: "/reservations/r1/prefill_complete", status: 200},
		{name: "output block, no model", path: "/reservations/r1/output_block", body: jsonObj{"decay_fraction": 0.5}, status: 200},
		{name: "output block, no model, unknown", path: "/reservations/r9/output_block", status: 404, errHas: []string{"r9"}},
	})
	if got := r.cat.Endpoint(catalog.WorkerKey{Key: indexer.Key{Model: "m2", Tenant: "t"}, ID: 2}); !strings.Contains(got, "9000") {
		t.Errorf("worker 2's endpoint after the patch: %q", got)
	}
	if l := r.loads.Snapshot("model", ""); l[0].PrefillTokens != 0 || l[0].DecodeBlocks != 1.5 {
		t.Errorf("r1's load after prefill_complete and output_block: %+v", l[0])
	}

	// The same ids under a second (model, tenant).
	r.post("/workers", svcSSWorker.with("model_name", "m3")).expect(t, http.StatusCreated)
	r.post("/reservations", res("m2", "t", 2)).expect(t, http.StatusCreated)
	r.svcCalls(t, []svcCall{
		{name: "patch, ambiguous", method: http.MethodPatch, path: "/workers/1", body: jsonObj{"endpoint": "worker:1"}, status: 409,
			errHas: []string{"worker 1", `"model"/"default"`, `"m3"/"default"`, "give model_name"}},
		{name: "delete, ambiguous", method: http.MethodDelete, path: "/workers/1", status: 409, errHas: []string{"give model_name"}},
		{name: "prefill complete, ambiguous", path: "/reservations/r1/prefill_complete", status: 409,
			errHas: []string{`reservation "r1"`, `"m2"/"t"`, "give model_name"}},
		{name: "output block, ambiguous", path: "/reservations/r1/output_block", status: 409},
		{name: "free, ambiguous", method: http.MethodDelete, path: "/reservations/r1", status: 409},
		{name: "free, tenant picks one", method: http.MethodDelete, path: "/reservations/r1?tenant_id=t", status: 200},
		{name: "free, no model, now one", method: http.MethodDelete, path: "/reservations/r1", status: 200},
		{name: "free, no model, active nowhere", method: http.MethodDelete, path: "/reservations/r1", status: 200},
		{name: "delete, model given", method: http.MethodDelete, path: "/workers/1?model_name=m3", status: 200},
		{name: "delete, no model, now one", method: http.MethodDelete, path: "/workers/1", status: 200},
		{name: "delete, no model, gone", method: http.MethodDelete, path: "/workers/1", status: 404, errHas: []string{"worker 1 is not registered"}},
		{name: "delete worker 2, no model", method: http.MethodDelete, path: "/workers/2", body: jsonObj{}, status: 200},
	})
	if l := r.loads.Snapshot("", ""); len(l) != 0 {
		t.Errorf("loads left: %+v", l)
	}
}

// TestSelectionLoads: the selection service's GET /loads, on a port of its
// own, answers Dynamo's ModelLoadResponse per (model, tenant); the
// combined port keeps the slot tracker's flat rows.
func TestSelectionLoads(t *testing.T) {
	r := svcSelectRig(t, scheduler.CostOptions{})
	r.post("/workers", jsonObj{"worker_id": 2, "model_name": "m2", "tenant_id": "t", "endpoint": "http://worker2:8000", "block_size": 16}).
		expect(t, http.StatusCreated)
	r.post("/reservations", jsonObj{"reservation_id": "r1", "model_name": "model", "worker_id": 1, "dp_rank": 1,
		"sequence_hashes": []any{1, 2}, "isl_tokens": 32, "effective_prefill_tokens": 20}).expect(t, http.StatusCreated)
	r.post("/reservations/r1/output_block?model_name=model", nil).expect(t, http.StatusOK)

	sel := admin.New(admin.Options{})
	sel.Handle(SelectionServiceRoutes(r.cat, scheduler.NewScheduler(r.cat, r.set, r.loads, scheduler.CostOptions{}, 1, nil), r.set)...)
	get := func(path string) reply {
		rec := httptest.NewRecorder()
		sel.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return reply{status: rec.Code, body: rec.Body.Bytes()}
	}
	svcJSON(t, "selection loads", get("/loads"), 200, `[
		{"model_name":"m2","tenant_id":"t","routing_group":"t","pending_count":0,"pending_isl_tokens":0,"loads":[
			{"worker_id":2,"dp_rank":0,"potential_prefill_tokens":0,"potential_decode_blocks":0,"active_requests":0}]},
		{"model_name":"model","tenant_id":"default","routing_group":"default","pending_count":0,"pending_isl_tokens":0,"loads":[
			{"worker_id":1,"dp_rank":0,"potential_prefill_tokens":0,"potential_decode_blocks":0,"active_requests":0},
			{"worker_id":1,"dp_rank":1,"potential_prefill_tokens":20,"potential_decode_blocks":3,"active_requests":1}]}]`)
	svcJSON(t, "selection loads of one model", get("/loads?model_name=m2&tenant_id=nope"), 200, `[]`)
	svcJSON(t, "combined port's loads", r.svcGet("/loads?model_name=m2"), 200, `[
		{"model_name":"m2","tenant_id":"t","worker_id":2,"dp_rank":0,"active_prefill_tokens":0,"active_decode_blocks":0}]`)
	for _, route := range SlotTrackerRoutes(r.cat, nil, r.set) {
		if strings.Contains(route.Pattern, "/workers") || strings.Contains(route.Pattern, "/select") {
			t.Errorf("slot tracker route %s", route.Pattern)
		}
	}
}
