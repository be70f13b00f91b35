package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Policies are kvgate's routing policies, in the order they are compared.
var allPolicies = []string{"kv", "round-robin", "random", "least-loaded", "prefix-hash"}

// Config is a whole benchmark run.
type Config struct {
	Fleet FleetConfig

	Trace         string
	Start, Window time.Duration // trace time; Window 0: to the end
	MaxRequests   int           // 0: every request of the window
	TokensPerHash int
	MaxTokens     int // caps each request's output_length; 0: none
	// Compressions are the load levels: trace time / wall time.
	Compressions   []float64
	Policies       []string
	OutDir         string
	RequestTimeout time.Duration
	// Command is how the run was started, for the report.
	Command string
	// Terminal: draw the progress bar (stderr is a terminal).
	Terminal bool
}

func main() {
	cfg, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "routing:", err)
		os.Exit(2)
	}
	cfg.Command = commandLine(os.Args)
	cfg.Terminal = isTerminal(os.Stderr)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if _, err := Run(ctx, cfg, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "routing:", err)
		os.Exit(1)
	}
}

// commandLine is the command as a user would type it again.
func commandLine(args []string) string {
	prog := args[0]
	if strings.Contains(prog, "go-build") {
		prog = "go run ./bench/routing"
	}
	return prog + " " + shellQuote(args[1:])
}

// parseFlags reads the command line; the defaults are the demo's.
func parseFlags(args []string, errOut io.Writer) (Config, error) {
	var cfg Config
	fs := flag.NewFlagSet("routing", flag.ContinueOnError)
	fs.SetOutput(errOut)
	fs.Usage = func() {
		fmt.Fprintf(errOut, "Usage: routing [flags]\n\nReplays a Mooncake trace window through kvgate's proxy in front of a simulated vLLM fleet,\nonce per routing policy and load level, and compares the policies. Defaults are make demo's.\n\n")
		fs.PrintDefaults()
	}
	f := &cfg.Fleet
	fs.StringVar(&f.Kvgate, "kvgate", "bin/kvgate", "`path` of the kvgate binary, which runs both the simulated fleet (kvgate sim) and the router (kvgate serve)")
	fs.StringVar(&cfg.Trace, "trace", "data/mooncake-traces/conversation_trace.jsonl.gz", "Mooncake trace (JSON lines, or gzipped JSON lines: timestamp, input_length, output_length, hash_ids); the default is relative to the repository root")
	fs.DurationVar(&cfg.Start, "start", 0, "window start, in trace time from the first request")
	fs.DurationVar(&cfg.Window, "window", 8*time.Minute, "window length in trace time; 0: to the end of the trace")
	fs.IntVar(&cfg.MaxRequests, "max-requests", 0, "at most this many requests of the window; 0: all")
	fs.IntVar(&cfg.TokensPerHash, "tokens-per-hash", 512, "prompt tokens per trace hash id (Mooncake: 512)")
	fs.IntVar(&cfg.MaxTokens, "max-tokens", 32, "cap on each request's output_length (max_tokens); 0: no cap")
	compressions := fs.String("compression", "25", "time compression (trace time / wall time): one value, or a comma-separated `list` of them for a load sweep")
	policies := fs.String("policies", strings.Join(allPolicies, ","), "comma-separated `list` of kvgate --routing-policy values to compare")
	fs.StringVar(&cfg.OutDir, "out", "demo-out", "output `dir`ectory (results.csv, results.md, requests.csv, PNG plots, logs/)")
	fs.DurationVar(&cfg.RequestTimeout, "request-timeout", 5*time.Minute, "give up on a request after this long")
	fs.IntVar(&f.Workers, "workers", 4, "simulated workers")
	fs.IntVar(&f.DPSize, "dp-size", 1, "data-parallel ranks per worker")
	fs.IntVar(&f.NumBlocks, "num-blocks", 65536, "KV cache blocks per rank")
	fs.IntVar(&f.BlockSize, "block-size", 64, "tokens per KV block (engines and kvgate)")
	fs.IntVar(&f.MaxNumSeqs, "max-num-seqs", 0, "running requests per rank; 0: the simulator's default")
	fs.IntVar(&f.MaxBatchedTokens, "max-num-batched-tokens", 0, "tokens computed per engine step; 0: the simulator's default")
	fs.Float64Var(&f.Speedup, "speedup", 5, "engine speedup: simulated time runs this many times faster than wall time")
	fs.Uint64Var(&f.Seed, "seed", 1, "seed of the simulated fleet")
	simArgs := fs.String("sim-args", "", "extra `args` for kvgate sim, space-separated")
	serveArgs := fs.String("serve-args", "", "extra `args` for kvgate serve, space-separated (e.g. \"--log-level debug\" to log routing decisions for the gap analysis)")
	fs.DurationVar(&f.StartTimeout, "start-timeout", 30*time.Second, "how long a fleet and kvgate may take to be ready")
	fs.DurationVar(&f.StopTimeout, "stop-timeout", 10*time.Second, "how long a process may take to exit after SIGTERM before SIGKILL")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var err error
	if cfg.Compressions, err = parseFloats(*compressions); err != nil {
		return cfg, fmt.Errorf("-compression: %w", err)
	}
	cfg.Policies = splitList(*policies)
	f.SimArgs, f.ServeArgs = strings.Fields(*simArgs), strings.Fields(*serveArgs)
	return cfg, cfg.validate()
}

