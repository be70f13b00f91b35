package indexer

import (
	"reflect"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestRelaxYields checks when a writer gives up the lock: every
// writeChunk blocks, and for a waiting match at the next block once
// writers have applied yieldAfter blocks since they last yielded to one,
// which doubles while matches come back to back and halves while they
// come now and then.
func TestRelaxYields(t *testing.T) {
	ix := newShard()
	ix.mu.Lock()
	defer ix.mu.Unlock()
	// relax returns the blocks (1-based calls, each after one block) at
	// which it yielded (it then leaves held at 0) over n calls.
	relax := func(n int) []int {
		var at []int
		for i := 1; i <= n; i++ {
			if ix.relax(1); ix.held == 0 {
				at = append(at, i)
			}
		}
		return at
	}
	// lateMatch has a match come after a quiet stretch (the writer's
	// next operation): it gets the lock at the first block.
	lateMatch := func() {
		t.Helper()
		ix.waiting.Store(0)
		ix.held = 0
		relax(yieldChunk + 1)
		ix.waiting.Store(1)
		if got, want := relax(1), []int{1}; !slices.Equal(got, want) {
			t.Fatalf("match after a quiet stretch: yields at %v, want %v", got, want)
		}
	}
	if got, want := relax(2*writeChunk+1), []int{writeChunk, 2 * writeChunk}; !slices.Equal(got, want) {
		t.Fatalf("no match waiting: yields at %v, want %v", got, want)
	}
	// A match waits, long past the last yield: the next block yields.
	// While matches keep waiting, each comes right after a yield, and the
	// gap between yields doubles up to yieldChunk.
	ix.waiting.Store(1)
	ix.held = 0 // a new operation
	want := []int{1, 2, 4, 8, 16, 32, 32 + yieldChunk, 32 + 2*yieldChunk}
	if got := relax(32 + 2*yieldChunk); !slices.Equal(got, want) {
		t.Fatalf("matches back to back: yields at %v, want %v", got, want)
	}
	if got := ix.yieldAfter(); got != yieldChunk {
		t.Fatalf("after matches back to back: yieldAfter %d, want %d", got, yieldChunk)
	}
	// Matches now and then: each yields at the next block and halves the
	// gap (three times here: 32 -> 4).
	for range 3 {
		lateMatch()
	}
	// Another comes 1 block after that yield: the writer goes on until it
	// has applied yieldAfter (4) blocks since (the yielding call's block,
	// 1 more, then 2 before it yields at the third call); as matches keep
	// waiting, the gaps double again (8, 16).
	ix.waiting.Store(0)
	ix.held = 0
	relax(1)
	ix.waiting.Store(1)
	if got, want := relax(yieldChunk), []int{3, 3 + 8, 3 + 8 + 16}; !slices.Equal(got, want) {
		t.Fatalf("match soon after a yield: yields at %v, want %v", got, want)
	}
	// The last match seen (soon after that yield) got the lock otherwise
	// (at the end of the writer's operation): it does not count when the
	// next comes, long after, which halves the gap.
	lateMatch()
	if got := ix.yieldAfter(); got != yieldChunk/2 {
		t.Fatalf("after a match long after the last: yieldAfter %d, want %d", got, yieldChunk/2)
	}
}

// TestWritersGiveUpTheCPU checks that where the shards are as many as
// the cores, a writer applying a long event lets a goroutine waiting for
// a core run before the event ends: with one P and one shard, a goroutine
// started as the event begins sees it part-applied.
func TestWritersGiveUpTheCPU(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	ix := NewIndex(4)
	w := WorkerRank{Worker: 1}
	const n = 4 * writeChunk
	blocks := make([]Block, n)
	for i := range blocks {
		blocks[i] = Block{Hash: uint64(i + 1), Local: uint64(i + 1)}
	}
	seen := make(chan int, 1)
	var over atomic.Bool // Apply returned
	// The reader is runnable, but this goroutine has the only P.
	go func() {
		// Should it run before the event starts (this goroutine
		// preempted in between), it gives the P back until some
		// block is in; if the writer never gives up the P, it runs
		// only when the event is whole, and sees all of it.
		got := ix.RankBlocks(w)
		for got == 0 && !over.Load() {
			runtime.Gosched()
			got = ix.RankBlocks(w)
		}
		seen <- got
	}()
	_, err := ix.Apply(stored(w, TierDevice, nil, blocks))
	over.Store(true)
	if err != nil {
		t.Fatal(err)
	}
	if got := <-seen; got == 0 || got >= n {
		t.Fatalf("the other goroutine saw %d of the event's %d blocks, want some but not all", got, n)
	}
}

// TestSpareCore checks which indexes have a core to spare for matches,
// whose writers run handed matches and spin for the lock: those with fewer
// shards than Go uses cores. The others' writers give up their core now
// and then.
func TestSpareCore(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	cases := []struct {
		procs, shards int
		spare         bool
	}{
		{1, 1, false},
		{2, 1, true},
		{2, 2, false},
		{2, 4, false},
		{8, 4, true},
	}
	for _, c := range cases {
		runtime.GOMAXPROCS(c.procs)
		ix := NewShardedIndex(4, c.shards)
		for i, sh := range ix.shards {
			if sh.spare != c.spare {
				t.Errorf("GOMAXPROCS %d, %d shards: shard %d spare %v, want %v", c.procs, c.shards, i, sh.spare, c.spare)
			}
		}
	}
}

// handIndex returns an index of one shard where several ranks hold
// prefixes of a path of 12 blocks, and the path's sequence hashes with
// the match's answer on the quiescent index. The shard has a spare core,
// whatever GOMAXPROCS is, and handed matches wait for a writer for as long
// as handWait, whether or not it finishes steps meanwhile, and whatever
// CPU they run on (the shard knows none).
func handIndex(t *testing.T, handWait time.Duration) (*Index, []uint64, []Overlap) {
	t.Helper()
	ix := NewIndex(4)
	const path = "012301230123"
	for w, n := range []int{12, 7, 3, 12, 1} {
		if _, err := ix.Apply(stored(wr(uint64(w+1), 0), Tier(1<<(w%3)), nil, blocksOf("", path[:n]))); err != nil {
			t.Fatal(err)
		}
	}
	sh := ix.shards[0]
	sh.spare, sh.handWait, sh.stallWait = true, handWait, handWait
	sh.onCPU = func() int32 { return -1 }
	seq := seqOf(path)
	want := ix.Match(seq, nil)
	if len(want) != 5 {
		t.Fatalf("match on the quiescent index = %v, want 5 ranks", want)
	}
	return ix, seq, want
}

// matchAsync runs ix.Match(seq) on a new goroutine; its answer comes on
// the returned channel.
func matchAsync(ix *Index, seq []uint64) <-chan []Overlap {
	got := make(chan []Overlap, 1)
	go func() { got <- ix.Match(seq, make([]Overlap, 0, 1)) }()
	return got
}

// hangAfter is how long these tests wait for what must come before they
// fail: a guard against a hang (a broken hand-over spins or sleeps for
// ever), not a timing.
const hangAfter = 30 * time.Second

// until calls runtime.Gosched until cond holds; it fails t if cond does
// not hold within hangAfter.
func until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(hangAfter)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, hangAfter)
		}
		runtime.Gosched()
	}
}

