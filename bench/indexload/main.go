// Command indexload measures the KV block index under a realistic event
// stream: it spreads the requests of a Mooncake trace over simulated workers,
// each with a bounded LRU block cache that turns requests into Stored and
// Removed events (evicting tail blocks first, as vLLM does), then applies
// those events through an indexer.Set while other goroutines match the
// trace's prompts against the index.
//
// It reports sustained blocks applied per second (alone, while the trace's
// requests are matched as they come, and under matches run back to back),
// match latency percentiles, heap bytes per (block, worker) entry, and
// heap allocations per 1 000 blocks applied (the bench's own few among
// them; -memprofile writes where they were made).
// First it measures how often the machine holds up a running thread
// (-holdups): the floor under the tail of match latency on a shared VM.
// With -pace, the replay submits events no faster than a given rate, to
// time its matches at that apply rate rather than at the fastest; it
// sleeps until each event's time, or spins with -pace-spin (so that its
// core does not idle meanwhile: see BENCHMARKS.md on what a VM's
// scheduler does then). With -rematch, the replay matches each prompt a
// second time at once, and times that too: the same match with the
// blocks it reads in cache. Each phase that applies events reports how
// often the system preempted the process's threads and how many page
// faults they took, and, on Linux, the machine's interrupts of a few
// kinds meanwhile (TLB shootdowns, function calls, rescheduling, the
// local timer); -cpuprofile profiles the phases, a match's steps
// included. It owns nothing but its own measurement; it uses only the
// indexer package's public API.
//
// The trace is by default the Mooncake conversation trace shipped gzipped
// in data/mooncake-traces (see data/README.md); run it from the repository
// root, as make bench does:
//
//	go run ./bench/indexload [-trace data/mooncake-traces/conversation_trace.jsonl.gz]
package main

import (
	"bufio"
	"container/list"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kvgate/kvgate/indexer"
	"github.com/kvgate/kvgate/internal/gzfile"
)

// defaultTrace is -trace's default, relative to the repository root.
const defaultTrace = "data/mooncake-traces/conversation_trace.jsonl.gz"

type config struct {
	trace        string
	workers      int
	split        int // sub-blocks per trace block (512 tokens / split tokens each)
	capacity     int // blocks per worker cache
	eventThreads int
	indexShards  int
	queriers     int
	backlog      int
	idleRounds   int
	seed         uint64
	cpuProfile   string
	memProfile   string // where to write the heap profile of allocations, after the alone phase
	holdUps      time.Duration
	pace         float64 // replay: million blocks submitted per second, at most (0: as fast as applied)
	paceSpin     bool    // replay: wait for the pace by spinning, not sleeping
	rematch      bool    // replay: match each prompt again at once, and time that too
}

func main() {
	var cfg config
	flag.StringVar(&cfg.trace, "trace", defaultTrace, "Mooncake trace (JSON lines with hash_ids, gzipped or not); the default is relative to the repository root")
	flag.IntVar(&cfg.workers, "workers", 256, "simulated workers")
	flag.IntVar(&cfg.split, "split", 32, "sub-blocks per 512-token trace block (32 = vLLM's block size 16)")
	flag.IntVar(&cfg.capacity, "capacity", 16384, "KV cache capacity per worker, in blocks")
	flag.IntVar(&cfg.eventThreads, "event-threads", 4, "indexer apply goroutines")
	flag.IntVar(&cfg.indexShards, "index-shards", 1, "shards of the index (see indexer.Options)")
	flag.IntVar(&cfg.queriers, "queriers", 1, "goroutines matching prompts back to back while events apply (the stress phase)")
	flag.IntVar(&cfg.backlog, "backlog", 256, "events submitted and not yet applied, at most: the replay's matches see the index this far behind the trace")
	flag.IntVar(&cfg.idleRounds, "idle-rounds", 1, "times every prompt is matched on the idle index")
	flag.Uint64Var(&cfg.seed, "seed", 1, "seed of the worker assignment")
	flag.StringVar(&cfg.cpuProfile, "cpuprofile", "", "write a CPU profile of the measured phases to this file")
	flag.StringVar(&cfg.memProfile, "memprofile", "", "write a profile of the heap allocations made until the end of the alone phase to this file")
	flag.Float64Var(&cfg.pace, "pace", 0, "submit the replay's events at this many million blocks per second, at most (0: as fast as they apply), to time its matches at a given apply rate")
	flag.BoolVar(&cfg.paceSpin, "pace-spin", false, "with -pace, wait for each event's time by spinning rather than sleeping, so that the submitting (and matching) goroutine does not leave its core idle meanwhile; needs more than one Go core (GOMAXPROCS), as it holds one")
	flag.BoolVar(&cfg.rematch, "rematch", false, "in the replay, match each prompt a second time at once and time that too: the same match with what it reads in cache")
	flag.DurationVar(&cfg.holdUps, "holdups", 2*time.Second, "how long to measure how often the machine holds up a running thread, before the phases (0: not at all)")
	flag.Parse()
	if err := run(cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "indexload:", err)
		os.Exit(1)
	}
}

