package tokenize

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
)

// Split patterns. `tokenizers` compiles them with Oniguruma; Go's regexp (RE2) has no
// lookahead and an ASCII-only \s, so the patterns real models use get hand-written
// scanners below, recognised by their exact pattern string, and every other pattern goes
// to regexp2, whose default (.NET) mode agrees with Oniguruma on these constructs (\s is
// Unicode White_Space, \p{..} are general categories, (?!..) lookahead, leftmost-first
// alternation with backtracking).

const (
	// gpt2Pattern is the GPT-2 pre-tokenization regex, used by the ByteLevel
	// pre-tokenizer when use_regex is true.
	gpt2Pattern = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
	// llama3Pattern is the Llama-3 (tiktoken cl100k-style) Split regex.
	llama3Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// qwen2Pattern is Qwen2's Split regex: Llama-3's with single digits.
	qwen2Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

// Character classes as Oniguruma and Rust see them.
const (
	clsL   = 1 << iota // \p{L}
	clsN               // \p{N}
	clsS               // \s: Unicode White_Space
	clsW               // Rust regex \w: Alphabetic, M, Nd, Pc, Join_Control
	clsNum             // Rust char::is_numeric (the Digits pre-tokenizer)
)

// The reference (tokenizers 0.23.2) classifies characters with Unicode 16.0
// (Oniguruma) and, for char::is_numeric, 17.0 (Rust's standard library); Go 1.26's
// unicode package is Unicode 15.0.0. These tables add what the newer versions made
// letters and numbers, exactly as recorded from the reference in
// testdata/golden/unicode_classes.json (TestUnicodeClasses checks every code point).
var (
	newLetters = &unicode.RangeTable{
		R16: []unicode.Range16{{0x1C89, 0x1C8A, 1}, {0xA7CB, 0xA7CD, 1}, {0xA7DA, 0xA7DC, 1}},
		R32: []unicode.Range32{
			{0x105C0, 0x105F3, 1}, {0x10D4A, 0x10D65, 1}, {0x10D6F, 0x10D85, 1}, {0x10EC2, 0x10EC4, 1},
			{0x11380, 0x11389, 1}, {0x1138B, 0x1138B, 1}, {0x1138E, 0x1138E, 1}, {0x11390, 0x113B5, 1},
			{0x113B7, 0x113B7, 1}, {0x113D1, 0x113D1, 1}, {0x113D3, 0x113D3, 1}, {0x11BC0, 0x11BE0, 1},
			{0x13460, 0x143FA, 1}, {0x16100, 0x1611D, 1}, {0x16D40, 0x16D6C, 1}, {0x18CFF, 0x18CFF, 1},
			{0x1E5D0, 0x1E5ED, 1}, {0x1E5F0, 0x1E5F0, 1}, {0x2EBF0, 0x2EE5D, 1},
		},
	}
	newNumbers = &unicode.RangeTable{R32: []unicode.Range32{
		{0x10D40, 0x10D49, 1}, {0x116D0, 0x116E3, 1}, {0x11BF0, 0x11BF9, 1}, {0x16130, 0x16139, 1},
		{0x16D70, 0x16D79, 1}, {0x1CCF0, 0x1CCF9, 1}, {0x1E5F1, 0x1E5FA, 1},
	}}
	newNumeric = &unicode.RangeTable{R32: []unicode.Range32{
		{0x10D40, 0x10D49, 1}, {0x116D0, 0x116E3, 1}, {0x11BF0, 0x11BF9, 1}, {0x11DE0, 0x11DE9, 1},
		{0x16130, 0x16139, 1}, {0x16D70, 0x16D79, 1}, {0x16FF4, 0x16FF6, 1}, {0x1CCF0, 0x1CCF9, 1},
		{0x1E5F1, 0x1E5FA, 1},
	}}
)

// classTables lists, for each class bit, the tables whose union makes the class.
var classTables = []struct {
	bit    uint8
	tables []*unicode.RangeTable
}{
	{clsL, []*unicode.RangeTable{unicode.L, newLetters}},
	{clsN, []*unicode.RangeTable{unicode.N, newNumbers}},
	{clsS, []*unicode.RangeTable{unicode.White_Space}},
	// Alphabetic is L, Nl and Other_Alphabetic.
	{clsW, []*unicode.RangeTable{unicode.L, unicode.Nl, unicode.Other_Alphabetic, unicode.M,
		unicode.Nd, unicode.Pc, unicode.Join_Control, newLetters, newNumbers}},
	{clsNum, []*unicode.RangeTable{unicode.N, newNumeric}},
}

// bmpClass holds the class bits of every BMP code point. It is filled once by init
// from the range tables and only read afterwards.
var bmpClass [0x10000]uint8

func init() {
	for _, ct := range classTables {
		for _, t := range ct.tables {
			for _, r := range t.R16 {
				for c := uint32(r.Lo); c <= uint32(r.Hi); c += uint32(r.Stride) {
					bmpClass[c] |= ct.bit
				}
			}
		}
	}
}

// charClass returns the class bits of r.
func charClass(r rune) uint8 {
	if r < 0x10000 {
		if r < 0 {
			return 0
		}
		return bmpClass[r]
	}
	var c uint8
	for _, ct := range classTables {
		for _, t := range ct.tables {
			if unicode.Is(t, r) {
				c |= ct.bit
				break
			}
		}
	}
	return c
}

// isNumeric is Rust's char::is_numeric, the Digits pre-tokenizer's test.
func isNumeric(r rune) bool { return charClass(r)&clsNum != 0 }

// runeAt decodes the rune at s[i:] (s is valid UTF-8) with an ASCII fast path.
func runeAt(s string, i int) (rune, int) {
	if c := s[i]; c < utf8.RuneSelf {
		return rune(c), 1
	}
	return utf8.DecodeRuneInString(s[i:])
}

// span is a byte range [start, end) of a string.
type span struct{ start, end int }

// matcher finds the matches of a Split or Replace pattern in s: non-overlapping, in
// order, with Oniguruma's find_iter semantics for empty matches (an empty match right
// after the previous match is skipped).
type matcher interface {
	find(s string, out []span, st *encScratch) []span
}

// knownMatcher returns the hand-written scanner for pattern, if there is one.
func knownMatcher(pattern string) (matcher, bool) {
	switch pattern {
	case gpt2Pattern:
		return gpt2Matcher{}, true
	case llama3Pattern:
		return llama3Matcher{maxDigits: 3}, true
	case qwen2Pattern:
		return llama3Matcher{maxDigits: 1}, true
	}
	return nil, false
}

// compileMatcher returns a matcher for a Split/Replace Regex pattern.
func compileMatcher(pattern string) (matcher, error) {
	if m, ok := knownMatcher(pattern); ok {
		return m, nil
	}
	re, err := regexp2.Compile(pattern, regexp2.None)
	if err != nil {
		return nil, &UnsupportedError{Component: fmt.Sprintf("regex %q (regexp2: %v)", pattern, err)}
	}
	return regexp2Matcher{re: re}, nil
}

// gpt2Matcher scans with gpt2Pattern.
type gpt2Matcher struct{}

func (gpt2Matcher) find(s string, out []span, _ *encScratch) []span {
	return scanGPT2(s, out)
}

// llama3Matcher scans with llama3Pattern (maxDigits 3) or qwen2Pattern (maxDigits 1).
type llama3Matcher struct{ maxDigits int }

func (m llama3Matcher) find(s string, out []span, _ *encScratch) []span {
	return scanLlama3(s, m.maxDigits, out)
}

// isPunct reports whether class bits describe [^\s\p{L}\p{N}].
func isPunct(c uint8) bool { return c&(clsL|clsN|clsS) == 0 }

// scanWhitespace handles the `\s+(?!\S)|\s+` tail shared by both patterns for a
// whitespace run starting at i: the whole run if it ends the text or is one character
// long, otherwise the run minus its last character (which then prefixes the next word).
func scanWhitespace(s string, i int) int {
	j := i
	last := i
	for j < len(s) {
		r, n := runeAt(s, j)
		if charClass(r)&clsS == 0 {
			break
		}
		last = j
		j += n
	}
	if j == len(s) || last == i {
		return j
	}
	return last
}

// scanRun returns the end of the run of characters with class bits matching want
// (any bit) starting at i.
func scanRun(s string, i int, want uint8) int {
	for i < len(s) {
		r, n := runeAt(s, i)
		if charClass(r)&want == 0 {
			break
		}
		i += n
	}
	return i
}

// scanPunctRun returns the end of the [^\s\p{L}\p{N}]+ run starting at i (i if none).
func scanPunctRun(s string, i int) int {
	for i < len(s) {
		r, n := runeAt(s, i)
		if !isPunct(charClass(r)) {
			break
		}
		i += n
	}
	return i
}

// contraction returns the end of 's|'t|'re|'ve|'m|'ll|'d at s[i] (an apostrophe), or -1.
// With fold, letters match case-insensitively (Oniguruma's (?i:...) with Unicode case
// folding, under which U+017F LATIN SMALL LETTER LONG S folds to s).
func contraction(s string, i int, fold bool) int {
	j := i + 1
	if j >= len(s) {
		return -1
	}
	lower := func(k int) (byte, int) {
		c := s[k]
		if c < utf8.RuneSelf {
			if fold && 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			}
			return c, 1
		}
		if fold && strings.HasPrefix(s[k:], "\u017f") {
			return 's', 2
		}
		return 0, 1
	}
	c, n := lower(j)
	switch c {
	case 's', 't', 'm', 'd':
		return j + n
	case 'r', 'v', 'l':
		if j+n >= len(s) {
			return -1
		}
		c2, n2 := lower(j + n)
		want := byte('e')
		if c == 'l' {
			want = 'l'
		}
		if c2 == want {
			return j + n + n2
		}
	}
	return -1
}

