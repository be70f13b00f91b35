package indexer

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math/bits"
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
	// kids counts the rank's holders on child nodes of this node
	// (saturating at maxKids, after which it is never decremented).
	kids uint16
}

const maxKids = 1<<16 - 1

// node is one block position in the prefix tree, keyed in Index.nodes by
// its sequence hash (which encodes the whole path from the root).
type node struct {
	local   uint64   // local hash of the block
	parent  uint64   // sequence hash of the parent; a root node's key equals local
	holders []holder // sorted by slot
	one     [1]holder
	bits    *classBits // the holders again, once there are many (see Index.sync)
}

// worker is one worker rank's view: engine id -> sequence hash of every
// block it holds.
//
// Match may jump over blocks of a rank whose blocks are prefix-closed (it
// holds the parent of every block it holds) and all in device memory only;
// holes and lower say when that is not known to hold.
type worker struct {
	slot   uint32
	blocks map[uint64]uint64
}

// slot maps a compact holder id back to its worker rank, and keeps what
// Match needs to know of the rank in one contiguous array.
//
// Match may jump over blocks of a rank whose blocks are prefix-closed (it
// holds the parent of every block it holds) and in device memory only;
// holes and lower say when that is not known to hold.
type slot struct {
	w WorkerRank
	// holes counts removals of a block while the rank held a child of it:
	// a conservative count of orphaned blocks, reset when the rank is empty.
	holes int32
	// lower counts the rank's holders with a tier other than device.
	lower   int32
	retired bool // being removed; its holders are ignored by Match
}

// jumpable reports whether Match may skip over this rank's blocks.
func (s *slot) jumpable() bool { return s.holes == 0 && s.lower == 0 }

// retier accounts for a holder's tiers changing from before to after.
func (s *slot) retier(before, after Tier) {
	if before != 0 && before != TierDevice {
		s.lower--
	}
	if after != 0 && after != TierDevice {
		s.lower++
	}
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

	// denseHolders, if positive, overrides denseAt (tests use it to give
	// every node classBits).
	denseHolders int
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
	var parent *node // node of the previous block, once known
	sl := &ix.slots[w.slot]
	for i, b := range ev.Blocks {
		if i > 0 && i%writeChunk == 0 {
			ix.mu.Unlock()
			ix.mu.Lock()
			if ix.workers[ev.Worker] != w {
				// The worker was removed meanwhile: the rest has no parent.
				ix.mu.Unlock()
				return res, nil
			}
			parent, sl = nil, &ix.slots[w.slot]
		}
		key := b.Local
		if hasPrev {
			key = NextSequenceHash(prev, b.Local)
			if parent == nil {
				parent = ix.nodes[prev]
			}
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
		h, isNew := n.holderOf(w.slot)
		if h.tiers&ev.Tier == 0 {
			res.Stored++
			sl.retier(h.tiers, h.tiers|ev.Tier)
			h.tiers |= ev.Tier
			ix.sync(n, w.slot, h.tiers)
		}
		if isNew && hasPrev {
			if ph := parent.find(w.slot); ph != nil {
				if ph.kids < maxKids {
					ph.kids++
				}
			} else {
				sl.holes++ // placed under a parent the rank holds by id only
			}
		}
		w.blocks[b.Hash] = key
		prev, hasPrev, parent = key, true, n
	}
	ix.mu.Unlock()
	return res, nil
}

// storeByID adds tier to the blocks of hashes the worker rank holds.
func (ix *Index) storeByID(wr WorkerRank, tier Tier, hashes []uint64) ApplyResult {
	var res ApplyResult
	ix.mu.Lock()
	defer ix.mu.Unlock()
	w := ix.workers[wr]
	if w == nil {
		res.Unknown = len(hashes)
		return res
	}
	sl := &ix.slots[w.slot]
	for _, h := range hashes {
		key, ok := w.blocks[h]
		var hd *holder
		var n *node
		if ok {
			n = ix.nodes[key]
			hd = n.find(w.slot)
		}
		if hd == nil {
			res.Unknown++
			continue
		}
		if hd.tiers&tier == 0 {
			sl.retier(hd.tiers, hd.tiers|tier)
			hd.tiers |= tier
			ix.sync(n, w.slot, hd.tiers)
			res.Stored++
		}
	}
	return res
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
	sl := &ix.slots[w.slot]
	if n := ix.nodes[key]; n != nil {
		if i, ok := slices.BinarySearchFunc(n.holders, w.slot, cmpSlot); ok {
			hd := &n.holders[i]
			removed = bits.OnesCount8(uint8(hd.tiers & tiers))
			left = hd.tiers &^ tiers
			sl.retier(hd.tiers, left)
			hd.tiers = left
			if left == 0 {
				if hd.kids > 0 {
					sl.holes++ // its children held by the rank are orphans now
				}
				n.holders = slices.Delete(n.holders, i, i+1)
				if key != n.local { // not a root: one child less for the parent
					if ph := ix.nodes[n.parent].find(w.slot); ph != nil && ph.kids > 0 && ph.kids < maxKids {
						ph.kids--
					}
				}
			}
			if removed > 0 {
				ix.sync(n, w.slot, left)
			}
		}
		if len(n.holders) == 0 {
			delete(ix.nodes, key)
		}
	}
	if left == 0 {
		delete(w.blocks, h)
		if len(w.blocks) == 0 {
			sl.holes = 0
		}
	}
	return removed
}

func (ix *Index) clear(wr WorkerRank, tiers Tier) ApplyResult {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	w := ix.workers[wr]
	if w == nil {
		return ApplyResult{}
	}
	return ApplyResult{Removed: ix.detachAll(w, tiers, func() bool { return ix.workers[wr] == w })}
}

// detachAll drops tiers from every block of w, releasing the lock every
// writeChunk blocks; after each release it goes on only while current()
// holds. Called with mu held, it returns with mu held.
func (ix *Index) detachAll(w *worker, tiers Tier, current func() bool) (removed int) {
	ids := slices.Collect(maps.Keys(w.blocks))
	for i, h := range ids {
		if i > 0 && i%writeChunk == 0 {
			ix.mu.Unlock()
			ix.mu.Lock()
			if !current() {
				break
			}
		}
		if key, ok := w.blocks[h]; ok {
			removed += ix.detach(w, h, key, tiers)
		}
	}
	return removed
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
	ix.detachAll(w, AllTiers, func() bool { return true })
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
	} else {
		s = uint32(len(ix.slots))
		ix.slots = append(ix.slots, slot{})
	}
	w := &worker{slot: s, blocks: make(map[uint64]uint64)}
	ix.slots[s] = slot{w: wr}
	ix.workers[wr] = w
	return w
}

