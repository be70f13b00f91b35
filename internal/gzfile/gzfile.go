// Package gzfile opens data files that may be gzipped, such as the traces
// shipped in data/, so that readers take either form. It owns nothing else.
package gzfile

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"strings"
)

// magic starts every gzip stream.
var magic = []byte{0x1f, 0x8b}

// Open opens path for reading, decompressed when it is gzip: when its name
// ends in .gz (then it must be gzip) or its content starts as gzip does.
// Errors name the path.
func Open(path string) (io.ReadCloser, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	r, err := Decompress(f, strings.HasSuffix(path, ".gz"))
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return readCloser{r, f}, nil
}

// Decompress returns r decompressed when it starts as gzip does, or when gz
// is set (then it must be gzip); else r itself, buffered.
func Decompress(r io.Reader, gz bool) (io.Reader, error) {
	br := bufio.NewReader(r)
	if head, _ := br.Peek(len(magic)); !gz && !bytes.Equal(head, magic) {
		return br, nil
	}
	return gzip.NewReader(br)
}

type readCloser struct {
	io.Reader
	io.Closer
}
