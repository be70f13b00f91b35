package indexer

import "math/bits"

// The index's storage holds no Go pointers in its bulk, so that the garbage
// collector never scans it: nodes live by value in fixed-size chunks of a
// slab and are named by uint32 ids; the map from sequence hash to node id
// and each rank's map from engine id to node id are open-addressing
// tables of plain words, probed linearly in Robin Hood order (an entry
// further from its home slot than the one in a slot takes the slot and
// moves that one on, so that a miss stops early even when the table is
// nearly full) and emptied by backward shifting (no tombstones). Tables
// map a hash to its home slot by multiplication (no power-of-two sizes):
// node tables grow by a quarter when 9/10 full, engine id tables by half.
// The node table is split in nodeTables tables that grow one at a time, so
// that no growth stalls matches for long.

// nodeChunk is how many nodes a slab chunk holds.
const nodeChunk = 1 << 12

// maxLoadNum/maxLoadDen is the load factor past which a node table grows.
const maxLoadNum, maxLoadDen = 9, 10

// nodeTables is how many tables the node table is split into, by the top
// tableBits bits of a key's tag (see tableOf), so that a growth rehashes
// 1/nodeTables of the nodes, not all of them. The writer builds growths
// without the lock (see nodeStore.growths); add rehashes under it only
// where that estimate fell short. Why 1024, not 256 or 4096: BENCHMARKS.md,
// tenth session.
const (
	tableBits  = 10
	nodeTables = 1 << tableBits
)

// grown returns the size of an engine id table after growth from size.
func grown(size int) int { return max(16, size+size/2) }

// nodeTableGrown returns the size of a node table after growth from size.
// A quarter, not a half: the tables fill at the same pace and grow at
// about the same time, so their load swings together, between 0.72 and
// 0.9 instead of 0.6 and 0.9. They rehash more often; bench/indexload's
// apply rate did not show it (each holds 1/nodeTables of a shard's nodes).
func nodeTableGrown(size int) int { return max(16, size+size/4) }

// nodeStore is the slab of nodes and the table that finds them by key.
// Node id 0 is never used: it means "no node".
type nodeStore struct {
	chunks [][]node // each of nodeChunk nodes, never moved
	next   uint32   // ids below next were handed out
	free   uint32   // head of the free list, linked through node.only
	// tabs are the tables of live nodes, by the top tableBits bits of
	// the tag: slot value tag<<32 | id, 0 empty, where tag is the top half
	// of the key's mix; its other bits pick the home slot.
	tabs   [nodeTables][]uint64
	counts [nodeTables]int32 // live nodes per table
	live   int
	// rehashes counts the growths made by add, under the shard's lock:
	// none while the writer grows the tables ahead (see growths).
	rehashes int
}

// mix spreads a key's bits; its top 32 bits are a node's tag.
func mix(k uint64) uint64 {
	k ^= k >> 32
	k *= 0xd6e8feb86659fd93
	k ^= k >> 32
	return k
}

// tagOf returns the tag of key.
func tagOf(key uint64) uint32 { return uint32(mix(key) >> 32) }

// tableOf returns the node table of a tag.
func tableOf(tag uint32) uint32 { return tag >> (32 - tableBits) }

// home returns the slot a tag starts probing at in its table of size slots.
func home(tag uint32, size int) int { return int(uint64(tag<<tableBits) * uint64(size) >> 32) }

// get returns node id (which must have been handed out).
func (s *nodeStore) get(id uint32) *node { return &s.chunks[id/nodeChunk][id%nodeChunk] }

// find returns the id of the live node with key, or 0.
func (s *nodeStore) find(key uint64) uint32 {
	tag := tagOf(key)
	tab := s.tabs[tableOf(tag)]
	size := len(tab)
	if size == 0 {
		return 0
	}
	for i, d := home(tag, size), 0; ; d++ {
		e := tab[i]
		if e == 0 || tagDist(e, i, size) < d {
			return 0 // key would have taken this slot
		}
		if uint32(e>>32) == tag {
			if id := uint32(e); s.get(id).key == key {
				return id
			}
		}
		if i++; i == size {
			i = 0
		}
	}
}

