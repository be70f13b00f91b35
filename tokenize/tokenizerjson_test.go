package tokenize

import (
	"bytes"
	"compress/gzip"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// gzipFile writes data gzipped to path.
func gzipFile(t *testing.T, path string, data []byte) {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestLoadGzip: a directory with tokenizer.json.gz and no tokenizer.json loads,
// through Load and a Registry, and encodes as the plain file does; tokenizer.json
// wins when both exist; errors name the path.
func TestLoadGzip(t *testing.T) {
	plainDir := tinyModel(t)
	raw, err := os.ReadFile(filepath.Join(plainDir, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := os.ReadFile(filepath.Join(plainDir, "tokenizer_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	plain, err := Load(plainDir)
	if err != nil {
		t.Fatal(err)
	}

	gzDir := t.TempDir()
	gzipFile(t, filepath.Join(gzDir, "tokenizer.json.gz"), raw)
	if err := os.WriteFile(filepath.Join(gzDir, "tokenizer_config.json"), cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	data, path, err := ReadTokenizerJSON(gzDir)
	if err != nil || !bytes.Equal(data, raw) || path != filepath.Join(gzDir, "tokenizer.json.gz") {
		t.Fatalf("ReadTokenizerJSON = %d bytes, %q, %v; want the %d bytes of tokenizer.json.gz", len(data), path, err, len(raw))
	}
	tk, err := Load(gzDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"hello world", "<s>hello", "héllo wörld"} {
		want, err1 := plain.Encode(s, true)
		got, err2 := tk.Encode(s, true)
		if err1 != nil || err2 != nil || !slices.Equal(got, want) {
			t.Errorf("Encode(%q) = %v, %v from the .gz; %v, %v from the plain file", s, got, err2, want, err1)
		}
	}
	reg, err := NewRegistry(Config{Models: []ModelConfig{{Name: "m", Tokenizer: gzDir, Fallbacks: []Path{PathLocal}}}}, RegistryOptions{Strict: true})
	if err != nil {
		t.Fatalf("NewRegistry on a directory with tokenizer.json.gz: %v", err)
	}
	res, err := reg.Tokenize(t.Context(), Request{Model: "m", Text: "hello world"})
	if want, _ := plain.Encode("hello world", true); err != nil || !slices.Equal(res.Tokens, want) {
		t.Errorf("Registry.Tokenize = %v, %v; want %v", res.Tokens, err, want)
	}

	// Both: tokenizer.json is read (the .gz here is not even gzip).
	both := t.TempDir()
	if err := os.WriteFile(filepath.Join(both, "tokenizer.json"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(both, "tokenizer.json.gz"), []byte("not gzip"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(both); err != nil {
		t.Errorf("Load with tokenizer.json and a bad tokenizer.json.gz: %v", err)
	}
	if p, err := TokenizerJSONPath(both); err != nil || p != filepath.Join(both, "tokenizer.json") {
		t.Errorf("TokenizerJSONPath = %q, %v; want tokenizer.json", p, err)
	}

	// Errors name the file.
	empty := t.TempDir()
	_, err = Load(empty)
	if err == nil || !errors.Is(err, fs.ErrNotExist) ||
		!strings.Contains(err.Error(), filepath.Join(empty, "tokenizer.json")) || !strings.Contains(err.Error(), filepath.Join(empty, "tokenizer.json.gz")) {
		t.Errorf("Load of a directory with neither file: %v; want a not-exist error naming both paths", err)
	}
	var trunc bytes.Buffer
	zw := gzip.NewWriter(&trunc)
	zw.Write(raw)
	zw.Close()
	var notJSON bytes.Buffer
	zw = gzip.NewWriter(&notJSON)
	zw.Write([]byte(`{"model": `))
	zw.Close()
	for name, content := range map[string][]byte{
		"not gzip":  []byte("{}"),
		"truncated": trunc.Bytes()[:trunc.Len()/2],
		"not json":  notJSON.Bytes(),
	} {
		dir := t.TempDir()
		path := filepath.Join(dir, "tokenizer.json.gz")
		if err := os.WriteFile(path, content, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), path) {
			t.Errorf("%s: Load = %v; want an error naming %s", name, err, path)
		}
	}
}

// TestLoadShipped loads the tokenizer shipped gzipped in data/tokenizers (see
// data/README.md); it is part of the repository, so its absence fails.
func TestLoadShipped(t *testing.T) {
	dir := filepath.Join("..", "data", "tokenizers", "qwen2.5")
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json.gz")); err != nil {
		t.Fatalf("the shipped tokenizer is missing: %v", err)
	}
	tk, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := tk.Encode("Hello, world!", false); err != nil || !slices.Equal(got, []uint32{9707, 11, 1879, 0}) {
		t.Errorf("Encode(Hello, world!) = %v, %v; want [9707 11 1879 0]", got, err)
	}
	if id, ok := tk.TokenID("<|im_start|>"); !ok || id != 151644 {
		t.Errorf("TokenID(<|im_start|>) = %d, %v; want 151644", id, ok)
	}
}