func splitList(s string) []string {
	var out []string
	for p := range strings.SplitSeq(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func parseFloats(s string) ([]float64, error) {
	var out []float64
	for _, p := range splitList(s) {
		v, err := strconv.ParseFloat(p, 64)
		if err != nil {
			return nil, fmt.Errorf("%q is not a number", p)
		}
		out = append(out, v)
	}
	return out, nil
}

// validate checks cfg; bad values are errors naming the flag.
func (c *Config) validate() error {
	f := c.Fleet
	switch {
	case len(c.Compressions) == 0:
		return errors.New("-compression: want at least one value")
	case slices.ContainsFunc(c.Compressions, func(v float64) bool { return !(v > 0) || v > 1e9 }):
		return fmt.Errorf("-compression %v: every value must be > 0", c.Compressions)
	case len(c.Policies) == 0:
		return errors.New("-policies: want at least one policy")
	case hasDuplicate(c.Policies):
		return fmt.Errorf("-policies %v: a policy is listed twice", c.Policies)
	case !(f.Speedup > 0):
		return fmt.Errorf("-speedup %v: must be > 0", f.Speedup)
	case f.Workers < 1 || f.DPSize < 1:
		return fmt.Errorf("-workers %d, -dp-size %d: must be >= 1", f.Workers, f.DPSize)
	case f.NumBlocks < 1 || f.BlockSize < 1:
		return fmt.Errorf("-num-blocks %d, -block-size %d: must be >= 1", f.NumBlocks, f.BlockSize)
	case f.MaxNumSeqs < 0 || f.MaxBatchedTokens < 0:
		return errors.New("-max-num-seqs and -max-num-batched-tokens must be >= 0")
	case c.TokensPerHash < 1:
		return fmt.Errorf("-tokens-per-hash %d: must be >= 1", c.TokensPerHash)
	case c.MaxTokens < 0 || c.MaxRequests < 0:
		return errors.New("-max-tokens and -max-requests must be >= 0")
	case c.Start < 0 || c.Window < 0:
		return errors.New("-start and -window must be >= 0")
	case c.OutDir == "":
		return errors.New("-out: empty")
	case f.Kvgate == "":
		return errors.New("-kvgate: empty")
	case f.StartTimeout <= 0 || f.StopTimeout <= 0 || c.RequestTimeout < 0:
		return errors.New("-start-timeout and -stop-timeout must be > 0, -request-timeout >= 0")
	}
	return nil
}

func hasDuplicate(s []string) bool {
	seen := map[string]bool{}
	for _, v := range s {
		if seen[v] {
			return true
		}
		seen[v] = true
	}
	return false
}

// Run runs the benchmark: every policy at every load level, each on a
// fresh fleet. It prints a table per level on out and progress on
// progress, writes the results to cfg.OutDir and returns the report. It
// fails when a run could not be made, or after writing everything when
// some requests failed.
func Run(ctx context.Context, cfg Config, out, progress io.Writer) (*Report, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	began := time.Now()
	all, err := ReadTraceFile(cfg.Trace, cfg.TokensPerHash)
	if err != nil {
		return nil, err
	}
	reqs := Window(all, cfg.Start, cfg.Window, cfg.MaxRequests)
	if len(reqs) == 0 {
		return nil, fmt.Errorf("no request in the window (-start %v -window %v) of %s", cfg.Start, cfg.Window, cfg.Trace)
	}
	loader := Loader{TokensPerHash: cfg.TokensPerHash, MaxTokens: cfg.MaxTokens, Timeout: cfg.RequestTimeout}
	rep := &Report{Command: cfg.Command, Machine: machine(), Trace: filepath.Base(cfg.Trace), Start: cfg.Start,
		Requests: len(reqs), MaxTokens: cfg.MaxTokens, TokensPerHash: cfg.TokensPerHash, Policies: cfg.Policies,
		Oracle: ComputeOracle(reqs, cfg.TokensPerHash)}
	var in, outTok float64
	for _, r := range reqs {
		in += float64(r.InputLength)
		outTok += float64(loader.maxTokens(r))
		cfg.Fleet.MaxModelLen = max(cfg.Fleet.MaxModelLen, r.InputLength+loader.maxTokens(r))
	}
	rep.MeanInput, rep.MeanOut = in/float64(len(reqs)), outTok/float64(len(reqs))
	rep.Window = reqs[len(reqs)-1].At
	if cfg.Window > 0 && cfg.MaxRequests == 0 {
		rep.Window = cfg.Window
	}
	rep.WindowDescription = fmt.Sprintf("trace time %v to %v", cfg.Start, cfg.Start+rep.Window)
	if cache := cfg.Fleet.NumBlocks * cfg.Fleet.BlockSize; cfg.Fleet.MaxModelLen > cache {
		return nil, fmt.Errorf("the window's longest request needs %d tokens, a rank's KV cache holds %d (-num-blocks %d x -block-size %d): raise -num-blocks",
			cfg.Fleet.MaxModelLen, cache, cfg.Fleet.NumBlocks, cfg.Fleet.BlockSize)
	}
	if cfg.Fleet.PolicyFlag, err = supportsPolicyFlag(ctx, cfg.Fleet.Kvgate); err != nil {
		return nil, err
	}
	if v, err := exec.CommandContext(ctx, cfg.Fleet.Kvgate, "version").Output(); err == nil {
		rep.KvgateVersion = strings.TrimSpace(string(v))
	}
	if !cfg.Fleet.PolicyFlag && !slices.Equal(cfg.Policies, []string{"kv"}) {
		return nil, fmt.Errorf("%s serve has no --routing-policy flag: rebuild it, or run -policies kv", cfg.Fleet.Kvgate)
	}
	rep.Fleet = cfg.Fleet
	logDir := filepath.Join(cfg.OutDir, "logs")
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return nil, err
	}
	rc, err := createRequestsCSV(filepath.Join(cfg.OutDir, "requests.csv"))
	if err != nil {
		return nil, err
	}
	defer rc.close()

	fmt.Fprintf(out, "%s", rep.Setup())
	plots := map[float64]string{}
	failed := 0
	total := len(cfg.Compressions) * len(cfg.Policies)
	for _, c := range cfg.Compressions {
		level := Level{Compression: c, Load: c / cfg.Fleet.Speedup}
		for _, policy := range cfg.Policies {
			n := len(rep.Levels)*len(cfg.Policies) + len(level.Summaries) + 1
			label := fmt.Sprintf("[%d/%d] %s @%gx", n, total, policy, c)
			tag := fmt.Sprintf("c%g-%s", c, policy)
			s, outs, err := runPolicy(ctx, cfg, loader, policy, c, reqs, logDir, tag, label, progress)
			if err != nil {
				return nil, fmt.Errorf("%s at compression %g: %w", policy, c, err)
			}
			// kvgate has exited: its log is complete. Without the log, the
			// gap has no decisions.
			routed, _ := readRouted(filepath.Join(logDir, tag+"-kvgate.log"))
			s.Gap = ComputeGap(reqs, outs, cfg.TokensPerHash, routed, cfg.Fleet.BlockSize)
			rc.write(c, policy, outs)
			failed += s.Errors
			level.Summaries = append(level.Summaries, s)
		}
		rep.Levels = append(rep.Levels, level)
		rep.WriteText(out, level)
		name := "ttft_cdf.png"
		if len(cfg.Compressions) > 1 {
			name = fmt.Sprintf("ttft_cdf_c%g.png", c)
		}
		if err := PlotTTFTCDF(filepath.Join(cfg.OutDir, name), rep.ttftCDFTitle(level), level); err != nil {
			return nil, err
		}
		plots[c] = name
	}
	sweep := ""
	if len(cfg.Compressions) > 1 {
		sweep = "sweep_ttft.png"
		if err := PlotSweep(filepath.Join(cfg.OutDir, sweep), "Mean TTFT against offered load: "+rep.Trace, rep.Levels, cfg.Policies); err != nil {
			return nil, err
		}
	}
	rep.Elapsed = time.Since(began)
	if err := writeFile(filepath.Join(cfg.OutDir, "results.csv"), rep.WriteCSV); err != nil {
		return nil, err
	}
	if err := writeFile(filepath.Join(cfg.OutDir, "results.md"), func(w io.Writer) error { return rep.WriteMarkdown(w, plots, sweep) }); err != nil {
		return nil, err
	}
	if err := rc.close(); err != nil {
		return nil, fmt.Errorf("requests.csv: %w", err)
	}
	fmt.Fprintf(out, "\nwrote %s/{results.csv,results.md,requests.csv,*.png} in %.0f s\n", cfg.OutDir, rep.Elapsed.Seconds())
	if failed > 0 {
		return rep, fmt.Errorf("%d requests failed (see the tables and %s)", failed, logDir)
	}
	return rep, nil
}

// runPolicy replays reqs through a fresh fleet routed by policy.
func runPolicy(ctx context.Context, cfg Config, loader Loader, policy string, compression float64, reqs []Request,
	logDir, tag, label string, progress io.Writer) (_ Summary, outs []Outcome, err error) {
	mark := markCPU()
	f, err := startFleet(ctx, cfg.Fleet, policy, logDir, tag)
	if err != nil {
		return Summary{}, nil, err
	}
	defer func() {
		if serr := f.stop(cfg.Fleet.StopTimeout); serr != nil && err == nil && ctx.Err() == nil {
			err = fmt.Errorf("stopping: %w", serr)
		}
	}()
	client := newClient()
	defer client.CloseIdleConnections()
	loader.Client, loader.URL, loader.Model = client, f.proxyURL, f.model
	bar := StartProgress(progress, cfg.Terminal, label, len(reqs), 250*time.Millisecond)
	outs = loader.Run(ctx, reqs, compression, bar.Done)
	s := Summarize(policy, compression, cfg.Fleet.Speedup, outs)
	bar.Finish(fmt.Sprintf("hit rate %s, mean TTFT %s, %d errors", pct(s.HitRate), fmtDur(s.TTFTMean), s.Errors))
	if err := ctx.Err(); err != nil {
		return Summary{}, nil, err
	}
	s.Diag = f.diagnostics(ctx, mark)
	return s, outs, nil
}

// supportsPolicyFlag reports whether bin's `serve` has --routing-policy.
func supportsPolicyFlag(ctx context.Context, bin string) (bool, error) {
	help, err := exec.CommandContext(ctx, bin, "serve", "--help").CombinedOutput()
	if err != nil {
		return false, fmt.Errorf("%s serve --help: %w: %s", bin, err, help)
	}
	return strings.Contains(string(help), "--routing-policy"), nil
}

// machine describes the host for the report.
func machine() string {
	cpu := "unknown CPU"
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				cpu = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	return fmt.Sprintf("%s, %d CPUs, %s/%s, %s", cpu, runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, runtime.Version())
}
