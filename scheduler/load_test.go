package scheduler

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/indexer"
)

// These tests drive Loads directly (shared/spec/scheduling.md, "Active load
// per (worker, dp_rank)"; seed 002, the slot tracker). Every expected load
// is worked out by hand in the case that states it.

// loadKey is the (model, tenant) of the load tests.
var loadKey = indexer.Key{Model: "m", Tenant: indexer.DefaultTenant}

func rk(worker uint64, rank uint32) indexer.WorkerRank {
	return indexer.WorkerRank{Worker: worker, Rank: rank}
}

// fakeClock is a clock the tests move by hand.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Unix(1_800_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

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
		l.RemoveRanks(key, op.rank.Worker, rank)
		return nil
	case "apply-add":
		return l.Apply(Lifecycle{Kind: LifecycleAdd, Key: key, Booking: b})
	case "apply-prefill":
		return l.Apply(Lifecycle{Kind: LifecyclePrefillComplete, Key: key, Booking: b})
	case "apply-free":
		return l.Apply(Lifecycle{Kind: LifecycleFree, Key: key, Booking: b})
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
		{"RemoveRanks drops the rank's requests and load", []loadOp{
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
			l.AddRanks(loadKey, 16, a, c)
			l.AddRanks(loadKey, 16, b, a) // a again keeps its (empty) load
			l.AddRanks(indexer.Key{Model: "m", Tenant: "t"}, 16, a)
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
	l.AddRanks(loadKey, 16, rk(1, 0))
	hashes := []uint64{1, 2, 3}
	if err := l.Add(loadKey, Booking{ID: "r", Worker: rk(1, 0), Hashes: hashes}); err != nil {
		t.Fatal(err)
	}
	hashes[0], hashes[1], hashes[2] = 7, 8, 9 // the caller reuses its buffer
	if _, err := l.Free(loadKey, "r"); err != nil {
		t.Fatal(err)
	}
	checkIdle(t, l)
	p, err := l.Potentials(loadKey, []uint64{1, 2, 3}, 0)
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
	l.AddRanks(loadKey, 16, rk(7, 0), rk(7, 1), rk(8, 0))
	must(t, l.Add(loadKey, Booking{ID: "req-123", Worker: rk(7, 0), Hashes: []uint64{101, neg22, 303}, PrefillTokens: 48}))
	// Rank 8/0 runs a request holding 303 (not a prefix: any held block
	// counts) and 500, with an output block at decay 0.75: 2 + 0.25 blocks.
	must(t, l.Add(loadKey, Booking{ID: "x", Worker: rk(8, 0), Hashes: []uint64{303, 500}, PrefillTokens: 10}))
	must(t, l.OutputBlock(loadKey, "x", 0.75))
	must(t, l.PrefillComplete(loadKey, "x"))

	got, err := l.Potentials(loadKey, []uint64{101, neg22, 303, 404}, 48)
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
	if got, err := l.Potentials(loadKey, nil, 0); err != nil || len(got) != 3 || got[0].DecodeBlocks+got[1].DecodeBlocks+got[2].DecodeBlocks != 3+0+2.25 {
		t.Errorf("empty request: %+v, %v; want the current loads", got, err)
	}
	if _, err := l.Potentials(indexer.Key{Model: "nope", Tenant: "default"}, nil, 0); !errors.Is(err, ErrNotFound) {
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
	l.AddRanks(mb, 16, rk(2, 1), rk(10, 0), rk(2, 0))
	l.AddRanks(ma, 16, rk(3, 0))
	l.AddRanks(mat, 16, rk(9, 3), rk(1, 2))
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
	l.AddRanks(loadKey, 16, rk(1, 0))
	l.AddRanks(other, 16, rk(1, 0))
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
	if n := l.Expire(); n != 2 {
		t.Fatalf("at 301 s: expired %d, want 2 (old, other-old)", n)
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
	if freed, _ := l.Free(loadKey, "young"); freed {
		t.Error("young was not expired by the add")
	}
	clk.Advance(101 * time.Second) // other-young is 301 s old
	if active(other) != 1 {
		t.Errorf("other: %d active, want other-young until swept", active(other))
	}
	if n := l.Expire(); n != 1 || active(other) != 0 {
		t.Errorf("Expire: %d expired, %d left in other; want 1 and 0", n, active(other))
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
	l.AddRanks(loadKey, 16, rk(1, 0))
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
	l.AddRanks(loadKey, 16, rk(1, 0))
	if err := l.Apply(Lifecycle{Kind: 0, Key: loadKey, Booking: Booking{ID: "x", Worker: rk(1, 0)}}); !errors.Is(err, ErrInvalid) {
		t.Errorf("kind 0: %v, want ErrInvalid", err)
	}
	if err := l.Apply(Lifecycle{Kind: 99, Key: loadKey}); !errors.Is(err, ErrInvalid) {
		t.Errorf("kind 99: %v, want ErrInvalid", err)
	}
	checkIdle(t, l)
}
