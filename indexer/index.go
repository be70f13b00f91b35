package indexer

import (
	"errors"
	"fmt"
	"slices"
	"sync"
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
type Overlap struct {
	Worker WorkerRank
	Device int
	Host   int
	Disk   int
}

// holder records that a worker rank (by slot) holds a node on some tiers.
type holder struct {
	slot  uint32
	tiers Tier
}

// node is one block position in the prefix tree, keyed in Index.nodes by
// its sequence hash (which encodes the whole path from the root).
type node struct {
	local   uint64   // local hash of the block
	parent  uint64   // sequence hash of the parent; a root node's key equals local
	holders []holder // sorted by slot
	one     [1]holder
}

// worker is one worker rank's view: engine id -> sequence hash of every
// block it holds.
type worker struct {
	slot   uint32
	blocks map[uint64]uint64
}

// slot maps a compact holder id back to its worker rank.
type slot struct {
	w       WorkerRank
	retired bool // being removed; its holders are ignored by Match
}

// writeChunk is how many blocks a writer processes per lock hold, so a long
// event or a worker removal never stalls matches for long. Readers may
// observe a Stored or Removed event part-applied, which is the same state as
// applying its blocks one by one: never a torn one.
const writeChunk = 64

// Index is the KV block index of one (model, tenant): which worker ranks
// hold which blocks, on which tiers. It is safe for concurrent use: matches
// run concurrently with each other and with event application. Events of
// one worker rank must be applied in order by one goroutine at a time.
type Index struct {
	blockSize int

	mu      sync.RWMutex
	nodes   map[uint64]*node
	workers map[WorkerRank]*worker
	slots   []slot
	free    []uint32 // reusable slots
	entries int      // (block, worker rank) pairs held
}

// NewIndex returns an empty index for blocks of blockSize tokens.
func NewIndex(blockSize int) *Index {
	return &Index{
		blockSize: blockSize,
		nodes:     make(map[uint64]*node),
		workers:   make(map[WorkerRank]*worker),
	}
}

// BlockSize returns the number of tokens per block.
func (ix *Index) BlockSize() int { return ix.blockSize }

// Apply applies one event. On error the index is unchanged.
func (ix *Index) Apply(ev Event) (ApplyResult, error) {
	switch ev.Kind {
	case Stored:
		if !ev.Tier.single() {
			return ApplyResult{}, fmt.Errorf("%w: stored event with tier %s", ErrBadEvent, ev.Tier)
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

func (ix *Index) store(ev Event) (ApplyResult, error) {
	var res ApplyResult
	ix.mu.Lock()
	w := ix.workers[ev.Worker]
	var prev uint64
	hasPrev := ev.HasParent
	if hasPrev {
		var ok bool
		if w != nil {
			prev, ok = w.blocks[ev.Parent]
		}
		if !ok {
			ix.mu.Unlock()
			return res, fmt.Errorf("%w %d for %s", ErrUnknownParent, ev.Parent, ev.Worker)
		}
	}
	if w == nil {
		w = ix.addWorker(ev.Worker)
	}
	for i, b := range ev.Blocks {
		if i > 0 && i%writeChunk == 0 {
			ix.mu.Unlock()
			ix.mu.Lock()
			if ix.workers[ev.Worker] != w {
				// The worker was removed meanwhile: the rest has no parent.
				ix.mu.Unlock()
				return res, nil
			}
		}
		key := b.Local
		if hasPrev {
			key = NextSequenceHash(prev, b.Local)
		}
		if old, ok := w.blocks[b.Hash]; ok && old != key {
			// The engine reused an id for other content: the old block is gone.
			res.Removed += ix.detach(w, b.Hash, old, AllTiers)
		}
		n := ix.nodes[key]
		if n == nil {
			n = &node{local: b.Local, parent: prev}
			n.holders = n.one[:0]
			ix.nodes[key] = n
		}
		if n.add(w.slot, ev.Tier) {
			res.Stored++
		}
		if _, ok := w.blocks[b.Hash]; !ok {
			w.blocks[b.Hash] = key
			ix.entries++
		}
		prev, hasPrev = key, true
	}
	ix.mu.Unlock()
	return res, nil
}

func (ix *Index) remove(wr WorkerRank, tier Tier, hashes []uint64) ApplyResult {
	var res ApplyResult
	ix.mu.Lock()
	defer ix.mu.Unlock()
	w := ix.workers[wr]
	for i, h := range hashes {
		if i > 0 && i%writeChunk == 0 {
			ix.mu.Unlock()
			ix.mu.Lock()
			w = ix.workers[wr]
		}
		key, ok := uint64(0), false
		if w != nil {
			key, ok = w.blocks[h]
		}
		if !ok {
			res.Unknown++
			continue
		}
		if ix.detach(w, h, key, tier) == 0 {
			res.Unknown++
		} else {
			res.Removed++
		}
	}
	return res
}

// detach drops tiers of the block with engine id h (node key) from w and
// returns how many (block, tier) entries that removed. Called with mu held.
//
// Two engine ids may name the same block (the engine stored one content
// twice); dropping one drops the holder, and the other id then finds no
// holder: it is forgotten without touching any node.
func (ix *Index) detach(w *worker, h, key uint64, tiers Tier) int {
	var left Tier
	removed := 0
	if n := ix.nodes[key]; n != nil {
		left, removed = n.drop(w.slot, tiers)
		if len(n.holders) == 0 {
			delete(ix.nodes, key)
		}
	}
	if left == 0 {
		delete(w.blocks, h)
		ix.entries--
	}
	return removed
}

func (ix *Index) clear(wr WorkerRank, tiers Tier) ApplyResult {
	var res ApplyResult
	ix.mu.Lock()
	w := ix.workers[wr]
	if w == nil {
		ix.mu.Unlock()
		return res
	}
	ids := make([]uint64, 0, len(w.blocks))
	for h := range w.blocks {
		ids = append(ids, h)
	}
	for i, h := range ids {
		if i > 0 && i%writeChunk == 0 {
			ix.mu.Unlock()
			ix.mu.Lock()
			if ix.workers[wr] != w {
				break
			}
		}
		if key, ok := w.blocks[h]; ok {
			res.Removed += ix.detach(w, h, key, tiers)
		}
	}
	ix.mu.Unlock()
	return res
}

// RemoveWorker drops every block of every rank of worker.
func (ix *Index) RemoveWorker(worker uint64) {
	ix.mu.RLock()
	var ranks []WorkerRank
	for wr := range ix.workers {
		if wr.Worker == worker {
			ranks = append(ranks, wr)
		}
	}
	ix.mu.RUnlock()
	for _, wr := range ranks {
		ix.RemoveWorkerRank(wr)
	}
}

// RemoveWorkerRank drops every block of one worker rank. Matches never see
// the rank half-removed: its slot is retired first.
func (ix *Index) RemoveWorkerRank(wr WorkerRank) {
	ix.mu.Lock()
	w := ix.workers[wr]
	if w == nil {
		ix.mu.Unlock()
		return
	}
	delete(ix.workers, wr)
	ix.slots[w.slot].retired = true
	ids := make([]uint64, 0, len(w.blocks))
	for h := range w.blocks {
		ids = append(ids, h)
	}
	for i, h := range ids {
		if i > 0 && i%writeChunk == 0 {
			ix.mu.Unlock()
			ix.mu.Lock()
		}
		ix.detach(w, h, w.blocks[h], AllTiers)
	}
	ix.slots[w.slot] = slot{}
	ix.free = append(ix.free, w.slot)
	ix.mu.Unlock()
}

// addWorker creates the state of a new worker rank. Called with mu held.
func (ix *Index) addWorker(wr WorkerRank) *worker {
	var s uint32
	if n := len(ix.free); n > 0 {
		s = ix.free[n-1]
		ix.free = ix.free[:n-1]
		ix.slots[s] = slot{w: wr}
	} else {
		s = uint32(len(ix.slots))
		ix.slots = append(ix.slots, slot{w: wr})
	}
	w := &worker{slot: s, blocks: make(map[uint64]uint64)}
	ix.workers[wr] = w
	return w
}

// add records that slot s holds n on tier t; it reports whether that was new.
func (n *node) add(s uint32, t Tier) bool {
	i, found := slices.BinarySearchFunc(n.holders, s, cmpSlot)
	if found {
		if n.holders[i].tiers&t != 0 {
			return false
		}
		n.holders[i].tiers |= t
		return true
	}
	n.holders = slices.Insert(n.holders, i, holder{slot: s, tiers: t})
	return true
}

// drop clears tiers of slot s in n. It returns the tiers s still holds and
// how many tiers were cleared.
func (n *node) drop(s uint32, tiers Tier) (left Tier, removed int) {
	i, found := slices.BinarySearchFunc(n.holders, s, cmpSlot)
	if !found {
		return 0, 0
	}
	h := &n.holders[i]
	removed = bitCount(h.tiers & tiers)
	h.tiers &^= tiers
	left = h.tiers
	if left == 0 {
		n.holders = slices.Delete(n.holders, i, i+1)
	}
	return left, removed
}

func cmpSlot(h holder, s uint32) int {
	switch {
	case h.slot < s:
		return -1
	case h.slot > s:
		return 1
	}
	return 0
}

func bitCount(t Tier) int {
	c := 0
	for ; t != 0; t &= t - 1 {
		c++
	}
	return c
}

// cand is a worker rank still matching during a walk, with its reach so far.
type cand struct {
	slot            uint32
	dev, host, disk int
}

// matchScratch is reused between matches to keep them allocation-free.
type matchScratch struct {
	cands []cand
	live  []int32 // indexes into cands whose any-tier reach equals the depth
	next  []int32
}

var scratchPool = sync.Pool{New: func() any { return new(matchScratch) }}

// Match walks the prefix given by seq (the prompt's sequence hashes, see
// SequenceHashes) and appends to dst one Overlap per worker rank holding at
// least its first block, in slot order. It returns the extended slice.
func (ix *Index) Match(seq []uint64, dst []Overlap) []Overlap {
	if len(seq) == 0 {
		return dst
	}
	sc := scratchPool.Get().(*matchScratch)
	cands, live, next := sc.cands[:0], sc.live[:0], sc.next[:0]

	ix.mu.RLock()
	for depth, key := range seq {
		n := ix.nodes[key]
		if n == nil {
			break
		}
		if depth == 0 {
			for _, h := range n.holders {
				if ix.slots[h.slot].retired {
					continue
				}
				c := cand{slot: h.slot, disk: 1}
				c.reach(h.tiers, 0)
				live = append(live, int32(len(cands)))
				cands = append(cands, c)
			}
		} else {
			next = next[:0]
			hs := n.holders
			if len(live)*8 < len(hs) {
				for _, ci := range live {
					c := &cands[ci]
					if i, ok := slices.BinarySearchFunc(hs, c.slot, cmpSlot); ok {
						c.reach(hs[i].tiers, depth)
						next = append(next, ci)
					}
				}
			} else {
				i := 0
				for _, ci := range live {
					c := &cands[ci]
					for i < len(hs) && hs[i].slot < c.slot {
						i++
					}
					if i < len(hs) && hs[i].slot == c.slot {
						c.reach(hs[i].tiers, depth)
						next = append(next, ci)
					}
				}
			}
			live, next = next, live
		}
		if len(live) == 0 {
			break
		}
	}
	for _, c := range cands {
		dst = append(dst, Overlap{Worker: ix.slots[c.slot].w, Device: c.dev, Host: c.host, Disk: c.disk})
	}
	ix.mu.RUnlock()

	sc.cands, sc.live, sc.next = cands, live, next
	scratchPool.Put(sc)
	return dst
}

// reach extends c's per-tier reach with a block at depth held on tiers.
func (c *cand) reach(tiers Tier, depth int) {
	if c.dev == depth && tiers&TierDevice != 0 {
		c.dev++
	}
	if c.host == depth && tiers&(TierDevice|TierHost) != 0 {
		c.host++
	}
	if depth > 0 {
		c.disk++
	}
}

// MatchTokens hashes the full blocks of tokens (for adapter lora, "" for the
// base model) and matches them; see Match.
func (ix *Index) MatchTokens(tokens []uint32, lora string, dst []Overlap) []Overlap {
	local := LocalHashes(make([]uint64, 0, len(tokens)/max(ix.blockSize, 1)), tokens, ix.blockSize, LoRASeed(lora), nil)
	return ix.Match(SequenceHashes(local[:0:0], local), dst)
}

// BlockCounts returns how many blocks each worker rank holds (on any tier).
func (ix *Index) BlockCounts() map[WorkerRank]int {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	out := make(map[WorkerRank]int, len(ix.workers))
	for wr, w := range ix.workers {
		out[wr] = len(w.blocks)
	}
	return out
}

// Stats describes the size of an index.
type Stats struct {
	Workers int // worker ranks with state
	Nodes   int // distinct block positions
	Entries int // (block, worker rank) pairs
}

// Stats returns the index's current size.
func (ix *Index) Stats() Stats {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	return Stats{Workers: len(ix.workers), Nodes: len(ix.nodes), Entries: ix.entries}
}