func run(cfg config, out io.Writer) error {
	if cfg.workers < 1 || cfg.split < 1 || cfg.capacity < 1 || cfg.eventThreads < 1 || cfg.indexShards < 1 || cfg.queriers < 0 || cfg.idleRounds < 1 || cfg.backlog < 1 ||
		cfg.pace < 0 || math.IsNaN(cfg.pace) || math.IsInf(cfg.pace, 0) || cfg.holdUps < 0 {
		return errors.New("workers, split, capacity, event-threads, index-shards, idle-rounds and backlog must be >= 1; queriers, holdups and pace >= 0, pace finite")
	}
	if cfg.paceSpin && (cfg.pace == 0 || runtime.GOMAXPROCS(0) < 2) {
		return errors.New("-pace-spin needs -pace, and more than one Go core (GOMAXPROCS): the replay's goroutine holds one while it spins")
	}
	reqs, err := readTrace(cfg.trace)
	if err != nil {
		return err
	}
	prompts := make([][]uint64, len(reqs))
	for i, r := range reqs {
		prompts[i] = expand(r, cfg.split)
	}
	events, firsts, blocks := simulate(cfg, prompts)
	queries := make([][]uint64, len(prompts))
	for i, p := range prompts {
		local := make([]uint64, len(p))
		for j, id := range p {
			local[j] = localOf(id)
		}
		queries[i] = indexer.SequenceHashes(nil, local)
	}

	fmt.Fprintf(out, "# indexload\n\n")
	fmt.Fprintf(out, "- trace: %s (%d requests, %d prompt blocks of %d tokens)\n", cfg.trace, len(reqs), totalLen(prompts), 512/cfg.split)
	fmt.Fprintf(out, "- workers: %d, cache %d blocks each; %d events carrying %d block operations\n", cfg.workers, cfg.capacity, len(events), blocks)
	fmt.Fprintf(out, "- machine: %s, %d CPUs, GOMAXPROCS %d, %s\n", cpuModel(), runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version())
	fmt.Fprintf(out, "- event threads: %d, concurrent matchers: %d\n", cfg.eventThreads, cfg.queriers)
	if cfg.holdUps > 0 {
		h := measureHoldUps(cfg.holdUps, 1)
		fmt.Fprintf(out, "- hold-ups: a thread repeating the same work (%s at the shortest, a clock read included) was held up (one repeat took %s or more) %.0f times a second, %.2f %% of its time, over %s\n",
			h.work.Round(10*time.Nanosecond), holdUpMin, h.rate(), h.lostPct(), h.total.Round(time.Millisecond))
		if n := runtime.GOMAXPROCS(0); n > 1 {
			h := measureHoldUps(cfg.holdUps, n)
			fmt.Fprintf(out, "- the same with %d such threads at once, one per Go core, as when a writer and a match both run: %.0f times a second, %.2f %% of the time, per thread\n",
				n, h.rate(), h.lostPct())
		}
	}
	fmt.Fprintln(out)
	if cfg.cpuProfile != "" {
		f, err := os.Create(cfg.cpuProfile)
		if err != nil {
			return fmt.Errorf("cpu profile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("cpu profile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	var memProfile *os.File // written after the alone phase
	if cfg.memProfile != "" {
		f, err := os.Create(cfg.memProfile)
		if err != nil {
			return fmt.Errorf("memory profile: %w", err)
		}
		defer f.Close()
		memProfile = f
	}

	// Phase 1: apply alone, measuring throughput and memory: the heap's
	// growth from the empty index (its Set and queues made) to the full one.
	var before runtime.MemStats
	empty := func() {
		runtime.GC()
		runtime.ReadMemStats(&before)
	}
	set, ix, alone, err := apply(cfg, events, empty, nil, nil, 0)
	if err != nil {
		return err
	}
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	stats := ix.Stats()
	perEntry := float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(max(stats.Entries, 1))
	allocs := float64(after.Mallocs-before.Mallocs) / float64(max(blocks, 1)) * 1000
	if memProfile != nil {
		if err := pprof.Lookup("allocs").WriteTo(memProfile, 0); err != nil {
			return fmt.Errorf("memory profile: %w", err)
		}
		if err := memProfile.Close(); err != nil {
			return fmt.Errorf("memory profile: %w", err)
		}
	}

	runtime.KeepAlive(set) // and its index, until measured
	reuse()

	// Phase 2, the replay: apply again into a fresh index, matching each
	// request's prompt when the trace reaches it, before its events (as a
	// router does: it routes the request, then the worker stores).
	var replay latencies
	r := &replayer{queries: queries, firsts: firsts, rematch: cfg.rematch}
	_, _, replayRun, err := apply(cfg, events, nil, nil, r.before, cfg.pace*1e6)
	if err != nil {
		return err
	}
	reuse()
	replay = r.lat
	slices.Sort(replay)
	slices.Sort(r.again)

	// Phase 3, the stress: apply again while matches run back to back.
	var lat latencies
	_, six, busyRun, err := apply(cfg, events, nil, func(ix *indexer.Index, stop <-chan struct{}) {
		lat = measureBusy(ix, queries, cfg.queriers, stop)
	}, nil, 0)
	if err != nil {
		return err
	}

	// Matches on the final, quiescent index: the stress phase's, which
	// holds what the alone phase's did. They come last, as the runtime
	// first gives the system the memory it freed, so that it does not do
	// so, a little at a time from a background goroutine, while they run;
	// a phase after it would take each page it reuses from the system
	// anew (a page fault each).
	debug.FreeOSMemory()
	idle, shapes := measureIdle(six, queries, cfg.idleRounds)
	// The same matches with a thread busy on another core, writing
	// nothing the matches read: what having both cores busy does to
	// them, without a writer.
	var spun latencies
	if runtime.GOMAXPROCS(0) > 1 {
		spinWhile(func() { spun, _ = measureIdle(six, queries, cfg.idleRounds) })
	}

	rate := func(d time.Duration) string { return fmt.Sprintf("%.2f M/s", float64(blocks)/d.Seconds()/1e6) }
	fmt.Fprintf(out, "| measure | value |\n|---|---|\n")
	fmt.Fprintf(out, "| blocks applied per second, alone | %s (%d ops in %s) |\n", rate(alone.elapsed), blocks, alone.elapsed.Round(time.Millisecond))
	paced := ""
	if cfg.pace > 0 {
		paced = fmt.Sprintf(", events submitted at %.2f M blocks/s at most", cfg.pace)
		if cfg.paceSpin {
			paced += ", spinning in between"
		}
	}
	fmt.Fprintf(out, "| blocks applied per second, replay (each request matched before its events%s) | %s (%d ops in %s) |\n", paced, rate(replayRun.elapsed), blocks, replayRun.elapsed.Round(time.Millisecond))
	fmt.Fprintf(out, "| matches during the replay | %s |\n", replay)
	if cfg.rematch {
		fmt.Fprintf(out, "| the same, each matched again at once (-rematch) | %s |\n", r.again)
	}
	fmt.Fprintf(out, "| blocks applied per second, stress (%d goroutines matching back to back) | %s (%d ops in %s) |\n", cfg.queriers, rate(busyRun.elapsed), blocks, busyRun.elapsed.Round(time.Millisecond))
	fmt.Fprintf(out, "| matches during the stress | %s |\n", lat)
	fmt.Fprintf(out, "| matches on the idle index | %s |\n", idle)
	if spun != nil {
		fmt.Fprintf(out, "| the same, a thread spinning meanwhile (another core busy) | %s |\n", spun)
	}
	if alone.os.ok && replayRun.os.ok && busyRun.os.ok {
		fmt.Fprintf(out, "| preemptions (involuntary context switches) / page faults, alone, replay, stress | %d, %d, %d / %d, %d, %d |\n",
			alone.os.preempted, replayRun.os.preempted, busyRun.os.preempted, alone.os.faults, replayRun.os.faults, busyRun.os.faults)
	}
	if alone.os.irqOK && replayRun.os.irqOK && busyRun.os.irqOK {
		fmt.Fprintf(out, "| interrupts, all CPUs (TLB shootdowns / function calls / rescheduling / local timer), alone, replay, stress |")
		for k := range irqKinds {
			if k > 0 {
				fmt.Fprintf(out, " /")
			}
			fmt.Fprintf(out, " %d, %d, %d", alone.os.irq[k], replayRun.os.irq[k], busyRun.os.irq[k])
		}
		fmt.Fprintf(out, " |\n")
	}
	fmt.Fprintf(out, "| final index | %d shards, %d worker ranks, %d nodes, %d (block, worker) entries |\n", cfg.indexShards, stats.Workers, stats.Nodes, stats.Entries)
	fmt.Fprintf(out, "| heap bytes per (block, worker) entry | %.1f |\n", perEntry)
	fmt.Fprintf(out, "| heap allocations per 1 000 blocks applied, alone (the index's and its Set's) | %.2f |\n", allocs)
	fmt.Fprintf(out, "\nIdle matches by how many distinct device prefix lengths the matched ranks have:\n\n")
	fmt.Fprintf(out, "| distinct lengths | matches | median ranks | median prompt blocks | p50 | p99 |\n|---|---|---|---|---|---|\n")
	for _, g := range groupShapes(shapes) {
		fmt.Fprintf(out, "| %s | %d | %d | %d | %s | %s |\n", g.name, len(g.lat), g.ranks, g.blocks, g.lat.pct(50), g.lat.pct(99))
	}
	return nil
}

// shape is one idle match: its duration, and what made it long.
type shape struct {
	d       time.Duration
	blocks  int // prompt blocks
	ranks   int // overlaps returned
	lengths int // distinct device prefix lengths among them
}

// shapeGroup is the idle matches whose distinct lengths fall in one range.
type shapeGroup struct {
	name          string
	lat           latencies // sorted
	ranks, blocks int       // medians
}

// groupShapes groups shapes by distinct lengths: 0-1, 2, 3-4, 5-8, 9+.
func groupShapes(shapes []shape) []shapeGroup {
	bounds := []struct {
		name   string
		lo, hi int
	}{{"0-1", 0, 1}, {"2", 2, 2}, {"3-4", 3, 4}, {"5-8", 5, 8}, {"9+", 9, 1 << 30}}
	var out []shapeGroup
	for _, b := range bounds {
		var g shapeGroup
		var ranks, blocks []int
		for _, sh := range shapes {
			if sh.lengths >= b.lo && sh.lengths <= b.hi {
				g.lat = append(g.lat, sh.d)
				ranks, blocks = append(ranks, sh.ranks), append(blocks, sh.blocks)
			}
		}
		if len(g.lat) == 0 {
			continue
		}
		slices.Sort(g.lat)
		slices.Sort(ranks)
		slices.Sort(blocks)
		g.name, g.ranks, g.blocks = b.name, ranks[len(ranks)/2], blocks[len(blocks)/2]
		out = append(out, g)
	}
	return out
}

// traceRequest is one line of a Mooncake trace.
type traceRequest struct {
	HashIDs []uint64 `json:"hash_ids"`
}

// readTrace reads a Mooncake trace, gzipped or not (by its magic bytes, or
// a name ending in .gz).
func readTrace(path string) ([]traceRequest, error) {
	r, err := gzfile.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open trace: %w", err)
	}
	defer r.Close()
	var reqs []traceRequest
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for line := 1; sc.Scan(); line++ {
		if len(strings.TrimSpace(sc.Text())) == 0 {
			continue
		}
		var r traceRequest
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, fmt.Errorf("trace %s line %d: %w", path, line, err)
		}
		reqs = append(reqs, r)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read trace %s: %w", path, err)
	}
	if len(reqs) == 0 {
		return nil, fmt.Errorf("trace %s has no requests", path)
	}
	return reqs, nil
}

// expand turns trace hash ids into block ids: split sub-blocks per id. A
// trace id already identifies content and position (equal ids at the same
// position are the same prefix), so the block id can serve as the engine id.
func expand(r traceRequest, split int) []uint64 {
	ids := make([]uint64, 0, len(r.HashIDs)*split)
	for _, h := range r.HashIDs {
		for j := range split {
			ids = append(ids, h*uint64(split)+uint64(j)+1)
		}
	}
	return ids
}

// localOf is the local hash of a block: LocalHash of 16 tokens derived from
// the block id, so that different blocks have different content.
func localOf(id uint64) uint64 {
	var toks [16]uint32
	x := id
	for i := range toks {
		x = x*6364136223846793005 + 1442695040888963407
		toks[i] = uint32(x>>33) % 128000
	}
	return indexer.LocalHash(toks[:], indexer.BaseSeed, nil)
}

// lru is one simulated worker's KV cache.
type lru struct {
	order *list.List // front = most recently used block id
	at    map[uint64]*list.Element
}

// simulate assigns each prompt to a random worker and returns the events its
// cache publishes, in order, the index of each prompt's first event (where
// its events would start: prompts without events have none), and the number
// of block operations in them.
func simulate(cfg config, prompts [][]uint64) ([]indexer.Event, []int, int) {
	rng := rand.New(rand.NewPCG(cfg.seed, 0x6b7667617465))
	caches := make([]lru, cfg.workers)
	for i := range caches {
		caches[i] = lru{order: list.New(), at: make(map[uint64]*list.Element)}
	}
	var events []indexer.Event
	firsts := make([]int, len(prompts))
	ops := 0
	for r, p := range prompts {
		firsts[r] = len(events)
		w := rng.IntN(cfg.workers)
		c := &caches[w]
		wr := indexer.WorkerRank{Worker: uint64(w)}
		miss := 0
		for miss < len(p) {
			if _, ok := c.at[p[miss]]; !ok {
				break
			}
			miss++
		}
		if miss < len(p) {
			ev := indexer.Event{Kind: indexer.Stored, Worker: wr, Tier: indexer.TierDevice}
			if miss > 0 {
				ev.Parent, ev.HasParent = p[miss-1], true
			}
			for _, id := range p[miss:] {
				ev.Blocks = append(ev.Blocks, indexer.Block{ID: id, Local: localOf(id)})
			}
			events = append(events, ev)
			ops += blockOps(ev)
		}
		// Touch the tail first, so the prompt's head is the most recent and
		// eviction drops children before their parents.
		for i := len(p) - 1; i >= 0; i-- {
			if e, ok := c.at[p[i]]; ok {
				c.order.MoveToFront(e)
			} else {
				c.at[p[i]] = c.order.PushFront(p[i])
			}
		}
		if c.order.Len() > cfg.capacity {
			ev := indexer.Event{Kind: indexer.Removed, Worker: wr, Tier: indexer.TierDevice}
			for c.order.Len() > cfg.capacity {
				id := c.order.Remove(c.order.Back()).(uint64)
				delete(c.at, id)
				ev.IDs = append(ev.IDs, id)
			}
			events = append(events, ev)
			ops += blockOps(ev)
		}
	}
	return events, firsts, ops
}

// blockOps is the block operations of ev: its stored blocks or removed
// ids.
func blockOps(ev indexer.Event) int { return len(ev.Blocks) + len(ev.IDs) }

// replayer matches the trace's prompts in trace order as the replay
// reaches them: each before the first of its events is submitted.
type replayer struct {
	queries [][]uint64
	firsts  []int // see simulate
	next    int   // the next prompt to match
	buf     []indexer.Overlap
	lat     latencies
	rematch bool      // match each prompt again at once, timed in again
	again   latencies // the second matches
}

// before matches, on ix, every prompt not yet matched whose events start
// at or before event i (len(events): all that are left).
func (r *replayer) before(ix *indexer.Index, i int) {
	for ; r.next < len(r.queries) && r.firsts[r.next] <= i; r.next++ {
		r.lat = append(r.lat, r.match(ix, r.queries[r.next]))
		if r.rematch {
			r.again = append(r.again, r.match(ix, r.queries[r.next]))
		}
	}
}

// match matches q on ix, into r.buf, and returns how long it took.
func (r *replayer) match(ix *indexer.Index, q []uint64) time.Duration {
	t0 := time.Now()
	r.buf = ix.Match(q, r.buf[:0])
	return time.Since(t0)
}

// phaseRun is how one phase of apply went: how long it took, and what
// the system did to the process meanwhile.
type phaseRun struct {
	elapsed time.Duration
	os      osUsage
}

// osUsage counts what the system did to the process: how often it took a
// core from one of its threads that could have gone on running
// (involuntary context switches), and how many pages its threads touched
// for the first time (minor page faults). Both stall the thread: a match
// held up takes that much longer, a writer publishes its changes that
// much later.
// It also counts, where Linux tells (/proc/interrupts), the machine's
// interrupts of a few kinds, summed over its CPUs: each stops whatever
// thread runs on the CPU it hits, and on a VM costs more than on bare
// metal.
type osUsage struct {
	preempted, faults int64
	ok                bool // the system reported them
	irq               irqCounts
	irqOK             bool // /proc/interrupts was read
}

// irqCounts are interrupts of some kinds, summed over the CPUs (see
// irqKinds).
type irqCounts [len(irqKinds)]int64

// irqKinds are the /proc/interrupts rows counted: TLB shootdowns,
// function calls (another CPU asking this one to run something),
// rescheduling (to wake a thread), the local timer.
var irqKinds = [...]string{"TLB", "CAL", "RES", "LOC"}

func osNow() osUsage {
	var u osUsage
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err == nil {
		u.preempted, u.faults, u.ok = int64(ru.Nivcsw), int64(ru.Minflt), true
	}
	if f, err := os.Open("/proc/interrupts"); err == nil {
		u.irq, err = parseInterrupts(f)
		u.irqOK = err == nil
		f.Close()
	}
	return u
}

// parseInterrupts sums, from a Linux /proc/interrupts listing, each row
// of irqKinds over the CPUs: a row is its name and a colon, then a count
// per CPU, then a description.
func parseInterrupts(r io.Reader) (irqCounts, error) {
	var c irqCounts
	var seen [len(irqKinds)]bool
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		name, rest, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		if !ok {
			continue
		}
		k := slices.Index(irqKinds[:], name)
		if k < 0 {
			continue
		}
		if seen[k] {
			return c, fmt.Errorf("read interrupts: row %s twice", name)
		}
		seen[k] = true
		for _, f := range strings.Fields(rest) {
			n, err := strconv.ParseInt(f, 10, 64)
			if err != nil {
				break // the description
			}
			c[k] += n
		}
	}
	if err := sc.Err(); err != nil {
		return c, fmt.Errorf("read interrupts: %w", err)
	}
	if i := slices.Index(seen[:], false); i >= 0 {
		return c, fmt.Errorf("read interrupts: no row %s", irqKinds[i])
	}
	return c, nil
}

