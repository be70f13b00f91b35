package tokenize

import (
	"errors"
	"fmt"
	"hash/maphash"
	"strings"
	"sync/atomic"
	"unicode/utf8"
)

// bpeModel is the BPE model of tokenizer.json ("model": {"type": "BPE"}): a word is split
// into characters (or, in byte mode, bytes), each looked up in the vocabulary (with
// byte_fallback and unk handling), then merged pair by pair, always applying the
// lowest-ranked merge present and the leftmost one among equals, exactly as the
// priority queue in `tokenizers`' Word::merge_all does.
type bpeModel struct {
	vocab     map[string]uint32
	vocabSize int // len(vocab), what `tokenizers` calls the model's vocab size
	merges    mergeTable

	unkToken     string
	hasUnk       bool
	unkID        uint32
	unkInVocab   bool
	fuseUnk      bool
	byteFallback bool
	fallbackIDs  [256]uint32 // id of "<0xXX>"
	fallbackOK   [256]bool
	ignoreMerges bool
	prefix       string // continuing_subword_prefix
	suffix       string // end_of_word_suffix

	// Char mode without prefix/suffix: id of each single-character token.
	runeIDs []int32 // indexed by BMP rune, -1 if absent
	runeMap map[rune]uint32

	// Byte mode: the pre-tokenizer ends with ByteLevel, so every word reaching the model
	// would be the GPT-2 byte-to-char mapping of a raw word. The model works on the raw
	// bytes instead: rawVocab maps the raw bytes of every vocabulary entry made only of
	// byte-level characters to its id, and byteIDs gives the id of each single byte.
	byteMode bool
	rawVocab map[string]uint32
	byteIDs  [256]uint32

	// cross, when not nil, enables exact segmentation of long words (encodeSegments).
	cross *crossSet

	cache *wordCache
}

// errUnkOutOfVocab mirrors `tokenizers`' UnkTokenOutOfVocabulary encode error.
var errUnkOutOfVocab = errors.New("unk_token is not in the vocabulary")

// canByteMode reports whether the model can run in byte mode: every byte-level character
// is a token and no subword prefix/suffix decorates symbols.
func (m *bpeModel) canByteMode() bool {
	if m.prefix != "" || m.suffix != "" {
		return false
	}
	for b := 0; b < 256; b++ {
		if _, ok := m.vocab[string(byteLevelChars[b])]; !ok {
			return false
		}
	}
	return true
}

// enableByteMode builds the raw-byte tables (see bpeModel.byteMode).
func (m *bpeModel) enableByteMode() {
	m.byteMode = true
	m.rawVocab = make(map[string]uint32, len(m.vocab))
	buf := make([]byte, 0, 64)
	for tok, id := range m.vocab {
		buf = buf[:0]
		ok := true
		for _, r := range tok {
			b, in := byteLevelByte(r)
			if !in {
				ok = false
				break
			}
			buf = append(buf, b)
		}
		if ok {
			m.rawVocab[string(buf)] = id
		}
	}
	for b := 0; b < 256; b++ {
		m.byteIDs[b] = m.vocab[string(byteLevelChars[b])]
	}
}

// buildRuneTable fills the single-character lookup used in char mode.
func (m *bpeModel) buildRuneTable() {
	m.runeIDs = make([]int32, 0x10000)
	for i := range m.runeIDs {
		m.runeIDs[i] = -1
	}
	m.runeMap = make(map[rune]uint32)
	for tok, id := range m.vocab {
		r, n := utf8.DecodeRuneInString(tok)
		if n != len(tok) || r == utf8.RuneError && n <= 1 {
			continue
		}
		if r < 0x10000 && id <= 1<<31-1 {
			m.runeIDs[r] = int32(id)
		} else {
			m.runeMap[r] = id
		}
	}
}

