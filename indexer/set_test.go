package indexer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
)

func TestSetIndexes(t *testing.T) {
	s := NewSet(Options{EventThreads: 2})
	defer s.Close()
	k1, k2 := Key{"llama", "default"}, Key{"llama", "acme"}
	a, err := s.Index(k1, 16)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := s.Index(k1, 16); err != nil || again != a {
		t.Fatalf("second Index call: %v, %v", again == a, err)
	}
	if _, err := s.Index(k1, 32); !errors.Is(err, ErrBlockSizeConflict) {
		t.Fatalf("block size conflict: err = %v", err)
	}
	for _, bs := range []int{0, -1, MaxBlockSize + 1} {
		if _, err := s.Index(k2, bs); err == nil {
			t.Fatalf("block size %d accepted", bs)
		}
	}
	b, err := s.Index(k2, 32)
	if err != nil || b == a {
		t.Fatalf("tenant index: %v", err)
	}
	if s.Lookup(Key{"nope", "default"}) != nil {
		t.Fatal("lookup of a missing key")
	}
	if got, want := s.Keys(), []Key{k2, k1}; !slices.Equal(got, want) {
		t.Fatalf("keys = %v, want %v", got, want)
	}
}

func TestTenantIsolation(t *testing.T) {
	s := NewSet(Options{})
	defer s.Close()
	a, _ := s.Index(Key{"m", "t1"}, 4)
	b, _ := s.Index(Key{"m", "t2"}, 4)
	if _, err := a.Apply(stored(wr(1, 0), TierDevice, nil, chain(1, prompt...))); err != nil {
		t.Fatal(err)
	}
	if got := b.MatchTokens(prompt, "", nil); got != nil {
		t.Fatalf("tenant t2 sees %v", got)
	}
}

func TestParseKey(t *testing.T) {
	tests := []struct {
		in   string
		want Key
		ok   bool
	}{
		{"llama:default", Key{"llama", "default"}, true},
		{"org/model:v1:tenant", Key{"org/model:v1", "tenant"}, true},
		{"nocolon", Key{}, false},
		{":tenant", Key{}, false},
		{"model:", Key{}, false},
	}
	for _, tt := range tests {
		got, err := ParseKey(tt.in)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("ParseKey(%q) = %v, %v", tt.in, got, err)
		}
		if tt.ok && got.String() != tt.in {
			t.Errorf("round trip %q -> %q", tt.in, got.String())
		}
	}
}

func TestSetAppliesInOrderAndDo(t *testing.T) {
	s := NewSet(Options{EventThreads: 3, QueueLen: 2})
	ix, _ := s.Index(Key{"m", DefaultTenant}, 4)
	ctx := context.Background()
	a := wr(9, 0)
	// A chain stored one block at a time: each event needs the previous.
	blocks := chain(100, prompt...)
	var failed atomic.Int32
	for i, b := range blocks {
		ev := stored(a, TierDevice, nil, []Block{b})
		if i > 0 {
			ev.Parent, ev.HasParent = blocks[i-1].ID, true
		}
		if err := s.Submit(ctx, ix, ev, func(_ ApplyResult, err error) {
			if err != nil {
				failed.Add(1)
			}
		}); err != nil {
			t.Fatal(err)
		}
	}
	var seen []Overlap
	if err := s.Do(ctx, a.Worker, func() { seen = ix.MatchTokens(prompt, "", nil) }); err != nil {
		t.Fatal(err)
	}
	if failed.Load() != 0 || !slices.Equal(trees(t, ix, seen), []Overlap{ov(a, 4, 4, 4)}) {
		t.Fatalf("failed %d, match after Do = %v", failed.Load(), seen)
	}
	if err := s.Do(ctx, a.Worker, func() { ix.RemoveWorker(a.Worker) }); err != nil {
		t.Fatal(err)
	}
	if got := ix.MatchTokens(prompt, "", nil); got != nil {
		t.Fatalf("after RemoveWorker: %v", got)
	}
	s.Close()
	s.Close() // idempotent
	if err := s.Submit(ctx, ix, stored(a, TierDevice, nil, blocks), nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("submit after close: %v", err)
	}
	if err := s.Do(ctx, 1, func() {}); !errors.Is(err, ErrClosed) {
		t.Fatalf("do after close: %v", err)
	}
}

