package tokenize

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"unicode/utf8"
	"unsafe"

	"golang.org/x/text/unicode/norm"
)

// Tokenizer encodes text as a Hugging Face tokenizer.json does. Safe for concurrent use.
type Tokenizer struct {
	model *bpeModel
	norm  normalizer     // nil: no normalizer
	pre   []preTokenizer // flattened pre-tokenizer steps
	added addedVocab
	post  postProcessor
	// track: some step (Metaspace with prepend_scheme "first") needs to know which
	// pieces start at offset 0 of the original text.
	track     bool
	vocabSize int
	pool      sync.Pool // *encScratch
	// segs, when not nil, caches the ids of the text between added tokens (see
	// WithSegmentCache).
	segs *segCache
}

// UnsupportedError names the tokenizer.json component kvgate cannot reproduce exactly
// (e.g. `model type "WordPiece"`, `pre_tokenizer "Whitespace"`), so callers fall back.
type UnsupportedError struct{ Component string }

func (e *UnsupportedError) Error() string { return "unsupported " + e.Component }

// Load reads dir/tokenizer.json, or dir/tokenizer.json.gz when tokenizer.json does
// not exist (see ReadTokenizerJSON).
func Load(dir string) (*Tokenizer, error) {
	data, path, err := ReadTokenizerJSON(dir)
	if err != nil {
		return nil, err
	}
	t, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return t, nil
}

// WithSegmentCache returns a Tokenizer that encodes exactly as t does, sharing t's
// tables and word cache, with its own segment cache of the given size (none when
// opts.MaxBytes <= 0). The cache keeps the ids of the text between added tokens
// (special tokens such as <|im_start|> or <|eot_id|>), keyed by that text and by
// whether it starts the input, so that text repeated across calls (the earlier turns
// of a multi-turn chat prompt) is not encoded again. The ids are the same with or
// without it (see the package documentation). t itself is unchanged.
func (t *Tokenizer) WithSegmentCache(opts SegmentCacheOptions) *Tokenizer {
	u := &Tokenizer{model: t.model, norm: t.norm, pre: t.pre, added: t.added, post: t.post,
		track: t.track, vocabSize: t.vocabSize, segs: newSegCache(opts)}
	u.pool.New = func() any { return &encScratch{track: u.track} }
	return u
}

// SegmentCacheStats returns the segment cache's counters and size (zero without a
// cache).
func (t *Tokenizer) SegmentCacheStats() SegmentCacheStats { return t.segs.stats() }

// TokenID returns the id of a token: an added token's content, or a vocabulary entry.
func (t *Tokenizer) TokenID(token string) (uint32, bool) {
	if id, ok := t.added.byContent[token]; ok {
		return id, true
	}
	id, ok := t.model.vocab[token]
	return id, ok
}

// VocabSize returns one more than the largest token id (vocabulary or added token):
// every id Encode returns is below it.
func (t *Tokenizer) VocabSize() int { return t.vocabSize }

// Encode returns the token ids of text. addSpecialTokens only controls the
// post-processor (e.g. a BOS from TemplateProcessing); special tokens written in the
// text are always recognised.
func (t *Tokenizer) Encode(text string, addSpecialTokens bool) ([]uint32, error) {
	return t.AppendEncode(make([]uint32, 0, len(text)/3+4), text, addSpecialTokens)
}

// errInvalidUTF8 is returned for text that is not valid UTF-8.
var errInvalidUTF8 = errors.New("tokenize: text is not valid UTF-8")

// AppendEncode appends the token ids of text to dst and returns the extended slice.
// On error dst is returned unchanged.
func (t *Tokenizer) AppendEncode(dst []uint32, text string, addSpecialTokens bool) ([]uint32, error) {
	dst, _, err := t.appendEncode(dst, text, addSpecialTokens)
	return dst, err
}

// segLookups counts one call's segment-cache lookups.
type segLookups struct{ hits, misses int }