// within receives from ch; it fails t if nothing comes within hangAfter.
func within[T any](t *testing.T, what string, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(hangAfter):
		t.Fatalf("%s: not within %v", what, hangAfter)
		panic("unreachable")
	}
}

// serveRound hands a match of seq to the first shard of ix, whose lock
// this goroutine holds as a writer, and applies blocks (relax) until the
// writer has run it, or gives up after serveBurst. It checks the answer,
// and returns how many blocks that took.
func serveRound(t *testing.T, ix *Index, seq []uint64, want []Overlap) int {
	t.Helper()
	sh := ix.shards[0]
	got := matchAsync(ix, seq)
	until(t, "match handed", func() bool { return sh.handed.Load() != nil })
	blocks := 0
	sh.held = 0 // and stays below writeChunk: relax keeps mu
	for sh.handed.Load() != nil {
		if blocks == serveBurst {
			t.Fatalf("match not run after %d blocks", blocks)
		}
		sh.relax(1)
		blocks++
	}
	if a := within(t, "handed match", got); !slices.Equal(a, want) { // mu is still held: the writer ran it
		t.Errorf("handed match = %v, want %v", a, want)
	}
	return blocks
}

// TestHandedMatchRunByWriter checks that a match finding the lock held
// by a writer is run by that writer at its next block, while it still
// holds the lock, with the answer it would have got on its own, and that
// writers then apply serveAfter blocks before they run the next.
func TestHandedMatchRunByWriter(t *testing.T) {
	ix, seq, want := handIndex(t, time.Hour)
	handed, timed := observeHanded(ix)
	sh := ix.shards[0]
	sh.write.Lock() // this goroutine is the writer
	sh.lock()
	sh.serveCredit = serveAfter - 1 // the next block may run a match
	for round, wantBlocks := range []int{1, serveAfter} {
		if blocks := serveRound(t, ix, seq, want); blocks != wantBlocks {
			t.Errorf("round %d: run at block %d, want %d", round, blocks, wantBlocks)
		}
	}
	sh.unlock()
	sh.write.Unlock()
	if got := ix.Stats().Handed; got != 2 {
		t.Errorf("Stats().Handed = %d, want 2", got)
	}
	ix.Match(seq, nil) // the lock free: not handed
	if want := []MatchPath{PathHanded, PathHanded, PathFree}; timed && !slices.Equal(handed.paths, want) {
		t.Errorf("MatchPhases.Path of the two handed matches and one more: %v, want %v", handed.paths, want)
	}
}