// since returns what happened between u, taken earlier, and now.
func (u osUsage) since() osUsage {
	now := osNow()
	d := osUsage{preempted: now.preempted - u.preempted, faults: now.faults - u.faults, ok: u.ok && now.ok, irqOK: u.irqOK && now.irqOK}
	for k := range d.irq {
		d.irq[k] = now.irq[k] - u.irq[k]
	}
	return d
}

// apply submits events to a fresh Set and waits until all are applied,
// and closes the Set before it returns (its index stays readable),
// keeping at most cfg.backlog submitted and not yet applied (so that a
// match by before sees the index at most that far behind the trace, as
// where events are applied as fast as they come), calling ready (when
// given) once the Set and its empty index are made,
// running during(ix, stop) concurrently when given, and calling before(ix,
// i) (when given) before submitting event i and, with i = len(events),
// after the last.
//
// With pace > 0 (blocks per second), it submits each event no earlier
// than the blocks before it take at that rate, sleeping until then, or
// spinning with cfg.paceSpin.
func apply(cfg config, events []indexer.Event, ready func(), during func(*indexer.Index, <-chan struct{}), before func(*indexer.Index, int), pace float64) (*indexer.Set, *indexer.Index, phaseRun, error) {
	set := indexer.NewSet(indexer.Options{EventThreads: cfg.eventThreads, IndexShards: cfg.indexShards, QueueLen: 4096})
	defer set.Close() // its goroutines; the caller may keep the Set
	ix, err := set.Index(indexer.Key{Model: "trace", Tenant: indexer.DefaultTenant}, 16)
	if err != nil {
		return nil, nil, phaseRun{}, err
	}
	if ready != nil {
		ready()
	}
	stop := make(chan struct{})
	var bg sync.WaitGroup
	stopDuring := sync.OnceFunc(func() {
		close(stop)
		bg.Wait()
	})
	defer stopDuring() // on every return, before the Set closes
	if during != nil {
		bg.Go(func() { during(ix, stop) })
	}
	var failed, applied atomic.Int64
	room := make(chan struct{}, 1) // a token after each event applied
	done := func(_ indexer.ApplyResult, err error) {
		if err != nil {
			failed.Add(1)
		}
		applied.Add(1)
		select {
		case room <- struct{}{}:
		default:
		}
	}
	ctx := context.Background()
	os0 := osNow()
	start := time.Now()
	wait := func(i int) { // until fewer than backlog of events[:i] are left
		for int64(i)-applied.Load() >= int64(cfg.backlog) {
			<-room
		}
	}
	ops := 0
	for i, ev := range events {
		wait(i)
		if pace > 0 {
			due := start.Add(time.Duration(float64(ops) / pace * 1e9))
			if cfg.paceSpin {
				for time.Now().Before(due) {
				}
			} else if d := time.Until(due); d > 0 {
				time.Sleep(d)
			}
			ops += blockOps(ev)
		}
		if before != nil {
			before(ix, i)
		}
		if err := set.Submit(ctx, ix, ev, done); err != nil {
			return nil, nil, phaseRun{}, err
		}
	}
	if before != nil {
		wait(len(events))
		before(ix, len(events))
	}
	for w := range cfg.workers {
		if err := set.Do(ctx, uint64(w), func() {}); err != nil {
			return nil, nil, phaseRun{}, err
		}
	}
	run := phaseRun{elapsed: time.Since(start), os: os0.since()}
	stopDuring()
	if n := failed.Load(); n > 0 {
		return nil, nil, phaseRun{}, fmt.Errorf("%d events failed to apply", n)
	}
	return set, ix, run, nil
}

