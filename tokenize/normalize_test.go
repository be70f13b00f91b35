package tokenize

import (
	"encoding/json"
	"path/filepath"
	"testing"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

var (
	nfc  = norm.NFC
	nfd  = norm.NFD
	nfkc = norm.NFKC
)

// TestLowercase checks the Lowercase normalizer on every character against the
// reference's mapping (testdata/golden/unicode_classes.json, "lower").
func TestLowercase(t *testing.T) {
	var ref struct {
		Lower [][2]json.RawMessage `json:"lower"`
	}
	readJSON(t, filepath.Join(goldenDir, "unicode_classes.json"), &ref)
	want := map[rune]string{}
	for _, e := range ref.Lower {
		var cp rune
		var s string
		if json.Unmarshal(e[0], &cp) != nil || json.Unmarshal(e[1], &s) != nil {
			t.Fatalf("bad entry %s", e)
		}
		want[cp] = s
	}
	if len(want) < 1000 {
		t.Fatalf("only %d mappings recorded", len(want))
	}
	buf := make([]byte, 0, 8)
	bad := 0
	for r := rune(0); r <= unicode.MaxRune; r++ {
		if 0xD800 <= r && r <= 0xDFFF || r == '\n' {
			continue // '\n' separated the reference's batches
		}
		w, ok := want[r]
		if !ok {
			w = string(r)
		}
		buf = utf8.AppendRune(buf[:0], r)
		if got := lowerAppend(nil, string(buf)); string(got) != w {
			if bad++; bad <= 10 {
				t.Errorf("lower(U+%04X) = %q, reference %q", r, got, w)
			}
		}
	}
}

// TestNormUnknown checks normUnknown against the characters the reference's
// normalizers were recorded not to know.
func TestNormUnknown(t *testing.T) {
	var ref struct {
		NormUnknown [][2]rune `json:"norm_unknown"`
	}
	readJSON(t, filepath.Join(goldenDir, "unicode_classes.json"), &ref)
	if len(ref.NormUnknown) < 20 {
		t.Fatalf("only %d ranges recorded", len(ref.NormUnknown))
	}
	want := map[rune]bool{}
	for _, rg := range ref.NormUnknown {
		for c := rg[0]; c <= rg[1]; c++ {
			want[c] = true
		}
	}
	for r := rune(0); r <= unicode.MaxRune; r++ {
		if got := unicode.Is(normUnknown, r); got != want[r] {
			t.Errorf("U+%04X: in normUnknown %v, recorded %v", r, got, want[r])
		}
	}
	// Such a character is kept, and splits the text for the normalizer.
	st := &encScratch{}
	for _, tc := range []struct {
		form       string
		in, want   string
		normalizer normalizer
	}{
		{"NFKC", "x\u32ffy\ufb01", "x\u32ffyfi", formNormalizer{nfkc}},
		{"NFC", "\U00011935\U00011930e\u0301", "\U00011935\U00011930\u00e9", formNormalizer{nfc}},
		{"NFD", "a\u0301\u1df6\u0316", "a\u0301\u1df6\u0316", formNormalizer{nfd}},
	} {
		if got := tc.normalizer.normalize(st, piece{s: tc.in}).s; got != tc.want {
			t.Errorf("%s(%+q) = %+q, want %+q", tc.form, tc.in, got, tc.want)
		}
	}
}

// TestFormNormalizerBoundary: normalizing a piece must not touch the text already in
// the arena (earlier pieces), even when the piece starts with a combining mark.
func TestFormNormalizerBoundary(t *testing.T) {
	st := &encScratch{arena: []byte("e")}
	got := formNormalizer{nfkc}.normalize(st, piece{s: "\u0301\ufb01"})
	if got.s != "\u0301fi" || string(st.arena[:1]) != "e" {
		t.Errorf("got %+q, arena %+q", got.s, st.arena)
	}
}
