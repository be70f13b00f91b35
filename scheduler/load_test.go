package scheduler

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/indexer"
	"github.com/kvgate/kvgate/internal/stacktest"
)

// These tests drive Loads directly (docs/scheduling.md, "Active load
// per (worker, dp_rank)"; seed 002, the slot tracker). Every expected load
// is worked out by hand in the case that states it.

// loadKey is the (model, tenant) of the load tests.
var loadKey = indexer.Key{Model: "m", Tenant: indexer.DefaultTenant}

func rk(worker uint64, rank uint32) indexer.WorkerRank {
	return indexer.WorkerRank{Worker: worker, Rank: rank}
}

// fakeClock is a clock the tests move by hand.
type fakeClock = stacktest.Clock

func newFakeClock() *fakeClock { return stacktest.NewClock() }

// recorder collects what a Loads observer is told.
type recorder struct {
	mu  sync.Mutex
	evs []Lifecycle
}

func observe(l *Loads) *recorder {
	rec := &recorder{}
	l.Observe(func(ev Lifecycle) {
		rec.mu.Lock()
		rec.evs = append(rec.evs, ev)
		rec.mu.Unlock()
	})
	return rec
}

// take returns the events seen since the last take.
func (r *recorder) take() []Lifecycle {
	r.mu.Lock()
	defer r.mu.Unlock()
	evs := r.evs
	r.evs = nil
	return evs
}

// load is the expected load of one rank.
type load struct {
	prefill int64
	decode  float64
	reqs    int
}

// loadsOf returns the loads of key by rank.
func loadsOf(l *Loads, key indexer.Key) map[indexer.WorkerRank]load {
	out := map[indexer.WorkerRank]load{}
	for _, x := range l.Snapshot(key.Model, key.Tenant) {
		if x.Key == key {
			out[x.Worker] = load{x.PrefillTokens, x.DecodeBlocks, x.Requests}
		}
	}
	return out
}

// checkIdle fails unless every rank of l is known to have exactly no load.
func checkIdle(t testing.TB, l *Loads) {
	t.Helper()
	for _, x := range l.Snapshot("", "") {
		if x.PrefillTokens != 0 || x.DecodeBlocks != 0 || x.Requests != 0 {
			t.Errorf("%s %s: load %d prefill tokens, %v decode blocks, %d requests after everything was freed",
				x.Key, x.Worker, x.PrefillTokens, x.DecodeBlocks, x.Requests)
		}
	}
}

// loadOp is one call on Loads.
type loadOp struct {
	do      string // add, prefill, output, free, remove, apply-add, apply-prefill, apply-free
	id      string
	rank    indexer.WorkerRank // add; remove (with all: every rank of the worker)
	all     bool
	hashes  []uint64
	prefill int64
	decay   float64
	key     indexer.Key // default loadKey
	err     error       // errors.Is target; nil for success
	freed   bool        // free's answer
	// notify is the observed event the call must cause (0: none);
	// anyNotify accepts one or none.
	notify    LifecycleKind
	anyNotify bool
	want      map[indexer.WorkerRank]load // non-zero loads after the call
}

func (op loadOp) run(l *Loads) error {
	key := op.key
	if key == (indexer.Key{}) {
		key = loadKey
	}
	b := Booking{ID: op.id, Worker: op.rank, Hashes: op.hashes, PrefillTokens: op.prefill}
	switch op.do {
	case "add":
		return l.Add(key, b)
	case "prefill":
		return l.PrefillComplete(key, op.id)
	case "output":
		return l.OutputBlock(key, op.id, op.decay)
	case "free":
		freed, err := l.Free(key, op.id)
		if freed != op.freed {
			return fmt.Errorf("free reported freed %v, want %v (err %v)", freed, op.freed, err)
		}
		return err
	case "remove":
		var rank *uint32
		if !op.all {
			rank = &op.rank.Rank
		}
		l.removeRanks(key, op.rank.Worker, rank)
		return nil
	case "apply-add":
		_, err := l.Apply(Lifecycle{Kind: LifecycleAdd, Key: key, Booking: b})
		return err
	case "apply-prefill":
		_, err := l.Apply(Lifecycle{Kind: LifecyclePrefillComplete, Key: key, Booking: b})
		return err
	case "apply-free":
		_, err := l.Apply(Lifecycle{Kind: LifecycleFree, Key: key, Booking: b})
		return err
	}
	panic("unknown op " + op.do)
}

