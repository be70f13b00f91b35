package main

import (
	"bytes"
	"regexp"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestRun runs a small benchmark end to end: every request is routed and
// answered (level fails if a booking is left), the table has a row per
// level, and nothing is left running.
func TestRun(t *testing.T) {
	cfg := config{tokenizer: "../../data/tokenizers/qwen2.5", workers: 4, rate: 40, duration: time.Second,
		sweep: []float64{80}, sweepDuration: 500 * time.Millisecond, p99Limit: time.Minute,
		active: 4, turns: 3, historyTokens: 400, turnTokens: 60, chunk: 1024, seed: 1}
	var out bytes.Buffer
	if err := run(t.Context(), cfg, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	rows := regexp.MustCompile(`(?m)^\| (\d+) \| \d+ \| (\d+) \| (\d+) \|.* \| (\d+) \|$`).FindAllStringSubmatch(out.String(), -1)
	if len(rows) != 2 {
		t.Fatalf("%d result rows, want 2:\n%s", len(rows), out.String())
	}
	for i, want := range [][2]string{{"40", "40"}, {"80", "40"}} {
		r := rows[i]
		if r[1] != want[0] || r[2] != want[1] || r[4] != "0" || r[3] == "0" {
			t.Errorf("row %q: want rate %s, %s requests, prompt tokens, no errors", r[0], want[0], want[1])
		}
	}
	// Which rates this machine sustains is for the benchmark to measure,
	// not for a test: only that the summary names one of those tried (0:
	// none).
	if !regexp.MustCompile(`sustained with decision p99 < 1m0s: (0|40|80) req/s`).MatchString(out.String()) {
		t.Errorf("no highest sustained rate:\n%s", out.String())
	}
}

func TestBadTokenizer(t *testing.T) {
	if err := run(t.Context(), config{tokenizer: t.TempDir(), workers: 1, rate: 1, duration: time.Millisecond}, &bytes.Buffer{}); err == nil {
		t.Error("a directory without tokenizer.json was accepted")
	}
}
