package tokenize

import (
	"encoding/json"
	"fmt"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// piece is a part of the text on its way to the model: a normalized string, plus what
// Metaspace's prepend_scheme "first" needs to know about its alignment to the original
// text (only tracked when such a Metaspace exists, see Tokenizer.track):
//
//   - orig0: the piece starts at offset 0 of the original text (tokenizers'
//     `normalized.offsets_original().0 == 0`);
//   - zp: how many leading bytes of s are aligned to original offset 0 (tokenizers
//     aligns inserted characters with their neighbour, so a prefix of the normalized
//     text can map to the first original character). A split at byte a of the piece
//     yields a sub-piece with orig0 iff a < zp.
type piece struct {
	s     string
	orig0 bool
	zp    int
}

// sub returns the slice [a, b) of p as tokenizers' NormalizedString::slice does.
func (p piece) sub(a, b int) piece {
	q := piece{s: p.s[a:b]}
	if a < p.zp {
		q.orig0 = true
		q.zp = min(p.zp-a, b-a)
	}
	return q
}

// normalizer is one step of the tokenizer.json normalizer.
type normalizer interface {
	normalize(st *encScratch, p piece) piece
}

// parseNormalizer builds the normalizer described by raw (nil for JSON null).
func parseNormalizer(raw json.RawMessage) (normalizer, error) {
	if isNull(raw) {
		return nil, nil
	}
	var h struct {
		Type        string            `json:"type"`
		Normalizers []json.RawMessage `json:"normalizers"`
		Prepend     *string           `json:"prepend"`
		Pattern     json.RawMessage   `json:"pattern"`
		Content     *string           `json:"content"`
		StripLeft   *bool             `json:"strip_left"`
		StripRight  *bool             `json:"strip_right"`
	}
	if err := json.Unmarshal(raw, &h); err != nil {
		return nil, err
	}
	switch h.Type {
	case "Sequence":
		var seq seqNormalizer
		for i, r := range h.Normalizers {
			n, err := parseNormalizer(r)
			if err != nil {
				return nil, fmt.Errorf("normalizers[%d]: %w", i, err)
			}
			if n != nil {
				seq = append(seq, n)
			}
		}
		return seq, nil
	case "NFC":
		return formNormalizer{norm.NFC}, nil
	case "NFD":
		return formNormalizer{norm.NFD}, nil
	case "NFKC":
		return formNormalizer{norm.NFKC}, nil
	case "NFKD":
		return formNormalizer{norm.NFKD}, nil
	case "Lowercase":
		return lowercaseNormalizer{}, nil
	case "Strip":
		return stripNormalizer{left: h.StripLeft == nil || *h.StripLeft, right: h.StripRight == nil || *h.StripRight}, nil
	case "Prepend":
		if h.Prepend == nil {
			return nil, fmt.Errorf("Prepend: missing prepend")
		}
		return prependNormalizer{s: *h.Prepend}, nil
	case "Replace":
		if h.Content == nil {
			return nil, fmt.Errorf("Replace: missing content")
		}
		m, err := parsePattern(h.Pattern)
		if err != nil {
			return nil, fmt.Errorf("Replace: %w", err)
		}
		return replaceNormalizer{m: m, content: *h.Content}, nil
	case "":
		return nil, fmt.Errorf("normalizer without a type")
	}
	return nil, &UnsupportedError{Component: fmt.Sprintf("normalizer %q", h.Type)}
}

// parsePattern reads a Split/Replace pattern: {"String": s} or {"Regex": r}.
func parsePattern(raw json.RawMessage) (matcher, error) {
	var p struct {
		String *string `json:"String"`
		Regex  *string `json:"Regex"`
	}
	if isNull(raw) {
		return nil, fmt.Errorf("missing pattern")
	}
	if err := json.Unmarshal(raw, &p); err != nil {
		return nil, fmt.Errorf("pattern: %w", err)
	}
	switch {
	case p.String != nil && p.Regex == nil:
		if *p.String == "" {
			return nil, &UnsupportedError{Component: "empty String pattern"}
		}
		return literalMatcher{lit: *p.String}, nil
	case p.Regex != nil && p.String == nil:
		return compileMatcher(*p.Regex)
	}
	return nil, fmt.Errorf("pattern: want exactly one of String or Regex")
}

// seqNormalizer applies its normalizers in order.
type seqNormalizer []normalizer

func (s seqNormalizer) normalize(st *encScratch, p piece) piece {
	for _, n := range s {
		p = n.normalize(st, p)
	}
	return p
}

// formNormalizer applies a Unicode normalization form.
type formNormalizer struct{ f norm.Form }

// normUnknown are the characters the reference's normalizers do not know: tokenizers
// normalizes with tables older than Go's (x/text's are Unicode 15.0), so these newer
// characters keep their form there and act as plain starters (no decomposition,
// combining class 0, no composition). Recorded from the reference by gen.js
// (testdata/golden/unicode_classes.json, "norm_unknown"); TestNormUnknown checks it.
var normUnknown = &unicode.RangeTable{
	R16: []unicode.Range16{
		{0x7FD, 0x7FD, 1}, {0x897, 0x89F, 1}, {0x8CA, 0x8D3, 1}, {0x9FE, 0x9FE, 1},
		{0xC3C, 0xC3C, 1}, {0xD3B, 0xD3C, 1}, {0xEBA, 0xEBA, 1}, {0x1715, 0x1715, 1},
		{0x1ABF, 0x1ADD, 1}, {0x1AE0, 0x1AEB, 1}, {0x1DF6, 0x1DFA, 1}, {0x32FF, 0x32FF, 1},
		{0xA7F1, 0xA7F4, 1}, {0xA82C, 0xA82C, 1}, {0xAB69, 0xAB69, 1},
	},
	R32: []unicode.Range32{
		{0x105C9, 0x105C9, 1}, {0x105D2, 0x105D2, 1}, {0x105DA, 0x105DA, 1},
		{0x105E4, 0x105E4, 1}, {0x10781, 0x10785, 1}, {0x10787, 0x107B0, 1},
		{0x107B2, 0x107BA, 1}, {0x10D24, 0x10D27, 1}, {0x10D69, 0x10D6D, 1},
		{0x10EAB, 0x10EAC, 1}, {0x10EFA, 0x10EFB, 1}, {0x10EFD, 0x10EFF, 1},
		{0x10F46, 0x10F50, 1}, {0x10F82, 0x10F85, 1}, {0x11070, 0x11070, 1},
		{0x1133B, 0x1133B, 1}, {0x11382, 0x11385, 1}, {0x1138B, 0x1138B, 1},
		{0x1138E, 0x1138E, 1}, {0x11390, 0x11391, 1}, {0x113C2, 0x113C2, 1},
		{0x113C5, 0x113C5, 1}, {0x113C7, 0x113C8, 1}, {0x113CE, 0x113D0, 1},
		{0x1145E, 0x1145E, 1}, {0x11839, 0x1183A, 1}, {0x11935, 0x11935, 1},
		{0x11938, 0x11938, 1}, {0x1193D, 0x1193E, 1}, {0x11943, 0x11943, 1},
		{0x119E0, 0x119E0, 1}, {0x11A34, 0x11A34, 1}, {0x11A47, 0x11A47, 1},
		{0x11A99, 0x11A99, 1}, {0x11D42, 0x11D42, 1}, {0x11D44, 0x11D45, 1},
		{0x11D97, 0x11D97, 1}, {0x11F41, 0x11F42, 1}, {0x1611E, 0x1611E, 1},
		{0x16121, 0x16129, 1}, {0x1612F, 0x1612F, 1}, {0x16D63, 0x16D63, 1},
		{0x16D67, 0x16D6A, 1}, {0x16FF0, 0x16FF1, 1}, {0x1CCD6, 0x1CCF9, 1},
		{0x1E030, 0x1E06D, 1}, {0x1E08F, 0x1E08F, 1}, {0x1E130, 0x1E136, 1},
		{0x1E2AE, 0x1E2AE, 1}, {0x1E2EC, 0x1E2EF, 1}, {0x1E4EC, 0x1E4EF, 1},
		{0x1E5EE, 0x1E5EF, 1}, {0x1E6E3, 0x1E6E3, 1}, {0x1E6E6, 0x1E6E6, 1},
		{0x1E6EE, 0x1E6EF, 1}, {0x1E6F5, 0x1E6F5, 1}, {0x1F16C, 0x1F16C, 1},
		{0x1FBF0, 0x1FBF9, 1},
	},
}

// appendForm appends f(s) to dst. (norm.Form.AppendString(dst, s) would return
// f(dst + s), normalizing across the boundary into bytes that belong to other pieces,
// and it allocates its reorder buffer on every call; the pooled iterator does neither.)
func appendForm(st *encScratch, f norm.Form, dst []byte, s string) []byte {
	if s == "" {
		return dst
	}
	it := &st.normIter
	it.InitString(f, s)
	for !it.Done() {
		dst = append(dst, it.Next()...)
	}
	return dst
}

func (n formNormalizer) normalize(st *encScratch, p piece) piece {
	if n.f.QuickSpanString(p.s) == len(p.s) { // (IsNormalString allocates)
		return p
	}
	off := len(st.arena)
	// Characters in normUnknown stay as they are and split the text: as starters that
	// never compose, nothing normalizes across them.
	prev := 0
	for i := 0; i < len(p.s); {
		r, size := runeAt(p.s, i)
		if r >= 0x300 && unicode.Is(normUnknown, r) {
			st.arena = appendForm(st, n.f, st.arena, p.s[prev:i])
			st.arena = append(st.arena, p.s[i:i+size]...)
			prev = i + size
		}
		i += size
	}
	st.arena = appendForm(st, n.f, st.arena, p.s[prev:])
	q := piece{s: st.str(off), orig0: p.orig0}
	if st.track && p.zp > 0 {
		// The characters derived from the zero-aligned prefix, extended over the
		// combining marks that may compose with it.
		end := p.zp
		for end < len(p.s) {
			r, sz := utf8.DecodeRuneInString(p.s[end:])
			if !unicode.Is(unicode.M, r) {
				break
			}
			end += sz
		}
		q.zp = min(len(n.f.String(p.s[:end])), len(q.s))
	}
	return q
}

// lowercaseNormalizer is Rust's char::to_lowercase per character: the Unicode
// lowercase mapping, with the one unconditional multi-character mapping (U+0130), and
// the case pairs added after Go's Unicode 15.0 (lowerRune). TestLowercase checks every
// character against the reference.
type lowercaseNormalizer struct{}

// lowerRune is unicode.ToLower plus the lowercase mappings of Unicode 16.0 and 17.0.
func lowerRune(r rune) rune {
	switch {
	case r < 0x1C89:
		return unicode.ToLower(r)
	case r == 0x1C89:
		return 0x1C8A
	case r == 0xA7CB:
		return 0x0264
	case r == 0xA7DC:
		return 0x019B
	case r == 0xA7CC || r == 0xA7CE || r == 0xA7D2 || r == 0xA7D4 || r == 0xA7DA:
		return r + 1
	case 0x10D50 <= r && r <= 0x10D65: // Garay
		return r + 0x20
	case 0x16EA0 <= r && r <= 0x16EB8: // Beria Erfe
		return r + 0x1B
	}
	return unicode.ToLower(r)
}

func lowerAppend(dst []byte, s string) []byte {
	for _, r := range s {
		if r == '\u0130' {
			dst = append(dst, "i\u0307"...)
			continue
		}
		dst = utf8.AppendRune(dst, lowerRune(r))
	}
	return dst
}

func (lowercaseNormalizer) normalize(st *encScratch, p piece) piece {
	changed := false
	for _, r := range p.s {
		if r == '\u0130' || lowerRune(r) != r {
			changed = true
			break
		}
	}
	if !changed {
		return p
	}
	off := len(st.arena)
	st.arena = lowerAppend(st.arena, p.s)
	q := piece{s: st.str(off), orig0: p.orig0}
	if st.track && p.zp > 0 {
		q.zp = len(lowerAppend(nil, p.s[:p.zp]))
	}
	return q
}

// stripNormalizer removes leading and/or trailing White_Space characters.
type stripNormalizer struct{ left, right bool }

func (n stripNormalizer) normalize(st *encScratch, p piece) piece {
	a, b := 0, len(p.s)
	if n.left {
		for a < b {
			r, sz := utf8.DecodeRuneInString(p.s[a:])
			if charClass(r)&clsS == 0 {
				break
			}
			a += sz
		}
	}
	if n.right {
		for b > a {
			r, sz := utf8.DecodeLastRuneInString(p.s[a:b])
			if charClass(r)&clsS == 0 {
				break
			}
			b -= sz
		}
	}
	q := piece{s: p.s[a:b], orig0: p.orig0}
	if p.zp > 0 {
		q.zp = max(0, min(p.zp-a, b-a))
	}
	return q
}

// prependNormalizer prepends a string to non-empty text.
type prependNormalizer struct{ s string }

func (n prependNormalizer) normalize(st *encScratch, p piece) piece {
	if p.s == "" {
		return p
	}
	off := len(st.arena)
	st.arena = append(st.arena, n.s...)
	st.arena = append(st.arena, p.s...)
	q := piece{s: st.str(off), orig0: p.orig0}
	if p.zp > 0 {
		q.zp = p.zp + len(n.s)
	}
	return q
}

// replaceNormalizer replaces every match of a pattern with content.
type replaceNormalizer struct {
	m       matcher
	content string
}

func (n replaceNormalizer) normalize(st *encScratch, p piece) piece {
	return replaceAll(st, p, n.m, n.content)
}

// replaceAll is NormalizedString::replace: every match is replaced by content. The
// replacement characters are inserted ones, aligned with the byte before the match
// (or with offset 0 at the very start), which is what moves zp.
func replaceAll(st *encScratch, p piece, m matcher, content string) piece {
	spans := m.find(p.s, st.rspans[:0], st)
	st.rspans = spans
	if len(spans) == 0 {
		return p
	}
	off := len(st.arena)
	prev := 0
	zp := p.zp
	for _, sp := range spans {
		st.arena = append(st.arena, p.s[prev:sp.start]...)
		// The match occupies [ns, ne) of the text rewritten so far; zp is in the same
		// coordinates. The inserted content is zero-aligned iff the byte before it is.
		ns := len(st.arena) - off
		ne := ns + (sp.end - sp.start)
		if ns <= zp {
			zp = ns + len(content) + max(0, zp-ne)
		}
		st.arena = append(st.arena, content...)
		prev = sp.end
	}
	st.arena = append(st.arena, p.s[prev:]...)
	q := piece{s: st.str(off), orig0: p.orig0}
	if p.orig0 {
		q.zp = zp
	}
	return q
}

func isNull(raw json.RawMessage) bool {
	for _, c := range raw {
		switch c {
		case ' ', '\t', '\n', '\r':
			continue
		case 'n':
			return true
		}
		return false
	}
	return true
}
