package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/kvgate/kvgate/bench/engine"
	"github.com/kvgate/kvgate/bench/sim"
	"github.com/kvgate/kvgate/indexer"
)

func newSimCmd() *cobra.Command {
	var (
		cfg          sim.Config
		lora         string
		encoding     string
		endpointFile string
		logLevel     string
	)
	cmd := &cobra.Command{
		Use:   "sim",
		Short: "Run a fleet of simulated vLLM workers (OpenAI HTTP API, KV events over ZMQ) for demos and load tests",
		Long: `Runs --workers simulated vLLM engines in one process. Workers are numbered from
--first-id (default 1); the worker with id --first-id+i (i = 0, 1, ...) serves
vLLM's OpenAI-compatible HTTP API on port --base-port+i (/v1/completions,
/v1/chat/completions, /v1/models, /tokenize, /health, /metrics,
/reset_prefix_cache) and publishes its KV cache events, rank r on port
--event-base-port + i*dp_size + r, with a replay socket on --replay-base-port
likewise. With the defaults, worker 1 listens on 8000 and publishes on 5557,
worker 2 on 8001 and 5558, and so on. Each rank has a KV cache of --num-blocks
blocks with prefix caching and LRU eviction, a continuous-batching scheduler,
and Dynamo mocker's timing model, sped up by --speedup.

A request with max_tokens gets exactly that many output tokens (finish_reason
"length"); without it the simulated model ends its answer on its own, after a
length drawn per request from a lognormal distribution with mean
--mean-output-tokens (median about 0.61 x the mean), the same for the same
request and --seed (finish_reason "stop"), unless the context (or, for
completions, vLLM's default of 16 tokens) cuts it first.

It prints where every worker listens and a "kvgate serve" command that routes
to them: the embedded proxy on 127.0.0.1:8080, the admin API on 127.0.0.1:8090
and ext_proc on 127.0.0.1:9002. --endpoints-file writes the same as JSON, the
listener flags as listen_args and the fleet's as serve_args. Then it runs until
interrupted.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfg.Workers < 1 || cfg.DPSize < 1 {
				return fmt.Errorf("sim: --workers and --dp-size must be at least 1 (got %d, %d)", cfg.Workers, cfg.DPSize)
			}
			if cfg.Engine.BlockSize < 1 || cfg.Engine.BlockSize > indexer.MaxBlockSize {
				return fmt.Errorf("sim: --block-size must be between 1 and %d, not %d", indexer.MaxBlockSize, cfg.Engine.BlockSize)
			}
			if lora != "" {
				cfg.LoRA = strings.Split(lora, ",")
			}
			switch encoding {
			case "map":
				cfg.Encoding = engine.MapEncoding
			case "array":
				cfg.Encoding = engine.ArrayEncoding
			default:
				return fmt.Errorf("sim: --encoding %q: want map or array", encoding)
			}
			var level slog.Level
			if err := level.UnmarshalText([]byte(logLevel)); err != nil {
				return fmt.Errorf("sim: --log-level %q: want debug, info, warn or error", logLevel)
			}
			cfg.Logger = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: level}))
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			context.AfterFunc(ctx, stop)
			return runSim(ctx, cfg, endpointFile, cmd.OutOrStdout())
		},
	}
	fs := cmd.Flags()
	fs.IntVar(&cfg.Workers, "workers", 4, "number of simulated workers")
	fs.IntVar(&cfg.DPSize, "dp-size", 1, "data-parallel ranks per worker")
	fs.StringVar(&cfg.Host, "host", "127.0.0.1", "address every socket binds")
	fs.IntVar(&cfg.BasePort, "base-port", 8000, "HTTP port of the first worker (the worker with id first-id+i: base-port+i); 0 picks free ports")
	fs.IntVar(&cfg.EventBasePort, "event-base-port", 5557, "KV event PUB port of the first worker's rank 0 (id first-id+i, rank r: event-base-port + i*dp-size + r); 0 picks free ports")
	fs.IntVar(&cfg.ReplayBasePort, "replay-base-port", 6557, "KV event replay port of the first worker's rank 0, numbered as --event-base-port; 0 picks free ports")
	fs.BoolVar(&cfg.NoReplay, "no-replay", false, "do not open replay sockets")
	fs.Uint64Var(&cfg.FirstID, "first-id", 1, "id of the first worker; the others follow (first-id+1, ...)")
	fs.StringVar(&cfg.Model, "model", "sim-model", "served model name")
	fs.StringVar(&lora, "lora", "", "comma-separated LoRA adapter names, served as models of their own")
	fs.StringVar(&cfg.Tokenizer, "tokenizer", "", "model directory with tokenizer.json (and chat template); without it text prompts are tokenized as UTF-8 bytes and chats are refused")
	fs.IntVar(&cfg.Engine.BlockSize, "block-size", 16, "tokens per KV block")
	fs.IntVar(&cfg.Engine.NumBlocks, "num-blocks", 8192, "KV cache blocks per rank")
	fs.IntVar(&cfg.Engine.MaxNumSeqs, "max-num-seqs", 256, "running requests per rank")
	fs.IntVar(&cfg.Engine.MaxBatchedTokens, "max-num-batched-tokens", 8192, "tokens computed per step")
	fs.IntVar(&cfg.Engine.MaxModelLen, "max-model-len", 0, "prompt + output tokens per request (default 32768, or the cache size if smaller)")
	fs.Float64Var(&cfg.Engine.Speedup, "speedup", 1, "time compression: a step of simulated duration d takes d/speedup")
	fs.StringVar(&encoding, "encoding", "map", "KV event encoding: map (vLLM today) or array (older engines)")
	fs.StringVar(&cfg.Topic, "topic", "", "ZMQ topic of the KV event messages")
	fs.Float64Var(&cfg.Faults.DropEvents, "drop-events", 0, "fault: fraction of live KV event batches not sent (still replayable)")
	fs.Float64Var(&cfg.Faults.FailRate, "fail-rate", 0, "fault: fraction of generation requests answered with HTTP 500")
	fs.DurationVar(&cfg.Faults.Delay, "delay", 0, "fault: delay before every generation response")
	fs.DurationVar(&cfg.Faults.RestartEvery, "restart-every", 0, "fault: restart one worker's engine (round robin) at this period; 0: never")
	fs.Float64Var(&cfg.MeanOutputTokens, "mean-output-tokens", sim.DefaultMeanOutputTokens, "mean length of the answers the simulated model ends on its own (requests without max_tokens; lognormal, median about 0.61 x the mean)")
	fs.Uint64Var(&cfg.Seed, "seed", 1, "seed of output tokens, output lengths and faults")
	fs.StringVar(&endpointFile, "endpoints-file", "", "also write the workers' endpoints as JSON to this file once listening")
	fs.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn or error")
	return cmd
}

// runSim starts the fleet, reports where it listens, and runs until ctx
// ends.
func runSim(ctx context.Context, cfg sim.Config, endpointFile string, out io.Writer) error {
	f, err := sim.Start(ctx, cfg)
	if err != nil {
		return err
	}
	defer f.Close()
	cfg = f.Config()
	doc := sim.Endpoints{Model: cfg.Model, BlockSize: cfg.Engine.BlockSize}
	var workers []string
	for _, w := range f.Workers() {
		sw := sim.EndpointWorker{ID: w.ID, URL: w.URL()}
		for r, ep := range w.EventEndpoints() {
			replay := w.ReplayEndpoints()[r]
			sw.Ranks = append(sw.Ranks, sim.EndpointRank{Rank: r, Events: ep, Replay: replay})
			spec := fmt.Sprintf("%d:%d=%s", w.ID, r, ep)
			if replay != "" {
				spec += "|" + replay
			}
			workers = append(workers, spec)
		}
		doc.Workers = append(doc.Workers, sw)
	}
	fmt.Fprintf(out, "kvgate sim: %d workers x %d DP ranks serving %q, block size %d, %d blocks per rank, speedup %g\n",
		cfg.Workers, cfg.DPSize, cfg.Model, cfg.Engine.BlockSize, cfg.Engine.NumBlocks, cfg.Engine.Speedup)
	for _, w := range doc.Workers {
		fmt.Fprintf(out, "worker %d  %s", w.ID, w.URL)
		for _, r := range w.Ranks {
			fmt.Fprintf(out, "  rank %d events %s", r.Rank, r.Events)
			if r.Replay != "" {
				fmt.Fprintf(out, " replay %s", r.Replay)
			}
		}
		fmt.Fprintln(out)
	}
	doc.ServeArgs = []string{"--model-name", cfg.Model, "--block-size", strconv.Itoa(cfg.Engine.BlockSize)}
	if cfg.Topic != "" {
		doc.ServeArgs = append(doc.ServeArgs, "--kv-topic", cfg.Topic)
	}
	var https []string
	for _, w := range doc.Workers {
		https = append(https, fmt.Sprintf("%d=%s", w.ID, strings.TrimPrefix(w.URL, "http://")))
	}
	doc.ServeArgs = append(doc.ServeArgs, "--workers", strings.Join(workers, ","), "--worker-endpoints", strings.Join(https, ","))
	doc.ListenArgs = serveListenArgs
	fmt.Fprintf(out, "route with: kvgate serve %s\n", shellJoin(slices.Concat(doc.ListenArgs, doc.ServeArgs)))
	if endpointFile != "" {
		data, err := json.MarshalIndent(doc, "", "  ")
		if err != nil {
			return fmt.Errorf("sim: endpoints: %w", err)
		}
		if err := os.WriteFile(endpointFile, append(data, '\n'), 0o644); err != nil {
			return fmt.Errorf("sim: %w", err)
		}
	}
	cfg.Logger.Info("sim fleet ready", "workers", len(doc.Workers))
	<-ctx.Done()
	if err := f.Close(); err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("sim: shutdown: %w", err)
	}
	return nil
}

// serveListenArgs are the listeners of the printed `kvgate serve`
// command: the embedded proxy the walkthrough sends requests to, and the
// admin and ext_proc servers, all on the loopback interface only (kvgate's
// own defaults bind every interface).
var serveListenArgs = []string{"--proxy-addr", "127.0.0.1:8080", "--admin-addr", "127.0.0.1:8090", "--ext-proc-addr", "127.0.0.1:9002"}

// shellJoin quotes args for a POSIX shell where needed.
func shellJoin(args []string) string {
	out := make([]string, len(args))
	for i, a := range args {
		if a != "" && strings.IndexFunc(a, func(r rune) bool {
			return !(r == '-' || r == '_' || r == '.' || r == '/' || r == ':' || r == ',' || r == '=' ||
				(r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9'))
		}) < 0 {
			out[i] = a
			continue
		}
		out[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(out, " ")
}
