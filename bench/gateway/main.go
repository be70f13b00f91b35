// Command gateway measures kvgate's routing decision as Envoy sees it: the
// time from the last request-body chunk sent to the ext_proc server to the
// header mutation naming the endpoint, for multi-turn chat prompts of about
// 8 000 tokens tokenized in process, over 64 workers, at an open-loop
// offered load.
//
//	go run ./bench/gateway [-tokenizer data/tokenizers/qwen2.5] [-rate 100] [-duration 30s]
//
// The default tokenizer is the Qwen2.5 one shipped in the repository (see
// data/README.md), relative to the repository root, where make and go run
// ./bench/gateway run.
//
// Everything runs in this process, over real gRPC on 127.0.0.1: kvgate's
// ext_proc server (extproc.Server over a Gateway, the catalog, the
// scheduler, the index and a tokenizer registry, as `kvgate serve` builds
// them) and an Envoy-behaving client (internal/envoytest) sending every
// request in FULL_DUPLEX_STREAMED mode in 16 KiB chunks, then passing a
// short streamed response back through, as Envoy does, which ends the
// request's booking.
//
// The workload: conversations, each a long history (a system prompt and
// earlier turns) followed by -turns new turns; request k of a
// conversation is its history, its k earlier new turns with their replies,
// and a new user message, so prompts grow by a few hundred tokens a turn
// and repeat everything before. -active conversations are in progress at a
// time; each arrival (Poisson, -rate per second) takes the next turn of one
// of them at random. Before a level runs, each conversation's previous
// turn (its history up to the last question) is routed through the gateway
// and stored in the index on the worker chosen, as the earlier turns would
// have left both: the gateway has seen the history once (its tokenizer's
// segment cache may hold it) and decisions find real prefixes. Only the
// last reply and the new question of a request are new to the gateway.
// The text is runs of 6 to 17 consecutive words of English prose, in an
// order drawn from -seed: the prose of kvgate's own documentation, embedded
// (testdata/prose.txt.gz, written by ./genprose).
//
// Reported per offered rate: decision latency p50/p99/max, the rate
// achieved, and CPU time per request (user+system of this whole process
// over the level divided by requests: kvgate's side and the client's
// gRPC side together, so an upper bound of kvgate's cost). After the main
// level, a sweep of higher rates (-sweep) finds the highest rate sustained
// with p99 under -p99-limit (default 10 ms).
package main

import (
	"bytes"
	"compress/gzip"
	"context"
	_ "embed"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/extproc"
	"github.com/kvgate/kvgate/indexer"
	"github.com/kvgate/kvgate/indexer/kvevents"
	"github.com/kvgate/kvgate/internal/envoytest"
	"github.com/kvgate/kvgate/internal/listeners"
	"github.com/kvgate/kvgate/scheduler"
	"github.com/kvgate/kvgate/scheduler/catalog"
	"github.com/kvgate/kvgate/tokenize"
)

type config struct {
	tokenizer     string
	workers       int
	rate          float64
	duration      time.Duration
	sweep         []float64
	sweepDuration time.Duration
	p99Limit      time.Duration
	active        int
	turns         int
	historyTokens int
	turnTokens    int
	chunk         int
	seed          uint64
	cpuProfile    string
}

const model = "bench-model"

