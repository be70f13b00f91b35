package indexer

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
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

// Index is the KV block index of one (model, tenant): which worker ranks
// hold which blocks, on which tiers. It is safe for concurrent use: matches
// run concurrently with each other and with event application. Events of
// one worker rank must be applied in order, as a Set does. The index
// itself makes the calls that change a shard (Apply, RemoveWorker,
// RemoveWorkerRank) take turns (see shard.write). Matches never wait for
// them: they read the state as of the last whole operation, never a
// part-applied one (see shard).
//
// An index is split by worker id into shards, each a whole prefix tree
// with writers of its own, so that events of workers in different shards apply
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
// blocks of blockSize tokens.
func NewShardedIndex(blockSize, n int) *Index {
	ix := &Index{blockSize: blockSize, shards: make([]*shard, max(n, 1))}
	for i := range ix.shards {
		ix.shards[i] = newShard()
	}
	return ix
}

// BlockSize returns the number of tokens per block.
func (ix *Index) BlockSize() int { return ix.blockSize }

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
}

// Stats returns the index's current size.
func (ix *Index) Stats() Stats {
	var st Stats
	for _, s := range ix.shards {
		t := s.stats()
		st.Workers += t.Workers
		st.Nodes += t.Nodes
		st.Entries += t.Entries
	}
	return st
}

// shard is the index of the worker ranks of some workers (see Index): a
// spanTree whose writers take turns, and the view of it that matches read.
//
// Matches never wait for a writer. A shard has two copies of what
// matches read of the tree (view), in turn the writers' and the
// published one: after each operation, a writer publishes its copy
// (front), waits until no match reads the other, brings that one up to
// date with the changes of the operation, and makes it its own (see
// publish and spanTree.catchUp). A match counts itself in the readers of
// the copy it reads (enter, leave).
type shard struct {
	// What matches read, a cache line from what they write (see
	// cacheLine): what writers set once an operation, or as they give up
	// their core.
	//
	// views are the two copies of what matches read; front is the one
	// they read now, which only a writer changes, in its turn. ceded
	// is set while a writer has given up its core (see cede), and
	// cededMatches counts the matches that ended meanwhile.
	views        [2]view
	front        atomic.Uint32
	ceded        atomic.Bool
	_            [cacheLine]byte
	cededMatches atomic.Int32
	_            [cacheLine - 4]byte

	// readers[i] counts the matches reading views[i], each a cache line
	// from the other, as matches on several cores add to both.
	readers [2]struct {
		n atomic.Int64
		_ [cacheLine - 8]byte
	}
	_ [cacheLine]byte

	// What only writers read and write.
	//
	// write is held by a writer for a whole operation (an event, a rank's
	// removal), and by the calls that read the writers' tree (stats,
	// dumps): writers take turns on it.
	write sync.Mutex
	tree  *spanTree
	// warmth sums what spanTree.warm read, so that its loads are kept.
	warmth uint64
}

// newShard returns an empty shard.
func newShard() *shard {
	ix := &shard{tree: newSpanTree()}
	ix.views[0] = ix.tree.view // its arrays are empty, but the sets'
	return ix
}

// cede gives up the writer's core to any goroutine waiting for one
// (runtime.Gosched). Matches then give it back once cedeMatches of them
// have ended (see shard.match): Go would take the core from a goroutine
// running matches back to back only after 10 ms, while a match now and
// then, as a router's, is not made to wait for the writer.
func (ix *shard) cede() {
	ix.cededMatches.Store(0)
	ix.ceded.Store(true)
	runtime.Gosched()
	ix.ceded.Store(false)
}

// publish makes the writers' view the one matches read, and gives the
// writers the other, once no match reads it, brought up to date: called
// by a writer, in its turn, after each operation.
func (ix *shard) publish() {
	w := 1 - ix.front.Load() // only writers change front, in turn
	ix.views[w] = ix.tree.view
	ix.front.Store(w)
	// A match that read front before the Store may still be counting
	// itself in; it then sees front changed, and counts itself out.
	if ix.readers[1-w].n.Load() != 0 {
		ix.drain(1 - w)
	}
	ix.tree.catchUp(&ix.views[w], &ix.views[1-w])
}

