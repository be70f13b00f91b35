package main

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseRouted(t *testing.T) {
	log := strings.Join([]string{
		`time=2026-11-21T05:35:46.619Z level=DEBUG msg=routed id=trace-line-6 model=m worker=2 rank=0 endpoint=127.0.0.1:1 cached_blocks=8 best_cached_blocks=216 blocks=275 path=ids`,
		`time=2026-11-21T05:35:46.624Z level=DEBUG msg=routed id=trace-line-7 model=m worker=4 rank=0 endpoint=127.0.0.1:2 cached_blocks=0 best_cached_blocks=0 blocks=105 path=ids`,
		// A baseline's decision: no best prefix known.
		`time=2026-11-21T05:35:46.625Z level=DEBUG msg=routed id=trace-line-8 model=m worker=1 rank=0 endpoint=127.0.0.1:3 cached_blocks=0 best_cached_blocks=-1 blocks=272 path=ids`,
		// Not a trace request, not a routed line.
		`time=2026-11-21T05:35:46.625Z level=DEBUG msg=routed id=abc model=m worker=1 rank=0 cached_blocks=3 best_cached_blocks=3`,
		`time=2026-11-21T05:35:46.625Z level=INFO msg="routed requests" id=trace-line-9 cached_blocks=3 best_cached_blocks=5`,
		`time=2026-11-21T05:35:46.625Z level=INFO msg=started`,
	}, "\n")
	got, err := parseRouted(strings.NewReader(log))
	if err != nil {
		t.Fatal(err)
	}
	want := map[int]routedDecision{6: {cached: 8, best: 216}, 7: {cached: 0, best: 0}}
	if len(got) != len(want) || got[6] != want[6] || got[7] != want[7] {
		t.Errorf("decisions %v, want %v", got, want)
	}
}

