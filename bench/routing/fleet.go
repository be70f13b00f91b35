package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kvgate/kvgate/bench/sim"
)

// maxLines bounds the log lines a proc keeps in memory (the log file has
// them all).
const maxLines = 5000

// proc is a child process in its own process group, with its log lines.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{} // closed once the process exited and its output is read
	err  error         // Wait's error, set before done closes

	mu      sync.Mutex
	lines   []string
	partial []byte
	log     io.Writer
	changed chan struct{} // cap 1: new lines
}

// startProc starts bin with args, its stdout and stderr appended to
// logPath, in an environment without KVGATE_* and DYN_* variables (the
// runner's flags alone configure it).
func startProc(name, bin string, args []string, logPath string) (*proc, error) {
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, done: make(chan struct{}), log: logFile, changed: make(chan struct{}, 1)}
	p.cmd = exec.Command(bin, args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "KVGATE_") && !strings.HasPrefix(kv, "DYN_") {
			p.cmd.Env = append(p.cmd.Env, kv)
		}
	}
	p.cmd.Stdout, p.cmd.Stderr = p, p
	p.cmd.SysProcAttr = sysProcAttr()
	p.cmd.WaitDelay = 2 * time.Second // a grandchild holding the pipes cannot hang Wait
	fmt.Fprintf(logFile, "# %s %s\n", bin, shellQuote(args))
	if err := p.cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		logFile.Close()
		close(p.done)
	}()
	return p, nil
}

// Write records the child's output, line by line.
func (p *proc) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, _ = p.log.Write(b)
	p.partial = append(p.partial, b...)
	for {
		i := bytes.IndexByte(p.partial, '\n')
		if i < 0 {
			break
		}
		p.lines = append(p.lines, string(p.partial[:i]))
		p.partial = p.partial[i+1:]
	}
	if len(p.lines) > maxLines {
		p.lines = append(p.lines[:0:0], p.lines[len(p.lines)-maxLines/2:]...)
	}
	select {
	case p.changed <- struct{}{}:
	default:
	}
	return len(b), nil
}

// tail returns the last n log lines.
func (p *proc) tail(n int) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.lines[max(0, len(p.lines)-n):], "\n")
}

// waitMatch waits for a log line matching re and returns its first
// submatch; it fails when the process exits first or ctx ends.
func (p *proc) waitMatch(ctx context.Context, re *regexp.Regexp) (string, error) {
	for {
		p.mu.Lock()
		for _, l := range p.lines {
			if m := re.FindStringSubmatch(l); m != nil {
				p.mu.Unlock()
				return m[len(m)-1], nil
			}
		}
		p.mu.Unlock()
		select {
		case <-p.changed:
		case <-p.done:
			return "", fmt.Errorf("%s exited (%v) before logging %s; last lines:\n%s", p.name, p.err, re, p.tail(20))
		case <-ctx.Done():
			return "", fmt.Errorf("%s: waiting for %s: %w", p.name, re, ctx.Err())
		}
	}
}

// stop sends SIGTERM to the process group, waits up to timeout, then
// sends SIGKILL and waits again. It reports an exit that was not clean.
func (p *proc) stop(timeout time.Duration) error {
	select {
	case <-p.done:
		return p.exitErr()
	default:
	}
	_ = signalGroup(p.cmd.Process.Pid, syscall.SIGTERM)
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-p.done:
		return p.exitErr()
	case <-t.C:
	}
	_ = signalGroup(p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
	return fmt.Errorf("%s did not stop within %v of SIGTERM: killed", p.name, timeout)
}

func (p *proc) exitErr() error {
	if p.err != nil {
		return fmt.Errorf("%s: %w; last lines:\n%s", p.name, p.err, p.tail(10))
	}
	return nil
}

// FleetConfig is what a fleet run needs beyond the policy.
type FleetConfig struct {
	Kvgate string // kvgate binary
	// Sim flags.
	Workers, DPSize      int
	NumBlocks, BlockSize int
	MaxNumSeqs           int // 0: the simulator's default
	MaxBatchedTokens     int // 0: the simulator's default
	MaxModelLen          int
	Speedup              float64
	Seed                 uint64
	SimArgs              []string // extra `kvgate sim` arguments
	ServeArgs            []string // extra `kvgate serve` arguments
	// PolicyFlag: pass --routing-policy (false: kvgate without the flag,
	// for its default policy only).
	PolicyFlag   bool
	StartTimeout time.Duration
	StopTimeout  time.Duration
}

// fleet is a running `kvgate sim` and a `kvgate serve` in front of it.
type fleet struct {
	sim, kv  *proc
	model    string
	proxyURL string
	adminURL string
	ranks    int
	workers  []sim.EndpointWorker
}

var (
	proxyRE = regexp.MustCompile(`msg="proxy listening" addr=(\S+)`)
	adminRE = regexp.MustCompile(`msg="admin listening" addr=(\S+)`)
	readyRE = regexp.MustCompile(`msg="sim fleet ready"()`)
)

