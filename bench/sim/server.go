package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvgate/kvgate/tokenize"
)

// The worker's HTTP API is the part of vLLM's OpenAI-compatible server a
// router and a load generator use, with vLLM's request fields, defaults,
// response shapes and errors:
//
//   - POST /v1/completions: prompt as a string, a list of token ids, or a
//     list holding exactly one of either (more prompts: 400); max_tokens
//     (default 16), n (only 1), seed, add_special_tokens (default true),
//     stream and stream_options (include_usage, continuous_usage_stats).
//   - POST /v1/chat/completions: messages rendered by the fleet's chat
//     template (tools, documents, add_generation_prompt (default true),
//     continue_final_message, chat_template_kwargs); max_completion_tokens
//     or max_tokens (default: the rest of the context, as vLLM), n, seed,
//     stream and stream_options. Streams start with a {"role":"assistant",
//     "content":""} delta, sent with the first output as vLLM does.
//
// Output length: a request with max_tokens (or max_completion_tokens)
// gets exactly that many tokens, finish_reason "length", as a load
// generator's request with ignore_eos does; trace replays rely on it.
// Without it the simulated model ends its answer on its own after a
// length drawn per request (output.go; Config.MeanOutputTokens), with
// finish_reason "stop", unless the default limit above (16 tokens for a
// completion, the context for a chat) cuts it first ("length").
//   - POST /tokenize, GET /v1/models, GET /health, POST
//     /reset_prefix_cache (409 while requests run) and GET /metrics (vLLM's
//     v1 engine metrics per rank, labelled model_name and engine, plus the
//     simulator's own kvgate_sim_* counters).
//
// Every response carries usage with prompt_tokens_details.cached_tokens
// (the prompt tokens found in the prefix cache), as vLLM does with
// --enable-prompt-tokens-details. Streams send one chunk per batch of new
// tokens, an optional usage chunk, then "data: [DONE]"; an engine failure
// mid-stream sends an error chunk before [DONE], as vLLM does.
//
// The engine produces token ids only, so output text is made from them:
// id i becomes simWords[i % len(simWords)] (" lorem", " ipsum", ...),
// which makes the text deterministic for a given seed.
//
// Errors use vLLM's ErrorResponse, {"error": {"message", "type", "param",
// "code"}}, with the matching status: 400 for malformed or invalid
// requests (prompt too long included), 404 for an unknown model, 405 for a
// wrong method, 413 for a body over 32 MiB, 500 for injected failures and
// engine restarts, 503 once the engine stopped.
//
// The X-data-parallel-rank header sends a request to that rank (an invalid
// rank is a 400); without it the least loaded rank takes it. Faults.Delay
// holds every generation request before it reaches the engine, and
// Faults.FailRate answers that fraction of them with a 500 instead.

// maxBody caps request bodies.
const maxBody = 32 << 20

// simWords is the vocabulary of the output text, one word per token id.
var simWords = [...]string{
	" lorem", " ipsum", " dolor", " sit", " amet", " consectetur", " adipiscing", " elit",
	" sed", " do", " eiusmod", " tempor", " incididunt", " ut", " labore", " et",
	" dolore", " magna", " aliqua", " enim", " ad", " minim", " veniam", " quis",
	" nostrud", " exercitation", " ullamco", " laboris", " nisi", " aliquip", " ex", " ea",
	" commodo", " consequat", " duis", " aute", " irure", " in", " reprehenderit", " voluptate",
	" velit", " esse", " cillum", " eu", " fugiat", " nulla", " pariatur", " excepteur",
	" sint", " occaecat", " cupidatat", " non", " proident", " sunt", " culpa", " qui",
	" officia", " deserunt", " mollit", " anim", " id", " est", " laborum", " at",
}

// detokenize is the simulator's text for output token ids.
func detokenize(ids []uint32) string {
	var b strings.Builder
	for _, id := range ids {
		b.WriteString(simWords[id%uint32(len(simWords))])
	}
	return b.String()
}

// ---- metrics ----

// workerMetrics is a worker's Prometheus registry: vLLM's engine metrics,
// read from the ranks at scrape time, and the simulator's event counters.
type workerMetrics struct {
	reg           *prometheus.Registry
	events        prometheus.Counter
	batches       prometheus.Counter
	publishErrors prometheus.Counter
	lostEvents    prometheus.Counter
}

