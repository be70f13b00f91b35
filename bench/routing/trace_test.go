package main

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestReadTrace(t *testing.T) {
	ok := `{"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [0, 1]}
{"timestamp": 1500.5, "input_length": 512, "output_length": 1, "hash_ids": [0]}

{"timestamp": 1500.5, "input_length": 513, "output_length": 2, "hash_ids": [0, 2]}
`
	tests := []struct {
		name    string
		in      string
		want    []Request
		wantErr string
	}{
		{name: "ok", in: ok, want: []Request{
			{Line: 1, At: 0, InputLength: 1000, OutputLength: 5, HashIDs: []uint64{0, 1}},
			{Line: 2, At: 1500500 * time.Microsecond, InputLength: 512, OutputLength: 1, HashIDs: []uint64{0}},
			{Line: 4, At: 1500500 * time.Microsecond, InputLength: 513, OutputLength: 2, HashIDs: []uint64{0, 2}},
		}},
		{name: "times from the first line", in: `{"timestamp": 100, "input_length": 1, "output_length": 1, "hash_ids": [7]}` + "\n" +
			`{"timestamp": 350, "input_length": 1, "output_length": 1, "hash_ids": [7]}`,
			want: []Request{{Line: 1, InputLength: 1, OutputLength: 1, HashIDs: []uint64{7}}, {Line: 2, At: 250 * time.Millisecond, InputLength: 1, OutputLength: 1, HashIDs: []uint64{7}}}},
		{name: "empty", in: "\n", wantErr: "no requests"},
		{name: "not json", in: "{", wantErr: "line 1"},
		{name: "missing field", in: `{"timestamp": 0, "input_length": 10, "hash_ids": [1]}`, wantErr: "line 1: want timestamp"},
		{name: "backwards", in: `{"timestamp": 5, "input_length": 1, "output_length": 1, "hash_ids": [1]}` + "\n" +
			`{"timestamp": 4, "input_length": 1, "output_length": 1, "hash_ids": [1]}`, wantErr: "line 2: timestamp 4 before"},
		{name: "negative time", in: `{"timestamp": -1, "input_length": 1, "output_length": 1, "hash_ids": [1]}`, wantErr: "must be >= 0"},
		{name: "too few ids", in: `{"timestamp": 0, "input_length": 513, "output_length": 1, "hash_ids": [1]}`, wantErr: "needs 2 blocks of 512 tokens, hash_ids has 1"},
		{name: "too many ids", in: `{"timestamp": 0, "input_length": 512, "output_length": 1, "hash_ids": [1, 2]}`, wantErr: "needs 1 blocks"},
		{name: "no output", in: `{"timestamp": 0, "input_length": 5, "output_length": 0, "hash_ids": [1]}`, wantErr: "must be >= 1"},
		{name: "negative id", in: `{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [-1]}`, wantErr: "line 1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ReadTrace(strings.NewReader(tc.in), 512)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.EqualFunc(got, tc.want, func(a, b Request) bool {
				return a.Line == b.Line && a.At == b.At && a.InputLength == b.InputLength && a.OutputLength == b.OutputLength && slices.Equal(a.HashIDs, b.HashIDs)
			}) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
	if _, err := ReadTrace(strings.NewReader(ok), 0); err == nil {
		t.Error("tokens per hash 0: no error")
	}
}

func TestWindow(t *testing.T) {
	var reqs []Request
	for i := range 10 {
		reqs = append(reqs, Request{Line: i + 1, At: time.Duration(i) * time.Second})
	}
	lines := func(rs []Request) (out []int) {
		for _, r := range rs {
			out = append(out, r.Line)
		}
		return out
	}
	tests := []struct {
		name          string
		start, length time.Duration
		max           int
		want          []int
		firstAt       time.Duration
	}{
		{name: "all", want: []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}},
		{name: "middle", start: 2 * time.Second, length: 3 * time.Second, want: []int{3, 4, 5}},
		{name: "start between requests", start: 2500 * time.Millisecond, length: 2 * time.Second, want: []int{4, 5}, firstAt: 500 * time.Millisecond},
		{name: "max", start: time.Second, max: 2, want: []int{2, 3}},
		{name: "past the end", start: time.Hour},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := Window(reqs, tc.start, tc.length, tc.max)
			if !slices.Equal(lines(got), tc.want) {
				t.Fatalf("lines %v, want %v", lines(got), tc.want)
			}
			if len(got) > 0 && got[0].At != tc.firstAt {
				t.Errorf("first At %v, want %v", got[0].At, tc.firstAt)
			}
		})
	}
	if reqs[3].At != 3*time.Second {
		t.Error("Window changed its input")
	}
}

