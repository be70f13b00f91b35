package indexer

import "math/bits"

// The index's tables hold no Go pointers, so that the garbage collector
// never scans them: each rank's map from engine id to block (blockTable,
// Robin Hood linear probing, emptied by backward shifting, sized by
// multiplication) and each shard's map from a span's first key to the
// span (headTable, linear probing in a power-of-two table).

// mix spreads a key's bits. It is a bijection (see unmix): a blockTable
// keeps mix(id) in place of id.
func mix(k uint64) uint64 {
	k ^= k >> 32
	k *= 0xd6e8feb86659fd93
	k ^= k >> 32
	return k
}

// unmix is mix's inverse: 0xcfee444d8b59a89b is 0xd6e8feb86659fd93's
// inverse modulo 2^64, and k ^= k>>32 is its own.
func unmix(k uint64) uint64 {
	k ^= k >> 32
	k *= 0xcfee444d8b59a89b
	k ^= k >> 32
	return k
}

// blockEntry maps an engine block id to a word: 12 bytes, as the id's mix
// is kept in two 32-bit halves.
type blockEntry struct {
	lo, hi uint32 // mix(engine id)'s low and high halves
	word   uint32
}

// mixed returns mix of the entry's engine id (0: an empty slot).
func (e *blockEntry) mixed() uint64 { return uint64(e.hi)<<32 | uint64(e.lo) }

// engineID returns the entry's engine id.
func (e *blockEntry) engineID() uint64 { return unmix(e.mixed()) }

func newBlockEntry(m uint64, word uint32) blockEntry {
	return blockEntry{lo: uint32(m), hi: uint32(m >> 32), word: word}
}

// blockTable is one rank's map from engine id to a word: Robin Hood
// linear probing, so that probe runs stay short at a high load and a miss
// stops early. It keeps each id as m = mix(id), a bijection whose high bits
// place it: its home slot is m*size/2^64, so homes are in the order of m,
// and the table keeps its entries in that order (along a run, cyclically),
// ties too. A lookup stops at the first entry placed after m; a resize
// copies the entries in order, without probing. Entries with id 0 (mix 0)
// are kept aside, as 0 marks an empty slot.
type blockTable struct {
	tab      []blockEntry
	n        int // entries in tab
	zeroWord uint32
	hasZero  bool
}

// blockLoadNum/blockLoadDen is the load factor past which a blockTable grows.
const blockLoadNum, blockLoadDen = 9, 10

// A blockTable grows to load sizeToNum/sizeToDen for what it must hold, by
// a quarter at least; below load trimBelowNum/trimBelowDen after a removal
// it shrinks to sizeTo (see trimmed). A rank's table would otherwise stay
// at the size of its peak (its cache's capacity plus the longest request
// stored before the eviction that follows). The gaps between the three
// loads keep a rank whose cache is full from growing and shrinking at
// every request: from load 4/5 it grows only for a request of more than an
// eighth of its blocks, and after such growth it shrinks back only if the
// request was more than a third.
const (
	sizeToNum, sizeToDen       = 4, 5
	trimBelowNum, trimBelowDen = 6, 10
)

// home returns the home slot of m in a table of size slots.
func home(m uint64, size int) int {
	hi, _ := bits.Mul64(m, uint64(size))
	return int(hi)
}

// dist returns how far slot i is from the home of m, in a table of size.
func dist(m uint64, i, size int) int {
	d := i - home(m, size)
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

// find looks m up in tab. It returns m's slot and true, or the slot m
// would take and false. tab must have slots.
func find(tab []blockEntry, m uint64) (int, bool) {
	size := len(tab)
	for i, d := home(m, size), 0; ; d++ {
		cm := tab[i].mixed()
		if cm == m {
			return i, true
		}
		if cm == 0 {
			return i, false
		}
		// An entry nearer its home than m would be, or as near with a
		// larger m, is placed after m.
		if cd := dist(cm, i, size); cd < d || cd == d && cm > m {
			return i, false
		}
		if i++; i == size {
			i = 0
		}
	}
}

// lookup returns the slot of id, -1 for id 0 (kept aside), and whether
// id is there.
func (t *blockTable) lookup(id uint64) (int, bool) {
	if id == 0 {
		return -1, t.hasZero
	}
	if len(t.tab) == 0 {
		return 0, false
	}
	return find(t.tab, mix(id))
}

// wordAt returns the word at slot i (from lookup).
func (t *blockTable) wordAt(i int) uint32 {
	if i < 0 {
		return t.zeroWord
	}
	return t.tab[i].word
}

// get returns the word of id.
func (t *blockTable) get(id uint64) (uint32, bool) {
	if i, ok := t.lookup(id); ok {
		return t.wordAt(i), true
	}
	return 0, false
}

// add gives id the word, if id has none (else it reports false), with one
// probe: a full table first grows for left more ids (the blocks left in a
// Stored event), not for one at a time.
func (t *blockTable) add(id uint64, word uint32, left int) bool {
	if id == 0 {
		if t.hasZero {
			return false
		}
		t.zeroWord, t.hasZero = word, true
		return true
	}
	m := mix(id)
	var i int
	if len(t.tab) > 0 {
		var found bool
		if i, found = find(t.tab, m); found {
			return false
		}
	}
	if (t.n+1)*blockLoadDen > len(t.tab)*blockLoadNum { // always for an empty table
		t.reserve(left)
		i, _ = find(t.tab, m)
	}
	shift(t.tab, newBlockEntry(m, word), i)
	t.n++
	return true
}

// reserve grows the table, if needed, so that extra more entries fit
// without another growth.
func (t *blockTable) reserve(extra int) {
	if size := t.reserveSize(extra); size > 0 {
		t.tab = t.resized(size)
	}
}

// reserveSize returns the size reserve(extra) would grow the table to, 0
// if it fits.
func (t *blockTable) reserveSize(extra int) int {
	need := t.n + extra
	if need*blockLoadDen <= len(t.tab)*blockLoadNum {
		return 0
	}
	return max(16, len(t.tab)+len(t.tab)/4, need*sizeToDen/sizeToNum+1)
}

// trimmed returns the table shrunk, if removals left it below load
// trimBelow, to load sizeTo, or nil. It only reads t: a writer builds it
// once per event (see spanTree.trimmed), not on each deletion.
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
	return max(16, t.n*sizeToDen/sizeToNum+1)
}