func TestLoadsLifecycle(t *testing.T) {
	a, b, c := rk(1, 0), rk(1, 1), rk(2, 0)
	other := indexer.Key{Model: "other", Tenant: indexer.DefaultTenant}
	tests := []struct {
		name string
		ops  []loadOp
	}{
		{"prefill tokens: add, prefill complete, free", []loadOp{
			{do: "add", id: "r1", rank: a, hashes: []uint64{1, 2, 3}, prefill: 48, notify: LifecycleAdd, want: map[indexer.WorkerRank]load{a: {48, 3, 1}}},
			{do: "add", id: "r2", rank: a, hashes: []uint64{7}, prefill: 5, notify: LifecycleAdd, want: map[indexer.WorkerRank]load{a: {53, 4, 2}}},
			{do: "prefill", id: "r1", notify: LifecyclePrefillComplete, want: map[indexer.WorkerRank]load{a: {5, 4, 2}}},
			// Repeating it is a no-op (seed 002). Whether it is observed
			// again is left open: see the report on Observe.
			{do: "prefill", id: "r1", anyNotify: true, want: map[indexer.WorkerRank]load{a: {5, 4, 2}}},
			{do: "free", id: "r1", freed: true, notify: LifecycleFree, want: map[indexer.WorkerRank]load{a: {5, 1, 1}}},
			// Free releases the prefill still pending.
			{do: "free", id: "r2", freed: true, notify: LifecycleFree},
		}},
		{"shared prompt blocks are counted once per rank", []loadOp{
			{do: "add", id: "r1", rank: a, hashes: []uint64{1, 2, 3}, prefill: 12, notify: LifecycleAdd, want: map[indexer.WorkerRank]load{a: {12, 3, 1}}},
			{do: "add", id: "r2", rank: a, hashes: []uint64{1, 2, 4, 5}, prefill: 8, notify: LifecycleAdd, want: map[indexer.WorkerRank]load{a: {20, 5, 2}}},
			// Another rank counts its own copy.
			{do: "add", id: "r3", rank: b, hashes: []uint64{1, 2}, prefill: 4, notify: LifecycleAdd, want: map[indexer.WorkerRank]load{a: {20, 5, 2}, b: {4, 2, 1}}},
			// Blocks 1 and 2 stay: r2 still holds them.
			{do: "free", id: "r1", freed: true, notify: LifecycleFree, want: map[indexer.WorkerRank]load{a: {8, 4, 1}, b: {4, 2, 1}}},
			{do: "add", id: "r4", rank: a, hashes: []uint64{1, 2, 3}, notify: LifecycleAdd, want: map[indexer.WorkerRank]load{a: {8, 5, 2}, b: {4, 2, 1}}},
			{do: "free", id: "r2", freed: true, notify: LifecycleFree, want: map[indexer.WorkerRank]load{a: {0, 3, 1}, b: {4, 2, 1}}},
			{do: "free", id: "r4", freed: true, notify: LifecycleFree, want: map[indexer.WorkerRank]load{b: {4, 2, 1}}},
			{do: "free", id: "r3", freed: true, notify: LifecycleFree},
		}},
		{"a hash listed twice in one prompt", []loadOp{
			{do: "add", id: "r1", rank: a, hashes: []uint64{9, 9, 8}, notify: LifecycleAdd, want: map[indexer.WorkerRank]load{a: {0, 2, 1}}},
			{do: "add", id: "r2", rank: a, hashes: []uint64{9}, notify: LifecycleAdd, want: map[indexer.WorkerRank]load{a: {0, 2, 2}}},
			{do: "free", id: "r1", freed: true, notify: LifecycleFree, want: map[indexer.WorkerRank]load{a: {0, 1, 1}}},
			{do: "free", id: "r2", freed: true, notify: LifecycleFree},
		}},
		{"output blocks weigh 1 - decay", []loadOp{
			{do: "add", id: "r1", rank: a, hashes: []uint64{1}, notify: LifecycleAdd, want: map[indexer.WorkerRank]load{a: {0, 1, 1}}},
			{do: "output", id: "r1", decay: 0, want: map[indexer.WorkerRank]load{a: {0, 2, 1}}},
			{do: "output", id: "r1", decay: 0.25, want: map[indexer.WorkerRank]load{a: {0, 2.75, 1}}},
			{do: "output", id: "r1", decay: 1, want: map[indexer.WorkerRank]load{a: {0, 2.75, 1}}},
			{do: "add", id: "r2", rank: a, hashes: []uint64{1, 2}, notify: LifecycleAdd, want: map[indexer.WorkerRank]load{a: {0, 3.75, 2}}},
			{do: "output", id: "r2", decay: 0.5, want: map[indexer.WorkerRank]load{a: {0, 4.25, 2}}},
			{do: "output", id: "r2", decay: -0.1, err: ErrInvalid, want: map[indexer.WorkerRank]load{a: {0, 4.25, 2}}},
			{do: "output", id: "r2", decay: 1.5, err: ErrInvalid, want: map[indexer.WorkerRank]load{a: {0, 4.25, 2}}},
			{do: "output", id: "r2", decay: math.NaN(), err: ErrInvalid, want: map[indexer.WorkerRank]load{a: {0, 4.25, 2}}},
			{do: "output", id: "nope", err: ErrNotFound, want: map[indexer.WorkerRank]load{a: {0, 4.25, 2}}},
			{do: "output", id: "r2", key: other, err: ErrNotFound, want: map[indexer.WorkerRank]load{a: {0, 4.25, 2}}},
			// r1's own output goes with it; block 1 stays for r2.
			{do: "free", id: "r1", freed: true, notify: LifecycleFree, want: map[indexer.WorkerRank]load{a: {0, 2.5, 1}}},
			{do: "free", id: "r2", freed: true, notify: LifecycleFree},
		}},
		{"refused calls change nothing", []loadOp{
			{do: "add", id: "r1", rank: a, hashes: []uint64{1, 2}, prefill: 8, notify: LifecycleAdd, want: map[indexer.WorkerRank]load{a: {8, 2, 1}}},
			{do: "add", id: "r1", rank: c, hashes: []uint64{3}, prefill: 4, err: ErrConflict, want: map[indexer.WorkerRank]load{a: {8, 2, 1}}},
			{do: "add", id: "r1", rank: a, hashes: []uint64{1, 2}, prefill: 8, err: ErrConflict, want: map[indexer.WorkerRank]load{a: {8, 2, 1}}},
			{do: "add", id: "r2", rank: rk(9, 0), hashes: []uint64{3}, err: ErrNotFound, want: map[indexer.WorkerRank]load{a: {8, 2, 1}}},
			{do: "add", id: "r2", rank: rk(1, 7), hashes: []uint64{3}, err: ErrNotFound, want: map[indexer.WorkerRank]load{a: {8, 2, 1}}},
			{do: "add", id: "r2", rank: a, key: other, err: ErrNotFound, want: map[indexer.WorkerRank]load{a: {8, 2, 1}}},
			{do: "add", id: "", rank: a, err: ErrInvalid, want: map[indexer.WorkerRank]load{a: {8, 2, 1}}},
			{do: "add", id: "r2", rank: a, prefill: -1, err: ErrInvalid, want: map[indexer.WorkerRank]load{a: {8, 2, 1}}},
			{do: "prefill", id: "nope", err: ErrNotFound, want: map[indexer.WorkerRank]load{a: {8, 2, 1}}},
			{do: "prefill", id: "r1", key: other, err: ErrNotFound, want: map[indexer.WorkerRank]load{a: {8, 2, 1}}},
			{do: "free", id: "r1", key: other, err: ErrNotFound, want: map[indexer.WorkerRank]load{a: {8, 2, 1}}},
			// Free is idempotent.
			{do: "free", id: "nope", want: map[indexer.WorkerRank]load{a: {8, 2, 1}}},
			{do: "free", id: "r1", freed: true, notify: LifecycleFree},
			{do: "free", id: "r1"},
			{do: "prefill", id: "r1", err: ErrNotFound},
			// A freed id may be booked again.
			{do: "add", id: "r1", rank: c, hashes: []uint64{3}, prefill: 4, notify: LifecycleAdd, want: map[indexer.WorkerRank]load{c: {4, 1, 1}}},
			{do: "free", id: "r1", freed: true, notify: LifecycleFree},
		}},
		{"removeRanks drops the rank's requests and load", []loadOp{
			{do: "add", id: "ra", rank: a, hashes: []uint64{1, 2}, prefill: 8, notify: LifecycleAdd, want: map[indexer.WorkerRank]load{a: {8, 2, 1}}},
			{do: "add", id: "rb", rank: b, hashes: []uint64{1, 2}, prefill: 4, notify: LifecycleAdd, want: map[indexer.WorkerRank]load{a: {8, 2, 1}, b: {4, 2, 1}}},
			{do: "add", id: "rc", rank: c, hashes: []uint64{1}, prefill: 2, notify: LifecycleAdd, want: map[indexer.WorkerRank]load{a: {8, 2, 1}, b: {4, 2, 1}, c: {2, 1, 1}}},
			{do: "remove", rank: b, want: map[indexer.WorkerRank]load{a: {8, 2, 1}, c: {2, 1, 1}}},
			{do: "free", id: "rb", want: map[indexer.WorkerRank]load{a: {8, 2, 1}, c: {2, 1, 1}}},
			{do: "prefill", id: "rb", err: ErrNotFound, want: map[indexer.WorkerRank]load{a: {8, 2, 1}, c: {2, 1, 1}}},
			{do: "add", id: "rb", rank: b, err: ErrNotFound, want: map[indexer.WorkerRank]load{a: {8, 2, 1}, c: {2, 1, 1}}},
			{do: "remove", rank: rk(1, 0), all: true, want: map[indexer.WorkerRank]load{c: {2, 1, 1}}},
			{do: "add", id: "ra", rank: a, err: ErrNotFound, want: map[indexer.WorkerRank]load{c: {2, 1, 1}}},
			{do: "remove", rank: rk(5, 0), all: true, want: map[indexer.WorkerRank]load{c: {2, 1, 1}}},
			{do: "remove", rank: c, key: other, want: map[indexer.WorkerRank]load{c: {2, 1, 1}}},
			{do: "free", id: "rc", freed: true, notify: LifecycleFree},
		}},
		{"Apply changes loads without observing", []loadOp{
			{do: "apply-add", id: "p1", rank: a, hashes: []uint64{1, 2}, prefill: 8, want: map[indexer.WorkerRank]load{a: {8, 2, 1}}},
			{do: "apply-add", id: "p1", rank: c, err: ErrConflict, want: map[indexer.WorkerRank]load{a: {8, 2, 1}}},
			{do: "apply-add", id: "p2", rank: rk(9, 0), err: ErrNotFound, want: map[indexer.WorkerRank]load{a: {8, 2, 1}}},
			{do: "add", id: "l1", rank: a, hashes: []uint64{2, 3}, prefill: 4, notify: LifecycleAdd, want: map[indexer.WorkerRank]load{a: {12, 3, 2}}},
			{do: "apply-prefill", id: "p1", want: map[indexer.WorkerRank]load{a: {4, 3, 2}}},
			{do: "apply-prefill", id: "nope", err: ErrNotFound, want: map[indexer.WorkerRank]load{a: {4, 3, 2}}},
			{do: "apply-free", id: "p1", want: map[indexer.WorkerRank]load{a: {4, 2, 1}}},
			{do: "apply-free", id: "p1", want: map[indexer.WorkerRank]load{a: {4, 2, 1}}},
			{do: "apply-free", id: "l1", key: other, err: ErrNotFound, want: map[indexer.WorkerRank]load{a: {4, 2, 1}}},
			{do: "free", id: "l1", freed: true, notify: LifecycleFree},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := NewLoads(LoadOptions{})
			l.addRanks(loadKey, 16, a, c)
			l.addRanks(loadKey, 16, b, a) // a again keeps its (empty) load
			l.addRanks(indexer.Key{Model: "m", Tenant: "t"}, 16, a)
			rec := observe(l)
			ranks := []indexer.WorkerRank{a, b, c}
			for i, op := range tt.ops {
				what := fmt.Sprintf("op %d (%s %q)", i, op.do, op.id)
				err := op.run(l)
				if op.err == nil && err != nil || op.err != nil && !errors.Is(err, op.err) {
					t.Fatalf("%s: error %v, want %v", what, err, op.err)
				}
				if op.do == "remove" && op.key == (indexer.Key{}) {
					ranks = slices.DeleteFunc(ranks, func(x indexer.WorkerRank) bool {
						return x.Worker == op.rank.Worker && (op.all || x.Rank == op.rank.Rank)
					})
				}
				checkLoads(t, what, l, ranks, op.want)
				checkNotified(t, what, rec.take(), op)
			}
			checkIdle(t, l)
			if got := l.Snapshot("m", "t"); len(got) != 1 || got[0].Worker != a {
				t.Errorf("tenant t: %+v, want rank %s alone, untouched", got, a)
			}
		})
	}
}

