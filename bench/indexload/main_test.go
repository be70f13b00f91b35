package main

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvgate/kvgate/indexer"
	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any leaves a goroutine running.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestSpinWhile checks that spinWhile runs f once, and returns with its
// spinning goroutine ended (TestMain checks for leaks).
func TestSpinWhile(t *testing.T) {
	calls := 0
	spinWhile(func() { calls++ })
	if calls != 1 {
		t.Fatalf("f ran %d times, want once", calls)
	}
	if err := goleak.Find(); err != nil {
		t.Errorf("after spinWhile: %v", err)
	}
}

func TestSimulateEvictsTailFirst(t *testing.T) {
	cfg := config{workers: 1, split: 1, capacity: 3}
	prompts := [][]uint64{{1, 2, 3}, {1, 2, 4}, {1, 5}}
	events, firsts, ops := simulate(cfg, prompts)
	// 1: store 1,2,3. 2: store 4 under 2, evict 3 (the older tail).
	// 3: store 5 under 1, evict 4.
	want := []string{"stored[1 2 3]", "stored^2[4]", "removed[3]", "stored^1[5]", "removed[4]"}
	var got []string
	for _, ev := range events {
		got = append(got, describe(ev))
	}
	if strings.Join(got, " ") != strings.Join(want, " ") || ops != 7 {
		t.Fatalf("events %v (%d ops), want %v", got, ops, want)
	}
	if !slices.Equal(firsts, []int{0, 1, 3}) {
		t.Fatalf("first events %v, want [0 1 3]", firsts)
	}
	// The events apply cleanly: no unknown parents.
	ix := indexer.NewIndex(16)
	for _, ev := range events {
		if _, err := ix.Apply(ev); err != nil {
			t.Fatal(err)
		}
	}
}

func TestHoldUpsOf(t *testing.T) {
	cases := []struct {
		name  string
		gaps  []time.Duration // each repeat's time
		d     time.Duration
		n     int
		lost  time.Duration
		work  time.Duration
		total time.Duration
	}{
		{"none", []time.Duration{us(1), us(1), us(1)}, us(3), 0, 0, us(1), us(3)},
		{"two", []time.Duration{us(1), us(10), us(1), us(1), us(40)}, us(50), 2, us(48), us(1), us(53)},
		{"the shortest repeat", []time.Duration{us(3), us(2), us(9), us(4)}, us(18), 1, us(7), us(2), us(18)},
		{"at the threshold", []time.Duration{us(2), holdUpMin, us(2)}, us(11), 1, holdUpMin - us(2), us(2), us(12)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			clock := time.Unix(0, 0)
			i := 0
			now := func() time.Time { return clock }
			work := func() { clock = clock.Add(c.gaps[i]); i++ }
			h := holdUpsOf(c.d, now, work)
			if i != len(c.gaps) || h.n != c.n || h.lost != c.lost || h.work != c.work || h.total != c.total || h.threads != 1 {
				t.Fatalf("%d repeats: %+v, want %d repeats, n %d lost %s work %s total %s", i, h, len(c.gaps), c.n, c.lost, c.work, c.total)
			}
		})
	}
}

func TestSumHoldUps(t *testing.T) {
	cases := []struct {
		name       string
		all        []holdUps
		want       holdUps
		rate, lost float64 // per thread: per second, per cent
	}{
		{"one thread", []holdUps{{n: 10, lost: 20 * time.Millisecond, total: time.Second, work: us(1), threads: 1}},
			holdUps{n: 10, lost: 20 * time.Millisecond, total: time.Second, work: us(1), threads: 1}, 10, 2},
		{"two", []holdUps{
			{n: 30, lost: 60 * time.Millisecond, total: 2 * time.Second, work: us(2), threads: 1},
			{n: 10, lost: 20 * time.Millisecond, total: 2*time.Second + us(5), work: us(1), threads: 1},
		}, holdUps{n: 40, lost: 80 * time.Millisecond, total: 2*time.Second + us(5), work: us(1), threads: 2}, 10, 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := sumHoldUps(c.all)
			if got != c.want {
				t.Fatalf("sum %+v, want %+v", got, c.want)
			}
			if r, l := got.rate(), got.lostPct(); math.Abs(r-c.rate) > 0.01 || math.Abs(l-c.lost) > 0.01 {
				t.Errorf("rate %.3f, lost %.3f %%; want %.3f, %.3f", r, l, c.rate, c.lost)
			}
		})
	}
	if h := measureHoldUps(time.Millisecond, 2); h.threads != 2 || h.total < time.Millisecond || h.work <= 0 {
		t.Errorf("two threads measured for 1ms: %+v", h)
	}
}