// scanGPT2 appends the matches of gpt2Pattern in s to out.
func scanGPT2(s string, out []span) []span {
	for i := 0; i < len(s); {
		r, _ := runeAt(s, i)
		end := -1
		if r == '\'' {
			end = contraction(s, i, false)
		}
		if end < 0 {
			c := charClass(r)
			j := i // start of the class run (after an optional leading space)
			if r == ' ' && i+1 < len(s) {
				r2, _ := runeAt(s, i+1)
				c2 := charClass(r2)
				if c2&(clsL|clsN) != 0 || isPunct(c2) {
					j, c = i+1, c2
				}
			}
			switch {
			case c&clsL != 0:
				end = scanRun(s, j, clsL)
			case c&clsN != 0:
				end = scanRun(s, j, clsN)
			case isPunct(c):
				end = scanPunctRun(s, j)
			default: // whitespace
				end = scanWhitespace(s, i)
			}
		}
		out = append(out, span{i, end})
		i = end
	}
	return out
}

// scanLlama3 appends the matches of llama3Pattern (maxDigits 3) or qwen2Pattern
// (maxDigits 1) in s to out.
func scanLlama3(s string, maxDigits int, out []span) []span {
	for i := 0; i < len(s); {
		r, n := runeAt(s, i)
		c := charClass(r)
		end := -1
		// (?i:'s|'t|'re|'ve|'m|'ll|'d)
		if r == '\'' {
			end = contraction(s, i, true)
		}
		// [^\r\n\p{L}\p{N}]?\p{L}+
		if end < 0 {
			if c&clsL != 0 {
				end = scanRun(s, i+n, clsL)
			} else if r != '\r' && r != '\n' && c&clsN == 0 && i+n < len(s) {
				r2, n2 := runeAt(s, i+n)
				if charClass(r2)&clsL != 0 {
					end = scanRun(s, i+n+n2, clsL)
				}
			}
		}
		// \p{N}{1,maxDigits}
		if end < 0 && c&clsN != 0 {
			end = i + n
			for k := 1; k < maxDigits && end < len(s); k++ {
				r2, n2 := runeAt(s, end)
				if charClass(r2)&clsN == 0 {
					break
				}
				end += n2
			}
		}
		// ` ?[^\s\p{L}\p{N}]+[\r\n]*`
		if end < 0 {
			j := i
			if r == ' ' {
				j = i + 1
			}
			if k := scanPunctRun(s, j); k > j {
				for k < len(s) && (s[k] == '\r' || s[k] == '\n') {
					k++
				}
				end = k
			}
		}
		// \s*[\r\n]+|\s+(?!\S)|\s+
		if end < 0 {
			j := scanRun(s, i, clsS)
			if k := strings.LastIndexAny(s[i:j], "\r\n"); k >= 0 {
				end = i + k + 1
			} else {
				end = scanWhitespace(s, i)
			}
		}
		out = append(out, span{i, end})
		i = end
	}
	return out
}

