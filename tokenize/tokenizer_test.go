package tokenize

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kvgate/kvgate/internal/fixture"
)

// realFamilies are the real tokenizers (see internal/fixture), with a golden
// file each.
var realFamilies = []string{"llama3", "qwen2.5", "qwen3", "llama2", "phi3", "phi2"}

const goldenDir = "testdata/golden"

var (
	realMu    sync.Mutex
	realCache = map[string]*Tokenizer{}
)

// loadReal loads (once per test binary) a real tokenizer, skipping the test when it
// is absent (see fixture.Family).
func loadReal(t testing.TB, name string) *Tokenizer {
	t.Helper()
	dir := fixture.Family(t, name)
	realMu.Lock()
	defer realMu.Unlock()
	if tk, ok := realCache[name]; ok {
		return tk
	}
	tk, err := Load(dir)
	if err != nil {
		t.Fatalf("Load(%s): %v", name, err)
	}
	realCache[name] = tk
	return tk
}

type goldenFile struct {
	Name string `json:"name"`
	Wrap struct {
		Prefix []uint32 `json:"prefix"`
		Suffix []uint32 `json:"suffix"`
	} `json:"wrap"`
	Cases []struct {
		I       int      `json:"i"`
		IDs     []uint32 `json:"ids"`
		Special []uint32 `json:"special"`
	} `json:"cases"`
}