// TestComputeGap works out a tiny run by hand, 100 tokens per hash id:
//
//	line 1: hashes 1 2 (200 tokens), sent at 0, prefill done at 50 ms
//	line 2: hashes 1 2 3, sent at 10 ms: 1 and 2 seen, not yet computed
//	        (in flight, 200); cached 0
//	line 3: hashes 1 2 3 4 (350 tokens), sent at 100 ms: 1, 2, 3 seen
//	        (300), computed; cached 128; kvgate chose a rank with 2
//	        blocks of 64 where one held 4: 128 tokens off best
//	line 4: hashes 5, failed
//	line 5: hashes 5 6, sent at 200 ms: 5 seen but its only request
//	        failed (in flight, 100)
//
// Oracle 200 + 300 + 100 = 600 tokens; found 128.
//
// The contended run is the same but for line 2: on a busy machine the
// runner saw line 1's first token late, yet the engine had computed its
// prefix when line 2 reached it and found 192 of line 2's 200 reusable
// tokens. They count as found, and only the 8 it missed as in flight:
// before, they counted twice and the rest came out negative (-24.7%).
func TestComputeGap(t *testing.T) {
	ms := time.Millisecond
	reqs := []Request{
		{Line: 1, InputLength: 200, HashIDs: []uint64{1, 2}},
		{Line: 2, InputLength: 300, HashIDs: []uint64{1, 2, 3}},
		{Line: 3, InputLength: 350, HashIDs: []uint64{1, 2, 3, 4}},
		{Line: 4, InputLength: 100, HashIDs: []uint64{5}},
		{Line: 5, InputLength: 200, HashIDs: []uint64{5, 6}},
	}
	outs := []Outcome{ // in completion order, not the trace's
		{Line: 3, Sent: 100 * ms, TTFT: 20 * ms, CachedTokens: 128},
		{Line: 1, Sent: 0, TTFT: 50 * ms},
		{Line: 2, Sent: 10 * ms, TTFT: 60 * ms},
		{Line: 4, Sent: 150 * ms, Err: "status 500"},
		{Line: 5, Sent: 200 * ms, TTFT: 5 * ms},
	}
	contended := slices.Clone(outs)
	contended[2].CachedTokens = 192
	routed := map[int]routedDecision{1: {0, 0}, 2: {0, 0}, 3: {cached: 2, best: 4}, 5: {0, 0}}
	// Line 3 lost 172 tokens; a decision claiming 10 blocks (640 tokens)
	// off best accounts for those 172 only.
	greedy := map[int]routedDecision{3: {cached: 2, best: 12}}
	tests := []struct {
		name   string
		outs   []Outcome
		routed map[int]routedDecision
		want   ReuseGap
		text   string
	}{
		{"with decisions", outs, routed, ReuseGap{Oracle: 600, Found: 128, InFlight: 300, OffBestTokens: 128, Other: 44, Decisions: 4, OffBest: 1},
			"found 21.3% of the oracle's reusable tokens; lost: 50.0% in flight (prefix not yet computed when sent), 21.3% routed off the longest cached prefix (1 of 4 decisions), 7.3% other"},
		{"without", outs, nil, ReuseGap{Oracle: 600, Found: 128, InFlight: 300, Other: 172},
			"found 21.3% of the oracle's reusable tokens; lost: 50.0% in flight (prefix not yet computed when sent), 28.7% other"},
		{"contended", contended, routed, ReuseGap{Oracle: 600, Found: 320, InFlight: 108, OffBestTokens: 128, Other: 44, Decisions: 4, OffBest: 1},
			"found 53.3% of the oracle's reusable tokens; lost: 18.0% in flight (prefix not yet computed when sent), 21.3% routed off the longest cached prefix (1 of 4 decisions), 7.3% other"},
		{"off best capped by the loss", outs, greedy, ReuseGap{Oracle: 600, Found: 128, InFlight: 300, OffBestTokens: 172, Decisions: 1, OffBest: 1},
			"found 21.3% of the oracle's reusable tokens; lost: 50.0% in flight (prefix not yet computed when sent), 28.7% routed off the longest cached prefix (1 of 1 decisions), 0.0% other"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := ComputeGap(reqs, tt.outs, 100, tt.routed, 64)
			if g != tt.want {
				t.Errorf("gap %+v, want %+v", g, tt.want)
			}
			checkGapParts(t, g)
			if g.String() != tt.text {
				t.Errorf("text %q\nwant %q", g.String(), tt.text)
			}
		})
	}
	if g := ComputeGap(reqs[:1], outs, 100, nil, 64); g.String() != "no reusable token in the window" {
		t.Errorf("one request: %q", g)
	}
}

// checkGapParts: the parts of g are never negative and add up to the
// oracle.
func checkGapParts(t *testing.T, g ReuseGap) {
	t.Helper()
	if g.Found < 0 || g.InFlight < 0 || g.OffBestTokens < 0 || g.Other < 0 || g.Found+g.InFlight+g.OffBestTokens+g.Other != g.Oracle {
		t.Errorf("gap %+v: parts negative or not adding up to the oracle", g)
	}
}

// TestComputeGapBounded: whatever the engines report (cached tokens up to
// the whole prompt, first tokens seen at any time, failures) and whatever
// kvgate logged, every share is in [0, 100%] and they add up.
func TestComputeGapBounded(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		var reqs []Request
		var outs []Outcome
		routed := map[int]routedDecision{}
		for line := range 30 {
			n := 1 + rng.IntN(6)
			ids := make([]uint64, n)
			for j := range ids {
				ids[j] = uint64(j*10 + rng.IntN(3)) // shared prefixes, often
			}
			in := (n-1)*100 + 1 + rng.IntN(100)
			reqs = append(reqs, Request{Line: line, InputLength: in, HashIDs: ids})
			o := Outcome{Line: line, Sent: time.Duration(line) * time.Millisecond, TTFT: time.Duration(rng.IntN(50)) * time.Millisecond,
				CachedTokens: rng.IntN(in + 1)}
			if rng.IntN(10) == 0 {
				o.Err = "status 500"
			}
			if rng.IntN(5) > 0 {
				outs = append(outs, o)
			}
			routed[line] = routedDecision{cached: rng.IntN(4), best: rng.IntN(8)}
		}
		g := ComputeGap(reqs, outs, 100, routed, 16)
		checkGapParts(t, g)
		if t.Failed() {
			return
		}
	}
}