// tagDist returns how far slot i is from the home of table value e, in a
// table of size slots.
func tagDist(e uint64, i, size int) int {
	d := i - home(uint32(e>>32), size)
	if d < 0 {
		d += size
	}
	return d
}

// add creates a node with key, which must not be live, and returns its id
// and the node, zeroed but for key.
func (s *nodeStore) add(key uint64) (uint32, *node) {
	tag := tagOf(key)
	sh := tableOf(tag)
	if int(s.counts[sh]+1)*maxLoadDen > len(s.tabs[sh])*maxLoadNum {
		tab := make([]uint64, nodeTableGrown(len(s.tabs[sh])))
		refill(tab, s.tabs[sh])
		s.tabs[sh] = tab
		s.rehashes++
	}
	id, n := s.alloc(key)
	placeTag(s.tabs[sh], uint64(tag)<<32|uint64(id))
	s.counts[sh]++
	s.live++
	return id, n
}

// alloc returns the id of a new node with key, zeroed but for key, which
// is not in the table (add lists it; a dead node never is).
func (s *nodeStore) alloc(key uint64) (uint32, *node) {
	var id uint32
	if s.free != 0 {
		id = s.free
		s.free = s.get(id).only
	} else {
		if s.next == 0 {
			s.next = 1
		}
		id = s.next
		if int(id/nodeChunk) == len(s.chunks) {
			s.chunks = append(s.chunks, make([]node, nodeChunk))
		}
		s.next++
	}
	n := s.get(id)
	*n = node{key: key}
	return id, n
}

// placeTag inserts table value e, whose node is not in tab, which has an
// empty slot: Robin Hood, as in blockTable.
func placeTag(tab []uint64, e uint64) {
	size := len(tab)
	for i, d := home(uint32(e>>32), size), 0; ; d++ {
		cur := tab[i]
		if cur == 0 {
			tab[i] = e
			return
		}
		if cd := tagDist(cur, i, size); cd < d {
			tab[i], e, d = e, cur, cd
		}
		if i++; i == size {
			i = 0
		}
	}
}

// refill places the entries of the table src in the empty table dst.
func refill(dst, src []uint64) {
	for _, e := range src {
		if e != 0 {
			placeTag(dst, e)
		}
	}
}

// tableGrowth is a node table grown ahead of the nodes that will fill it:
// table sh, to tab.
type tableGrowth struct {
	sh  uint32
	tab []uint64
}

// growths returns in dst the tables that adding nodes for fresh, keys
// that have none, would make grow, with their sizes: the shard's writer
// builds them (build) without the shard's lock and puts them in place
// (grow) with it, so that matches do not wait for a rehash. Called by the
// writer (see shard.write), with mu held or not: it only reads.
func (s *nodeStore) growths(fresh []uint64, dst []tableGrowth) []tableGrowth {
	dst = dst[:0]
	var pend [nodeTables]uint8 // fresh keys per table; at most writeChunk
	for _, key := range fresh {
		pend[tableOf(tagOf(key))]++
	}
	for _, key := range fresh {
		sh := tableOf(tagOf(key))
		n := int(s.counts[sh]) + int(pend[sh])
		if pend[sh] == 0 || n*maxLoadDen <= len(s.tabs[sh])*maxLoadNum {
			continue
		}
		pend[sh] = 0
		size := len(s.tabs[sh])
		for n*maxLoadDen > size*maxLoadNum {
			size = nodeTableGrown(size)
		}
		dst = append(dst, tableGrowth{sh: sh, tab: make([]uint64, size)})
	}
	return dst
}

// build fills the tables of gs with the entries of the tables they grow.
// Called by the shard's writer, with mu held or not.
func (s *nodeStore) build(gs []tableGrowth) {
	for _, g := range gs {
		refill(g.tab, s.tabs[g.sh])
	}
}

