package main

import (
	"math"
	"slices"
	"time"
)

// Summary is one policy's run at one load level.
type Summary struct {
	Policy      string
	Compression float64
	// Load is the offered load relative to the trace's real rate against
	// the engines' real speed: Compression / Speedup.
	Load float64

	Requests, Completed, Errors int
	// ErrorSamples are the first few errors, for the report.
	ErrorSamples []string

	PromptTokens, CachedTokens, OutputTokens int64
	HitRate                                  float64

	TTFTMean, TTFTP50, TTFTP90, TTFTP99 time.Duration
	E2EMean, E2EP50, E2EP99             time.Duration
	// TTFTs are the completed requests' TTFTs, sorted (for the CDF).
	TTFTs []time.Duration

	// Duration is from the first request sent to the last one ended.
	Duration          time.Duration
	OutputTokensPerS  float64
	RequestsPerS      float64
	LagP99, LagMax    time.Duration // how late requests were sent (runner overload shows here)
	OfferedRequestsPS float64

	Diag Diagnostics
	// Gap splits the reusable tokens not found cached by cause.
	Gap ReuseGap
}

// maxErrorSamples bounds Summary.ErrorSamples.
const maxErrorSamples = 5

// Summarize aggregates outcomes.
func Summarize(policy string, compression, speedup float64, outs []Outcome) Summary {
	s := Summary{Policy: policy, Compression: compression, Load: compression / speedup, Requests: len(outs)}
	var ttft, e2e, lag []time.Duration
	var first, last time.Duration = math.MaxInt64, 0
	for _, o := range outs {
		if !o.OK() {
			s.Errors++
			if len(s.ErrorSamples) < maxErrorSamples {
				s.ErrorSamples = append(s.ErrorSamples, o.Err)
			}
			continue
		}
		s.Completed++
		s.PromptTokens += int64(o.PromptTokens)
		s.CachedTokens += int64(o.CachedTokens)
		s.OutputTokens += int64(o.OutputTokens)
		ttft = append(ttft, o.TTFT)
		e2e = append(e2e, o.E2E)
		lag = append(lag, max(0, o.Sent-o.Scheduled))
		first = min(first, o.Sent)
		last = max(last, o.Sent+o.E2E)
	}
	s.HitRate = ratio(float64(s.CachedTokens), float64(s.PromptTokens))
	slices.Sort(ttft)
	slices.Sort(e2e)
	slices.Sort(lag)
	s.TTFTs = ttft
	s.TTFTMean, s.TTFTP50, s.TTFTP90, s.TTFTP99 = mean(ttft), Percentile(ttft, 0.5), Percentile(ttft, 0.9), Percentile(ttft, 0.99)
	s.E2EMean, s.E2EP50, s.E2EP99 = mean(e2e), Percentile(e2e, 0.5), Percentile(e2e, 0.99)
	s.LagP99 = Percentile(lag, 0.99)
	if len(lag) > 0 {
		s.LagMax = lag[len(lag)-1]
	}
	if s.Completed > 0 && last > first {
		s.Duration = last - first
		s.OutputTokensPerS = float64(s.OutputTokens) / s.Duration.Seconds()
		s.RequestsPerS = float64(s.Completed) / s.Duration.Seconds()
	}
	if n := len(outs); n > 1 {
		if span := outs[n-1].Scheduled - outs[0].Scheduled; span > 0 {
			s.OfferedRequestsPS = float64(n-1) / span.Seconds()
		}
	}
	return s
}

// Percentile returns the nearest-rank p-quantile (0 < p <= 1) of sorted
// durations, 0 for none.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func mean(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	var sum float64
	for _, v := range d {
		sum += float64(v)
	}
	return time.Duration(sum / float64(len(d)))
}
