package tokenize

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// Reading tokenizer.json. The file is mostly the model's vocab and merges (9 MB for
// Llama-3), which a small single-pass reader below decodes straight into the model's
// tables; the small sections (normalizer, pre_tokenizer, ...) go through encoding/json.

// Parse builds a Tokenizer from tokenizer.json bytes.
func Parse(data []byte) (*Tokenizer, error) {
	// One pass: the model is decoded where it stands, the other sections are kept as
	// raw JSON.
	r := jsonReader{data: data}
	fields := map[string][]byte{}
	var model *bpeModel
	var modelErr error
	err := r.object(func(key string) error {
		if key == "model" {
			model, modelErr = parseModel(&r)
			return modelErr
		}
		start := r.pos
		if err := r.skip(0); err != nil {
			return err
		}
		fields[key] = data[start:r.pos]
		return nil
	})
	if err == nil {
		err = r.end()
	}
	switch {
	case modelErr != nil:
		return nil, fmt.Errorf("tokenizer.json: model: %w", modelErr)
	case err != nil:
		return nil, fmt.Errorf("tokenizer.json: %w", err)
	case model == nil:
		return nil, fmt.Errorf("tokenizer.json: model: missing model")
	}
	t := &Tokenizer{}
	t.model = model
	if t.norm, err = parseNormalizer(fields["normalizer"]); err != nil {
		return nil, fmt.Errorf("tokenizer.json: normalizer: %w", err)
	}
	if t.pre, err = parsePreTokenizer(fields["pre_tokenizer"], nil); err != nil {
		return nil, fmt.Errorf("tokenizer.json: pre_tokenizer: %w", err)
	}
	if t.post, err = parsePostProcessor(fields["post_processor"]); err != nil {
		return nil, fmt.Errorf("tokenizer.json: post_processor: %w", err)
	}
	for _, p := range t.pre {
		if m, ok := p.(*metaspacePre); ok && m.scheme == prependFirst {
			t.track = true
		}
	}
	// Byte mode: the last pre-tokenizer step is ByteLevel, so the model can work on raw
	// bytes instead of their GPT-2 characters.
	if n := len(t.pre); n > 0 {
		if bl, ok := t.pre[n-1].(*byteLevelPre); ok && t.model.canByteMode() {
			bl.raw = true
			t.model.enableByteMode()
		}
	}
	if !t.model.byteMode {
		t.model.buildRuneTable()
	}
	t.model.buildCross()
	if err := t.added.build(fields["added_tokens"], t.model, t.norm); err != nil {
		return nil, fmt.Errorf("tokenizer.json: added_tokens: %w", err)
	}
	t.post.resolve()
	if len(t.model.vocab) > 0 || len(t.added.byContent) > 0 {
		t.vocabSize = int(t.model.maxID()) + 1
		for _, id := range t.added.byContent {
			t.vocabSize = max(t.vocabSize, int(id)+1)
		}
	}
	t.pool.New = func() any { return &encScratch{track: t.track} }
	return t, nil
}

