package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// buildKvgate builds the kvgate binary into a temporary directory.
func buildKvgate(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "kvgate")
	cmd := exec.CommandContext(t.Context(), "go", "build", "-o", bin, "github.com/kvgate/kvgate")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build kvgate: %v\n%s", err, out)
	}
	return bin
}

// conversationTrace writes a Mooncake-style trace of convs conversations
// of turns turns: every prompt starts with the shared block 0, and turn t
// of a conversation extends turn t-1 by two blocks. Turns of different
// conversations interleave every gap; a conversation's next turn comes
// convs*gap later.
func conversationTrace(t *testing.T, convs, turns int, gap time.Duration) string {
	t.Helper()
	var b bytes.Buffer
	for turn := range turns {
		for c := range convs {
			ids := []uint64{0}
			for k := range 2 + 2*turn {
				ids = append(ids, uint64(1000*(c+1)+k))
			}
			line, _ := json.Marshal(map[string]any{
				"timestamp":     float64(turn*convs+c) * float64(gap) / float64(time.Millisecond),
				"input_length":  len(ids)*512 - 100,
				"output_length": 8,
				"hash_ids":      ids,
			})
			b.Write(append(line, '\n'))
		}
	}
	path := filepath.Join(t.TempDir(), "trace.jsonl")
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestShortDemo is the demo in a few seconds: every policy on a fresh
// simulated fleet behind a fresh kvgate, a tiny conversation trace. Every
// request must complete under every policy, and KV-aware routing must find
// more of the prompts in cache than round-robin (5 interleaved
// conversations on 4 workers: round-robin never sends two consecutive
// turns to the same worker).
func TestShortDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	bin := buildKvgate(t) // before the deadline: a cold build cache takes minutes
	// A guard against a hang, not a measure of speed.
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	out := t.TempDir()
	cfg, err := parseFlags([]string{"-kvgate", bin, "-trace", conversationTrace(t, 5, 4, 80*time.Millisecond),
		"-window", "0", "-compression", "1", "-speedup", "50", "-max-tokens", "4", "-num-blocks", "4096", "-out", out}, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	var stdout, progress bytes.Buffer
	rep, err := Run(ctx, cfg, &stdout, &progress)
	t.Logf("stdout:\n%s\nprogress:\n%s", stdout.String(), progress.String())
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Levels) != 1 || len(rep.Levels[0].Summaries) != len(allPolicies) {
		t.Fatalf("levels %+v, want one with %d policies", rep.Levels, len(allPolicies))
	}
	l := rep.Levels[0]
	for _, s := range l.Summaries {
		if s.Requests != 20 || s.Completed != 20 || s.Errors != 0 {
			t.Errorf("%s: %d of %d requests completed, %d errors %q", s.Policy, s.Completed, s.Requests, s.Errors, s.ErrorSamples)
		}
		if s.PromptTokens != 20*int64(rep.MeanInput) {
			t.Errorf("%s: %d prompt tokens, want %d", s.Policy, s.PromptTokens, 20*int64(rep.MeanInput))
		}
		// Every request sends max_tokens (the trace's output_length, capped
		// at -max-tokens), so the simulator generates exactly that many
		// tokens: its own end of answer is for requests without it.
		if s.OutputTokens != 20*4 {
			t.Errorf("%s: %d output tokens, want %d", s.Policy, s.OutputTokens, 20*4)
		}
	}
	kv, _ := l.policy("kv")
	rr, _ := l.policy("round-robin")
	if kv.HitRate <= rr.HitRate {
		t.Errorf("kv hit rate %.3f, round-robin %.3f: want kv higher", kv.HitRate, rr.HitRate)
	}
	if kv.HitRate > rep.Oracle.TokenRate() {
		t.Errorf("kv hit rate %.3f above the oracle's %.3f", kv.HitRate, rep.Oracle.TokenRate())
	}

	// The outputs.
	f, err := os.Open(filepath.Join(out, "results.csv"))
	if err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(f).ReadAll()
	f.Close()
	if err != nil || len(rows) != 1+len(allPolicies)+1 {
		t.Fatalf("results.csv: %d rows (%v), want header, %d policies and the oracle", len(rows), err, len(allPolicies))
	}
	for _, name := range []string{"results.md", "requests.csv"} {
		if data, err := os.ReadFile(filepath.Join(out, name)); err != nil || len(data) == 0 {
			t.Errorf("%s: %v, %d bytes", name, err, len(data))
		}
	}
	img, err := os.Open(filepath.Join(out, "ttft_cdf.png"))
	if err != nil {
		t.Fatal(err)
	}
	defer img.Close()
	if _, err := png.Decode(img); err != nil {
		t.Errorf("ttft_cdf.png: %v", err)
	}
	for _, p := range allPolicies {
		if !strings.Contains(stdout.String(), fmt.Sprintf("| %s ", p)) {
			t.Errorf("stdout has no row for %s", p)
		}
	}
}

// TestFlagUsage: -h names every flag's value with a placeholder that
// reads as one (Go's flag package takes a back-quoted word of the usage
// as the placeholder, else the type), and no back quote is left over.
func TestFlagUsage(t *testing.T) {
	var b bytes.Buffer
	if _, err := parseFlags([]string{"-h"}, &b); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v, want flag.ErrHelp", err)
	}
	out := b.String()
	if strings.Contains(out, "`") {
		t.Errorf("usage has a back quote:\n%s", out)
	}
	placeholders := map[string]bool{"int": true, "uint": true, "float": true, "duration": true, "string": true,
		"path": true, "dir": true, "file": true, "list": true, "args": true}
	flagLine := regexp.MustCompile(`^  -(\S+)(?: (.*))?$`)
	got := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		m := flagLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		got[m[1]] = m[2]
		if m[2] != "" && !placeholders[m[2]] {
			t.Errorf("-%s: placeholder %q", m[1], m[2])
		}
	}
	for name, want := range map[string]string{"kvgate": "path", "sim-args": "args", "serve-args": "args", "compression": "list",
		"policies": "list", "out": "dir", "workers": "int", "speedup": "float", "window": "duration"} {
		if got[name] != want {
			t.Errorf("-%s: placeholder %q, want %q", name, got[name], want)
		}
	}
	if len(got) < 20 {
		t.Errorf("%d flags in the usage, want every flag:\n%s", len(got), out)
	}
}