// charID returns the id of the single-character symbol s (a whole rune of the word).
func (m *bpeModel) charID(r rune, s string, first, last bool, buf []byte) (uint32, bool, []byte) {
	if m.prefix == "" && m.suffix == "" {
		if r < 0x10000 && m.runeIDs != nil {
			if id := m.runeIDs[r]; id >= 0 {
				return uint32(id), true, buf
			}
			return 0, false, buf
		}
		id, ok := m.runeMap[r]
		return id, ok, buf
	}
	buf = m.decorate(buf[:0], s, first, last)
	id, ok := m.vocab[string(buf)]
	return id, ok, buf
}

// decorate appends the symbol string of character s: the continuing-subword prefix
// unless it is the word's first character, and the end-of-word suffix on its last.
func (m *bpeModel) decorate(buf []byte, s string, first, last bool) []byte {
	if !first {
		buf = append(buf, m.prefix...)
	}
	buf = append(buf, s...)
	if last {
		buf = append(buf, m.suffix...)
	}
	return buf
}

// maxCachedWord is the longest word (in bytes) the word cache keeps.
const maxCachedWord = 256

// segMinLen is the word length (bytes) from which encodeWord cuts the word at safe
// boundaries before merging.
const segMinLen = 48

// encodeWord appends the ids of one pre-tokenized word.
func (m *bpeModel) encodeWord(dst []uint32, w string, st *encScratch) ([]uint32, error) {
	if w == "" {
		return dst, nil
	}
	if m.byteMode {
		if len(w) == 1 {
			return append(dst, m.byteIDs[w[0]]), nil
		}
		if m.ignoreMerges {
			if id, ok := m.rawVocab[w]; ok {
				return append(dst, id), nil
			}
		}
	} else if m.ignoreMerges {
		if id, ok := m.vocab[w]; ok {
			return append(dst, id), nil
		}
	}
	if m.cross != nil && len(w) >= segMinLen {
		return m.encodeSegments(dst, w, st)
	}
	return m.encodeMerged(dst, w, st)
}

// encodeSegments cuts w at every safe boundary (see crossSet) and merges the segments
// independently. No merge can ever join symbols across a safe boundary, and merges on
// one side never change which merges happen on the other, so the result is the
// whole-word result; the segments are short and hit the word cache.
func (m *bpeModel) encodeSegments(dst []uint32, w string, st *encScratch) ([]uint32, error) {
	var err error
	start := 0
	if m.byteMode {
		for i := 1; i < len(w); i++ {
			if !m.cross.bytes(w[i-1], w[i]) {
				if dst, err = m.encodeMerged(dst, w[start:i], st); err != nil {
					return dst, err
				}
				start = i
			}
		}
	} else {
		prev, n := runeAt(w, 0)
		for i := n; i < len(w); i += n {
			var r rune
			r, n = runeAt(w, i)
			if !m.cross.runes(prev, r) {
				if dst, err = m.encodeMerged(dst, w[start:i], st); err != nil {
					return dst, err
				}
				start = i
			}
			prev = r
		}
	}
	return m.encodeMerged(dst, w[start:], st)
}

// encodeMerged appends the merged symbols of w, through the word cache.
func (m *bpeModel) encodeMerged(dst []uint32, w string, st *encScratch) ([]uint32, error) {
	if m.byteMode && len(w) == 1 {
		return append(dst, m.byteIDs[w[0]]), nil
	}
	cacheable := m.cache != nil && len(w) <= maxCachedWord
	var h uint64
	if cacheable {
		h = m.cache.hash(w)
		if ids, ok := m.cache.get(h, w); ok {
			return append(dst, ids...), nil
		}
	}
	syms := st.syms[:0]
	if m.byteMode {
		for i := 0; i < len(w); i++ {
			syms = append(syms, m.byteIDs[w[i]])
		}
	} else {
		var err error
		if syms, err = m.charSymbols(syms, w, st); err != nil {
			st.syms = syms
			return dst, err
		}
	}
	syms = m.merge(syms, st)
	st.syms = syms
	if cacheable {
		m.cache.put(h, w, syms)
	}
	return append(dst, syms...), nil
}

