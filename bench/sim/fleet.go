package sim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/bench/engine"
	"github.com/kvgate/kvgate/tokenize"
)

// Config describes a fleet of simulated workers. Zero fields take the
// defaults.
type Config struct {
	Workers int    // number of workers (1)
	DPSize  int    // data-parallel ranks per worker (1)
	Host    string // address every socket binds ("127.0.0.1")
	// BasePort is the HTTP port of the first worker (id FirstID); the
	// worker with id FirstID+i listens on BasePort+i. 0 picks free ports.
	BasePort int
	// EventBasePort is the KV-event PUB port of the first worker's rank 0;
	// rank r of the worker with id FirstID+i publishes on
	// EventBasePort+i*DPSize+r (so a worker's ranks follow vLLM's
	// port+rank rule). 0 picks free ports.
	EventBasePort int
	// ReplayBasePort is the same for the replay ROUTER sockets; 0 picks
	// free ports. NoReplay leaves the replay sockets out.
	ReplayBasePort int
	NoReplay       bool
	// FirstID is the first worker's id; the others follow: FirstID+1, ...
	// (default 1).
	FirstID uint64

	// Model is the served model name ("sim-model"); LoRA lists adapters
	// served under their own names.
	Model string
	LoRA  []string
	// Tokenizer is a directory with tokenizer.json (and chat template),
	// loaded through the same tokenize package as the gateway. Without it,
	// text prompts are tokenized as their UTF-8 bytes (one id per byte)
	// and chat requests are refused; token-id prompts always work.
	Tokenizer string

	Engine EngineConfig

	// The KV-event wire: Encoding (map by default, as vLLM's msgspec
	// structs are), HashEncoding, Topic and BufferSteps (replay ring).
	Encoding     engine.Encoding
	HashEncoding engine.HashEncoding
	Topic        string
	BufferSteps  int

	// MeanOutputTokens is the mean length of the answers the simulated
	// model ends on its own, for requests without max_tokens (see
	// output.go: lognormal, median about 0.61 x the mean); 0:
	// DefaultMeanOutputTokens.
	MeanOutputTokens float64

	Faults Faults
	// Seed makes output tokens and lengths and injected faults
	// reproducible.
	Seed uint64

	Logger *slog.Logger
}

// Faults are injected failures; all are off by default.
type Faults struct {
	// DropEvents is the fraction of live KV-event batches not sent on the
	// PUB socket (they stay available for replay, as a lossy link loses
	// them).
	DropEvents float64
	// FailRate is the fraction of generation requests answered with a 500.
	FailRate float64
	// Delay is added before every generation response starts.
	Delay time.Duration
	// RestartEvery restarts one worker's engine (round robin) at this
	// wall-clock period: its requests fail, its cache empties, and its
	// publishers come back on the same ports with sequence numbers from 0.
	RestartEvery time.Duration
}

func (c *Config) normalize() error {
	if c.Workers == 0 {
		c.Workers = 1
	}
	if c.DPSize == 0 {
		c.DPSize = 1
	}
	if c.Host == "" {
		c.Host = "127.0.0.1"
	}
	if c.FirstID == 0 {
		c.FirstID = 1
	}
	if c.Model == "" {
		c.Model = "sim-model"
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.MeanOutputTokens == 0 {
		c.MeanOutputTokens = DefaultMeanOutputTokens
	}
	if !(c.MeanOutputTokens >= 1) || math.IsInf(c.MeanOutputTokens, 0) {
		return fmt.Errorf("sim: mean output tokens %v: must be at least 1", c.MeanOutputTokens)
	}
	if c.Workers < 1 || c.DPSize < 1 {
		return fmt.Errorf("sim: workers and dp size must be positive (got %d, %d)", c.Workers, c.DPSize)
	}
	for _, p := range []struct {
		name string
		v    int
	}{{"base port", c.BasePort}, {"event base port", c.EventBasePort}, {"replay base port", c.ReplayBasePort}} {
		last := p.v + c.Workers*c.DPSize
		if p.v < 0 || (p.v > 0 && last > 65535) {
			return fmt.Errorf("sim: %s %d: ports up to %d do not exist", p.name, p.v, last)
		}
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"drop events", c.Faults.DropEvents}, {"fail rate", c.Faults.FailRate}} {
		if f.v < 0 || f.v > 1 || math.IsNaN(f.v) {
			return fmt.Errorf("sim: %s %v not in [0, 1]", f.name, f.v)
		}
	}
	if c.Faults.Delay < 0 || c.Faults.RestartEvery < 0 {
		return errors.New("sim: delay and restart period must not be negative")
	}
	if err := c.Engine.normalize(); err != nil {
		return fmt.Errorf("sim: %w", err)
	}
	return nil
}