func TestComputeOracle(t *testing.T) {
	// Blocks of 4 tokens. Request 2 repeats request 1's first block and
	// its short last block (id 2, 3 tokens there, 4 here); request 3
	// repeats 0 and 5 (seen in the same earlier request 2).
	reqs := []Request{
		{InputLength: 7, HashIDs: []uint64{0, 2}},
		{InputLength: 14, HashIDs: []uint64{0, 2, 5, 6}},
		{InputLength: 9, HashIDs: []uint64{0, 5, 8}},
	}
	got := ComputeOracle(reqs, 4)
	want := Oracle{Blocks: 9, SeenBlocks: 4, Tokens: 30, SeenTokens: 16}
	if got != want {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	if got.BlockRate() != 4.0/9 || got.TokenRate() != 16.0/30 {
		t.Errorf("rates %v %v", got.BlockRate(), got.TokenRate())
	}
	if (Oracle{}).BlockRate() != 0 {
		t.Error("empty oracle rate not 0")
	}
}

func TestPromptTokens(t *testing.T) {
	a := Request{InputLength: 10, HashIDs: []uint64{7, 9, 11}}
	b := Request{InputLength: 12, HashIDs: []uint64{7, 9, 12}}
	ta, tb := PromptTokens(a, 4), PromptTokens(b, 4)
	if len(ta) != 10 || len(tb) != 12 {
		t.Fatalf("lengths %d %d, want 10 12", len(ta), len(tb))
	}
	if !slices.Equal(ta[:8], tb[:8]) {
		t.Error("equal hash ids gave different blocks")
	}
	if slices.Equal(ta[8:10], tb[8:10]) {
		t.Error("different hash ids gave the same tokens")
	}
	if slices.Equal(ta[:4], ta[4:8]) {
		t.Error("blocks 7 and 9 are equal")
	}
	for _, v := range append(ta, tb...) {
		if v >= vocab {
			t.Fatalf("token %d outside the vocabulary", v)
		}
	}
	if !slices.Equal(PromptTokens(a, 4), ta) {
		t.Error("not deterministic")
	}
	// The JSON the loader sends is the same prompt.
	var fromJSON []uint32
	if err := json.Unmarshal(appendPromptJSON(nil, a, 4), &fromJSON); err != nil || !slices.Equal(fromJSON, ta) {
		t.Errorf("appendPromptJSON: %v, %v, want %v", fromJSON, err, ta)
	}
}

// TestReadTraceGzip: a gzipped trace reads as the plain one does, by its
// magic bytes whatever its name; a .gz name that is not gzip, and a
// truncated gzip stream, fail naming the file.
func TestReadTraceGzip(t *testing.T) {
	plain := `{"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [0, 1]}
{"timestamp": 1500.5, "input_length": 512, "output_length": 1, "hash_ids": [0]}
`
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte(plain))
	zw.Close()
	want, err := ReadTrace(strings.NewReader(plain), 512)
	if err != nil {
		t.Fatal(err)
	}
	same := func(got []Request) bool {
		return slices.EqualFunc(got, want, func(a, b Request) bool {
			return a.Line == b.Line && a.At == b.At && a.InputLength == b.InputLength && a.OutputLength == b.OutputLength && slices.Equal(a.HashIDs, b.HashIDs)
		})
	}
	if got, err := ReadTrace(bytes.NewReader(gz.Bytes()), 512); err != nil || !same(got) {
		t.Errorf("ReadTrace(gzip) = %+v, %v; want %+v", got, err, want)
	}
	dir := t.TempDir()
	for name, data := range map[string][]byte{"t.jsonl": []byte(plain), "t.jsonl.gz": gz.Bytes(), "gzip-named-plainly.jsonl": gz.Bytes()} {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		if got, err := ReadTraceFile(path, 512); err != nil || !same(got) {
			t.Errorf("ReadTraceFile(%s) = %+v, %v; want %+v", name, got, err, want)
		}
	}
	for name, data := range map[string][]byte{"plain.jsonl.gz": []byte(plain), "truncated.jsonl.gz": gz.Bytes()[:gz.Len()-12]} {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadTraceFile(path, 512); err == nil || !strings.Contains(err.Error(), path) {
			t.Errorf("ReadTraceFile(%s) = %v; want an error naming the file", name, err)
		}
	}
}

// TestShippedTraces reads the traces shipped in data/mooncake-traces (see
// data/README.md) whole, as the demo and bench-routing do: they are part
// of the repository, so a missing or unreadable one fails. The default
// -trace is one of them (relative to the repository root, where make and
// go run ./bench/routing run).
func TestShippedTraces(t *testing.T) {
	root := filepath.Join("..", "..")
	cfg, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Trace != "data/mooncake-traces/conversation_trace.jsonl.gz" {
		t.Errorf("default -trace %q, want the shipped conversation trace", cfg.Trace)
	}
	for _, tc := range []struct {
		file             string
		requests, blocks int
	}{
		{"conversation_trace.jsonl.gz", 12031, 288500},
		{"synthetic_trace.jsonl.gz", 3993, 121877},
	} {
		t.Run(tc.file, func(t *testing.T) {
			reqs, err := ReadTraceFile(filepath.Join(root, "data", "mooncake-traces", tc.file), 512)
			if err != nil {
				t.Fatal(err)
			}
			blocks, distinct := 0, map[uint64]bool{}
			for _, r := range reqs {
				if len(r.HashIDs) == 0 {
					t.Fatalf("line %d has no hash ids", r.Line)
				}
				blocks += len(r.HashIDs)
				for _, h := range r.HashIDs {
					distinct[h] = true
				}
			}
			if len(reqs) != tc.requests || blocks != tc.blocks {
				t.Errorf("%d requests, %d prompt blocks; want %d and %d (data/README.md)", len(reqs), blocks, tc.requests, tc.blocks)
			}
			if o := ComputeOracle(reqs, 512); o.SeenBlocks == 0 || len(distinct) >= blocks {
				t.Errorf("no prompt block repeats (%d distinct of %d): the hash ids do not share prefixes", len(distinct), blocks)
			}
		})
	}
}