func newWorkerMetrics(w *Worker) *workerMetrics {
	m := &workerMetrics{
		reg: prometheus.NewRegistry(),
		events: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvgate_sim_events_published_total",
			Help: "KV cache events published (in batches the publisher accepted).",
		}),
		batches: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvgate_sim_event_batches_published_total",
			Help: "KV event batches published.",
		}),
		publishErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvgate_sim_event_publish_errors_total",
			Help: "KV event batches whose publishing failed.",
		}),
		lostEvents: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvgate_sim_events_publish_failed_total",
			Help: "KV cache events in batches whose publishing failed.",
		}),
	}
	m.reg.MustRegister(m.events, m.batches, m.publishErrors, m.lostEvents, newRankCollector(w))
	return m
}

// published records the outcome of publishing one batch of n events.
func (m *workerMetrics) published(n int, err error) {
	if err != nil {
		m.publishErrors.Inc()
		m.lostEvents.Add(float64(n))
		return
	}
	m.batches.Inc()
	m.events.Add(float64(n))
}

// rankCollector exposes each rank's RankStats under vLLM's v1 metric
// names, as a scrape of vLLM shows them (counters with _total).
type rankCollector struct {
	w                                   *Worker
	running, waiting, usage             *prometheus.Desc
	queries, hits, prompt, gen, preempt *prometheus.Desc
}

func newRankCollector(w *Worker) *rankCollector {
	labels := []string{"model_name", "engine"}
	d := func(name, help string) *prometheus.Desc { return prometheus.NewDesc(name, help, labels, nil) }
	return &rankCollector{
		w:       w,
		running: d("vllm:num_requests_running", "Number of requests in model execution batches."),
		waiting: d("vllm:num_requests_waiting", "Number of requests waiting to be processed."),
		usage:   d("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."),
		queries: d("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens."),
		hits:    d("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens."),
		prompt:  d("vllm:prompt_tokens_total", "Number of prefill tokens processed."),
		gen:     d("vllm:generation_tokens_total", "Number of generation tokens processed."),
		preempt: d("vllm:num_preemptions_total", "Cumulative number of preemption from the engine."),
	}
}

func (c *rankCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.running, c.waiting, c.usage, c.queries, c.hits, c.prompt, c.gen, c.preempt} {
		ch <- d
	}
}

func (c *rankCollector) Collect(ch chan<- prometheus.Metric) {
	model := c.w.fleet.cfg.Model
	for i, r := range c.w.ranks {
		st := r.Stats()
		engine := strconv.Itoa(i)
		g := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, model, engine)
		}
		cn := func(d *prometheus.Desc, v uint64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), model, engine)
		}
		g(c.running, float64(st.Running))
		g(c.waiting, float64(st.Waiting))
		g(c.usage, st.Usage)
		cn(c.queries, st.PrefixQueries)
		cn(c.hits, st.PrefixHits)
		cn(c.prompt, st.PromptTokens)
		cn(c.gen, st.GenerationTokens)
		cn(c.preempt, st.Preemptions)
	}
}

// ---- errors ----

// apiError is an error response: vLLM's ErrorResponse and its status.
type apiError struct {
	status int
	typ    string
	msg    string
}

func (e *apiError) Error() string { return e.msg }

func badRequest(format string, args ...any) *apiError {
	return &apiError{http.StatusBadRequest, "BadRequestError", fmt.Sprintf(format, args...)}
}

type errorInfo struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}

type errorResponse struct {
	Error errorInfo `json:"error"`
}

func (e *apiError) body() errorResponse {
	return errorResponse{Error: errorInfo{Message: e.msg, Type: e.typ, Code: e.status}}
}

func writeError(rw http.ResponseWriter, e *apiError) {
	writeJSON(rw, e.status, e.body())
}

// marshal encodes v as pydantic does: compact, without HTML escaping.
func marshal(v any) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		// Only our own response types are encoded; they always encode.
		panic(fmt.Sprintf("sim: encode response: %v", err))
	}
	return bytes.TrimSuffix(b.Bytes(), []byte{'\n'})
}

func writeJSON(rw http.ResponseWriter, status int, v any) {
	rw.Header().Set("Content-Type", "application/json")
	rw.WriteHeader(status)
	_, _ = rw.Write(marshal(v))
}

