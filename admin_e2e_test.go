package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvgate/kvgate/bench/engine"
	"github.com/kvgate/kvgate/bench/engine/enginetest"
	"github.com/kvgate/kvgate/indexer"
)

// End-to-end tests of the admin HTTP API through the built binary, with
// workers simulated by the engine publisher.

// apiClient calls one kvgate's admin API.
type apiClient struct {
	t     *testing.T
	ctx   context.Context
	c     *http.Client
	base  string
	token string
}

// call sends body (JSON-encoded unless a string) and returns the status and
// response body.
func (a apiClient) call(method, path string, body any) (int, string) {
	a.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		data, err := json.Marshal(b)
		if err != nil {
			a.t.Fatal(err)
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(a.ctx, method, a.base+path, rd)
	if err != nil {
		a.t.Fatal(err)
	}
	if a.token != "" {
		req.Header.Set("Authorization", "Bearer "+a.token)
	}
	resp, err := a.c.Do(req)
	if err != nil {
		a.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		a.t.Fatal(err)
	}
	return resp.StatusCode, string(data)
}

// must calls and fails the test unless the status is want.
func (a apiClient) must(want int, method, path string, body any) string {
	a.t.Helper()
	status, resp := a.call(method, path, body)
	if status != want {
		a.t.Fatalf("%s %s = %d %s, want %d", method, path, status, resp, want)
	}
	return resp
}

// eventually polls check until it returns "" (done) or the test's context
// ends, then fails with check's last explanation.
func (a apiClient) eventually(check func() string) {
	a.t.Helper()
	for {
		why := check()
		if why == "" {
			return
		}
		select {
		case <-a.ctx.Done():
			a.t.Fatalf("gave up: %s", why)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// sameJSON reports whether two JSON documents are equal as values.
func sameJSON(a, b string) bool {
	var x, y any
	return json.Unmarshal([]byte(a), &x) == nil && json.Unmarshal([]byte(b), &y) == nil && reflect.DeepEqual(x, y)
}

func tokens(from, to uint32) []uint32 {
	var out []uint32
	for i := from; i <= to; i++ {
		out = append(out, i)
	}
	return out
}

func publish(t *testing.T, pub *engine.Publisher, events ...engine.Event) {
	t.Helper()
	if _, err := pub.Publish(events...); err != nil {
		t.Fatal(err)
	}
}

func stop(t *testing.T, p *kvgateProc) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(); code != 0 {
		t.Errorf("exit code %d; stderr:\n%s", code, strings.Join(p.stderrLines(), "\n"))
	}
}

// TestE2EAdminAPI registers two workers over HTTP, publishes their cache
// through the engine publisher, queries in both APIs' shapes, unregisters
// one and queries again.
func TestE2EAdminAPI(t *testing.T) {
	ctx := e2eContext(t)
	withReplay := engine.Config{ReplayEndpoint: "tcp://127.0.0.1:0"}
	pub1, pub2 := enginetest.Start(t, withReplay), enginetest.Start(t, withReplay)
	p := startKvgateEnv(t, ctx, []string{dynMinWorkersEnv + "=2"},
		"serve", "--admin-addr", "127.0.0.1:0", "--log-format", "json", "--admin-token", "tok", "--max-body", "4KiB", "--enable-test-routes")
	anon := apiClient{t: t, ctx: ctx, c: testClient(t), base: "http://" + p.adminAddr(t, ctx)}
	admin := anon
	admin.token = "tok"

	if status, body := anon.call("GET", "/ready", nil); status != 503 || !strings.Contains(body, "waiting for 2 active workers") {
		t.Errorf("GET /ready before any worker = %d %s, want 503 waiting for 2", status, body)
	}
	reg := func(id int, pub *engine.Publisher) map[string]any {
		return map[string]any{"instance_id": id, "endpoint": pub.Endpoint(), "replay_endpoint": pub.ReplayEndpoint(),
			"model_name": "llama", "block_size": 4, "dp_rank": 0, "future_field": true}
	}
	if status, body := anon.call("POST", "/register", reg(1, pub1)); status != 401 {
		t.Fatalf("POST /register without the token = %d %s, want 401", status, body)
	}
	admin.must(201, "POST", "/register", reg(1, pub1))
	admin.must(201, "POST", "/register", reg(2, pub2))
	if status, body := admin.call("POST", "/register", map[string]any{"instance_id": 3, "endpoint": "tcp://127.0.0.1:1", "model_name": "llama", "block_size": 8}); status != 409 {
		t.Errorf("register with another block size = %d %s, want 409", status, body)
	}
	for _, pub := range []*engine.Publisher{pub1, pub2} {
		if err := pub.WaitSubscribed(ctx); err != nil {
			t.Fatal(err)
		}
	}
	anon.eventually(func() string {
		if status, body := anon.call("GET", "/ready", nil); status != 200 {
			return "GET /ready = " + body
		}
		return ""
	})

	// Worker 1 holds two blocks on device; worker 2 one on device and the
	// next in host memory.
	parent := uint64(201)
	publish(t, pub1, engine.BlockStored{BlockHashes: []uint64{101, 102}, TokenIDs: tokens(1, 8), BlockSize: 4})
	publish(t, pub2, engine.BlockStored{BlockHashes: []uint64{201}, TokenIDs: tokens(1, 4), BlockSize: 4})
	publish(t, pub2, engine.BlockStored{BlockHashes: []uint64{202}, Parent: &parent, TokenIDs: tokens(5, 8), BlockSize: 4, Medium: "CPU"})

	query := map[string]any{"token_ids": tokens(1, 9), "model_name": "llama"}
	want := `{"scores":{"1":{"0":8},"2":{"0":4}},"frequencies":[2,1],"tree_sizes":{"1":{"0":2},"2":{"0":2}},
		"instances":{"1":{"longest_matched":8,"gpu":8,"dp":{"0":8},"cpu":8,"disk":8},
		             "2":{"longest_matched":8,"gpu":4,"dp":{"0":4},"cpu":8,"disk":8}}}`
	anon.eventually(func() string {
		if got := anon.must(200, "POST", "/query", query); !sameJSON(got, want) {
			return "POST /query = " + got
		}
		return ""
	})

	// The same prompt by local hashes, as signed int64 JSON numbers.
	var hashes []int64
	for _, h := range indexer.LocalHashes(nil, tokens(1, 8), 4, indexer.LoRASeed(""), nil) {
		hashes = append(hashes, int64(h))
	}
	if got := anon.must(200, "POST", "/query_by_hash", map[string]any{"block_hashes": hashes, "model_name": "llama"}); !sameJSON(got, want) {
		t.Errorf("POST /query_by_hash = %s, want %s", got, want)
	}
	wantMooncake := `{"data":{"1":{"longest_matched":8,"GPU":8,"DP":{"0":8},"CPU":8,"DISK":8},
		"2":{"longest_matched":8,"GPU":4,"DP":{"0":4},"CPU":8,"DISK":8}}}`
	for _, path := range []string{"/query", "/conductor/query"} {
		if got := anon.must(200, "POST", path, map[string]any{"model": "llama", "token_ids": tokens(1, 8)}); !sameJSON(got, wantMooncake) {
			t.Errorf("POST %s (Mooncake body) = %s, want %s", path, got, wantMooncake)
		}
	}
	if status, body := anon.call("POST", "/query", fmt.Sprintf(`{"model_name":"llama","token_ids":[%s1]}`, strings.Repeat("1,", 4096))); status != 413 {
		t.Errorf("8 KiB query with --max-body 4KiB = %d %s, want 413", status, body)
	}

	var workers []struct {
		InstanceID   uint64 `json:"instance_id"`
		Status       string `json:"status"`
		Source       string `json:"source"`
		RegisteredBy string `json:"registered_by"`
		Listeners    map[string]struct {
			Endpoint string `json:"endpoint"`
			Status   string `json:"status"`
		} `json:"listeners"`
	}
	if err := json.Unmarshal([]byte(anon.must(200, "GET", "/workers?model_name=llama", nil)), &workers); err != nil {
		t.Fatal(err)
	}
	if len(workers) != 2 || workers[0].InstanceID != 1 || workers[1].InstanceID != 2 ||
		workers[0].Status != "active" || workers[0].Source != "zmq" || workers[0].RegisteredBy != "api" || workers[0].Listeners["0"].Endpoint != pub1.Endpoint() {
		t.Errorf("GET /workers = %+v", workers)
	}

	admin.must(200, "POST", "/unregister", map[string]any{"instance_id": 1, "model_name": "llama"})
	admin.must(404, "POST", "/unregister", map[string]any{"instance_id": 1, "model_name": "llama"})
	// Unregister returns after the worker's blocks are gone.
	want = `{"scores":{"2":{"0":4}},"frequencies":[1],"tree_sizes":{"2":{"0":2}},
		"instances":{"2":{"longest_matched":8,"gpu":4,"dp":{"0":4},"cpu":8,"disk":8}}}`
	if got := anon.must(200, "POST", "/query", query); !sameJSON(got, want) {
		t.Errorf("POST /query after unregister = %s, want %s", got, want)
	}
	if status, body := anon.call("GET", "/ready", nil); status != 200 {
		t.Errorf("GET /ready after unregistering below the minimum = %d %s; the startup gate must stay open", status, body)
	}
	metrics := anon.must(200, "GET", "/metrics", nil)
	for _, line := range []string{
		`kvgate_http_requests_total{code="401",method="POST",route="POST /register"} 1`,
		`kvgate_http_requests_total{code="413",method="POST",route="POST /query"} 1`,
		`kvgate_index_entries{model="llama",tenant="default"} 2`,
		`kvgate_workers{status="active"} 1`,
		`kvgate_index_query_duration_seconds_count{api="mooncake"} 2`,
	} {
		if !strings.Contains(metrics, line) {
			t.Errorf("/metrics lacks %q", line)
		}
	}
	// Without the token, every route the route table marks as mutating
	// (the ones --admin-token's help lists) answers 401, and no other.
	for _, rt := range adminRouteTable(t) {
		method, path, _ := strings.Cut(rt.Pattern, " ")
		path = wildcardRE.ReplaceAllString(path, "1")
		if status, body := anon.call(method, path, nil); (status == 401) != rt.Mutates {
			t.Errorf("%s %s without the token = %d %s; mutating: %v", method, path, status, body, rt.Mutates)
		}
	}
	stop(t, p)
}

var wildcardRE = regexp.MustCompile(`\{[^}]*\}`)

// closedPort returns a loopback address nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// TestE2EPeerRecovery starts replica A, feeds it events, starts replica B
// with --peers (an unreachable peer first, then A): B recovers A's index,
// then both apply live events and answer alike.
func TestE2EPeerRecovery(t *testing.T) {
	ctx := e2eContext(t)
	pub := enginetest.Start(t, engine.Config{ReplayEndpoint: "tcp://127.0.0.1:0"})
	workers := fmt.Sprintf("1=%s|%s", pub.Endpoint(), pub.ReplayEndpoint())
	args := []string{"serve", "--admin-addr", "127.0.0.1:0", "--log-format", "json", "--workers", workers, "--model-name", "m:v1", "--block-size", "4"}

	pa := startKvgate(t, ctx, args...)
	a := apiClient{t: t, ctx: ctx, c: testClient(t), base: "http://" + pa.adminAddr(t, ctx)}
	if err := pub.WaitSubscribed(ctx); err != nil {
		t.Fatal(err)
	}
	publish(t, pub, engine.BlockStored{BlockHashes: []uint64{1, 2}, TokenIDs: tokens(1, 8), BlockSize: 4})
	publish(t, pub, engine.BlockStored{BlockHashes: []uint64{3}, TokenIDs: tokens(100, 103), BlockSize: 4, Medium: "DISK"})
	queries := []map[string]any{
		{"model_name": "m:v1", "token_ids": tokens(1, 12)},
		{"model_name": "m:v1", "token_ids": tokens(100, 104)},
	}
	wantBefore := `{"scores":{"1":{"0":8}},"frequencies":[1,1],"tree_sizes":{"1":{"0":3}},"instances":{"1":{"longest_matched":8,"gpu":8,"dp":{"0":8},"cpu":8,"disk":8}}}`
	a.eventually(func() string {
		if got := a.must(200, "POST", "/query", queries[0]); !sameJSON(got, wantBefore) {
			return "A: POST /query = " + got
		}
		return ""
	})

	dead := "http://" + closedPort(t)
	pb := startKvgate(t, ctx, append(args, "--peers", dead+","+a.base, "--peer-timeout", "5s")...)
	b := apiClient{t: t, ctx: ctx, c: a.c, base: "http://" + pb.adminAddr(t, ctx)}
	if _, err := pb.waitLine(ctx, func(l string) bool {
		return strings.Contains(l, "peer recovery: loaded dump") && strings.Contains(l, a.base)
	}); err != nil {
		t.Fatal(err)
	}
	b.eventually(func() string {
		if status, body := b.call("GET", "/ready", nil); status != 200 {
			return "B: GET /ready = " + body
		}
		return ""
	})
	if got := b.must(200, "POST", "/query", queries[0]); !sameJSON(got, wantBefore) {
		t.Errorf("B after recovery: POST /query = %s, want %s", got, wantBefore)
	}
	peers := []string{dead, a.base}
	slices.Sort(peers)
	if got, want := b.must(200, "GET", "/peers", nil), fmt.Sprintf(`["%s","%s"]`, peers[0], peers[1]); !sameJSON(got, want) {
		t.Errorf("B: GET /peers = %s, want %s", got, want)
	}

	// B joins the live stream: once it has seen a batch, any it misses
	// later is replayed, so the next events reach both replicas.
	b.eventually(func() string {
		publish(t, pub)
		if !strings.Contains(b.must(200, "GET", "/workers", nil), `"last_seq"`) {
			return "B never received a live batch"
		}
		return ""
	})
	parent := uint64(2)
	publish(t, pub, engine.BlockStored{BlockHashes: []uint64{4}, Parent: &parent, TokenIDs: tokens(9, 12), BlockSize: 4})
	publish(t, pub, engine.BlockRemoved{BlockHashes: []uint64{3}, Medium: "DISK"})
	wantAfter := `{"scores":{"1":{"0":12}},"frequencies":[1,1,1],"tree_sizes":{"1":{"0":3}},"instances":{"1":{"longest_matched":12,"gpu":12,"dp":{"0":12},"cpu":12,"disk":12}}}`
	for _, r := range []apiClient{a, b} {
		r.eventually(func() string {
			if got := r.must(200, "POST", "/query", queries[0]); !sameJSON(got, wantAfter) {
				return r.base + ": POST /query = " + got
			}
			if got := r.must(200, "POST", "/query", queries[1]); !sameJSON(got, `{"scores":{},"frequencies":[],"tree_sizes":{},"instances":{}}`) {
				return r.base + ": removed block still matches: " + got
			}
			return ""
		})
	}
	if da, db := a.must(200, "GET", "/dump", nil), b.must(200, "GET", "/dump", nil); da != db {
		t.Errorf("dumps differ:\nA: %s\nB: %s", da, db)
	}
	stop(t, pb)
	stop(t, pa)
}

// TestE2ETestRoutesFlag checks that Dynamo's test routes are 404 without
// --enable-test-routes, and served with it.
func TestE2ETestRoutesFlag(t *testing.T) {
	ctx := e2eContext(t)
	for _, tc := range []struct {
		args   []string
		status int // of a pause without a worker id
	}{
		{nil, 404},
		{[]string{"--enable-test-routes"}, 400},
	} {
		p := startKvgate(t, ctx, append([]string{"serve", "--admin-addr", "127.0.0.1:0", "--log-format", "json"}, tc.args...)...)
		c := apiClient{t: t, ctx: ctx, c: testClient(t), base: "http://" + p.adminAddr(t, ctx)}
		for _, path := range []string{"/test/pause_listener", "/test/resume_listener"} {
			if status, body := c.call("POST", path, map[string]any{}); status != tc.status {
				t.Errorf("kvgate %v: POST %s = %d %s, want %d", tc.args, path, status, body, tc.status)
			}
		}
		stop(t, p)
	}
}