// observeHanded makes ix's matches note, if the binary times their
// phases (-tags matchphases), how they got the lock or were run
// (MatchPhases.Path; PathHanded: a writer ran them).
// Matches may run at once: read the notes after they return.
func observeHanded(ix *Index) (n *handedNotes, timed bool) {
	n = new(handedNotes)
	timed = ix.ObservePhases(func(p MatchPhases) {
		n.mu.Lock()
		defer n.mu.Unlock()
		n.paths = append(n.paths, p.Path)
	})
	return n, timed
}

// handedNotes is what observeHanded noted, in the order the matches ended.
type handedNotes struct {
	mu    sync.Mutex
	paths []MatchPath
}

// TestHandedMatchesAfterQuiet checks that, after a spell of blocks
// without matches, writers run the next serveBurst/serveAfter handed
// matches each at the next block, and then one every serveAfter blocks,
// never more than the blocks they applied allow.
func TestHandedMatchesAfterQuiet(t *testing.T) {
	ix, seq, want := handIndex(t, time.Hour)
	sh := ix.shards[0]
	sh.write.Lock()
	sh.lock()
	for range 4 * serveBurst { // the quiet spell
		sh.relax(1)
	}
	const rounds = 2 * serveBurst / serveAfter
	applied := serveBurst // the most the quiet spell may count for
	for round := range rounds {
		blocks := serveRound(t, ix, seq, want)
		applied += blocks
		switch {
		case round < serveBurst/serveAfter && blocks != 1:
			t.Errorf("round %d, in the burst: run at block %d, want 1", round, blocks)
		case round == rounds-1 && blocks != serveAfter:
			t.Errorf("round %d, after the burst: run at block %d, want %d", round, blocks, serveAfter)
		}
		if ran := round + 1; ran*serveAfter > applied {
			t.Errorf("round %d: %d matches run over %d blocks, more than one per %d", round, ran, applied, serveAfter)
		}
	}
	sh.unlock()
	sh.write.Unlock()
}

// TestHandedMatchTakenBack checks that a handed match runs itself if the
// lock comes free before a writer runs it.
func TestHandedMatchTakenBack(t *testing.T) {
	ix, seq, want := handIndex(t, time.Hour)
	handed, timed := observeHanded(ix)
	sh := ix.shards[0]
	sh.lock()
	got := matchAsync(ix, seq)
	until(t, "match handed", func() bool { return sh.handed.Load() != nil })
	sh.unlock()
	if a := within(t, "match taken back", got); !slices.Equal(a, want) {
		t.Errorf("match = %v, want %v", a, want)
	}
	if h := sh.handed.Load(); h != nil || ix.Stats().Handed != 0 {
		t.Errorf("after: handed %p, %d run by a writer; want none", h, ix.Stats().Handed)
	}
	if timed && !slices.Equal(handed.paths, []MatchPath{PathTakenBack}) {
		t.Errorf("MatchPhases.Path: %v, want %v", handed.paths, PathTakenBack)
	}
}