// Fleet is a set of simulated workers, each with its HTTP server, its DP
// ranks' engines and their KV-event publishers. Start it with Start; Close
// stops everything it started.
type Fleet struct {
	cfg     Config
	reg     *tokenize.Registry // nil without a tokenizer
	workers []*Worker
	cancel  context.CancelFunc
	wg      sync.WaitGroup

	closeOnce sync.Once
	closeErr  error
}

// Worker is one simulated engine process: an OpenAI-compatible HTTP server
// in front of DPSize ranks.
type Worker struct {
	// ID is the worker's id as a router registers it.
	ID    uint64
	fleet *Fleet
	index int
	ranks []*Rank
	url   string
	srv   *http.Server
	ln    net.Listener
	m     *workerMetrics
	ids   atomic.Uint64 // response ids

	events, replays []string // per rank
	pubCfg          []engine.Config

	mu      sync.Mutex // guards rng and restarts
	rng     uint64
	restart int // restarts so far
}

// Start starts a fleet. ctx bounds only the start; the fleet runs until
// Close.
func Start(ctx context.Context, cfg Config) (*Fleet, error) {
	if err := cfg.normalize(); err != nil {
		return nil, err
	}
	f := &Fleet{cfg: cfg}
	if cfg.Tokenizer != "" {
		reg, err := tokenize.NewRegistry(tokenize.Config{Models: []tokenize.ModelConfig{{
			Name: cfg.Model, LoRA: cfg.LoRA, Tokenizer: cfg.Tokenizer,
			BlockSize: cfg.Engine.BlockSize, Fallbacks: []tokenize.Path{tokenize.PathLocal},
		}}}, tokenize.RegistryOptions{Strict: true, Logger: cfg.Logger})
		if err != nil {
			return nil, fmt.Errorf("sim: %w", err)
		}
		f.reg = reg
	}
	runCtx, cancel := context.WithCancel(context.Background())
	f.cancel = cancel
	for i := range cfg.Workers {
		w, err := f.startWorker(ctx, runCtx, i)
		if err != nil {
			_ = f.Close()
			return nil, fmt.Errorf("sim: worker %d: %w", i, err)
		}
		f.workers = append(f.workers, w)
	}
	if cfg.Faults.RestartEvery > 0 {
		f.wg.Go(func() { f.restarts(runCtx) })
	}
	return f, nil
}

func port(base, offset int) int {
	if base == 0 {
		return 0
	}
	return base + offset
}