// drain waits until no match reads views[i]. Where Go runs goroutines on
// more than one core (GOMAXPROCS, read now, as it can change), the
// matches may be running: it looks publishSpin times before it gives up
// its core between looks (cede); with one, they run only once it does.
func (ix *shard) drain(i uint32) {
	spin := 0
	if runtime.GOMAXPROCS(0) > 1 {
		spin = publishSpin
	}
	for n := 0; ix.readers[i].n.Load() != 0; n++ {
		if n >= spin {
			ix.cede()
		}
	}
}

// cedeMatches is how many matches may end while a writer that ceded its
// core waits for one, before one gives its own up (see shard.cede).
const cedeMatches = 4

// publishSpin is how many times a writer looks for the matches still
// reading the copy it is to bring up to date before it gives up its
// core between looks (see drain): a match takes a few microseconds,
// unless the system has stopped its thread.
const publishSpin = 256

// enter returns the view matches read now, with its index for leave: the
// match counts itself in that view's readers, so that no writer changes
// it until the match leaves.
func (ix *shard) enter() (*view, uint32) {
	for {
		i := ix.front.Load()
		ix.readers[i].n.Add(1)
		if ix.front.Load() == i {
			return &ix.views[i], i
		}
		ix.readers[i].n.Add(-1) // a writer published the other meanwhile
	}
}

// leave ends a match's read of views[i] (see enter).
func (ix *shard) leave(i uint32) { ix.readers[i].n.Add(-1) }

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
	ix.warmth += ix.tree.warm(ev)
	res, err := ix.tree.apply(ev)
	ix.publish()
	if ev.Kind == Removed || ev.Kind == Cleared {
		ix.tree.trim(ev.Worker) // if removals emptied its table enough
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
// turn, and publishes the tree without them.
func (ix *shard) removeRanks(gone func(WorkerRank) bool) {
	ix.write.Lock()
	defer ix.write.Unlock()
	leaving := ix.tree.leaving(gone)
	if len(leaving) == 0 {
		return
	}
	for _, r := range leaving {
		ix.tree.removeRank(r.wr, r.ids)
	}
	ix.publish()
}

var matchPool = sync.Pool{New: func() any { return new(runMatch) }}

// match appends to dst the Overlaps of the shard's ranks holding seq's
// first block (see Index.Match), in slot order, as of the view the
// shard published last.
func (ix *shard) match(seq []uint64, dst []Overlap) []Overlap {
	if len(seq) == 0 {
		return dst
	}
	m := matchPool.Get().(*runMatch)
	dst = ix.read(seq, m, dst)
	matchPool.Put(m)
	if ix.ceded.Load() && ix.cededMatches.Add(1) >= cedeMatches {
		// A writer of the shard, waiting for a match to leave the view
		// it must bring up to date, gave up its core cedeMatches
		// matches ago.
		runtime.Gosched()
	}
	return dst
}

// read runs m on the view the shard published last: a match that
// panicked would otherwise be counted as reading it for ever, and keep
// writers waiting (see publish).
func (ix *shard) read(seq []uint64, m *runMatch, dst []Overlap) []Overlap {
	v, i := ix.enter()
	defer ix.leave(i)
	return v.match(seq, m, dst)
}

// blockCounts sets, in out, how many engine ids each worker rank holds.
func (ix *shard) blockCounts(out map[WorkerRank]int) {
	ix.write.Lock()
	defer ix.write.Unlock()
	ix.tree.blockCounts(out)
}

// rankBlocks returns how many engine ids one worker rank holds.
func (ix *shard) rankBlocks(wr WorkerRank) int {
	ix.write.Lock()
	defer ix.write.Unlock()
	if slot, ok := ix.tree.slotOf[wr]; ok {
		return ix.tree.ranks[slot].names.len()
	}
	return 0
}

// stats returns the shard's current size.
func (ix *shard) stats() Stats {
	ix.write.Lock()
	defer ix.write.Unlock()
	st := Stats{Workers: len(ix.tree.slotOf), Nodes: ix.tree.live}
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
