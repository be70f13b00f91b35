package httpapi

import (
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/kvgate/kvgate/bench/engine"
	"github.com/kvgate/kvgate/indexer"
	"github.com/kvgate/kvgate/internal/admin"
	"github.com/kvgate/kvgate/internal/poll"
	"github.com/kvgate/kvgate/scheduler"
)

// These tests check that a (model, tenant) goes with its last worker: the
// slot tracker's routes answer 404 for it, as Dynamo's do for an unknown
// tracker, its index leaves /dump and the kvgate_index_* series, and it
// may be registered again with another block size.

// newLastWorkerRig is a service rig that also serves the index routes,
// in process.
func newLastWorkerRig(t *testing.T) *rig {
	t.Helper()
	r := newSvcRig(t, rigOptions{inProcess: true}, scheduler.CostOptions{})
	peers, err := NewPeers(nil)
	if err != nil {
		t.Fatal(err)
	}
	r.handler.(*admin.Server).Handle(IndexRoutes(r.set, peers, r.reg)...)
	return r
}

// indexGone fails t unless key has no index, no /dump entry and no
// kvgate_index_* series.
func (r *rig) indexGone(t *testing.T, key indexer.Key) {
	t.Helper()
	if r.set.Lookup(key) != nil {
		t.Errorf("%s: index left", key)
	}
	rep := r.do(http.MethodGet, "/dump", nil)
	if rep.status != http.StatusOK || strings.Contains(string(rep.body), key.String()) {
		t.Errorf("%s: /dump answers %d %s", key, rep.status, rep.body)
	}
	for name := range samples(t, r.reg) {
		if strings.Contains(name, `model="`+key.Model+`"`) && strings.Contains(name, `tenant="`+key.Tenant+`"`) {
			t.Errorf("%s: series %s left", key, name)
		}
	}
}

func TestLastWorkerGoes(t *testing.T) {
	const model = "llama-3-8b"
	key := indexer.Key{Model: model, Tenant: indexer.DefaultTenant}
	other := rangeBody(model, "other", 7, 0, 1).with("block_size", 16)
	tests := []struct {
		name  string
		leave []jsonObj // unregister bodies, in order
		mid   jsonObj   // a request booked on what is left between them
	}{
		{"one worker", []jsonObj{who(model, "default", 7)}, nil},
		{"rank by rank", []jsonObj{who(model, "default", 7).with("dp_rank", 0), who(model, "default", 7).with("dp_rank", 1)},
			svcSTAdd.with("request_id", "r-mid", "dp_rank", 1)},
		{"two workers", []jsonObj{who(model, "default", 7), who(model, "default", 8)},
			svcSTAdd.with("request_id", "r-mid", "worker_id", 8)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newLastWorkerRig(t)
			r.register(svcSTWorker, other)
			if tt.name == "two workers" {
				r.register(svcSTWorker.with("worker_id", 8))
			}
			r.post("/add", svcSTAdd).expect(t, http.StatusCreated)
			if _, ok := samples(t, r.reg)[`kvgate_index_entries{model="llama-3-8b",tenant="default"}`]; !ok || r.set.Lookup(key) == nil {
				t.Fatal("no index, or no series of it, for the registered worker")
			}
			for i, b := range tt.leave {
				if i > 0 {
					r.post("/add", tt.mid).expect(t, http.StatusCreated)
				}
				r.unregister(b)
			}
			r.svcCalls(t, []svcCall{
				{name: "add", path: "/add", body: svcSTAdd.with("request_id", "r2"), status: 404, errHas: []string{model}},
				{name: "prefill complete", path: "/prefill_complete", body: svcSTReq, status: 404},
				{name: "free", path: "/free", body: svcSTReq, status: 404},
				{name: "potential loads", path: "/potential_loads", body: jsonObj{"model_name": model, "sequence_hashes": []any{1}, "new_isl_tokens": 4}, status: 404},
			})
			svcJSON(t, "loads", r.svcGet("/loads?model_name="+model+"&tenant_id=default"), 200, `[]`)
			r.indexGone(t, key)
			if r.set.Lookup(indexer.Key{Model: model, Tenant: "other"}) == nil {
				t.Error("another tenant's index went too")
			}
			// Back with another block size.
			r.register(svcSTWorker.with("block_size", 32))
			r.post("/add", svcSTAdd.with("request_id", "r3")).expect(t, http.StatusCreated)
			if ix := r.set.Lookup(key); ix == nil || ix.BlockSize() != 32 {
				t.Fatal("registering again made no index of block size 32")
			}
		})
	}
}

// TestLastWorkerGoesWithEventsInFlight unregisters the last worker of a
// key while its publisher streams events (run with -race): the index goes,
// nothing brings it back, and the key registers again with another block
// size.
func TestLastWorkerGoesWithEventsInFlight(t *testing.T) {
	r := newLastWorkerRig(t)
	key := indexer.Key{Model: "m", Tenant: indexer.DefaultTenant}
	p := r.follow("m", "default", 1, 0)
	r.storeBlocks(p, key, rk(1, 0), 1, 2)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Go(func() {
		for id := uint64(100); ; id += 4 {
			select {
			case <-stop:
				return
			default:
			}
			tokens := make([]uint32, 4*testBS)
			for i := range tokens {
				tokens[i] = uint32(id)*100 + uint32(i)
			}
			if _, err := p.Publish(engine.BlockStored{BlockHashes: []uint64{id, id + 1, id + 2, id + 3}, TokenIDs: tokens, BlockSize: testBS}); err != nil {
				t.Error(err)
				return
			}
		}
	})
	poll.Until(t, "the stream applies", func() bool { return r.blocks(key)[rk(1, 0)] > 2 })
	r.unregister(who("m", "default", 1))
	close(stop)
	wg.Wait()
	r.indexGone(t, key)
	if got := r.set.Keys(); len(got) != 0 {
		t.Fatalf("indexes left: %v", got)
	}
	r.register(rangeBody("m", "default", 2, 0, 1).with("block_size", 2*testBS))
	if ix := r.set.Lookup(key); ix == nil || ix.BlockSize() != 2*testBS || ix.Stats().Entries != 0 {
		t.Fatal("registering again made no new, empty index of the other block size")
	}
}