// engineError maps an error of Submit or Wait to a response.
func engineError(err error) *apiError {
	switch {
	case errors.Is(err, ErrTooLong):
		return badRequest("%v", err)
	case errors.Is(err, ErrStopped):
		return &apiError{http.StatusServiceUnavailable, "ServiceUnavailableError", "The engine is stopped: " + err.Error()}
	case errors.Is(err, ErrRestarted):
		return &apiError{http.StatusInternalServerError, "InternalServerError", "The engine failed (restarted) while serving the request: " + err.Error()}
	case errors.Is(err, ErrAborted):
		return &apiError{http.StatusInternalServerError, "InternalServerError", "The request was aborted."}
	default:
		return &apiError{http.StatusInternalServerError, "InternalServerError", err.Error()}
	}
}

// tokenizeError maps an error of Worker.tokenize to a response.
func tokenizeError(err error) *apiError {
	var te *tokenize.TemplateError
	switch {
	case errors.As(err, &te), errors.Is(err, tokenize.ErrNoChatTemplate), errors.Is(err, tokenize.ErrBadRequest):
		return badRequest("%v", err)
	case errors.Is(err, tokenize.ErrUnknownModel):
		return &apiError{http.StatusNotFound, "NotFoundError", err.Error()}
	default:
		return &apiError{http.StatusInternalServerError, "InternalServerError", err.Error()}
	}
}

// ---- routing ----

// handler returns the worker's HTTP API (see the comment at the top of
// this file).
func (w *Worker) handler() http.Handler {
	mux := http.NewServeMux()
	route := func(path, method string, h http.HandlerFunc) {
		mux.HandleFunc(path, func(rw http.ResponseWriter, r *http.Request) {
			if r.Method != method && (method != http.MethodGet || r.Method != http.MethodHead) {
				allow := method
				if method == http.MethodGet {
					allow += ", " + http.MethodHead
				}
				rw.Header().Set("Allow", allow)
				// As vLLM's handler for Starlette's HTTPException answers.
				writeError(rw, &apiError{http.StatusMethodNotAllowed, "Method Not Allowed", "Method Not Allowed"})
				return
			}
			h(rw, r)
		})
	}
	route("/v1/completions", http.MethodPost, serveGen(w, w.completionGen))
	route("/v1/chat/completions", http.MethodPost, serveGen(w, w.chatGen))
	route("/tokenize", http.MethodPost, w.serveTokenize)
	route("/v1/models", http.MethodGet, w.serveModels)
	route("/health", http.MethodGet, func(rw http.ResponseWriter, _ *http.Request) { rw.WriteHeader(http.StatusOK) })
	route("/reset_prefix_cache", http.MethodPost, w.serveResetPrefixCache)
	metrics := promhttp.HandlerFor(w.m.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
	route("/metrics", http.MethodGet, metrics.ServeHTTP)
	mux.HandleFunc("/", func(rw http.ResponseWriter, _ *http.Request) {
		writeError(rw, &apiError{http.StatusNotFound, "Not Found", "Not Found"})
	})
	return mux
}

// decodeBody reads a JSON request body of at most maxBody bytes into v.
func decodeBody(rw http.ResponseWriter, r *http.Request, v any) *apiError {
	data, err := io.ReadAll(http.MaxBytesReader(rw, r.Body, maxBody))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return &apiError{http.StatusRequestEntityTooLarge, "BadRequestError", fmt.Sprintf("request body larger than %d bytes", maxBody)}
		}
		return badRequest("read request body: %v", err)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return badRequest("request body: empty; want a JSON object")
	}
	if err := json.Unmarshal(data, v); err != nil {
		return badRequest("invalid JSON body: %v", err)
	}
	return nil
}

// present reports whether an optional JSON field was given and not null.
func present(raw json.RawMessage) bool {
	s := bytes.TrimSpace(raw)
	return len(s) > 0 && !bytes.Equal(s, []byte("null"))
}

// checkModel resolves a request's model: the served name it answers with
// and the adapter ("" for the base model). An omitted model is the base
// model, as vLLM takes it.
func (w *Worker) checkModel(name string) (served, lora string, e *apiError) {
	if name == "" {
		return w.fleet.cfg.Model, "", nil
	}
	lora, ok := w.servedModel(name)
	if !ok {
		return "", "", &apiError{http.StatusNotFound, "NotFoundError", fmt.Sprintf("The model `%s` does not exist.", name)}
	}
	return name, lora, nil
}

// ---- generation ----

type streamOptions struct {
	IncludeUsage         bool `json:"include_usage"`
	ContinuousUsageStats bool `json:"continuous_usage_stats"`
}