// holdUpMin is the shortest repeat of the work counted as a hold-up.
const holdUpMin = 8 * time.Microsecond

// holdUps is what holdUpsOf measured.
type holdUps struct {
	n     int           // repeats that took holdUpMin or longer
	lost  time.Duration // their time, less the work's usual time
	total time.Duration
	work  time.Duration // the shortest repeat
	// threads is how many threads measured (see measureHoldUps).
	threads int
}

// measureHoldUps measures, for d, how often the machine holds up a thread
// doing fixed work: interrupts, the hypervisor's steal, the Go runtime. A
// match held up takes that much longer, so these set a floor to the tail
// of match latency. With threads > 1, that many threads do so at once,
// each locked to its goroutine (see sumHoldUps): a VM's hypervisor may
// hold threads up more often when all its cores are busy.
func measureHoldUps(d time.Duration, threads int) holdUps {
	all := make([]holdUps, threads)
	var wg sync.WaitGroup
	for i := range all {
		wg.Go(func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			x := uint64(1)
			all[i] = holdUpsOf(d, time.Now, func() { x = fixedWork(x) })
			runtime.KeepAlive(x)
		})
	}
	wg.Wait()
	return sumHoldUps(all)
}

// fixedWork is the same work each time, a few hundred nanoseconds of
// arithmetic that touches no memory: 200 steps of a linear congruential
// generator from x.
func fixedWork(x uint64) uint64 {
	for range 200 {
		x = x*6364136223846793005 + 1442695040888963407
	}
	return x
}

