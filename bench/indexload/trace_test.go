package main

import (
	"bytes"
	"compress/gzip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestReadTraceFiles: a gzipped trace reads as the plain one does (by its
// magic bytes, whatever its name); a .gz name that is not gzip, and a
// truncated stream, fail naming the file; the default -trace, shipped in
// the repository, reads whole.
func TestReadTraceFiles(t *testing.T) {
	plain := `{"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [0, 1]}

{"timestamp": 1, "input_length": 1536, "output_length": 1, "hash_ids": [0, 1, 2]}
`
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte(plain))
	zw.Close()
	dir := t.TempDir()
	for name, data := range map[string][]byte{"t.jsonl": []byte(plain), "t.jsonl.gz": gz.Bytes(), "gzip-named-plainly.jsonl": gz.Bytes()} {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		reqs, err := readTrace(path)
		if err != nil || len(reqs) != 2 || !slices.Equal(reqs[1].HashIDs, []uint64{0, 1, 2}) {
			t.Errorf("readTrace(%s) = %v, %v; want the 2 requests", name, reqs, err)
		}
	}
	for name, data := range map[string][]byte{"plain.jsonl.gz": []byte(plain), "truncated.jsonl.gz": gz.Bytes()[:gz.Len()-12]} {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := readTrace(path); err == nil || !strings.Contains(err.Error(), path) {
			t.Errorf("readTrace(%s) = %v; want an error naming the file", name, err)
		}
	}

	// The default, relative to the repository root (data/README.md).
	reqs, err := readTrace(filepath.Join("..", "..", defaultTrace))
	if err != nil {
		t.Fatal(err)
	}
	blocks := 0
	for _, r := range reqs {
		blocks += len(r.HashIDs)
	}
	if len(reqs) != 12031 || blocks != 288500 {
		t.Errorf("%s: %d requests, %d blocks; want 12031 and 288500", defaultTrace, len(reqs), blocks)
	}
}