func (f *Fleet) startWorker(ctx, runCtx context.Context, i int) (*Worker, error) {
	cfg := f.cfg
	w := &Worker{ID: cfg.FirstID + uint64(i), fleet: f, index: i, rng: cfg.Seed ^ (uint64(i)+1)*0x9e3779b97f4a7c15}
	for r := range cfg.DPSize {
		rank := r
		pc := engine.Config{
			Endpoint:     "tcp://" + net.JoinHostPort(cfg.Host, strconv.Itoa(port(cfg.EventBasePort, i*cfg.DPSize+r))),
			Topic:        cfg.Topic,
			BufferSteps:  cfg.BufferSteps,
			Encoding:     cfg.Encoding,
			HashEncoding: cfg.HashEncoding,
			Rank:         &rank,
		}
		if !cfg.NoReplay {
			pc.ReplayEndpoint = "tcp://" + net.JoinHostPort(cfg.Host, strconv.Itoa(port(cfg.ReplayBasePort, i*cfg.DPSize+r)))
		}
		if cfg.Faults.DropEvents > 0 {
			pc.Drop = dropper(cfg.Seed, uint64(i*cfg.DPSize+r), cfg.Faults.DropEvents)
		}
		pub, err := engine.NewPublisher(ctx, pc)
		if err != nil {
			w.close()
			return nil, err
		}
		// Restarts bind the same ports again.
		pc.Endpoint, pc.ReplayEndpoint = pub.Endpoint(), pub.ReplayEndpoint()
		w.pubCfg = append(w.pubCfg, pc)
		w.events = append(w.events, pub.Endpoint())
		w.replays = append(w.replays, pub.ReplayEndpoint())
		w.ranks = append(w.ranks, newRank(cfg.Engine, r, pub))
	}
	w.m = newWorkerMetrics(w)
	ln, err := net.Listen("tcp", net.JoinHostPort(cfg.Host, strconv.Itoa(port(cfg.BasePort, i))))
	if err != nil {
		w.close()
		return nil, err
	}
	w.ln = ln
	w.url = "http://" + ln.Addr().String()
	w.srv = &http.Server{Handler: w.handler(), ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelWarn)}
	for _, rk := range w.ranks {
		f.wg.Go(func() { rk.run(runCtx, w.m.published) })
	}
	f.wg.Go(func() {
		if err := w.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			cfg.Logger.Error("sim worker HTTP server failed", "worker", w.ID, "err", err)
		}
	})
	cfg.Logger.Info("sim worker started", "worker", w.ID, "url", w.url, "events", w.events, "replay", w.replays)
	return w, nil
}

// dropper returns a publisher Drop function dropping about frac of the
// batches, decided by a hash of (seed, stream, seq): reproducible and
// lock-free.
func dropper(seed, stream uint64, frac float64) func(uint64) bool {
	return func(seq uint64) bool {
		return float64(mix(seed^mix(stream+1)^seq)>>11)/(1<<53) < frac
	}
}

// mix is splitmix64's finalizer.
func mix(z uint64) uint64 {
	z += 0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// restarts restarts one worker per period, round robin, until ctx ends.
func (f *Fleet) restarts(ctx context.Context) {
	t := time.NewTicker(f.cfg.Faults.RestartEvery)
	defer t.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		w := f.workers[i%len(f.workers)]
		if err := w.Restart(ctx); err != nil {
			f.cfg.Logger.Error("sim worker restart failed", "worker", w.ID, "err", err)
		}
	}
}

// Workers returns the fleet's workers, in id order.
func (f *Fleet) Workers() []*Worker { return f.workers }

// Config returns the fleet's configuration, defaults filled in.
func (f *Fleet) Config() Config { return f.cfg }

// Close stops every worker: HTTP servers, step loops and publishers.
// Requests in flight fail with ErrStopped. Later calls return the first
// call's result.
func (f *Fleet) Close() error {
	f.closeOnce.Do(func() {
		if f.cancel != nil {
			f.cancel()
		}
		var errs []error
		for _, w := range f.workers {
			errs = append(errs, w.close())
		}
		f.wg.Wait()
		f.closeErr = errors.Join(errs...)
	})
	return f.closeErr
}

func (w *Worker) close() error {
	var errs []error
	for _, r := range w.ranks {
		r.stop()
	}
	if w.srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := w.srv.Shutdown(ctx); err != nil {
			errs = append(errs, w.srv.Close())
		}
	} else if w.ln != nil {
		errs = append(errs, w.ln.Close())
	}
	for _, r := range w.ranks {
		r.mu.Lock()
		pub := r.pub
		r.pub = nil
		r.mu.Unlock()
		if pub != nil {
			errs = append(errs, pub.Close())
		}
	}
	return errors.Join(errs...)
}

// URL is the worker's HTTP base URL, e.g. "http://127.0.0.1:8000".
func (w *Worker) URL() string { return w.url }

// Ranks returns the worker's DP ranks, rank 0 first.
func (w *Worker) Ranks() []*Rank { return w.ranks }

// EventEndpoints returns each rank's KV-event PUB endpoint.
func (w *Worker) EventEndpoints() []string { return w.events }