// grow puts the tables of gs in place of those they were built from,
// which must not have changed since: only the shard's writer changes
// them. Called with mu held.
func (s *nodeStore) grow(gs []tableGrowth) {
	for _, g := range gs {
		s.tabs[g.sh] = g.tab
	}
}

// del takes the live node id out of the table and frees it.
func (s *nodeStore) del(id uint32) {
	s.unlist(id)
	s.release(id)
}

// unlist takes the live node id out of the table: find no longer finds it,
// but the node stays where it is, with its id, until released.
func (s *nodeStore) unlist(id uint32) {
	tag := tagOf(s.get(id).key)
	sh := tableOf(tag)
	tab := s.tabs[sh]
	size := len(tab)
	i := home(tag, size)
	for uint32(tab[i]) != id {
		if i++; i == size {
			i = 0
		}
	}
	// Shift the rest of the run back by one, up to an entry at its home.
	for {
		j := i + 1
		if j == size {
			j = 0
		}
		if e := tab[j]; e == 0 || tagDist(e, j, size) == 0 {
			break
		}
		tab[i] = tab[j]
		i = j
	}
	tab[i] = 0
	s.counts[sh]--
	s.live--
}

// release frees the unlisted node id: its id may be handed out again.
func (s *nodeStore) release(id uint32) {
	*s.get(id) = node{only: s.free}
	s.free = id
}

// blockEntry maps an engine block id to the id of the node of the block
// (see worker): 12 bytes, as the id is kept in two 32-bit halves.
type blockEntry struct {
	lo, hi uint32 // the engine id's low and high halves
	node   uint32
}

// engineID returns the entry's engine id (0: an empty slot).
func (e *blockEntry) engineID() uint64 { return uint64(e.hi)<<32 | uint64(e.lo) }

func newBlockEntry(id uint64, node uint32) blockEntry {
	return blockEntry{lo: uint32(id), hi: uint32(id >> 32), node: node}
}

// blockTable is one rank's map from engine id to node id: Robin Hood
// linear probing (an entry further from its home slot than the one in a
// slot takes the slot and moves that one on), so that probe runs stay
// short at a high load and a miss stops early. Entries with id 0 are kept
// aside, as id 0 marks an empty slot.
type blockTable struct {
	tab      []blockEntry
	n        int // entries in tab
	zeroNode uint32
	hasZero  bool
	// gen counts the table's changes, so that a resized copy built
	// meanwhile can tell whether it is still the table's (see tableResize).
	gen uint32
}

// blockLoadNum/blockLoadDen is the load factor past which a blockTable grows.
const blockLoadNum, blockLoadDen = 9, 10

// A blockTable below load trimBelowNum/trimBelowDen after a removal shrinks
// to load trimToNum/trimToDen (see trim). A rank's table would otherwise
// stay at the size of its peak (its cache's capacity plus the longest
// request stored before the eviction that follows), at load ~0.6 once the
// rank evicts back to capacity. The gap between the two keeps a rank whose
// cache is full from growing and shrinking at every request: it grows only
// for a request of more than an eighth of its blocks.
const (
	trimBelowNum, trimBelowDen = 7, 10
	trimToNum, trimToDen       = 4, 5
)

func idHome(id uint64, size int) int {
	hi, _ := bits.Mul64(mix(id), uint64(size))
	return int(hi)
}

// dist returns how far slot i is from the home of id, in a table of size.
func dist(id uint64, i, size int) int {
	d := i - idHome(id, size)
	if d < 0 {
		d += size
	}
	return d
}

// len returns the number of entries.
func (t *blockTable) len() int {
	if t.hasZero {
		return t.n + 1
	}
	return t.n
}