// common are the generation fields both endpoints share.
type common struct {
	Model         string         `json:"model"`
	MaxTokens     *int           `json:"max_tokens"`
	N             *int           `json:"n"`
	Seed          *int64         `json:"seed"`
	Stream        bool           `json:"stream"`
	StreamOptions *streamOptions `json:"stream_options"`
}

type completionRequest struct {
	common
	Prompt           json.RawMessage `json:"prompt"`
	AddSpecialTokens *bool           `json:"add_special_tokens"`
}

type chatRequest struct {
	common
	Messages             json.RawMessage `json:"messages"`
	Tools                json.RawMessage `json:"tools"`
	Documents            json.RawMessage `json:"documents"`
	ChatTemplateKwargs   json.RawMessage `json:"chat_template_kwargs"`
	AddGenerationPrompt  *bool           `json:"add_generation_prompt"`
	ContinueFinalMessage bool            `json:"continue_final_message"`
	MaxCompletionTokens  *int            `json:"max_completion_tokens"`
}

// validate checks what vLLM's request models check before the model is
// looked at.
func (c *common) validate() *apiError {
	if c.StreamOptions != nil && !c.Stream {
		return badRequest("Stream options can only be defined when `stream=True`.")
	}
	if c.N != nil && *c.N != 1 {
		return badRequest("n=%d: the simulator generates one choice per request (n must be 1)", *c.N)
	}
	return nil
}

// gen is a validated generation request.
type gen struct {
	chat       bool
	id         string
	model      string // the name the response carries
	lora       string
	prompt     []uint32
	maxTokens  int
	stopAfter  int // the model's own end (Request.StopAfter); 0: none
	seed       *int64
	stream     bool
	usage      bool // final usage chunk
	continuous bool // usage in every chunk
	rankHeader string
}

// serveGen decodes a generation request into T, builds it with build and
// runs it.
func serveGen[T any](w *Worker, build func(*http.Request, *T) (*gen, *apiError)) http.HandlerFunc {
	return func(rw http.ResponseWriter, r *http.Request) {
		var req T
		if e := decodeBody(rw, r, &req); e != nil {
			writeError(rw, e)
			return
		}
		g, e := build(r, &req)
		if e != nil {
			if r.Context().Err() == nil {
				writeError(rw, e)
			}
			return
		}
		w.generate(rw, r, g)
	}
}

func (w *Worker) completionGen(r *http.Request, req *completionRequest) (*gen, *apiError) {
	if e := req.validate(); e != nil {
		return nil, e
	}
	model, lora, e := w.checkModel(req.Model)
	if e != nil {
		return nil, e
	}
	g := &gen{model: model, lora: lora, id: "cmpl-" + w.requestID(r)}
	text, ids, e := parsePrompt(req.Prompt)
	if e != nil {
		return nil, e
	}
	if ids == nil {
		var err error
		ids, err = w.tokenize(r.Context(), tokenize.Request{Model: model, Text: text, AddSpecialTokens: req.AddSpecialTokens})
		if err != nil {
			return nil, tokenizeError(err)
		}
	}
	maxTokens := 16
	if req.MaxTokens != nil {
		maxTokens = *req.MaxTokens
	}
	if e := w.fill(g, r, &req.common, ids, maxTokens, req.MaxTokens != nil); e != nil {
		return nil, e
	}
	return g, nil
}

func (w *Worker) chatGen(r *http.Request, req *chatRequest) (*gen, *apiError) {
	if !present(req.Messages) {
		return nil, badRequest("messages: Field required")
	}
	if e := req.validate(); e != nil {
		return nil, e
	}
	model, lora, e := w.checkModel(req.Model)
	if e != nil {
		return nil, e
	}
	g := &gen{chat: true, model: model, lora: lora, id: "chatcmpl-" + w.requestID(r)}
	addGen := req.AddGenerationPrompt == nil || *req.AddGenerationPrompt
	ids, err := w.tokenize(r.Context(), tokenize.Request{Model: model, Chat: &tokenize.ChatRequest{
		Messages: req.Messages, Tools: req.Tools, AddGenerationPrompt: addGen,
		ContinueFinalMessage: req.ContinueFinalMessage, Documents: req.Documents, Kwargs: req.ChatTemplateKwargs,
	}})
	if err != nil {
		return nil, tokenizeError(err)
	}
	max := req.MaxCompletionTokens
	if max == nil {
		max = req.MaxTokens
	}
	// vLLM's default for chat: whatever the context leaves.
	maxTokens := w.fleet.cfg.Engine.MaxModelLen - len(ids)
	if max != nil {
		maxTokens = *max
	}
	if e := w.fill(g, r, &req.common, ids, maxTokens, max != nil); e != nil {
		return nil, e
	}
	return g, nil
}