// appendEncode is AppendEncode, also reporting the call's segment-cache lookups.
func (t *Tokenizer) appendEncode(dst []uint32, text string, addSpecialTokens bool) ([]uint32, segLookups, error) {
	if !utf8.ValidString(text) {
		return dst, segLookups{}, errInvalidUTF8
	}
	st := t.pool.Get().(*encScratch)
	st.lk = segLookups{}
	dst, err := t.appendEncodeWith(dst, text, addSpecialTokens, st)
	lk := st.lk
	t.putScratch(st)
	if c := t.segs; c != nil {
		if lk.hits > 0 {
			c.hits.Add(uint64(lk.hits))
		}
		if lk.misses > 0 {
			c.misses.Add(uint64(lk.misses))
		}
	}
	return dst, lk, err
}

func (t *Tokenizer) appendEncodeWith(dst []uint32, text string, addSpecialTokens bool, st *encScratch) ([]uint32, error) {
	base := len(dst)
	var err error
	if p := &t.post; p.simple {
		if addSpecialTokens {
			dst = append(dst, p.prefix...)
		}
		if dst, err = t.encodeBody(dst, text, st); err != nil {
			return dst[:base], fmt.Errorf("tokenize: %w", err)
		}
		if addSpecialTokens {
			dst = append(dst, p.suffix...)
		}
		return dst, nil
	}
	body, err := t.encodeBody(st.body[:0], text, st)
	st.body = body
	if err != nil {
		return dst, fmt.Errorf("tokenize: %w", err)
	}
	return t.post.apply(dst, body, addSpecialTokens), nil
}

func (t *Tokenizer) putScratch(st *encScratch) {
	if cap(st.arena) > 1<<20 {
		st.arena = nil
	}
	if cap(st.body) > 1<<18 {
		st.body = nil
	}
	st.arena = st.arena[:0]
	t.pool.Put(st)
}

// encodeBody runs added-token extraction, normalization, pre-tokenization and the
// model over text (everything but the post-processor).
func (t *Tokenizer) encodeBody(dst []uint32, text string, st *encScratch) ([]uint32, error) {
	if text == "" {
		return dst, nil
	}
	// 1. Non-normalized added tokens, on the raw text.
	segs := t.added.raw.split(text, t.added.tokens, st.segs[:0])
	st.segs = segs
	var err error
	c := t.segs
	for _, sg := range segs {
		if sg.id >= 0 {
			dst = append(dst, uint32(sg.id))
			continue
		}
		s, first := text[sg.start:sg.end], sg.start == 0
		if c == nil || len(s) < c.minLen {
			if dst, err = t.encodeSegment(dst, s, first, st); err != nil {
				return dst, err
			}
			continue
		}
		// The segment's ids depend only on (s, first): see the package documentation.
		h := c.hash(s, first)
		if ids, ok := c.get(h, s, first); ok {
			st.lk.hits++
			dst = append(dst, ids...)
			continue
		}
		st.lk.misses++
		n := len(dst)
		if dst, err = t.encodeSegment(dst, s, first, st); err != nil {
			return dst, err
		}
		c.put(h, s, first, dst[n:])
	}
	return dst, nil
}

// encodeSegment appends the ids of s, text between two added tokens of the raw text
// (first: s starts the input). The result is a function of s and first alone.
func (t *Tokenizer) encodeSegment(dst []uint32, s string, first bool, st *encScratch) ([]uint32, error) {
	var err error
	p := piece{s: s, orig0: first}
	if t.track && p.orig0 {
		_, p.zp = utf8.DecodeRuneInString(p.s)
	}
	// 2. Normalize the piece, then split it on the normalized added tokens.
	if t.norm != nil {
		p = t.norm.normalize(st, p)
	}
	if p.s == "" {
		return dst, nil
	}
	if t.added.norm.empty() {
		return t.encodePiece(dst, p, st)
	}
	nsegs := t.added.norm.split(p.s, t.added.tokens, st.nsegs[:0])
	st.nsegs = nsegs
	for _, ns := range nsegs {
		if ns.id >= 0 {
			dst = append(dst, uint32(ns.id))
			continue
		}
		if dst, err = t.encodePiece(dst, p.sub(ns.start, ns.end), st); err != nil {
			return dst, err
		}
	}
	return dst, nil
}