// slot returns the slot of id in tab, or -1.
func (t *blockTable) slot(id uint64) int {
	size := len(t.tab)
	if size == 0 {
		return -1
	}
	for i, d := idHome(id, size), 0; ; d++ {
		e := &t.tab[i]
		eid := e.engineID()
		if eid == id {
			return i
		}
		if eid == 0 || dist(eid, i, size) < d {
			return -1 // id would have taken this slot
		}
		if i++; i == size {
			i = 0
		}
	}
}

// get returns the node of id.
func (t *blockTable) get(id uint64) (uint32, bool) {
	if id == 0 {
		return t.zeroNode, t.hasZero
	}
	if i := t.slot(id); i >= 0 {
		return t.tab[i].node, true
	}
	return 0, false
}

// put sets the node of id.
func (t *blockTable) put(id uint64, node uint32) {
	t.gen++
	if id == 0 {
		t.zeroNode, t.hasZero = node, true
		return
	}
	if i := t.slot(id); i >= 0 {
		t.tab[i].node = node
		return
	}
	t.reserve(1)
	robinHood(t.tab, newBlockEntry(id, node))
	t.n++
}

// reserve grows the table, if needed, so that extra more entries fit
// without another growth.
func (t *blockTable) reserve(extra int) {
	if size := t.reserveSize(extra); size > 0 {
		t.tab = t.resized(size)
		t.gen++
	}
}

// fit makes room for one more entry: a full table grows once for left
// more (the blocks left in a Stored event), not for one at a time, and
// only when it is full (a Stored event that copies held blocks to another
// tier adds no entries).
func (t *blockTable) fit(left int) {
	if (t.n+1)*blockLoadDen > len(t.tab)*blockLoadNum {
		t.reserve(left)
	}
}

// reserveSize returns the size reserve(extra) would grow the table to, 0
// if it fits.
func (t *blockTable) reserveSize(extra int) int {
	need := t.n + extra
	if need*blockLoadDen <= len(t.tab)*blockLoadNum {
		return 0
	}
	return max(grown(len(t.tab)), need*blockLoadDen/blockLoadNum+1)
}

// trim shrinks a table that removals left below load trimBelow to load
// trimTo. Called at the end of a removal, not on each deletion, so that an
// event's removals shrink it once.
func (t *blockTable) trim() {
	if size := t.trimSize(); size > 0 {
		t.tab = t.resized(size)
		t.gen++
	}
}

// trimSize returns the size trim would shrink the table to, 0 if none.
func (t *blockTable) trimSize() int {
	if t.n*trimBelowDen >= len(t.tab)*trimBelowNum || len(t.tab) <= 16 {
		return 0
	}
	return max(16, t.n*trimToDen/trimToNum+1)
}

// resized returns the table's entries in a new table of size slots. It
// only reads t: a writer builds it without the index's lock and takes the
// lock only to put it in place (see tableResize).
func (t *blockTable) resized(size int) []blockEntry {
	tab := make([]blockEntry, size)
	for _, e := range t.tab {
		if e.engineID() != 0 {
			robinHood(tab, e)
		}
	}
	return tab
}

// robinHood inserts e, whose id is not in tab, which has an empty slot.
func robinHood(tab []blockEntry, e blockEntry) {
	size := len(tab)
	for i, d := idHome(e.engineID(), size), 0; ; d++ {
		cur := &tab[i]
		cid := cur.engineID()
		if cid == 0 {
			*cur = e
			return
		}
		if cd := dist(cid, i, size); cd < d {
			*cur, e = e, *cur
			d = cd
		}
		if i++; i == size {
			i = 0
		}
	}
}

// del removes id and reports whether it was there.
func (t *blockTable) del(id uint64) bool {
	t.gen++
	if id == 0 {
		had := t.hasZero
		t.zeroNode, t.hasZero = 0, false
		return had
	}
	i := t.slot(id)
	if i < 0 {
		return false
	}
	// Shift the rest of the run back by one, up to an entry at its home.
	size := len(t.tab)
	for {
		j := i + 1
		if j == size {
			j = 0
		}
		if nid := t.tab[j].engineID(); nid == 0 || dist(nid, j, size) == 0 {
			break
		}
		t.tab[i] = t.tab[j]
		i = j
	}
	t.tab[i] = blockEntry{}
	t.n--
	if t.n == 0 {
		t.tab = nil // an emptied rank gives its memory back
	}
	return true
}

