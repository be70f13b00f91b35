package indexer

import "math/bits"

// The index's tables hold no Go pointers, so that the garbage collector
// never scans them: each rank's map from engine id to block (blockTable,
// Robin Hood linear probing, emptied by backward shifting, sized by
// multiplication) and each shard's map from a span's first key to the
// span (headTable, linear probing in a power-of-two table).

// grown returns the size of an engine id table after growth from size.
func grown(size int) int { return max(16, size+size/2) }

// mix spreads a key's bits.
func mix(k uint64) uint64 {
	k ^= k >> 32
	k *= 0xd6e8feb86659fd93
	k ^= k >> 32
	return k
}

// blockEntry maps an engine block id to a word (see engTable): 12 bytes,
// as the id is kept in two 32-bit halves.
type blockEntry struct {
	lo, hi uint32 // the engine id's low and high halves
	word   uint32
}

// engineID returns the entry's engine id (0: an empty slot).
func (e *blockEntry) engineID() uint64 { return uint64(e.hi)<<32 | uint64(e.lo) }

func newBlockEntry(id uint64, word uint32) blockEntry {
	return blockEntry{lo: uint32(id), hi: uint32(id >> 32), word: word}
}

// blockTable is one rank's map from engine id to a word: Robin Hood
// linear probing (an entry further from its home slot than the one in a
// slot takes the slot and moves that one on), so that probe runs stay
// short at a high load and a miss stops early. Entries with id 0 are kept
// aside, as id 0 marks an empty slot.
type blockTable struct {
	tab      []blockEntry
	n        int // entries in tab
	zeroWord uint32
	hasZero  bool
}

// blockLoadNum/blockLoadDen is the load factor past which a blockTable grows.
const blockLoadNum, blockLoadDen = 9, 10

// A blockTable below load trimBelowNum/trimBelowDen after a removal shrinks
// to load trimToNum/trimToDen (see trimmed). A rank's table would otherwise
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

// get returns the word of id.
func (t *blockTable) get(id uint64) (uint32, bool) {
	if id == 0 {
		return t.zeroWord, t.hasZero
	}
	if i := t.slot(id); i >= 0 {
		return t.tab[i].word, true
	}
	return 0, false
}

// put sets the word of id.
func (t *blockTable) put(id uint64, word uint32) {
	if id == 0 {
		t.zeroWord, t.hasZero = word, true
		return
	}
	if i := t.slot(id); i >= 0 {
		t.tab[i].word = word
		return
	}
	t.reserve(1)
	robinHood(t.tab, newBlockEntry(id, word))
	t.n++
}

// reserve grows the table, if needed, so that extra more entries fit
// without another growth.
func (t *blockTable) reserve(extra int) {
	if size := t.reserveSize(extra); size > 0 {
		t.tab = t.resized(size)
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

// trimmed returns the table shrunk, if removals left it below load
// trimBelow, to load trimTo, or nil. It only reads t: a writer builds it
// without the index's lock (see runTree.trimmed), once per event, not on
// each deletion.
func (t *blockTable) trimmed() []blockEntry {
	if size := t.trimSize(); size > 0 {
		return t.resized(size)
	}
	return nil
}

// trimSize returns the size trimmed would shrink the table to, 0 if none.
func (t *blockTable) trimSize() int {
	if t.n*trimBelowDen >= len(t.tab)*trimBelowNum || len(t.tab) <= 16 {
		return 0
	}
	return max(16, t.n*trimToDen/trimToNum+1)
}

// resized returns the table's entries in a new table of size slots.
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
	if id == 0 {
		had := t.hasZero
		t.zeroWord, t.hasZero = 0, false
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
func (t *blockTable) each(f func(id uint64, word uint32)) {
	if t.hasZero {
		f(0, t.zeroWord)
	}
	for _, e := range t.tab {
		if id := e.engineID(); id != 0 {
			f(id, e.word)
		}
	}
}

// headTable maps the key of each span's first block to the span: open
// addressing with linear probing and backward-shift deletion, key 0 kept
// aside.
type headTable struct {
	slots []headSlot
	n     int
	zero  bool
	zv    uint32
}

type headSlot struct {
	key uint64
	val uint32
}

func (t *headTable) get(k uint64) (uint32, bool) {
	if k == 0 {
		return t.zv, t.zero
	}
	if len(t.slots) == 0 {
		return 0, false
	}
	m := uint64(len(t.slots) - 1)
	for i := mix(k) & m; ; i = (i + 1) & m {
		switch t.slots[i].key {
		case k:
			return t.slots[i].val, true
		case 0:
			return 0, false
		}
	}
}

func (t *headTable) put(k uint64, v uint32) {
	if k == 0 {
		t.zero, t.zv = true, v
		return
	}
	if (t.n+1)*8 > len(t.slots)*7 {
		t.grow()
	}
	m := uint64(len(t.slots) - 1)
	for i := mix(k) & m; ; i = (i + 1) & m {
		switch t.slots[i].key {
		case k:
			t.slots[i].val = v
			return
		case 0:
			t.slots[i] = headSlot{k, v}
			t.n++
			return
		}
	}
}

func (t *headTable) grow() {
	old := t.slots
	t.slots = make([]headSlot, max(16, 2*len(old)))
	t.n = 0
	for _, s := range old {
		if s.key != 0 {
			t.put(s.key, s.val)
		}
	}
}

func (t *headTable) del(k uint64) {
	if k == 0 {
		t.zero, t.zv = false, 0
		return
	}
	if len(t.slots) == 0 {
		return
	}
	m := uint64(len(t.slots) - 1)
	i := mix(k) & m
	for ; t.slots[i].key != k; i = (i + 1) & m {
		if t.slots[i].key == 0 {
			return
		}
	}
	t.n--
	for j := (i + 1) & m; t.slots[j].key != 0; j = (j + 1) & m {
		h := mix(t.slots[j].key) & m
		// j's entry may fill the hole at i unless its home lies in (i, j].
		if (j > i && (h <= i || h > j)) || (j < i && h <= i && h > j) {
			t.slots[i] = t.slots[j]
			i = j
		}
	}
	t.slots[i] = headSlot{}
}

func (t *headTable) len() int {
	if t.zero {
		return t.n + 1
	}
	return t.n
}