func TestGroupShapes(t *testing.T) {
	shapes := []shape{
		{d: us(3), blocks: 10, ranks: 1, lengths: 1},
		{d: us(1), blocks: 30, ranks: 3, lengths: 0},
		{d: us(2), blocks: 20, ranks: 2, lengths: 1},
		{d: us(9), blocks: 90, ranks: 256, lengths: 12},
		{d: us(5), blocks: 50, ranks: 8, lengths: 4},
	}
	got := groupShapes(shapes)
	want := []struct {
		name          string
		n             int
		ranks, blocks int
		p50           time.Duration
	}{{"0-1", 3, 2, 20, us(2)}, {"3-4", 1, 8, 50, us(5)}, {"9+", 1, 256, 90, us(9)}}
	if len(got) != len(want) {
		t.Fatalf("groups %+v, want %+v", got, want)
	}
	for i, w := range want {
		g := got[i]
		if g.name != w.name || len(g.lat) != w.n || g.ranks != w.ranks || g.blocks != w.blocks || g.lat.pct(50) != w.p50 {
			t.Errorf("group %d = %s: %d matches, %d ranks, %d blocks, p50 %s; want %+v", i, g.name, len(g.lat), g.ranks, g.blocks, g.lat.pct(50), w)
		}
	}
}

func describe(ev indexer.Event) string {
	var b strings.Builder
	b.WriteString(ev.Kind.String())
	if ev.HasParent {
		b.WriteString("^" + itoa(ev.Parent))
	}
	b.WriteString("[")
	for i, bl := range ev.Blocks {
		if i > 0 {
			b.WriteString(" ")
		}
		b.WriteString(itoa(bl.ID))
	}
	for i, h := range ev.IDs {
		if i > 0 {
			b.WriteString(" ")
		}
		b.WriteString(itoa(h))
	}
	b.WriteString("]")
	return b.String()
}

// us is n microseconds.
func us(n int) time.Duration { return time.Duration(n) * time.Microsecond }

func itoa(v uint64) string { return strconv.FormatUint(v, 10) }

