package tokenize

import (
	"slices"
	"strings"
	"sync"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/dlclark/regexp2"

	"github.com/kvgate/kvgate/internal/fixture"
)

// FuzzParse: Parse must never panic, and a tokenizer it accepts must encode without
// panicking and within its vocabulary. Seeds: testdata/fuzz/FuzzParse (small
// tokenizer.json documents covering every supported component).
func FuzzParse(f *testing.F) {
	f.Add([]byte(`{"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}}`))
	f.Add([]byte(`{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [["a", "a"]]}, "added_tokens": [{"id": 5, "content": "a"}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		tk, err := Parse(data)
		if err != nil {
			return
		}
		for _, s := range []string{"", "ab a  b\n", "Hello, World! 123 'S <s>", "日本 e\u0301 ſ\t\u00a0"} {
			checkEncode(t, "fuzz", tk, s)
		}
	})
}

type namedTokenizer struct {
	name string
	tk   *Tokenizer
}

// fuzzReal are the real tokenizers fuzzTokenizerSet adds when present (one
// byte-level, one SentencePiece-style).
var fuzzReal = []string{"llama3", "llama2"}

// fuzzTokenizerSet returns the fixtures plus the tokenizers of fuzzReal that are
// present.
func fuzzTokenizerSet(t testing.TB) []namedTokenizer {
	t.Helper()
	var toks []namedTokenizer
	for _, p := range fixturePipelines(t) {
		tk, err := Parse(assembleFixture(t, p))
		if err != nil {
			t.Fatalf("%s: %v", p.Name, err)
		}
		toks = append(toks, namedTokenizer{p.Name, tk})
	}
	for i, dir := range fixture.Optional(t, fuzzReal...) {
		if dir == "" {
			continue
		}
		tk, err := Load(dir)
		if err != nil {
			t.Fatal(err)
		}
		toks = append(toks, namedTokenizer{fuzzReal[i], tk})
	}
	return toks
}

var (
	refOnce     sync.Once
	refMatchers []regexp2Matcher
)

// FuzzEncode: on every fixture (and real tokenizers when present), encoding arbitrary
// text must not panic and must satisfy the invariants of checkEncode; the hand-written
// Split scanners must agree with regexp2 on the text; segmenting long words must not
// change the merges.
func FuzzEncode(f *testing.F) {
	for _, s := range goldenTexts(f) {
		f.Add(s)
	}
	toks := fuzzTokenizerSet(f)
	f.Fuzz(func(t *testing.T, text string) {
		for _, nt := range toks {
			checkEncode(t, nt.name, nt.tk, text)
		}
		if !utf8.ValidString(text) {
			return
		}
		refOnce.Do(func() {
			for _, sc := range scannerCases {
				refMatchers = append(refMatchers, regexp2Matcher{re: regexp2.MustCompile(sc.pattern, regexp2.None)})
			}
		})
		st := &encScratch{}
		for i, sc := range scannerCases {
			if sc.name != "gpt2" && strings.Contains(text, "ſ") {
				continue // Oniguruma folds ſ to s; see TestLongSContraction
			}
			if hasPost15Unicode(text) {
				continue // regexp2 classifies with Go's Unicode 15.0 tables
			}
			got := sc.m.find(text, nil, st)
			want := refMatchers[i].find(text, nil, st)
			if !slices.Equal(got, want) {
				t.Fatalf("%s scanner on %q:\n got %q\nwant %q", sc.name, text, pieces(text, got), pieces(text, want))
			}
		}
		for _, nt := range toks {
			m := nt.tk.model
			if m.cross == nil || text == "" {
				continue
			}
			var syms []uint32
			if m.byteMode {
				for i := 0; i < len(text); i++ {
					syms = append(syms, m.byteIDs[text[i]])
				}
			} else {
				var err error
				if syms, err = m.charSymbols(nil, text, st); err != nil {
					continue
				}
			}
			whole := m.mergeHeap(syms, st)
			seg, err := m.encodeSegments(nil, text, st)
			if err != nil || !slices.Equal(seg, whole) {
				t.Fatalf("%s: segmented %v (%v), whole %v", nt.name, seg, err, whole)
			}
		}
	})
}

// checkEncode checks the invariants of one encoding: no error for valid UTF-8 (an error
// for invalid), ids below VocabSize, AppendEncode consistent with Encode, the same
// result twice, and special tokens only added around the text.
func checkEncode(t *testing.T, name string, tk *Tokenizer, text string) {
	t.Helper()
	ids, err := tk.Encode(text, false)
	if !utf8.ValidString(text) {
		if err == nil {
			t.Fatalf("%s: Encode accepted invalid UTF-8 %q", name, text)
		}
		return
	}
	if err != nil {
		if strings.Contains(err.Error(), errUnkOutOfVocab.Error()) {
			return // the file's unk token is missing from its vocab, as tokenizers reports
		}
		t.Fatalf("%s: Encode(%q): %v", name, text, err)
	}
	for _, id := range ids {
		if int(id) >= tk.VocabSize() {
			t.Fatalf("%s: Encode(%q) = %v: id %d >= VocabSize %d", name, text, ids, id, tk.VocabSize())
		}
	}
	again, err := tk.AppendEncode([]uint32{42}, text, false)
	if err != nil || again[0] != 42 || !slices.Equal(again[1:], ids) {
		t.Fatalf("%s: AppendEncode(%q) = %v, %v; Encode = %v", name, text, again, err, ids)
	}
	with, err := tk.Encode(text, true)
	if err != nil {
		t.Fatalf("%s: Encode(%q, true): %v", name, text, err)
	}
	if p := &tk.post; p.simple && !slices.Equal(with, slices.Concat(p.prefix, ids, p.suffix)) {
		t.Fatalf("%s: Encode(%q, true) = %v, want %v around %v", name, text, with, p.prefix, ids)
	}
	if text == "" && len(ids) != 0 {
		t.Fatalf("%s: empty text encodes to %v", name, ids)
	}
}

// hasPost15Unicode reports whether s has a letter or number added after Unicode 15.0,
// which the scanners classify like the reference (Unicode 16.0) and regexp2 cannot.
func hasPost15Unicode(s string) bool {
	for _, r := range s {
		if unicode.Is(newLetters, r) || unicode.Is(newNumbers, r) {
			return true
		}
	}
	return false
}
