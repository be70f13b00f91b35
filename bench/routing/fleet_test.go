package main

import (
	"context"
	"errors"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestProcStopsGroup: stop reaches the children of the process (its
// process group), and a clean exit is no error.
func TestProcStopsGroup(t *testing.T) {
	dir := t.TempDir()
	p, err := startProc("sh", "/bin/sh", []string{"-c", `sleep 60 & echo "child $!"; wait`}, filepath.Join(dir, "sh.log"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	pid, err := p.waitMatch(ctx, regexp.MustCompile(`^child (\d+)$`))
	if err != nil {
		t.Fatal(err)
	}
	child, _ := strconv.Atoi(pid)
	if err := p.stop(5 * time.Second); err == nil || !strings.Contains(err.Error(), "signal: terminated") {
		t.Errorf("stop: %v, want the shell's death by SIGTERM", err)
	}
	// The orphaned sleep is reaped by init; poll until it is gone.
	deadline := time.Now().Add(5 * time.Second)
	for syscall.Kill(child, 0) == nil {
		if time.Now().After(deadline) {
			t.Fatalf("child %d still alive after stop", child)
		}
		time.Sleep(10 * time.Millisecond)
	}

	q, err := startProc("true", "/bin/sh", []string{"-c", "echo bye"}, filepath.Join(dir, "true.log"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.waitMatch(ctx, regexp.MustCompile(`never`)); err == nil || !strings.Contains(err.Error(), "exited") {
		t.Errorf("waitMatch on an exited process: %v", err)
	}
	if err := q.stop(time.Second); err != nil {
		t.Errorf("stop after a clean exit: %v", err)
	}
	if got := q.tail(5); got != "bye" {
		t.Errorf("tail %q", got)
	}
}

// TestProcStopKills: a process ignoring SIGTERM is killed after the
// timeout, and stop says so.
func TestProcStopKills(t *testing.T) {
	p, err := startProc("stubborn", "/bin/sh", []string{"-c", `trap "" TERM; echo ready; while :; do sleep 1; done`}, filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := p.waitMatch(ctx, regexp.MustCompile(`^ready$`)); err != nil {
		t.Fatal(err)
	}
	err = p.stop(200 * time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "killed") {
		t.Errorf("stop: %v, want killed", err)
	}
	select {
	case <-p.done:
	default:
		t.Error("process not reaped")
	}
	if _, err := startProc("x", filepath.Join(t.TempDir(), "missing"), nil, filepath.Join(t.TempDir(), "log")); err == nil {
		t.Error("missing binary: no error")
	}
	var ctxErr error
	ctx2, cancel2 := context.WithCancel(t.Context())
	cancel2()
	p2, _ := startProc("sleeper", "/bin/sh", []string{"-c", "sleep 60"}, filepath.Join(t.TempDir(), "log"))
	_, ctxErr = p2.waitMatch(ctx2, regexp.MustCompile(`x`))
	_ = p2.stop(time.Second)
	if !errors.Is(ctxErr, context.Canceled) {
		t.Errorf("waitMatch with a cancelled context: %v", ctxErr)
	}
}

func TestParseFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		wantErr string
		check   func(Config) bool
	}{
		{name: "demo defaults", check: func(c Config) bool {
			return len(c.Policies) == 5 && len(c.Compressions) == 1 && c.Fleet.Workers == 4 && c.OutDir == "demo-out" && c.Fleet.Kvgate == "bin/kvgate"
		}},
		{name: "sweep", args: []string{"-compression", "10, 20,40", "-policies", "kv,round-robin", "-sim-args", "--encoding array", "-serve-args", "--fallbacks 1"},
			check: func(c Config) bool {
				return len(c.Compressions) == 3 && c.Compressions[2] == 40 && len(c.Policies) == 2 &&
					len(c.Fleet.SimArgs) == 2 && c.Fleet.ServeArgs[1] == "1"
			}},
		{name: "bad compression", args: []string{"-compression", "fast"}, wantErr: `-compression: "fast" is not a number`},
		{name: "zero compression", args: []string{"-compression", "0"}, wantErr: "must be > 0"},
		{name: "no policy", args: []string{"-policies", " , "}, wantErr: "at least one policy"},
		{name: "policy twice", args: []string{"-policies", "kv,kv"}, wantErr: "listed twice"},
		{name: "no workers", args: []string{"-workers", "0"}, wantErr: "-workers 0"},
		{name: "no speedup", args: []string{"-speedup", "0"}, wantErr: "-speedup 0"},
		{name: "negative window", args: []string{"-window", "-1s"}, wantErr: "-window"},
		{name: "stray argument", args: []string{"extra"}, wantErr: "unexpected arguments"},
		{name: "unknown flag", args: []string{"-nope"}, wantErr: "not defined"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var errOut strings.Builder
			c, err := parseFlags(tc.args, &errOut)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || !tc.check(c) {
				t.Fatalf("config %+v, error %v", c, err)
			}
		})
	}
}