// ids appends every engine id to dst.
func (t *blockTable) ids(dst []uint64) []uint64 {
	if t.hasZero {
		dst = append(dst, 0)
	}
	for _, e := range t.tab {
		if id := e.engineID(); id != 0 {
			dst = append(dst, id)
		}
	}
	return dst
}

// each calls f for every entry.
func (t *blockTable) each(f func(id uint64, node uint32)) {
	if t.hasZero {
		f(0, t.zeroNode)
	}
	for _, e := range t.tab {
		if id := e.engineID(); id != 0 {
			f(id, e.node)
		}
	}
}

// each calls f for every live node.
func (s *nodeStore) each(f func(id uint32, n *node)) {
	for _, tab := range s.tabs {
		for _, e := range tab {
			if e != 0 {
				f(uint32(e), s.get(uint32(e)))
			}
		}
	}
}

// touch loads the first slot key would probe, so that a later find finds
// it in cache: a writer touches the slots of a whole chunk of blocks
// first, and their cache misses overlap.
func (s *nodeStore) touch(key uint64) uint64 {
	tag := tagOf(key)
	tab := s.tabs[tableOf(tag)]
	if len(tab) == 0 {
		return 0
	}
	return tab[home(tag, len(tab))]
}

// touch loads the first slot id would probe (see nodeStore.touch).
func (t *blockTable) touch(id uint64) uint64 {
	if len(t.tab) == 0 {
		return 0
	}
	return uint64(t.tab[idHome(id, len(t.tab))].node)
}

// holderArena keeps the holder lists of nodes held by several ranks, by
// value in blocks of plain holders: no slice header or pointer per list,
// and nothing for the garbage collector to scan. A list of n holders lives
// in a block of size class sizeClass(n) (exactly n holders up to 16, at
// most an eighth more beyond), so a list is named by its length and its
// block's number in that class; a list that changes class moves (see
// insert, remove). Each class keeps its blocks in chunks that never move,
// so a pointer to a holder stays valid until its own list changes; freed
// blocks are reused first, through a free list per class.
type holderArena struct {
	classes []holderClass // by size class, made as needed
}

// holderClass is the blocks of one size class.
type holderClass struct {
	size   int  // holders per block
	shift  uint // a chunk holds 1<<shift blocks
	chunks [][]holder
	// mores holds, per chunk, the extMore of each block (an index of
	// Index.mores, 0: none) whose node could not keep it (see
	// Index.moreIndex); a chunk's is made when first needed.
	mores [][]uint32
	next  uint32 // blocks handed out
	free  uint32 // 1 + the first free block, 0: none; linked through the first holder's slot, the same way
	used  int    // blocks in use
}

// arenaChunk is about how many holders a chunk of a size class holds.
const arenaChunk = 2048

// exactUpTo is the largest list kept in a block of its exact size.
const exactUpTo = 16

// sizeClass returns the size class of a list of n >= 2 holders: n-2 for
// n <= exactUpTo; above, eight classes per power of two.
func sizeClass(n int) int {
	if n <= exactUpTo {
		return n - 2
	}
	x := uint(n - 1)
	h := bits.Len(x) - 1 // >= 4
	return exactUpTo - 1 + (h-4)*8 + int(x>>(h-3)&7)
}

// classSize returns how many holders a block of size class c holds: the
// largest list of class c.
func classSize(c int) int {
	if c < exactUpTo-1 {
		return c + 2
	}
	c -= exactUpTo - 1
	return (9 + c%8) << (c/8 + 1)
}

// class returns size class c, making the classes up to it if needed.
func (a *holderArena) class(c int) *holderClass {
	for len(a.classes) <= c {
		size := classSize(len(a.classes))
		a.classes = append(a.classes, holderClass{size: size, shift: uint(max(0, bits.Len(uint(arenaChunk/size))-1))})
	}
	return &a.classes[c]
}

