package main

import (
	"slices"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	ms := func(v ...int) (out []time.Duration) {
		for _, x := range v {
			out = append(out, time.Duration(x)*time.Millisecond)
		}
		return out
	}
	ten := ms(1, 2, 3, 4, 5, 6, 7, 8, 9, 10)
	tests := []struct {
		name string
		in   []time.Duration
		p    float64
		want time.Duration
	}{
		{"empty", nil, 0.5, 0},
		{"one", ms(7), 0.99, 7 * time.Millisecond},
		{"median of ten", ten, 0.5, 5 * time.Millisecond},
		{"p90 of ten", ten, 0.9, 9 * time.Millisecond},
		{"p99 of ten", ten, 0.99, 10 * time.Millisecond},
		{"p100", ten, 1, 10 * time.Millisecond},
		{"tiny p", ten, 0.001, time.Millisecond},
	}
	for _, tc := range tests {
		if got := Percentile(tc.in, tc.p); got != tc.want {
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestSummarize(t *testing.T) {
	s := time.Second
	outs := []Outcome{
		{Scheduled: 0, Sent: 0, TTFT: 100 * time.Millisecond, E2E: s, PromptTokens: 1000, CachedTokens: 500, OutputTokens: 10},
		{Scheduled: s, Sent: s + 10*time.Millisecond, TTFT: 300 * time.Millisecond, E2E: 3 * s, PromptTokens: 3000, CachedTokens: 0, OutputTokens: 30},
		{Scheduled: 2 * s, Sent: 2 * s, Err: "status 502: boom", Status: 502},
	}
	got := Summarize("kv", 20, 10, outs)
	if got.Requests != 3 || got.Completed != 2 || got.Errors != 1 || !slices.Equal(got.ErrorSamples, []string{"status 502: boom"}) {
		t.Errorf("counts %+v", got)
	}
	if got.Load != 2 || got.HitRate != 500.0/4000 || got.PromptTokens != 4000 || got.OutputTokens != 40 {
		t.Errorf("load %v hit rate %v prompt %d output %d", got.Load, got.HitRate, got.PromptTokens, got.OutputTokens)
	}
	if got.TTFTMean != 200*time.Millisecond || got.TTFTP50 != 100*time.Millisecond || got.TTFTP99 != 300*time.Millisecond {
		t.Errorf("TTFT mean %v p50 %v p99 %v", got.TTFTMean, got.TTFTP50, got.TTFTP99)
	}
	if got.E2EMean != 2*s || got.E2EP99 != 3*s {
		t.Errorf("e2e mean %v p99 %v", got.E2EMean, got.E2EP99)
	}
	// From the first send (0) to the last end (1.01 s + 3 s).
	if got.Duration != 4010*time.Millisecond || got.OutputTokensPerS != 40/4.01 || got.RequestsPerS != 2/4.01 {
		t.Errorf("duration %v, %v tok/s, %v req/s", got.Duration, got.OutputTokensPerS, got.RequestsPerS)
	}
	if got.LagP99 != 10*time.Millisecond || got.OfferedRequestsPS != 1 {
		t.Errorf("lag %v offered %v", got.LagP99, got.OfferedRequestsPS)
	}
	if !slices.Equal(got.TTFTs, []time.Duration{100 * time.Millisecond, 300 * time.Millisecond}) {
		t.Errorf("TTFTs %v", got.TTFTs)
	}
	if empty := Summarize("rr", 1, 1, nil); empty.HitRate != 0 || empty.Duration != 0 {
		t.Errorf("empty summary %+v", empty)
	}
}