func main() {
	var cfg config
	var sweep string
	flag.StringVar(&cfg.tokenizer, "tokenizer", "data/tokenizers/qwen2.5", "model directory with tokenizer.json (or tokenizer.json.gz) and a chat template")
	flag.IntVar(&cfg.workers, "workers", 64, "workers in the catalog")
	flag.Float64Var(&cfg.rate, "rate", 100, "offered load of the main level, requests per second (open loop)")
	flag.DurationVar(&cfg.duration, "duration", 30*time.Second, "length of the main level")
	flag.StringVar(&sweep, "sweep", "200,400,800,1200,1600,2400,3200", "comma-separated higher rates tried after the main level, in order, until p99 exceeds -p99-limit (empty: none)")
	flag.DurationVar(&cfg.sweepDuration, "sweep-duration", 10*time.Second, "length of each sweep level")
	flag.DurationVar(&cfg.p99Limit, "p99-limit", 10*time.Millisecond, "p99 a sweep level must stay under")
	flag.IntVar(&cfg.active, "active", 64, "conversations in progress at a time")
	flag.IntVar(&cfg.turns, "turns", 8, "new turns per conversation")
	flag.IntVar(&cfg.historyTokens, "history-tokens", 7000, "approximate tokens of a conversation's history")
	flag.IntVar(&cfg.turnTokens, "turn-tokens", 250, "approximate tokens a turn adds (reply and question)")
	flag.IntVar(&cfg.chunk, "chunk", 16<<10, "request body chunk size, bytes")
	flag.Uint64Var(&cfg.seed, "seed", 1, "seed of the text and the arrivals")
	flag.StringVar(&cfg.cpuProfile, "cpuprofile", "", "write a CPU profile of the main level to this file")
	flag.Parse()
	for s := range strings.SplitSeq(sweep, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		r, err := strconv.ParseFloat(s, 64)
		if err != nil || r <= 0 {
			fmt.Fprintf(os.Stderr, "gateway: -sweep: bad rate %q\n", s)
			os.Exit(2)
		}
		cfg.sweep = append(cfg.sweep, r)
	}
	ctx, stop := signalContext()
	defer stop()
	if err := run(ctx, cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "gateway:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, cfg config, w io.Writer) error {
	b, err := newBench(cfg)
	if err != nil {
		return err
	}
	defer b.close()
	fmt.Fprintf(w, "gateway decision benchmark: %d workers, tokenizer %s, FULL_DUPLEX_STREAMED in %d-byte chunks, GOMAXPROCS %d\n",
		cfg.workers, filepath.Base(cfg.tokenizer), cfg.chunk, runtime.GOMAXPROCS(0))
	fmt.Fprintf(w, "conversations: %d in progress, history ~%d tokens, %d turns of ~%d tokens\n\n", cfg.active, cfg.historyTokens, cfg.turns, cfg.turnTokens)
	fmt.Fprintln(w, "| offered req/s | achieved req/s | requests | prompt tokens (mean) | decision p50 | p99 | max | CPU per request | errors |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|")
	main, err := b.level(ctx, cfg.rate, cfg.duration, cfg.cpuProfile)
	if err != nil {
		return err
	}
	fmt.Fprintln(w, main.row())
	best := 0.0
	if main.ok(cfg.p99Limit) {
		best = main.offered
	}
	for _, r := range cfg.sweep {
		if r <= cfg.rate {
			continue
		}
		res, err := b.level(ctx, r, cfg.sweepDuration, "")
		if err != nil {
			return err
		}
		fmt.Fprintln(w, res.row())
		if !res.ok(cfg.p99Limit) {
			break
		}
		best = r
	}
	fmt.Fprintf(w, "\nhighest offered rate sustained with decision p99 < %v: %g req/s (of the rates tried)\n", cfg.p99Limit, best)
	return nil
}

// bench is the system under test and its client.
type bench struct {
	cfg    config
	log    *slog.Logger
	set    *indexer.Set
	ingest *kvevents.Ingester
	cat    *catalog.Catalog
	loads  *scheduler.Loads
	ix     *indexer.Index
	srv    *extproc.Server
	served chan error
	envoy  *envoytest.Client
	// own tokenizes conversation histories to store them in the index: a
	// registry of its own, so that the gateway's caches start cold.
	own   *tokenize.Registry
	ids   map[string]uint64 // worker ids by endpoint
	words []string
	rand  *rand.Rand
	convs int // conversations made so far
}

func newBench(cfg config) (*bench, error) {
	b := &bench{cfg: cfg, log: slog.New(slog.NewTextHandler(io.Discard, nil)), rand: rand.New(rand.NewPCG(cfg.seed, 11))}
	words, err := proseWords()
	if err != nil {
		return nil, err
	}
	b.words = words
	models := tokenize.Config{Models: []tokenize.ModelConfig{{Name: model, Tokenizer: cfg.tokenizer, BlockSize: 16}}}
	reg, err := tokenize.NewRegistry(models, tokenize.RegistryOptions{Logger: b.log, Registerer: prometheus.NewRegistry()})
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	if b.own, err = tokenize.NewRegistry(models, tokenize.RegistryOptions{Logger: b.log, SegmentCacheBytes: -1}); err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	b.set = indexer.NewSet(indexer.Options{})
	b.ingest = kvevents.NewIngester(b.set, kvevents.IngestOptions{Logger: b.log})
	b.cat = catalog.New(b.set, listeners.New(b.ingest), nil, catalog.Options{Logger: b.log})
	b.loads = scheduler.NewLoads(scheduler.LoadOptions{})
	b.cat.Watch(b.loads.Follow)
	key := indexer.Key{Model: model, Tenant: indexer.DefaultTenant}
	b.ids = map[string]uint64{}
	for id := 1; id <= cfg.workers; id++ {
		ws := catalog.WorkerSpec{WorkerKey: catalog.WorkerKey{Key: key, ID: uint64(id)}, BlockSize: 16,
			Endpoint: fmt.Sprintf("10.0.%d.%d:8000", id/250, id%250+1), DPSize: 1}
		b.ids[ws.Endpoint] = ws.WorkerKey.ID
		if err := b.cat.PutWorker(ws); err != nil {
			b.close()
			return nil, fmt.Errorf("register worker %d: %w", id, err)
		}
	}
	if b.ix, err = b.set.Index(key, 16); err != nil {
		b.close()
		return nil, err
	}
	sched := scheduler.NewScheduler(b.cat, b.set, b.loads, scheduler.CostOptions{}, cfg.seed, nil)
	g := extproc.New(reg, b.cat, sched, extproc.Options{Logger: b.log, Registerer: prometheus.NewRegistry()})
	if b.srv, err = extproc.NewServer(g, extproc.ServerOptions{Logger: b.log, Ready: func() bool { return true }}); err != nil {
		b.close()
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.close()
		return nil, err
	}
	b.served = make(chan error, 1)
	go func() { b.served <- b.srv.Serve(ln) }()
	if b.envoy, err = envoytest.Dial(ln.Addr().String()); err != nil {
		b.close()
		return nil, err
	}
	return b, nil
}

func (b *bench) close() {
	if b.envoy != nil {
		b.envoy.Close()
	}
	if b.srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		b.srv.Shutdown(ctx)
		cancel()
		<-b.served
	}
	if b.ingest != nil {
		b.ingest.Close()
	}
	if b.set != nil {
		b.set.Close()
	}
}