// parseModel decodes the BPE model at r.
func parseModel(r *jsonReader) (*bpeModel, error) {
	r.space()
	if r.peek() == 'n' {
		return nil, fmt.Errorf("missing model")
	}
	m := &bpeModel{cache: newWordCache(defaultCacheSlots)}
	var typ *string
	var vocabArray, prefixKnown bool
	var merges []byte // merges read before the vocab, decoded after it
	fields := map[string][]byte{}
	err := r.object(func(key string) error {
		start := r.pos
		switch key {
		case "vocab":
			r.space()
			if (typ != nil && *typ != "BPE") || r.peek() == '[' {
				vocabArray = true
				return r.skip(0)
			}
			var err error
			if m.vocab, err = jsonVocab(r); err != nil {
				return fmt.Errorf("vocab: %w", err)
			}
			return nil
		case "continuing_subword_prefix":
			if err := r.skip(0); err != nil {
				return err
			}
			fields[key] = r.data[start:r.pos]
			var p *string
			if err := json.Unmarshal(fields[key], &p); err != nil {
				return fmt.Errorf("%s: %w", key, err)
			}
			if p != nil {
				m.prefix = *p
			}
			prefixKnown = true
			return nil
		case "merges":
			// Merges need the vocab and the prefix; read them now if both are known.
			if m.vocab == nil || !prefixKnown || (typ != nil && *typ != "BPE") {
				if err := r.skip(0); err != nil {
					return err
				}
				merges = r.data[start:r.pos]
				return nil
			}
			if err := m.readMerges(r); err != nil {
				return fmt.Errorf("merges: %w", err)
			}
			merges = nil
			return nil
		}
		if err := r.skip(0); err != nil {
			return err
		}
		fields[key] = r.data[start:r.pos]
		if key == "type" {
			typ = new(string)
			if err := json.Unmarshal(fields[key], typ); err != nil {
				return fmt.Errorf("type: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	switch {
	case typ != nil && *typ != "BPE":
		return nil, &UnsupportedError{Component: fmt.Sprintf("model type %q", *typ)}
	case vocabArray:
		return nil, &UnsupportedError{Component: "model with a list vocab (Unigram)"}
	case typ == nil && m.merges.slots == nil && merges == nil:
		return nil, &UnsupportedError{Component: "model without a type or merges"}
	}
	if m.vocab == nil {
		m.vocab = map[string]uint32{}
	}
	var opt struct {
		Dropout                 *float64
		UnkToken                *string
		ContinuingSubwordPrefix *string
		EndOfWordSuffix         *string
		FuseUnk                 bool
		ByteFallback            bool
		IgnoreMerges            bool
	}
	for _, f := range []struct {
		name string
		dst  any
	}{
		{"dropout", &opt.Dropout}, {"unk_token", &opt.UnkToken},
		{"continuing_subword_prefix", &opt.ContinuingSubwordPrefix},
		{"end_of_word_suffix", &opt.EndOfWordSuffix}, {"fuse_unk", &opt.FuseUnk},
		{"byte_fallback", &opt.ByteFallback}, {"ignore_merges", &opt.IgnoreMerges},
	} {
		if r, ok := fields[f.name]; ok {
			if err := json.Unmarshal(r, f.dst); err != nil {
				return nil, fmt.Errorf("%s: %w", f.name, err)
			}
		}
	}
	if opt.Dropout != nil && *opt.Dropout != 0 {
		return nil, &UnsupportedError{Component: fmt.Sprintf("BPE dropout %v", *opt.Dropout)}
	}
	m.fuseUnk, m.byteFallback, m.ignoreMerges = opt.FuseUnk, opt.ByteFallback, opt.IgnoreMerges
	m.vocabSize = len(m.vocab)
	if opt.UnkToken != nil {
		m.hasUnk = true
		m.unkToken = *opt.UnkToken
		m.unkID, m.unkInVocab = m.vocab[m.unkToken]
	}
	if opt.ContinuingSubwordPrefix != nil {
		m.prefix = *opt.ContinuingSubwordPrefix
	}
	if opt.EndOfWordSuffix != nil {
		m.suffix = *opt.EndOfWordSuffix
	}
	if m.byteFallback {
		for b := 0; b < 256; b++ {
			m.fallbackIDs[b], m.fallbackOK[b] = m.vocab[fmt.Sprintf("<0x%02X>", b)]
		}
	}
	if merges != nil {
		if err := m.readMerges(&jsonReader{data: merges}); err != nil {
			return nil, fmt.Errorf("merges: %w", err)
		}
	}
	if m.merges.slots == nil {
		m.merges = newMergeTable(0)
	}
	return m, nil
}

// readMerges fills the merge table from the merges at r, as tokenizers does: merge i
// of (a, b) has rank i and produces the token a + b without b's continuing-subword
// prefix; a later duplicate pair replaces an earlier one.
func (m *bpeModel) readMerges(r *jsonReader) error {
	n := 0
	var buf []byte
	m.merges = newMergeTable(2 * len(m.vocab))
	return jsonMerges(r, func(ta, tb []byte) error {
		i := n
		n++
		a, ok := m.vocab[string(ta)]
		if !ok {
			return fmt.Errorf("merge %d: token %q not in vocab", i, ta)
		}
		b, ok := m.vocab[string(tb)]
		if !ok {
			return fmt.Errorf("merge %d: token %q not in vocab", i, tb)
		}
		if len(tb) < len(m.prefix) {
			return fmt.Errorf("merge %d: token %q shorter than continuing_subword_prefix", i, tb)
		}
		buf = append(append(buf[:0], ta...), tb[len(m.prefix):]...)
		id, ok := m.vocab[string(buf)]
		if !ok {
			return fmt.Errorf("merge %d: merged token %q not in vocab", i, buf)
		}
		m.merges.put(a, b, uint32(i), id)
		return nil
	})
}

// maxID returns the largest id of the vocabulary.
func (m *bpeModel) maxID() uint32 {
	var mx uint32
	for _, id := range m.vocab {
		mx = max(mx, id)
	}
	return mx
}

// jsonVocab decodes {"token": id, ...} (or null) at r.
func jsonVocab(r *jsonReader) (map[string]uint32, error) {
	if r.peek() == 'n' {
		return map[string]uint32{}, r.skip(0)
	}
	vocab := make(map[string]uint32, 1024)
	err := r.object(func(key string) error {
		id, err := r.uint32()
		if err != nil {
			return fmt.Errorf("%q: %w", key, err)
		}
		vocab[key] = id
		return nil
	})
	return vocab, err
}

// jsonMerges decodes ["a b", ...], [["a", "b"], ...] or null at r, calling merge with
// the two tokens of each merge (only valid during the call).
func jsonMerges(r *jsonReader, merge func(a, b []byte) error) error {
	r.space()
	if r.peek() == 'n' {
		return r.skip(0)
	}
	sa, sb := make([]byte, 0, 64), make([]byte, 0, 64)
	n := 0
	err := r.array(func() error {
		r.space()
		var err error
		if r.peek() == '[' {
			k := 0
			err := r.array(func() error {
				var err error
				switch k {
				case 0:
					sa, err = r.strBytes(sa[:0])
				case 1:
					sb, err = r.strBytes(sb[:0])
				default:
					err = r.skipStr()
				}
				k++
				return err
			})
			if err != nil {
				return err
			}
			if k != 2 {
				return fmt.Errorf("merge %d: want a pair, got %d strings", n, k)
			}
			n++
			return merge(sa, sb)
		}
		if sa, err = r.strBytes(sa[:0]); err != nil {
			return err
		}
		sp := bytes.IndexByte(sa, ' ')
		if sp < 0 || bytes.IndexByte(sa[sp+1:], ' ') >= 0 {
			return fmt.Errorf("merge %d %q: want two space-separated tokens", n, sa)
		}
		n++
		return merge(sa[:sp], sa[sp+1:])
	})
	return err
}

// jsonReader is a minimal strict JSON reader over a byte slice.
type jsonReader struct {
	data []byte
	pos  int
}

var errJSONEnd = errors.New("unexpected end of JSON input")

func (r *jsonReader) errorf(format string, args ...any) error {
	return fmt.Errorf("JSON offset %d: %s", r.pos, fmt.Sprintf(format, args...))
}

func (r *jsonReader) space() {
	for r.pos < len(r.data) {
		switch r.data[r.pos] {
		case ' ', '\t', '\n', '\r':
			r.pos++
		default:
			return
		}
	}
}

func (r *jsonReader) peek() byte {
	if r.pos < len(r.data) {
		return r.data[r.pos]
	}
	return 0
}

// end checks that only whitespace follows.
func (r *jsonReader) end() error {
	r.space()
	if r.pos != len(r.data) {
		return r.errorf("unexpected data after the JSON value")
	}
	return nil
}

// object reads {"key": value, ...}, calling member with r positioned at each value,
// which member must consume.
func (r *jsonReader) object(member func(key string) error) error {
	r.space()
	if r.peek() != '{' {
		if r.pos >= len(r.data) {
			return errJSONEnd
		}
		return r.errorf("want an object")
	}
	r.pos++
	r.space()
	if r.peek() == '}' {
		r.pos++
		return nil
	}
	for {
		key, err := r.str()
		if err != nil {
			return err
		}
		r.space()
		if r.peek() != ':' {
			return r.errorf("want ':'")
		}
		r.pos++
		r.space()
		if err := member(key); err != nil {
			return err
		}
		r.space()
		switch r.peek() {
		case ',':
			r.pos++
			r.space()
		case '}':
			r.pos++
			return nil
		default:
			return r.errorf("want ',' or '}'")
		}
	}
}

// array reads [value, ...], calling elem with r positioned at each element.
func (r *jsonReader) array(elem func() error) error {
	r.space()
	if r.peek() != '[' {
		if r.pos >= len(r.data) {
			return errJSONEnd
		}
		return r.errorf("want an array")
	}
	r.pos++
	r.space()
	if r.peek() == ']' {
		r.pos++
		return nil
	}
	for {
		if err := elem(); err != nil {
			return err
		}
		r.space()
		switch r.peek() {
		case ',':
			r.pos++
			r.space()
		case ']':
			r.pos++
			return nil
		default:
			return r.errorf("want ',' or ']'")
		}
	}
}

// str reads a string. Invalid UTF-8 and lone surrogates are errors (serde_json, which
// reads tokenizer.json for tokenizers, rejects them too).
func (r *jsonReader) str() (string, error) {
	b, err := r.strBytes(nil)
	return string(b), err
}

// skipStr checks a string without copying it.
func (r *jsonReader) skipStr() error {
	_, err := r.strRaw(true)
	return err
}

// strBytes reads a string, appending its bytes to buf.
func (r *jsonReader) strBytes(buf []byte) ([]byte, error) {
	s, err := r.strRaw(false)
	if err != nil {
		return nil, err
	}
	if s != nil {
		return append(buf, s...), nil
	}
	return r.escapedStr(buf)
}

// strRaw reads a string without escapes and returns its bytes (aliasing the input).
// For a string with escapes it returns nil with r positioned at the string start
// (unless check, which validates the whole string and returns nil).
func (r *jsonReader) strRaw(check bool) ([]byte, error) {
	r.space()
	if r.peek() != '"' {
		if r.pos >= len(r.data) {
			return nil, errJSONEnd
		}
		return nil, r.errorf("want a string")
	}
	r.pos++
	start := r.pos
	for r.pos < len(r.data) {
		c := r.data[r.pos]
		switch {
		case c == '"':
			s := r.data[start:r.pos]
			r.pos++
			if !utf8.Valid(s) {
				return nil, r.errorf("invalid UTF-8 in string")
			}
			return s, nil
		case c == '\\':
			r.pos = start
			if check {
				var scratch [64]byte
				_, err := r.escapedStr(scratch[:0])
				return nil, err
			}
			return nil, nil
		case c < 0x20:
			return nil, r.errorf("control character in string")
		}
		r.pos++
	}
	return nil, errJSONEnd
}

func (r *jsonReader) escapedStr(buf []byte) ([]byte, error) {
	for r.pos < len(r.data) {
		c := r.data[r.pos]
		switch {
		case c == '"':
			r.pos++
			if !utf8.Valid(buf) {
				return nil, r.errorf("invalid UTF-8 in string")
			}
			return buf, nil
		case c < 0x20:
			return nil, r.errorf("control character in string")
		case c != '\\':
			buf = append(buf, c)
			r.pos++
			continue
		}
		r.pos++
		if r.pos >= len(r.data) {
			return nil, errJSONEnd
		}
		e := r.data[r.pos]
		r.pos++
		switch e {
		case '"', '\\', '/':
			buf = append(buf, e)
		case 'b':
			buf = append(buf, '\b')
		case 'f':
			buf = append(buf, '\f')
		case 'n':
			buf = append(buf, '\n')
		case 'r':
			buf = append(buf, '\r')
		case 't':
			buf = append(buf, '\t')
		case 'u':
			c1, err := r.hex4()
			if err != nil {
				return nil, err
			}
			if utf16.IsSurrogate(c1) {
				if c1 >= 0xDC00 || r.pos+1 >= len(r.data) || r.data[r.pos] != '\\' || r.data[r.pos+1] != 'u' {
					return nil, r.errorf("lone surrogate in string")
				}
				r.pos += 2
				c2, err := r.hex4()
				if err != nil {
					return nil, err
				}
				if c1 = utf16.DecodeRune(c1, c2); c1 == utf8.RuneError {
					return nil, r.errorf("lone surrogate in string")
				}
			}
			buf = utf8.AppendRune(buf, c1)
		default:
			return nil, r.errorf("invalid escape")
		}
	}
	return nil, errJSONEnd
}

func (r *jsonReader) hex4() (rune, error) {
	if r.pos+4 > len(r.data) {
		return 0, errJSONEnd
	}
	v, err := strconv.ParseUint(string(r.data[r.pos:r.pos+4]), 16, 32)
	if err != nil {
		return 0, r.errorf("invalid \\u escape")
	}
	r.pos += 4
	return rune(v), nil
}

// uint32 reads a non-negative integer that fits a token id.
func (r *jsonReader) uint32() (uint32, error) {
	r.space()
	start := r.pos
	var v uint64
	for r.pos < len(r.data) && '0' <= r.data[r.pos] && r.data[r.pos] <= '9' {
		v = v*10 + uint64(r.data[r.pos]-'0')
		if v >= 1<<32-1 {
			return 0, r.errorf("id out of range")
		}
		r.pos++
	}
	if r.pos == start || (r.pos-start > 1 && r.data[start] == '0') {
		return 0, r.errorf("want a non-negative integer id")
	}
	if c := r.peek(); c == '.' || c == 'e' || c == 'E' {
		return 0, r.errorf("want an integer id")
	}
	return uint32(v), nil
}

// maxDepth bounds the nesting skip accepts.
const maxDepth = 1000

// skip consumes one value, checking its syntax.
func (r *jsonReader) skip(depth int) error {
	if depth > maxDepth {
		return r.errorf("nesting too deep")
	}
	r.space()
	if r.pos >= len(r.data) {
		return errJSONEnd
	}
	switch c := r.data[r.pos]; {
	case c == '{':
		return r.object(func(string) error { return r.skip(depth + 1) })
	case c == '[':
		return r.array(func() error { return r.skip(depth + 1) })
	case c == '"':
		return r.skipStr()
	case c == '-' || '0' <= c && c <= '9':
		return r.number()
	default:
		for _, lit := range []string{"true", "false", "null"} {
			if strings.HasPrefix(string(r.data[r.pos:min(len(r.data), r.pos+5)]), lit) {
				r.pos += len(lit)
				return nil
			}
		}
		return r.errorf("invalid value")
	}
}

// number consumes a JSON number.
func (r *jsonReader) number() error {
	if r.peek() == '-' {
		r.pos++
	}
	digits := func() int {
		n := 0
		for r.pos < len(r.data) && '0' <= r.data[r.pos] && r.data[r.pos] <= '9' {
			r.pos++
			n++
		}
		return n
	}
	intStart := r.pos
	if n := digits(); n == 0 || (n > 1 && r.data[intStart] == '0') {
		return r.errorf("invalid number")
	}
	if r.peek() == '.' {
		r.pos++
		if digits() == 0 {
			return r.errorf("invalid number")
		}
	}
	if c := r.peek(); c == 'e' || c == 'E' {
		r.pos++
		if c := r.peek(); c == '+' || c == '-' {
			r.pos++
		}
		if digits() == 0 {
			return r.errorf("invalid number")
		}
	}
	return nil
}