func TestSubmitHonoursContext(t *testing.T) {
	s := NewSet(Options{EventThreads: 1, QueueLen: 1})
	defer s.Close()
	ix, _ := s.Index(Key{"m", DefaultTenant}, 4)
	release := make(chan struct{})
	started := make(chan struct{})
	go func() {
		_ = s.Do(context.Background(), 1, func() { close(started); <-release })
	}()
	<-started
	// The goroutine is busy; fill the queue, then the next Submit must wait
	// until its context ends.
	if err := s.Submit(context.Background(), ix, stored(wr(1, 0), TierDevice, nil, chain(1, prompt...)), nil); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Submit(ctx, ix, stored(wr(2, 0), TierDevice, nil, chain(1, prompt...)), nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("submit on a full queue with a cancelled context: %v", err)
	}
	close(release)
}

// TestConcurrentApplyAndMatch applies events of many workers through the
// Set while matches run, then checks the final state equals a sequential
// application of the same events. Run under -race.
//
// With 2 shards each apply goroutine feeds one shard, and shards apply in
// parallel; with 3, goroutines share shards.
func TestConcurrentApplyAndMatch(t *testing.T) {
	for _, shards := range []int{1, 2, 3} {
		t.Run(fmt.Sprint(shards, " shards"), func(t *testing.T) { concurrentApplyAndMatch(t, shards) })
	}
}

func concurrentApplyAndMatch(t *testing.T, shards int) {
	const workers, rounds = 16, 60
	s := NewSet(Options{EventThreads: 4, IndexShards: shards, QueueLen: 8})
	defer s.Close()
	ix, _ := s.Index(Key{"m", DefaultTenant}, 4)
	if len(ix.shards) != shards {
		t.Fatalf("index of %d shards, want %d", len(ix.shards), shards)
	}
	seq := NewIndex(4)

	// Each worker stores and evicts chains over a shared vocabulary, so
	// nodes are shared between workers and change concurrently.
	events := make([][]Event, workers)
	for w := range workers {
		var evs []Event
		for r := range rounds {
			path := fmt.Sprintf("%d%d%d%d%d", r%4, (r/4+w)%4, (r*7+w)%4, (r*3)%4, w%4)
			ev := stored(wr(uint64(w), uint32(w%2)), Tier(1<<(r%3)), nil, blocksOf("", path))
			evs = append(evs, ev)
			if r%3 == 2 {
				evs = append(evs, removed(ev.Worker, ev.Tier, ev.Blocks[len(ev.Blocks)-1].ID, ev.Blocks[2].ID))
			}
			if r%29 == 28 {
				evs = append(evs, Event{Kind: Cleared, Worker: ev.Worker, Tier: TierHost})
			}
		}
		events[w] = evs
		for _, ev := range evs {
			if _, err := seq.Apply(ev); err != nil {
				t.Fatal(err)
			}
		}
	}

	ctx := context.Background()
	stop := make(chan struct{})
	var readers sync.WaitGroup
	for r := range 2 {
		readers.Go(func() {
			buf := make([]Overlap, 0, workers)
			q := seqOf("01230")
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				buf = ix.Match(q, buf[:0])
				for _, o := range buf {
					if o.Device > o.Host || o.Host > o.Disk || int(o.Disk) > len(q) || o.Disk < 1 {
						t.Errorf("reader %d: impossible overlap %+v", r, o)
						return
					}
				}
				_ = ix.BlockCounts()
				if i%50 == 0 {
					_ = ix.Dump()
				}
			}
		})
	}
	var writers sync.WaitGroup
	for w := range workers {
		writers.Go(func() {
			for _, ev := range events[w] {
				if err := s.Submit(ctx, ix, ev, func(_ ApplyResult, err error) {
					if err != nil {
						t.Errorf("apply: %v", err)
					}
				}); err != nil {
					t.Errorf("submit: %v", err)
				}
			}
		})
	}
	writers.Wait()
	for w := range workers {
		if err := s.Do(ctx, uint64(w), func() {}); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	readers.Wait()

	for _, q := range []string{"0", "01230", "12301", "33333", "2103", "0000"} {
		if got, want := matchSorted(ix, q), matchSorted(seq, q); !slices.Equal(got, want) {
			t.Errorf("match %q = %v, sequential %v", q, got, want)
		}
	}
	if got, want := ix.BlockCounts(), seq.BlockCounts(); !mapsEqual(got, want) {
		t.Errorf("block counts %v, sequential %v", got, want)
	}
	if got, want := ix.Stats(), seq.Stats(); got.Workers != want.Workers || got.Entries != want.Entries || got.Nodes < want.Nodes {
		t.Errorf("stats %+v, sequential %+v", got, want)
	}
	for w := range uint64(workers) {
		r := wr(w, uint32(w%2))
		if got, want := ix.RankBlocks(r), seq.RankBlocks(r); got != want {
			t.Errorf("%s: %d blocks, sequential %d", r, got, want)
		}
	}
	checkInvariants(t, ix)
}

