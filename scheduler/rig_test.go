package scheduler

import (
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/indexer"
	"github.com/kvgate/kvgate/indexer/kvevents"
	"github.com/kvgate/kvgate/internal/listeners"
	"github.com/kvgate/kvgate/scheduler/catalog"
)

// This file holds the test rig: a catalog on real listeners, with loads
// following it, as main wires them.

const testBS = 4 // tokens per block of the indexes the tests publish to

var quiet = slog.New(slog.DiscardHandler)

type rigOptions struct {
	set     indexer.Options
	catalog catalog.Options
	loads   LoadOptions
	ingest  kvevents.IngestOptions
}

// rig is a catalog on a fresh Set and Ingester, with loads following it.
type rig struct {
	t     testing.TB
	set   *indexer.Set
	ing   *kvevents.Ingester
	cat   *catalog.Catalog
	loads *Loads
	reg   *prometheus.Registry
}

func newRig(t testing.TB, o rigOptions) *rig {
	t.Helper()
	if o.set.EventThreads == 0 {
		o.set.EventThreads = 2
	}
	r := &rig{t: t, set: indexer.NewSet(o.set), reg: prometheus.NewRegistry()}
	if o.ingest.Logger == nil {
		o.ingest.Logger = quiet
	}
	if o.ingest.MinBackoff == 0 {
		o.ingest.MinBackoff, o.ingest.MaxBackoff = 5*time.Millisecond, 50*time.Millisecond
	}
	if o.ingest.FailAfter == 0 {
		o.ingest.FailAfter = 2
	}
	r.ing = kvevents.NewIngester(r.set, o.ingest)
	if o.catalog.Logger == nil {
		o.catalog.Logger = quiet
	}
	r.cat = catalog.New(r.set, listeners.New(r.ing), r.reg, o.catalog)
	r.loads = NewLoads(o.loads)
	r.cat.Watch(r.loads.Follow)
	t.Cleanup(func() {
		r.ing.Close() // listeners stop submitting before the Set closes
		r.set.Close()
	})
	return r
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
