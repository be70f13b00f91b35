package indexer

import (
	"cmp"
	"errors"
	"fmt"
	"math/bits"
	"runtime"
	"slices"
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
	// Blocks is how many blocks the rank holds in all, of any prompt and
	// on any tier (its tree size; see RankBlocks), as of the match.
	Blocks int32
}

// Tokens returns the overlap in tokens, for blocks of blockSize tokens.
func (o Overlap) Tokens(blockSize int) (device, host, disk int) {
	return int(o.Device) * blockSize, int(o.Host) * blockSize, int(o.Disk) * blockSize
}

// holder records that a worker rank (by slot) holds a node on some tiers.
type holder struct {
	slot uint32
	// kids counts, per tier class, the child nodes of this node the rank
	// holds in that class. A count that would pass maxKids stays there and
	// makes the rank holey (see slot.holes).
	kids  [nClasses]uint16
	tiers Tier
}

const maxKids = 1<<16 - 1

// ends returns the tier classes in which the holder holds the node and no
// child of it: where, for a closed rank, its prefix in that class ends.
func (h *holder) ends() uint8 {
	cl := classesOf(h.tiers)
	for c := range nClasses {
		if h.kids[c] != 0 {
			cl &^= 1 << c
		}
	}
	return cl
}

// end lists a holder of a node in its ends: slot holds the node and no
// child of it in the tier classes of the bit mask classes.
type end struct {
	slot    uint32
	classes uint8
}

// multi, in the tiers of a node's inline holder, says that the node has
// several holders, in shard.hold: the inline holder names the list (see
// holder.list).
const multi Tier = 1 << 7

// hasMore, in the tiers of a multi node's inline holder, says that the
// node has an extMore (see shard.moreIndex).
const hasMore Tier = 1 << 5

// offDevice, in the tiers of a multi node's inline holder, says that some
// holder does not hold the node on the device tier, so that the node's
// holders in the tier classes differ (see shard.holdCounts).
const offDevice Tier = 1 << 4

// list returns the block and length of the holder list that the inline
// holder h of a multi node names: its slot is the block, its first two
// kids the length (its last, kids[2], names its extMore: see
// shard.moreIndex).
func (h *holder) list() (uint32, int) { return h.slot, int(h.kids[0]) | int(h.kids[1])<<16 }

// setList makes h, the inline holder of a multi node, name the list of n
// holders in block at, keeping its extMore.
func (h *holder) setList(at uint32, n int) {
	h.slot, h.kids[0], h.kids[1] = at, uint16(n), uint16(n>>16)
	h.tiers |= multi
}

// moreInArena, as kids[2] of a multi node's inline holder with hasMore,
// says that the index of its extMore did not fit there and is kept by the
// holder arena instead (see shard.moreIndex).
const moreInArena = 1<<16 - 1

// noSlot is the slot of the inline holder of a node without holders.
const noSlot = ^uint32(0)

// node is one block position in the prefix tree, found by its sequence
// hash (key, which encodes the whole path from the root) in the node store.
// It holds no Go pointer: nodes live by value in the store's slab.
type node struct {
	key   uint64 // sequence hash
	local uint64 // local hash of the block; a root node's key equals it
	// linked is the id of the node of the parent's key this node is
	// counted in; 0 for a root, and only for a root, so that it names the
	// parent's key (see parentKey). That node may be dead: deleted since,
	// and not the current node of the parent's key if that was made anew
	// (see shard.delete), or made dead for the link when there was none
	// (see standIn). A child held by a closed rank is always linked to its
	// live parent (see link).
	linked uint32
	// one is the node's holder when it has one (slot noSlot when it has
	// none); with tiers multi, it names the node's list of holders in
	// shard.hold instead (see holder.list). The ends of a node with one
	// holder are that holder's.
	one [1]holder
	// kids counts the nodes linked to this one; only is that node's id
	// when there is one and it is known (0 otherwise).
	kids int32
	only uint32
}

// extMore is what a node held by many ranks keeps so that Match need not
// look at each holder (see shard.sync). Nodes with fewer holders derive
// both from holders.
type extMore struct {
	// ends are the holders with ends() != 0, sorted by slot: the ranks
	// whose prefix ends here in some class, which Match drops here. Kept
	// while listed.
	ends   []end
	bits   classBits // the holders again, as bit sets; kept while dense
	listed bool
	dense  bool
}

// dead, as the tiers of a node's inline holder, marks a deleted node kept
// because nodes are still linked to it (see shard.delete).
const dead Tier = 1 << 6

// worker is one worker rank's view: engine id -> node of every block it
// holds.
//
// An engine id names a node by id: the node stays in the slab while any
// engine id names it, dead once it has no holders (see shard.delete), and
// a dead node's key still resolves to the live node of that key, if any
// (see shard.resolve). Each holder accounts for one engine id naming its
// node; shard.aliases counts the others.
type worker struct {
	slot   uint32
	blocks blockTable
	sink   uint64 // what prefetches loaded, so that they are not optimized away
}

// slot maps a compact holder id back to its worker rank, and keeps what
// Match needs to know of the rank in one contiguous array.
//
// A rank is closed when it holds the parent of every block it holds, in
// each tier class the block is held in (so the blocks it holds in a class
// are prefixes), and its holders' kids counts are exact. Match follows
// closed ranks by the ends of the nodes on the prompt's path, and may jump
// over blocks; holes and open say when a rank is not known to be closed.
type slot struct {
	w WorkerRank
	// holes counts blocks held while the rank did not hold their parent
	// (stored under a parent held by id only, or orphaned by the removal
	// of their parent), and kids counts that saturated: a conservative
	// count, reset when the rank is empty.
	holes int32
	// open counts, over the tier classes, the rank's blocks held in a
	// class their (held) parent is not held in. Exact while holes is 0.
	open int32
	// blocks is how many blocks the rank holds (its engine ids), for
	// Overlap.Blocks.
	blocks  int32
	retired bool // being removed; its holders are ignored by Match
}

// closed reports whether Match may follow the rank by node ends and jump
// over its blocks.
func (s *slot) closed() bool { return s.holes == 0 && s.open == 0 }

// plain reports whether the rank is closed and not being removed: every
// rank holding a block on the prompt's path then holds the path up to it,
// so Match may count a node's holders instead of comparing them (see
// shard.notPlain).
func (s *slot) plain() bool { return s.closed() && !s.retired }

// writeChunk is how many blocks a writer processes per lock hold, so a long
// event or a worker removal never stalls matches for long. Readers may
// observe a Stored or Removed event part-applied, which is the same state as
// applying its blocks one by one: never a torn one.
const writeChunk = 64

// Index is the KV block index of one (model, tenant): which worker ranks
// hold which blocks, on which tiers. It is safe for concurrent use: matches
// run concurrently with each other and with event application. Events of
// one worker rank must be applied in order, as a Set does. The index
// itself makes the calls that change a shard (Apply, RemoveWorker,
// RemoveWorkerRank) take turns (see shard.write), so a writer may resize
// a rank's table of engine ids or grow node tables without the shard's
// lock.
//
// An index is split by worker id into shards, each a whole prefix tree
// behind its own lock, so that events of workers in different shards apply
// in parallel: a Set's apply goroutines each feed one shard when the shard
// count divides theirs. A match walks every shard; a block held by workers
// of several shards has a node in each.
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

// BlockCounts returns how many blocks each worker rank holds (on any tier).
func (ix *Index) BlockCounts() map[WorkerRank]int {
	out := make(map[WorkerRank]int)
	for _, s := range ix.shards {
		s.blockCounts(out)
	}
	return out
}

// RankBlocks returns how many blocks one worker rank holds (on any tier).
func (ix *Index) RankBlocks(wr WorkerRank) int { return ix.shardFor(wr.Worker).rankBlocks(wr) }

