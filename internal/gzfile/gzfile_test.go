package gzfile

import (
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestOpen(t *testing.T) {
	const text = "{\"hash_ids\": [1, 2]}\n"
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte(text))
	zw.Close()
	dir := t.TempDir()
	for _, tc := range []struct {
		name    string
		data    []byte
		want    string
		wantErr bool
	}{
		{name: "plain.jsonl", data: []byte(text), want: text},
		{name: "gzipped.jsonl.gz", data: gz.Bytes(), want: text},
		{name: "gzip without the suffix.jsonl", data: gz.Bytes(), want: text},
		{name: "not gzip.jsonl.gz", data: []byte(text), wantErr: true},
		{name: "empty.jsonl", data: nil, want: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, tc.name)
			if err := os.WriteFile(path, tc.data, 0o644); err != nil {
				t.Fatal(err)
			}
			r, err := Open(path)
			if tc.wantErr {
				if err == nil || !strings.Contains(err.Error(), path) {
					t.Fatalf("Open = %v, want an error naming %s", err, path)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(r)
			if err != nil || string(got) != tc.want {
				t.Fatalf("read %q, %v; want %q", got, err, tc.want)
			}
			if err := r.Close(); err != nil {
				t.Fatal(err)
			}
		})
	}
	if _, err := Open(filepath.Join(dir, "missing")); !os.IsNotExist(err) {
		t.Fatalf("Open(missing) = %v, want not-exist", err)
	}
}