// list returns the list of n holders in block at of its class.
func (a *holderArena) list(at uint32, n int) []holder {
	k := &a.classes[sizeClass(n)]
	off := int(at&(1<<k.shift-1)) * k.size
	return k.chunks[at>>k.shift][off : off+n : off+n]
}

// alloc returns an unused block of size class c.
func (a *holderArena) alloc(c int) uint32 {
	k := a.class(c)
	k.used++
	if k.free != 0 {
		at := k.free - 1
		off := int(at&(1<<k.shift-1)) * k.size
		k.free = k.chunks[at>>k.shift][off].slot
		return at
	}
	at := k.next
	if int(at>>k.shift) == len(k.chunks) {
		k.chunks = append(k.chunks, make([]holder, k.size<<k.shift))
		k.mores = append(k.mores, nil)
	}
	k.next++
	return at
}

// release frees block at of size class c, and its extMore index.
func (a *holderArena) release(c int, at uint32) {
	k := &a.classes[c]
	ch, i := at>>k.shift, at&(1<<k.shift-1)
	if m := k.mores[ch]; m != nil {
		m[i] = 0
	}
	k.chunks[ch][int(i)*k.size].slot = k.free
	k.free = at + 1
	k.used--
}

// pair returns the block of a new list of holders x and y, in that order.
func (a *holderArena) pair(x, y holder) uint32 {
	at := a.alloc(sizeClass(2))
	l := a.list(at, 2)
	l[0], l[1] = x, y
	return at
}

// insert puts h at position i of the list of n holders in block at and
// returns the block of the list of n+1 holders, at or another one.
func (a *holderArena) insert(at uint32, n, i int, h holder) uint32 {
	c, nc := sizeClass(n), sizeClass(n+1)
	if c == nc {
		l := a.list(at, n+1)
		copy(l[i+1:], l[i:n])
		l[i] = h
		return at
	}
	nat := a.alloc(nc)
	src, dst := a.list(at, n), a.list(nat, n+1)
	copy(dst, src[:i])
	dst[i] = h
	copy(dst[i+1:], src[i:])
	a.moveMore(n, at, n+1, nat)
	a.release(c, at)
	return nat
}

// remove deletes position i of the list of n > 2 holders in block at and
// returns the block of the list of n-1 holders, at or another one.
func (a *holderArena) remove(at uint32, n, i int) uint32 {
	c, nc := sizeClass(n), sizeClass(n-1)
	if c == nc {
		l := a.list(at, n)
		copy(l[i:], l[i+1:])
		return at
	}
	nat := a.alloc(nc)
	src, dst := a.list(at, n), a.list(nat, n-1)
	copy(dst, src[:i])
	copy(dst[i:], src[i+1:])
	a.moveMore(n, at, n-1, nat)
	a.release(c, at)
	return nat
}

// more returns the extMore index of the list of n holders in block at (0:
// none).
func (a *holderArena) more(at uint32, n int) uint32 {
	k := &a.classes[sizeClass(n)]
	if m := k.mores[at>>k.shift]; m != nil {
		return m[at&(1<<k.shift-1)]
	}
	return 0
}

// setMore sets the extMore index of the list of n holders in block at.
func (a *holderArena) setMore(at uint32, n int, x uint32) {
	k := &a.classes[sizeClass(n)]
	ch := at >> k.shift
	if k.mores[ch] == nil {
		if x == 0 {
			return
		}
		k.mores[ch] = make([]uint32, 1<<k.shift)
	}
	k.mores[ch][at&(1<<k.shift-1)] = x
}

// moveMore moves the extMore index of a list that moved from block at
// (n holders) to block to (m holders).
func (a *holderArena) moveMore(n int, at uint32, m int, to uint32) {
	if x := a.more(at, n); x != 0 {
		a.setMore(to, m, x)
	}
}