// literalMatcher finds a non-empty literal string (Split/Replace String patterns).
type literalMatcher struct{ lit string }

func (m literalMatcher) find(s string, out []span, _ *encScratch) []span {
	off := 0
	for {
		k := strings.Index(s[off:], m.lit)
		if k < 0 {
			return out
		}
		out = append(out, span{off + k, off + k + len(m.lit)})
		off += k + len(m.lit)
	}
}

// runeMatcher matches every single character for which pred holds (the char-predicate
// patterns of Digits and Metaspace).
type runeMatcher struct{ pred func(rune) bool }

func (m runeMatcher) find(s string, out []span, _ *encScratch) []span {
	for i := 0; i < len(s); {
		r, n := runeAt(s, i)
		if m.pred(r) {
			out = append(out, span{i, i + n})
		}
		i += n
	}
	return out
}

// regexp2Matcher runs a general pattern with regexp2, iterating like the onig crate's
// find_iter.
type regexp2Matcher struct{ re *regexp2.Regexp }

func (m regexp2Matcher) find(s string, out []span, st *encScratch) []span {
	if s == "" {
		return out
	}
	var runes []rune
	var offs []int
	if st != nil {
		runes, offs = st.runes[:0], st.runeOffs[:0]
	}
	for i, r := range s {
		runes = append(runes, r)
		offs = append(offs, i)
	}
	offs = append(offs, len(s))
	if st != nil {
		st.runes, st.runeOffs = runes, offs
	}
	lastEnd, lastMatchEnd := 0, -1
	for lastEnd <= len(runes) {
		mt, err := m.re.FindRunesMatchStartingAt(runes, lastEnd)
		if err != nil || mt == nil {
			break
		}
		a, b := mt.Index, mt.Index+mt.Length
		if a == b && lastMatchEnd == b {
			lastEnd++
			continue
		}
		lastEnd, lastMatchEnd = b, b
		out = append(out, span{offs[a], offs[b]})
	}
	return out
}
