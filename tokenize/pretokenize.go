package tokenize

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
)

// preTokenizer is one step of the tokenizer.json pre-tokenizer (a Sequence is
// flattened into its steps): it splits, and may rewrite, every piece of in, appending
// the non-empty results to out.
type preTokenizer interface {
	split(st *encScratch, in, out []piece) []piece
}

// splitBehavior is tokenizers' SplitDelimiterBehavior.
type splitBehavior int

const (
	behIsolated splitBehavior = iota
	behRemoved
	behMergedWithPrevious
	behMergedWithNext
	behContiguous
)

func parseBehavior(s string) (splitBehavior, error) {
	switch s {
	case "Isolated":
		return behIsolated, nil
	case "Removed":
		return behRemoved, nil
	case "MergedWithPrevious":
		return behMergedWithPrevious, nil
	case "MergedWithNext":
		return behMergedWithNext, nil
	case "Contiguous":
		return behContiguous, nil
	}
	return 0, &UnsupportedError{Component: fmt.Sprintf("split behavior %q", s)}
}

// prependScheme is Metaspace's prepend_scheme.
type prependScheme int

const (
	prependAlways prependScheme = iota
	prependFirst
	prependNever
)

// parsePreTokenizer appends the steps described by raw to steps.
func parsePreTokenizer(raw json.RawMessage, steps []preTokenizer) ([]preTokenizer, error) {
	if isNull(raw) {
		return steps, nil
	}
	var h struct {
		Type             string            `json:"type"`
		PreTokenizers    []json.RawMessage `json:"pretokenizers"`
		Pattern          json.RawMessage   `json:"pattern"`
		Behavior         string            `json:"behavior"`
		Invert           bool              `json:"invert"`
		AddPrefixSpace   *bool             `json:"add_prefix_space"`
		UseRegex         *bool             `json:"use_regex"`
		Replacement      *string           `json:"replacement"`
		PrependScheme    *string           `json:"prepend_scheme"`
		Split            *bool             `json:"split"`
		IndividualDigits bool              `json:"individual_digits"`
	}
	if err := json.Unmarshal(raw, &h); err != nil {
		return nil, err
	}
	switch h.Type {
	case "Sequence":
		for i, r := range h.PreTokenizers {
			var err error
			if steps, err = parsePreTokenizer(r, steps); err != nil {
				return nil, fmt.Errorf("pretokenizers[%d]: %w", i, err)
			}
		}
		return steps, nil
	case "Split":
		m, err := parsePattern(h.Pattern)
		if err != nil {
			return nil, fmt.Errorf("Split: %w", err)
		}
		b, err := parseBehavior(h.Behavior)
		if err != nil {
			return nil, fmt.Errorf("Split: %w", err)
		}
		return append(steps, &splitPre{m: m, behavior: b, invert: h.Invert}), nil
	case "ByteLevel":
		return append(steps, &byteLevelPre{
			addPrefixSpace: h.AddPrefixSpace == nil || *h.AddPrefixSpace,
			useRegex:       h.UseRegex == nil || *h.UseRegex,
		}), nil
	case "Metaspace":
		rep := "▁"
		if h.Replacement != nil {
			rep = *h.Replacement
		}
		if _, n := utf8.DecodeRuneInString(rep); n == 0 || n != len(rep) {
			return nil, fmt.Errorf("Metaspace: replacement %q is not one character", rep)
		}
		scheme := prependAlways
		if h.PrependScheme != nil {
			switch *h.PrependScheme {
			case "always":
				scheme = prependAlways
			case "first":
				scheme = prependFirst
			case "never":
				scheme = prependNever
			default:
				return nil, &UnsupportedError{Component: fmt.Sprintf("Metaspace prepend_scheme %q", *h.PrependScheme)}
			}
		} else if h.AddPrefixSpace != nil && !*h.AddPrefixSpace {
			scheme = prependNever
		}
		return append(steps, &metaspacePre{rep: rep, scheme: scheme, doSplit: h.Split == nil || *h.Split}), nil
	case "Digits":
		b := behContiguous
		if h.IndividualDigits {
			b = behIsolated
		}
		return append(steps, &splitPre{m: runeMatcher{pred: isNumeric}, behavior: b}), nil
	case "":
		return nil, fmt.Errorf("pre_tokenizer without a type")
	}
	return nil, &UnsupportedError{Component: fmt.Sprintf("pre_tokenizer %q", h.Type)}
}

// splitPre is the Split pre-tokenizer (and Digits).
type splitPre struct {
	m        matcher
	behavior splitBehavior
	invert   bool
}

func (s *splitPre) split(st *encScratch, in, out []piece) []piece {
	for _, p := range in {
		spans := s.m.find(p.s, st.spans[:0], st)
		st.spans = spans
		out = splitPiece(st, p, spans, s.behavior, s.invert, out)
	}
	return out
}

