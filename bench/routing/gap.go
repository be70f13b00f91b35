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

// ReuseGap splits the reusable prompt tokens a run did not find cached
// (the oracle's, less the engines' cached tokens) by cause:
//
//   - in flight: the block had been sent before, but no request holding
//     it had finished its prefill when this one was sent, so no engine
//     held it yet (blocks are cached once computed);
//   - off best: kvgate routed the request to a rank holding a shorter
//     cached prefix than another rank did (from kvgate's routed debug
//     log: cached_blocks against best_cached_blocks; only for kv runs
//     with --log-level debug);
//   - the rest: evictions, prefixes split over ranks, and the engines'
//     own timing (negative when the engines found more than kvgate saw at
//     routing time: a prefix computed between the decision and the
//     request's scheduling).
type ReuseGap struct {
	// Oracle and Cached are tokens: those in blocks seen earlier in the
	// window (as Oracle.SeenTokens) and those the engines reported cached.
	Oracle, Cached int64
	InFlight       int64
	// Decisions are the routed decisions read from kvgate's log, OffBest
	// those off the longest cached prefix, OffBestTokens the cached
	// tokens they gave up.
	Decisions, OffBest int
	OffBestTokens      int64
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
		for j, h := range r.HashIDs {
			n := int64(min(tokensPerHash, r.InputLength-j*tokensPerHash))
			at, seen := stored[h]
			if !seen {
				continue
			}
			g.Oracle += n
			if sent && at > o.Sent {
				g.InFlight += n
			}
		}
		done := time.Duration(math.MaxInt64)
		if sent && o.OK() {
			g.Cached += int64(o.CachedTokens)
			done = o.Sent + o.TTFT
		}
		for _, h := range r.HashIDs {
			if at, seen := stored[h]; !seen || done < at {
				stored[h] = done
			}
		}
		if d, ok := routed[r.Line]; ok {
			g.Decisions++
			if d.best > d.cached {
				g.OffBest++
				g.OffBestTokens += int64((d.best - d.cached) * blockSize)
			}
		}
	}
	return g
}

// String is a one-line account of the gap, as shares of the oracle.
func (g ReuseGap) String() string {
	if g.Oracle == 0 {
		return "no reusable token in the window"
	}
	share := func(n int64) string { return pct(float64(n) / float64(g.Oracle)) }
	s := fmt.Sprintf("found %s of the oracle's reusable tokens; lost: %s in flight (prefix not yet computed when sent)", share(g.Cached), share(g.InFlight))
	rest := g.Oracle - g.Cached - g.InFlight
	if g.Decisions > 0 {
		s += fmt.Sprintf(", %s routed off the longest cached prefix (%d of %d decisions)", share(g.OffBestTokens), g.OffBest, g.Decisions)
		rest -= g.OffBestTokens
	}
	return s + fmt.Sprintf(", %s other", share(rest))
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
