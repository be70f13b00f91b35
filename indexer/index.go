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
		if ok {
			if n := ix.nodes[key]; n != nil {
				hd = n.find(w.slot)
			}
		}
		if hd == nil {
			res.Unknown++
			continue
		}
		if hd.tiers&tier == 0 {
			sl.retier(hd.tiers, hd.tiers|tier)
			hd.tiers |= tier
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

// cand is a worker rank still matching during a walk, with its reach so far.
type cand struct {
	slot            uint32
	dev, host, disk int32
	exact           bool // must be walked block by block (see slot.jumpable)
}

// reach extends c's per-tier reach with a block at depth held on tiers.
func (c *cand) reach(tiers Tier, depth int) {
	d := int32(depth)
	if c.dev == d && tiers&TierDevice != 0 {
		c.dev++
	}
	if c.host == d && tiers&(TierDevice|TierHost) != 0 {
		c.host++
	}
	c.disk = d + 1
}

// matcher is the state of one Match; its slices are reused between matches.
type matcher struct {
	ix     *Index
	seq    []uint64
	cands  []cand
	live   []int32 // candidates holding every block so far, in slot order
	next   []int32
	drop   []int32
	rest   []int32
	tiers  []Tier // tiers of live[i] on the node looked up last; 0 = absent
	exact  int    // live candidates that must be walked block by block
	stride int    // next jump length; doubles after each jump
}

var matcherPool = sync.Pool{New: func() any { return new(matcher) }}

// Match walks the prefix given by seq (the prompt's sequence hashes, see
// SequenceHashes) and appends to dst one Overlap per worker rank holding at
// least its first block, in slot order. It returns the extended slice.
//
// While any rank still matching needs it, the walk goes block by block.
// Otherwise it searches exponentially (1, 2, 4, ... blocks ahead), and finds
// where ranks dropped out by bisection: exact, because those ranks hold
// only device-tier, prefix-closed blocks.
func (ix *Index) Match(seq []uint64, dst []Overlap) []Overlap {
	if len(seq) == 0 {
		return dst
	}
	m := matcherPool.Get().(*matcher)
	m.ix, m.seq, m.exact, m.stride = ix, seq, 0, 1
	m.cands, m.live = m.cands[:0], m.live[:0]

	ix.mu.RLock()
	m.run()
	dst = slices.Grow(dst, len(m.cands))
	slots := ix.slots
	for _, c := range m.cands {
		dst = append(dst, Overlap{Worker: slots[c.slot].w, Device: int(c.dev), Host: int(c.host), Disk: int(c.disk)})
	}
	ix.mu.RUnlock()

	m.ix, m.seq = nil, nil
	matcherPool.Put(m)
	return dst
}

func (m *matcher) run() {
	n := m.ix.nodes[m.seq[0]]
	if n == nil {
		return
	}
	cands, live := slices.Grow(m.cands, len(n.holders)), slices.Grow(m.live, len(n.holders))
	slots := m.ix.slots
	for _, h := range n.holders {
		s := &slots[h.slot]
		if s.retired {
			continue
		}
		c := cand{slot: h.slot, exact: !s.jumpable()}
		c.reach(h.tiers, 0)
		if c.exact {
			m.exact++
		}
		live = append(live, int32(len(cands)))
		cands = append(cands, c)
	}
	m.cands, m.live = cands, live
	for depth := 0; len(m.live) > 0 && depth < len(m.seq)-1; {
		if m.exact > 0 {
			depth++
			m.step(depth)
			m.stride = 1
		} else {
			depth = m.jump(depth)
		}
	}
}

// lookup sets m.tiers[i] to the tiers on which live[i] holds node n.
func (m *matcher) lookup(n *node, live []int32) {
	m.tiers = slices.Grow(m.tiers[:0], len(live))[:len(live)]
	clear(m.tiers)
	if n == nil {
		return
	}
	hs := n.holders
	if len(live)*8 < len(hs) {
		for i, ci := range live {
			if j, ok := slices.BinarySearchFunc(hs, m.cands[ci].slot, cmpSlot); ok {
				m.tiers[i] = hs[j].tiers
			}
		}
		return
	}
	j := 0
	for i, ci := range live {
		s := m.cands[ci].slot
		for j < len(hs) && hs[j].slot < s {
			j++
		}
		if j < len(hs) && hs[j].slot == s {
			m.tiers[i] = hs[j].tiers
		}
	}
}

// step extends every live candidate by the block at depth.
func (m *matcher) step(depth int) {
	m.lookup(m.ix.nodes[m.seq[depth]], m.live)
	m.next = m.next[:0]
	for i, ci := range m.live {
		c := &m.cands[ci]
		if t := m.tiers[i]; t != 0 {
			c.reach(t, depth)
			m.next = append(m.next, ci)
		} else if c.exact {
			m.exact--
		}
	}
	m.live, m.next = m.next, m.live
}

// jump moves every live (jumpable) candidate from depth, which they all
// hold, to depth+stride (or the last block), and settles those that dropped
// out in between. It returns the new depth.
func (m *matcher) jump(depth int) int {
	to := min(depth+m.stride, len(m.seq)-1)
	m.stride *= 2
	m.lookup(m.ix.nodes[m.seq[to]], m.live)
	m.next, m.drop = m.next[:0], m.drop[:0]
	for i, ci := range m.live {
		if m.tiers[i] != 0 {
			m.cands[ci].settle(to + 1)
			m.next = append(m.next, ci)
		} else {
			m.drop = append(m.drop, ci)
		}
	}
	m.live, m.next = m.next, m.live
	m.bisect(depth, to, m.drop)
	return to
}

// bisect settles candidates d that all hold the block at lo and none at hi.
func (m *matcher) bisect(lo, hi int, d []int32) {
	for len(d) > 0 {
		if hi-lo == 1 {
			for _, ci := range d {
				m.cands[ci].settle(hi)
			}
			return
		}
		mid := (lo + hi) / 2
		m.lookup(m.ix.nodes[m.seq[mid]], d)
		// Stable partition (lookup's merge needs slot order): holders of
		// mid first, the rest after.
		held, rest := 0, m.rest[:0]
		for i, ci := range d {
			if m.tiers[i] != 0 {
				d[held] = ci
				held++
			} else {
				rest = append(rest, ci)
			}
		}
		copy(d[held:], rest)
		m.rest = rest
		m.bisect(mid, hi, d[:held])
		d, hi = d[held:], mid
	}
}

// settle sets a jumpable candidate's reach: all its blocks are on device.
func (c *cand) settle(blocks int) {
	b := int32(blocks)
	c.dev, c.host, c.disk = b, b, b
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