// TestHandedMatchWaitsForTheLock checks that a handed match no writer
// runs within handWait, or whose writer finishes no step for stallWait,
// or that runs on the CPU the writer took the lock on, waits for the lock
// instead, telling writers; that while one match is handed, others wait
// for the lock; and that where the shard has no spare core, matches are
// not handed over.
func TestHandedMatchWaitsForTheLock(t *testing.T) {
	for _, c := range []struct {
		name                string
		handWait, stallWait time.Duration
		sameCPU             bool        // the match runs on the writer's CPU
		noSpare             bool        // the shard has no spare core
		matches             int         // matches started while the lock is held
		paths               []MatchPath // their MatchPhases.Path, sorted
	}{
		{"handWait passes", 0, time.Hour, false, false, 1, []MatchPath{PathHandGaveUp}},
		{"the writer makes no step", time.Hour, stallWait, false, false, 1, []MatchPath{PathHandGaveUp}},
		{"on the writer's CPU", time.Hour, time.Hour, true, false, 1, []MatchPath{PathSameCPU}},
		// The first, handed, takes itself back when the lock comes free.
		{"another is handed", time.Hour, time.Hour, false, false, 2, []MatchPath{PathTakenBack, PathBusy}},
		{"no spare core", time.Hour, time.Hour, false, true, 1, []MatchPath{PathBusy}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ix, seq, want := handIndex(t, c.handWait)
			notes, timed := observeHanded(ix)
			sh := ix.shards[0]
			sh.stallWait = c.stallWait
			sh.spare = !c.noSpare
			if c.sameCPU {
				sh.onCPU = func() int32 { return 7 } // the writer's and the match's
			}
			sh.lock()
			var got []<-chan []Overlap
			for range c.matches {
				got = append(got, matchAsync(ix, seq))
			}
			until(t, "a match waiting for the lock", func() bool { return sh.waiting.Load() == 1 })
			sh.unlock()
			for _, g := range got {
				if a := within(t, "match", g); !slices.Equal(a, want) {
					t.Errorf("match = %v, want %v", a, want)
				}
			}
			if n := ix.Stats().Handed; n != 0 {
				t.Errorf("%d matches run by a writer, want 0", n)
			}
			slices.Sort(notes.paths)
			if timed && !slices.Equal(notes.paths, c.paths) {
				t.Errorf("MatchPhases.Path: %v, want %v", notes.paths, c.paths)
			}
		})
	}
}

// TestHandedMatchTakenAsItGivesUp checks that a handed match whose time
// runs out after a writer has taken it (serve's first half), but before
// the writer has run it, does not give up: it waits for the writer to run
// it, and returns the writer's answer, without waiting for the lock.
func TestHandedMatchTakenAsItGivesUp(t *testing.T) {
	ix, seq, want := handIndex(t, time.Hour)
	notes, timed := observeHanded(ix)
	sh := ix.shards[0]
	// The match's clock: it moves when the test moves it, and notes when
	// the match has read it, before and after it moved.
	var elapsed atomic.Int64
	var read, readMoved atomic.Bool
	t0 := time.Now()
	sh.now = func() time.Time {
		d := elapsed.Load()
		read.Store(true)
		if d != 0 {
			readMoved.Store(true)
		}
		return t0.Add(time.Duration(d))
	}
	sh.write.Lock()
	sh.lock()
	got := matchAsync(ix, seq)
	until(t, "match handed", func() bool { return sh.handed.Load() != nil })
	m := sh.handed.Load()
	if !sh.handed.CompareAndSwap(m, nil) {
		t.Fatal("the handed match went before the writer took it")
	}
	// The match's first reading starts its timer, before the clock moves;
	// a reading after the move runs its time out, and it finds the writer
	// has taken it.
	until(t, "the match starts its timer", read.Load)
	elapsed.Store(int64(2 * time.Hour))
	until(t, "the match reads the moved clock", readMoved.Load)
	for i := range 1000 {
		select {
		case a := <-got:
			t.Fatalf("after %d yields, a match the writer took but has not run returned %v", i, a)
		default:
		}
		if sh.waiting.Load() != 0 {
			t.Fatalf("after %d yields, a match the writer took waits for the lock", i)
		}
		runtime.Gosched()
	}
	sh.run(m)
	if a := within(t, "match the writer ran", got); !slices.Equal(a, want) {
		t.Errorf("match = %v, want %v", a, want)
	}
	sh.unlock()
	sh.write.Unlock()
	if n := ix.Stats().Handed; n != 1 {
		t.Errorf("%d matches run by a writer, want 1", n)
	}
	if timed && !slices.Equal(notes.paths, []MatchPath{PathHanded}) {
		t.Errorf("MatchPhases.Path: %v, want %v", notes.paths, PathHanded)
	}
}

