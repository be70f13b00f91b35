// Package stacktest builds, for tests, the core as main wires it: an index
// Set, real KV event listeners (kvevents.Ingester) behind the worker
// catalog, torn down in order at the test's end; and the small fixtures
// the tests of several packages share (a loopback port nobody listens on,
// a clock moved by hand).
//
// Only tests import it. It must not hold behaviour of its own: what it
// builds is exactly what main builds, with quiet logs and short backoffs.
package stacktest

import (
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/indexer"
	"github.com/kvgate/kvgate/indexer/kvevents"
	"github.com/kvgate/kvgate/internal/listeners"
	"github.com/kvgate/kvgate/scheduler/catalog"
)

// Quiet is a logger that discards everything.
var Quiet = slog.New(slog.DiscardHandler)

// Options configure a Stack. Zero values take the tests' defaults: two
// event threads, quiet logs, listener backoffs of 5 to 50 ms, a listener
// failed after 2 attempts.
type Options struct {
	Set     indexer.Options
	Ingest  kvevents.IngestOptions
	Catalog catalog.Options
	// Registry, if not nil, receives the catalog's metrics.
	Registry prometheus.Registerer
}

// Stack is a catalog on real listeners over a fresh Set.
type Stack struct {
	Set      *indexer.Set
	Ingester *kvevents.Ingester
	Catalog  *catalog.Catalog
}

// New builds a Stack and closes it when t ends: the listeners first, so
// that they stop submitting before the Set closes.
func New(t testing.TB, o Options) *Stack {
	t.Helper()
	if o.Set.EventThreads == 0 {
		o.Set.EventThreads = 2
	}
	if o.Ingest.Logger == nil {
		o.Ingest.Logger = Quiet
	}
	if o.Ingest.MinBackoff == 0 {
		o.Ingest.MinBackoff, o.Ingest.MaxBackoff = 5*time.Millisecond, 50*time.Millisecond
	}
	if o.Ingest.FailAfter == 0 {
		o.Ingest.FailAfter = 2
	}
	if o.Catalog.Logger == nil {
		o.Catalog.Logger = Quiet
	}
	s := &Stack{Set: indexer.NewSet(o.Set)}
	s.Ingester = kvevents.NewIngester(s.Set, o.Ingest)
	s.Catalog = catalog.New(s.Set, listeners.New(s.Ingester), o.Registry, o.Catalog)
	t.Cleanup(func() {
		s.Ingester.Close()
		s.Set.Close()
	})
	return s
}

// ClosedPort returns a tcp endpoint on a loopback port nobody listens on.
func ClosedPort(t testing.TB) string {
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

// Clock is a clock the tests move by hand.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a Clock at a fixed instant.
func NewClock() *Clock { return &Clock{now: time.Unix(1_800_000_000, 0)} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}
