package extproc

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/indexer"
	"github.com/kvgate/kvgate/scheduler"
	"github.com/kvgate/kvgate/scheduler/catalog"
	"github.com/kvgate/kvgate/tokenize"
)

// Options configure a Gateway. Zero values take the defaults.
type Options struct {
	// Tenant is the tenant of every routed request (default
	// indexer.DefaultTenant).
	Tenant string
	// Fallbacks is how many next-best endpoints follow the chosen one.
	Fallbacks int
	// MaxRequestsPerRank sheds requests (429) when every candidate rank
	// already has this many active requests; 0: no limit.
	MaxRequestsPerRank int
	// DefaultModel routes requests without a body (load only).
	DefaultModel string
	// Policy is how ranks are picked (default PolicyKV); the others are
	// baselines for comparison. Seed seeds their random choices.
	Policy     Policy
	Seed       uint64
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// Gateway decides where OpenAI requests go and accounts them until they
// finish. The ext_proc server and the embedded proxy are two fronts over
// one Gateway. It is safe for concurrent use.
type Gateway struct {
	reg   *tokenize.Registry
	cat   *catalog.Catalog
	sched *scheduler.Scheduler
	loads *scheduler.Loads
	opts  Options
	log   *slog.Logger
	m     *metrics
	seq   atomic.Uint64 // booking id suffixes
	base  *baseline     // nil for PolicyKV
}

// New returns a gateway deciding with sched over cat's workers and
// tokenizing with reg.
func New(reg *tokenize.Registry, cat *catalog.Catalog, sched *scheduler.Scheduler, opts Options) *Gateway {
	if opts.Tenant == "" {
		opts.Tenant = indexer.DefaultTenant
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	g := &Gateway{reg: reg, cat: cat, sched: sched, loads: sched.Loads(), opts: opts, log: opts.Logger, m: newMetrics(opts.Registerer)}
	if opts.Policy != "" && opts.Policy != PolicyKV {
		g.base = newBaseline(opts.Policy, opts.Seed)
	}
	return g
}

// PathIDs is Route.Path for a completion whose client sent token ids:
// nothing was tokenized.
const PathIDs tokenize.Path = "ids"

// Route is a routed request: where it goes, and its booking until Finish.
type Route struct {
	// ID is the request id (x-request-id, or one made up).
	ID string
	// Endpoint is the chosen worker's host:port; Fallbacks the next best.
	Endpoint  string
	Fallbacks []string
	// Rank is the chosen DP rank; SetRank says the worker has several,
	// so the X-data-parallel-rank header must name it.
	Rank    uint32
	SetRank bool
	Worker  uint64
	// Path is the tokenization path used ("" for load-only routing).
	Path tokenize.Path
	// CachedBlocks is the chosen rank's device-tier prefix, in blocks.
	CachedBlocks int
	Blocks       int

	fallbackPicks []pick // the worker ranks behind Fallbacks, in order

	g        *Gateway
	key      indexer.Key
	booking  string
	started  time.Time
	prefill  atomic.Bool
	finished atomic.Bool
}

// Decide routes one request: p is its parsed body (nil for a request
// without one), subset the endpoints the proxy allows (nil: any), id its
// x-request-id ("" to make one up). The request is booked on the chosen
// rank until Finish.
func (g *Gateway) Decide(ctx context.Context, p *Prompt, subset []string, id string) (*Route, *Error) {
	start := time.Now()
	r, e := g.decide(ctx, p, subset, id)
	outcome := "routed"
	if e != nil {
		outcome = strconv.Itoa(e.Status)
	}
	g.m.decisions.WithLabelValues(outcome).Inc()
	g.m.latency.Observe(time.Since(start).Seconds())
	return r, e
}

func (g *Gateway) decide(ctx context.Context, p *Prompt, subset []string, id string) (*Route, *Error) {
	if id == "" {
		id = newID()
	}
	model := g.opts.DefaultModel
	if p == nil {
		p = &Prompt{LoadOnly: true}
	} else {
		model = p.Model
	}
	r := &Route{ID: id, g: g}
	var local []uint64
	var isl int64
	key := indexer.Key{Model: model, Tenant: g.opts.Tenant}
	switch {
	case p.LoadOnly:
		isl = int64(p.Bytes / 4) // about a token per 4 bytes
	default:
		req := p.Tokenize
		res, err := g.tokenize(ctx, req, p.IDs)
		if err != nil {
			return nil, tokenizeError(err)
		}
		key.Model, r.Path = res.Model, res.Path
		switch {
		case res.Approx != nil:
			local, isl = res.Approx, int64(len(p.Tokenize.Text)/4)
		default:
			local = indexer.LocalHashes(nil, res.Tokens, res.BlockSize, indexer.LoRASeed(res.LoRA), nil)
			isl = int64(len(res.Tokens))
		}
	}
	targets := g.cat.Targets(key)
	if len(targets) == 0 {
		return nil, errorf(http.StatusServiceUnavailable, "no ready worker serves model %q", key.Model)
	}
	allowed, e := g.candidates(key, targets, subset)
	if e != nil {
		return nil, e
	}
	r.key = key
	r.booking = id + "#" + strconv.FormatUint(g.seq.Add(1), 36)
	var wr indexer.WorkerRank
	best := -1 // the longest cached prefix of any rank; unknown to the baselines
	if g.base != nil {
		var e *Error
		if wr, e = g.pickBaseline(key, targets, allowed, p, local, isl, r.booking); e != nil {
			return nil, e
		}
	} else {
		d, err := g.sched.Select(scheduler.SelectRequest{Key: key, Local: local, ISL: isl, Workers: allowed, Reserve: true, ReservationID: r.booking, ChargeReuse: true})
		if err != nil {
			if errors.Is(err, scheduler.ErrUnavailable) {
				return nil, errorf(http.StatusServiceUnavailable, "no ready worker serves model %q", key.Model)
			}
			return nil, errorf(http.StatusInternalServerError, "routing failed: %v", err)
		}
		wr, r.CachedBlocks, best = d.Worker, int(d.Overlap.Device), d.BestDevice
	}
	r.Worker, r.Rank, r.Blocks = wr.Worker, wr.Rank, len(local)
	r.started = time.Now()
	for _, t := range targets {
		if t.ID == wr.Worker {
			r.Endpoint, r.SetRank = HostPort(t.Endpoint), t.Ranks > 1
		}
	}
	if r.Endpoint == "" {
		r.Finish()
		return nil, errorf(http.StatusServiceUnavailable, "worker %d of model %q has no endpoint to send requests to", wr.Worker, key.Model)
	}
	if g.base == nil {
		r.fallbackPicks = g.fallbacks(key, local, isl, allowed, targets, wr.Worker)
		for _, p := range r.fallbackPicks {
			r.Fallbacks = append(r.Fallbacks, p.endpoint)
		}
	}
	g.m.routed.WithLabelValues(key.Model, strconv.FormatUint(r.Worker, 10)).Inc()
	g.log.Debug("routed", "id", id, "model", key.Model, "worker", r.Worker, "rank", r.Rank, "endpoint", r.Endpoint,
		"cached_blocks", r.CachedBlocks, "best_cached_blocks", best, "blocks", r.Blocks, "path", r.Path)
	return r, nil
}

// pickBaseline picks a rank with a baseline policy among the ranks of the
// allowed targets (every target when allowed is nil) under the load limit,
// and books the request there, without cache credit.
func (g *Gateway) pickBaseline(key indexer.Key, targets []catalog.Target, allowed []uint64, p *Prompt, local []uint64, isl int64, booking string) (indexer.WorkerRank, *Error) {
	all := g.loads.Snapshot(key.Model, key.Tenant)
	if g.base.policy == PolicyPrefixHash && g.seq.Load()%1024 == 0 {
		g.base.forget(key, all) // now and then, the chunks of ranks gone
	}
	cands := all[:0:0]
	for _, l := range all {
		if l.Key != key || (allowed != nil && !slices.Contains(allowed, l.Worker.Worker)) ||
			!slices.ContainsFunc(targets, func(t catalog.Target) bool { return t.ID == l.Worker.Worker }) {
			continue
		}
		if limit := g.opts.MaxRequestsPerRank; limit > 0 && l.Requests >= limit {
			continue
		}
		cands = append(cands, l)
	}
	if len(cands) == 0 {
		return indexer.WorkerRank{}, errorf(http.StatusServiceUnavailable, "no ready worker serves model %q", key.Model)
	}
	wr := g.base.pick(key, cands, promptBytes(p))
	b := scheduler.Booking{ID: booking, Worker: wr, Hashes: indexer.SequenceHashes(nil, local), PrefillTokens: isl}
	if err := g.loads.Add(key, b); err != nil {
		return indexer.WorkerRank{}, errorf(http.StatusServiceUnavailable, "cannot book the request on worker %d: %v", wr.Worker, err)
	}
	return wr, nil
}

// tokenize returns the prompt's tokens: the client's ids as they are (an
// engine does not re-tokenize them), else the registry's.
func (g *Gateway) tokenize(ctx context.Context, req tokenize.Request, ids []uint32) (tokenize.Result, error) {
	if ids == nil {
		return g.reg.Tokenize(ctx, req)
	}
	info, err := g.reg.Lookup(req.Model)
	if err != nil {
		return tokenize.Result{}, err
	}
	info.Tokens, info.Path = ids, PathIDs
	return info, nil
}

func tokenizeError(err error) *Error {
	var te *tokenize.TemplateError
	switch {
	case errors.Is(err, tokenize.ErrUnknownModel):
		return errorf(http.StatusNotFound, "The model does not exist: %v", err)
	case errors.As(err, &te), errors.Is(err, tokenize.ErrBadRequest), errors.Is(err, tokenize.ErrNoChatTemplate):
		return errorf(http.StatusBadRequest, "%v", err)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return errorf(http.StatusServiceUnavailable, "request ended while tokenizing: %v", err)
	}
	return errorf(http.StatusServiceUnavailable, "cannot tokenize: %v", err)
}

// candidates returns the worker ids allowed by the subset hint (nil: all)
// and under the load limit, or the error when none is.
func (g *Gateway) candidates(key indexer.Key, targets []catalog.Target, subset []string) ([]uint64, *Error) {
	var allowed []uint64
	if subset != nil {
		want := make(map[string]bool, len(subset))
		for _, s := range subset {
			want[HostPort(s)] = true
		}
		for _, t := range targets {
			if want[HostPort(t.Endpoint)] {
				allowed = append(allowed, t.ID)
			}
		}
		if len(allowed) == 0 {
			return nil, errorf(http.StatusServiceUnavailable, "no ready worker of model %q among the %d endpoints of the subset hint", key.Model, len(subset))
		}
	}
	if limit := g.opts.MaxRequestsPerRank; limit > 0 {
		busy := map[uint64]int{} // ranks at the limit, per worker
		for _, l := range g.loads.Snapshot(key.Model, key.Tenant) {
			if l.Requests >= limit {
				busy[l.Worker.Worker]++
			}
		}
		var open []uint64
		for _, t := range targets {
			if (allowed == nil || slices.Contains(allowed, t.ID)) && busy[t.ID] < max(t.Ranks, 1) {
				open = append(open, t.ID)
			}
		}
		if len(open) == 0 {
			g.m.shed.WithLabelValues(key.Model).Inc()
			return nil, errorf(http.StatusTooManyRequests, "every worker of model %q is at its limit of %d active requests per rank", key.Model, limit)
		}
		allowed = open
	}
	return allowed, nil
}

// fallbacks returns up to Options.Fallbacks next-best worker ranks: the
// decision repeated without the workers already chosen (no booking).
func (g *Gateway) fallbacks(key indexer.Key, local []uint64, isl int64, allowed []uint64, targets []catalog.Target, chosen uint64) []pick {
	n := g.opts.Fallbacks
	if n <= 0 {
		return nil
	}
	pool := allowed
	if pool == nil {
		for _, t := range targets {
			pool = append(pool, t.ID)
		}
	}
	pool = slices.DeleteFunc(slices.Clone(pool), func(id uint64) bool { return id == chosen })
	var out []pick
	for len(out) < n && len(pool) > 0 {
		d, err := g.sched.Select(scheduler.SelectRequest{Key: key, Local: local, ISL: isl, Workers: pool, ChargeReuse: true})
		if err != nil {
			break
		}
		pool = slices.DeleteFunc(pool, func(id uint64) bool { return id == d.Worker.Worker })
		if ep := HostPort(d.Endpoint); ep != "" {
			p := pick{endpoint: ep, worker: d.Worker.Worker, rank: d.Worker.Rank}
			for _, t := range targets {
				if t.ID == p.worker {
					p.setRank = t.Ranks > 1
				}
			}
			out = append(out, p)
		}
	}
	return out
}

// PrefillDone records the request's first output (its prefill is done).
// Later calls do nothing.
func (r *Route) PrefillDone() {
	if r == nil || r.finished.Load() || !r.prefill.CompareAndSwap(false, true) {
		return
	}
	if err := r.g.loads.PrefillComplete(r.key, r.booking); err != nil {
		r.g.log.Debug("prefill complete", "id", r.ID, "err", err) // expired or freed meanwhile
	}
	r.g.m.ttft.WithLabelValues(r.key.Model).Observe(time.Since(r.started).Seconds())
}

// Finish frees the request's load: the response ended, failed or the
// client left. Later calls do nothing.
func (r *Route) Finish() {
	if r == nil || r.booking == "" || !r.finished.CompareAndSwap(false, true) {
		return
	}
	if _, err := r.g.loads.Free(r.key, r.booking); err != nil {
		r.g.log.Debug("free", "id", r.ID, "err", err)
	}
}

// Usage records a response's token usage.
func (r *Route) Usage(u Usage) {
	if r == nil {
		return
	}
	w := strconv.FormatUint(r.Worker, 10)
	r.g.m.tokens.WithLabelValues(r.key.Model, w, "prompt").Add(float64(u.PromptTokens))
	r.g.m.tokens.WithLabelValues(r.key.Model, w, "cached").Add(float64(u.CachedTokens))
	r.g.m.tokens.WithLabelValues(r.key.Model, w, "completion").Add(float64(u.CompletionTokens))
	k := modelWorker{r.key.Model, w}
	r.g.m.mu.Lock()
	t := r.g.m.usage[k]
	t.prompt += u.PromptTokens
	t.cached += u.CachedTokens
	r.g.m.usage[k] = t
	r.g.m.mu.Unlock()
}

// Usage is the "usage" object of an OpenAI response.
type Usage struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	CachedTokens     int64 `json:"-"`
}

// usageScanner finds the last "usage" object in a response body, streamed
// (SSE "data:" lines) or not, reading it chunk by chunk with bounded
// memory: it keeps only the current line (SSE) or up to maxUsageBody bytes.
type usageScanner struct {
	buf   []byte
	found *Usage
	sse   bool
	over  bool
}

const maxUsageBody = 4 << 20

func (s *usageScanner) write(chunk []byte) {
	if s.sse {
		s.buf = append(s.buf, chunk...)
		for {
			i := bytes.IndexByte(s.buf, '\n')
			if i < 0 {
				break
			}
			s.line(s.buf[:i])
			s.buf = s.buf[i+1:]
		}
		if len(s.buf) > maxUsageBody {
			s.buf = s.buf[:0] // a line this long is not usage
		}
		return
	}
	if s.over || len(s.buf)+len(chunk) > maxUsageBody {
		s.over, s.buf = true, nil
		return
	}
	s.buf = append(s.buf, chunk...)
}

func (s *usageScanner) line(l []byte) {
	data, ok := bytes.CutPrefix(bytes.TrimSpace(l), []byte("data:"))
	if !ok || !bytes.Contains(data, []byte(`"usage"`)) {
		return
	}
	if u := parseUsage(bytes.TrimSpace(data)); u != nil {
		s.found = u
	}
}

// result returns the usage found, if any, once the body ended.
func (s *usageScanner) result() *Usage {
	if s.sse {
		if len(s.buf) > 0 {
			s.line(s.buf)
		}
		return s.found
	}
	if s.over {
		return nil
	}
	return parseUsage(s.buf)
}

func parseUsage(doc []byte) *Usage {
	var v struct {
		Usage *struct {
			Usage
			Details *struct {
				Cached int64 `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if json.Unmarshal(doc, &v) != nil || v.Usage == nil {
		return nil
	}
	u := v.Usage.Usage
	if v.Usage.Details != nil {
		u.CachedTokens = v.Usage.Details.Cached
	}
	return &u
}

// HostPort reduces an endpoint (URL or host:port) to host:port:
// "http://h:8000/v1" -> "h:8000".
func HostPort(ep string) string {
	if _, rest, ok := strings.Cut(ep, "://"); ok {
		ep = rest
	}
	ep, _, _ = strings.Cut(ep, "/")
	return ep
}

// newID returns 32 random hex digits, like a uuid4 without dashes.
func newID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("extproc: crypto/rand: %v", err)) // never fails on supported platforms
	}
	return hex.EncodeToString(b[:])
}

type metrics struct {
	decisions *prometheus.CounterVec
	latency   prometheus.Histogram
	routed    *prometheus.CounterVec
	shed      *prometheus.CounterVec
	ttft      *prometheus.HistogramVec
	tokens    *prometheus.CounterVec
	streams   *prometheus.CounterVec

	mu    sync.Mutex
	usage map[modelWorker]struct{ prompt, cached int64 }
}

type modelWorker struct{ model, worker string }

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		usage: make(map[modelWorker]struct{ prompt, cached int64 }),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_gateway_decisions_total",
			Help: "Routing decisions, by outcome (routed, or the HTTP status of the refusal)."}, []string{"outcome"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kvgate_gateway_decision_duration_seconds",
			Help:    "Time from a complete request body to the decision: parsing, tokenization, hashing, selection.",
			Buckets: prometheus.ExponentialBuckets(25e-6, 2, 16)}),
		routed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_gateway_requests_routed_total",
			Help: "Requests routed, by model and worker."}, []string{"model", "worker"}),
		shed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_gateway_requests_shed_total",
			Help: "Requests refused with 429: every candidate at its load limit."}, []string{"model"}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kvgate_gateway_time_to_first_byte_seconds",
			Help:    "Time from the decision to the first response body byte (prefill done).",
			Buckets: prometheus.ExponentialBuckets(1e-3, 2, 16)}, []string{"model"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_gateway_usage_tokens_total",
			Help: "Tokens reported in responses' usage, by model, worker and kind (prompt, cached, completion). cached/prompt is the KV hit ratio."},
			[]string{"model", "worker", "kind"}),
		streams: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_gateway_streams_total",
			Help: "Requests handled, by front (ext_proc, proxy) and how they ended (completed, cancelled, error, refused)."}, []string{"front", "end"}),
	}
	if reg != nil {
		reg.MustRegister(m.decisions, m.latency, m.routed, m.shed, m.ttft, m.tokens, m.streams, hitRatio{m})
	}
	return m
}

// hitRatio exports kvgate_gateway_kv_hit_ratio per model and worker:
// cached over prompt tokens of the usage reported so far.
type hitRatio struct{ m *metrics }

var hitDesc = prometheus.NewDesc("kvgate_gateway_kv_hit_ratio",
	"Cached prompt tokens over prompt tokens in responses' usage, since start, by model and worker.", []string{"model", "worker"}, nil)

func (h hitRatio) Describe(ch chan<- *prometheus.Desc) { ch <- hitDesc }

func (h hitRatio) Collect(ch chan<- prometheus.Metric) {
	h.m.mu.Lock()
	defer h.m.mu.Unlock()
	for k, u := range h.m.usage {
		if u.prompt > 0 {
			ch <- prometheus.MustNewConstMetric(hitDesc, prometheus.GaugeValue, float64(u.cached)/float64(u.prompt), k.model, k.worker)
		}
	}
}