// fill completes g with the prompt, output length and options, checking
// them as vLLM does.
func (w *Worker) fill(g *gen, r *http.Request, c *common, ids []uint32, maxTokens int, explicit bool) *apiError {
	maxLen := w.fleet.cfg.Engine.MaxModelLen
	switch {
	case len(ids) == 0:
		return badRequest("The prompt cannot be empty.")
	case len(ids) >= maxLen && !explicit && g.chat:
		return badRequest("This model's maximum context length is %d tokens. However, you requested %d tokens in the messages, Please reduce the length of the messages.", maxLen, len(ids))
	case maxTokens < 1:
		return badRequest("max_tokens must be at least 1, got %d.", maxTokens)
	case len(ids)+maxTokens > maxLen:
		return badRequest("This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.", maxLen, len(ids)+maxTokens, len(ids), maxTokens)
	}
	g.prompt, g.maxTokens, g.seed = ids, maxTokens, c.Seed
	if !explicit {
		cfg := w.fleet.cfg
		g.stopAfter = naturalLength(cfg.MeanOutputTokens, outputKey(cfg.Seed, g.lora, ids, c.Seed))
	}
	g.stream = c.Stream
	if c.StreamOptions != nil {
		g.usage = c.StreamOptions.IncludeUsage
		g.continuous = g.usage && c.StreamOptions.ContinuousUsageStats
	}
	g.rankHeader = r.Header.Get("X-data-parallel-rank")
	if g.rankHeader != "" {
		if _, err := w.pickRank(g.rankHeader); err != nil {
			return badRequest("%v", err)
		}
	}
	return nil
}

// parsePrompt reads a completion prompt: text, or token ids (non-nil).
func parsePrompt(raw json.RawMessage) (string, []uint32, *apiError) {
	if !present(raw) {
		return "", nil, badRequest("prompt: Field required")
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil, nil
	}
	var ids []uint32
	if json.Unmarshal(raw, &ids) == nil {
		if len(ids) == 0 {
			return "", nil, badRequest("The prompt cannot be empty.")
		}
		return "", ids, nil
	}
	var texts []string
	if json.Unmarshal(raw, &texts) == nil {
		if len(texts) != 1 {
			return "", nil, badRequest("prompt: the simulator takes one prompt per request, got %d", len(texts))
		}
		return texts[0], nil, nil
	}
	var lists [][]uint32
	if json.Unmarshal(raw, &lists) == nil {
		if len(lists) != 1 {
			return "", nil, badRequest("prompt: the simulator takes one prompt per request, got %d", len(lists))
		}
		if len(lists[0]) == 0 {
			return "", nil, badRequest("The prompt cannot be empty.")
		}
		return "", lists[0], nil
	}
	return "", nil, badRequest("prompt: want a string, a list of token ids (non-negative integers), or a list of one of those")
}

// requestID is the base of a response id: the X-Request-Id header, as
// vLLM takes it, or a fresh random one.
func (w *Worker) requestID(r *http.Request) string {
	if id := r.Header.Get("X-Request-Id"); id != "" {
		return id
	}
	return w.newID()
}

// newID returns 32 hex digits, unique in the process (the worker's id and
// a per-worker counter, mixed with the time), like a uuid4 hex.
func (w *Worker) newID() string {
	return fmt.Sprintf("%016x%016x", mix(uint64(time.Now().UnixNano())^w.ID), mix(w.ids.Add(1)^w.ID<<40))
}