func TestRunOnASmallTrace(t *testing.T) {
	trace := filepath.Join(t.TempDir(), "trace.jsonl")
	data := `{"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [0, 1]}
{"timestamp": 1, "input_length": 1536, "output_length": 1, "hash_ids": [0, 1, 2]}

{"timestamp": 2, "input_length": 512, "output_length": 1, "hash_ids": [3]}
`
	if err := os.WriteFile(trace, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	cfg := config{trace: trace, workers: 2, split: 4, capacity: 6, eventThreads: 2, indexShards: 1, queriers: 1, idleRounds: 2, backlog: 2, seed: 1, holdUps: time.Millisecond}
	for _, shards := range []int{1, 2} {
		out.Reset()
		cfg.indexShards = shards
		cfg.pace = float64(shards-1) * 1e3 // the second run paced, at a rate it never waits for
		cfg.rematch = shards == 2
		cfg.paceSpin = shards == 2 && runtime.GOMAXPROCS(0) > 1
		if shards == 2 {
			cfg.memProfile = filepath.Join(t.TempDir(), "mem.prof")
		}
		if err := run(cfg, &out); err != nil {
			t.Fatal(err)
		}
		multi := runtime.GOMAXPROCS(0) > 1
		for _, row := range []struct {
			text string
			want bool
		}{
			{"Phases of the matches", false},
			{"for the lock", false},
			{"such threads at once, one per Go core", multi},
			{"| the same, a thread spinning meanwhile (another core busy) | 6, ", multi},
			{"| interrupts, all CPUs (TLB shootdowns / function calls / rescheduling / local timer), alone, replay, stress | ", runtime.GOOS == "linux"},
		} {
			if got := strings.Contains(out.String(), row.text); got != row.want {
				t.Errorf("%q printed %v, want %v:\n%s", row.text, got, row.want, out.String())
			}
		}
		for _, want := range []string{"3 requests, 24 prompt blocks", "blocks applied per second, alone", "| matches during the replay | 3, ", "| matches on the idle index | 6, ", "| distinct lengths | matches |", "heap bytes per (block, worker) entry", "| heap allocations per 1 000 blocks applied, alone (the index's and its Set's) | ", "- hold-ups: a thread repeating",
			"| preemptions (involuntary context switches) / page faults, alone, replay, stress | ",
			fmt.Sprintf("| final index | %d shards, 2 worker ranks, ", shards)} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("output lacks %q:\n%s", want, out.String())
			}
		}
		if got, want := strings.Contains(out.String(), "events submitted at 1000.00 M blocks/s at most"), cfg.pace > 0; got != want {
			t.Errorf("paced label printed %v, paced %v:\n%s", got, want, out.String())
		}
		if got, want := strings.Contains(out.String(), "at most, spinning in between"), cfg.paceSpin; got != want {
			t.Errorf("spinning label printed %v, -pace-spin %v:\n%s", got, want, out.String())
		}
		if cfg.memProfile != "" {
			if fi, err := os.Stat(cfg.memProfile); err != nil || fi.Size() == 0 {
				t.Errorf("memory profile: %v, %v", fi, err)
			}
		}
		if got, want := strings.Contains(out.String(), "| the same, each matched again at once (-rematch) | 3, "), cfg.rematch; got != want {
			t.Errorf("second matches printed %v, rematch %v:\n%s", got, want, out.String())
		}
	}
	bad := cfg
	bad.memProfile = filepath.Join(t.TempDir(), "no such dir", "mem.prof")
	if err := run(bad, &out); err == nil || !strings.Contains(err.Error(), "memory profile") {
		t.Errorf("memory profile in a missing directory: err = %v", err)
	}
	if err := os.WriteFile(trace, []byte("{not json\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := run(cfg, &out); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Fatalf("bad trace: err = %v", err)
	}
	if err := run(config{trace: trace}, &out); err == nil {
		t.Fatal("zero workers accepted")
	}
	spin := cfg
	spin.pace, spin.paceSpin = 0, true
	if err := run(spin, &out); err == nil || !strings.Contains(err.Error(), "-pace-spin needs -pace") {
		t.Errorf("-pace-spin without -pace: err = %v", err)
	}
	spin.pace = 1e3
	prev := runtime.GOMAXPROCS(1)
	err := run(spin, &out)
	runtime.GOMAXPROCS(prev)
	if err == nil || !strings.Contains(err.Error(), "more than one Go core") {
		t.Errorf("-pace-spin on one Go core: err = %v", err)
	}
	for _, bad := range []config{{pace: -1}, {pace: math.NaN()}, {pace: math.Inf(1)}, {holdUps: -time.Second}} {
		c := cfg
		c.pace, c.holdUps = bad.pace, bad.holdUps
		if err := run(c, &out); err == nil || !strings.Contains(err.Error(), "pace finite") {
			t.Errorf("pace %v, holdups %v: err = %v", bad.pace, bad.holdUps, err)
		}
	}
}

// storedOf is a Stored event of worker's rank 0 with a root chain of
// blocks named ids, each id its own local hash.
func storedOf(worker uint64, ids ...uint64) indexer.Event {
	ev := indexer.Event{Kind: indexer.Stored, Worker: indexer.WorkerRank{Worker: worker}, Tier: indexer.TierDevice}
	for _, id := range ids {
		ev.Blocks = append(ev.Blocks, indexer.Block{ID: id, Local: id})
	}
	return ev
}

// TestApplyKeepsTheBacklog checks that apply submits an event only once
// all but backlog of the earlier ones are applied: with a backlog of b,
// the index holds at least i-b+1 of the events before event i is
// submitted. Each event stores one new block of its own worker.
func TestApplyKeepsTheBacklog(t *testing.T) {
	const n = 200
	var events []indexer.Event
	for i := range n {
		events = append(events, storedOf(uint64(i%7), uint64(i+1)))
	}
	for _, backlog := range []int{1, 3} {
		cfg := config{workers: 7, eventThreads: 4, indexShards: 1, backlog: backlog}
		var low []string
		before := func(ix *indexer.Index, i int) {
			if got := ix.Stats().Entries; got < i-backlog+1 {
				low = append(low, fmt.Sprintf("event %d: %d applied", i, got))
			}
		}
		if _, _, _, err := apply(cfg, events, nil, nil, before, 0); err != nil {
			t.Fatal(err)
		}
		if len(low) > 0 {
			t.Errorf("backlog %d: submitted too early: %v", backlog, low)
		}
	}
}

