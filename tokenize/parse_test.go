package tokenize

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// TestJSONReaderStrings compares the reader's strings with encoding/json's.
func TestJSONReaderStrings(t *testing.T) {
	for _, lit := range []string{
		`""`, `"a"`, `"Ġthe"`, `"\u0120the"`, `"a\"b\\c\/d"`, `"\b\f\n\r\t"`, `"\ud83d\ude00"`,
		`"日本語"`, `"<0x0A>"`, `"x\u0000y"`, `"\u00e9\u0301"`,
	} {
		var want string
		if err := json.Unmarshal([]byte(lit), &want); err != nil {
			t.Fatalf("%s: %v", lit, err)
		}
		r := jsonReader{data: []byte(lit)}
		got, err := r.str()
		if err != nil || got != want || r.end() != nil {
			t.Errorf("str(%s) = %q, %v; want %q", lit, got, err, want)
		}
		r = jsonReader{data: []byte(lit)}
		if err := r.skip(0); err != nil || r.end() != nil {
			t.Errorf("skip(%s): %v", lit, err)
		}
	}
	// Rejected (serde_json rejects them too).
	for _, lit := range []string{`"\ud83d"`, `"\ude00x"`, "\"\xff\"", "\"a\nb\"", `"\x"`, `"\u12"`, `"abc`, `abc`} {
		r := jsonReader{data: []byte(lit)}
		if _, err := r.str(); err == nil {
			t.Errorf("str(%s) succeeded", lit)
		}
	}
}

// TestJSONReaderValidity compares skip with json.Valid.
func TestJSONReaderValidity(t *testing.T) {
	for _, doc := range []string{
		`null`, `true`, `false`, `0`, `-0`, `1.5e-3`, `-12E+2`, `[]`, `{}`, `[1, "a", {"b": [null]}]`,
		` { "a" : 1 , "b" : [ 2 , 3 ] } `, `01`, `1.`, `.5`, `-`, `1e`, `[1,]`, `{"a":1,}`, `{"a" 1}`,
		`[1 2]`, `{1: 2}`, `nul`, `tru`, `"a" "b"`, `[`, `{"a":`, strings.Repeat("[", 2000) + strings.Repeat("]", 2000),
	} {
		r := jsonReader{data: []byte(doc)}
		err := r.skip(0)
		if err == nil {
			err = r.end()
		}
		valid := json.Valid([]byte(doc)) && !strings.HasPrefix(doc, "[[[[")
		if (err == nil) != valid {
			t.Errorf("skip(%.40s) error = %v, json.Valid = %v", doc, err, json.Valid([]byte(doc)))
		}
	}
}

// TestParseModelVariants covers model layouts: merges as pairs, merges before vocab,
// escapes in tokens, ids that must be integers.
func TestParseModelVariants(t *testing.T) {
	for _, tc := range []struct {
		name, model string
		ok          bool
	}{
		{"pairs", `{"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": [["a", "b"]]}`, true},
		{"merges first", `{"merges": ["a b"], "vocab": {"a": 0, "b": 1, "ab": 2}, "type": "BPE"}`, true},
		{"escaped", `{"type": "BPE", "vocab": {"\u0061": 0, "b": 1, "a\u0062": 2}, "merges": ["\u0061 b"]}`, true},
		{"no type", `{"vocab": {"a": 0}, "merges": []}`, true},
		{"null merges", `{"type": "BPE", "vocab": {"a": 0}, "merges": null}`, true},
		{"float id", `{"type": "BPE", "vocab": {"a": 1.0}, "merges": []}`, false},
		{"big id", `{"type": "BPE", "vocab": {"a": 4294967295}, "merges": []}`, false},
		{"pair of three", `{"type": "BPE", "vocab": {"a": 0}, "merges": [["a", "a", "a"]]}`, false},
		{"string vocab id", `{"type": "BPE", "vocab": {"a": "0"}, "merges": []}`, false},
		{"prefix after merges", `{"type": "BPE", "vocab": {"a": 0, "##b": 1, "ab": 2}, "merges": ["a ##b"], "continuing_subword_prefix": "##"}`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tk, err := Parse([]byte(`{"model": ` + tc.model + `}`))
			if (err == nil) != tc.ok {
				t.Fatalf("Parse: %v, want ok=%v", err, tc.ok)
			}
			if err != nil {
				var ue *UnsupportedError
				if errors.As(err, &ue) {
					t.Errorf("malformed model reported as unsupported: %v", err)
				}
				return
			}
			if tk.model.merges.n > 0 {
				if v := tk.model.merges.get(tk.model.vocab["a"], tk.model.vocab["b"]); v == noMerge && tc.name != "prefix after merges" {
					t.Errorf("merge a+b missing")
				}
			}
		})
	}
}