// splitPiece is NormalizedString::split: the matches and the gaps between them cover p;
// behavior decides how delimiters (matches, or gaps when inverted) attach.
func splitPiece(st *encScratch, p piece, matches []span, behavior splitBehavior, invert bool, out []piece) []piece {
	if behavior == behIsolated {
		// Every match and every gap is its own piece; invert changes nothing.
		prev := 0
		for _, m := range matches {
			if m.start > prev {
				out = append(out, p.sub(prev, m.start))
			}
			if m.end > m.start {
				out = append(out, p.sub(m.start, m.end))
			}
			prev = m.end
		}
		if prev < len(p.s) {
			out = append(out, p.sub(prev, len(p.s)))
		}
		return out
	}
	// segs: the (offsets, is_match) list of Pattern::find_matches.
	segs := st.segflags[:0]
	prev := 0
	for _, m := range matches {
		if m.start != prev {
			segs = append(segs, flagSpan{span{prev, m.start}, invert})
		}
		segs = append(segs, flagSpan{m, !invert})
		prev = m.end
	}
	if prev != len(p.s) {
		segs = append(segs, flagSpan{span{prev, len(p.s)}, invert})
	}
	// acc: (offsets, remove) as in NormalizedString::split.
	acc := st.acc[:0]
	switch behavior {
	case behRemoved:
		for _, s := range segs {
			acc = append(acc, flagSpan{s.span, s.match})
		}
	case behContiguous:
		prevMatch := false
		for _, s := range segs {
			if len(acc) > 0 && s.match == prevMatch {
				acc[len(acc)-1].end = s.end
			} else {
				acc = append(acc, flagSpan{s.span, false})
			}
			prevMatch = s.match
		}
	case behMergedWithPrevious:
		prevMatch := false
		for _, s := range segs {
			if len(acc) > 0 && s.match && !prevMatch {
				acc[len(acc)-1].end = s.end
			} else {
				acc = append(acc, flagSpan{s.span, false})
			}
			prevMatch = s.match
		}
	case behMergedWithNext:
		prevMatch := false
		for i := len(segs) - 1; i >= 0; i-- {
			s := segs[i]
			if len(acc) > 0 && s.match && !prevMatch {
				acc[len(acc)-1].start = s.start
			} else {
				acc = append(acc, flagSpan{s.span, false})
			}
			prevMatch = s.match
		}
		for i, j := 0, len(acc)-1; i < j; i, j = i+1, j-1 {
			acc[i], acc[j] = acc[j], acc[i]
		}
	}
	for _, a := range acc {
		if !a.match && a.end > a.start {
			out = append(out, p.sub(a.start, a.end))
		}
	}
	st.segflags, st.acc = segs, acc
	return out
}

// flagSpan is a span with a flag: is_match in a match list, should_remove in a split list.
type flagSpan struct {
	span
	match bool
}

// byteLevelPre is the ByteLevel pre-tokenizer: optional prefix space, optional GPT-2
// regex split, then each byte becomes its GPT-2 character. When it is the last step and
// the model runs in byte mode (raw), the mapping is left to the model.
type byteLevelPre struct {
	addPrefixSpace bool
	useRegex       bool
	raw            bool
}

func (b *byteLevelPre) split(st *encScratch, in, out []piece) []piece {
	for _, p := range in {
		if b.addPrefixSpace && !strings.HasPrefix(p.s, " ") {
			off := len(st.arena)
			st.arena = append(st.arena, ' ')
			st.arena = append(st.arena, p.s...)
			q := piece{s: st.str(off), orig0: p.orig0}
			if p.zp > 0 {
				q.zp = p.zp + 1
			}
			p = q
		}
		start := len(out)
		if b.useRegex {
			spans := scanGPT2(p.s, st.spans[:0])
			st.spans = spans
			out = splitPiece(st, p, spans, behIsolated, false, out)
		} else {
			out = append(out, p)
		}
		if !b.raw {
			for i := start; i < len(out); i++ {
				out[i] = byteLevelMap(st, out[i])
			}
		}
	}
	return out
}

// byteLevelMap rewrites every byte of p as its GPT-2 character. Every character derived
// from a byte keeps the alignment of its original character.
func byteLevelMap(st *encScratch, p piece) piece {
	off := len(st.arena)
	zpEnd := -1
	for i := 0; i < len(p.s); i++ {
		if i == p.zp {
			zpEnd = len(st.arena) - off
		}
		st.arena = utf8.AppendRune(st.arena, byteLevelChars[p.s[i]])
	}
	q := piece{s: st.str(off), orig0: p.orig0}
	if p.zp > 0 {
		if zpEnd < 0 {
			zpEnd = len(q.s)
		}
		q.zp = zpEnd
	}
	return q
}

// spaceMatcher finds the spaces Metaspace replaces.
var spaceMatcher matcher = literalMatcher{lit: " "}

// metaspacePre is the Metaspace pre-tokenizer: spaces become the replacement character,
// which is prepended per prepend_scheme, then (with split) each replacement starts a
// new piece.
type metaspacePre struct {
	rep     string
	scheme  prependScheme
	doSplit bool
}

func (m *metaspacePre) split(st *encScratch, in, out []piece) []piece {
	for _, p := range in {
		p = replaceAll(st, p, spaceMatcher, m.rep)
		prepend := false
		switch m.scheme {
		case prependAlways:
			prepend = !strings.HasPrefix(p.s, m.rep)
		case prependFirst:
			prepend = !strings.HasPrefix(p.s, m.rep) && p.orig0
		}
		if prepend {
			p = prependNormalizer{s: m.rep}.normalize(st, p)
		}
		if !m.doSplit {
			if p.s != "" {
				out = append(out, p)
			}
			continue
		}
		spans := st.spans[:0]
		for i := 0; i < len(p.s); {
			k := strings.Index(p.s[i:], m.rep)
			if k < 0 {
				break
			}
			spans = append(spans, span{i + k, i + k + len(m.rep)})
			i += k + len(m.rep)
		}
		st.spans = spans
		out = splitPiece(st, p, spans, behMergedWithNext, false, out)
	}
	return out
}