// startFleet starts a fresh simulated fleet and a fresh kvgate routing with
// policy in front of it, logs in dir/<tag>-{sim,kvgate}.log, and waits
// until kvgate is ready and subscribed to every rank. On error everything
// started is stopped.
func startFleet(ctx context.Context, cfg FleetConfig, policy, dir, tag string) (_ *fleet, err error) {
	ctx, cancel := context.WithTimeout(ctx, cfg.StartTimeout)
	defer cancel()
	f := &fleet{}
	defer func() {
		if err != nil {
			_ = f.stop(cfg.StopTimeout)
		}
	}()
	epFile := filepath.Join(dir, tag+"-endpoints.json")
	_ = os.Remove(epFile)
	simArgs := []string{"sim", "--workers", strconv.Itoa(cfg.Workers), "--dp-size", strconv.Itoa(cfg.DPSize),
		"--base-port", "0", "--event-base-port", "0", "--replay-base-port", "0", "--endpoints-file", epFile,
		"--speedup", strconv.FormatFloat(cfg.Speedup, 'g', -1, 64),
		"--num-blocks", strconv.Itoa(cfg.NumBlocks), "--block-size", strconv.Itoa(cfg.BlockSize),
		"--max-model-len", strconv.Itoa(cfg.MaxModelLen), "--seed", strconv.FormatUint(cfg.Seed, 10)}
	if cfg.MaxNumSeqs > 0 {
		simArgs = append(simArgs, "--max-num-seqs", strconv.Itoa(cfg.MaxNumSeqs))
	}
	if cfg.MaxBatchedTokens > 0 {
		simArgs = append(simArgs, "--max-num-batched-tokens", strconv.Itoa(cfg.MaxBatchedTokens))
	}
	simArgs = append(simArgs, cfg.SimArgs...)
	if f.sim, err = startProc("kvgate sim", cfg.Kvgate, simArgs, filepath.Join(dir, tag+"-sim.log")); err != nil {
		return nil, err
	}
	if _, err := f.sim.waitMatch(ctx, readyRE); err != nil {
		return nil, err
	}
	data, err := os.ReadFile(epFile)
	if err != nil {
		return nil, fmt.Errorf("kvgate sim endpoints: %w", err)
	}
	var eps sim.Endpoints
	if err := json.Unmarshal(data, &eps); err != nil {
		return nil, fmt.Errorf("kvgate sim endpoints %s: %w", epFile, err)
	}
	if eps.Model == "" || len(eps.ServeArgs) == 0 {
		return nil, fmt.Errorf("kvgate sim endpoints %s: no model or serve_args", epFile)
	}
	f.model, f.workers = eps.Model, eps.Workers
	for _, w := range eps.Workers {
		f.ranks += len(w.Ranks)
	}

	serveArgs := append([]string{"serve"}, eps.ServeArgs...)
	serveArgs = append(serveArgs, "--proxy-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--ext-proc-addr", "",
		"--shutdown-timeout", "5s")
	if cfg.PolicyFlag {
		serveArgs = append(serveArgs, "--routing-policy", policy)
	}
	serveArgs = append(serveArgs, cfg.ServeArgs...)
	if f.kv, err = startProc("kvgate serve", cfg.Kvgate, serveArgs, filepath.Join(dir, tag+"-kvgate.log")); err != nil {
		return nil, err
	}
	proxy, err := f.kv.waitMatch(ctx, proxyRE)
	if err != nil {
		return nil, err
	}
	admin, err := f.kv.waitMatch(ctx, adminRE)
	if err != nil {
		return nil, err
	}
	f.proxyURL, f.adminURL = "http://"+proxy, "http://"+admin
	if err := f.waitReady(ctx); err != nil {
		return nil, err
	}
	return f, nil
}

// waitReady polls kvgate's /ready and /workers until it answers 200 and
// every rank's listener is active.
func (f *fleet) waitReady(ctx context.Context) error {
	client := &http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: 2 * time.Second}
	defer client.CloseIdleConnections()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var last string
	for {
		ok, why := f.ready(ctx, client)
		if ok {
			return nil
		}
		last = why
		select {
		case <-ctx.Done():
			return fmt.Errorf("kvgate not ready (%s): %w", last, ctx.Err())
		case <-f.kv.done:
			return f.kv.exitErr()
		case <-f.sim.done:
			return f.sim.exitErr()
		case <-tick.C:
		}
	}
}

func (f *fleet) ready(ctx context.Context, c *http.Client) (bool, string) {
	get := func(path string) (int, []byte, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, f.adminURL+path, nil)
		if err != nil {
			return 0, nil, err
		}
		resp, err := c.Do(req)
		if err != nil {
			return 0, nil, err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		return resp.StatusCode, body, err
	}
	code, body, err := get("/ready")
	if err != nil || code != http.StatusOK {
		return false, fmt.Sprintf("/ready: %d %s %v", code, bytes.TrimSpace(body), err)
	}
	code, body, err = get("/workers")
	if err != nil || code != http.StatusOK {
		return false, fmt.Sprintf("/workers: %d %v", code, err)
	}
	var workers []struct {
		Listeners map[string]struct {
			Status string `json:"status"`
		} `json:"listeners"`
	}
	if err := json.Unmarshal(body, &workers); err != nil {
		return false, fmt.Sprintf("/workers: %v", err)
	}
	active := 0
	for _, w := range workers {
		for _, l := range w.Listeners {
			if l.Status == "active" {
				active++
			}
		}
	}
	if active < f.ranks {
		return false, fmt.Sprintf("%d of %d rank listeners active", active, f.ranks)
	}
	return true, ""
}

// stop stops kvgate, then the fleet; each gets SIGTERM, then SIGKILL after
// timeout.
func (f *fleet) stop(timeout time.Duration) error {
	var errs []error
	if f.kv != nil {
		errs = append(errs, f.kv.stop(timeout))
	}
	if f.sim != nil {
		errs = append(errs, f.sim.stop(timeout))
	}
	return errors.Join(errs...)
}

// shellQuote joins args for a POSIX shell, quoting where needed.
func shellQuote(args []string) string {
	out := make([]string, len(args))
	for i, a := range args {
		if a != "" && strings.IndexFunc(a, func(r rune) bool {
			return !(r == '-' || r == '_' || r == '.' || r == '/' || r == ':' || r == ',' || r == '=' || r == '+' ||
				(r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9'))
		}) < 0 {
			out[i] = a
			continue
		}
		out[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(out, " ")
}
