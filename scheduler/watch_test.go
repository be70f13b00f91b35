package scheduler

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kvgate/kvgate/indexer"
)

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
// change, with the ranks each worker lost; a refused change tells nothing,
// and the loads following the catalog know exactly its ranks.
func TestWatch(t *testing.T) {
	r := newRig(t, rigOptions{})
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
