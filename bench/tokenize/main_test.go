package main

import (
	"bytes"
	"os"
	"path/filepath"
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
	for _, f := range []string{"a", "b", "c"} {
		if err := os.MkdirAll(filepath.Join(dir, f), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"a", "c"} {
		if err := os.WriteFile(filepath.Join(dir, f, "tokenizer.json"), []byte("{}"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := listFamilies(dir, "")
	if err != nil || strings.Join(got, ",") != "a,c" {
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
