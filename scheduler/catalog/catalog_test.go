package catalog

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kvgate/kvgate/indexer"
)

// These tests drive the catalog's own logic over fake listeners: status
// aggregation and the changes its watchers are told of. internal/httpapi
// tests the catalog on real listeners, through its routes.

const testBS = 4 // tokens per block of the rig's indexes

var (
	active = StatusActive
	paused = StatusPaused
	failed = StatusFailed
	// pending is the initial state of a listener.
	pending = StatusPending
)

// fakeListeners are listeners that never connect: each is pending until
// paused. Endpoints need a transport, as the real ones' do.
type fakeListeners struct {
	mu  sync.Mutex
	gen uint64
	ls  map[listenerID]ListenerState
}

type listenerID struct {
	wk       WorkerKey
	rank     uint32
	endpoint string
}

func (f *fakeListeners) CheckEndpoint(ep string) error {
	if !strings.Contains(ep, "://") {
		return fmt.Errorf("endpoint %q is not transport://address", ep)
	}
	return nil
}

func (f *fakeListeners) Listen(l Listener) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	id := listenerID{l.WorkerKey, l.Rank, l.Endpoint}
	for other, s := range f.ls {
		if other.wk.ID == l.ID && other.rank == l.Rank && other.endpoint == l.Endpoint && other.wk.Key != l.Key {
			return fmt.Errorf("worker %d rank %d endpoint %s is registered for %s", l.ID, l.Rank, l.Endpoint, s.Key)
		}
	}
	f.ls[id] = ListenerState{Listener: l, Status: StatusPending}
	f.gen++
	return nil
}

// each calls fn on the listeners of wk (one rank when rank is not nil).
func (f *fakeListeners) each(wk WorkerKey, rank *uint32, fn func(listenerID)) int {
	n := 0
	for id := range f.ls {
		if id.wk == wk && (rank == nil || id.rank == *rank) {
			fn(id)
			n++
		}
	}
	f.gen++
	return n
}

func (f *fakeListeners) Stop(_ context.Context, wk WorkerKey, rank *uint32) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.each(wk, rank, func(id listenerID) { delete(f.ls, id) })
	return nil
}

func (f *fakeListeners) set(wk WorkerKey, rank *uint32, s Status) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.each(wk, rank, func(id listenerID) {
		l := f.ls[id]
		l.Status = s
		f.ls[id] = l
	})
}

func (f *fakeListeners) Pause(wk WorkerKey, rank *uint32) int  { return f.set(wk, rank, StatusPaused) }
func (f *fakeListeners) Resume(wk WorkerKey, rank *uint32) int { return f.set(wk, rank, StatusPending) }

func (f *fakeListeners) States() []ListenerState {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.SortedFunc(maps.Values(f.ls), func(a, b ListenerState) int {
		return cmp.Or(cmpWorkerKey(a.WorkerKey, b.WorkerKey), cmp.Compare(a.Rank, b.Rank), strings.Compare(a.Endpoint, b.Endpoint))
	})
}

func (f *fakeListeners) Generation() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.gen
}

// rig is a catalog on fake listeners.
type rig struct {
	set *indexer.Set
	ls  *fakeListeners
	cat *Catalog
}

func newRig(t *testing.T) *rig {
	r := &rig{set: indexer.NewSet(indexer.Options{}), ls: &fakeListeners{ls: map[listenerID]ListenerState{}}}
	t.Cleanup(r.set.Close)
	r.cat = New(r.set, r.ls, nil, Options{Logger: slog.New(slog.DiscardHandler)})
	return r
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func ptrTo[T any](v T) *T { return &v }

// deadEndpoint is an endpoint nothing listens on.
func deadEndpoint(name string) string { return "ipc:///nonexistent/kvgate-catalog-test/" + name }

func TestAggregate(t *testing.T) {
	// Every set of listener states; the highest of failed > pending >
	// active > paused wins, and a worker without listeners is active.
	for _, tc := range []struct {
		states []Status
		want   Status
	}{
		{nil, active},
		{[]Status{paused}, paused},
		{[]Status{active}, active},
		{[]Status{pending}, pending},
		{[]Status{failed}, failed},
		{[]Status{paused, active}, active},
		{[]Status{paused, pending}, pending},
		{[]Status{paused, failed}, failed},
		{[]Status{active, pending}, pending},
		{[]Status{active, failed}, failed},
		{[]Status{pending, failed}, failed},
		{[]Status{paused, active, pending}, pending},
		{[]Status{paused, active, failed}, failed},
		{[]Status{paused, pending, failed}, failed},
		{[]Status{active, pending, failed}, failed},
		{[]Status{paused, active, pending, failed}, failed},
		{[]Status{paused, paused, paused}, paused},
		{[]Status{active, active, paused, paused}, active},
	} {
		// The order of the listeners must not matter.
		for shift := range max(len(tc.states), 1) {
			ls := map[uint32]ListenerState{}
			for i, s := range tc.states {
				rank := uint32((i + shift) % len(tc.states))
				ls[rank] = ListenerState{Listener: Listener{Rank: rank}, Status: s}
			}
			if got := aggregate(ls); got != tc.want {
				t.Errorf("aggregate(%v by rank, shifted %d) = %s, want %s", tc.states, shift, got, tc.want)
			}
		}
	}
}

// changeLog records what a watcher of the catalog is told, one line per
// change.
type changeLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *changeLog) watch(ch Change) {
	kind := map[ChangeKind]string{Added: "added", Changed: "changed", Removed: "removed"}[ch.Kind]
	w := ch.Worker
	line := fmt.Sprintf("%s %s ranks %v events %d endpoint %q gone %v", kind, w.WorkerKey, w.Ranks, len(w.Events), w.Endpoint, ch.Gone)
	l.mu.Lock()
	l.lines = append(l.lines, line)
	l.mu.Unlock()
}