// crossSet records, for every merge (A, B), the pair (last atom of A, first atom of B):
// the only adjacent atoms a merge can ever join across. Atoms are bytes in byte mode and
// characters in char mode.
type crossSet struct {
	byteBits []uint64            // byte mode: bit p<<8|c
	first    []uint64            // char mode: bit r set if r < 0x10000 starts some B
	pairs    map[uint64]struct{} // char mode: p<<32 | c
}

func (c *crossSet) bytes(p, b byte) bool {
	k := uint(p)<<8 | uint(b)
	return c.byteBits[k>>6]&(1<<(k&63)) != 0
}

func (c *crossSet) runes(p, r rune) bool {
	if r < 0x10000 && c.first[r>>6]&(1<<(uint(r)&63)) == 0 {
		return false
	}
	_, ok := c.pairs[uint64(uint32(p))<<32|uint64(uint32(r))]
	return ok
}

// buildCross enables segmentation when it is exact: no prefix/suffix decorations, no
// merge involving a byte-fallback or unk token, every character becoming symbols (in
// char mode: complete byte fallback, so no unk can be pending across a boundary and no
// unknown character is dropped, which would make its neighbours adjacent), and one
// string per id (so a symbol's id tells which atoms it spans).
func (m *bpeModel) buildCross() {
	if m.prefix != "" || m.suffix != "" || len(m.vocab) == 0 {
		return
	}
	if !m.byteMode {
		if !m.byteFallback {
			return
		}
		for b := 0; b < 256; b++ {
			if !m.fallbackOK[b] {
				return
			}
		}
	}
	// First and last atom of every token; -1: not made of atoms (never merged from
	// atoms), -2: the id has several strings.
	n := int(m.maxID()) + 1
	first, last := make([]int32, n), make([]int32, n)
	seen := make([]bool, n)
	for tok, id := range m.vocab {
		if seen[id] {
			return
		}
		seen[id] = true
		f, l := int32(-1), int32(-1)
		if m.byteMode {
			f, l = rawEnds(tok)
		} else if tok != "" {
			r, _ := utf8.DecodeRuneInString(tok)
			p, _ := utf8.DecodeLastRuneInString(tok)
			f, l = r, p
		}
		first[id], last[id] = f, l
	}
	c := &crossSet{}
	if m.byteMode {
		c.byteBits = make([]uint64, 65536/64)
	} else {
		c.first = make([]uint64, 0x10000/64)
		c.pairs = map[uint64]struct{}{}
	}
	var specials map[uint32]bool
	if m.hasUnk || m.byteFallback {
		specials = map[uint32]bool{}
		for tok, id := range m.vocab {
			if (m.hasUnk && tok == m.unkToken) || (m.byteFallback && len(tok) == 6 && strings.HasPrefix(tok, "<0x") && tok[5] == '>') {
				specials[id] = true
			}
		}
	}
	for _, s := range m.merges.slots {
		if s.key == emptySlot {
			continue
		}
		a, b := uint32(s.key>>32), uint32(s.key)
		if specials[a] || specials[b] {
			return
		}
		p, r := last[a], first[b]
		if p < 0 || r < 0 {
			continue // can never apply to atoms
		}
		if m.byteMode {
			k := uint(p)<<8 | uint(r)
			c.byteBits[k>>6] |= 1 << (k & 63)
			continue
		}
		if r < 0x10000 {
			c.first[r>>6] |= 1 << (uint(r) & 63)
		}
		c.pairs[uint64(uint32(p))<<32|uint64(uint32(r))] = struct{}{}
	}
	m.cross = c
}