// ReplayEndpoints returns each rank's replay endpoint ("" without replay).
func (w *Worker) ReplayEndpoints() []string { return w.replays }

// WaitSubscribed waits until every rank's publisher has a subscriber, so
// that no live batch is published before a router listens.
func (w *Worker) WaitSubscribed(ctx context.Context) error {
	for r, rk := range w.ranks {
		rk.mu.Lock()
		pub := rk.pub
		rk.mu.Unlock()
		if pub == nil {
			return fmt.Errorf("worker %d rank %d: stopped", w.ID, r)
		}
		if err := pub.WaitSubscribed(ctx); err != nil {
			return fmt.Errorf("worker %d rank %d: %w", w.ID, r, err)
		}
	}
	return nil
}

// Restart simulates an engine restart: every request in flight fails with
// ErrRestarted, the caches empty without events, and the publishers are
// replaced by new ones on the same ports, numbering batches from 0 again.
func (w *Worker) Restart(ctx context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	var errs []error
	for r, rk := range w.ranks {
		rk.mu.Lock()
		old := rk.pub
		rk.pub = nil
		rk.mu.Unlock()
		if old == nil {
			return fmt.Errorf("restart worker %d: stopped", w.ID)
		}
		if err := old.Close(); err != nil {
			errs = append(errs, err)
		}
		pub, err := engine.NewPublisher(ctx, w.pubCfg[r])
		if err != nil {
			return fmt.Errorf("restart worker %d rank %d: %w", w.ID, r, err)
		}
		rk.restart(pub)
	}
	w.restart++
	return errors.Join(errs...)
}

// servedModel reports whether name is the fleet's model or one of its
// adapters, and which adapter ("" for the base model).
func (w *Worker) servedModel(name string) (lora string, ok bool) {
	if name == w.fleet.cfg.Model {
		return "", true
	}
	for _, l := range w.fleet.cfg.LoRA {
		if name == l {
			return l, true
		}
	}
	return "", false
}

// tokenize turns a text or chat prompt into ids, with the fleet's
// tokenizer or, without one, one id per UTF-8 byte of the text. Errors
// wrap tokenize.ErrBadRequest, tokenize.ErrNoChatTemplate or are a
// *tokenize.TemplateError for requests the engine refuses.
func (w *Worker) tokenize(ctx context.Context, req tokenize.Request) ([]uint32, error) {
	if w.fleet.reg != nil {
		res, err := w.fleet.reg.Tokenize(ctx, req)
		if err != nil {
			return nil, err
		}
		return res.Tokens, nil
	}
	if req.Chat != nil {
		return nil, fmt.Errorf("%w: model %q has no tokenizer, so no chat template; send a completion with token ids or start the simulator with a tokenizer", tokenize.ErrNoChatTemplate, req.Model)
	}
	ids := make([]uint32, len(req.Text))
	for i := range len(req.Text) {
		ids[i] = uint32(req.Text[i])
	}
	return ids, nil
}

// pickRank returns the rank a request goes to: the one named by vLLM's
// X-data-parallel-rank header, or else the least loaded (4 x waiting +
// running, as vLLM's DP balancer weighs them; lowest rank on ties).
func (w *Worker) pickRank(header string) (*Rank, error) {
	if header != "" {
		r, err := strconv.Atoi(header)
		if err != nil || r < 0 || r >= len(w.ranks) {
			return nil, fmt.Errorf("X-data-parallel-rank %q: want a rank in [0, %d)", header, len(w.ranks))
		}
		return w.ranks[r], nil
	}
	best, bestLoad := w.ranks[0], w.ranks[0].load()
	for _, r := range w.ranks[1:] {
		if l := r.load(); l < bestLoad {
			best, bestLoad = r, l
		}
	}
	return best, nil
}

// fault draws whether this request fails (Faults.FailRate) and a seed for
// its output tokens.
func (w *Worker) fault() (fail bool, seed uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.rng = mix(w.rng)
	seed = w.rng
	return float64(seed>>11)/(1<<53) < w.fleet.cfg.Faults.FailRate, seed
}