// Stats describes the size of an index.
type Stats struct {
	Workers int // worker ranks with state
	Nodes   int // block positions, counted once per shard that has them
	Entries int // (block, worker rank) pairs
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

// shard is the index of the worker ranks of some workers (see Index): all
// of its state sits behind one RWMutex. Matches run concurrently with each
// other and with event application; the calls that change it take turns
// on write.
type shard struct {
	// write is held by a writer for a whole operation (an event, a rank's
	// removal), before it takes mu: writers take turns on it, so that at
	// most one of them waits for mu. Go's RWMutex makes new readers wait
	// behind a waiting writer; with several, a match would queue behind
	// each in turn, and behind the goroutine switches between them.
	write sync.Mutex
	mu    sync.RWMutex
	// waiting counts matches blocked on mu: a writer holding it gives it
	// up early (see relax).
	waiting atomic.Int32
	// sinceYield counts the blocks writers applied, under mu, since one
	// last released it for a waiting match (see relax); arrived is what
	// it was when a writer first saw a match waiting since (0: none is
	// waiting), and yieldShift sets yieldAfter from how soon matches came.
	sinceYield int
	arrived    int
	yieldShift uint8
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
	// handed is the match handed to the writer holding mu, if any;
	// serveCredit is what writers may spend on running handed matches
	// (see relax), handedRuns counts the handed matches writers ran;
	// handWait bounds how long a handed match waits for a writer to run
	// it.
	handed      atomic.Pointer[matcher]
	handedRuns  atomic.Int64
	serveCredit int
	handWait    time.Duration
	// phases times matches (see Index.ObservePhases).
	phases phaseHook
	// hints guide matches looking ahead (see runHints); made by the
	// first that does.
	hints atomic.Pointer[runHints]
	nodes nodeStore
	// hold keeps the holders of nodes with several, sorted by slot.
	hold holderArena
	// mores are the extMores of nodes with many holders, by the index
	// their inline holder or list keeps (see moreIndex); 0 is unused.
	mores    []extMore
	moreFree []uint32 // reusable entries of mores
	// aliases counts, per node id, the engine ids naming it (see worker)
	// besides one per holder: ids of a block the rank holds under another
	// id too, or no longer holds. Only ids with a count are in the map:
	// engines give one block one id, so it is mostly empty.
	aliases map[uint32]int32
	workers map[WorkerRank]*worker
	slots   []slot
	free    []uint32 // reusable slots

	// notPlain counts the slots that are not plain (see slot.plain).
	notPlain int

	// denseHolders, if positive, overrides denseAt (tests use it to give
	// every node with several holders classBits).
	denseHolders int
}

// recount accounts in notPlain for a change of slot sl, which was plain
// before it if was. Called with mu held.
func (ix *shard) recount(sl *slot, was bool) {
	if now := sl.plain(); now != was {
		if now {
			ix.notPlain--
		} else {
			ix.notPlain++
		}
	}
}

// newShard returns an empty shard.
func newShard() *shard {
	return &shard{
		workers:  make(map[WorkerRank]*worker),
		handWait: handWait,
	}
}

// apply applies one event. On error the shard is unchanged.
func (ix *shard) apply(ev Event) (ApplyResult, error) {
	ix.write.Lock()
	defer ix.write.Unlock()
	switch ev.Kind {
	case Stored:
		if !ev.Tier.single() {
			return ApplyResult{}, fmt.Errorf("%w: stored event with tier %s", ErrBadEvent, ev.Tier)
		}
		if ev.ByID {
			return ix.storeByID(ev.Worker, ev.Tier, ev.Hashes), nil
		}
		return ix.store(ev)
	case Removed:
		if !ev.Tier.single() {
			return ApplyResult{}, fmt.Errorf("%w: removed event with tier %s", ErrBadEvent, ev.Tier)
		}
		return ix.remove(ev.Worker, ev.Tier, ev.Hashes), nil
	case Cleared:
		if ev.Tier == 0 || ev.Tier&^AllTiers != 0 {
			return ApplyResult{}, fmt.Errorf("%w: cleared event with tier %s", ErrBadEvent, ev.Tier)
		}
		return ix.clear(ev.Worker, ev.Tier), nil
	}
	return ApplyResult{}, fmt.Errorf("%w: kind %d", ErrBadEvent, ev.Kind)
}

// lookup returns the node of key and its id, or nil and 0.
func (ix *shard) lookup(key uint64) (*node, uint32) {
	if id := ix.nodes.find(key); id != 0 {
		return ix.nodes.get(id), id
	}
	return nil, 0
}

func (ix *shard) store(ev Event) (ApplyResult, error) {
	var res ApplyResult
	var keys [writeChunk]uint64 // of the current chunk of blocks
	blocks := ev.Blocks
	first := blocks[:min(writeChunk, len(blocks))]
	hasPrev := ev.HasParent

	// Look the first chunk up while sharing the lock (see prefetchStore),
	// then grow the rank's table for the event, if it must, and the node
	// tables the chunk fills, without it. Only readers run while this
	// writer does not hold mu (see shard.write): what it saw stays so.
	ix.mu.RLock()
	var prev uint64
	var bt *blockTable
	growTo := 0
	w := ix.workers[ev.Worker]
	if w != nil {
		bt = &w.blocks
	}
	if hasPrev {
		x, ok := uint32(0), false
		if bt != nil {
			x, ok = bt.get(ev.Parent)
		}
		if !ok {
			ix.mu.RUnlock()
			return res, fmt.Errorf("%w %d for %s", ErrUnknownParent, ev.Parent, ev.Worker)
		}
		prev = ix.nodes.get(x).key
	}
	sink, gs := ix.prefetchStore(bt, first, prev, hasPrev, &keys, nil) // gs: node tables the chunk grows
	if bt != nil && bt.reserveSize(len(blocks)) > 0 {
		// Room for as many new engine ids as the first chunk suggests:
		// none for a copy of held blocks to another tier. (Counted only
		// when the table could be too small: most events fit.)
		fresh := 0
		for _, b := range first {
			if _, ok := bt.get(b.Hash); !ok {
				fresh++
			}
		}
		if fresh > 0 {
			growTo = bt.reserveSize((fresh*len(blocks) + len(first) - 1) / len(first))
		}
	}
	ix.mu.RUnlock()
	grown := prepareResize(bt, growTo)
	ix.nodes.build(gs)

	ix.lock()
	ix.nodes.grow(gs)
	if w == nil {
		w = ix.addWorker(ev.Worker)
	} else {
		grown.apply(&w.blocks)
	}
	var parent *node // node of the previous block, once known
	var pid uint32
	held := 0
	for i, b := range blocks {
		ix.relax(&held)
		if i > 0 && i%writeChunk == 0 {
			var s uint64
			s, gs = ix.prefetchStore(&w.blocks, blocks[i:min(i+writeChunk, len(blocks))], prev, true, &keys, gs)
			sink += s
			if len(gs) > 0 { // grow them without the lock
				ix.unlock()
				ix.nodes.build(gs)
				ix.lock()
				ix.nodes.grow(gs)
			}
		}
		key := keys[i%writeChunk]
		if hasPrev && parent == nil {
			parent, pid = ix.lookup(prev)
		}
		old, had := w.blocks.get(b.Hash)
		if had && ix.nodes.get(old).key != key {
			// The engine reused an id for other content: the old block is gone.
			res.Removed += ix.detach(w, b.Hash, old, AllTiers)
			if parent != nil && ix.nodes.find(prev) != pid {
				parent, pid = nil, 0 // that was the parent's node: it is gone
			}
			old, had = w.blocks.get(b.Hash)
		}
		n, id := ix.lookup(key)
		if n == nil {
			id, n = ix.nodes.add(key)
			n.local = b.Local
			n.one[0].slot = noSlot
		}
		if parent != nil {
			ix.link(n, id, parent, pid)
		} else if hasPrev && n.linked == 0 {
			ix.standIn(n, prev)
		}
		h := ix.holderOf(n, w.slot)
		before := h.tiers // 0: the holder is new
		if before&ev.Tier == 0 {
			res.Stored++
			h.tiers |= ev.Tier
			ix.retier(w.slot, n, key, parent, h, before)
			ix.sync(n, w.slot, h.tiers)
		}
		// b.Hash names n from now on (see worker).
		switch {
		case !had:
			w.blocks.fit(len(blocks) - i)
			w.blocks.put(b.Hash, id)
			if before != 0 { // the rank has another engine id for n
				ix.alias(id, 1)
			}
		case old != id: // it named a dead node of key
			w.blocks.put(b.Hash, id)
			if before != 0 {
				ix.alias(id, 1)
			}
			ix.alias(old, -1)
			ix.reap(old)
		case before == 0: // it named n, which the rank did not hold
			ix.alias(id, -1)
		}
		ix.slots[w.slot].blocks = int32(w.blocks.len())
		prev, hasPrev, parent, pid = key, true, n, id
	}
	w.sink += sink
	ix.unlock()
	return res, nil
}

// sequenceKeys sets keys to the sequence hashes of blocks, the next blocks
// of a Stored event after the block with key prev (hasPrev: else from the
// root).
func sequenceKeys(blocks []Block, prev uint64, hasPrev bool, keys *[writeChunk]uint64) {
	for k, b := range blocks {
		key := b.Local
		if hasPrev {
			key = NextSequenceHash(prev, b.Local)
		}
		keys[k] = key
		prev, hasPrev = key, true
	}
}

// prefetchStore sets keys as sequenceKeys does and loads what storing the
// blocks will look up (in bt, nil for a new rank, and the node store), so
// that the cache misses of a whole chunk overlap instead of coming one by
// one. Called with mu held: for reading for an event's first chunk, in
// parallel with matches, which then applies it with mu held mostly from
// cache; for writing for the following chunks (releasing mu for each did
// not pay). It returns what it loaded, for the caller to keep so that the
// loads are not optimized away, and in gs the node tables that the
// chunk's new nodes will grow (see nodeStore.growths).
func (ix *shard) prefetchStore(bt *blockTable, blocks []Block, prev uint64, hasPrev bool, keys *[writeChunk]uint64, gs []tableGrowth) (uint64, []tableGrowth) {
	sequenceKeys(blocks, prev, hasPrev, keys)
	var sink uint64
	for k, b := range blocks {
		sink += ix.nodes.touch(keys[k])
		if bt != nil {
			sink += bt.touch(b.Hash)
		}
	}
	var fresh [writeChunk]uint64
	nf := 0
	for _, key := range keys[:len(blocks)] {
		if id := ix.nodes.find(key); id != 0 {
			sink += ix.nodes.get(id).local
		} else {
			fresh[nf] = key
			nf++
		}
	}
	return sink, ix.nodes.growths(fresh[:nf], gs)
}

// prefetchRemove loads, level by level, what removing the blocks of w with
// engine ids hashes will look up (see prefetchStore). Called with mu held,
// for reading or writing.
func (ix *shard) prefetchRemove(w *worker, hashes []uint64) uint64 {
	var sink uint64
	for _, h := range hashes {
		sink += w.blocks.touch(h)
	}
	for _, h := range hashes {
		if x, ok := w.blocks.get(h); ok {
			sink += ix.nodes.get(x).local
		}
	}
	for _, h := range hashes {
		if x, ok := w.blocks.get(h); ok {
			if l := ix.nodes.get(x).linked; l != 0 {
				sink += ix.nodes.get(l).local
			}
		}
	}
	return sink
}

// storeByID adds tier to the blocks of hashes the worker rank holds.
func (ix *shard) storeByID(wr WorkerRank, tier Tier, hashes []uint64) ApplyResult {
	var res ApplyResult
	ix.lock()
	defer ix.unlock()
	w := ix.workers[wr]
	held := 0
	for _, h := range hashes {
		ix.relax(&held)
		var hd *holder
		var n *node
		if w != nil {
			if x, ok := w.blocks.get(h); ok {
				n, _ = ix.resolve(x)
				hd = ix.find(n, w.slot)
			}
		}
		if hd == nil {
			res.Unknown++
			continue
		}
		if before := hd.tiers; before&tier == 0 {
			hd.tiers |= tier
			ix.retier(w.slot, n, n.key, ix.parentOf(n, n.key), hd, before)
			ix.sync(n, w.slot, hd.tiers)
			res.Stored++
		}
	}
	return res
}

func (ix *shard) remove(wr WorkerRank, tier Tier, hashes []uint64) ApplyResult {
	var res ApplyResult
	ix.mu.RLock()
	w := ix.workers[wr]
	if w == nil {
		ix.mu.RUnlock()
		return ApplyResult{Unknown: len(hashes)}
	}
	sink := ix.prefetchRemove(w, hashes[:min(writeChunk, len(hashes))])
	ix.mu.RUnlock()
	ix.lock()
	defer ix.unlock()
	held := 0
	for i, h := range hashes {
		ix.relax(&held)
		if i > 0 && i%writeChunk == 0 {
			sink += ix.prefetchRemove(w, hashes[i:min(i+writeChunk, len(hashes))])
		}
		x, ok := w.blocks.get(h)
		if !ok {
			res.Unknown++
			continue
		}
		if ix.detach(w, h, x, tier) == 0 {
			res.Unknown++
		} else {
			res.Removed++
		}
	}
	w.sink += sink
	if size := w.blocks.trimSize(); size > 0 {
		// Build the smaller table without the lock (see tableResize).
		ix.unlock()
		r := prepareResize(&w.blocks, size)
		ix.lock()
		r.apply(&w.blocks)
	}
	return res
}

// tableResize is a resized copy of a rank's engine-id table, built
// without the index's lock by the goroutine applying the rank's events,
// and put in place with the lock held exclusively. That goroutine, holding
// the shard's write mutex, is the only one that changes the table, and
// matches never read it, so building it holds up no one; other readers,
// such as Dump, only read it too. The copy is put in place only if the
// table has not changed meanwhile, which the write mutex now rules out.
type tableResize struct {
	tab []blockEntry
	gen uint32 // that of the table it was built from
}

// prepareResize builds t's entries in a table of size slots (none for 0).
// Called by the goroutine that applies the events of t's rank, with or
// without mu (see tableResize).
func prepareResize(t *blockTable, size int) tableResize {
	if size == 0 {
		return tableResize{}
	}
	return tableResize{tab: t.resized(size), gen: t.gen}
}

// apply puts the resized table in place of t if t is still the table it
// was built from. Called with mu held.
func (r *tableResize) apply(t *blockTable) {
	if r.tab != nil && t.gen == r.gen {
		t.tab = r.tab
		t.gen++
	}
}

// detach drops tiers of the block with engine id h (node x, see worker)
// from w and returns how many (block, tier) entries that removed. Called
// with mu held.
//
// Two engine ids may name the same block (the engine stored one content
// twice); dropping one drops the holder, and the other id then finds no
// holder: it is forgotten without touching any node.
func (ix *shard) detach(w *worker, h uint64, x uint32, tiers Tier) int {
	var left Tier
	removed := 0
	dropped := false
	n, id := ix.resolve(x)
	if n != nil {
		key := n.key
		if hd := ix.find(n, w.slot); hd != nil {
			removed = bits.OnesCount8(uint8(hd.tiers & tiers))
			before := hd.tiers
			left = before &^ tiers
			if left != before {
				hd.tiers = left
				ix.retier(w.slot, n, key, ix.parentOf(n, key), hd, before)
			}
			if left == 0 {
				ix.dropHolder(n, w.slot)
				dropped = true
			}
			if removed > 0 {
				ix.sync(n, w.slot, left)
			}
		}
	}
	if left == 0 {
		w.blocks.del(h)
		sl := &ix.slots[w.slot]
		if sl.blocks = int32(w.blocks.len()); sl.blocks == 0 {
			was := sl.plain()
			sl.holes, sl.open = 0, 0
			ix.recount(sl, was)
		}
		if !dropped || x != id { // else one id and one holder less: even
			if dropped {
				ix.alias(id, 1)
			}
			ix.alias(x, -1)
		}
	}
	if n != nil && n.one[0].slot == noSlot {
		ix.delete(n, id)
	}
	if x != id {
		ix.reap(x)
	}
	return removed
}

func (ix *shard) clear(wr WorkerRank, tiers Tier) ApplyResult {
	ix.lock()
	defer ix.unlock()
	w := ix.workers[wr]
	if w == nil {
		return ApplyResult{}
	}
	removed := ix.detachAll(w, tiers)
	w.blocks.trim()
	return ApplyResult{Removed: removed}
}

// detachAll drops tiers from every block of w, yielding the lock as
// relax does. Called with mu held, it returns with mu held.
func (ix *shard) detachAll(w *worker, tiers Tier) (removed int) {
	ids := w.blocks.ids(nil)
	held := 0
	for i, h := range ids {
		ix.relax(&held)
		if i%writeChunk == 0 {
			w.sink += ix.prefetchRemove(w, ids[i:min(i+writeChunk, len(ids))])
		}
		if x, ok := w.blocks.get(h); ok {
			removed += ix.detach(w, h, x, tiers)
		}
	}
	return removed
}

// removeWorker drops every block of every rank of worker.
func (ix *shard) removeWorker(worker uint64) {
	ix.mu.RLock()
	var ranks []WorkerRank
	for wr := range ix.workers {
		if wr.Worker == worker {
			ranks = append(ranks, wr)
		}
	}
	ix.mu.RUnlock()
	for _, wr := range ranks {
		ix.removeWorkerRank(wr)
	}
}

// removeWorkerRank drops every block of one worker rank. Matches never see
// the rank half-removed: its slot is retired first.
func (ix *shard) removeWorkerRank(wr WorkerRank) {
	ix.write.Lock()
	defer ix.write.Unlock()
	ix.lock()
	w := ix.workers[wr]
	if w == nil {
		ix.unlock()
		return
	}
	delete(ix.workers, wr)
	sl := &ix.slots[w.slot]
	was := sl.plain()
	sl.retired = true
	ix.recount(sl, was)
	ix.detachAll(w, AllTiers)
	ix.slots[w.slot] = slot{} // sl still points at it: only writers add slots
	ix.recount(sl, false)
	ix.free = append(ix.free, w.slot)
	ix.unlock()
}

// addWorker creates the state of a new worker rank. Called with mu held.
func (ix *shard) addWorker(wr WorkerRank) *worker {
	var s uint32
	if n := len(ix.free); n > 0 {
		s = ix.free[n-1]
		ix.free = ix.free[:n-1]
	} else {
		s = uint32(len(ix.slots))
		ix.slots = append(ix.slots, slot{})
	}
	w := &worker{slot: s}
	ix.slots[s] = slot{w: wr}
	ix.workers[wr] = w
	return w
}

// holders returns the holders of n, sorted by slot. The slice is n's own
// until the next change of its holders.
func (ix *shard) holders(n *node) []holder {
	switch h := &n.one[0]; {
	case h.tiers&multi != 0:
		return ix.hold.list(h.list())
	case h.slot == noSlot:
		return nil
	}
	return n.one[:]
}

// holderOf returns the holder of slot s in n, inserting an empty one
// (tiers 0) if there is none. Called with mu held.
func (ix *shard) holderOf(n *node, s uint32) *holder {
	h := &n.one[0]
	if h.tiers&multi == 0 {
		switch h.slot {
		case noSlot:
			*h = holder{slot: s}
			return h
		case s:
			return h
		}
		// A second holder: move both to a list.
		i, add := 1, holder{slot: s}
		var at uint32
		if s < h.slot {
			i, at = 0, ix.hold.pair(add, *h)
		} else {
			at = ix.hold.pair(*h, add)
		}
		*h = holder{}
		h.setList(at, 2)
		return &ix.hold.list(at, 2)[i]
	}
	at, nh := h.list()
	i, found := slices.BinarySearchFunc(ix.hold.list(at, nh), s, cmpSlot)
	if !found {
		at = ix.hold.insert(at, nh, i, holder{slot: s})
		nh++
		h.setList(at, nh)
	}
	return &ix.hold.list(at, nh)[i]
}

// dropHolder deletes the holder of slot s from n, whose ends no longer
// list it. Called with mu held.
func (ix *shard) dropHolder(n *node, s uint32) {
	h := &n.one[0]
	if h.tiers&multi == 0 {
		*h = holder{slot: noSlot}
		return
	}
	at, nh := h.list()
	l := ix.hold.list(at, nh)
	i, found := slices.BinarySearchFunc(l, s, cmpSlot)
	if !found {
		return
	}
	if nh > 2 {
		h.setList(ix.hold.remove(at, nh, i), nh-1)
		return
	}
	// Back to one holder, inline.
	if h.tiers&hasMore != 0 {
		ix.freeMore(ix.moreIndex(h))
	}
	*h = l[1-i]
	ix.hold.release(sizeClass(nh), at) // and its extMore index, if any
}

// moreIndex returns the index in mores of the extMore of the multi node
// whose inline holder is h, which has one (hasMore). Indexes below
// moreInArena are kept in h (Match reads them from the node it has in
// hand); the others by the holder arena, with the list.
func (ix *shard) moreIndex(h *holder) uint32 {
	if x := h.kids[2]; x != moreInArena {
		return uint32(x)
	}
	return ix.hold.more(h.list())
}

// moreOf returns the extMore of n, or nil. Called with mu held (the
// pointer is valid until the next newMore).
func (ix *shard) moreOf(n *node) *extMore {
	if h := &n.one[0]; h.tiers&hasMore != 0 {
		return &ix.mores[ix.moreIndex(h)]
	}
	return nil
}

// newMore gives the multi node n an empty extMore and returns it. Called
// with mu held.
func (ix *shard) newMore(n *node) *extMore {
	var x uint32
	if k := len(ix.moreFree); k > 0 {
		x = ix.moreFree[k-1]
		ix.moreFree = ix.moreFree[:k-1]
	} else {
		if len(ix.mores) == 0 {
			ix.mores = append(ix.mores, extMore{}) // index 0 means none
		}
		ix.mores = append(ix.mores, extMore{})
		x = uint32(len(ix.mores) - 1)
	}
	h := &n.one[0]
	if x < moreInArena {
		h.kids[2] = uint16(x)
	} else {
		h.kids[2] = moreInArena
		at, nh := h.list()
		ix.hold.setMore(at, nh, x)
	}
	h.tiers |= hasMore
	return &ix.mores[x]
}

// dropMore takes the extMore of the multi node n away. Called with mu held.
func (ix *shard) dropMore(n *node) {
	h := &n.one[0]
	ix.freeMore(ix.moreIndex(h))
	if h.kids[2] == moreInArena {
		at, nh := h.list()
		ix.hold.setMore(at, nh, 0)
	}
	h.kids[2] = 0
	h.tiers &^= hasMore
}

// freeMore frees entry x of mores. Called with mu held.
func (ix *shard) freeMore(x uint32) {
	ix.mores[x] = extMore{}
	ix.moreFree = append(ix.moreFree, x)
}

// setEnd records the end classes of slot s in n (0: none). A node with one
// holder or a few needs no record: its ends are its holders' (see sync).
func (ix *shard) setEnd(n *node, s uint32, classes uint8) {
	e := ix.moreOf(n)
	if e == nil || !e.listed {
		return
	}
	i, found := slices.BinarySearchFunc(e.ends, s, func(e end, s uint32) int { return cmp.Compare(e.slot, s) })
	switch {
	case found && classes == 0:
		e.ends = slices.Delete(e.ends, i, i+1)
	case found:
		e.ends[i].classes = classes
	case classes != 0:
		e.ends = slices.Insert(e.ends, i, end{slot: s, classes: classes})
	}
}

// link counts n (id) as a child of parent (pid), the node of its parent's
// key, unless it is already. Called with mu held.
func (ix *shard) link(n *node, id uint32, parent *node, pid uint32) {
	if n.linked == pid {
		return
	}
	ix.unlink(n) // from a dead node
	n.linked = pid
	if parent.kids++; parent.kids == 1 {
		parent.only = id
	} else {
		parent.only = 0
	}
}

// unlink uncounts n from the node it is linked to, if any, and frees that
// node if it is dead and n was the last node linked to it. Called with mu
// held.
func (ix *shard) unlink(n *node) {
	if n.linked == 0 {
		return
	}
	p := ix.nodes.get(n.linked)
	p.kids--
	p.only = 0 // which one is left is not known
	ix.reap(n.linked)
	n.linked = 0
}

// delete deletes node n (id), which has no holders left. Nodes linked to
// it and engine ids naming it keep its id, so while there are any it stays
// in the slab, dead: unlisted, so that a node made anew for its key gets
// another id. The last of them to go frees it (see reap). Called with mu
// held.
func (ix *shard) delete(n *node, id uint32) {
	ix.unlink(n)
	ix.nodes.unlist(id)
	if n.kids == 0 && ix.aliases[id] == 0 {
		ix.nodes.release(id)
		return
	}
	n.one[0] = holder{slot: noSlot, tiers: dead}
	n.only = 0
}

// resolve returns the node engine ids name by x (see worker) and its id:
// x itself, or the live node of x's key if x is dead (nil, 0 if none).
func (ix *shard) resolve(x uint32) (*node, uint32) {
	if n := ix.nodes.get(x); n.one[0].tiers != dead {
		return n, x
	}
	return ix.lookup(ix.nodes.get(x).key)
}

// alias adds d to the count of engine ids naming node id besides one per
// holder of it (see worker). Called with mu held.
func (ix *shard) alias(id uint32, d int32) {
	v := ix.aliases[id] + d
	switch {
	case v == 0:
		delete(ix.aliases, id)
	case ix.aliases == nil:
		ix.aliases = map[uint32]int32{id: v}
	default:
		ix.aliases[id] = v
	}
}

// reap frees node id if it is dead and nothing keeps it: no node linked to
// it, no engine id naming it. Called with mu held.
func (ix *shard) reap(id uint32) {
	if n := ix.nodes.get(id); n.one[0].tiers == dead && n.kids == 0 && ix.aliases[id] == 0 {
		ix.nodes.release(id)
	}
}

// standIn links n, a new node whose parent's key pkey has no node (the
// rank holds that block by engine id only), to a dead node made for it:
// a non-root node is always linked, so that its link names its parent's
// key. Called with mu held.
func (ix *shard) standIn(n *node, pkey uint64) {
	pid, p := ix.nodes.alloc(pkey)
	p.one[0] = holder{slot: noSlot, tiers: dead}
	p.kids = 1
	n.linked = pid
}

// parentKey returns the sequence hash of n's parent (key is n's), 0 for a
// root. Called with mu held.
func (ix *shard) parentKey(n *node, key uint64) uint64 {
	if key == n.local || n.linked == 0 {
		return 0
	}
	return ix.nodes.get(n.linked).key
}

// parentOf returns the node of n's parent, nil for a root (key is n's)
// or when no rank holds the parent. Called with mu held.
func (ix *shard) parentOf(n *node, key uint64) *node {
	if key == n.local || n.linked == 0 {
		return nil
	}
	p := ix.nodes.get(n.linked)
	if p.one[0].tiers == dead { // the parent's key may have a new node
		p, _ = ix.lookup(p.key)
	}
	return p
}

// retier accounts for the holder h of slot s on node n (key; p is the
// parent's node, see parentOf) having changed its tiers from before to
// h.tiers, either 0 for a holder created or deleted (the holder is still
// in n): the kids and ends of the rank's holder on the parent node, the
// slot's holes and open counts, and h's own end. Called with mu held.
func (ix *shard) retier(s uint32, n *node, key uint64, p *node, h *holder, before Tier) {
	sl := &ix.slots[s]
	was := sl.plain()
	cb, ca := classesOf(before), classesOf(h.tiers)
	if key != n.local { // not a root: the rank's holder of the parent counts it
		switch ph := ix.find(p, s); {
		case ph == nil:
			if before == 0 {
				sl.holes++ // held under a parent the rank holds by id only
			}
		case cb != ca:
			pc := classesOf(ph.tiers)
			for c := range nClasses {
				bit := uint8(1) << c
				switch {
				case ca&bit != 0 && cb&bit == 0:
					if ph.kids[c] == maxKids {
						sl.holes++
					} else {
						ph.kids[c]++
					}
					if pc&bit == 0 {
						sl.open++
					}
				case cb&bit != 0 && ca&bit == 0:
					if ph.kids[c] > 0 && ph.kids[c] < maxKids {
						ph.kids[c]--
					}
					if pc&bit == 0 {
						sl.open--
					}
				}
			}
			ix.setEnd(p, s, ph.ends())
		}
	}
	// The rank's children of n, held in a class n is now held in or not.
	switch {
	case h.tiers == 0:
		if h.kids[classAny] > 0 {
			sl.holes++ // they are orphans now
		}
	case before != 0:
		for c := range nClasses {
			bit := uint8(1) << c
			switch {
			case ca&bit != 0 && cb&bit == 0:
				sl.open -= int32(h.kids[c])
			case cb&bit != 0 && ca&bit == 0:
				sl.open += int32(h.kids[c])
			}
		}
	}
	ix.setEnd(n, s, h.ends())
	ix.recount(sl, was)
}

// find returns the holder of slot s in n, or nil (also for a nil n).
func (ix *shard) find(n *node, s uint32) *holder {
	if n == nil {
		return nil
	}
	h := &n.one[0]
	if h.tiers&multi == 0 {
		if h.slot == s {
			return h
		}
		return nil
	}
	hs := ix.hold.list(h.list())
	if i, ok := slices.BinarySearchFunc(hs, s, cmpSlot); ok {
		return &hs[i]
	}
	return nil
}

func cmpSlot(h holder, s uint32) int { return cmp.Compare(h.slot, s) }

// Tier classes: Match reports, per rank, the longest prefix held in each.
const (
	classDev  = iota // on device
	classHost        // on device or host
	classAny         // on any tier
	nClasses
)

// classesOf returns the tier classes a holder with tiers t belongs to, as a
// bit per class.
func classesOf(t Tier) uint8 {
	var c uint8
	if t&TierDevice != 0 {
		c |= 1 << classDev
	}
	if t&(TierDevice|TierHost) != 0 {
		c |= 1 << classHost
	}
	if t != 0 {
		c |= 1 << classAny
	}
	return c
}

// classBits is a node's holders as bit sets over slots, one per tier class,
// interleaved: word w of class c is at index nClasses*w+c. Nodes held by
// many ranks keep one so that Match intersects them a word at a time.
type classBits []uint64

// set records that slot s holds the node on tiers t (0: not at all).
func (b *classBits) set(s uint32, t Tier) {
	w := int(s / 64)
	if need := nClasses * (w + 1); len(*b) < need {
		if t == 0 {
			return
		}
		*b = append(*b, make([]uint64, need-len(*b))...)
	}
	bit, cl := uint64(1)<<(s%64), classesOf(t)
	for c := range nClasses {
		if cl&(1<<c) != 0 {
			(*b)[nClasses*w+c] |= bit
		} else {
			(*b)[nClasses*w+c] &^= bit
		}
	}
}

// denseAt returns how many holders make a node keep classBits: enough that
// the bit sets cost at most a few bytes per holder. Called with mu held.
func (ix *shard) denseAt() int {
	if ix.denseHolders > 0 {
		return ix.denseHolders
	}
	return max(8, nClasses*((len(ix.slots)+63)/64))
}

// sync keeps n's end list and classBits in step after slot s's holder
// changed to tiers t (0: the holder was deleted): a node keeps the list
// from listAt holders on, the bit sets from denseAt, and drops each below
// half that. Called with mu held.
func (ix *shard) sync(n *node, s uint32, t Tier) {
	if n.one[0].tiers&multi == 0 {
		return
	}
	holders := ix.holders(n)
	markOffDevice(n, holders, t)
	nh, m := len(holders), ix.moreOf(n)
	if m == nil {
		if nh < min(listAt, ix.denseAt()) {
			return
		}
		m = ix.newMore(n)
	}
	la := listAt
	if ix.denseHolders > 0 {
		la = ix.denseHolders
	}
	switch {
	case !m.listed && nh >= la:
		m.ends = m.ends[:0]
		for _, h := range holders {
			if c := h.ends(); c != 0 {
				m.ends = append(m.ends, end{slot: h.slot, classes: c})
			}
		}
		m.listed = true
	case m.listed && nh < la/2:
		m.ends, m.listed = nil, false
	}
	switch at := ix.denseAt(); {
	case !m.dense && nh >= at:
		m.bits = make(classBits, 0, nClasses*((len(ix.slots)+63)/64))
		for _, h := range holders {
			m.bits.set(h.slot, h.tiers)
		}
		m.dense = true
	case m.dense && nh < at/2:
		m.bits, m.dense = nil, false
	case m.dense:
		m.bits.set(s, t)
	}
	if !m.listed && !m.dense {
		ix.dropMore(n)
	}
}

// markOffDevice keeps the offDevice flag of the multi node n, whose
// holders are hs, in step after a holder changed to tiers t (0: the holder
// was deleted). It looks at the holders only when the flag is set and may
// no longer hold, or the node has two (it may have just become multi).
func markOffDevice(n *node, hs []holder, t Tier) {
	h := &n.one[0]
	switch {
	case t != 0 && t&TierDevice == 0:
		h.tiers |= offDevice
	case h.tiers&offDevice != 0 || len(hs) == 2:
		h.tiers &^= offDevice
		for _, x := range hs {
			if x.tiers&TierDevice == 0 {
				h.tiers |= offDevice
				break
			}
		}
	}
}

// holdCounts returns how many ranks hold n in each tier class.
func (ix *shard) holdCounts(n *node) [nClasses]int {
	var c [nClasses]int
	h := &n.one[0]
	if h.tiers&multi != 0 && h.tiers&offDevice == 0 {
		_, nh := h.list()
		for i := range c {
			c[i] = nh
		}
		return c
	}
	for _, x := range ix.holders(n) {
		cl := classesOf(x.tiers)
		for i := range c {
			c[i] += int(cl >> i & 1)
		}
	}
	return c
}

// listAt is how many holders make a node keep the list of its ends, so
// that Match need not look at every holder (denseHolders overrides it).
const listAt = 8

// denseBits returns n's classBits, if it keeps them.
func (ix *shard) denseBits(n *node) (classBits, bool) {
	if m := ix.moreOf(n); m != nil && m.dense {
		return m.bits, true
	}
	return nil, false
}

// matcher is the state of one Match; its slices are reused between matches.
// Sets of ranks are bit sets over slots; per-class sets are interleaved as
// in classBits.
type matcher struct {
	ix    *shard
	seq   []uint64
	cands []uint64 // ranks holding the first block: each gets an Overlap
	// Per class, the candidates holding every block so far in it: closed
	// ranks (see slot.closed) in closed, the others in exact. Only words
	// [lo, hi) of closed and [elo, ehi) of exact may be non-zero; nClosed
	// counts the closed ones in class any.
	closed, exact    []uint64
	lo, hi, elo, ehi int
	nClosed          int
	open             []uint64          // start's scratch: the candidates that are not closed
	node             []uint64          // a sparse node's holders as classBits (see bitsOf)
	reach            [nClasses][]int32 // per slot and class: blocks matched
	sink             uint64            // what prefetches loaded (see gallop)
	probes           int               // blocks gallop looked up in this match
	dst              []Overlap         // where the match appends its Overlaps
	clock            phaseClock        // times the match (see Index.ObservePhases)
	state            atomic.Uint32     // handPending or handDone, when handed to a writer (see handOver)
	// counted says that gallop compares live, the closed ranks per class,
	// with a node's holder counts instead of its holders (see holdsAll).
	counted bool
	live    [nClasses]int
}

// gallopAfter is how many blocks in a row must drop no closed rank before
// Match searches ahead for the next block that does.
const gallopAfter = 4

var matcherPool = sync.Pool{New: func() any { return new(matcher) }}

// match appends to dst the Overlaps of the shard's ranks holding seq's
// first block (see Index.Match), in slot order.
//
// Closed ranks (see slot) are followed by the nodes' ends: where the prompt
// goes on to a node's only child, the ranks dropping out are those whose
// prefix ends at the node, so a block costs a lookup and a look at the
// ranks ending there. Where the node has other children, the ranks still
// matching, a bit set, are intersected with the child's holders a word at
// a time. Over a stretch where no closed rank drops out, Match looks
// first where the last match through the stretch's first block found the
// next drop (see runHints), then searches exponentially (8, 16, 32, ...
// blocks ahead) and finds the next drop by bisection: a closed rank
// holding a block holds all before it. Ranks that are not closed are
// walked block by block, by bit sets.
//
// A match that finds mu held by a writer may be run by that writer (see
// lock.go).
func (ix *shard) match(seq []uint64, dst []Overlap) []Overlap {
	if len(seq) == 0 {
		return dst
	}
	m := matcherPool.Get().(*matcher)
	m.ix, m.seq, m.dst = ix, seq, dst
	m.clock = ix.phases.begin()
	at := len(dst)
	switch {
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
	n, id := m.start()
	m.clock.lap(phaseStart)
	if n != nil {
		m.run(n, id)
		m.clock.lap(phaseWalk)
		m.dst = m.emit(m.dst)
		m.clock.lap(phaseEmit)
	}
}

// words resizes s to n zeroed words.
func words(s []uint64, n int) []uint64 {
	s = slices.Grow(s[:0], n)[:n]
	clear(s)
	return s
}

// start sets up the candidates from the first block's holders, settling
// the classes they do not hold it in. It returns the first block's node
// and its id, or nil if no rank holds it.
func (m *matcher) start() (*node, uint32) {
	m.probes = 0
	n, id := m.ix.lookup(m.seq[0])
	if n == nil {
		return nil, 0
	}
	slots := m.ix.slots
	nw := (len(slots) + 63) / 64
	m.cands, m.open = words(m.cands, nw), words(m.open, nw)
	m.closed, m.exact, m.node = words(m.closed, nClasses*nw), words(m.exact, nClasses*nw), words(m.node, nClasses*nw)
	for c := range m.reach {
		m.reach[c] = slices.Grow(m.reach[c][:0], len(slots))[:len(slots)]
	}
	m.lo, m.hi, m.elo, m.ehi, m.nClosed = nw, 0, nw, 0, 0
	if b, ok := m.ix.denseBits(n); ok && m.ix.notPlain == 0 {
		// Every rank is plain (none open, none retired): the candidates
		// are the first block's holders, all closed, each live in the
		// classes it holds the block in.
		for w := range nw {
			l := b.at(nClasses*w + classAny)
			if l == 0 {
				continue
			}
			m.cands[w] = l
			m.lo, m.hi = min(m.lo, w), w+1
			m.nClosed += bits.OnesCount64(l)
			for c := range nClasses {
				held := b.at(nClasses*w + c)
				m.closed[nClasses*w+c] = held
				m.settle(c, w, l&^held, 0)
			}
		}
		if m.nClosed == 0 {
			return nil, 0
		}
		return n, id
	}
	miss := m.node // per class, the candidates not holding the first block in it
	lo, hi := nw, 0
	for _, h := range m.ix.holders(n) {
		s := &slots[h.slot]
		if s.retired {
			continue
		}
		w, bit := int(h.slot/64), uint64(1)<<(h.slot%64)
		m.cands[w] |= bit
		lo, hi = min(lo, w), max(hi, w+1)
		if !s.closed() {
			m.open[w] |= bit
		}
		if cl := classesOf(h.tiers); cl != 1<<nClasses-1 {
			for c := range nClasses {
				if cl&(1<<c) == 0 {
					miss[nClasses*w+c] |= bit
					m.reach[c][h.slot] = 0
				}
			}
		}
	}
	for w := lo; w < hi; w++ {
		for c := range nClasses {
			l := m.cands[w] &^ miss[nClasses*w+c]
			m.closed[nClasses*w+c], m.exact[nClasses*w+c] = l&^m.open[w], l&m.open[w]
		}
		if x := m.cands[w] &^ m.open[w]; x != 0 {
			m.lo, m.hi = min(m.lo, w), w+1
			m.nClosed += bits.OnesCount64(x)
		}
		if m.open[w] != 0 {
			m.elo, m.ehi = min(m.elo, w), w+1
		}
	}
	if m.nClosed == 0 && m.elo >= m.ehi {
		return nil, 0
	}
	return n, id
}

// run walks the prompt from its first block, node n (id).
func (m *matcher) run(n *node, id uint32) {
	last := len(m.seq) - 1
	quiet := 0 // blocks in a row that dropped no closed rank
	for depth := 0; depth < last && (m.nClosed > 0 || m.elo < m.ehi); {
		if quiet >= gallopAfter && m.elo >= m.ehi {
			depth, n, id = m.gallop(depth, n, id)
			quiet = 0
			continue
		}
		var next *node
		nextID := n.only
		if nextID != 0 {
			if next = m.ix.nodes.get(nextID); next.key != m.seq[depth+1] {
				next = nil
			}
		}
		if next == nil {
			next, nextID = m.ix.lookup(m.seq[depth+1])
		}
		if m.advance(depth, n, id, next) {
			quiet = 0
		} else {
			quiet++
		}
		if m.elo < m.ehi {
			m.stepExact(depth+1, next)
		}
		depth, n, id = depth+1, next, nextID
	}
	// Whoever is still live holds the whole prompt in that class.
	all := int32(len(m.seq))
	for w := m.lo; w < m.hi; w++ {
		for c := range nClasses {
			m.settle(c, w, m.closed[nClasses*w+c], all)
		}
	}
	for w := m.elo; w < m.ehi; w++ {
		for c := range nClasses {
			m.settle(c, w, m.exact[nClasses*w+c], all)
		}
	}
}

// advance moves the closed ranks from the block at depth (node n, id,
// which they all hold in their live classes) to the next one (node next,
// nil if no rank holds it), settling those that drop out. It reports
// whether any did.
func (m *matcher) advance(depth int, n *node, id uint32, next *node) bool {
	if m.nClosed == 0 {
		return false
	}
	d := int32(depth + 1)
	if next == nil {
		for w := m.lo; w < m.hi; w++ {
			for c := range nClasses {
				m.settle(c, w, m.closed[nClasses*w+c], d)
				m.closed[nClasses*w+c] = 0
			}
		}
		m.nClosed, m.lo, m.hi = 0, 0, 0
		return true
	}
	if n.kids == 0 || n.kids == 1 && next.linked == id {
		// The closed ranks holding a child of n in a class hold next in
		// it: the others, n's ends, drop out.
		if h := &n.one[0]; h.tiers&multi == 0 {
			// One holder: its ends are the node's.
			return h.slot != noSlot && m.drop(end{slot: h.slot, classes: h.ends()}, d)
		}
		dropped := false
		if x := m.ix.moreOf(n); x != nil && x.listed {
			for _, e := range x.ends {
				if m.drop(e, d) {
					dropped = true
				}
			}
			return dropped
		}
		hs := m.ix.holders(n)
		for i := range hs {
			h := &hs[i]
			if c := h.ends(); c != 0 && m.drop(end{slot: h.slot, classes: c}, d) {
				dropped = true
			}
		}
		return dropped
	}
	// n has other children: intersect with next's holders.
	b, dropped := m.bitsOf(next, m.lo, m.hi), false
	m.nClosed = 0
	for w := m.lo; w < m.hi; w++ {
		for c := range nClasses {
			i := nClasses*w + c
			l := m.closed[i]
			keep := l & b.at(i)
			if gone := l &^ keep; gone != 0 {
				m.settle(c, w, gone, d)
				m.closed[i], dropped = keep, true
			}
		}
		m.nClosed += bits.OnesCount64(m.closed[nClasses*w+classAny])
	}
	m.shrink()
	return dropped
}

// drop settles a closed rank, in the classes of e, where its prefix ends
// at depth d, if it is still live there. It reports whether it was.
func (m *matcher) drop(e end, d int32) bool {
	i, bit := nClasses*int(e.slot/64), uint64(1)<<(e.slot%64)
	if m.closed[i+classAny]&bit == 0 {
		return false // not a closed candidate, or gone already
	}
	dropped := false
	for c := range nClasses {
		if e.classes&(1<<c) != 0 && m.closed[i+c]&bit != 0 {
			m.closed[i+c] &^= bit
			m.reach[c][e.slot] = d
			dropped = true
		}
	}
	if m.closed[i+classAny]&bit == 0 {
		m.nClosed--
	}
	return dropped
}

// holdsAll reports whether every closed rank holds node n (nil: no rank
// does) in each class it is live in.
//
// Where every rank of the shard is plain (see slot.plain), anyone holding
// a node further down the prompt's path holds the path up to it, so is a
// closed rank still live there: every closed rank holds n in a class when
// as many ranks hold it there as are live. Counting needs only the node,
// which keeps its holder count, where comparing needs its holders.
func (m *matcher) holdsAll(n *node) bool {
	if n == nil {
		return false
	}
	if m.counted {
		return m.ix.holdCounts(n) == m.live
	}
	b := m.bitsOf(n, m.lo, m.hi)
	for i := nClasses * m.lo; i < nClasses*m.hi; i++ {
		if m.closed[i]&^b.at(i) != 0 {
			return false
		}
	}
	return true
}

// gallop moves the closed ranks (there are no exact ones) from depth (node
// n) as far as they all hold the prompt. It returns the new depth, its node
// and the node's id; from there the next block drops a rank, or it is the
// last. It first tries where an earlier match found the next drop from n
// (see runHints), then searches exponentially far ahead and bisects.
func (m *matcher) gallop(depth int, n *node, id uint32) (int, *node, uint32) {
	last := len(m.seq) - 1
	if m.counted = m.ix.notPlain == 0; m.counted {
		m.live = [nClasses]int{}
		for i := nClasses * m.lo; i < nClasses*m.hi; i++ {
			m.live[i%nClasses] += bits.OnesCount64(m.closed[i])
		}
	}
	from, fromID := depth, id
	hints := m.ix.runHints()
	k, had := hints.get(id)
	if had && depth+k <= last {
		to := depth + k
		if to < last {
			m.sink += m.ix.nodes.touch(m.seq[to+1])
		}
		nt, tid := n, id
		if k > 0 {
			m.probes++
			nt, tid = m.ix.lookup(m.seq[to])
			if !m.holdsAll(nt) { // the drop came nearer
				depth, n, id = m.bisect(depth, to, n, id)
				hints.put(fromID, depth-from)
				return depth, n, id
			}
		}
		if to == last {
			return to, nt, tid
		}
		m.probes++
		nu, uid := m.ix.lookup(m.seq[to+1])
		if !m.holdsAll(nu) {
			return to, nt, tid
		}
		depth, n, id = to+1, nu, uid // the drop went further
	}
	depth, n, id = m.ahead(depth, n, id)
	if !had || depth-from != k {
		hints.put(fromID, depth-from)
	}
	return depth, n, id
}

// ahead is gallop's search: exponentially far ahead of depth (node n, id),
// then by bisection.
func (m *matcher) ahead(depth int, n *node, id uint32) (int, *node, uint32) {
	last := len(m.seq) - 1
	st := &m.ix.nodes
	// The blocks the exponential search may look at are known: look them
	// all up at once, so that their cache misses overlap.
	var at [48]int32
	var ids [48]uint32
	k := 0
	for d, stride := depth, 2*gallopAfter; d < last && k < len(at); stride *= 2 {
		d = min(d+stride, last)
		at[k] = int32(d)
		k++
	}
	for i := range k {
		m.sink += st.touch(m.seq[at[i]])
	}
	for i := range k {
		ids[i] = st.find(m.seq[at[i]])
	}
	m.probes += k
	for i := range k { // at[k-1] is the last block: 8<<47 blocks are more than any prompt
		to, tid := int(at[i]), ids[i]
		var nt *node
		if tid != 0 {
			nt = st.get(tid)
		}
		if !m.holdsAll(nt) {
			return m.bisect(depth, to, n, id)
		}
		depth, n, id = to, nt, tid
	}
	return depth, n, id
}

// bisect finds, between depth lo (node n, id), which every closed rank
// holds, and hi, which one does not, the last block they all hold.
func (m *matcher) bisect(lo, hi int, n *node, id uint32) (int, *node, uint32) {
	st := &m.ix.nodes
	for hi-lo > 1 {
		mid := (lo + hi) / 2
		if hi-lo > 3 { // the next step probes one of these
			m.sink += st.touch(m.seq[(lo+mid)/2]) + st.touch(m.seq[(mid+hi)/2])
		}
		m.probes++
		if nm, mi := m.ix.lookup(m.seq[mid]); m.holdsAll(nm) {
			lo, n, id = mid, nm, mi
		} else {
			hi = mid
		}
	}
	return lo, n, id
}

// bitsOf returns n's holders as classBits valid over words [lo, hi)
// (entries past its end are zero). For a node without its own classBits it
// fills m.node, which the next call overwrites.
func (m *matcher) bitsOf(n *node, lo, hi int) classBits {
	if n == nil {
		return nil
	}
	if b, ok := m.ix.denseBits(n); ok {
		return b
	}
	b := m.node[:nClasses*hi]
	clear(b[nClasses*lo:])
	for _, h := range m.ix.holders(n) {
		w := int(h.slot / 64)
		if w < lo || w >= hi {
			continue
		}
		bit, cl := uint64(1)<<(h.slot%64), classesOf(h.tiers)
		for c := range nClasses {
			if cl&(1<<c) != 0 {
				b[nClasses*w+c] |= bit
			}
		}
	}
	return b
}

// at returns word i of b, zero past its end.
func (b classBits) at(i int) uint64 {
	if i < len(b) {
		return b[i]
	}
	return 0
}

// stepExact applies the block at depth (node n, nil if no rank holds it)
// to every exact rank: who does not hold it in a class has matched depth
// blocks in it.
func (m *matcher) stepExact(depth int, n *node) {
	b, d := m.bitsOf(n, m.elo, m.ehi), int32(depth)
	live := m.exact[:nClasses*m.ehi]
	for w := m.elo; w < m.ehi; w++ {
		i := nClasses * w
		la := live[i+classAny]
		if la == 0 {
			continue
		}
		bd, bh, ba := b.at(i+classDev), b.at(i+classHost), b.at(i+classAny)
		ld, lh := live[i+classDev], live[i+classHost]
		if ld&^bd|lh&^bh|la&^ba == 0 {
			continue // every live rank of this word holds the block
		}
		m.settle(classDev, w, ld&^bd, d)
		m.settle(classHost, w, lh&^bh, d)
		m.settle(classAny, w, la&^ba, d)
		live[i+classDev], live[i+classHost], live[i+classAny] = ld&bd, lh&bh, la&ba
	}
	for m.elo < m.ehi && live[nClasses*m.elo+classAny] == 0 {
		m.elo++
	}
	for m.ehi > m.elo && live[nClasses*(m.ehi-1)+classAny] == 0 {
		m.ehi--
	}
}

// settle records that the ranks in word w of gone matched d blocks in class c.
func (m *matcher) settle(c, w int, gone uint64, d int32) {
	r := m.reach[c]
	for gone != 0 {
		r[w*64+bits.TrailingZeros64(gone)] = d
		gone &= gone - 1
	}
}

// shrink narrows [lo, hi) to the words with closed live ranks.
func (m *matcher) shrink() {
	for m.lo < m.hi && m.closed[nClasses*m.lo+classAny] == 0 {
		m.lo++
	}
	for m.hi > m.lo && m.closed[nClasses*(m.hi-1)+classAny] == 0 {
		m.hi--
	}
}

// emit appends an Overlap per candidate, in slot order.
func (m *matcher) emit(dst []Overlap) []Overlap {
	n := 0
	for _, x := range m.cands {
		n += bits.OnesCount64(x)
	}
	at := len(dst)
	dst = slices.Grow(dst, n)[:at+n]
	out := dst[at:]
	slots := m.ix.slots
	dev, host, disk := m.reach[classDev][:len(slots)], m.reach[classHost][:len(slots)], m.reach[classAny][:len(slots)]
	k := 0
	for w, x := range m.cands {
		for x != 0 {
			s := w*64 + bits.TrailingZeros64(x)
			x &= x - 1
			o := &out[k]
			sl := &slots[s]
			o.Worker, o.Device, o.Host, o.Disk, o.Blocks = sl.w, dev[s], host[s], disk[s], sl.blocks
			k++
		}
	}
	return dst
}

// blockCounts sets, in out, how many blocks each worker rank holds.
func (ix *shard) blockCounts(out map[WorkerRank]int) {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	for wr, w := range ix.workers {
		out[wr] = w.blocks.len()
	}
}

// rankBlocks returns how many blocks one worker rank holds (on any tier).
func (ix *shard) rankBlocks(wr WorkerRank) int {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	if w := ix.workers[wr]; w != nil {
		return w.blocks.len()
	}
	return 0
}

// stats returns the shard's current size.
func (ix *shard) stats() Stats {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	st := Stats{Workers: len(ix.workers), Nodes: ix.nodes.live, Handed: ix.handedRuns.Load()}
	for _, w := range ix.workers {
		st.Entries += w.blocks.len()
	}
	return st
}

// maxHintBits bounds a shard's runHints: at most 1<<maxHintBits words
// (256 KB).
const maxHintBits = 15

// minHints is the fewest words a shard's runHints has (8 KB).
const minHints = 1 << 10

// runHints remembers, per node where a match started looking ahead (see
// matcher.gallop), how many blocks further on it found the last block
// that every closed rank still matching held. Where every rank is closed,
// the ranks still matching at a node are those holding it, whatever the
// prompt, so the next match through the node finds the next drop where
// the last one did, unless an event has moved it since: it probes there
// first, then searches. An entry is only a guess, checked like any probe
// ahead, so a stale one, or one of a deleted node whose id was reused,
// costs a probe and is never wrong. Entries are words that matches, which
// share mu, write and read atomically; one node's entry may overwrite
// another's. The table has a word per 16 nodes the shard has had, a power
// of two from minHints to 1<<maxHintBits, so that the many small indexes
// of a fleet with many tenants stay small.
type runHints []atomic.Uint64

// runHints returns the shard's runHints, made (again, empty) where there
// are none yet or the shard has outgrown them. Called with mu held for
// reading.
func (ix *shard) runHints() runHints {
	want := min(max(1<<bits.Len32(ix.nodes.next/16), minHints), 1<<maxHintBits)
	p := ix.hints.Load()
	if p != nil && len(*p) >= want {
		return *p
	}
	h := make(runHints, want)
	if !ix.hints.CompareAndSwap(p, &h) {
		return *ix.hints.Load()
	}
	return h
}

// slot is node id's entry (Fibonacci hashing: ids are dense).
func (h runHints) slot(id uint32) *atomic.Uint64 {
	return &h[(id*0x9E3779B1)>>(32-bits.TrailingZeros(uint(len(h))))]
}

// get returns the distance remembered for node id, if any (no node has
// id 0, so an entry never written names none).
func (h runHints) get(id uint32) (int, bool) {
	e := h.slot(id).Load()
	if uint32(e>>32) != id {
		return 0, false
	}
	return int(uint32(e)), true
}

// put remembers distance k for node id.
func (h runHints) put(id uint32, k int) {
	h.slot(id).Store(uint64(id)<<32 | uint64(uint32(k)))
}