// encodePiece pre-tokenizes one normalized piece and runs the model on every word.
func (t *Tokenizer) encodePiece(dst []uint32, p piece, st *encScratch) ([]uint32, error) {
	var err error
	if len(t.pre) == 0 {
		return t.model.encodeWord(dst, p.s, st)
	}
	a := append(st.pa[:0], p)
	b := st.pb[:0]
	for _, step := range t.pre {
		b = step.split(st, a, b[:0])
		a, b = b, a
	}
	for _, q := range a {
		if dst, err = t.model.encodeWord(dst, q.s, st); err != nil {
			break
		}
	}
	st.pa, st.pb = a, b
	return dst, err
}

// encScratch holds the per-call buffers, pooled per Tokenizer.
type encScratch struct {
	track    bool
	lk       segLookups // this call's segment-cache lookups
	arena    []byte     // rewritten text; pieces point into it (see str)
	segs     []addedSeg
	nsegs    []addedSeg
	pa, pb   []piece
	spans    []span
	rspans   []span
	segflags []flagSpan
	acc      []flagSpan
	runes    []rune
	runeOffs []int
	body     []uint32
	normIter norm.Iter
	// BPE
	syms  []uint32
	pairs []uint64
	sym   []byte
	prev  []int32
	next  []int32
	alive []bool
	heap  []heapItem
}

// str returns arena[off:] as a string without copying. The arena is only appended to
// during a call, so the bytes behind the string never change while it is in use; a
// string kept beyond the call (the word cache) is cloned first.
func (st *encScratch) str(off int) string {
	if off == len(st.arena) {
		return ""
	}
	return unsafe.String(&st.arena[off], len(st.arena)-off)
}

// addedVocab is tokenizers' AddedVocabulary: tokens extracted from the text before
// the model runs, non-normalized ones from the raw text, normalized ones from the
// normalized pieces.
type addedVocab struct {
	byContent map[string]uint32 // content → id (added_tokens_map)
	tokens    map[uint32]*addedToken
	raw       tokenTrie // contents of non-normalized tokens
	norm      tokenTrie // normalized contents of normalized tokens
}