// TestApplyPaces: with a pace of p blocks per second, event i is submitted
// no earlier than the blocks of the events before it take at that rate,
// whether apply sleeps or spins until then.
func TestApplyPaces(t *testing.T) {
	const n, pace = 20, 2000.0 // 20 events of 1 or 2 blocks: at least 14 ms
	var events []indexer.Event
	var ops []int // blocks before event i
	total := 0
	for i := range n {
		ops = append(ops, total)
		ids := []uint64{uint64(2*i + 1), uint64(2*i + 2)}[:1+i%2]
		total += len(ids)
		events = append(events, storedOf(uint64(i), ids...))
	}
	for _, spin := range []bool{false, true} {
		cfg := config{workers: n, eventThreads: 2, indexShards: 1, backlog: n, paceSpin: spin}
		var at []time.Duration
		var t0 time.Time
		ready := func() { t0 = time.Now() } // no later than apply's start
		before := func(_ *indexer.Index, i int) {
			if i < n {
				at = append(at, time.Since(t0))
			}
		}
		_, _, run, err := apply(cfg, events, ready, nil, before, pace)
		if err != nil {
			t.Fatal(err)
		}
		if len(at) != n {
			t.Fatalf("spin %v: before called for %d events, want %d", spin, len(at), n)
		}
		for i, d := range at {
			if due := time.Duration(float64(ops[i]) / pace * float64(time.Second)); d < due {
				t.Errorf("spin %v: event %d submitted %s after the start, before %s", spin, i, d, due)
			}
		}
		if last := time.Duration(float64(ops[n-1]) / pace * float64(time.Second)); run.elapsed < last {
			t.Errorf("spin %v: apply took %s, less than the pace allows (%s)", spin, run.elapsed, last)
		}
	}
}

// TestOSUsage: the page faults counted grow as the process touches new
// memory. (Preemptions cannot be made to happen on demand, so their
// count is not checked here.)
func TestOSUsage(t *testing.T) {
	u := osNow()
	if !u.ok {
		t.Skip("the system does not report resource usage")
	}
	const size = 1 << 20
	mem, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(mem)
	for i := 0; i < size; i += 4096 {
		mem[i] = 1
	}
	d := u.since()
	if !d.ok || d.faults < 1 {
		t.Errorf("after touching %d fresh bytes: %+v, want at least 1 fault", size, d)
	}
}

func TestParseInterrupts(t *testing.T) {
	const two = `           CPU0       CPU1       
  0:         38          0   IO-APIC   2-edge      timer
NMI:          0          0   Non-maskable interrupts
LOC:    5057446    4967893   Local timer interrupts
RES:     385969     409287   Rescheduling interrupts
CAL:    3823533    3706609   Function call interrupts
TLB:    2288810    2272825   TLB shootdowns
HYP:         78         43   Hypervisor callback interrupts
`
	cases := []struct {
		name, in string
		want     irqCounts
		err      bool
	}{
		{"two CPUs", two, irqCounts{2288810 + 2272825, 3823533 + 3706609, 385969 + 409287, 5057446 + 4967893}, false},
		{"one CPU, no description", "TLB: 1\nCAL: 2\nRES: 3\nLOC: 4\n", irqCounts{1, 2, 3, 4}, false},
		{"a row missing", "TLB: 1\nCAL: 2\nRES: 3\n", irqCounts{}, true},
		{"a row twice, another missing", "RES: 1\nCAL: 2\nRES: 3\nLOC: 4\n", irqCounts{}, true},
		{"empty", "", irqCounts{}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := parseInterrupts(strings.NewReader(c.in))
			if (err != nil) != c.err {
				t.Fatalf("error %v, want an error: %t", err, c.err)
			}
			if !c.err && got != c.want {
				t.Errorf("got %v, want %v", got, c.want)
			}
		})
	}
}

// FuzzParseInterrupts: any listing parses without a panic, and a listing
// it accepts had every row of irqKinds; seeds in
// testdata/fuzz/FuzzParseInterrupts.
func FuzzParseInterrupts(f *testing.F) {
	f.Add("TLB: 1 2 TLB shootdowns\nCAL: 3\nRES: 4\nLOC: 5\n")
	f.Fuzz(func(t *testing.T, in string) {
		c, err := parseInterrupts(strings.NewReader(in))
		if err != nil {
			return
		}
		for _, k := range irqKinds {
			if !strings.Contains(in, k+":") {
				t.Fatalf("accepted %q without a %s row: %v", in, k, c)
			}
		}
	})
}
