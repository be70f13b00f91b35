package main

import (
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"testing"
)

// End-to-end test of replica sync: two kvgate processes subscribed to each
// other share their bookings.

// freePort returns a loopback port nothing listens on (for a moment).
func freePort(t *testing.T) string {
	t.Helper()
	_, port, err := net.SplitHostPort(closedPort(t))
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// loadRow is one entry of GET /loads.
type loadRow struct {
	WorkerID uint64  `json:"worker_id"`
	DPRank   uint32  `json:"dp_rank"`
	Prefill  int64   `json:"active_prefill_tokens"`
	Decode   float64 `json:"active_decode_blocks"`
}

// loadsOf returns a replica's loads of model by dp rank of worker 1.
func loadsOf(a apiClient, model string) map[uint32]loadRow {
	a.t.Helper()
	var rows []loadRow
	if err := json.Unmarshal([]byte(a.must(200, "GET", "/loads?model_name="+model, nil)), &rows); err != nil {
		a.t.Fatal(err)
	}
	out := map[uint32]loadRow{}
	for _, r := range rows {
		if r.WorkerID == 1 {
			out[r.DPRank] = r
		}
	}
	return out
}

// syncLive waits until from's bookings reach to: it books probes on from
// until one shows up on to (a subscriber misses what is published before
// its subscription is in), then frees them all and waits for to to be idle.
func syncLive(from, to apiClient, model string) {
	from.t.Helper()
	var probes []string
	from.eventually(func() string {
		id := fmt.Sprintf("probe-%s-%d", strings.TrimPrefix(from.base, "http://"), len(probes))
		probes = append(probes, id)
		from.must(201, "POST", "/add", map[string]any{"request_id": id, "model_name": model, "worker_id": 1, "dp_rank": 0,
			"sequence_hashes": []int64{}, "new_isl_tokens": 1})
		if loadsOf(to, model)[0].Prefill == 0 {
			return to.base + " never saw a probe booked on " + from.base
		}
		return ""
	})
	for _, id := range probes {
		from.must(200, "POST", "/free", map[string]any{"request_id": id, "model_name": model})
	}
	for _, r := range []apiClient{from, to} {
		r.eventually(func() string {
			if l := loadsOf(r, model)[0]; l.Prefill != 0 || l.Decode != 0 {
				return fmt.Sprintf("%s: probes not freed: %+v", r.base, l)
			}
			return ""
		})
	}
}

func TestE2EReplicaSync(t *testing.T) {
	ctx := e2eContext(t)
	portA, portB := freePort(t), freePort(t)
	var procs []*kvgateProc
	start := func(port, peer string) apiClient {
		p := startKvgate(t, ctx, "serve", "--admin-addr", "127.0.0.1:0", "--log-format", "json",
			"--replica-sync-port", port, "--replica-sync-peers", "tcp://127.0.0.1:"+peer)
		procs = append(procs, p)
		c := apiClient{t: t, ctx: ctx, c: testClient(t), base: "http://" + p.adminAddr(t, ctx)}
		if got := c.must(200, "GET", "/replica_sync/peers", nil); !sameJSON(got, `["tcp://127.0.0.1:`+peer+`"]`) {
			t.Errorf("%s: GET /replica_sync/peers = %s", c.base, got)
		}
		return c
	}
	a, b := start(portA, portB), start(portB, portA)

	const model = "llama"
	for _, r := range []apiClient{a, b} {
		// Every replica needs the same catalog: replica traffic never
		// creates workers.
		r.must(201, "POST", "/register", map[string]any{"worker_id": 1, "model_name": model, "block_size": 4, "dp_start": 0, "dp_size": 2})
	}
	syncLive(a, b, model)
	syncLive(b, a, model)

	// A books one request by selection, another by the slot tracker's /add.
	var sel struct {
		ReservationID string `json:"reservation_id"`
		WorkerID      uint64 `json:"worker_id"`
		DPRank        uint32 `json:"dp_rank"`
		Prefill       int64  `json:"effective_prefill_tokens"`
	}
	body := a.must(200, "POST", "/select_and_reserve", map[string]any{"model_name": model, "block_hashes": []int64{1, 2, 3}, "reservation_id": "res-1"})
	if err := json.Unmarshal([]byte(body), &sel); err != nil || sel.ReservationID != "res-1" || sel.WorkerID != 1 || sel.Prefill != 12 {
		t.Fatalf("POST /select_and_reserve = %s (%v)", body, err)
	}
	other := 1 - sel.DPRank
	a.must(201, "POST", "/add", map[string]any{"request_id": "req-2", "model_name": model, "worker_id": 1, "dp_rank": other,
		"sequence_hashes": []int64{7, 8}, "new_isl_tokens": 5})
	want := map[uint32]loadRow{sel.DPRank: {Prefill: 12, Decode: 3}, other: {Prefill: 5, Decode: 2}}
	same := func(got map[uint32]loadRow) bool {
		for rank, w := range want {
			if got[rank].Prefill != w.Prefill || got[rank].Decode != w.Decode {
				return false
			}
		}
		return true
	}
	for _, r := range []apiClient{a, b} {
		r.eventually(func() string {
			if got := loadsOf(r, model); !same(got) {
				return fmt.Sprintf("%s: loads %+v, want %+v", r.base, got, want)
			}
			return ""
		})
	}

	// Prefill completion travels; an output block stays on A.
	a.must(200, "POST", "/reservations/res-1/output_block?model_name="+model, nil)
	a.must(200, "POST", "/reservations/res-1/prefill_complete?model_name="+model, nil)
	want[sel.DPRank] = loadRow{Prefill: 0, Decode: 3}
	b.eventually(func() string {
		if got := loadsOf(b, model); !same(got) {
			return fmt.Sprintf("B after prefill_complete: loads %+v, want %+v", got, want)
		}
		return ""
	})
	if got := loadsOf(a, model)[sel.DPRank]; got.Prefill != 0 || got.Decode != 4 {
		t.Errorf("A after output_block and prefill_complete: %+v, want 0 prefill tokens, 4 decode blocks", got)
	}

	a.must(200, "POST", "/free", map[string]any{"request_id": "res-1", "model_name": model})
	a.must(200, "POST", "/free", map[string]any{"request_id": "req-2", "model_name": model})
	want = map[uint32]loadRow{0: {}, 1: {}}
	for _, r := range []apiClient{a, b} {
		r.eventually(func() string {
			if got := loadsOf(r, model); !same(got) {
				return fmt.Sprintf("%s after the frees: loads %+v", r.base, got)
			}
			return ""
		})
	}

	metrics := b.must(200, "GET", "/metrics", nil)
	for _, line := range []string{
		"kvgate_replica_sync_peers 1",
		"kvgate_replica_sync_peers_connected 1",
		`kvgate_replica_sync_events_applied_total{kind="prefill_complete"} 1`,
		`kvgate_replica_sync_events_dropped_total{reason="own"} 0`,
	} {
		if !strings.Contains(metrics, line) {
			t.Errorf("B's /metrics lacks %q", line)
		}
	}

	// Peers change at run time.
	b.must(200, "POST", "/replica_sync/deregister_peer", map[string]any{"endpoint": "tcp://127.0.0.1:" + portA})
	b.must(404, "POST", "/replica_sync/deregister_peer", map[string]any{"endpoint": "tcp://127.0.0.1:" + portA})
	if got := b.must(200, "GET", "/replica_sync/peers", nil); !sameJSON(got, `[]`) {
		t.Errorf("B: GET /replica_sync/peers after deregistering = %s", got)
	}
	b.must(400, "POST", "/replica_sync/register_peer", map[string]any{"endpoint": "127.0.0.1:" + portA})
	b.must(201, "POST", "/replica_sync/register_peer", map[string]any{"endpoint": "tcp://127.0.0.1:" + portA})
	syncLive(a, b, model)
	for _, p := range procs {
		stop(t, p)
	}
}

func TestE2EReplicaSyncOff(t *testing.T) {
	ctx := e2eContext(t)
	p := startKvgate(t, ctx, "serve", "--admin-addr", "127.0.0.1:0", "--log-format", "json")
	a := apiClient{t: t, ctx: ctx, c: testClient(t), base: "http://" + p.adminAddr(t, ctx)}
	if got := a.must(200, "GET", "/replica_sync/peers", nil); !sameJSON(got, `[]`) {
		t.Errorf("GET /replica_sync/peers = %s, want []", got)
	}
	if got := a.must(409, "POST", "/replica_sync/register_peer", map[string]any{"endpoint": "tcp://127.0.0.1:1"}); !strings.Contains(got, "--replica-sync-port") {
		t.Errorf("POST /replica_sync/register_peer = %s, want it to name --replica-sync-port", got)
	}
	stop(t, p)
}

func TestE2EReplicaSyncPeersWithoutPort(t *testing.T) {
	p := startKvgate(t, e2eContext(t), "serve", "--admin-addr", "127.0.0.1:0", "--replica-sync-peers", "tcp://127.0.0.1:9")
	if code := p.wait(); code != 1 {
		t.Errorf("exit code = %d, want 1", code)
	}
	lines := p.stderrLines()
	if len(lines) != 1 || !strings.Contains(lines[0], "requires --replica-sync-port") {
		t.Errorf("stderr = %q, want one line naming --replica-sync-port", lines)
	}
}