// rawEnds returns the first and last raw byte of a byte-level token, or -1, -1 when
// the token is not made of byte-level characters.
func rawEnds(tok string) (int32, int32) {
	f, l := int32(-1), int32(-1)
	for _, r := range tok {
		b, ok := byteLevelByte(r)
		if !ok {
			return -1, -1
		}
		if f < 0 {
			f = int32(b)
		}
		l = int32(b)
	}
	return f, l
}

// charSymbols appends the initial symbols of w in char mode (tokenizers' merge_word
// before merging), including its unk and byte-fallback quirks: a pending unk is only
// flushed by the next known character (not by byte-fallback bytes) or at the end.
func (m *bpeModel) charSymbols(syms []uint32, w string, st *encScratch) ([]uint32, error) {
	pendingUnk := false
	buf := st.sym
	defer func() { st.sym = buf }()
	for i := 0; i < len(w); {
		r, n := runeAt(w, i)
		first, last := i == 0, i+n == len(w)
		ch := w[i : i+n]
		i += n
		var id uint32
		var ok bool
		id, ok, buf = m.charID(r, ch, first, last, buf)
		if ok {
			if pendingUnk {
				syms = append(syms, m.unkID)
				pendingUnk = false
			}
			syms = append(syms, id)
			continue
		}
		if m.byteFallback {
			buf = m.decorate(buf[:0], ch, first, last)
			all := true
			for _, b := range buf {
				if !m.fallbackOK[b] {
					all = false
					break
				}
			}
			if all {
				for _, b := range buf {
					syms = append(syms, m.fallbackIDs[b])
				}
				continue
			}
		}
		if m.hasUnk {
			if !m.unkInVocab {
				return syms, fmt.Errorf("%w: %q", errUnkOutOfVocab, m.unkToken)
			}
			if pendingUnk && !m.fuseUnk {
				syms = append(syms, m.unkID)
			}
			pendingUnk = true
		}
	}
	if pendingUnk {
		syms = append(syms, m.unkID)
	}
	return syms, nil
}

// smallWord is the symbol count up to which merge uses the quadratic scan; longer words
// use the priority queue. Both apply the same merges in the same order.
const smallWord = 40

// merge applies the BPE merges to syms in place and returns the merged symbols.
func (m *bpeModel) merge(syms []uint32, st *encScratch) []uint32 {
	if len(syms) < 2 {
		return syms
	}
	if len(syms) <= smallWord {
		return m.mergeScan(syms, st)
	}
	return m.mergeHeap(syms, st)
}

// mergeScan repeatedly merges the lowest-ranked (then leftmost) adjacent pair.
func (m *bpeModel) mergeScan(syms []uint32, st *encScratch) []uint32 {
	pairs := st.pairs[:0]
	for i := 0; i+1 < len(syms); i++ {
		pairs = append(pairs, m.merges.get(syms[i], syms[i+1]))
	}
	for {
		best, bestV := -1, noMerge
		for i, v := range pairs {
			if v < bestV {
				best, bestV = i, v
			}
		}
		if best < 0 {
			break
		}
		syms[best] = uint32(bestV)
		copy(syms[best+1:], syms[best+2:])
		syms = syms[:len(syms)-1]
		copy(pairs[best:], pairs[best+1:])
		pairs = pairs[:len(pairs)-1]
		if best > 0 {
			pairs[best-1] = m.merges.get(syms[best-1], syms[best])
		}
		if best < len(pairs) {
			pairs[best] = m.merges.get(syms[best], syms[best+1])
		}
	}
	st.pairs = pairs
	return syms
}

// heapItem is a queued merge: key is rank<<32 | position of the left symbol.
type heapItem struct {
	key   uint64
	newID uint32
}