// resized returns the table's entries in a new table of size slots, which
// must hold them. It reads them in order of m and places each at its new
// home or just after the one before; only those that run past the end
// wrap around, placed by shifting.
func (t *blockTable) resized(size int) []blockEntry {
	tab := make([]blockEntry, size)
	old := len(t.tab)
	// The run at slot 0 may start with entries wrapped from the end: they
	// have the largest m, and come last.
	w := 0
	for w < old {
		if m := t.tab[w].mixed(); m == 0 || home(m, old) <= w {
			break
		}
		w++
	}
	next := 0 // the first slot free after the entries placed
	place := func(e blockEntry) {
		m := e.mixed()
		i := max(home(m, size), next)
		if i < size {
			tab[i] = e
			next = i + 1
			return
		}
		next = size
		j, _ := find(tab, m)
		shift(tab, e, j)
	}
	for _, e := range t.tab[w:] {
		if e.mixed() != 0 {
			place(e)
		}
	}
	for _, e := range t.tab[:w] {
		place(e)
	}
	return tab
}

// shift puts e at slot i, where find stopped for it, and moves the
// entries from i on along by one, up to an empty slot: they stay in order.
func shift(tab []blockEntry, e blockEntry, i int) {
	size := len(tab)
	for {
		cur := &tab[i]
		if cur.mixed() == 0 {
			*cur = e
			return
		}
		*cur, e = e, *cur
		if i++; i == size {
			i = 0
		}
	}
}

// delAt removes the entry at slot i (from lookup): the rest of its run
// shifts back by one, up to an entry at its home.
func (t *blockTable) delAt(i int) {
	if i < 0 {
		t.zeroWord, t.hasZero = 0, false
		return
	}
	size := len(t.tab)
	for {
		j := i + 1
		if j == size {
			j = 0
		}
		if nm := t.tab[j].mixed(); nm == 0 || dist(nm, j, size) == 0 {
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
}

// each calls f for every entry.
func (t *blockTable) each(f func(id uint64, word uint32)) {
	if t.hasZero {
		f(0, t.zeroWord)
	}
	for _, e := range t.tab {
		if e.mixed() != 0 {
			f(e.engineID(), e.word)
		}
	}
}

// headTable maps the key of each span's first block to the span: open
// addressing with linear probing and backward-shift deletion, key 0 kept
// aside.
type headTable struct {
	slots []headSlot
	zero  bool
	zv    uint32
	n     int // keys in slots
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
	if g := t.grownFor(1); g != nil {
		t.slots = g
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

// grownFor returns the table's slots rehashed into a table large enough
// for extra more keys, if it is not, or nil. It only reads t.
func (t *headTable) grownFor(extra int) []headSlot {
	size := len(t.slots)
	for (t.n+extra)*8 > size*7 {
		size = max(16, 2*size)
	}
	if size == len(t.slots) {
		return nil
	}
	return t.rehashed(size)
}

// rehashed returns the table's slots in a new table of size slots.
func (t *headTable) rehashed(size int) []headSlot {
	slots := make([]headSlot, size)
	m := uint64(size - 1)
	for _, s := range t.slots {
		if s.key == 0 {
			continue
		}
		i := mix(s.key) & m
		for slots[i].key != 0 {
			i = (i + 1) & m
		}
		slots[i] = s
	}
	return slots
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
