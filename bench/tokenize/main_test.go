package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any leaves a goroutine running.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestSplitDocs(t *testing.T) {
	text := strings.Repeat("line of text\n", 100) + strings.Repeat("日本語", 500)
	docs := splitDocs(text, 256)
	if strings.Join(docs, "") != text {
		t.Fatal("documents do not add up to the text")
	}
	for i, d := range docs {
		if !utf8.ValidString(d) {
			t.Errorf("document %d is not valid UTF-8", i)
		}
		if len(d) > 256+3 {
			t.Errorf("document %d has %d bytes", i, len(d))
		}
	}
}

func TestListFamilies(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"a", "b", "c", "d"} {
		if err := os.MkdirAll(filepath.Join(dir, f), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"a/tokenizer.json", "c/tokenizer.json", "d/tokenizer.json.gz", "b/tokenizer.json.bz2"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("{}"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := listFamilies(dir, "")
	if err != nil || strings.Join(got, ",") != "a,c,d" {
		t.Errorf("listFamilies = %v, %v", got, err)
	}
	got, err = listFamilies(dir, "c")
	if err != nil || strings.Join(got, ",") != "c" {
		t.Errorf("listFamilies(only c) = %v, %v", got, err)
	}
	if _, err := listFamilies(dir, "b"); err == nil {
		t.Error("a family without tokenizer.json was listed")
	}
}

func TestPrintTable(t *testing.T) {
	var buf bytes.Buffer
	rows := []result{
		{name: "x", load: 12 * time.Millisecond, goBest: 100 * time.Millisecond, tokens: 1000, numDocs: 3,
			ref: &refResult{LoadMs: 50, SeqMs: []float64{900, 800}, BatchMs: []float64{1000}, Tokens: 1000}},
		{name: "y", goBest: time.Second, tokens: 10, refNote: "not run"},
	}
	printTable(&buf, rows, 2_000_000)
	out := buf.String()
	for _, want := range []string{"| x | 20.00 | 0.010 | 2.50 | 0.001 | 8.0x | 12 ms | 50 ms | yes (3 docs, 1000 tokens) |", "| y |", "not run"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

// TestBuildCorpus: the embedded corpus has its sections, every kind of text is in
// any prefix of a few hundred KB, -mb beyond the corpus cycles it, and every
// document is valid UTF-8 that JSON carries to the reference unchanged.
func TestBuildCorpus(t *testing.T) {
	sections, err := readCorpus()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	size := 0
	for _, s := range sections {
		names = append(names, s.name)
		size += len(s.text)
	}
	if got := strings.Join(names, ","); got != "markdown,html,go,config,edge,french,japanese,chinese,korean" {
		t.Errorf("sections %s", got)
	}
	docs, sources, err := buildCorpus(300_000, 4096)
	if err != nil {
		t.Fatal(err)
	}
	joined := strings.Join(docs, "")
	if len(joined) < 300_000 || len(joined) > 300_000+8192 {
		t.Errorf("%d bytes for -mb 0.3", len(joined))
	}
	for _, want := range []string{"<p>", "func ", "kvgate", "apiVersion:", "déjà", "キャッシュ", "缓存", "캐시", "<|im_start|>"} {
		if !strings.Contains(joined, want) {
			t.Errorf("the first 0.3 MB lack %q (%s)", want, strings.Join(sources, ", "))
		}
	}
	for i, d := range docs {
		if !utf8.ValidString(d) {
			t.Fatalf("document %d is not valid UTF-8", i)
		}
		b, _ := json.Marshal(d)
		var back string
		if err := json.Unmarshal(b, &back); err != nil || back != d {
			t.Fatalf("document %d does not survive JSON", i)
		}
	}
	whole, _, err := buildCorpus(size, 4096)
	if err != nil {
		t.Fatal(err)
	}
	if got := len(strings.Join(whole, "")); got != size {
		t.Errorf("the whole corpus: %d bytes, want %d", got, size)
	}
	twice, sources, err := buildCorpus(2*size, 4096)
	if err != nil {
		t.Fatal(err)
	}
	if len(twice) != 2*len(whole) || !slices.Equal(twice[len(whole):], whole) {
		t.Errorf("twice the corpus: %d documents, want the %d of the corpus twice", len(twice), len(whole))
	}
	if !strings.Contains(strings.Join(sources, ", "), "cycled 2.0 times") {
		t.Errorf("sources %q do not say the corpus was cycled", sources)
	}
}

// TestRunShipped runs the benchmark on the tokenizer shipped in data/tokenizers
// (gzipped) over a small corpus, without the reference (no node on PATH).
func TestRunShipped(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	var out bytes.Buffer
	if err := run(&out, filepath.Join("..", "..", "data", "tokenizers"), 0.05, 4096, 1, "", t.TempDir()); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	for _, re := range []string{`(?m)^corpus: \d+ documents, 0\.05 MB \(markdown `, `reference not run: node is not installed`, `(?m)^\| qwen2\.5 \| [0-9.]+ \| [0-9.]+ \| n/a \|`} {
		if !regexp.MustCompile(re).MatchString(out.String()) {
			t.Errorf("output lacks %s:\n%s", re, out.String())
		}
	}
}

func TestDefaultTokenizers(t *testing.T) {
	t.Setenv("KVGATE_TOKENIZERS", "")
	if got := defaultTokenizers(); got != filepath.Join("data", "tokenizers") {
		t.Errorf("without KVGATE_TOKENIZERS: %q", got)
	}
	t.Setenv("KVGATE_TOKENIZERS", "/x/tokenizers")
	if got := defaultTokenizers(); got != "/x/tokenizers" {
		t.Errorf("with KVGATE_TOKENIZERS: %q", got)
	}
}