// TestHandTimer checks when a handed match stops waiting for the writer:
// after handWait from its first reading of the clock, or after stallWait
// without the writer finishing a step.
func TestHandTimer(t *testing.T) {
	const handWait, stallWait = 50 * time.Microsecond, 10 * time.Microsecond
	type reading struct {
		at    time.Duration // from the first
		steps uint32
		want  bool
	}
	for _, c := range []struct {
		name     string
		readings []reading
	}{
		{"a running writer", []reading{{0, 5, false}, {8 * us, 6, false}, {16 * us, 7, false}, {24 * us, 9, false}, {33 * us, 9, false}, {49 * us, 12, false}, {50 * us, 13, true}}},
		{"a writer that stops", []reading{{0, 5, false}, {4 * us, 6, false}, {13 * us, 6, false}, {14 * us, 6, true}}},
		{"a writer that never steps", []reading{{0, 5, false}, {9 * us, 5, false}, {10 * us, 5, true}}},
		{"the count wraps", []reading{{0, ^uint32(0), false}, {9 * us, 0, false}, {18 * us, 0, false}, {19 * us, 0, true}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var timer handTimer
			t0 := time.Unix(1700000000, 0)
			for _, r := range c.readings {
				if got := timer.expired(t0.Add(r.at), r.steps, handWait, stallWait); got != r.want {
					t.Errorf("at %v with %d steps: expired = %v, want %v", r.at, r.steps, got, r.want)
				}
			}
		})
	}
}

// TestWriterNotesItsCPU checks that a writer of a shard with a spare core
// notes the CPU it runs on when it takes the lock, and again when it takes
// it back after yielding it to a waiting match.
// Without a spare core, matches are not handed over: writers do not read
// their CPU.
func TestWriterNotesItsCPU(t *testing.T) {
	for _, c := range []struct {
		spare                 bool
		afterLock, afterYield int32
	}{{true, 3, 5}, {false, -1, -1}} {
		sh := newShard()
		sh.spare = c.spare
		if got := sh.cpu.Load(); got != -1 {
			t.Fatalf("new shard: cpu = %d, want -1", got)
		}
		cpu := int32(3)
		sh.onCPU = func() int32 { return cpu }
		sh.write.Lock()
		sh.lock()
		if got := sh.cpu.Load(); got != c.afterLock {
			t.Errorf("spare %v, after lock: cpu = %d, want %d", c.spare, got, c.afterLock)
		}
		// A waiting match: relax yields mu to it and takes it back.
		sh.waiting.Add(1)
		cpu = 5
		sh.held = writeChunk
		sh.relax(1)
		sh.waiting.Add(-1)
		if got := sh.cpu.Load(); got != c.afterYield {
			t.Errorf("spare %v, after yielding to a match: cpu = %d, want %d", c.spare, got, c.afterYield)
		}
		sh.unlock()
		sh.write.Unlock()
	}
	if c := currentCPU(); c < -1 || (runtime.GOOS == "linux" && c < 0) {
		t.Errorf("currentCPU() = %d on %s", c, runtime.GOOS)
	}
}