// take returns the lines recorded since the last call.
func (l *changeLog) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.lines
	l.lines = nil
	return out
}

// TestWatch: a watcher is told of the workers already there, then of every
// change, with the ranks each worker lost; a refused change tells nothing.
func TestWatch(t *testing.T) {
	r := newRig(t)
	key := indexer.Key{Model: "m", Tenant: indexer.DefaultTenant}
	wk := func(id uint64) WorkerKey { return WorkerKey{Key: key, ID: id} }
	must(t, r.cat.RegisterRange(RangeRegistration{WorkerKey: wk(1), BlockSize: testBS, DPSize: 2}))
	var log changeLog
	r.cat.Watch(log.watch)
	steps := []struct {
		name   string
		change func() error
		want   []string
	}{
		{"watching", func() error { return nil }, []string{`added worker 1 of m:default ranks [0 1] events 0 endpoint "" gone []`}},
		{"a rank with events", func() error {
			return r.cat.RegisterRank(RankRegistration{WorkerKey: wk(2), BlockSize: testBS, Publisher: Publisher{Endpoint: deadEndpoint("watch")}})
		}, []string{`added worker 2 of m:default ranks [0] events 1 endpoint "" gone []`}},
		{"a narrower range", func() error {
			return r.cat.RegisterRange(RangeRegistration{WorkerKey: wk(1), BlockSize: testBS, DPStart: 1, DPSize: 2})
		}, []string{`changed worker 1 of m:default ranks [1 2] events 0 endpoint "" gone [0]`}},
		{"refused: other block size", func() error {
			if err := r.cat.RegisterRange(RangeRegistration{WorkerKey: wk(1), BlockSize: 2 * testBS, DPSize: 1}); !errors.Is(err, ErrConflict) {
				return fmt.Errorf("got %v, want a conflict", err)
			}
			return nil
		}, nil},
		{"put", func() error {
			return r.cat.PutWorker(WorkerSpec{WorkerKey: wk(3), BlockSize: testBS, Endpoint: "10.0.0.3:8000", DPSize: 2})
		}, []string{`added worker 3 of m:default ranks [0 1] events 0 endpoint "10.0.0.3:8000" gone []`}},
		{"patch", func() error {
			return r.cat.PatchWorker(WorkerPatch{WorkerKey: wk(3), DPSize: ptrTo(uint32(1)), Endpoint: ptrTo("10.0.0.4:8000")})
		}, []string{`changed worker 3 of m:default ranks [0] events 0 endpoint "10.0.0.4:8000" gone [1]`}},
		{"one rank removed", func() error {
			_, err := r.cat.Unregister("m", nil, 1, ptrTo(uint32(1)))
			return err
		}, []string{`changed worker 1 of m:default ranks [2] events 0 endpoint "" gone [1]`}},
		{"the last rank removed", func() error {
			_, err := r.cat.Unregister("m", nil, 1, ptrTo(uint32(2)))
			return err
		}, []string{`removed worker 1 of m:default ranks [2] events 0 endpoint "" gone [2]`}},
		{"a worker removed", func() error {
			_, err := r.cat.Unregister("m", nil, 2, nil)
			return err
		}, []string{`removed worker 2 of m:default ranks [0] events 1 endpoint "" gone [0]`}},
	}
	for _, s := range steps {
		if err := s.change(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if got := log.take(); !slices.Equal(got, s.want) {
			t.Errorf("%s: told\n%s\nwant\n%s", s.name, strings.Join(got, "\n"), strings.Join(s.want, "\n"))
		}
	}
}

// The index of a (model, tenant) goes when its last worker does, however
// that worker leaves, and the key can then come back with another block
// size; other keys' indexes stay.
func TestLastWorkerRemovesIndex(t *testing.T) {
	key := indexer.Key{Model: "m", Tenant: indexer.DefaultTenant}
	other := indexer.Key{Model: "m", Tenant: "other"}
	tests := []struct {
		name  string
		leave func(c *Catalog, id uint64) error
	}{
		{"whole worker of the tenant", func(c *Catalog, id uint64) error {
			_, err := c.Unregister("m", ptrTo(indexer.DefaultTenant), id, nil)
			return err
		}},
		{"rank by rank", func(c *Catalog, id uint64) error {
			for _, rank := range []uint32{0, 1} {
				if _, err := c.Unregister("m", ptrTo(indexer.DefaultTenant), id, &rank); err != nil {
					return err
				}
			}
			return nil
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t)
			for _, id := range []uint64{1, 2} {
				must(t, r.cat.RegisterRange(RangeRegistration{WorkerKey: WorkerKey{Key: key, ID: id}, BlockSize: testBS, DPSize: 2}))
			}
			must(t, r.cat.PutWorker(WorkerSpec{WorkerKey: WorkerKey{Key: other, ID: 1}, BlockSize: testBS, Endpoint: "10.0.0.1:8000", DPSize: 2}))
			must(t, tt.leave(r.cat, 1))
			if r.set.Lookup(key) == nil {
				t.Fatal("index removed while a worker of it is left")
			}
			must(t, tt.leave(r.cat, 2))
			if r.set.Lookup(key) != nil {
				t.Fatal("index left after its last worker")
			}
			if got, want := r.set.Keys(), []indexer.Key{other}; !slices.Equal(got, want) {
				t.Fatalf("keys = %v, want %v", got, want)
			}
			must(t, r.cat.RegisterRange(RangeRegistration{WorkerKey: WorkerKey{Key: key, ID: 3}, BlockSize: 2 * testBS, DPSize: 1}))
			if ix := r.set.Lookup(key); ix == nil || ix.BlockSize() != 2*testBS {
				t.Fatal("registering again with another block size made no such index")
			}
		})
	}
}