type addedToken struct {
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	Lstrip     bool   `json:"lstrip"`
	Rstrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

// build adds the tokens in file order as tokenizers' deserializer does (one
// add_tokens/add_special_tokens call per token): a token whose content is already known
// keeps that id, a new one gets the next id after the vocabulary. The ids written in
// the file are not used, exactly as in tokenizers.
func (v *addedVocab) build(raw json.RawMessage, m *bpeModel, n normalizer) error {
	v.byContent = map[string]uint32{}
	v.tokens = map[uint32]*addedToken{}
	if isNull(raw) {
		return nil
	}
	var list []json.RawMessage
	if err := json.Unmarshal(raw, &list); err != nil {
		return err
	}
	var specials, classic []*addedToken
	specialSet := map[string]bool{}
	var maxAdded uint32 // largest id in byContent
	for i, r := range list {
		tok := &addedToken{Normalized: true}
		if err := json.Unmarshal(r, tok); err != nil {
			return fmt.Errorf("[%d]: %w", i, err)
		}
		if tok.Special && tok.Content != "" && !specialSet[tok.Content] {
			specials = append(specials, tok)
			specialSet[tok.Content] = true
		}
		if tok.Content == "" || v.hasEqual(tok) {
			continue
		}
		id, ok := v.byContent[tok.Content]
		if !ok {
			id, ok = m.vocab[tok.Content]
		}
		if !ok {
			id = uint32(m.vocabSize)
			if len(v.byContent) > 0 && (int(maxAdded) >= m.vocabSize || m.vocabSize == 0) {
				id = maxAdded + 1
			}
		}
		if len(v.byContent) == 0 || id > maxAdded {
			maxAdded = id
		}
		v.byContent[tok.Content] = id
		v.tokens[id] = tok
		if !specialSet[tok.Content] {
			classic = append(classic, tok)
		}
	}
	// refresh_added_tokens: specials then classic tokens, partitioned on normalized.
	var st encScratch
	for _, tok := range append(specials, classic...) {
		id := v.byContent[tok.Content]
		if !tok.Normalized {
			v.raw.insert(tok.Content, id)
			continue
		}
		content := tok.Content
		if n != nil {
			content = strings.Clone(n.normalize(&st, piece{s: content}).s)
		}
		if content == "" {
			// tokenizers would match the empty pattern at every byte (and panic
			// inside multi-byte characters).
			return &UnsupportedError{Component: fmt.Sprintf("added token %q that normalizes to an empty string", tok.Content)}
		}
		v.norm.insert(content, id)
	}
	return nil
}

// hasEqual reports whether an identical token (all fields) was already added. A
// content has one id, so only that id's token can be equal.
func (v *addedVocab) hasEqual(tok *addedToken) bool {
	id, ok := v.byContent[tok.Content]
	if !ok {
		return false
	}
	t, ok := v.tokens[id]
	return ok && *t == *tok
}

// addedSeg is a part of the text: an added token (id >= 0) or text to encode.
type addedSeg struct {
	start, end int
	id         int64
}

// tokenTrie matches added-token contents leftmost-longest (aho-corasick's
// MatchKind::LeftmostLongest): the earliest match, the longest at that position.
type tokenTrie struct {
	first  [256]bool
	firsts []byte // the distinct first bytes, in insertion order
	nodes  []trieNode
}

type trieNode struct {
	edges []trieEdge
	id    int64 // token id if a pattern ends here, else -1
}

type trieEdge struct {
	b    byte
	next int32
}

func (t *tokenTrie) empty() bool { return len(t.nodes) == 0 }

// insert adds a pattern; for duplicate patterns the first one inserted wins.
func (t *tokenTrie) insert(s string, id uint32) {
	if s == "" {
		return
	}
	if len(t.nodes) == 0 {
		t.nodes = append(t.nodes, trieNode{id: -1})
	}
	if !t.first[s[0]] {
		t.firsts = append(t.firsts, s[0])
	}
	t.first[s[0]] = true
	n := int32(0)
	for i := 0; i < len(s); i++ {
		next := int32(-1)
		for _, e := range t.nodes[n].edges {
			if e.b == s[i] {
				next = e.next
				break
			}
		}
		if next < 0 {
			next = int32(len(t.nodes))
			t.nodes = append(t.nodes, trieNode{id: -1})
			t.nodes[n].edges = append(t.nodes[n].edges, trieEdge{b: s[i], next: next})
		}
		n = next
	}
	if t.nodes[n].id < 0 {
		t.nodes[n].id = int64(id)
	}
}

// longest returns the end and id of the longest pattern starting at s[i], or -1.
func (t *tokenTrie) longest(s string, i int) (int, int64) {
	end, id := -1, int64(-1)
	n := int32(0)
	for j := i; j < len(s); j++ {
		next := int32(-1)
		for _, e := range t.nodes[n].edges {
			if e.b == s[j] {
				next = e.next
				break
			}
		}
		if next < 0 {
			break
		}
		n = next
		if t.nodes[n].id >= 0 {
			end, id = j+1, t.nodes[n].id
		}
	}
	return end, id
}

// split is AddedVocabulary::find_matches: it cuts s into added tokens and the text
// between them, honouring single_word, lstrip and rstrip.
func (t *tokenTrie) split(s string, tokens map[uint32]*addedToken, out []addedSeg) []addedSeg {
	if len(t.nodes) == 0 {
		return append(out, addedSeg{0, len(s), -1})
	}
	startOffset := 0
	var sk firstSkipper
	sk.init(t)
	for i := 0; i < len(s); {
		if i = sk.next(s, i); i == len(s) {
			break
		}
		stop, id := t.longest(s, i)
		if stop < 0 {
			i++
			continue
		}
		start := i
		i = stop
		tok := tokens[uint32(id)]
		if tok.SingleWord {
			startSpace := start == 0 || !endsWithWord(s[:start])
			stopSpace := stop == len(s) || !startsWithWord(s[stop:])
			if !startSpace || !stopSpace {
				continue
			}
		}
		if tok.Lstrip {
			start = max(trailingSpaceStart(s[:start]), startOffset)
		}
		if tok.Rstrip {
			stop += leadingSpaceLen(s[stop:])
		}
		if startOffset < start {
			out = append(out, addedSeg{startOffset, start, -1})
		}
		out = append(out, addedSeg{start, stop, id})
		startOffset = stop
	}
	if startOffset != len(s) {
		out = append(out, addedSeg{startOffset, len(s), -1})
	}
	return out
}

// firstSkipper finds the next byte that can start a pattern. With few distinct first
// bytes (chat special tokens all start with '<') it jumps with strings.IndexByte,
// remembering the next occurrence of each; otherwise it tests byte by byte.
type firstSkipper struct {
	t   *tokenTrie
	n   int               // len(t.firsts) if at most maxSkipBytes, else 0
	pos [maxSkipBytes]int // next occurrence of firsts[k] at or after the last query, len(s) if none; -1 unknown
}

const maxSkipBytes = 3

func (k *firstSkipper) init(t *tokenTrie) {
	k.t = t
	if len(t.firsts) <= maxSkipBytes {
		k.n = len(t.firsts)
	}
	for j := range k.pos {
		k.pos[j] = -1
	}
}

// next returns the first j >= i at which some pattern can start, or len(s). Calls
// must not go backwards in i.
func (k *firstSkipper) next(s string, i int) int {
	if k.n == 0 {
		for i < len(s) && !k.t.first[s[i]] {
			i++
		}
		return i
	}
	best := len(s)
	for j := 0; j < k.n; j++ {
		p := k.pos[j]
		if p < i && p < len(s) {
			p = strings.IndexByte(s[i:], k.t.firsts[j])
			if p < 0 {
				p = len(s)
			} else {
				p += i
			}
			k.pos[j] = p
		}
		best = min(best, p)
	}
	return best
}

func endsWithWord(s string) bool {
	r, _ := utf8.DecodeLastRuneInString(s)
	return s != "" && charClass(r)&clsW != 0
}

func startsWithWord(s string) bool {
	r, _ := utf8.DecodeRuneInString(s)
	return s != "" && charClass(r)&clsW != 0
}

// trailingSpaceStart returns where the run of White_Space ending s starts.
func trailingSpaceStart(s string) int {
	i := len(s)
	for i > 0 {
		r, n := utf8.DecodeLastRuneInString(s[:i])
		if charClass(r)&clsS == 0 {
			break
		}
		i -= n
	}
	return i
}

// leadingSpaceLen returns the length of the run of White_Space starting s.
func leadingSpaceLen(s string) int {
	i := 0
	for i < len(s) {
		r, n := utf8.DecodeRuneInString(s[i:])
		if charClass(r)&clsS == 0 {
			break
		}
		i += n
	}
	return i
}

// postProcessor is the tokenizer.json post_processor as it affects ids: a list of
// processors, each mapping the ids of one sequence to new ids.
type postProcessor struct {
	procs []postProc
	// simple: the whole chain is prefix + $A + suffix (with special tokens) and $A
	// (without), which lets AppendEncode write straight into dst.
	simple         bool
	prefix, suffix []uint32
}

// postProc is one id-affecting processor: TemplateProcessing's single template, or
// Bert/Roberta processing expressed as one.
type postProc struct {
	items []postItem
	// template: TemplateProcessing semantics (repeated $A kept without special
	// tokens); otherwise Bert/Roberta (without special tokens: the sequence as is).
	template bool
}

type postItem struct {
	seq     bool     // $A
	ids     []uint32 // special token ids
	tokName string   // TemplateProcessing special token name, looked up in special_tokens
}

func parsePostProcessor(raw json.RawMessage) (postProcessor, error) {
	var p postProcessor
	err := p.parse(raw)
	return p, err
}

func (p *postProcessor) parse(raw json.RawMessage) error {
	if isNull(raw) {
		return nil
	}
	var h struct {
		Type          string            `json:"type"`
		Processors    []json.RawMessage `json:"processors"`
		Single        []json.RawMessage `json:"single"`
		SpecialTokens map[string]struct {
			IDs []uint32 `json:"ids"`
		} `json:"special_tokens"`
		Sep []json.RawMessage `json:"sep"`
		Cls []json.RawMessage `json:"cls"`
	}
	if err := json.Unmarshal(raw, &h); err != nil {
		return err
	}
	switch h.Type {
	case "Sequence":
		for i, r := range h.Processors {
			if err := p.parse(r); err != nil {
				return fmt.Errorf("processors[%d]: %w", i, err)
			}
		}
		return nil
	case "ByteLevel":
		return nil
	case "TemplateProcessing":
		proc := postProc{template: true}
		for i, r := range h.Single {
			item, err := parseTemplatePiece(r)
			if err != nil {
				return fmt.Errorf("single[%d]: %w", i, err)
			}
			if !item.seq {
				st, ok := h.SpecialTokens[item.tokName]
				if !ok {
					return fmt.Errorf("single[%d]: special token %q not in special_tokens", i, item.tokName)
				}
				item.ids = st.IDs
			}
			proc.items = append(proc.items, item)
		}
		p.procs = append(p.procs, proc)
		return nil
	case "BertProcessing", "RobertaProcessing":
		cls, err := parseTokenPair(h.Cls)
		if err != nil {
			return fmt.Errorf("%s: cls: %w", h.Type, err)
		}
		sep, err := parseTokenPair(h.Sep)
		if err != nil {
			return fmt.Errorf("%s: sep: %w", h.Type, err)
		}
		p.procs = append(p.procs, postProc{items: []postItem{{ids: []uint32{cls}}, {seq: true}, {ids: []uint32{sep}}}})
		return nil
	case "":
		return fmt.Errorf("post_processor without a type")
	}
	return &UnsupportedError{Component: fmt.Sprintf("post_processor %q", h.Type)}
}

// parseTokenPair reads Bert/Roberta's ["[CLS]", 101].
func parseTokenPair(raw []json.RawMessage) (uint32, error) {
	if len(raw) != 2 {
		return 0, fmt.Errorf("want [token, id]")
	}
	var id uint32
	if err := json.Unmarshal(raw[1], &id); err != nil {
		return 0, err
	}
	return id, nil
}

// parseTemplatePiece reads {"SpecialToken": {"id": ..}} or {"Sequence": {"id": "A"}}
// (tokenizers rejects the string forms, such as "$A", in tokenizer.json).
func parseTemplatePiece(raw json.RawMessage) (postItem, error) {
	var o struct {
		SpecialToken *struct {
			ID string `json:"id"`
		} `json:"SpecialToken"`
		Sequence *struct {
			ID string `json:"id"`
		} `json:"Sequence"`
	}
	if err := json.Unmarshal(raw, &o); err != nil {
		return postItem{}, err
	}
	switch {
	case o.Sequence != nil && o.SpecialToken == nil:
		if o.Sequence.ID != "A" {
			return postItem{}, &UnsupportedError{Component: "TemplateProcessing single template with $B"}
		}
		return postItem{seq: true}, nil
	case o.SpecialToken != nil && o.Sequence == nil:
		return postItem{tokName: o.SpecialToken.ID}, nil
	}
	return postItem{}, fmt.Errorf("want one of SpecialToken or Sequence")
}

// resolve computes the simple form when the chain allows it.
func (p *postProcessor) resolve() {
	p.simple = true
	p.prefix, p.suffix = nil, nil
	// Without special tokens a processor keeps its sequences; with exactly one $A per
	// template that is the identity, and specials wrap the result.
	for _, proc := range p.procs {
		seqs := 0
		var pre, suf []uint32
		for _, it := range proc.items {
			switch {
			case it.seq:
				seqs++
			case seqs == 0:
				pre = append(pre, it.ids...)
			default:
				suf = append(suf, it.ids...)
			}
		}
		if seqs != 1 {
			p.simple = false
			return
		}
		p.prefix = append(append([]uint32(nil), pre...), p.prefix...)
		p.suffix = append(p.suffix, suf...)
	}
}

// apply runs the processors over body (the general path).
func (p *postProcessor) apply(dst, body []uint32, addSpecial bool) []uint32 {
	cur := body
	for _, proc := range p.procs {
		var next []uint32
		if !proc.template && !addSpecial {
			continue
		}
		for _, it := range proc.items {
			if it.seq {
				next = append(next, cur...)
			} else if addSpecial {
				next = append(next, it.ids...)
			}
		}
		cur = next
	}
	return append(dst, cur...)
}