// holderOf returns the holder of slot s in n, inserting an empty one
// (reported by isNew) if there is none.
func (n *node) holderOf(s uint32) (h *holder, isNew bool) {
	i, found := slices.BinarySearchFunc(n.holders, s, cmpSlot)
	if !found {
		n.holders = slices.Insert(n.holders, i, holder{slot: s})
	}
	return &n.holders[i], !found
}

// find returns the holder of slot s in n, or nil (also for a nil n).
func (n *node) find(s uint32) *holder {
	if n == nil {
		return nil
	}
	if i, ok := slices.BinarySearchFunc(n.holders, s, cmpSlot); ok {
		return &n.holders[i]
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
func (ix *Index) denseAt() int {
	if ix.denseHolders > 0 {
		return ix.denseHolders
	}
	return max(8, nClasses*((len(ix.slots)+63)/64))
}

// sync keeps n's classBits in step after slot s's holder changed to tiers t
// (0: the holder was deleted). Called with mu held.
func (ix *Index) sync(n *node, s uint32, t Tier) {
	at := ix.denseAt()
	switch {
	case n.bits == nil && len(n.holders) >= at:
		b := make(classBits, 0, nClasses*((len(ix.slots)+63)/64))
		for _, h := range n.holders {
			b.set(h.slot, h.tiers)
		}
		n.bits = &b
	case n.bits != nil && len(n.holders) < at/2:
		n.bits = nil
	case n.bits != nil:
		n.bits.set(s, t)
	}
}

// matcher is the state of one Match; its slices are reused between matches.
// Sets of ranks are bit sets over slots; per-class sets are interleaved as
// in classBits.
type matcher struct {
	ix     *Index
	seq    []uint64
	lo, hi int      // words of live that may be non-zero
	cands  []uint64 // ranks holding the first block: each gets an Overlap
	live   []uint64 // per class: ranks holding every block so far in it
	exact  []uint64 // live ranks that must be walked block by block
	node   []uint64 // a sparse node's holders as classBits (see bitsOf)
	levels [][]uint64
	reach  [nClasses][]int32 // per slot and class: blocks matched
	stride int               // next jump length; doubles after each jump
}

var matcherPool = sync.Pool{New: func() any { return new(matcher) }}

// Match walks the prefix given by seq (the prompt's sequence hashes, see
// SequenceHashes) and appends to dst one Overlap per worker rank holding at
// least its first block, in slot order. It returns the extended slice.
//
// The ranks still matching are a bit set, intersected with each node's
// holders a word at a time. While any of them needs it (see
// slot.jumpable), the walk goes block by block. Otherwise it searches
// exponentially (1, 2, 4, ... blocks ahead) and finds where ranks dropped
// out by bisection: exact, because those ranks hold only device-tier,
// prefix-closed blocks.
func (ix *Index) Match(seq []uint64, dst []Overlap) []Overlap {
	if len(seq) == 0 {
		return dst
	}
	m := matcherPool.Get().(*matcher)
	m.ix, m.seq, m.stride = ix, seq, 1
	ix.mu.RLock()
	if m.start() {
		m.run()
		dst = m.emit(dst)
	}
	ix.mu.RUnlock()
	m.ix, m.seq = nil, nil
	matcherPool.Put(m)
	return dst
}

// words resizes s to n zeroed words.
func words(s []uint64, n int) []uint64 {
	s = slices.Grow(s[:0], n)[:n]
	clear(s)
	return s
}

// start sets up the candidates from the first block's holders and applies
// that block. It reports whether any rank holds it.
func (m *matcher) start() bool {
	n := m.ix.nodes[m.seq[0]]
	if n == nil {
		return false
	}
	slots := m.ix.slots
	nw := (len(slots) + 63) / 64
	m.cands, m.exact = words(m.cands, nw), words(m.exact, nw)
	m.live, m.node = words(m.live, nClasses*nw), words(m.node, nClasses*nw)
	for c := range m.reach {
		m.reach[c] = slices.Grow(m.reach[c][:0], len(slots))[:len(slots)]
	}
	m.lo, m.hi = nw, 0
	for _, h := range n.holders {
		s := &slots[h.slot]
		if s.retired {
			continue
		}
		w, bit := int(h.slot/64), uint64(1)<<(h.slot%64)
		m.cands[w] |= bit
		if !s.jumpable() {
			m.exact[w] |= bit
		}
		m.lo, m.hi = min(m.lo, w), max(m.hi, w+1)
	}
	for w := m.lo; w < m.hi; w++ {
		for c := range nClasses {
			m.live[nClasses*w+c] = m.cands[w]
		}
	}
	if m.lo >= m.hi {
		return false
	}
	m.step(0, n)
	return true
}

func (m *matcher) run() {
	last := len(m.seq) - 1
	for depth := 0; m.lo < m.hi && depth < last; {
		if m.anyExact() {
			depth++
			m.step(depth, m.ix.nodes[m.seq[depth]])
			m.stride = 1
		} else {
			depth = m.jump(depth)
		}
	}
	// Whoever is still live holds the whole prompt in that class.
	all := int32(len(m.seq))
	for w := m.lo; w < m.hi; w++ {
		for c := range nClasses {
			m.settle(c, w, m.live[nClasses*w+c], all)
		}
	}
}

func (m *matcher) anyExact() bool {
	for _, x := range m.exact[m.lo:m.hi] {
		if x != 0 {
			return true
		}
	}
	return false
}

// bitsOf returns n's holders as classBits valid over words [m.lo, m.hi)
// (entries past its end are zero). For a node without its own classBits it
// fills m.node, which the next call overwrites.
func (m *matcher) bitsOf(n *node) classBits {
	if n == nil {
		return nil
	}
	if n.bits != nil {
		return *n.bits
	}
	b := m.node[:nClasses*m.hi]
	clear(b[nClasses*m.lo:])
	for _, h := range n.holders {
		w := int(h.slot / 64)
		if w < m.lo || w >= m.hi {
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

// step applies the block at depth (node n, nil if no rank holds it) to every
// live rank: who does not hold it in a class has matched depth blocks in it.
func (m *matcher) step(depth int, n *node) {
	b, d := m.bitsOf(n), int32(depth)
	live := m.live[:nClasses*m.hi]
	for w := m.lo; w < m.hi; w++ {
		i := nClasses * w
		la := live[i+classAny]
		if la == 0 {
			continue
		}
		var bd, bh, ba uint64
		if i+classAny < len(b) {
			bd, bh, ba = b[i+classDev], b[i+classHost], b[i+classAny]
		}
		ld, lh := live[i+classDev], live[i+classHost]
		if ld&^bd|lh&^bh|la&^ba == 0 {
			continue // every live rank of this word holds the block
		}
		m.settle(classDev, w, ld&^bd, d)
		m.settle(classHost, w, lh&^bh, d)
		m.settle(classAny, w, la&^ba, d)
		live[i+classDev], live[i+classHost], live[i+classAny] = ld&bd, lh&bh, la&ba
		m.exact[w] &= la & ba
	}
	m.shrink()
}

// settle records that the ranks in word w of gone matched d blocks in class c.
func (m *matcher) settle(c, w int, gone uint64, d int32) {
	r := m.reach[c]
	for gone != 0 {
		r[w*64+bits.TrailingZeros64(gone)] = d
		gone &= gone - 1
	}
}

// shrink narrows [lo, hi) to the words with live ranks.
func (m *matcher) shrink() {
	for m.lo < m.hi && m.live[nClasses*m.lo+classAny] == 0 {
		m.lo++
	}
	for m.hi > m.lo && m.live[nClasses*(m.hi-1)+classAny] == 0 {
		m.hi--
	}
}

// level returns bisection scratch set i, sized like m.cands.
func (m *matcher) level(i int) []uint64 {
	for len(m.levels) <= i {
		m.levels = append(m.levels, nil)
	}
	m.levels[i] = slices.Grow(m.levels[i][:0], len(m.cands))[:len(m.cands)]
	return m.levels[i]
}

// jump moves every live (hence jumpable: device-only, so equal in every
// class) rank from depth, which they all hold, to depth+stride (or the last
// block), and settles those that dropped out in between. It returns the new
// depth.
func (m *matcher) jump(depth int) int {
	to := min(depth+m.stride, len(m.seq)-1)
	m.stride *= 2
	b := m.bitsOf(m.ix.nodes[m.seq[to]])
	drop, dropped := m.level(0), false
	for w := m.lo; w < m.hi; w++ {
		l := m.live[nClasses*w+classAny]
		keep := l & b.at(nClasses*w+classAny)
		drop[w] = l &^ keep
		dropped = dropped || drop[w] != 0
		for c := range nClasses {
			m.live[nClasses*w+c] = keep
		}
	}
	if dropped {
		m.bisect(depth, to, 1, drop)
	}
	m.shrink()
	return to
}

// bisect settles the ranks of d (jumpable ones) that all hold the block at
// lo and none at hi, using scratch sets from level on.
func (m *matcher) bisect(lo, hi, level int, d []uint64) {
	for {
		if hi-lo == 1 {
			for w := m.lo; w < m.hi; w++ {
				for c := range nClasses {
					m.settle(c, w, d[w], int32(hi))
				}
			}
			return
		}
		mid := (lo + hi) / 2
		b := m.bitsOf(m.ix.nodes[m.seq[mid]])
		held, anyHeld, anyRest := m.level(level), false, false
		for w := m.lo; w < m.hi; w++ {
			x := d[w] & b.at(nClasses*w+classAny)
			held[w], d[w] = x, d[w]&^x
			anyHeld = anyHeld || x != 0
			anyRest = anyRest || d[w] != 0
		}
		if anyHeld {
			m.bisect(mid, hi, level+1, held)
		}
		if !anyRest {
			return
		}
		hi = mid
	}
}

// emit appends an Overlap per candidate, in slot order.
func (m *matcher) emit(dst []Overlap) []Overlap {
	n := 0
	for _, x := range m.cands {
		n += bits.OnesCount64(x)
	}
	dst = slices.Grow(dst, n)
	slots := m.ix.slots
	for w, x := range m.cands {
		for x != 0 {
			s := w*64 + bits.TrailingZeros64(x)
			x &= x - 1
			dst = append(dst, Overlap{Worker: slots[s].w,
				Device: int(m.reach[classDev][s]), Host: int(m.reach[classHost][s]), Disk: int(m.reach[classAny][s])})
		}
	}
	return dst
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

// RankBlocks returns how many blocks one worker rank holds (on any tier).
func (ix *Index) RankBlocks(wr WorkerRank) int {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	if w := ix.workers[wr]; w != nil {
		return len(w.blocks)
	}
	return 0
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
	st := Stats{Workers: len(ix.workers), Nodes: len(ix.nodes)}
	for _, w := range ix.workers {
		st.Entries += len(w.blocks)
	}
	return st
}