// mergeHeap is tokenizers' Word::merge_all: a min-queue of (rank, position) over a
// linked list of symbols, skipping stale entries.
func (m *bpeModel) mergeHeap(syms []uint32, st *encScratch) []uint32 {
	n := len(syms)
	if n < 2 {
		return syms
	}
	prev, next := st.prev[:0], st.next[:0]
	for i := 0; i < n; i++ {
		prev = append(prev, int32(i-1))
		next = append(next, int32(i+1))
	}
	next[n-1] = -1
	alive := st.alive[:0]
	for i := 0; i < n; i++ {
		alive = append(alive, true)
	}
	h := st.heap[:0]
	push := func(pos int, v uint64) {
		h = append(h, heapItem{key: v>>32<<32 | uint64(pos), newID: uint32(v)})
		for i := len(h) - 1; i > 0; {
			p := (i - 1) / 2
			if h[p].key <= h[i].key {
				break
			}
			h[p], h[i] = h[i], h[p]
			i = p
		}
	}
	pop := func() heapItem {
		top := h[0]
		last := len(h) - 1
		h[0] = h[last]
		h = h[:last]
		for i := 0; ; {
			l := 2*i + 1
			if l >= len(h) {
				break
			}
			c := l
			if r := l + 1; r < len(h) && h[r].key < h[l].key {
				c = r
			}
			if h[i].key <= h[c].key {
				break
			}
			h[i], h[c] = h[c], h[i]
			i = c
		}
		return top
	}
	for i := 0; i+1 < n; i++ {
		if v := m.merges.get(syms[i], syms[i+1]); v != noMerge {
			push(i, v)
		}
	}
	for len(h) > 0 {
		top := pop()
		pos := int(uint32(top.key))
		if !alive[pos] || next[pos] < 0 {
			continue
		}
		nx := int(next[pos])
		v := m.merges.get(syms[pos], syms[nx])
		if v == noMerge || uint32(v) != top.newID {
			continue
		}
		syms[pos] = top.newID
		alive[nx] = false
		nn := next[nx]
		next[pos] = nn
		if nn >= 0 {
			prev[nn] = int32(pos)
		}
		if p := prev[pos]; p >= 0 {
			if v := m.merges.get(syms[p], syms[pos]); v != noMerge {
				push(int(p), v)
			}
		}
		if nn >= 0 {
			if v := m.merges.get(syms[pos], syms[nn]); v != noMerge {
				push(pos, v)
			}
		}
	}
	out := syms[:0]
	for i := 0; i >= 0 && i < n; i = int(next[i]) {
		out = append(out, syms[i])
	}
	st.prev, st.next, st.alive, st.heap = prev, next, alive, h
	return out
}

// noMerge is mergeTable.get's answer for a pair without a merge. Real entries are
// rank<<32 | newID with rank < 2^32-1, so noMerge compares above all of them.
const noMerge = ^uint64(0)

// mergeTable maps a pair of symbol ids to rank<<32 | merged id, in an open-addressing
// hash table (faster than a Go map on the hot path).
type mergeTable struct {
	slots []mergeSlot
	shift uint
	mask  uint64
	n     int
}

type mergeSlot struct{ key, val uint64 }

const emptySlot = ^uint64(0)

// newMergeTable returns a table with room for about n merges at load factor 2/3.
func newMergeTable(n int) mergeTable {
	size, bits := 8, uint(3)
	for size < n+n/2+1 {
		size *= 2
		bits++
	}
	t := mergeTable{slots: make([]mergeSlot, size), shift: 64 - bits, mask: uint64(size - 1)}
	for i := range t.slots {
		t.slots[i].key = emptySlot
	}
	return t
}

func (t *mergeTable) index(key uint64) uint64 { return (key * 0x9E3779B97F4A7C15) >> t.shift }

// put sets the merge of (a, b), replacing an earlier one (as a HashMap collect does).
func (t *mergeTable) put(a, b uint32, rank, newID uint32) {
	if 4*(t.n+1) > 3*len(t.slots) {
		t.grow()
	}
	key := uint64(a)<<32 | uint64(b)
	for i := t.index(key); ; i = (i + 1) & t.mask {
		s := &t.slots[i]
		if s.key == emptySlot {
			s.key = key
			t.n++
		} else if s.key != key {
			continue
		}
		s.val = uint64(rank)<<32 | uint64(newID)
		return
	}
}

