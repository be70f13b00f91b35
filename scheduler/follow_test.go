package scheduler

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/kvgate/kvgate/indexer"
	"github.com/kvgate/kvgate/scheduler/catalog"
)

// TestLoadsFollowCatalog: loads following the catalog's changes
// (Loads.Follow) know exactly the catalog's ranks after every change, and
// a refused change changes nothing.
func TestLoadsFollowCatalog(t *testing.T) {
	r := newRig(t, rigOptions{})
	key := indexer.Key{Model: "m", Tenant: indexer.DefaultTenant}
	wk := func(id uint64) catalog.WorkerKey { return catalog.WorkerKey{Key: key, ID: id} }
	must(t, r.cat.RegisterRange(catalog.RangeRegistration{WorkerKey: wk(1), BlockSize: testBS, DPSize: 2}))
	steps := []struct {
		name   string
		change func() error
	}{
		{"registered before", func() error { return nil }},
		{"a rank with events", func() error {
			return r.cat.RegisterRank(catalog.RankRegistration{WorkerKey: wk(2), BlockSize: testBS, Publisher: catalog.Publisher{Endpoint: deadEndpoint("watch")}})
		}},
		{"a narrower range", func() error {
			return r.cat.RegisterRange(catalog.RangeRegistration{WorkerKey: wk(1), BlockSize: testBS, DPStart: 1, DPSize: 2})
		}},
		{"refused: other block size", func() error {
			if err := r.cat.RegisterRange(catalog.RangeRegistration{WorkerKey: wk(1), BlockSize: 2 * testBS, DPSize: 1}); !errors.Is(err, ErrConflict) {
				return fmt.Errorf("got %v, want a conflict", err)
			}
			return nil
		}},
		{"put", func() error {
			return r.cat.PutWorker(catalog.WorkerSpec{WorkerKey: wk(3), BlockSize: testBS, Endpoint: "10.0.0.3:8000", DPSize: 2})
		}},
		{"patch", func() error {
			return r.cat.PatchWorker(catalog.WorkerPatch{WorkerKey: wk(3), DPSize: ptrTo(uint32(1)), Endpoint: ptrTo("10.0.0.4:8000")})
		}},
		{"one rank removed", func() error {
			_, err := r.cat.Unregister("m", nil, 1, ptrTo(uint32(1)))
			return err
		}},
		{"the last rank removed", func() error {
			_, err := r.cat.Unregister("m", nil, 1, ptrTo(uint32(2)))
			return err
		}},
		{"a worker removed", func() error {
			_, err := r.cat.Unregister("m", nil, 2, nil)
			return err
		}},
	}
	for _, s := range steps {
		if err := s.change(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		var inCatalog, inLoads []indexer.WorkerRank
		for _, w := range r.cat.Workers("", "") {
			for _, rank := range w.Ranks {
				inCatalog = append(inCatalog, indexer.WorkerRank{Worker: w.ID, Rank: rank})
			}
		}
		for _, l := range r.loads.Snapshot("", "") {
			inLoads = append(inLoads, l.Worker)
		}
		if !slices.Equal(inLoads, inCatalog) {
			t.Errorf("%s: the loads know ranks %v, the catalog %v", s.name, inLoads, inCatalog)
		}
	}
}

// TestLoadsForgetLastWorker: when the last worker of a (model, tenant)
// leaves the catalog, its tracker goes (the key is not found, as Dynamo's
// slot tracker answers for an unknown tracker) and the key can come back
// with another block size; a key with a worker left keeps its tracker.
func TestLoadsForgetLastWorker(t *testing.T) {
	r := newRig(t, rigOptions{})
	key := indexer.Key{Model: "m", Tenant: indexer.DefaultTenant}
	other := indexer.Key{Model: "m", Tenant: "other"}
	must(t, r.cat.RegisterRange(catalog.RangeRegistration{WorkerKey: catalog.WorkerKey{Key: key, ID: 1}, BlockSize: testBS, DPSize: 2}))
	must(t, r.cat.RegisterRange(catalog.RangeRegistration{WorkerKey: catalog.WorkerKey{Key: key, ID: 2}, BlockSize: testBS, DPSize: 1}))
	must(t, r.cat.RegisterRange(catalog.RangeRegistration{WorkerKey: catalog.WorkerKey{Key: other, ID: 1}, BlockSize: testBS, DPSize: 1}))
	must(t, r.loads.Add(key, Booking{ID: "a", Worker: indexer.WorkerRank{Worker: 1}}))
	for _, id := range []uint64{1, 2} {
		if _, ok := r.loads.BlockSize(key); !ok {
			t.Fatalf("before worker %d left: key unknown", id)
		}
		if _, err := r.cat.Unregister("m", ptrTo(indexer.DefaultTenant), id, nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok := r.loads.BlockSize(key); ok {
		t.Fatal("the tracker outlived its last worker")
	}
	if err := r.loads.Add(key, Booking{ID: "b", Worker: indexer.WorkerRank{Worker: 2}}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("booking on a forgotten key: %v, want ErrNotFound", err)
	}
	if _, err := r.loads.Free(key, "a"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("free on a forgotten key: %v, want ErrNotFound", err)
	}
	if _, ok := r.loads.BlockSize(other); !ok {
		t.Fatal("another tenant's tracker went too")
	}
	must(t, r.cat.RegisterRange(catalog.RangeRegistration{WorkerKey: catalog.WorkerKey{Key: key, ID: 3}, BlockSize: 2 * testBS, DPSize: 1}))
	if bs, ok := r.loads.BlockSize(key); !ok || bs != 2*testBS {
		t.Fatalf("after registering again: block size %d, %v; want %d", bs, ok, 2*testBS)
	}
}