func readJSON(t testing.TB, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func goldenTexts(t testing.TB) []string {
	var texts []string
	readJSON(t, filepath.Join(goldenDir, "texts.json"), &texts)
	return texts
}

// fixturePipeline is one synthetic tokenizer of fixtures/pipelines.json.
type fixturePipeline struct {
	Name          string          `json:"name"`
	Model         string          `json:"model"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	PostProcessor json.RawMessage `json:"post_processor"`
	AddedTokens   json.RawMessage `json:"added_tokens"`
}

func fixturePipelines(t testing.TB) []fixturePipeline {
	var ps []fixturePipeline
	readJSON(t, filepath.Join(goldenDir, "fixtures", "pipelines.json"), &ps)
	return ps
}

// assembleFixture builds the tokenizer.json of a fixture as gen.js does.
func assembleFixture(t testing.TB, p fixturePipeline) []byte {
	t.Helper()
	model, err := os.ReadFile(filepath.Join(goldenDir, "fixtures", "model_"+p.Model+".json"))
	if err != nil {
		t.Fatal(err)
	}
	orNull := func(r json.RawMessage) json.RawMessage {
		if len(r) == 0 {
			return json.RawMessage("null")
		}
		return r
	}
	doc := map[string]json.RawMessage{
		"version":        json.RawMessage(`"1.0"`),
		"truncation":     json.RawMessage("null"),
		"padding":        json.RawMessage("null"),
		"added_tokens":   orNull(p.AddedTokens),
		"normalizer":     orNull(p.Normalizer),
		"pre_tokenizer":  orNull(p.PreTokenizer),
		"post_processor": orNull(p.PostProcessor),
		"decoder":        json.RawMessage("null"),
		"model":          model,
	}
	data, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// checkGolden compares every case of a golden file, with and without special tokens.
func checkGolden(t *testing.T, tk *Tokenizer, texts []string, g *goldenFile) (n int) {
	t.Helper()
	var dst []uint32
	for _, c := range g.Cases {
		text := texts[c.I]
		got, err := tk.Encode(text, false)
		if err != nil {
			t.Errorf("%s: Encode(%q, false): %v", g.Name, short(text), err)
			continue
		}
		if !slices.Equal(got, c.IDs) {
			t.Errorf("%s: Encode(%q, false)\n got %v\nwant %v", g.Name, short(text), got, c.IDs)
		}
		want := c.Special
		if want == nil {
			want = slices.Concat(g.Wrap.Prefix, c.IDs, g.Wrap.Suffix)
		}
		// AppendEncode onto a non-empty dst must leave the prefix alone.
		dst = append(dst[:0], 7, 7)
		dst, err = tk.AppendEncode(dst, text, true)
		if err != nil {
			t.Errorf("%s: AppendEncode(%q, true): %v", g.Name, short(text), err)
			continue
		}
		if !slices.Equal(dst[:2], []uint32{7, 7}) || !slices.Equal(dst[2:], want) {
			t.Errorf("%s: AppendEncode(%q, true)\n got %v\nwant [7 7] + %v", g.Name, short(text), dst, want)
		}
		n++
	}
	return n
}

func short(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

func TestGoldenReal(t *testing.T) {
	texts := goldenTexts(t)
	for _, name := range realFamilies {
		t.Run(name, func(t *testing.T) {
			tk := loadReal(t, name)
			var g goldenFile
			readJSON(t, filepath.Join(goldenDir, name+".json"), &g)
			if n := checkGolden(t, tk, texts, &g); n != len(texts) {
				t.Errorf("checked %d of %d texts", n, len(texts))
			}
		})
	}
}

func TestGoldenFixtures(t *testing.T) {
	texts := goldenTexts(t)
	ps := fixturePipelines(t)
	if len(ps) < 20 {
		t.Fatalf("only %d fixtures", len(ps))
	}
	for _, p := range ps {
		t.Run(p.Name, func(t *testing.T) {
			tk, err := Parse(assembleFixture(t, p))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			var g goldenFile
			readJSON(t, filepath.Join(goldenDir, "fixture_"+p.Name+".json"), &g)
			if n := checkGolden(t, tk, texts, &g); n == 0 {
				t.Error("no case checked")
			}
		})
	}
}

// TestGoldenCoverage makes sure every golden file on disk is checked by a test.
func TestGoldenCoverage(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(goldenDir, "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"texts.json": true, "unicode_classes.json": true}
	for _, n := range realFamilies {
		want[n+".json"] = true
	}
	for _, p := range fixturePipelines(t) {
		want["fixture_"+p.Name+".json"] = true
	}
	for _, f := range files {
		if !want[filepath.Base(f)] {
			t.Errorf("golden file %s is not checked by any test", f)
		}
	}
}

func TestUnsupported(t *testing.T) {
	base := func(over map[string]string) []byte {
		doc := map[string]string{
			"added_tokens":   `[]`,
			"normalizer":     `null`,
			"pre_tokenizer":  `null`,
			"post_processor": `null`,
			"model":          `{"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}`,
		}
		for k, v := range over {
			doc[k] = v
		}
		var b strings.Builder
		b.WriteString("{")
		first := true
		for k, v := range doc {
			if !first {
				b.WriteString(",")
			}
			first = false
			fmt.Fprintf(&b, "%q: %s", k, v)
		}
		b.WriteString("}")
		return []byte(b.String())
	}
	tests := []struct {
		name      string
		over      map[string]string
		component string
	}{
		{"wordpiece", map[string]string{"model": `{"type": "WordPiece", "vocab": {}}`}, `model type "WordPiece"`},
		{"unigram", map[string]string{"model": `{"type": "Unigram", "vocab": []}`}, `model type "Unigram"`},
		{"dropout", map[string]string{"model": `{"type": "BPE", "dropout": 0.1, "vocab": {}, "merges": []}`}, "BPE dropout 0.1"},
		{"whitespace", map[string]string{"pre_tokenizer": `{"type": "Whitespace"}`}, `pre_tokenizer "Whitespace"`},
		{"nested", map[string]string{"pre_tokenizer": `{"type": "Sequence", "pretokenizers": [{"type": "Punctuation"}]}`}, `pre_tokenizer "Punctuation"`},
		{"bert normalizer", map[string]string{"normalizer": `{"type": "BertNormalizer"}`}, `normalizer "BertNormalizer"`},
		{"precompiled", map[string]string{"normalizer": `{"type": "Sequence", "normalizers": [{"type": "Precompiled", "precompiled_charsmap": ""}]}`}, `normalizer "Precompiled"`},
		{"post", map[string]string{"post_processor": `{"type": "Weird"}`}, `post_processor "Weird"`},
		{"bad regex", map[string]string{"pre_tokenizer": `{"type": "Split", "pattern": {"Regex": "(?<=a"}, "behavior": "Isolated", "invert": false}`}, "regex"},
		{"empty string pattern", map[string]string{"pre_tokenizer": `{"type": "Split", "pattern": {"String": ""}, "behavior": "Isolated", "invert": false}`}, "empty String pattern"},
		{"template $B", map[string]string{"post_processor": `{"type": "TemplateProcessing", "single": [{"Sequence": {"id": "B", "type_id": 0}}], "pair": [], "special_tokens": {}}`}, "$B"},
		{"empty normalized added token", map[string]string{
			"normalizer":   `{"type": "Strip", "strip_left": true, "strip_right": true}`,
			"added_tokens": `[{"id": 3, "content": "  ", "normalized": true}]`,
		}, "normalizes to an empty string"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(base(tc.over))
			var ue *UnsupportedError
			if !errors.As(err, &ue) {
				t.Fatalf("Parse: err = %v, want an UnsupportedError", err)
			}
			if !strings.Contains(ue.Component, tc.component) {
				t.Errorf("Component = %q, want it to contain %q", ue.Component, tc.component)
			}
			if !strings.HasPrefix(err.Error(), "tokenizer.json: ") {
				t.Errorf("error %q lacks the tokenizer.json context", err)
			}
		})
	}
	// The base document itself is fine.
	if _, err := Parse(base(nil)); err != nil {
		t.Fatalf("base: %v", err)
	}
}