// checkLoads compares the loads of loadKey with want over the known ranks
// (those not in want must be idle).
func checkLoads(t *testing.T, what string, l *Loads, ranks []indexer.WorkerRank, want map[indexer.WorkerRank]load) {
	t.Helper()
	got := loadsOf(l, loadKey)
	if len(got) != len(ranks) {
		t.Errorf("%s: loads of ranks %v, want ranks %v", what, got, ranks)
	}
	for _, r := range ranks {
		if g, ok := got[r]; !ok || g != want[r] {
			t.Errorf("%s: %s load %+v (known %v), want %+v", what, r, g, ok, want[r])
		}
	}
	for r := range want {
		if !slices.Contains(ranks, r) {
			t.Fatalf("%s: test expects a load on unknown rank %s", what, r)
		}
	}
}

func checkNotified(t *testing.T, what string, evs []Lifecycle, op loadOp) {
	t.Helper()
	if op.anyNotify && len(evs) == 0 {
		return
	}
	if op.notify == 0 && !op.anyNotify {
		if len(evs) != 0 {
			t.Errorf("%s: observed %+v, want nothing", what, evs)
		}
		return
	}
	want := Lifecycle{Kind: op.notify, Key: loadKey, Booking: Booking{ID: op.id}}
	if op.anyNotify {
		want.Kind = LifecyclePrefillComplete
	}
	if want.Kind == LifecycleAdd {
		want.Booking = Booking{ID: op.id, Worker: op.rank, Hashes: op.hashes, PrefillTokens: op.prefill}
	}
	if len(evs) != 1 || evs[0].Kind != want.Kind || evs[0].Key != want.Key || evs[0].Booking.ID != want.Booking.ID ||
		evs[0].Booking.Worker != want.Booking.Worker || evs[0].Booking.PrefillTokens != want.Booking.PrefillTokens ||
		!slices.Equal(evs[0].Booking.Hashes, want.Booking.Hashes) {
		t.Errorf("%s: observed %+v, want exactly %+v", what, evs, want)
	}
}

