package indexer

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Tier is a set of KV cache storage tiers, as a bit mask.
type Tier uint8

// The storage tiers. External storage (network, shared pools) is reported
// together with disk.
const (
	TierDevice Tier = 1 << iota // GPU / NPU memory (G1)
	TierHost                    // host memory, pinned or not (G2)
	TierDisk                    // local disk, NVMe, external storage (G3)

	// AllTiers selects every tier, e.g. in a Cleared event.
	AllTiers = TierDevice | TierHost | TierDisk
)

// String returns the tier's name in the dump format: "device",
// "host_pinned", "disk", or a "|"-joined list for several tiers.
func (t Tier) String() string {
	switch t {
	case TierDevice:
		return "device"
	case TierHost:
		return "host_pinned"
	case TierDisk:
		return "disk"
	case 0:
		return "none"
	}
	s := ""
	for _, one := range []Tier{TierDevice, TierHost, TierDisk} {
		if t&one != 0 {
			if s != "" {
				s += "|"
			}
			s += one.String()
		}
	}
	return s
}

// single reports whether t names exactly one known tier.
func (t Tier) single() bool { return t == TierDevice || t == TierHost || t == TierDisk }

// WorkerRank identifies one data-parallel rank of a worker (an engine
// instance). Every rank has its own KV cache.
type WorkerRank struct {
	Worker uint64 // the worker's instance id
	Rank   uint32 // its data-parallel rank
}

func (w WorkerRank) String() string { return fmt.Sprintf("worker %d rank %d", w.Worker, w.Rank) }

// Block is one stored KV block: the engine's opaque id for it, and the
// router's own local hash of its tokens (LocalHash).
type Block struct {
	Hash  uint64 // engine block id; used only to link parents and to remove
	Local uint64 // LocalHash of the block's tokens
}

// EventKind says what an Event does.
type EventKind uint8

// The kinds of Event.
const (
	Stored  EventKind = iota + 1 // Blocks were stored under Parent
	Removed                      // Hashes were evicted from Tier
	Cleared                      // every block on the tiers in Tier was dropped
)

func (k EventKind) String() string {
	switch k {
	case Stored:
		return "stored"
	case Removed:
		return "removed"
	case Cleared:
		return "cleared"
	}
	return fmt.Sprintf("EventKind(%d)", uint8(k))
}

// Event is one change to the KV cache of one worker rank, already decoded
// from its wire format and hashed.
type Event struct {
	Kind   EventKind
	Worker WorkerRank
	// Tier is the tier of a Stored or Removed event (exactly one tier), or
	// the tiers a Cleared event empties (any non-empty mask).
	Tier Tier
	// Parent is the engine id of the block before Blocks[0]; HasParent is
	// false for a sequence that starts at the root.
	Parent    uint64
	HasParent bool
	Blocks    []Block  // Stored: in order, each the child of the previous
	Hashes    []uint64 // Removed: engine ids
	// ByID marks a Stored event that names blocks by engine id only, with
	// no tokens (Mooncake's store publisher reports objects that way): Tier
	// is added to those of Hashes the worker rank already holds, on any
	// tier; the others are counted Unknown. Parent and Blocks are unused.
	ByID bool
}

// Errors returned by Apply. They leave the index unchanged.
var (
	// ErrUnknownParent: a Stored event names a parent block the worker rank
	// does not hold. The event cannot be placed; for a worker with a replay
	// endpoint it signals missed events.
	ErrUnknownParent = errors.New("unknown parent block")
	// ErrBadEvent: the event is malformed (unknown kind, tier, ...).
	ErrBadEvent = errors.New("malformed event")
)

// ApplyResult counts what an applied event did, for metrics.
type ApplyResult struct {
	Stored  int // (block, tier) entries added
	Removed int // (block, tier) entries removed
	// Unknown counts removals of blocks the worker rank did not hold on
	// that tier: benign after a dump recovery or a lost Stored event.
	Unknown int
}

// Overlap is how far a worker rank holds a prompt's prefix, in blocks, per
// tier. The counts are cumulative: Device is the longest prefix held in
// device memory; Host the longest prefix held in device or host memory;
// Disk the longest prefix held in any tier. So Device <= Host <= Disk.
//
// The counts are int32, so that an Overlap is 32 bytes: a match writes one
// per rank holding the prompt's first block, hundreds in a large fleet.
type Overlap struct {
	Worker WorkerRank
	Device int32
	Host   int32
	Disk   int32
	// Blocks is how many engine ids the rank holds in all, of any prompt
	// and on any tier (see RankBlocks), as of the match.
	Blocks int32
}

