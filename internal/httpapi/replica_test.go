package httpapi

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/indexer"
	"github.com/kvgate/kvgate/internal/admin"
	"github.com/kvgate/kvgate/scheduler"
	"github.com/kvgate/kvgate/scheduler/catalog"
	"github.com/kvgate/kvgate/scheduler/replica"
)

// These tests drive replica sync's routes, on and off.

// serveReplicaRoute sends one request to an admin server.
func serveReplicaRoute(t *testing.T, srv http.Handler, method, path, body, token string) (int, string) {
	t.Helper()
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	w := httptest.NewRecorder()
	srv.ServeHTTP(w, req)
	return w.Code, strings.TrimSpace(w.Body.String())
}

func TestReplicaRoutes(t *testing.T) {
	loads := scheduler.NewLoads(scheduler.LoadOptions{})
	loads.Follow(catalog.Change{Kind: catalog.Added, Worker: catalog.Worker{
		WorkerKey: catalog.WorkerKey{Key: indexer.Key{Model: "m", Tenant: indexer.DefaultTenant}, ID: 1}, BlockSize: 4, Ranks: []uint32{0}}})
	r, err := replica.New(loads, prometheus.NewRegistry(), replica.Options{BindHost: "127.0.0.1", Logger: quiet})
	must(t, err)
	t.Cleanup(func() { must(t, r.Close()) })
	srv := admin.New(admin.Options{Token: "tok"})
	srv.Handle(ReplicaRoutes(r)...)
	dead := closedPort(t)
	steps := []struct {
		method, path, body, token string
		status                    int
		want                      string // exact body, or a substring of the error
	}{
		{"GET", "/replica_sync/peers", "", "", 200, `[]`},
		{"POST", "/replica_sync/register_peer", `{"endpoint":"` + dead + `"}`, "", 401, "bearer token"},
		{"POST", "/replica_sync/register_peer", `{"endpoint":"` + dead + `"}`, "tok", 201, `{"status":"ok"}`},
		{"POST", "/replica_sync/register_peer", `{"endpoint":"` + dead + `","future":1}`, "tok", 200, `{"status":"ok"}`},
		{"POST", "/replica_sync/register_peer", `{"endpoint":"tcp://Peer.invalid:9092"}`, "tok", 201, `{"status":"ok"}`},
		{"POST", "/replica_sync/register_peer", `{"endpoint":"tcp://peer.INVALID:9092"}`, "tok", 200, `{"status":"ok"}`},
		{"GET", "/replica_sync/peers", "", "", 200, `["` + dead + `","tcp://peer.invalid:9092"]`},
		{"POST", "/replica_sync/register_peer", `{"endpoint":"http://b:1"}`, "tok", 400, "want the tcp:// scheme"},
		{"POST", "/replica_sync/register_peer", `{"endpoint":"tcp://*:1"}`, "tok", 400, "not a host name"},
		{"POST", "/replica_sync/register_peer", `{"endpoint":5}`, "tok", 400, "field endpoint"},
		{"POST", "/replica_sync/register_peer", `{}`, "tok", 400, "endpoint is required"},
		{"POST", "/replica_sync/register_peer", `{`, "tok", 400, "malformed JSON"},
		{"POST", "/replica_sync/deregister_peer", `{"endpoint":"` + dead + `"}`, "", 401, "bearer token"},
		{"POST", "/replica_sync/deregister_peer", `{"endpoint":"` + dead + `"}`, "tok", 200, `{"status":"ok"}`},
		{"POST", "/replica_sync/deregister_peer", `{"endpoint":"` + dead + `"}`, "tok", 404, "is not registered"},
		{"POST", "/replica_sync/deregister_peer", `{"endpoint":"b:1"}`, "tok", 400, "want the tcp:// scheme"},
		{"GET", "/replica_sync/peers", "", "", 200, `["tcp://peer.invalid:9092"]`},
		{"DELETE", "/replica_sync/peers", "", "tok", 405, "not allowed"},
	}
	for _, s := range steps {
		status, body := serveReplicaRoute(t, srv, s.method, s.path, s.body, s.token)
		ok := status == s.status
		if s.status < 300 {
			ok = ok && body == s.want
		} else {
			ok = ok && strings.Contains(body, s.want) && strings.HasPrefix(body, `{"error":`)
		}
		if !ok {
			t.Errorf("%s %s %s = %d %s, want %d %s", s.method, s.path, s.body, status, body, s.status, s.want)
		}
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if status, body := serveReplicaRoute(t, srv, "POST", "/replica_sync/register_peer", `{"endpoint":"`+dead+`"}`, "tok"); status != 503 {
		t.Errorf("register after Close = %d %s, want 503", status, body)
	}

	off := admin.New(admin.Options{})
	off.Handle(ReplicaSyncOffRoutes()...)
	if status, body := serveReplicaRoute(t, off, "GET", "/replica_sync/peers", "", ""); status != 200 || body != "[]" {
		t.Errorf("off: GET peers = %d %s", status, body)
	}
	for _, path := range []string{"/replica_sync/register_peer", "/replica_sync/deregister_peer"} {
		if status, body := serveReplicaRoute(t, off, "POST", path, `{"endpoint":"`+dead+`"}`, ""); status != 409 || !strings.Contains(body, "--replica-sync-port") {
			t.Errorf("off: POST %s = %d %s, want 409 naming --replica-sync-port", path, status, body)
		}
	}
}