func TestLoadsAddCopiesHashes(t *testing.T) {
	l := NewLoads(LoadOptions{})
	l.addRanks(loadKey, 16, rk(1, 0))
	hashes := []uint64{1, 2, 3}
	if err := l.Add(loadKey, Booking{ID: "r", Worker: rk(1, 0), Hashes: hashes}); err != nil {
		t.Fatal(err)
	}
	hashes[0], hashes[1], hashes[2] = 7, 8, 9 // the caller reuses its buffer
	if _, err := l.Free(loadKey, "r"); err != nil {
		t.Fatal(err)
	}
	checkIdle(t, l)
	p, err := l.potentials(loadKey, []uint64{1, 2, 3}, 0)
	if err != nil || len(p) != 1 || p[0].DecodeBlocks != 3 {
		t.Errorf("potentials after free: %+v, %v; want 3 decode blocks (nothing held)", p, err)
	}
}

func TestPotentials(t *testing.T) {
	// Seed 002's /potential_loads example: worker 7 (dp 0..1) runs req-123
	// with sequence hashes [101, -22, 303] and 48 new tokens, so rank 0 has
	// 48 prefill tokens and 3 decode blocks. A request of [101, -22, 303,
	// 404] with 48 new tokens projects rank 0 to 48+48 = 96 tokens and 3+1
	// = 4 blocks (only 404 is new there); rank 1, idle, to 48 and 4.
	neg22 := uint64(1<<64 - 22) // -22 reinterpreted bit for bit
	l := NewLoads(LoadOptions{})
	l.addRanks(loadKey, 16, rk(7, 0), rk(7, 1), rk(8, 0))
	must(t, l.Add(loadKey, Booking{ID: "req-123", Worker: rk(7, 0), Hashes: []uint64{101, neg22, 303}, PrefillTokens: 48}))
	// Rank 8/0 runs a request holding 303 (not a prefix: any held block
	// counts) and 500, with an output block at decay 0.75: 2 + 0.25 blocks.
	must(t, l.Add(loadKey, Booking{ID: "x", Worker: rk(8, 0), Hashes: []uint64{303, 500}, PrefillTokens: 10}))
	must(t, l.OutputBlock(loadKey, "x", 0.75))
	must(t, l.PrefillComplete(loadKey, "x"))

	got, err := l.potentials(loadKey, []uint64{101, neg22, 303, 404}, 48)
	if err != nil {
		t.Fatal(err)
	}
	want := []Potential{
		{Worker: rk(7, 0), PrefillTokens: 96, DecodeBlocks: 4},
		{Worker: rk(7, 1), PrefillTokens: 48, DecodeBlocks: 4},
		{Worker: rk(8, 0), PrefillTokens: 48, DecodeBlocks: 2.25 + 3},
	}
	slices.SortFunc(got, func(a, b Potential) int { return cmpRank(a.Worker, b.Worker) })
	if !slices.Equal(got, want) {
		t.Errorf("potentials\n got %+v\nwant %+v", got, want)
	}
	if got, err := l.potentials(loadKey, nil, 0); err != nil || len(got) != 3 || got[0].DecodeBlocks+got[1].DecodeBlocks+got[2].DecodeBlocks != 3+0+2.25 {
		t.Errorf("empty request: %+v, %v; want the current loads", got, err)
	}
	if _, err := l.potentials(indexer.Key{Model: "nope", Tenant: "default"}, nil, 0); !errors.Is(err, ErrNotFound) {
		t.Errorf("unknown model: %v, want ErrNotFound", err)
	}
	if before := loadsOf(l, loadKey); before[rk(7, 0)] != (load{48, 3, 1}) || before[rk(7, 1)] != (load{}) {
		t.Errorf("Potentials changed the loads: %+v", before)
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestSnapshotSortedAndFiltered(t *testing.T) {
	l := NewLoads(LoadOptions{})
	mb := indexer.Key{Model: "b", Tenant: "default"}
	ma := indexer.Key{Model: "a", Tenant: "z"}
	mat := indexer.Key{Model: "a", Tenant: "default"}
	l.addRanks(mb, 16, rk(2, 1), rk(10, 0), rk(2, 0))
	l.addRanks(ma, 16, rk(3, 0))
	l.addRanks(mat, 16, rk(9, 3), rk(1, 2))
	must(t, l.Add(mb, Booking{ID: "x", Worker: rk(2, 1), Hashes: []uint64{1}, PrefillTokens: 3}))
	type row struct {
		key indexer.Key
		wr  indexer.WorkerRank
	}
	rows := func(ls []Load) []row {
		var out []row
		for _, x := range ls {
			out = append(out, row{x.Key, x.Worker})
		}
		return out
	}
	all := []row{{mat, rk(1, 2)}, {mat, rk(9, 3)}, {ma, rk(3, 0)}, {mb, rk(2, 0)}, {mb, rk(2, 1)}, {mb, rk(10, 0)}}
	for _, tt := range []struct {
		model, tenant string
		want          []row
	}{
		{"", "", all},
		{"a", "", all[:3]},
		{"", "default", []row{all[0], all[1], all[3], all[4], all[5]}},
		{"a", "z", all[2:3]},
		{"b", "z", nil},
		{"nope", "", nil},
	} {
		if got := rows(l.Snapshot(tt.model, tt.tenant)); !slices.Equal(got, tt.want) {
			t.Errorf("Snapshot(%q, %q) = %v, want %v", tt.model, tt.tenant, got, tt.want)
		}
	}
	if got := l.Snapshot("b", ""); got[1].PrefillTokens != 3 || got[1].DecodeBlocks != 1 || got[1].Requests != 1 {
		t.Errorf("load of b worker 2 rank 1: %+v", got[1])
	}
}

func TestExpiry(t *testing.T) {
	clk := newFakeClock()
	l := NewLoads(LoadOptions{Now: clk.Now}) // the default TTL, 300 s
	other := indexer.Key{Model: "other", Tenant: indexer.DefaultTenant}
	l.addRanks(loadKey, 16, rk(1, 0))
	l.addRanks(other, 16, rk(1, 0))
	add := func(key indexer.Key, id string) {
		t.Helper()
		must(t, l.Add(key, Booking{ID: id, Worker: rk(1, 0), Hashes: []uint64{uint64(len(id))}, PrefillTokens: 10}))
	}
	active := func(key indexer.Key) int { return loadsOf(l, key)[rk(1, 0)].reqs }

	add(loadKey, "old")     // t = 0
	add(other, "other-old") // t = 0
	clk.Advance(200 * time.Second)
	add(loadKey, "young") // t = 200
	clk.Advance(100 * time.Second)
	// t = 300: "old" is 300 s old, not older than the TTL.
	if n := l.Expire(); n != 0 || active(loadKey) != 2 {
		t.Fatalf("at the TTL: expired %d, %d active; want 0 and 2", n, active(loadKey))
	}
	clk.Advance(time.Second)
	if n := l.Expire(); n != 2 || l.expiredTotal() != 2 {
		t.Fatalf("at 301 s: expired %d (counted %d), want 2 (old, other-old)", n, l.expiredTotal())
	}
	if got := loadsOf(l, loadKey)[rk(1, 0)]; got != (load{10, 1, 1}) {
		t.Errorf("after expiry: %+v, want young alone", got)
	}
	if freed, err := l.Free(loadKey, "old"); freed || err != nil {
		t.Errorf("free of an expired request: %v, %v; want not active", freed, err)
	}
	if err := l.PrefillComplete(loadKey, "old"); !errors.Is(err, ErrNotFound) {
		t.Errorf("prefill complete of an expired request: %v, want ErrNotFound", err)
	}

	// Add sweeps its own (model, tenant) only.
	add(other, "other-young") // t = 301
	clk.Advance(200 * time.Second)
	add(loadKey, "late") // t = 501: young (added at 200) is 301 s old
	if got := loadsOf(l, loadKey)[rk(1, 0)]; got != (load{10, 1, 1}) {
		t.Errorf("after an add at 501 s: %+v, want late alone", got)
	}
	if freed, _ := l.Free(loadKey, "young"); freed || l.expiredTotal() != 3 {
		t.Errorf("young was not expired by the add, or not counted (%d expired, want 3)", l.expiredTotal())
	}
	clk.Advance(101 * time.Second) // other-young is 301 s old
	if active(other) != 1 {
		t.Errorf("other: %d active, want other-young until swept", active(other))
	}
	if n := l.Expire(); n != 1 || active(other) != 0 || l.expiredTotal() != 4 {
		t.Errorf("Expire: %d expired (%d counted in all), %d left in other; want 1 (4) and 0", n, l.expiredTotal(), active(other))
	}
	must(t, l.PrefillComplete(loadKey, "late"))
	if freed, err := l.Free(loadKey, "late"); !freed || err != nil {
		t.Errorf("free late: %v %v", freed, err)
	}
	checkIdle(t, l)
}

func TestExpiryCustomTTL(t *testing.T) {
	clk := newFakeClock()
	l := NewLoads(LoadOptions{Now: clk.Now, TTL: 10 * time.Second})
	l.addRanks(loadKey, 16, rk(1, 0))
	must(t, l.Add(loadKey, Booking{ID: "a", Worker: rk(1, 0), Hashes: []uint64{1, 2}, PrefillTokens: 7}))
	must(t, l.OutputBlock(loadKey, "a", 0.5))
	clk.Advance(10 * time.Second)
	must(t, l.Add(loadKey, Booking{ID: "b", Worker: rk(1, 0), Hashes: []uint64{2}}))
	if got := loadsOf(l, loadKey)[rk(1, 0)]; got != (load{7, 2.5, 2}) {
		t.Errorf("at 10 s: %+v, want both requests", got)
	}
	clk.Advance(time.Nanosecond)
	if n := l.Expire(); n != 1 {
		t.Errorf("expired %d, want a", n)
	}
	if got := loadsOf(l, loadKey)[rk(1, 0)]; got != (load{0, 1, 1}) {
		t.Errorf("after expiring a: %+v, want b's block alone", got)
	}
	clk.Advance(11 * time.Second)
	if n := l.Expire(); n != 1 {
		t.Errorf("expired %d, want b", n)
	}
	checkIdle(t, l)
}

func TestApplyUnknownKind(t *testing.T) {
	l := NewLoads(LoadOptions{})
	l.addRanks(loadKey, 16, rk(1, 0))
	if _, err := l.Apply(Lifecycle{Kind: 0, Key: loadKey, Booking: Booking{ID: "x", Worker: rk(1, 0)}}); !errors.Is(err, ErrInvalid) {
		t.Errorf("kind 0: %v, want ErrInvalid", err)
	}
	if _, err := l.Apply(Lifecycle{Kind: 99, Key: loadKey}); !errors.Is(err, ErrInvalid) {
		t.Errorf("kind 99: %v, want ErrInvalid", err)
	}
	checkIdle(t, l)
}

// checkHashRefs compares s with want (hash -> references) and checks its
// layout: at most half full, every entry reachable from its home slot
// without crossing a free one.
func checkHashRefs(t *testing.T, what string, s *hashRefs, want map[uint64]int32) {
	t.Helper()
	if s.len() != len(want) {
		t.Fatalf("%s: %d hashes, want %d", what, s.len(), len(want))
	}
	for h, refs := range want {
		if e := s.get(h); e == nil || e.refs != refs || !s.has(h) {
			t.Fatalf("%s: hash %#x: entry %+v, want %d references", what, h, e, refs)
		}
	}
	n := 0
	for i, e := range s.slots {
		if e.refs == 0 {
			continue
		}
		n++
		for j := s.home(e.hash); j != i; j = (j + 1) & (len(s.slots) - 1) {
			if s.slots[j].refs == 0 {
				t.Fatalf("%s: hash %#x in slot %d, a free slot %d lies on its probe sequence", what, e.hash, i, j)
			}
		}
	}
	if n != len(want) || 2*n > len(s.slots) {
		t.Fatalf("%s: %d entries in %d slots, want %d, at most half full", what, n, len(s.slots), len(want))
	}
}

// multInverse is the inverse of hashRefs' multiplier modulo 2^64.
const multInverse = 0xf1de83e19937733d

func TestHashRefs(t *testing.T) {
	if inv := uint64(multInverse); inv*0x9e3779b97f4a7c15 != 1 {
		t.Fatal("multInverse is not the multiplier's inverse")
	}
	rnd := rand.New(rand.NewPCG(1, 2))
	randomKeys := make([]uint64, 300)
	for i := range randomKeys {
		randomKeys[i] = rnd.Uint64()
	}
	seqKeys := make([]uint64, 300)
	for i := range seqKeys {
		seqKeys[i] = uint64(i) // small consecutive ids, as clients send
	}
	// Keys whose hashes (times the multiplier) are 0, 1, 2, ...: they all
	// share home slot 0 in tables of up to 2^40 slots, so they probe past
	// each other and deletions must shift entries back.
	colliding := make([]uint64, 40)
	for i := range colliding {
		colliding[i] = uint64(i) * multInverse
	}
	tests := []struct {
		name string
		keys []uint64
		// ops: positive i: inc keys[i-1]; negative: dec keys[-i-1].
		ops func(n int) []int
	}{
		{"add all, remove all in order", randomKeys, func(n int) []int {
			var ops []int
			for i := range n {
				ops = append(ops, i+1)
			}
			for i := range n {
				ops = append(ops, -(i + 1))
			}
			return ops
		}},
		{"add all twice, remove in reverse", seqKeys, func(n int) []int {
			var ops []int
			for i := range n {
				ops = append(ops, i+1, i+1)
			}
			for i := n - 1; i >= 0; i-- {
				ops = append(ops, -(i + 1), -(i + 1))
			}
			return ops
		}},
		{"colliding keys, removed from the middle", colliding, func(n int) []int {
			var ops []int
			for i := range n {
				ops = append(ops, i+1)
			}
			for i := n / 2; i < n; i++ {
				ops = append(ops, -(i + 1))
			}
			for i := range n / 2 {
				ops = append(ops, -(i + 1))
			}
			return ops
		}},
		{"random mix", randomKeys[:60], func(n int) []int {
			var ops []int
			refs := make([]int, n)
			for range 3000 {
				i := rnd.IntN(n)
				if refs[i] > 0 && rnd.IntN(2) == 0 {
					refs[i]--
					ops = append(ops, -(i + 1))
				} else {
					refs[i]++
					ops = append(ops, i+1)
				}
			}
			for i, r := range refs {
				for range r {
					ops = append(ops, -(i + 1))
				}
			}
			return ops
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s hashRefs
			want := map[uint64]int32{}
			for k, op := range tt.ops(len(tt.keys)) {
				what := fmt.Sprintf("op %d (%d)", k, op)
				if op > 0 {
					h := tt.keys[op-1]
					e, first := s.inc(h)
					if first != (want[h] == 0) || e.hash != h {
						t.Fatalf("%s: inc %#x: entry %+v, first %v; want first %v", what, h, e, first, want[h] == 0)
					}
					e.pos = int32(op) // kept through moves
					want[h]++
				} else {
					h := tt.keys[-op-1]
					pos, last := s.dec(h)
					if want[h]--; last != (want[h] == 0) || last && pos != int32(-op) {
						t.Fatalf("%s: dec %#x: last %v pos %d; want last %v pos %d", what, h, last, pos, want[h] == 0, -op)
					}
					if want[h] == 0 {
						delete(want, h)
					}
				}
				if k%17 == 0 || len(want) < 3 {
					checkHashRefs(t, what, &s, want)
				}
				if k%50 == 49 { // fit shrinks a sparse set, and keeps it right
					s.fit()
					if len(s.slots) > max(minHashRefs, 8*len(want)) || len(want) == 0 && s.slots != nil {
						t.Fatalf("%s: fit leaves %d slots for %d hashes", what, len(s.slots), len(want))
					}
					checkHashRefs(t, what+", fitted", &s, want)
				}
			}
			checkHashRefs(t, "at the end", &s, want)
			s.fit()
			if s.slots != nil {
				t.Errorf("an empty set keeps %d slots after fit", len(s.slots))
			}
			if s.has(tt.keys[0]) || s.get(tt.keys[0]) != nil {
				t.Error("the empty set has a key")
			}
		})
	}
}

func TestHashRefsReserve(t *testing.T) {
	for _, tt := range []struct{ have, more int }{{0, 1}, {0, 4}, {0, 5}, {0, 500}, {3, 1}, {100, 29}, {100, 28}, {100, 300}} {
		var s hashRefs
		want := map[uint64]int32{}
		for i := range uint64(tt.have) {
			s.inc(i)
			want[i] = 1
		}
		s.reserve(tt.more)
		slots := len(s.slots)
		for i := range uint64(tt.more) {
			s.inc(1000 + i)
			want[1000+i] = 1
		}
		if len(s.slots) != slots || slots > max(minHashRefs, 4*(tt.have+tt.more)) {
			t.Errorf("%d hashes, reserve(%d): %d slots, then %d after adding them", tt.have, tt.more, slots, len(s.slots))
		}
		checkHashRefs(t, fmt.Sprintf("%d + %d", tt.have, tt.more), &s, want)
	}
}

func TestHashRefsClear(t *testing.T) {
	var s hashRefs
	s.clear() // of an empty set
	for i := range uint64(20) {
		s.inc(i * 7)
	}
	slots := len(s.slots)
	s.clear()
	if s.len() != 0 || len(s.slots) != slots || s.has(7) {
		t.Errorf("cleared set: %d hashes, %d slots (had %d), has 7: %v", s.len(), len(s.slots), slots, s.has(7))
	}
	if _, first := s.inc(7); !first || s.len() != 1 {
		t.Errorf("inc after clear: first %v, %d hashes", first, s.len())
	}
}

func TestRankTable(t *testing.T) {
	var rt rankTable
	if rt.get(rk(1, 0)) != nil {
		t.Fatal("empty table finds a rank")
	}
	tests := []struct {
		name  string
		ranks []indexer.WorkerRank
		not   []indexer.WorkerRank
	}{
		{"one", []indexer.WorkerRank{rk(1, 0)}, []indexer.WorkerRank{rk(1, 1), rk(0, 0), rk(2, 0)}},
		{"dp ranks of workers", func() (out []indexer.WorkerRank) {
			for w := range uint64(256) {
				for r := range uint32(8) {
					out = append(out, rk(w+1, r))
				}
			}
			return out
		}(), []indexer.WorkerRank{rk(0, 0), rk(1, 8), rk(257, 0), rk(1<<40, 1)}},
		{"lease ids", []indexer.WorkerRank{rk(0x694d9f5a3c11e001, 0), rk(0x694d9f5a3c11e002, 0), rk(0x694d9f5a3c11e001, 1), rk(1<<63, 1<<31)},
			[]indexer.WorkerRank{rk(0x694d9f5a3c11e003, 0), rk(0x694d9f5a3c11e001, 2)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ranks := make([]*rankLoad, len(tt.ranks))
			for i, wr := range tt.ranks {
				ranks[i] = &rankLoad{wr: wr}
			}
			rt.build(ranks)
			for _, rl := range ranks {
				if got := rt.get(rl.wr); got != rl {
					t.Errorf("get(%s) = %p, want %p", rl.wr, got, rl)
				}
			}
			for _, wr := range tt.not {
				if got := rt.get(wr); got != nil {
					t.Errorf("get(%s) = %+v, want nil", wr, got.wr)
				}
			}
			// Rebuilt without the first rank, it is gone.
			rt.build(ranks[1:])
			if rt.get(ranks[0].wr) != nil {
				t.Errorf("%s found after the rebuild without it", ranks[0].wr)
			}
		})
	}
}

func TestAgeHeap(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	tests := []struct {
		name   string
		ages   []int // seconds after t0, in push order
		remove []int // indexes into ages, removed after all pushes
	}{
		{"in order", []int{0, 1, 2, 3, 4, 5}, nil},
		{"reversed", []int{9, 8, 7, 6, 5, 4, 3, 2, 1}, []int{0}},
		{"ties and a clock going back", []int{5, 5, 1, 9, 5, 0, 7, 7, 3}, []int{3, 5}},
		{"remove the root and leaves", []int{4, 2, 8, 6, 1, 3, 9, 0, 5, 7}, []int{7, 4, 6, 9, 2}},
		{"remove everything", []int{3, 1, 2}, []int{1, 0, 2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var h ageHeap
			reqs := make([]*request, len(tt.ages))
			for i, a := range tt.ages {
				reqs[i] = &request{id: fmt.Sprint(i), added: t0.Add(time.Duration(a) * time.Second)}
				h.push(reqs[i])
			}
			gone := map[int]bool{}
			for _, i := range tt.remove {
				h.remove(reqs[i])
				gone[i] = true
			}
			for i, r := range h {
				if r.age != i {
					t.Fatalf("request %s at %d says %d", r.id, i, r.age)
				}
			}
			var want []int
			for i, a := range tt.ages {
				if !gone[i] {
					want = append(want, a)
				}
			}
			slices.Sort(want)
			var got []int
			for len(h) > 0 {
				got = append(got, int(h[0].added.Sub(t0)/time.Second))
				h.remove(h[0])
			}
			if !slices.Equal(got, want) {
				t.Errorf("oldest first: %v, want %v", got, want)
			}
		})
	}
}

// TestExpiryOutOfOrder: expiry does not assume requests are added in time
// order (the clock may step back).
func TestExpiryOutOfOrder(t *testing.T) {
	clk := newFakeClock()
	l := NewLoads(LoadOptions{Now: clk.Now, TTL: 10 * time.Second})
	l.addRanks(loadKey, 16, rk(1, 0))
	clk.Advance(100 * time.Second)
	must(t, l.Add(loadKey, Booking{ID: "late", Worker: rk(1, 0), Hashes: []uint64{1}}))      // t = 100
	clk.Advance(-95 * time.Second)                                                           // the clock steps back
	must(t, l.Add(loadKey, Booking{ID: "early", Worker: rk(1, 0), Hashes: []uint64{2}}))     // t = 5
	must(t, l.Add(loadKey, Booking{ID: "early2", Worker: rk(1, 0), Hashes: []uint64{2, 3}})) // t = 5
	clk.Advance(10*time.Second + 1)                                                          // t = 15+: both early ones are stale
	if n := l.Expire(); n != 2 {
		t.Fatalf("expired %d, want early and early2", n)
	}
	if got := loadsOf(l, loadKey)[rk(1, 0)]; got != (load{0, 1, 1}) {
		t.Errorf("after expiry: %+v, want late alone", got)
	}
	clk.Advance(100 * time.Second)
	if n := l.Expire(); n != 1 {
		t.Errorf("expired %d, want late", n)
	}
	checkIdle(t, l)
}

// TestNegativeOutputCounted: a rank's output may end a hair below zero
// (float residue of releases) while it has requests; the tracker counts
// such ranks, as decisions rely on costs bounds that assume none.
func TestNegativeOutputCounted(t *testing.T) {
	l := NewLoads(LoadOptions{})
	l.addRanks(loadKey, 16, rk(1, 0), rk(2, 0))
	negative := func() int {
		tr := l.tracker(loadKey)
		tr.mu.Lock()
		defer tr.mu.Unlock()
		return tr.negative
	}
	steps := []struct {
		op   loadOp
		want int
	}{
		{loadOp{do: "add", id: "a", rank: rk(1, 0), hashes: []uint64{1}}, 0},
		{loadOp{do: "add", id: "b", rank: rk(1, 0), hashes: []uint64{2}}, 0},
		{loadOp{do: "add", id: "c", rank: rk(1, 0), hashes: []uint64{3}}, 0},
		{loadOp{do: "output", id: "a", decay: 0}, 0},   // 1
		{loadOp{do: "output", id: "b", decay: 0.1}, 0}, // 1 + 0.9 = 1.9
		{loadOp{do: "free", id: "b", freed: true}, 0},  // 1.9 - 0.9
		{loadOp{do: "free", id: "a", freed: true}, 1},  // ... - 1 = -1.1e-16, c still active
		{loadOp{do: "output", id: "c", decay: 0.5}, 0},
		{loadOp{do: "add", id: "d", rank: rk(2, 0), hashes: []uint64{1}}, 0},
		{loadOp{do: "add", id: "e", rank: rk(2, 0), hashes: []uint64{1}}, 0},
		{loadOp{do: "add", id: "f", rank: rk(2, 0), hashes: []uint64{1}}, 0},
		{loadOp{do: "output", id: "d", decay: 0}, 0},
		{loadOp{do: "output", id: "e", decay: 0.1}, 0},
		{loadOp{do: "free", id: "e", freed: true}, 0},
		{loadOp{do: "free", id: "d", freed: true}, 1},
		{loadOp{do: "free", id: "f", freed: true}, 0}, // idle: output reset to 0
		{loadOp{do: "free", id: "c", freed: true}, 0},
	}
	for i, st := range steps {
		if err := st.op.run(l); err != nil {
			t.Fatalf("step %d (%s %s): %v", i, st.op.do, st.op.id, err)
		}
		if got := negative(); got != st.want {
			t.Fatalf("step %d (%s %s): %d ranks with negative output, want %d", i, st.op.do, st.op.id, got, st.want)
		}
	}
	checkIdle(t, l)
}

// TestExpiredMetric: the scheduler exports its Loads' expirations as
// kvgate_scheduler_expired_requests_total.
func TestExpiredMetric(t *testing.T) {
	clk := newFakeClock()
	s := newSelRig(t, 16, rigOptions{loads: LoadOptions{Now: clk.Now, TTL: time.Minute}})
	s.ranks(1, 1)
	l, reg := s.loads, s.reg
	NewScheduler(s.cat, s.set, l, CostOptions{}, 1, reg)
	expired := func() float64 {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "kvgate_scheduler_expired_requests_total" {
				return mf.GetMetric()[0].GetCounter().GetValue()
			}
		}
		t.Fatal("kvgate_scheduler_expired_requests_total not registered")
		return 0
	}
	must(t, l.Add(loadKey, Booking{ID: "lost", Worker: rk(1, 0), Hashes: []uint64{1}}))
	must(t, l.Add(loadKey, Booking{ID: "freed", Worker: rk(1, 0), Hashes: []uint64{2}}))
	if _, err := l.Free(loadKey, "freed"); err != nil {
		t.Fatal(err)
	}
	if got := expired(); got != 0 {
		t.Fatalf("before the TTL: %v expired, want 0", got)
	}
	clk.Advance(61 * time.Second)
	if n := l.Expire(); n != 1 {
		t.Fatalf("Expire freed %d, want 1", n)
	}
	if got := expired(); got != 1 {
		t.Errorf("after the TTL: %v expired, want 1 (a freed request is not counted)", got)
	}
	checkIdle(t, l)
}