// generate runs g on a rank and writes the response.
func (w *Worker) generate(rw http.ResponseWriter, r *http.Request, g *gen) {
	ctx := r.Context()
	fail, seed := w.fault()
	if d := w.fleet.cfg.Faults.Delay; d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return
		}
	}
	if fail {
		writeError(rw, &apiError{http.StatusInternalServerError, "InternalServerError", "simulated engine failure (Faults.FailRate)"})
		return
	}
	if g.seed != nil {
		seed = uint64(*g.seed)
	}
	rank, err := w.pickRank(g.rankHeader)
	if err != nil {
		writeError(rw, badRequest("%v", err))
		return
	}
	seq, err := rank.Submit(Request{Prompt: g.prompt, LoRA: g.lora, MaxTokens: g.maxTokens, StopAfter: g.stopAfter, Seed: seed})
	if err != nil {
		writeError(rw, engineError(err))
		return
	}
	// Frees the request's blocks if the client leaves or writing fails; a
	// no-op once it finished.
	defer seq.Abort()
	created := time.Now().Unix()
	if g.stream {
		w.stream(ctx, rw, g, seq, created)
		return
	}
	var out []uint32
	cached, finish := 0, ""
	for {
		p, err := seq.Wait(ctx)
		if err != nil {
			if ctx.Err() == nil {
				writeError(rw, engineError(err))
			}
			return
		}
		out = append(out, p.Tokens...)
		cached = p.CachedTokens
		if p.Done {
			finish = p.FinishReason
			break
		}
	}
	u := g.usageInfo(len(out), cached)
	text := detokenize(out)
	if g.chat {
		writeJSON(rw, http.StatusOK, chatResponse{
			ID: g.id, Object: "chat.completion", Created: created, Model: g.model,
			Choices: []chatChoice{{Message: chatMessage{Role: "assistant", Content: text, ToolCalls: []struct{}{}}, FinishReason: &finish}},
			Usage:   u,
		})
		return
	}
	writeJSON(rw, http.StatusOK, completionResponse{
		ID: g.id, Object: "text_completion", Created: created, Model: g.model,
		Choices: []completionChoice{{Text: text, FinishReason: &finish}},
		Usage:   u,
	})
}

func (g *gen) usageInfo(completion, cached int) *usageInfo {
	return &usageInfo{
		PromptTokens: len(g.prompt), CompletionTokens: completion, TotalTokens: len(g.prompt) + completion,
		PromptTokensDetails: &promptTokensDetails{CachedTokens: cached},
	}
}

// stream writes g's output as server-sent events, one chunk per Progress.
func (w *Worker) stream(ctx context.Context, rw http.ResponseWriter, g *gen, seq *Seq, created int64) {
	rc := http.NewResponseController(rw)
	rw.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	rw.WriteHeader(http.StatusOK)
	send := func(data []byte) bool {
		buf := make([]byte, 0, len(data)+8)
		buf = append(append(append(buf, "data: "...), data...), "\n\n"...)
		if _, err := rw.Write(buf); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	_ = rc.Flush() // headers now: a client's time to first byte is not its time to first token
	object := "text_completion"
	if g.chat {
		object = "chat.completion.chunk"
	}
	chunk := func(choices any, u *usageInfo) []byte {
		return marshal(streamChunk{ID: g.id, Object: object, Created: created, Model: g.model, Choices: choices, Usage: u})
	}
	n, cached, first := 0, 0, true
	for {
		p, err := seq.Wait(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return // the client left; Abort frees the blocks
			}
			if send(marshal(engineError(err).body())) {
				send([]byte("[DONE]"))
			}
			return
		}
		n += len(p.Tokens)
		cached = p.CachedTokens
		var u *usageInfo
		if g.continuous {
			u = g.usageInfo(n, cached)
		}
		var finish *string
		var stop json.RawMessage
		if p.Done {
			finish, stop = &p.FinishReason, json.RawMessage("null")
		}
		text := detokenize(p.Tokens)
		var data []byte
		if g.chat {
			if first {
				var ru *usageInfo
				if g.continuous {
					ru = g.usageInfo(0, cached)
				}
				empty := ""
				if !send(chunk([]chatStreamChoice{{Delta: chatDelta{Role: "assistant", Content: &empty}}}, ru)) {
					return
				}
			}
			data = chunk([]chatStreamChoice{{Delta: chatDelta{Content: &text}, FinishReason: finish, StopReason: stop}}, u)
		} else {
			data = chunk([]completionStreamChoice{{Text: text, FinishReason: finish}}, u)
		}
		first = false
		if !send(data) {
			return
		}
		if p.Done {
			break
		}
	}
	if g.usage {
		if !send(chunk([]struct{}{}, g.usageInfo(n, cached))) {
			return
		}
	}
	send([]byte("[DONE]"))
}

// ---- response bodies ----

type promptTokensDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

type usageInfo struct {
	PromptTokens        int                  `json:"prompt_tokens"`
	TotalTokens         int                  `json:"total_tokens"`
	CompletionTokens    int                  `json:"completion_tokens"`
	PromptTokensDetails *promptTokensDetails `json:"prompt_tokens_details"`
}