// Tokens returns the overlap in tokens, for blocks of blockSize tokens.
func (o Overlap) Tokens(blockSize int) (device, host, disk int) {
	return int(o.Device) * blockSize, int(o.Host) * blockSize, int(o.Disk) * blockSize
}

// writeChunk is how many blocks a writer processes per lock hold, and the
// step that reaches it (see lock.go), so a long event or a worker removal
// never stalls matches for long. Readers may
// observe a Stored or Removed event part-applied, which is the same state as
// applying its blocks one by one: never a torn one.
const writeChunk = 64

// Index is the KV block index of one (model, tenant): which worker ranks
// hold which blocks, on which tiers. It is safe for concurrent use: matches
// run concurrently with each other and with event application. Events of
// one worker rank must be applied in order, as a Set does. The index
// itself makes the calls that change a shard (Apply, RemoveWorker,
// RemoveWorkerRank) take turns (see shard.write), so a writer may resize
// a rank's table of engine ids without the shard's lock.
//
// An index is split by worker id into shards, each a whole prefix tree
// behind its own lock, so that events of workers in different shards apply
// in parallel: a Set's apply goroutines each feed one shard when the shard
// count divides theirs. A match walks every shard; a block held by workers
// of several shards is in each.
type Index struct {
	blockSize int
	shards    []*shard
}

// NewIndex returns an empty index of one shard for blocks of blockSize
// tokens.
func NewIndex(blockSize int) *Index { return NewShardedIndex(blockSize, 1) }

// NewShardedIndex returns an empty index of n shards (at least one) for
// blocks of blockSize tokens. With as many shards as Go uses cores
// (GOMAXPROCS, now) or more, writers give up their core now and then;
// with fewer, matches may be handed to writers (see shard.spare).
func NewShardedIndex(blockSize, n int) *Index {
	ix := &Index{blockSize: blockSize, shards: make([]*shard, max(n, 1))}
	spare := len(ix.shards) < runtime.GOMAXPROCS(0)
	if spare {
		// Shards that hand matches over read the CPU (lock.go): find out
		// how once, here, rather than in the first writer, holding the
		// lock.
		currentCPU()
	}
	for i := range ix.shards {
		ix.shards[i] = newShard()
		ix.shards[i].spare = spare
	}
	return ix
}

// BlockSize returns the number of tokens per block.
func (ix *Index) BlockSize() int { return ix.blockSize }

// Shards returns the number of shards.
func (ix *Index) Shards() int { return len(ix.shards) }

// shardFor returns the shard of every rank of worker.
func (ix *Index) shardFor(worker uint64) *shard {
	if len(ix.shards) == 1 {
		return ix.shards[0]
	}
	return ix.shards[shardOf(worker, len(ix.shards))]
}

// Apply applies one event. On error the index is unchanged.
func (ix *Index) Apply(ev Event) (ApplyResult, error) {
	return ix.shardFor(ev.Worker.Worker).apply(ev)
}

// Match walks the prefix given by seq (the prompt's sequence hashes, see
// SequenceHashes) and appends to dst one Overlap per worker rank holding at
// least its first block, shard by shard. It returns the extended slice.
func (ix *Index) Match(seq []uint64, dst []Overlap) []Overlap {
	for _, s := range ix.shards {
		dst = s.match(seq, dst)
	}
	return dst
}

// MatchPhases is how long one match of one shard of an index spent in
// each of its phases (see Index.ObservePhases).
type MatchPhases struct {
	Wait  time.Duration // for the shard's lock, held by a writer, or for the writer to run the match (near 0 when the lock was free)
	Start time.Duration // finding the first block and its holders, the candidates
	Walk  time.Duration // following the candidates along the prompt
	Emit  time.Duration // appending their Overlaps
	Ranks int           // Overlaps appended (0: no rank holds the first block; Walk and Emit are 0)
	Path  MatchPath     // how the match got the lock, or was run (PathHanded: the writer holding the lock ran it; see lock.go, Stats.Handed)
	// Again counts the times a match without the lock (a binary built
	// with -tags unlockedmatch: see UnlockedMatches) faulted on a torn
	// read and ran again; those runs are booked as its wait.
	Again int
}

