package extproc

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvgate/kvgate/indexer"
	"github.com/kvgate/kvgate/indexer/kvevents"
	"github.com/kvgate/kvgate/internal/envoytest"
	"github.com/kvgate/kvgate/internal/listeners"
	"github.com/kvgate/kvgate/internal/poll"
	"github.com/kvgate/kvgate/scheduler"
	"github.com/kvgate/kvgate/scheduler/catalog"
	"github.com/kvgate/kvgate/tokenize"
)

// selfSigned writes a certificate for 127.0.0.1 and its key, and returns
// their paths and a pool trusting it.
func selfSigned(t *testing.T) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kvgate"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

// newTestCore returns what a Gateway stands on, with model mc and no
// worker; everything is closed when t ends.
func newTestCore(t *testing.T, mc tokenize.ModelConfig) (*slog.Logger, *catalog.Catalog, *scheduler.Scheduler, *tokenize.Registry) {
	t.Helper()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	set := indexer.NewSet(indexer.Options{})
	t.Cleanup(set.Close)
	ingest := kvevents.NewIngester(set, kvevents.IngestOptions{Logger: logger})
	t.Cleanup(ingest.Close) // before set.Close: cleanups run last-in first-out
	cat := catalog.New(set, listeners.New(ingest), nil, catalog.Options{Logger: logger})
	loads := scheduler.NewLoads(scheduler.LoadOptions{})
	cat.Watch(loads.Follow)
	sched := scheduler.NewScheduler(cat, set, loads, scheduler.CostOptions{}, 1, nil)
	reg, err := tokenize.NewRegistry(tokenize.Config{Models: []tokenize.ModelConfig{mc}}, tokenize.RegistryOptions{Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	return logger, cat, sched, reg
}

// TestServerTLSHealthAndDrain serves ext_proc over TLS in process: health
// follows readiness, a refusal is an ImmediateResponse, and a shutdown
// with a stream in flight cancels it and frees its booking.
// serveOnLoopback starts srv on a free loopback port and returns its
// address and a channel that yields Serve's result once it returns.
func serveOnLoopback(t *testing.T, srv *Server) (addr string, served <-chan error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	return ln.Addr().String(), done
}

func TestServerTLSHealthAndDrain(t *testing.T) {
	logger, cat, sched, reg := newTestCore(t, tokenize.ModelConfig{Name: "m", Fallbacks: []tokenize.Path{tokenize.PathApproximate}})
	g := New(reg, cat, sched, Options{Logger: logger, Registerer: prometheus.NewRegistry()})

	certFile, keyFile, pool := selfSigned(t)
	var ready atomic.Bool
	srv, err := NewServer(g, ServerOptions{TLSCert: certFile, TLSKey: keyFile, Ready: ready.Load, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	addr, served := serveOnLoopback(t, srv)
	envoy, err := envoytest.Dial(addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool})))
	if err != nil {
		t.Fatal(err)
	}
	defer envoy.Close()
	ctx := t.Context()
	health := healthpb.NewHealthClient(envoy.Conn())
	status := func(svc string) healthpb.HealthCheckResponse_ServingStatus {
		r, err := health.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
		if err != nil {
			return healthpb.HealthCheckResponse_UNKNOWN
		}
		return r.GetStatus()
	}
	if status("liveness") != healthpb.HealthCheckResponse_SERVING || status(ExtProcServiceName) != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("before ready: liveness %v, service %v", status("liveness"), status(ExtProcServiceName))
	}
	ready.Store(true)
	poll.Until(t, "readiness to follow", func() bool {
		return status("readiness") == healthpb.HealthCheckResponse_SERVING && status(ExtProcServiceName) == healthpb.HealthCheckResponse_SERVING
	})

	// No worker yet: 503 as an ImmediateResponse, over TLS.
	x, err := envoy.Route(ctx, envoytest.Request{Path: "/v1/completions", Body: []byte(`{"model":"m","prompt":"hello"}`)})
	if err != nil || x.Immediate == nil || x.Immediate.GetStatus().GetCode() != 503 {
		t.Fatalf("without workers: %v %v", err, x)
	}

	key := indexer.Key{Model: "m", Tenant: indexer.DefaultTenant}
	if err := cat.PutWorker(catalog.WorkerSpec{WorkerKey: catalog.WorkerKey{Key: key, ID: 7}, BlockSize: 16, Endpoint: "http://127.0.0.1:9", DPSize: 1}); err != nil {
		t.Fatal(err)
	}
	x, err = envoy.Route(ctx, envoytest.Request{Path: "/v1/completions", Body: []byte(`{"model":"m","prompt":"hello"}`)})
	if err != nil || x.Immediate != nil || x.Headers[DestinationHeader] != "127.0.0.1:9" || x.Headers[RankHeader] != "" {
		t.Fatalf("with a worker: %v %v %v", err, x.Immediate, x.Headers)
	}
	booked := func() int {
		n := 0
		for _, l := range sched.Loads().Snapshot("m", indexer.DefaultTenant) {
			n += l.Requests
		}
		return n
	}
	if booked() != 1 {
		t.Fatalf("%d requests booked, want 1", booked())
	}
	// Shutdown with the stream still open: the drain deadline passes, the
	// stream is cancelled, its booking freed.
	dctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	srv.Shutdown(dctx)
	if err := <-served; err != nil {
		t.Fatal(err)
	}
	poll.Until(t, "the booking to be freed", func() bool { return booked() == 0 })
	x.Cancel()
}

func TestServerOptionsTLS(t *testing.T) {
	if _, err := NewServer(nil, ServerOptions{TLSCert: "x"}); err == nil {
		t.Error("a certificate without key accepted")
	}
	if _, err := NewServer(nil, ServerOptions{TLSCert: "/nonexistent", TLSKey: "/nonexistent"}); err == nil {
		t.Error("missing TLS files accepted")
	}
}