// Many models registered then unregistered leave no index behind.
func TestChurnLeavesNoIndex(t *testing.T) {
	r := newRig(t)
	for i := range 3000 {
		key := indexer.Key{Model: fmt.Sprintf("m%d", i), Tenant: indexer.DefaultTenant}
		must(t, r.cat.RegisterRange(RangeRegistration{WorkerKey: WorkerKey{Key: key, ID: 1}, BlockSize: testBS, DPSize: 1}))
		if _, err := r.cat.Unregister(key.Model, nil, 1, nil); err != nil {
			t.Fatal(err)
		}
	}
	if keys := r.set.Keys(); len(keys) != 0 {
		t.Fatalf("%d indexes left, first %v", len(keys), keys[0])
	}
}

// TestIncompleteNeverATarget: a worker registered without an endpoint is
// incomplete, with the selection service's reason, and no target until a
// patch supplies the endpoint.
func TestIncompleteNeverATarget(t *testing.T) {
	r := newRig(t)
	key := indexer.Key{Model: "m", Tenant: indexer.DefaultTenant}
	wk := WorkerKey{Key: key, ID: 1}
	steps := []struct {
		name    string
		do      func() error
		reasons []string
		targets []Target
	}{
		{"put without endpoint", func() error {
			return r.cat.PutWorker(WorkerSpec{WorkerKey: wk, BlockSize: testBS, DPSize: 2})
		}, []string{"endpoint is required"}, nil},
		{"patch the range only", func() error {
			return r.cat.PatchWorker(WorkerPatch{WorkerKey: wk, DPSize: ptrTo(uint32(1))})
		}, []string{"endpoint is required"}, nil},
		{"patch the endpoint", func() error {
			return r.cat.PatchWorker(WorkerPatch{WorkerKey: wk, Endpoint: ptrTo("10.0.0.1:8000")})
		}, nil, []Target{{ID: 1, Endpoint: "10.0.0.1:8000", Ranks: 1}}},
		{"put again without endpoint", func() error {
			return r.cat.PutWorker(WorkerSpec{WorkerKey: wk, BlockSize: testBS, DPSize: 1})
		}, []string{"endpoint is required"}, nil},
	}
	for _, s := range steps {
		must(t, s.do())
		if got := r.cat.NotSchedulable(wk); !slices.Equal(got, s.reasons) {
			t.Errorf("%s: reasons %q, want %q", s.name, got, s.reasons)
		}
		if got := r.cat.Targets(key); !reflect.DeepEqual(got, s.targets) {
			t.Errorf("%s: targets %+v, want %+v", s.name, got, s.targets)
		}
		ws := r.cat.Workers("m", "")
		if want := len(s.reasons) > 0; len(ws) != 1 || (ws[0].Status == StatusIncomplete) != want || r.cat.View().Schedulable(key)[1] == want {
			t.Errorf("%s: workers %+v, schedulable %v", s.name, ws, r.cat.View().Schedulable(key))
		}
	}
}
