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

func (n formNormalizer) normalize(st *encScratch, p piece) piece {
	if n.f.IsNormalString(p.s) {
		return p
	}
	off := len(st.arena)
	st.arena = n.f.AppendString(st.arena, p.s)
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

// lowercaseNormalizer is Rust's char::to_lowercase per character: Unicode simple
// lowercase mapping, plus the one unconditional multi-character mapping (U+0130).
type lowercaseNormalizer struct{}

func lowerAppend(dst []byte, s string) []byte {
	for _, r := range s {
		if r == '\u0130' {
			dst = append(dst, "i\u0307"...)
			continue
		}
		dst = utf8.AppendRune(dst, unicode.ToLower(r))
	}
	return dst
}

func (lowercaseNormalizer) normalize(st *encScratch, p piece) piece {
	changed := false
	for _, r := range p.s {
		if r == '\u0130' || unicode.ToLower(r) != r {
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