// sumHoldUps sums the hold-ups of threads measured at once, one or more:
// their counts and lost time, the shortest repeat of any, the longest
// total.
func sumHoldUps(all []holdUps) holdUps {
	sum := holdUps{work: time.Duration(math.MaxInt64)}
	for _, h := range all {
		sum.n += h.n
		sum.lost += h.lost
		sum.total = max(sum.total, h.total)
		sum.work = min(sum.work, h.work)
		sum.threads += h.threads
	}
	return sum
}

// rate is how many times a second each thread was held up, on average.
func (h holdUps) rate() float64 { return float64(h.n) / float64(h.threads) / h.total.Seconds() }

// lostPct is the share of each thread's time lost to hold-ups, on
// average, in per cent.
func (h holdUps) lostPct() float64 {
	return 100 * h.lost.Seconds() / float64(h.threads) / h.total.Seconds()
}

// holdUpsOf runs work back to back for d, timed by now, and counts the
// repeats that took holdUpMin or longer. It allocates nothing.
func holdUpsOf(d time.Duration, now func() time.Time, work func()) holdUps {
	h := holdUps{work: time.Duration(math.MaxInt64), threads: 1}
	var long time.Duration // the time of the hold-ups
	start := now()
	for prev := start; ; {
		work()
		t := now()
		gap := t.Sub(prev)
		prev = t
		h.work = min(h.work, gap)
		if gap >= holdUpMin {
			h.n++
			long += gap
		}
		if h.total = t.Sub(start); h.total >= d {
			break
		}
	}
	h.lost = long - time.Duration(h.n)*h.work
	return h
}

