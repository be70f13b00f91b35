package scheduler

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/indexer"
	"github.com/kvgate/kvgate/indexer/kvevents"
	"github.com/kvgate/kvgate/internal/stacktest"
	"github.com/kvgate/kvgate/scheduler/catalog"
)

// This file holds the test rig: a catalog on real listeners, with loads
// following it, as main wires them.

const testBS = 4 // tokens per block of the indexes the tests publish to

var quiet = stacktest.Quiet

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
	r := &rig{t: t, reg: prometheus.NewRegistry()}
	st := stacktest.New(t, stacktest.Options{Set: o.set, Ingest: o.ingest, Catalog: o.catalog, Registry: r.reg})
	r.set, r.ing, r.cat = st.Set, st.Ingester, st.Catalog
	r.loads = NewLoads(o.loads)
	r.cat.Watch(r.loads.Follow)
	return r
}

// deadEndpoint is an ipc endpoint in a directory that does not exist:
// listeners on it never connect, and nothing else can ever bind it.
func deadEndpoint(name string) string { return "ipc:///nonexistent/kvgate-scheduler-test/" + name }

// closedPort returns a tcp endpoint on a loopback port nobody listens on.
func closedPort(t testing.TB) string { return stacktest.ClosedPort(t) }
