package main

import (
	"encoding/json"
	"strings"
	"syscall"
	"testing"
)

// TestE2EServiceListeners starts kvgate with a listener per service and
// checks that each serves its own service's routes, the process routes
// and the admin plumbing, and 404s the other services' routes, while the
// combined admin port keeps serving them all.
func TestE2EServiceListeners(t *testing.T) {
	ctx := e2eContext(t)
	p := startKvgate(t, ctx, "serve", "--admin-addr", "127.0.0.1:0", "--log-format", "json", "--admin-token", "tok",
		"--indexer-addr", "127.0.0.1:0", "--slot-tracker-addr", "127.0.0.1:0", "--selection-addr", "127.0.0.1:0")
	addrs := map[string]string{}
	if _, err := p.waitLine(ctx, func(line string) bool {
		var rec struct{ Msg, Addr string }
		if json.Unmarshal([]byte(line), &rec) == nil {
			switch name := strings.TrimSuffix(rec.Msg, " listening"); name {
			case "admin", "indexer", "slot-tracker", "selection":
				addrs[name] = rec.Addr
			}
		}
		return len(addrs) == 4
	}); err != nil {
		t.Fatalf("waiting for four listeners: %v (have %v)", err, addrs)
	}
	client := func(name string) apiClient {
		if addrs[name] == "" {
			t.Fatalf("no %q listener in %v", name, addrs)
		}
		return apiClient{t: t, ctx: ctx, c: testClient(t), base: "http://" + addrs[name], token: "tok"}
	}
	combined, indexer, slots, selection := client("admin"), client("indexer"), client("slot-tracker"), client("selection")

	// Each listener: the process routes, the bearer token on mutating
	// routes, JSON 404 and 405.
	for name, a := range map[string]apiClient{"indexer": indexer, "slot-tracker": slots, "selection": selection} {
		a.must(200, "GET", "/health", nil)
		if body := a.must(200, "GET", "/metrics", nil); !strings.Contains(body, "kvgate_http_requests_total") {
			t.Errorf("%s: GET /metrics lacks kvgate_http_requests_total", name)
		}
		if status, body := a.call("GET", "/no/such/route", nil); status != 404 || !strings.Contains(body, `"error"`) {
			t.Errorf("%s: GET /no/such/route = %d %s, want a JSON 404", name, status, body)
		}
		anon := a
		anon.token = ""
		if status, _ := anon.call("POST", "/register", map[string]any{}); status != 401 && status != 404 {
			t.Errorf("%s: anonymous POST /register = %d, want 401 (or 404 where not served)", name, status)
		}
	}

	// The indexer: worker catalog, queries, dump, peers, conductor.
	indexer.must(201, "POST", "/register", map[string]any{"worker_id": 1, "model_name": "m", "block_size": 4, "dp_size": 1})
	indexer.must(200, "GET", "/workers", nil)
	indexer.must(200, "POST", "/query_by_hash", map[string]any{"model_name": "m", "block_hashes": []int{1}})
	indexer.must(200, "POST", "/conductor/query_by_hash", map[string]any{"model": "m", "block_hash": []int{1}})
	indexer.must(200, "GET", "/dump", nil)
	indexer.must(200, "GET", "/peers", nil)
	indexer.must(405, "GET", "/query", nil)
	for _, r := range [][2]string{{"GET", "/loads"}, {"POST", "/add"}, {"POST", "/select"}, {"POST", "/select_and_reserve"}, {"GET", "/replica_sync/peers"}} {
		indexer.must(404, r[0], r[1], map[string]any{})
	}

	// The slot tracker: registration, bookings and its flat GET /loads.
	slots.must(201, "POST", "/add", map[string]any{"model_name": "m", "request_id": "r1", "worker_id": 1, "sequence_hashes": []int{}, "new_isl_tokens": 8})
	var loads []map[string]any
	if err := json.Unmarshal([]byte(slots.must(200, "GET", "/loads?model_name=m", nil)), &loads); err != nil || len(loads) != 1 || loads[0]["active_prefill_tokens"] != 8.0 {
		t.Errorf("slot tracker GET /loads = %v (%v), want one row with 8 prefill tokens", loads, err)
	}
	slots.must(200, "POST", "/free", map[string]any{"model_name": "m", "request_id": "r1"})
	slots.must(200, "GET", "/workers", nil)
	for _, r := range [][2]string{{"POST", "/query"}, {"GET", "/dump"}, {"POST", "/select"}, {"POST", "/reservations"}, {"GET", "/peers"}} {
		slots.must(404, r[0], r[1], map[string]any{})
	}

	// The selection service: workers in its shape, selection, overlap.
	selection.must(201, "POST", "/workers", map[string]any{"worker_id": 2, "model_name": "s", "endpoint": "http://h:1", "block_size": 4})
	selection.must(200, "POST", "/select", map[string]any{"model_name": "s", "block_hashes": []int{1}})
	selection.must(200, "POST", "/overlap_scores", map[string]any{"model_name": "s", "block_hashes": []int{1}})
	selection.must(200, "GET", "/replica_sync/peers", nil)
	// GET /loads in the selection service's shape: one entry per (model,
	// tenant), its ranks under "loads".
	var groups []map[string]any
	if err := json.Unmarshal([]byte(selection.must(200, "GET", "/loads?model_name=s", nil)), &groups); err != nil || len(groups) != 1 || groups[0]["model_name"] != "s" || groups[0]["loads"] == nil {
		t.Errorf("selection GET /loads = %v (%v), want one entry for model s with its loads", groups, err)
	}
	selection.must(405, "GET", "/select", nil)
	for _, r := range [][2]string{{"POST", "/query"}, {"GET", "/dump"}, {"POST", "/add"}, {"POST", "/register"}, {"POST", "/unregister"}, {"GET", "/peers"}} {
		selection.must(404, r[0], r[1], map[string]any{})
	}

	// The combined port serves every service's routes.
	combined.must(200, "GET", "/dump", nil)
	combined.must(200, "GET", "/loads", nil)
	combined.must(200, "POST", "/select", map[string]any{"model_name": "s", "block_hashes": []int{1}})

	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(); code != 0 {
		t.Errorf("exit code = %d, want 0; stderr:\n%s", code, strings.Join(p.stderrLines(), "\n"))
	}
}
