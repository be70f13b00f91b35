package main

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// ReuseGap splits the reusable prompt tokens of a run (the oracle's: in
// blocks seen earlier in the window) into those the engines found cached
// and those lost, by cause. The parts are never negative and add up to
// Oracle, token by token: a request's cached tokens are the first ones of
// its prompt, so each reusable block is found (as far as the engine's
// cached prefix reaches into it) or lost, and a lost token has one cause,
// the first that applies:
//
//   - in flight: the block had been sent before, but no request holding
//     it had finished its prefill (as the runner saw it: first token
//     received) when this one was sent, so no engine could hold it yet.
//     On a busy machine the runner sees first tokens late, so more blocks
//     count as in flight; those the engines found all the same count as
//     found, never twice;
//   - off best: kvgate routed the request to a rank holding a shorter
//     cached prefix than another rank did (from kvgate's routed debug
//     log: cached_blocks against best_cached_blocks; only for kv runs
//     with --log-level debug), at most the tokens the request lost
//     otherwise;
//   - other: evictions, prefixes split over ranks, failed requests, a
//     prompt's last partial block, and the engines' own timing.
type ReuseGap struct {
	// Oracle is the reusable tokens (as Oracle.SeenTokens); Found,
	// InFlight, OffBestTokens and Other split it.
	Oracle, Found, InFlight, OffBestTokens, Other int64
	// Decisions are the routed decisions read from kvgate's log, OffBest
	// those off the longest cached prefix.
	Decisions, OffBest int
}

// routedDecision is a decision of kvgate's routed debug log, in blocks.
type routedDecision struct{ cached, best int }

// ComputeGap works out the gap of a run of reqs (in window order) with
// outcomes outs, and kvgate's decisions by trace line (nil: unknown) on
// blocks of blockSize tokens.
func ComputeGap(reqs []Request, outs []Outcome, tokensPerHash int, routed map[int]routedDecision, blockSize int) ReuseGap {
	byLine := make(map[int]Outcome, len(outs))
	for _, o := range outs {
		byLine[o.Line] = o
	}
	var g ReuseGap
	// stored is, per hash id seen so far, the earliest time a request
	// holding it finished its prefill (MaxInt64: none did).
	stored := make(map[uint64]time.Duration)
	for _, r := range reqs {
		o, sent := byLine[r.Line]
		cached := 0
		if sent && o.OK() {
			cached = o.CachedTokens
		}
		var inFlight, other int64
		for j, h := range r.HashIDs {
			at, seen := stored[h]
			if !seen {
				continue
			}
			from := j * tokensPerHash
			n := min(tokensPerHash, r.InputLength-from)
			if n <= 0 {
				continue
			}
			found := min(max(cached-from, 0), n)
			lost := int64(n - found)
			g.Oracle += int64(n)
			g.Found += int64(found)
			if sent && at > o.Sent {
				inFlight += lost
			} else {
				other += lost
			}
		}
		if d, ok := routed[r.Line]; ok {
			g.Decisions++
			if d.best > d.cached {
				g.OffBest++
				off := min(int64((d.best-d.cached)*blockSize), other)
				g.OffBestTokens += off
				other -= off
			}
		}
		g.InFlight += inFlight
		g.Other += other
		done := time.Duration(math.MaxInt64)
		if sent && o.OK() {
			done = o.Sent + o.TTFT
		}
		for _, h := range r.HashIDs {
			if at, seen := stored[h]; !seen || done < at {
				stored[h] = done
			}
		}
	}
	return g
}

// String is a one-line account of the gap, as shares of the oracle (each
// in [0, 100%], together 100%).
func (g ReuseGap) String() string {
	if g.Oracle == 0 {
		return "no reusable token in the window"
	}
	share := func(n int64) string { return pct(float64(n) / float64(g.Oracle)) }
	s := fmt.Sprintf("found %s of the oracle's reusable tokens; lost: %s in flight (prefix not yet computed when sent)", share(g.Found), share(g.InFlight))
	if g.Decisions > 0 {
		s += fmt.Sprintf(", %s routed off the longest cached prefix (%d of %d decisions)", share(g.OffBestTokens), g.OffBest, g.Decisions)
	}
	return s + fmt.Sprintf(", %s other", share(g.Other))
}

// routedRE reads a text-format routed debug line of kvgate's gateway.
var (
	routedLineRE = regexp.MustCompile(`\bmsg=routed\b`)
	routedIDRE   = regexp.MustCompile(`\bid=trace-line-(\d+)\b`)
	routedKVRE   = regexp.MustCompile(`\b(cached_blocks|best_cached_blocks)=(-?\d+)\b`)
)

// readRouted reads the routed decisions of kvgate's log at path (text
// format, --log-level debug) that name a best cached prefix (kv runs),
// by trace line. A log without any gives an empty map.
func readRouted(path string) (map[int]routedDecision, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseRouted(f)
}

func parseRouted(r io.Reader) (map[int]routedDecision, error) {
	out := map[int]routedDecision{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, "routed") || !routedLineRE.MatchString(line) {
			continue
		}
		id := routedIDRE.FindStringSubmatch(line)
		if id == nil {
			continue
		}
		d := routedDecision{cached: -1, best: -1}
		for _, m := range routedKVRE.FindAllStringSubmatch(line, -1) {
			v, _ := strconv.Atoi(m[2])
			if m[1] == "cached_blocks" {
				d.cached = v
			} else {
				d.best = v
			}
		}
		if d.cached < 0 || d.best < 0 {
			continue // a baseline: no best prefix known
		}
		n, _ := strconv.Atoi(id[1])
		out[n] = d
	}
	return out, sc.Err()
}
