package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"time"

	"github.com/kvgate/kvgate/internal/gzfile"
)

// vocab bounds the prompt token ids made from trace hash ids.
const vocab = 32000

// Request is one trace line: when it arrives, its prompt as hash ids of
// TokensPerHash-token blocks (the last one cut to InputLength), and how
// many tokens it generates.
type Request struct {
	// Line is the 1-based line of the trace file.
	Line int
	// At is the arrival time from the start of the window, in trace time.
	At           time.Duration
	InputLength  int
	OutputLength int
	HashIDs      []uint64
}

type traceLine struct {
	Timestamp    *float64 `json:"timestamp"`
	InputLength  *int     `json:"input_length"`
	OutputLength *int     `json:"output_length"`
	HashIDs      []uint64 `json:"hash_ids"`
}

// ReadTraceFile reads a Mooncake trace file, gzipped or not (a name ending
// in .gz must be gzip); see ReadTrace.
func ReadTraceFile(path string, tokensPerHash int) ([]Request, error) {
	r, err := gzfile.Open(path)
	if err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	defer r.Close()
	reqs, err := ReadTrace(r, tokensPerHash)
	if err != nil {
		return nil, fmt.Errorf("trace %s: %w", path, err)
	}
	return reqs, nil
}

// ReadTrace reads a Mooncake trace, gzipped or not: one JSON object per
// line with timestamp (ms), input_length, output_length and hash_ids, where
// each id stands for tokensPerHash prompt tokens. Lines must be in
// timestamp order and each prompt must need exactly len(hash_ids) blocks.
// At is the timestamp from the first line's.
func ReadTrace(r io.Reader, tokensPerHash int) ([]Request, error) {
	if tokensPerHash < 1 {
		return nil, fmt.Errorf("tokens per hash id %d: must be >= 1", tokensPerHash)
	}
	r, err := gzfile.Decompress(r, false)
	if err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<20), 64<<20)
	var out []Request
	var first, prev float64
	for n := 1; sc.Scan(); n++ {
		if len(sc.Bytes()) == 0 {
			continue
		}
		var tl traceLine
		if err := json.Unmarshal(sc.Bytes(), &tl); err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		switch {
		case tl.Timestamp == nil || tl.InputLength == nil || tl.OutputLength == nil || tl.HashIDs == nil:
			return nil, fmt.Errorf("line %d: want timestamp, input_length, output_length and hash_ids", n)
		case math.IsNaN(*tl.Timestamp) || *tl.Timestamp < 0:
			return nil, fmt.Errorf("line %d: timestamp %v: must be >= 0", n, *tl.Timestamp)
		case len(out) > 0 && *tl.Timestamp < prev:
			return nil, fmt.Errorf("line %d: timestamp %v before the previous line's %v", n, *tl.Timestamp, prev)
		case *tl.InputLength < 1 || *tl.OutputLength < 1:
			return nil, fmt.Errorf("line %d: input_length %d and output_length %d must be >= 1", n, *tl.InputLength, *tl.OutputLength)
		case (*tl.InputLength+tokensPerHash-1)/tokensPerHash != len(tl.HashIDs):
			return nil, fmt.Errorf("line %d: input_length %d needs %d blocks of %d tokens, hash_ids has %d",
				n, *tl.InputLength, (*tl.InputLength+tokensPerHash-1)/tokensPerHash, tokensPerHash, len(tl.HashIDs))
		}
		if len(out) == 0 {
			first = *tl.Timestamp
		}
		prev = *tl.Timestamp
		out = append(out, Request{
			Line:         n,
			At:           time.Duration((*tl.Timestamp - first) * float64(time.Millisecond)),
			InputLength:  *tl.InputLength,
			OutputLength: *tl.OutputLength,
			HashIDs:      tl.HashIDs,
		})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, errors.New("no requests")
	}
	return out, nil
}

// Window returns the requests arriving in [start, start+length) of trace
// time (length 0: to the end), at most max of them (0: all), with At made
// relative to start.
func Window(reqs []Request, start, length time.Duration, max int) []Request {
	var out []Request
	for _, r := range reqs {
		if r.At < start || (length > 0 && r.At >= start+length) {
			continue
		}
		if max > 0 && len(out) == max {
			break
		}
		r.At -= start
		out = append(out, r)
	}
	return out
}

// Oracle is the best prefix-cache hit rate any router could reach on a
// window, assuming caches that never evict: a block is a hit when its hash
// id appeared in an earlier request of the window. TokenRate, each block
// weighed by its tokens, is the one to compare with a token hit rate: it
// bounds it, while BlockRate does not quite (a prompt's last block is
// short).
type Oracle struct {
	Blocks, SeenBlocks int
	// Tokens and SeenTokens weigh each block by its tokens (the last
	// block of a prompt may be short).
	Tokens, SeenTokens int64
}

// BlockRate is SeenBlocks / Blocks.
func (o Oracle) BlockRate() float64 { return ratio(float64(o.SeenBlocks), float64(o.Blocks)) }

// TokenRate is SeenTokens / Tokens.
func (o Oracle) TokenRate() float64 { return ratio(float64(o.SeenTokens), float64(o.Tokens)) }

// ComputeOracle returns the oracle of reqs.
func ComputeOracle(reqs []Request, tokensPerHash int) Oracle {
	var o Oracle
	seen := make(map[uint64]struct{})
	for _, r := range reqs {
		for j, h := range r.HashIDs {
			n := int64(min(tokensPerHash, r.InputLength-j*tokensPerHash))
			o.Blocks++
			o.Tokens += n
			if _, ok := seen[h]; ok {
				o.SeenBlocks++
				o.SeenTokens += n
			}
		}
		for _, h := range r.HashIDs {
			seen[h] = struct{}{}
		}
	}
	return o
}

// splitmix64 is the output function of the SplitMix64 generator.
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// blockToken is token j of hash id h's block.
func blockToken(h uint64, j, tokensPerHash int) uint32 {
	return uint32(splitmix64(h*uint64(tokensPerHash)+uint64(j)) % vocab)
}

// PromptTokens returns r's prompt: each hash id's block of tokensPerHash
// deterministic token ids, cut to InputLength.
func PromptTokens(r Request, tokensPerHash int) []uint32 {
	out := make([]uint32, 0, r.InputLength)
	for _, h := range r.HashIDs {
		for j := 0; j < tokensPerHash && len(out) < r.InputLength; j++ {
			out = append(out, blockToken(h, j, tokensPerHash))
		}
	}
	return out
}

// appendPromptJSON appends r's prompt as a JSON array of token ids, the
// same ids PromptTokens returns, without building the slice.
func appendPromptJSON(b []byte, r Request, tokensPerHash int) []byte {
	b = append(b, '[')
	n := 0
	for _, h := range r.HashIDs {
		for j := 0; j < tokensPerHash && n < r.InputLength; j++ {
			if n > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendUint(b, uint64(blockToken(h, j, tokensPerHash)), 10)
			n++
		}
	}
	return append(b, ']')
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}