// latencies collects match durations.
type latencies []time.Duration

func (l latencies) n() int { return len(l) }

// String gives the count and percentiles of l, which must be sorted.
func (l latencies) String() string {
	return fmt.Sprintf("%d, p50 %s, p99 %s, p99.9 %s, max %s", l.n(), l.pct(50), l.pct(99), l.pct(99.9), l.pct(100))
}

func (l latencies) pct(p float64) time.Duration {
	if len(l) == 0 {
		return 0
	}
	i := int(float64(len(l)-1) * p / 100)
	return l[i]
}

func measureBusy(ix *indexer.Index, queries [][]uint64, n int, stop <-chan struct{}) latencies {
	if n == 0 {
		<-stop
		return nil
	}
	results := make([]latencies, n)
	var wg sync.WaitGroup
	for g := range n {
		wg.Go(func() {
			buf := make([]indexer.Overlap, 0, 256)
			var l latencies
			for i := g; ; i += n {
				select {
				case <-stop:
					results[g] = l
					return
				default:
				}
				q := queries[i%len(queries)]
				t0 := time.Now()
				buf = ix.Match(q, buf[:0])
				l = append(l, time.Since(t0))
			}
		})
	}
	wg.Wait()
	all := slices.Concat(results...)
	slices.Sort(all)
	return all
}