// MatchPath is how a match of one shard got the shard's lock, or was run
// by the writer holding it (see lock.go).
type MatchPath uint8

// The paths of a match.
const (
	PathFree       MatchPath = iota // the lock was free (or, built with -tags unlockedmatch, not taken)
	PathHanded                      // a writer ran it
	PathTakenBack                   // handed over, it found the lock free first and ran itself
	PathHandGaveUp                  // handed over, no writer ran it in time: it waited for the lock
	PathSameCPU                     // it ran on the writer's CPU: it waited for the lock
	PathBusy                        // another match was handed over, or matches are not: it waited for the lock
	NPaths                          // the number of paths
)

func (p MatchPath) String() string {
	if p < NPaths {
		return [NPaths]string{"free", "handed", "taken back", "hand gave up", "same CPU", "busy"}[p]
	}
	return fmt.Sprintf("MatchPath(%d)", uint8(p))
}

// The phases, as indexes of phaseClock's laps.
const (
	phaseWait = iota
	phaseStart
	phaseWalk
	phaseEmit
	nPhases
)

// ObservePhases makes every later match call f with its phases, once per
// shard, on the matching goroutine, while the shard's lock is no longer
// held (nil: stop). It is a measuring instrument for benchmarks: only a
// binary built with -tags matchphases times matches; others ignore f and
// ObservePhases reports false.
func (ix *Index) ObservePhases(f func(MatchPhases)) bool {
	ok := false
	for _, s := range ix.shards {
		ok = s.phases.set(f)
	}
	return ok
}

// CurrentCPU returns the number of the CPU the calling thread runs on, as
// the index reads it for its hand-over rule (see lock.go), or -1 where
// the system does not tell. It is a measuring instrument for benchmarks.
func CurrentCPU() int32 { return currentCPU() }

// UnlockedMatches reports whether the binary was built with -tags
// unlockedmatch, whose matches take no lock and may answer wrong (see
// unlocked.go): a measuring instrument for benchmarks.
func UnlockedMatches() bool { return unlockedMatches }

// MatchTokens hashes the full blocks of tokens (for adapter lora, "" for the
// base model) and matches them; see Match.
func (ix *Index) MatchTokens(tokens []uint32, lora string, dst []Overlap) []Overlap {
	local := LocalHashes(make([]uint64, 0, len(tokens)/max(ix.blockSize, 1)), tokens, ix.blockSize, LoRASeed(lora), nil)
	return ix.Match(SequenceHashes(local[:0:0], local), dst)
}

// RemoveWorker drops every block of every rank of worker.
func (ix *Index) RemoveWorker(worker uint64) { ix.shardFor(worker).removeWorker(worker) }

// RemoveWorkerRank drops every block of one worker rank. Matches never see
// the rank half-removed.
func (ix *Index) RemoveWorkerRank(wr WorkerRank) { ix.shardFor(wr.Worker).removeWorkerRank(wr) }

// BlockCounts returns how many engine ids each worker rank holds, of
// blocks on any tier (see Overlap.Blocks).
func (ix *Index) BlockCounts() map[WorkerRank]int {
	out := make(map[WorkerRank]int)
	for _, s := range ix.shards {
		s.blockCounts(out)
	}
	return out
}

// RankBlocks returns how many engine ids one worker rank holds (see
// BlockCounts).
func (ix *Index) RankBlocks(wr WorkerRank) int { return ix.shardFor(wr.Worker).rankBlocks(wr) }

// Stats describes the size of an index.
type Stats struct {
	Workers int // worker ranks with state
	Nodes   int // block positions, counted once per shard that has them
	Entries int // (block, worker rank) pairs, counted as the ranks' engine ids
	// Handed counts the matches that found a shard's lock held by a
	// writer and were run by it, since the index was made (see lock.go).
	Handed int64
}

// Stats returns the index's current size, and how many matches its
// writers ran.
func (ix *Index) Stats() Stats {
	var st Stats
	for _, s := range ix.shards {
		t := s.stats()
		st.Workers += t.Workers
		st.Nodes += t.Nodes
		st.Entries += t.Entries
		st.Handed += t.Handed
	}
	return st
}