// TestShardsFollowThreads checks what Options.IndexShards promises: with a
// shard count that divides the goroutine count, all the workers of one
// apply goroutine are in one shard, so goroutines of different shards
// never wait for each other's turn (see shard).
func TestShardsFollowThreads(t *testing.T) {
	for _, c := range []struct{ threads, shards int }{{4, 2}, {4, 4}, {6, 3}, {8, 2}, {4, 1}} {
		shardOfThread := make(map[int]int)
		for w := range uint64(10000) {
			th, sh := shardOf(w, c.threads), shardOf(w, c.shards)
			if got, ok := shardOfThread[th]; ok && got != sh {
				t.Fatalf("%d threads, %d shards: goroutine %d feeds shards %d and %d", c.threads, c.shards, th, got, sh)
			}
			shardOfThread[th] = sh
		}
		if len(shardOfThread) != c.threads {
			t.Errorf("%d threads: %d used", c.threads, len(shardOfThread))
		}
	}
}

// TestSetHold checks Options.Hold: submitted events queue, in order, until
// Release (or Close) lets them apply.
func TestSetHold(t *testing.T) {
	for _, closeOnly := range []bool{false, true} {
		t.Run(fmt.Sprintf("close only %v", closeOnly), func(t *testing.T) {
			s := NewSet(Options{Hold: true, EventThreads: 2})
			defer s.Close()
			ix, _ := s.Index(Key{"m", DefaultTenant}, 4)
			ctx := context.Background()
			// Two chains stored one block at a time: each event needs the one
			// before it, so only an in-order application places them all.
			var applied []uint64 // block ids, in application order; written by the apply goroutines
			var failed atomic.Int32
			a, b := wr(1, 0), wr(2, 0)
			for _, w := range []WorkerRank{a, b} {
				blocks := chain(10*w.Worker, prompt...)
				for i, blk := range blocks {
					ev := stored(w, TierDevice, nil, []Block{blk})
					if i > 0 {
						ev.Parent, ev.HasParent = blocks[i-1].ID, true
					}
					done := func(_ ApplyResult, err error) {
						if err != nil {
							failed.Add(1)
						}
						if w == a {
							applied = append(applied, blk.ID)
						}
					}
					if err := s.Submit(ctx, ix, ev, done); err != nil {
						t.Fatal(err)
					}
				}
			}
			if !s.Held() || ix.MatchTokens(prompt, "", nil) != nil || ix.Stats() != (Stats{}) {
				t.Fatalf("held set applied events: held %v, stats %+v", s.Held(), ix.Stats())
			}
			if closeOnly {
				s.Close()
			} else {
				s.Release()
				s.Release() // idempotent
				for _, w := range []WorkerRank{a, b} {
					if err := s.Do(ctx, w.Worker, func() {}); err != nil {
						t.Fatal(err)
					}
				}
			}
			if s.Held() || failed.Load() != 0 || !slices.Equal(applied, []uint64{10, 11, 12, 13}) {
				t.Fatalf("held %v, %d failed, worker 1 applied %v", s.Held(), failed.Load(), applied)
			}
			got := trees(t, ix, ix.MatchTokens(prompt, "", nil))
			sortOverlaps(got)
			if !slices.Equal(got, []Overlap{ov(a, 4, 4, 4), ov(b, 4, 4, 4)}) {
				t.Fatalf("after release: %v", got)
			}
		})
	}
}