func TestParseErrors(t *testing.T) {
	for _, doc := range []string{
		``,
		`[]`,
		`{"model": null}`,
		`{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}}`,
		`{"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": ["a b"]}}`,
		`{"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": ["a b c"]}}`,
		`{"model": {"type": "BPE", "vocab": {"a": -1}, "merges": []}}`,
		`{"model": {"type": "BPE", "vocab": {}, "merges": []}, "pre_tokenizer": {"type": "Split", "pattern": {}, "behavior": "Isolated"}}`,
		`{"model": {"type": "BPE", "vocab": {}, "merges": []}, "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>"}}], "special_tokens": {}}}`,
	} {
		if _, err := Parse([]byte(doc)); err == nil {
			t.Errorf("Parse(%s) succeeded, want an error", doc)
		}
	}
}

func TestAPI(t *testing.T) {
	tk := loadReal(t, "llama3")
	if got := tk.VocabSize(); got != 128256 {
		t.Errorf("VocabSize = %d, want 128256", got)
	}
	for tok, want := range map[string]uint32{"<|begin_of_text|>": 128000, "<|eot_id|>": 128009, "Hello": 9906, "Ġworld": 1917} {
		if id, ok := tk.TokenID(tok); !ok || id != want {
			t.Errorf("TokenID(%q) = %d, %v; want %d", tok, id, ok, want)
		}
	}
	if _, ok := tk.TokenID("no such token"); ok {
		t.Error("TokenID found a missing token")
	}
	got, err := tk.Encode("<|begin_of_text|>Hello, world!<|end_of_text|>", true)
	if want := []uint32{128000, 128000, 9906, 11, 1917, 0, 128001}; err != nil || !slices.Equal(got, want) {
		t.Errorf("Encode = %v, %v; want %v", got, err, want)
	}
	if _, err := tk.Encode("bad \xff utf-8", false); err == nil {
		t.Error("Encode accepted invalid UTF-8")
	}
	dst := []uint32{1, 2, 3}
	if out, err := tk.AppendEncode(dst, "bad \xff", false); err == nil || !slices.Equal(out, dst) {
		t.Errorf("AppendEncode on error = %v, %v; want dst unchanged and an error", out, err)
	}
	if _, err := Load("testdata/no-such-dir"); err == nil {
		t.Error("Load of a missing directory succeeded")
	}
}

// TestConcurrentEncode encodes the golden texts from many goroutines at once on one
// Tokenizer (shared cache and pool) and compares with sequential results; run with
// -race.
func TestConcurrentEncode(t *testing.T) {
	texts := goldenTexts(t)
	for _, name := range []string{"llama3", "llama2"} {
		t.Run(name, func(t *testing.T) {
			tk := loadReal(t, name)
			want := make([][]uint32, len(texts))
			for i, s := range texts {
				var err error
				if want[i], err = tk.Encode(s, true); err != nil {
					t.Fatal(err)
				}
			}
			var wg sync.WaitGroup
			errs := make(chan string, 8)
			for g := 0; g < 8; g++ {
				wg.Add(1)
				go func(g int) {
					defer wg.Done()
					var buf []uint32
					for k := 0; k < 3; k++ {
						for j := range texts {
							i := (j*7 + g + k) % len(texts)
							var err error
							buf, err = tk.AppendEncode(buf[:0], texts[i], true)
							if err != nil || !slices.Equal(buf, want[i]) {
								errs <- fmt.Sprintf("goroutine %d text %d: got %v (%v)", g, i, buf, err)
								return
							}
						}
					}
				}(g)
			}
			wg.Wait()
			close(errs)
			for e := range errs {
				t.Error(e)
			}
		})
	}
}

// BenchmarkEncode encodes the golden texts (about 9 kB, the long mixed text included)
// with each real tokenizer, warm cache, one goroutine.
func BenchmarkEncode(b *testing.B) {
	texts := goldenTexts(b)
	size := 0
	for _, s := range texts {
		size += len(s)
	}
	for _, name := range realFamilies {
		b.Run(name, func(b *testing.B) {
			tk := loadReal(b, name)
			var dst []uint32
			b.SetBytes(int64(size))
			b.ReportAllocs()
			tokens := 0
			for b.Loop() {
				tokens = 0
				for _, s := range texts {
					dst, _ = tk.AppendEncode(dst[:0], s, false)
					tokens += len(dst)
				}
			}
			b.ReportMetric(float64(tokens)*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
		})
	}
}

// BenchmarkLoad parses each real tokenizer.json (the file read is not timed).
func BenchmarkLoad(b *testing.B) {
	for _, name := range realFamilies {
		b.Run(name, func(b *testing.B) {
			data, _, err := ReadTokenizerJSON(fixture.Family(b, name))
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				if _, err := Parse(data); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