type completionChoice struct {
	Index          int       `json:"index"`
	Text           string    `json:"text"`
	Logprobs       *struct{} `json:"logprobs"`
	FinishReason   *string   `json:"finish_reason"`
	StopReason     *string   `json:"stop_reason"`
	PromptLogprobs *struct{} `json:"prompt_logprobs"`
}

type completionResponse struct {
	ID                string             `json:"id"`
	Object            string             `json:"object"`
	Created           int64              `json:"created"`
	Model             string             `json:"model"`
	Choices           []completionChoice `json:"choices"`
	ServiceTier       *string            `json:"service_tier"`
	SystemFingerprint *string            `json:"system_fingerprint"`
	Usage             *usageInfo         `json:"usage"`
	KVTransferParams  *struct{}          `json:"kv_transfer_params"`
}

type chatMessage struct {
	Role             string     `json:"role"`
	Content          string     `json:"content"`
	Refusal          *string    `json:"refusal"`
	Annotations      *struct{}  `json:"annotations"`
	Audio            *struct{}  `json:"audio"`
	FunctionCall     *struct{}  `json:"function_call"`
	ToolCalls        []struct{} `json:"tool_calls"`
	ReasoningContent *string    `json:"reasoning_content"`
}

type chatChoice struct {
	Index        int         `json:"index"`
	Message      chatMessage `json:"message"`
	Logprobs     *struct{}   `json:"logprobs"`
	FinishReason *string     `json:"finish_reason"`
	StopReason   *string     `json:"stop_reason"`
}

type chatResponse struct {
	ID                string       `json:"id"`
	Object            string       `json:"object"`
	Created           int64        `json:"created"`
	Model             string       `json:"model"`
	Choices           []chatChoice `json:"choices"`
	ServiceTier       *string      `json:"service_tier"`
	SystemFingerprint *string      `json:"system_fingerprint"`
	Usage             *usageInfo   `json:"usage"`
	PromptLogprobs    *struct{}    `json:"prompt_logprobs"`
	KVTransferParams  *struct{}    `json:"kv_transfer_params"`
}

// streamChunk is one streamed event: choices are completionStreamChoice
// or chatStreamChoice, or empty in the final usage chunk.
type streamChunk struct {
	ID      string     `json:"id"`
	Object  string     `json:"object"`
	Created int64      `json:"created"`
	Model   string     `json:"model"`
	Choices any        `json:"choices"`
	Usage   *usageInfo `json:"usage,omitempty"`
}

type completionStreamChoice struct {
	Index        int       `json:"index"`
	Text         string    `json:"text"`
	Logprobs     *struct{} `json:"logprobs"`
	FinishReason *string   `json:"finish_reason"`
	StopReason   *string   `json:"stop_reason"`
}

type chatDelta struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content"`
}

type chatStreamChoice struct {
	Index        int       `json:"index"`
	Delta        chatDelta `json:"delta"`
	Logprobs     *struct{} `json:"logprobs"`
	FinishReason *string   `json:"finish_reason"`
	// StopReason is only on the last chunk, as null (vLLM sets it there).
	StopReason json.RawMessage `json:"stop_reason,omitempty"`
}

// ---- other endpoints ----

// tokenizeRequest is vLLM's POST /tokenize body: a completion prompt or
// chat messages.
type tokenizeRequest struct {
	Model                string          `json:"model"`
	Prompt               *string         `json:"prompt"`
	Messages             json.RawMessage `json:"messages"`
	Tools                json.RawMessage `json:"tools"`
	Documents            json.RawMessage `json:"documents"`
	ChatTemplateKwargs   json.RawMessage `json:"chat_template_kwargs"`
	AddGenerationPrompt  *bool           `json:"add_generation_prompt"`
	ContinueFinalMessage bool            `json:"continue_final_message"`
	AddSpecialTokens     *bool           `json:"add_special_tokens"`
}

type tokenizeResponse struct {
	Count       int       `json:"count"`
	MaxModelLen int       `json:"max_model_len"`
	Tokens      []uint32  `json:"tokens"`
	TokenStrs   *[]string `json:"token_strs"`
}