func TestSetRemove(t *testing.T) {
	s := NewSet(Options{EventThreads: 2})
	defer s.Close()
	k, other := Key{"m", "t"}, Key{"m", "u"}
	old, _ := s.Index(k, 4)
	if _, err := s.Index(other, 4); err != nil {
		t.Fatal(err)
	}
	if _, err := old.Apply(stored(wr(1, 0), TierDevice, nil, chain(1, prompt...))); err != nil {
		t.Fatal(err)
	}
	if !s.Remove(k) {
		t.Fatal("Remove of an index reported none")
	}
	if s.Remove(k) {
		t.Fatal("second Remove reported an index")
	}
	if s.Lookup(k) != nil {
		t.Fatal("Lookup finds a removed index")
	}
	if got, want := s.Keys(), []Key{other}; !slices.Equal(got, want) {
		t.Fatalf("keys = %v, want %v", got, want)
	}
	if d := s.Dump(); len(d) != 1 || d[0].Key != other {
		t.Fatalf("dump holds %v", d)
	}
	// The key comes back new, empty, with any block size.
	fresh, err := s.Index(k, 8)
	if err != nil || fresh == old || fresh.BlockSize() != 8 || fresh.Stats().Entries != 0 {
		t.Fatalf("index after Remove: same %v, err %v", fresh == old, err)
	}
}

// Events queued for an index when it is removed are dropped and counted,
// never applied to the removed index, nor to the key's next one.
func TestSetRemoveDropsQueued(t *testing.T) {
	s := NewSet(Options{EventThreads: 2, Hold: true})
	defer s.Close()
	k := Key{"m", "t"}
	old, _ := s.Index(k, 4)
	var removed atomic.Int64
	const n = 5
	for i := range n {
		err := s.Submit(context.Background(), old, stored(wr(uint64(i), 0), TierDevice, nil, chain(1, prompt...)), func(_ ApplyResult, err error) {
			if errors.Is(err, ErrRemoved) {
				removed.Add(1)
			}
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	s.Remove(k)
	fresh, _ := s.Index(k, 4)
	s.Release()
	if err := s.Do(context.Background(), 0, func() {}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if removed.Load() != n || s.Dropped() != n {
		t.Fatalf("dropped: done saw %d, Dropped %d, want %d", removed.Load(), s.Dropped(), n)
	}
	if e := old.Stats().Entries + fresh.Stats().Entries; e != 0 {
		t.Fatalf("%d entries applied after Remove", e)
	}
}

// Removing and recreating indexes while events for them are submitted and
// read is safe (run with -race): each event applies or is dropped.
func TestSetRemoveRace(t *testing.T) {
	s := NewSet(Options{EventThreads: 4, QueueLen: 16})
	k := Key{"m", "t"}
	var applied, dropped atomic.Int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	const submitters, per = 4, 300
	for w := range submitters {
		wg.Go(func() {
			for i := range per {
				ix, err := s.Index(k, 4)
				if err != nil {
					t.Error(err)
					return
				}
				ev := stored(wr(uint64(w), uint32(i%3)), TierDevice, nil, chain(uint64(i), prompt...))
				err = s.Submit(context.Background(), ix, ev, func(_ ApplyResult, err error) {
					if errors.Is(err, ErrRemoved) {
						dropped.Add(1)
					} else {
						applied.Add(1)
					}
				})
				if err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	var rg sync.WaitGroup
	rg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			s.Remove(k)
			if ix := s.Lookup(k); ix != nil {
				ix.MatchTokens(prompt, "", nil)
			}
			_ = s.Dump()
		}
	})
	wg.Wait()
	close(stop)
	rg.Wait()
	s.Close()
	if got := applied.Load() + dropped.Load(); got != submitters*per {
		t.Fatalf("%d events applied or dropped, want %d", got, submitters*per)
	}
	if uint64(dropped.Load()) != s.Dropped() {
		t.Fatalf("done saw %d dropped, Dropped says %d", dropped.Load(), s.Dropped())
	}
}