// grow doubles the table.
func (t *mergeTable) grow() {
	old := t.slots
	*t = newMergeTable(2 * max(len(old), 8))
	for _, s := range old {
		if s.key != emptySlot {
			t.put(uint32(s.key>>32), uint32(s.key), uint32(s.val>>32), uint32(s.val))
		}
	}
}

// get returns rank<<32 | merged id for (a, b), or noMerge.
func (t *mergeTable) get(a, b uint32) uint64 {
	if len(t.slots) == 0 {
		return noMerge
	}
	key := uint64(a)<<32 | uint64(b)
	for i := t.index(key); ; i = (i + 1) & t.mask {
		s := &t.slots[i]
		if s.key == key {
			return s.val
		}
		if s.key == emptySlot {
			return noMerge
		}
	}
}

// wordCache is a bounded, lock-free, 4-way set-associative cache of merged words: a
// fixed array of atomic pointers; a word may live in any of the 4 slots of the set its
// hash selects, and a new entry takes an empty slot of the set or replaces one chosen
// by other hash bits. Entries are immutable once published, so readers need no lock.
type wordCache struct {
	seed  maphash.Seed
	mask  uint64 // selects a set: the index of its first slot
	slots []atomic.Pointer[cacheEntry]
}

type cacheEntry struct {
	word string
	ids  []uint32
}

// defaultCacheSlots bounds the cache (tokenizers' BPE cache holds 10,000 words).
const defaultCacheSlots = 1 << 16

const cacheWays = 4

func newWordCache(slots int) *wordCache {
	return &wordCache{seed: maphash.MakeSeed(), mask: uint64(slots-1) &^ (cacheWays - 1), slots: make([]atomic.Pointer[cacheEntry], slots)}
}

func (c *wordCache) hash(w string) uint64 { return maphash.String(c.seed, w) }

func (c *wordCache) get(h uint64, w string) ([]uint32, bool) {
	set := c.slots[h&c.mask:][:cacheWays]
	for i := range set {
		if e := set[i].Load(); e != nil && e.word == w {
			return e.ids, true
		}
	}
	return nil, false
}

func (c *wordCache) put(h uint64, w string, ids []uint32) {
	e := &cacheEntry{word: strings.Clone(w), ids: append([]uint32(nil), ids...)}
	set := c.slots[h&c.mask:][:cacheWays]
	for i := range set {
		if set[i].Load() == nil && set[i].CompareAndSwap(nil, e) {
			return
		}
	}
	set[(h>>32)%cacheWays].Store(e)
}

// byteLevelChars is GPT-2's bytes_to_unicode: the character standing for each byte.
var byteLevelChars = func() [256]rune {
	var t [256]rune
	n := 0
	for b := 0; b < 256; b++ {
		if ('!' <= b && b <= '~') || (0xA1 <= b && b <= 0xAC) || (0xAE <= b && b <= 0xFF) {
			t[b] = rune(b)
		} else {
			t[b] = rune(256 + n)
			n++
		}
	}
	return t
}()

// byteLevelByte inverts byteLevelChars.
func byteLevelByte(r rune) (byte, bool) {
	switch {
	case r < 256:
		if ('!' <= r && r <= '~') || (0xA1 <= r && r <= 0xAC) || (0xAE <= r && r <= 0xFF) {
			return byte(r), true
		}
		return 0, false
	case r < 256+68:
		return byteLevelInverse[r-256], true
	}
	return 0, false
}

// byteLevelInverse maps the 68 shifted characters U+0100.. back to their bytes.
var byteLevelInverse = func() [68]byte {
	var t [68]byte
	for b := 0; b < 256; b++ {
		if r := byteLevelChars[b]; r >= 256 {
			t[r-256] = byte(b)
		}
	}
	return t
}()
