package main

import (
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
// Oracle 200 + 300 + 100 = 600 tokens; cached 128.
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
	routed := map[int]routedDecision{1: {0, 0}, 2: {0, 0}, 3: {cached: 2, best: 4}, 5: {0, 0}}
	tests := []struct {
		name   string
		routed map[int]routedDecision
		want   ReuseGap
		text   string
	}{
		{"with decisions", routed, ReuseGap{Oracle: 600, Cached: 128, InFlight: 300, Decisions: 4, OffBest: 1, OffBestTokens: 128},
			"found 21.3% of the oracle's reusable tokens; lost: 50.0% in flight (prefix not yet computed when sent), 21.3% routed off the longest cached prefix (1 of 4 decisions), 7.3% other"},
		{"without", nil, ReuseGap{Oracle: 600, Cached: 128, InFlight: 300},
			"found 21.3% of the oracle's reusable tokens; lost: 50.0% in flight (prefix not yet computed when sent), 28.7% other"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := ComputeGap(reqs, outs, 100, tt.routed, 64)
			if g != tt.want {
				t.Errorf("gap %+v, want %+v", g, tt.want)
			}
			if g.String() != tt.text {
				t.Errorf("text %q\nwant %q", g.String(), tt.text)
			}
		})
	}
	if g := ComputeGap(reqs[:1], outs, 100, nil, 64); g.String() != "no reusable token in the window" {
		t.Errorf("one request: %q", g)
	}
}