// shard is the index of the worker ranks of some workers (see Index): a
// runTree behind one RWMutex. Matches run concurrently with each other and
// with event application; the calls that change it take turns on write.
type shard struct {
	// What matches read and only construction and ObservePhases write,
	// a cache line away from what writers or matches write at nearly
	// every step or match (see cacheLine).
	//
	// spare is set where the index has fewer shards than Go uses cores,
	// so that a core stays free for matches and requests while the
	// writers of every shard run: a match finding mu held by a writer
	// then hands itself to the writer, and writers spin for mu instead of
	// sleeping (see lock.go). Where it is not set, the writers of all
	// shards can keep every core busy, and Go takes a core from a running
	// goroutine only after 10 ms: writers then give up their core now and
	// then (see relax), so that a match of another shard, or a request,
	// does not wait for a writer's whole event, and nothing spins, which
	// could keep the goroutine it waits for off the cores.
	spare bool
	// handWait bounds how long a handed match waits for a writer to run
	// it, stallWait how long it waits for one that finishes no step.
	handWait, stallWait time.Duration
	// onCPU returns the CPU the calling thread runs on (currentCPU; tests
	// set their own).
	onCPU func() int32
	// now reads the clock for a handed match's and a spinning writer's
	// timer (time.Now; tests set their own).
	now func() time.Time
	// phases times matches (see Index.ObservePhases).
	phases phaseHook
	tree   *runTree
	_      [cacheLine]byte

	// What both writers and matches write.
	mu sync.RWMutex
	// waiting counts matches blocked on mu: a writer holding it gives it
	// up early (see relax).
	waiting atomic.Int32
	// handed is the match handed to the writer holding mu, if any.
	handed atomic.Pointer[matcher]
	_      [cacheLine]byte

	// What writers write and matches read as they hand themselves over:
	// steps counts the steps writers finished (see relax and stallWait);
	// cpu is the CPU the last writer to take mu ran on then, noted only
	// where matches are handed over (-1: not known; it is not reset when
	// mu is let go, and the writer may have moved since).
	steps atomic.Uint32
	cpu   atomic.Int32
	_     [cacheLine]byte

	// What only writers read and write (but handedRuns, which Stats
	// reads).
	//
	// write is held by a writer for a whole operation (an event, a rank's
	// removal), before it takes mu: writers take turns on it, so that at
	// most one of them waits for mu. Go's RWMutex makes new readers wait
	// behind a waiting writer; with several, a match would queue behind
	// each in turn, and behind the goroutine switches between them.
	write sync.Mutex
	// sinceYield counts the blocks writers applied, under mu, since one
	// last released it for a waiting match (see relax); arrived is what
	// it was when a writer first saw a match waiting since (0: none is
	// waiting), and yieldShift sets yieldAfter from how soon matches came.
	sinceYield int
	arrived    int
	yieldShift uint8
	// serveCredit is what writers may spend on running handed matches
	// (see relax), handedRuns counts the handed matches writers ran.
	serveCredit int
	handedRuns  atomic.Int64
	// held counts the blocks the writer holding mu applied since it took
	// it (see relax); unlock resets it.
	held int
	// warmth sums what runTree.warm read, so that its loads are kept.
	warmth uint64
}

// newShard returns an empty shard.
func newShard() *shard {
	ix := &shard{handWait: handWait, stallWait: stallWait, onCPU: currentCPU, now: time.Now, tree: newRunTree()}
	ix.tree.yield = ix.relax
	ix.cpu.Store(-1)
	return ix
}

// apply applies one event. On error the shard is unchanged.
func (ix *shard) apply(ev Event) (ApplyResult, error) {
	switch ev.Kind {
	case Stored:
		if !ev.Tier.single() {
			return ApplyResult{}, fmt.Errorf("%w: stored event with tier %s", ErrBadEvent, ev.Tier)
		}
	case Removed:
		if !ev.Tier.single() {
			return ApplyResult{}, fmt.Errorf("%w: removed event with tier %s", ErrBadEvent, ev.Tier)
		}
	case Cleared:
		if ev.Tier == 0 || ev.Tier&^AllTiers != 0 {
			return ApplyResult{}, fmt.Errorf("%w: cleared event with tier %s", ErrBadEvent, ev.Tier)
		}
	default:
		return ApplyResult{}, fmt.Errorf("%w: kind %d", ErrBadEvent, ev.Kind)
	}
	ix.write.Lock()
	defer ix.write.Unlock()
	// Grow what the event may outgrow without mu: only writers change the
	// tree, and they take turns on write.
	grown := ix.tree.prepare(ev)
	ix.warmth += ix.tree.warm(ev, grown.names)
	ix.lock()
	res, err := ix.tree.apply(ev, grown)
	ix.unlock()
	if ev.Kind == Removed || ev.Kind == Cleared {
		// Shrink the rank's table, if removals emptied it enough, without
		// mu too.
		if tab := ix.tree.trimmed(ev.Worker); tab != nil {
			ix.lock()
			ix.tree.use(ev.Worker, growth{names: tab})
			ix.unlock()
		}
	}
	if errors.Is(err, ErrUnknownParent) {
		err = fmt.Errorf("%w %d for %s", ErrUnknownParent, ev.Parent, ev.Worker)
	}
	return res, err
}