// serveTokenize is vLLM's POST /tokenize. Chat prompts are tokenized
// without special tokens whatever add_special_tokens says (the template
// writes them), and token_strs is always null.
func (w *Worker) serveTokenize(rw http.ResponseWriter, r *http.Request) {
	var req tokenizeRequest
	if e := decodeBody(rw, r, &req); e != nil {
		writeError(rw, e)
		return
	}
	chat := present(req.Messages)
	switch {
	case chat && req.Prompt != nil:
		writeError(rw, badRequest("give either prompt or messages, not both"))
		return
	case !chat && req.Prompt == nil:
		writeError(rw, badRequest("prompt or messages: Field required"))
		return
	}
	model, _, e := w.checkModel(req.Model)
	if e != nil {
		writeError(rw, e)
		return
	}
	treq := tokenize.Request{Model: model}
	if chat {
		treq.Chat = &tokenize.ChatRequest{
			Messages: req.Messages, Tools: req.Tools, AddGenerationPrompt: req.AddGenerationPrompt == nil || *req.AddGenerationPrompt,
			ContinueFinalMessage: req.ContinueFinalMessage, Documents: req.Documents, Kwargs: req.ChatTemplateKwargs,
		}
	} else {
		treq.Text, treq.AddSpecialTokens = *req.Prompt, req.AddSpecialTokens
	}
	ids, err := w.tokenize(r.Context(), treq)
	if err != nil {
		if r.Context().Err() == nil {
			writeError(rw, tokenizeError(err))
		}
		return
	}
	if ids == nil {
		ids = []uint32{}
	}
	writeJSON(rw, http.StatusOK, tokenizeResponse{Count: len(ids), MaxModelLen: w.fleet.cfg.Engine.MaxModelLen, Tokens: ids})
}

type modelPermission struct {
	ID                 string  `json:"id"`
	Object             string  `json:"object"`
	Created            int64   `json:"created"`
	AllowCreateEngine  bool    `json:"allow_create_engine"`
	AllowSampling      bool    `json:"allow_sampling"`
	AllowLogprobs      bool    `json:"allow_logprobs"`
	AllowSearchIndices bool    `json:"allow_search_indices"`
	AllowView          bool    `json:"allow_view"`
	AllowFineTuning    bool    `json:"allow_fine_tuning"`
	Organization       string  `json:"organization"`
	Group              *string `json:"group"`
	IsBlocking         bool    `json:"is_blocking"`
}

type modelCard struct {
	ID          string            `json:"id"`
	Object      string            `json:"object"`
	Created     int64             `json:"created"`
	OwnedBy     string            `json:"owned_by"`
	Root        string            `json:"root"`
	Parent      *string           `json:"parent"`
	MaxModelLen *int              `json:"max_model_len"`
	Permission  []modelPermission `json:"permission"`
}

type modelList struct {
	Object string      `json:"object"`
	Data   []modelCard `json:"data"`
}

// serveModels is vLLM's GET /v1/models: the base model, then one card per
// adapter with the base model as parent (and, as in vLLM, no
// max_model_len).
func (w *Worker) serveModels(rw http.ResponseWriter, _ *http.Request) {
	cfg := w.fleet.cfg
	now := time.Now().Unix()
	card := func(id string) modelCard {
		return modelCard{
			ID: id, Object: "model", Created: now, OwnedBy: "vllm", Root: id,
			Permission: []modelPermission{{
				ID: "modelperm-" + w.newID(), Object: "model_permission", Created: now,
				AllowSampling: true, AllowLogprobs: true, AllowView: true, Organization: "*",
			}},
		}
	}
	base := card(cfg.Model)
	maxLen := cfg.Engine.MaxModelLen
	base.MaxModelLen = &maxLen
	list := modelList{Object: "list", Data: []modelCard{base}}
	for _, l := range cfg.LoRA {
		c := card(l)
		parent := cfg.Model
		c.Parent = &parent
		list.Data = append(list.Data, c)
	}
	writeJSON(rw, http.StatusOK, list)
}

// serveResetPrefixCache resets every rank's prefix cache: 200 when all
// did, else 409 naming the ranks that refused (they run requests).
func (w *Worker) serveResetPrefixCache(rw http.ResponseWriter, _ *http.Request) {
	var busy []string
	for i, r := range w.ranks {
		if !r.ResetPrefixCache() {
			busy = append(busy, strconv.Itoa(i))
		}
	}
	if len(busy) > 0 {
		writeError(rw, &apiError{http.StatusConflict, "ConflictError",
			fmt.Sprintf("prefix cache not reset on rank(s) %s: requests are running", strings.Join(busy, ", "))})
		return
	}
	rw.WriteHeader(http.StatusOK)
}