// reuse makes the memory of the indexes no longer used free for the next
// phase's index to reuse (a garbage collection), as a long-running
// router's index reuses what it let go. Else the next phase's index grows
// into memory the process has not touched yet until the collector runs,
// and its page faults make the system interrupt the other CPUs that run
// the process (TLB shootdowns and function calls: see the interrupts
// row), which stops a match running there. The memory is not returned to
// the system: taking it back would fault again.
func reuse() { runtime.GC() }

// spinWhile runs f while a thread of its own spins, doing fixed work
// that touches no memory: the core it takes is busy, as a writer's is,
// and the other cores keep their caches. It needs more than one Go core
// (GOMAXPROCS), as the spinning goroutine holds one.
func spinWhile(f func()) {
	var stop atomic.Bool
	started := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		close(started)
		x := uint64(1)
		for !stop.Load() {
			x = fixedWork(x)
		}
		runtime.KeepAlive(x)
	}()
	<-started
	defer func() {
		stop.Store(true)
		<-done
	}()
	f()
}

// measureIdle matches every query rounds times on ix and returns the
// durations, sorted, and the shape of each match.
func measureIdle(ix *indexer.Index, queries [][]uint64, rounds int) (latencies, []shape) {
	buf := make([]indexer.Overlap, 0, 256)
	l := make(latencies, 0, rounds*len(queries))
	shapes := make([]shape, 0, rounds*len(queries))
	lengths := make(map[int]bool)
	for range rounds {
		for _, q := range queries {
			t0 := time.Now()
			buf = ix.Match(q, buf[:0])
			d := time.Since(t0)
			l = append(l, d)
			clear(lengths)
			for _, o := range buf {
				lengths[int(o.Device)] = true
			}
			shapes = append(shapes, shape{d: d, blocks: len(q), ranks: len(buf), lengths: len(lengths)})
		}
	}
	slices.Sort(l)
	return l, shapes
}

func totalLen(p [][]uint64) int {
	n := 0
	for _, x := range p {
		n += len(x)
	}
	return n
}

func cpuModel() string {
	data, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	for line := range strings.Lines(string(data)) {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return runtime.GOARCH
}