// TestRelaxCountsSteps checks that writers count each step they finish
// (shard.steps), which a handed match reads to tell a stalled writer.
func TestRelaxCountsSteps(t *testing.T) {
	sh := newShard()
	sh.write.Lock()
	sh.lock()
	before := sh.steps.Load()
	for _, n := range []int{1, maxStretch, 3} {
		sh.relax(n)
	}
	if got := sh.steps.Load() - before; got != 3 {
		t.Errorf("3 steps counted as %d", got)
	}
	sh.unlock()
	sh.write.Unlock()
}

// us is a microsecond.
const us = time.Microsecond

// TestWriterSpinsThenWaits checks that a writer of a shard with a spare
// core, spinning for the lock while matches hold it, gives up spinning
// after lockSpin and waits on the lock, which keeps new matches out, and
// that it notes its CPU once it has the lock.
func TestWriterSpinsThenWaits(t *testing.T) {
	sh := newShard()
	sh.spare = true
	sh.onCPU = func() int32 { return 2 }
	sh.mu.RLock() // a match
	locked := make(chan struct{})
	go func() {
		sh.lock()
		close(locked)
	}()
	// A spinning writer lets new matches in; one waiting on the lock does
	// not.
	until(t, "writer waiting on the lock", func() bool {
		if !sh.mu.TryRLock() {
			return true
		}
		sh.mu.RUnlock()
		return false
	})
	select {
	case <-locked:
		t.Fatal("writer took the lock while a match held it")
	default:
	}
	sh.mu.RUnlock()
	within(t, "writer taking the lock", locked)
	if got := sh.cpu.Load(); got != 2 {
		t.Errorf("writer that slept for the lock: cpu = %d, want 2", got)
	}
	sh.unlock()
}

// field is a field's name and where it lies in its struct.
type field struct {
	name     string
	from, to uintptr // bytes [from, to)
}

// fieldsOf lists the fields of struct type t, those of the struct types
// in open listed in their stead, and the blank ones (padding) left out.
func fieldsOf(t reflect.Type, open ...reflect.Type) []field {
	var out []field
	var walk func(t reflect.Type, at uintptr, prefix string)
	walk = func(t reflect.Type, at uintptr, prefix string) {
		for i := range t.NumField() {
			f := t.Field(i)
			if f.Name == "_" {
				continue
			}
			if slices.Contains(open, f.Type) {
				walk(f.Type, at+f.Offset, prefix+f.Name+".")
				continue
			}
			out = append(out, field{prefix + f.Name, at + f.Offset, at + f.Offset + f.Type.Size()})
		}
	}
	walk(t, 0, "")
	return out
}

// TestMatchFieldsApart checks that the fields of a runTree and a shard
// that matches read lie at least a cache line away from those that
// writers change (and, in a shard, that both change), so that no line
// holds both, however the struct is aligned.
func TestMatchFieldsApart(t *testing.T) {
	for _, tc := range []struct {
		name   string
		fields []field
		groups [][]string // fields that may share lines; the rest one more group
	}{
		{"runTree", fieldsOf(reflect.TypeFor[runTree](), reflect.TypeFor[blockSlab](), reflect.TypeFor[headTable]()),
			[][]string{{"blocks.chunks", "spans", "sets", "who", "retired", "heads.slots", "heads.zero", "heads.zv"}}},
		{"shard", fieldsOf(reflect.TypeFor[shard]()),
			[][]string{{"spare", "handWait", "stallWait", "onCPU", "now", "phases", "tree"}, {"mu", "waiting", "handed"}, {"steps", "cpu"}}},
	} {
		groupOf := func(name string) int {
			for g, names := range tc.groups {
				if slices.Contains(names, name) {
					return g
				}
			}
			return len(tc.groups)
		}
		for _, names := range tc.groups {
			for _, n := range names {
				if !slices.ContainsFunc(tc.fields, func(f field) bool { return f.name == n }) {
					t.Fatalf("%s has no field %s", tc.name, n)
				}
			}
		}
		for i, a := range tc.fields {
			for _, b := range tc.fields[i+1:] {
				if groupOf(a.name) == groupOf(b.name) {
					continue
				}
				if a.to+cacheLine > b.from && b.to+cacheLine > a.from {
					t.Errorf("%s: %s (bytes %d-%d) and %s (%d-%d) are less than a cache line apart", tc.name, a.name, a.from, a.to, b.name, b.from, b.to)
				}
			}
		}
	}
}