//go:embed testdata/prose.txt.gz
var proseGz []byte

// proseWords returns the words of the embedded prose, in order.
func proseWords() ([]string, error) {
	zr, err := gzip.NewReader(bytes.NewReader(proseGz))
	if err != nil {
		return nil, fmt.Errorf("text source: %w", err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		return nil, fmt.Errorf("text source: %w", err)
	}
	words := strings.Fields(string(raw))
	if len(words) < 1000 {
		return nil, fmt.Errorf("text source: only %d words", len(words))
	}
	return words, nil
}

// text returns sentences of about tokens tokens (in Qwen2.5's tokenizer, a
// word of the prose with its space and its share of the full stops is about
// 1.7 tokens: technical English, with numbers and punctuation).
func (b *bench) text(tokens int) string {
	var sb strings.Builder
	n := tokens * 10 / 17
	for i := 0; i < n; {
		start := b.rand.IntN(len(b.words) - 20)
		l := 6 + b.rand.IntN(12)
		for _, wd := range b.words[start : start+l] {
			sb.WriteString(wd)
			sb.WriteByte(' ')
		}
		sb.WriteString(". ")
		i += l
	}
	return sb.String()
}

type message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// conversation is a history and its new turns' user messages and replies.
type conversation struct {
	history []message
	turns   []message // user, assistant, user, assistant, ...
	home    uint64    // the worker its previous turn went to
}

func (b *bench) conversation() conversation {
	b.convs++
	var c conversation
	c.history = append(c.history, message{"system", "You are a helpful assistant. Conversation " + strconv.Itoa(b.convs) + ". " + b.text(300)})
	const prior = 10
	for range prior {
		c.history = append(c.history, message{"user", b.text(b.cfg.historyTokens / prior / 3)}, message{"assistant", b.text(b.cfg.historyTokens * 2 / prior / 3)})
	}
	for range b.cfg.turns {
		c.turns = append(c.turns, message{"user", b.text(b.cfg.turnTokens / 4)}, message{"assistant", b.text(b.cfg.turnTokens * 3 / 4)})
	}
	return c
}

// request returns the body of turn k of c, and its messages.
func (c conversation) request(k int) ([]byte, json.RawMessage) {
	msgs, err := json.Marshal(append(slices.Clone(c.history), c.turns[:2*k+1]...))
	if err != nil {
		panic(err) // strings always encode
	}
	body := fmt.Appendf(nil, `{"model":%q,"messages":%s,"stream":true,"stream_options":{"include_usage":true},"max_tokens":200}`, model, msgs)
	return body, msgs
}

// warm routes c's previous turn (its history up to the last question)
// through the gateway, as the turns before did, and stores that prompt in
// the index on the worker the gateway chose, as its engine would have
// after prefill. It sets c.home.
func (b *bench) warm(ctx context.Context, c *conversation) error {
	msgs, err := json.Marshal(c.history[:len(c.history)-1])
	if err != nil {
		return err
	}
	body := fmt.Appendf(nil, `{"model":%q,"messages":%s,"stream":true,"max_tokens":200}`, model, msgs)
	x, err := b.envoy.Route(ctx, envoytest.Request{Path: "/v1/chat/completions", Body: body, Chunk: b.cfg.chunk, Mode: envoytest.FullDuplex})
	if err != nil {
		return fmt.Errorf("route a previous turn: %w", err)
	}
	if x.Immediate != nil {
		return fmt.Errorf("route a previous turn: refused with %d: %s", x.Immediate.GetStatus().GetCode(), x.Immediate.GetBody())
	}
	if _, err := x.Respond(envoytest.Response{Status: 200, Headers: map[string]string{"content-type": "text/event-stream"}, Body: strings.NewReader(sse)}); err != nil {
		return fmt.Errorf("respond to a previous turn: %w", err)
	}
	home, ok := b.ids[x.Headers[extproc.DestinationHeader]]
	if !ok {
		return fmt.Errorf("routed to an unknown endpoint %q", x.Headers[extproc.DestinationHeader])
	}
	c.home = home
	res, err := b.own.Tokenize(ctx, tokenize.Request{Model: model, Chat: &tokenize.ChatRequest{Messages: msgs, AddGenerationPrompt: true}})
	if err != nil {
		return fmt.Errorf("tokenize a previous turn: %w", err)
	}
	local := indexer.LocalHashes(nil, res.Tokens, 16, indexer.LoRASeed(""), nil)
	seq := indexer.SequenceHashes(nil, local)
	ev := indexer.Event{Kind: indexer.Stored, Worker: indexer.WorkerRank{Worker: c.home}, Tier: indexer.TierDevice}
	for i := range local {
		ev.Blocks = append(ev.Blocks, indexer.Block{ID: seq[i], Local: local[i]})
	}
	if _, err := b.ix.Apply(ev); err != nil {
		return fmt.Errorf("store a previous turn: %w", err)
	}
	return nil
}

// result is one level's outcome.
type result struct {
	offered, achieved float64
	requests, errors  int
	promptTokens      float64
	p50, p99, max     time.Duration
	cpuPerRequest     time.Duration
}

func (r result) ok(limit time.Duration) bool {
	return r.errors == 0 && r.p99 < limit && r.achieved >= 0.95*r.offered
}

func (r result) row() string {
	return fmt.Sprintf("| %g | %.0f | %d | %.0f | %s | %s | %s | %s | %d |", r.offered, r.achieved, r.requests, r.promptTokens,
		fmtDur(r.p50), fmtDur(r.p99), fmtDur(r.max), fmtDur(r.cpuPerRequest), r.errors)
}

func fmtDur(d time.Duration) string {
	switch {
	case d >= time.Millisecond:
		return fmt.Sprintf("%.2f ms", float64(d)/1e6)
	default:
		return fmt.Sprintf("%.0f µs", float64(d)/1e3)
	}
}

const sse = "data: {\"choices\":[{\"index\":0,\"text\":\"ok\"}]}\n\n" +
	"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":8000,\"completion_tokens\":1,\"prompt_tokens_details\":{\"cached_tokens\":7000}}}\n\n" +
	"data: [DONE]\n\n"

// level offers rate requests per second for d and measures them, with a
// CPU profile of the measured part written to profile if not "".
func (b *bench) level(ctx context.Context, rate float64, d time.Duration, profile string) (result, error) {
	n := max(1, int(rate*d.Seconds()))
	// Set up: the conversations this level needs, their histories stored,
	// and the order of the requests.
	type slot struct {
		c    conversation
		next int
	}
	var bodies [][]byte
	var sample []json.RawMessage // the messages of up to 100 requests, to count their tokens
	active := make([]*slot, 0, b.cfg.active)
	for len(bodies) < n {
		if len(active) < b.cfg.active {
			c := b.conversation()
			if err := b.warm(ctx, &c); err != nil {
				return result{}, err
			}
			active = append(active, &slot{c: c})
			continue
		}
		i := b.rand.IntN(len(active))
		s := active[i]
		body, msgs := s.c.request(s.next)
		bodies = append(bodies, body)
		if len(sample) < 100 {
			sample = append(sample, msgs)
		}
		if s.next++; s.next == b.cfg.turns {
			active = slices.Delete(active, i, i+1)
		}
	}
	var sampled float64
	for _, msgs := range sample {
		res, err := b.own.Tokenize(ctx, tokenize.Request{Model: model, Chat: &tokenize.ChatRequest{Messages: msgs, AddGenerationPrompt: true}})
		if err != nil {
			return result{}, fmt.Errorf("count prompt tokens: %w", err)
		}
		sampled += float64(len(res.Tokens))
	}
	// Arrivals: Poisson at rate.
	at := make([]time.Duration, n)
	var t float64
	for i := range at {
		t += b.rand.ExpFloat64() / rate
		at[i] = time.Duration(t * float64(time.Second))
	}
	lat := make([]time.Duration, n)
	failed := make([]bool, n)
	runtime.GC()
	if profile != "" {
		f, err := os.Create(profile)
		if err != nil {
			return result{}, err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return result{}, err
		}
		defer pprof.StopCPUProfile()
	}
	cpu0 := cpuTime()
	start := time.Now()
	var wg sync.WaitGroup
	for i := range n {
		if wait := time.Until(start.Add(at[i])); wait > 0 {
			select {
			case <-ctx.Done():
				wg.Wait()
				return result{}, ctx.Err()
			case <-time.After(wait):
			}
		}
		wg.Go(func() {
			x, err := b.envoy.Route(ctx, envoytest.Request{Path: "/v1/chat/completions", Body: bodies[i], Chunk: b.cfg.chunk, Mode: envoytest.FullDuplex})
			if err != nil || x.Immediate != nil || x.Headers[extproc.DestinationHeader] == "" {
				failed[i] = true
				if x != nil && x.Immediate == nil {
					x.Cancel()
				}
				return
			}
			lat[i] = x.Decision
			if _, err := x.Respond(envoytest.Response{Status: 200, Headers: map[string]string{"content-type": "text/event-stream"}, Body: strings.NewReader(sse)}); err != nil {
				failed[i] = true
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu := cpuTime() - cpu0
	if err := b.drained(ctx); err != nil {
		return result{}, err
	}
	res := result{offered: rate, requests: n, achieved: float64(n) / elapsed.Seconds(), cpuPerRequest: cpu / time.Duration(n)}
	var ok []time.Duration
	var promptBytes int
	for i, f := range failed {
		if f {
			res.errors++
			continue
		}
		ok = append(ok, lat[i])
		promptBytes += len(bodies[i])
	}
	slices.Sort(ok)
	if len(ok) > 0 {
		res.p50, res.p99, res.max = pct(ok, 0.50), pct(ok, 0.99), ok[len(ok)-1]
	}
	res.promptTokens = sampled / float64(len(sample))
	return res, nil
}

// drained waits until no request is booked any more (every response has
// ended its booking), or fails after a while.
func (b *bench) drained(ctx context.Context) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		n := 0
		for _, l := range b.loads.Snapshot(model, indexer.DefaultTenant) {
			n += l.Requests
		}
		if n == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d requests still booked after every response ended", n)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func pct(sorted []time.Duration, p float64) time.Duration {
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// cpuTime returns the process's user+system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// signalContext is cancelled on SIGINT or SIGTERM.
func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}