// removeWorker drops every rank of worker.
func (ix *shard) removeWorker(worker uint64) {
	ix.removeRanks(func(wr WorkerRank) bool { return wr.Worker == worker })
}

// removeWorkerRank drops one rank.
func (ix *shard) removeWorkerRank(wr WorkerRank) {
	ix.removeRanks(func(r WorkerRank) bool { return r == wr })
}

// removeRanks drops the ranks for which gone is true, in the writers'
// turn and holding mu (which the tree's steps may yield: see relax). It
// lists them, with their engine ids, before it takes mu.
func (ix *shard) removeRanks(gone func(WorkerRank) bool) {
	ix.write.Lock()
	defer ix.write.Unlock()
	leaving := ix.tree.leaving(gone)
	if len(leaving) == 0 {
		return
	}
	ix.lock()
	for _, r := range leaving {
		ix.tree.removeRank(r.wr, r.ids)
	}
	ix.unlock()
}

// matcher is one match of one shard, which the writer holding mu may run
// (see lock.go).
type matcher struct {
	ix    *shard
	seq   []uint64
	dst   []Overlap
	rm    runMatch
	clock phaseClock    // times the match (see Index.ObservePhases)
	state atomic.Uint32 // handPending or handDone, when handed to a writer (see handOver)
}

var matcherPool = sync.Pool{New: func() any { return new(matcher) }}

// match appends to dst the Overlaps of the shard's ranks holding seq's
// first block (see Index.Match), in slot order. A match that finds mu
// held by a writer may be run by that writer (see lock.go).
func (ix *shard) match(seq []uint64, dst []Overlap) []Overlap {
	if len(seq) == 0 {
		return dst
	}
	m := matcherPool.Get().(*matcher)
	m.ix, m.seq, m.dst = ix, seq, dst
	m.clock = ix.phases.begin()
	at := len(dst)
	switch {
	case unlockedMatches:
		m.doUnlocked()
	case ix.mu.TryRLock():
		m.do()
		ix.mu.RUnlock()
	case ix.handOver(m):
	default:
		ix.rlock()
		m.do()
		ix.mu.RUnlock()
	}
	dst = m.dst
	m.clock.done(len(dst) - at)
	m.ix, m.seq, m.dst = nil, nil, nil
	matcherPool.Put(m)
	return dst
}

// do runs the match, appending its Overlaps to m.dst, with mu held: shared
// by the match, or exclusively by the writer it was handed to.
func (m *matcher) do() {
	m.clock.lap(phaseWait)
	m.dst = m.ix.tree.match(m.seq, &m.rm, m.dst, &m.clock)
}

// blockCounts sets, in out, how many engine ids each worker rank holds.
func (ix *shard) blockCounts(out map[WorkerRank]int) {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	ix.tree.blockCounts(out)
}

// rankBlocks returns how many engine ids one worker rank holds.
func (ix *shard) rankBlocks(wr WorkerRank) int {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	if slot, ok := ix.tree.slotOf[wr]; ok {
		return ix.tree.ranks[slot].names.len()
	}
	return 0
}

// stats returns the shard's current size.
func (ix *shard) stats() Stats {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	st := Stats{Workers: len(ix.tree.slotOf), Nodes: ix.tree.live, Handed: ix.handedRuns.Load()}
	for _, slot := range ix.tree.slotOf {
		st.Entries += ix.tree.ranks[slot].names.len()
	}
	return st
}

// Tier classes: Match reports, per rank, the longest prefix held in each.
const (
	classDev  = iota // on device
	classHost        // on device or host
	classAny         // on any tier
	nClasses
)
