package msgpack

import (
	"bytes"
	"errors"
	"math"
	"strings"
	"testing"

	vm "github.com/vmihailenco/msgpack/v5"
)

// TestAppendMatchesIndependentEncoder: every Append function writes the
// bytes an independent implementation writes for the same value, and the
// Reader reads them back.
func TestAppendMatchesIndependentEncoder(t *testing.T) {
	ints := []int64{0, 1, 0x7f, 0x80, 0xff, 0x100, 0xffff, 0x10000, math.MaxUint32, math.MaxUint32 + 1, math.MaxInt64,
		-1, -32, -33, -128, -129, -32768, -32769, math.MinInt32, math.MinInt32 - 1, math.MinInt64}
	for _, v := range ints {
		want := compact(t, v)
		if got := AppendInt(nil, v); !bytes.Equal(got, want) {
			t.Errorf("AppendInt(%d) = %x, want %x", v, got, want)
		}
		r := NewReader(AppendInt(nil, v))
		if got, big, err := r.Int(); err != nil || big || got != v || !r.Done() {
			t.Errorf("Int of AppendInt(%d) = %d, %v, %v", v, got, big, err)
		}
	}
	for _, v := range []uint64{0, 0x7f, 0x80, 0xff, 0x100, 0xffff, 0x10000, math.MaxUint32, math.MaxUint32 + 1, math.MaxUint64} {
		want := compact(t, v)
		if got := AppendUint(nil, v); !bytes.Equal(got, want) {
			t.Errorf("AppendUint(%d) = %x, want %x", v, got, want)
		}
		r := NewReader(AppendUint(nil, v))
		if got, err := r.Uint64Bits(); err != nil || got != v || !r.Done() {
			t.Errorf("Uint64Bits of AppendUint(%d) = %d, %v", v, got, err)
		}
	}
	for _, n := range []int{0, 31, 32, 255, 256, 65535, 65536} {
		s := strings.Repeat("x", n)
		want := compact(t, s)
		if got := AppendString(nil, s); !bytes.Equal(got, want) {
			t.Errorf("AppendString(%d bytes) = %x..., want %x...", n, got[:min(len(got), 8)], want[:min(len(want), 8)])
		}
		r := NewReader(AppendString(nil, s))
		if p, err := r.Raw(); err != nil || string(p) != s || !r.Done() {
			t.Errorf("Raw of AppendString(%d bytes): %d bytes, %v", n, len(p), err)
		}
	}
	for _, n := range []int{0, 15, 16, 65535, 65536} {
		var enc bytes.Buffer
		e := vm.NewEncoder(&enc)
		if err := e.EncodeArrayLen(n); err != nil {
			t.Fatal(err)
		}
		if got := AppendArrayHeader(nil, n); !bytes.Equal(got, enc.Bytes()) {
			t.Errorf("AppendArrayHeader(%d) = %x, want %x", n, got, enc.Bytes())
		}
		enc.Reset()
		if err := e.EncodeMapLen(n); err != nil {
			t.Fatal(err)
		}
		if got := AppendMapHeader(nil, n); !bytes.Equal(got, enc.Bytes()) {
			t.Errorf("AppendMapHeader(%d) = %x, want %x", n, got, enc.Bytes())
		}
	}
}

// compact encodes v with the independent encoder in its shortest forms.
func compact(t *testing.T, v any) []byte {
	t.Helper()
	var b bytes.Buffer
	e := vm.NewEncoder(&b)
	e.UseCompactInts(true)
	if err := e.Encode(v); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// TestReaderReadsIndependentEncoder: a document written by an independent
// encoder reads back value by value, and Skip steps over each whole.
func TestReaderReadsIndependentEncoder(t *testing.T) {
	doc := map[string]any{"kind": "add", "hashes": []uint64{1, math.MaxUint64}, "f": 1.5, "nil": nil, "nested": []any{[]any{true, "x"}, map[string]any{"a": -7}}}
	b, err := vm.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	r := NewReader(b)
	n, err := r.MapLen()
	if err != nil || n != len(doc) {
		t.Fatalf("MapLen = %d, %v", n, err)
	}
	for range n {
		k, err := r.Raw()
		if err != nil {
			t.Fatal(err)
		}
		switch string(k) {
		case "kind":
			if v, err := r.Raw(); err != nil || string(v) != "add" {
				t.Errorf("kind = %q, %v", v, err)
			}
		case "hashes":
			if l, err := r.ArrayLen(); err != nil || l != 2 {
				t.Fatalf("hashes: %d, %v", l, err)
			}
			a, _ := r.Uint64Bits()
			c, err := r.Uint64Bits()
			if a != 1 || c != math.MaxUint64 || err != nil {
				t.Errorf("hashes = %d %d, %v", a, c, err)
			}
		case "f":
			if f, err := r.Float(); err != nil || f != 1.5 {
				t.Errorf("f = %v, %v", f, err)
			}
		case "nil":
			if !r.Nil() {
				t.Errorf("nil is %v", r.Peek())
			}
		default:
			if err := r.Skip(); err != nil {
				t.Errorf("skip %s: %v", k, err)
			}
		}
	}
	if !r.Done() || r.Len() != 0 {
		t.Errorf("%d bytes left", r.Len())
	}
}

// TestReaderBounds: lengths beyond the input and nesting beyond
// MaxSkipDepth are errors, never allocations or panics.
func TestReaderBounds(t *testing.T) {
	deep := bytes.Repeat([]byte{0x91}, MaxSkipDepth+2)
	cases := []struct {
		name string
		in   []byte
		read func(*Reader) error
		want error
	}{
		{"str longer than input", []byte{0xdb, 0xff, 0xff, 0xff, 0xff, 'x'}, func(r *Reader) error { _, err := r.Raw(); return err }, ErrTruncated},
		{"array count beyond input", []byte{0xdd, 0x7f, 0xff, 0xff, 0xff, 0x01}, func(r *Reader) error { _, err := r.ArrayLen(); return err }, nil},
		{"map count beyond input", []byte{0xdf, 0x7f, 0xff, 0xff, 0xff}, func(r *Reader) error { _, err := r.MapLen(); return err }, nil},
		{"truncated uint64", []byte{0xcf, 1, 2}, func(r *Reader) error { _, _, err := r.Int(); return err }, ErrTruncated},
		{"nesting too deep", append(deep, 0xc0), (*Reader).Skip, nil},
		{"empty", nil, (*Reader).Skip, ErrTruncated},
		{"wrong type", []byte{0xa1, 'x'}, func(r *Reader) error { _, err := r.ArrayLen(); return err }, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := NewReader(c.in)
			err := c.read(&r)
			if err == nil {
				t.Fatal("no error")
			}
			if c.want != nil && !errors.Is(err, c.want) {
				t.Errorf("error %v, want %v", err, c.want)
			}
		})
	}
}

// FuzzReader: skipping any input ends in an error or consumes exactly the
// bytes of whole values, never panics.
func FuzzReader(f *testing.F) {
	f.Add([]byte{0x92, 0xa1, 'x', 0xcf, 1, 2, 3, 4, 5, 6, 7, 8})
	f.Add(AppendMapHeader(AppendString(nil, "k"), 1))
	f.Fuzz(func(t *testing.T, in []byte) {
		r := NewReader(in)
		for !r.Done() {
			before := r.Len()
			if err := r.Skip(); err != nil {
				return
			}
			if r.Len() >= before {
				t.Fatalf("Skip consumed nothing at %d", len(in)-before)
			}
		}
	})
}
