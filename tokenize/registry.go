package tokenize

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.yaml.in/yaml/v3"
)

// Path is how a prompt was turned into blocks.
type Path string

// The tokenization paths, in the default fallback order.
const (
	PathLocal       Path = "local"       // the model's tokenizer.json and chat template, in process
	PathRemote      Path = "remote"      // the worker's own POST /tokenize
	PathApproximate Path = "approximate" // prompt bytes cut into pseudo-blocks
)

// Errors of Registry.Tokenize. A *TemplateError is returned as is.
var (
	ErrUnknownModel = errors.New("unknown model")
	ErrBadRequest   = errors.New("bad tokenize request")
)

// ModelConfig says how to tokenize one served model.
type ModelConfig struct {
	// Name is the served model name, as requests carry it.
	Name string `yaml:"name" json:"name"`
	// LoRA lists adapter names served under their own model names; they
	// tokenize like the base model, and their blocks are hashed with the
	// adapter's seed.
	LoRA []string `yaml:"lora" json:"lora,omitempty"`
	// Tokenizer is a directory with tokenizer.json, and optionally
	// tokenizer_config.json and chat_template.jinja.
	Tokenizer string `yaml:"tokenizer" json:"tokenizer,omitempty"`
	// BlockSize is the engine's KV block size in tokens (default 16).
	BlockSize int `yaml:"block_size" json:"block_size,omitempty"`
	// Fallbacks are the paths to try, in order (default: local, remote,
	// approximate; without Tokenizer: remote, approximate).
	Fallbacks []Path `yaml:"fallbacks" json:"fallbacks,omitempty"`
	// ApproxBlockBytes is the size of a pseudo-block of the approximate
	// path, in prompt bytes (default 4 * BlockSize: about a block's worth
	// of text).
	ApproxBlockBytes int `yaml:"approx_block_bytes" json:"approx_block_bytes,omitempty"`
}

// Config is the models section of kvgate's configuration.
type Config struct {
	Models []ModelConfig `yaml:"models" json:"models"`
}

// ParseConfig reads a YAML (or JSON) document with a top-level "models" list.
func ParseConfig(data []byte) (Config, error) {
	var c Config
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil {
		return Config{}, fmt.Errorf("models config: %w", err)
	}
	return c, nil
}

// LoadConfig reads a models configuration file.
func LoadConfig(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("models config: %w", err)
	}
	c, err := ParseConfig(data)
	if err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// Request is one prompt to tokenize: Text (a completion prompt) or Chat.
type Request struct {
	Model string
	Text  string
	// AddSpecialTokens applies to Text; nil means vLLM's default for
	// completions, true. Chat prompts never add them (the template does).
	AddSpecialTokens *bool
	Chat             *ChatRequest
}

// Result is a tokenized prompt.
type Result struct {
	Model     string // the base model's name
	LoRA      string // the adapter, "" for the base model
	BlockSize int
	Path      Path
	// Tokens are the prompt's token ids (local and remote paths).
	Tokens []uint32
	// Approx are the pseudo-block hashes of the approximate path, one per
	// full pseudo-block, to be used in place of block hashes.
	Approx []uint64
}

// Remote tokenizes on a worker of the model: vLLM's POST /tokenize.
type Remote interface {
	Tokenize(ctx context.Context, model string, req Request) ([]uint32, error)
}

// model is one configured model, loaded.
type model struct {
	cfg  ModelConfig
	tok  *Tokenizer    // nil: no usable local tokenizer
	chat *ChatTemplate // nil: no chat template
	// why says why tok or chat is missing, for errors and logs.
	why string
	// segHits and segMisses count tok's segment-cache lookups for this model (nil
	// without a cache).
	segHits, segMisses prometheus.Counter
}

// Registry maps served model names to their tokenizers. Loaded once by
// NewRegistry, it is immutable and safe for concurrent use.
type Registry struct {
	models map[string]*model // by served name, adapters included
	lora   map[string]string // adapter name -> base model name
	remote Remote
	log    *slog.Logger
	m      registryMetrics
}

type registryMetrics struct {
	paths     *prometheus.CounterVec
	failures  *prometheus.CounterVec
	latency   *prometheus.HistogramVec
	segHits   *prometheus.CounterVec
	segMisses *prometheus.CounterVec
}

// RegistryOptions configure NewRegistry.
type RegistryOptions struct {
	Remote Remote // nil: the remote path fails over to the next
	// Strict makes a local tokenizer kvgate cannot reproduce exactly an
	// error instead of a reason to use the fallbacks.
	Strict     bool
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	// SegmentCacheBytes is the budget of the segment cache each loaded tokenizer
	// gets (see Tokenizer.WithSegmentCache): 0 means DefaultSegmentCacheBytes
	// (64 MiB), a negative value disables the cache. Models sharing a tokenizer
	// directory share its cache.
	SegmentCacheBytes int64
	// SegmentCacheMinBytes is the shortest segment cached; 0 means
	// DefaultSegmentCacheMinBytes.
	SegmentCacheMinBytes int
}

// NewRegistry loads every configured model's tokenizer and chat template.
// Models sharing a tokenizer directory share one loaded copy. A tokenizer
// kvgate cannot reproduce exactly (UnsupportedError) is not an error: the
// model then uses its next fallback, and the reason is logged. A missing
// or unreadable directory is an error.
func NewRegistry(cfg Config, opts RegistryOptions) (*Registry, error) {
	r := &Registry{models: map[string]*model{}, lora: map[string]string{}, remote: opts.Remote, log: opts.Logger}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	r.m = registryMetrics{
		paths: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_tokenize_requests_total", Help: "Prompts tokenized, by model and the path that produced the blocks.",
		}, []string{"model", "path"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_tokenize_fallbacks_total", Help: "Tokenization paths that failed and fell through to the next one, by model and failed path.",
		}, []string{"model", "path"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "kvgate_tokenize_duration_seconds", Help: "Time to tokenize a prompt, by path.",
			Buckets: prometheus.ExponentialBuckets(1e-6, 3, 14),
		}, []string{"path"}),
		segHits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_tokenize_segment_cache_hits_total", Help: "Text segments (between special tokens) whose token ids came from the segment cache, by model.",
		}, []string{"model"}),
		segMisses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_tokenize_segment_cache_misses_total", Help: "Text segments (between special tokens) looked up in the segment cache and encoded, by model.",
		}, []string{"model"}),
	}
	if opts.Registerer != nil {
		for _, c := range []prometheus.Collector{r.m.paths, r.m.failures, r.m.latency, r.m.segHits, r.m.segMisses} {
			if err := opts.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("tokenize metrics: %w", err)
			}
		}
	}
	type loaded struct {
		tok  *Tokenizer
		chat *ChatTemplate
		why  string
	}
	dirs := map[string]loaded{}
	for i, mc := range cfg.Models {
		if mc.Name == "" {
			return nil, fmt.Errorf("models[%d]: name is required", i)
		}
		if err := mc.normalize(); err != nil {
			return nil, fmt.Errorf("model %q: %w", mc.Name, err)
		}
		for _, name := range append([]string{mc.Name}, mc.LoRA...) {
			if _, dup := r.models[name]; dup {
				return nil, fmt.Errorf("model %q: name %q configured twice", mc.Name, name)
			}
		}
		m := &model{cfg: mc}
		if mc.Tokenizer != "" {
			l, ok := dirs[mc.Tokenizer]
			if !ok {
				var err error
				l.tok, err = Load(mc.Tokenizer)
				var unsup *UnsupportedError
				switch {
				case errors.As(err, &unsup) && !opts.Strict:
					l.why = err.Error()
				case err != nil:
					return nil, fmt.Errorf("model %q: %w", mc.Name, err)
				}
				if l.tok != nil && opts.SegmentCacheBytes >= 0 {
					size := opts.SegmentCacheBytes
					if size == 0 {
						size = DefaultSegmentCacheBytes
					}
					l.tok = l.tok.WithSegmentCache(SegmentCacheOptions{MaxBytes: size, MinBytes: opts.SegmentCacheMinBytes})
				}
				l.chat, err = LoadChatTemplate(mc.Tokenizer)
				switch {
				case errors.Is(err, ErrNoChatTemplate):
				case err != nil:
					return nil, fmt.Errorf("model %q: %w", mc.Name, err)
				}
				dirs[mc.Tokenizer] = l
			}
			m.tok, m.chat, m.why = l.tok, l.chat, l.why
			if m.tok != nil && m.tok.segs != nil {
				m.segHits = r.m.segHits.WithLabelValues(mc.Name)
				m.segMisses = r.m.segMisses.WithLabelValues(mc.Name)
			}
			if m.why != "" {
				r.log.Warn("local tokenizer unusable; using fallbacks", "model", mc.Name, "dir", mc.Tokenizer, "reason", m.why, "fallbacks", mc.Fallbacks)
			}
		}
		r.models[mc.Name] = m
		for _, a := range mc.LoRA {
			r.models[a] = m
			r.lora[a] = mc.Name
		}
	}
	return r, nil
}

// maxBlockSize is the largest block_size a model may have: the index's
// bound (indexer.MaxBlockSize, which this package does not import; a test
// checks that they agree).
const maxBlockSize = 1 << 16

// normalize fills in defaults and checks the fallbacks.
func (mc *ModelConfig) normalize() error {
	if mc.BlockSize == 0 {
		mc.BlockSize = 16
	}
	if mc.BlockSize < 1 || mc.BlockSize > maxBlockSize {
		return fmt.Errorf("block_size must be between 1 and %d, not %d", maxBlockSize, mc.BlockSize)
	}
	if mc.ApproxBlockBytes == 0 {
		mc.ApproxBlockBytes = 4 * mc.BlockSize
	}
	if mc.ApproxBlockBytes < 0 {
		return fmt.Errorf("approx_block_bytes %d must be positive", mc.ApproxBlockBytes)
	}
	if len(mc.Fallbacks) == 0 {
		mc.Fallbacks = []Path{PathRemote, PathApproximate}
		if mc.Tokenizer != "" {
			mc.Fallbacks = []Path{PathLocal, PathRemote, PathApproximate}
		}
	}
	for _, p := range mc.Fallbacks {
		switch p {
		case PathLocal:
			if mc.Tokenizer == "" {
				return errors.New(`fallback "local" needs a tokenizer directory`)
			}
		case PathRemote, PathApproximate:
		default:
			return fmt.Errorf("unknown fallback %q (want local, remote or approximate)", p)
		}
	}
	if slices.Index(mc.Fallbacks, PathLocal) > 0 {
		return errors.New(`fallback "local" must come first`)
	}
	return nil
}

// Tokenize turns a prompt into tokens (or pseudo-blocks), trying the
// model's paths in order. A chat template's own error (*TemplateError) and
// a malformed request end the attempt: every engine would refuse them too.
func (r *Registry) Tokenize(ctx context.Context, req Request) (Result, error) {
	m := r.models[req.Model]
	if m == nil {
		return Result{}, fmt.Errorf("%w %q", ErrUnknownModel, req.Model)
	}
	res := Result{Model: m.cfg.Name, BlockSize: m.cfg.BlockSize}
	if base, ok := r.lora[req.Model]; ok {
		res.Model, res.LoRA = base, req.Model
	}
	if req.Chat != nil && req.Text != "" {
		return Result{}, fmt.Errorf("%w: both text and messages", ErrBadRequest)
	}
	var errs []error
	for _, p := range m.cfg.Fallbacks {
		start := time.Now()
		var err error
		switch p {
		case PathLocal:
			res.Tokens, err = r.local(m, req)
		case PathRemote:
			res.Tokens, err = r.remoteTokens(ctx, req)
		case PathApproximate:
			res.Approx, err = approximate(req, req.Model, m.cfg.ApproxBlockBytes)
		}
		r.m.latency.WithLabelValues(string(p)).Observe(time.Since(start).Seconds())
		if err == nil {
			res.Path = p
			r.m.paths.WithLabelValues(m.cfg.Name, string(p)).Inc()
			r.log.Debug("tokenized", "model", req.Model, "path", p, "tokens", len(res.Tokens), "pseudo_blocks", len(res.Approx))
			return res, nil
		}
		var te *TemplateError
		if errors.As(err, &te) || errors.Is(err, ErrBadRequest) || ctx.Err() != nil {
			return Result{}, err
		}
		r.m.failures.WithLabelValues(m.cfg.Name, string(p)).Inc()
		r.log.Debug("tokenization path failed; trying the next", "model", req.Model, "path", p, "err", err)
		errs = append(errs, fmt.Errorf("%s: %w", p, err))
	}
	return Result{}, fmt.Errorf("tokenize for model %q: every path failed: %w", req.Model, errors.Join(errs...))
}

// local tokenizes in process, as vLLM does: completions with special tokens
// unless told otherwise; chat through the template, without them.
func (r *Registry) local(m *model, req Request) ([]uint32, error) {
	if m.tok == nil {
		return nil, errors.New(m.why)
	}
	if req.Chat == nil {
		return r.encode(m, req.Text, req.AddSpecialTokens == nil || *req.AddSpecialTokens)
	}
	if m.chat == nil {
		return nil, fmt.Errorf("%w: model %q has no chat template", ErrNoChatTemplate, req.Model)
	}
	text, err := m.chat.Render(*req.Chat)
	if err != nil {
		return nil, err
	}
	return r.encode(m, text, false)
}

// encode is m.tok.Encode, counting the segment-cache lookups.
func (r *Registry) encode(m *model, text string, addSpecialTokens bool) ([]uint32, error) {
	ids, lk, err := m.tok.appendEncode(make([]uint32, 0, len(text)/3+4), text, addSpecialTokens)
	if m.segHits != nil {
		if lk.hits > 0 {
			m.segHits.Add(float64(lk.hits))
		}
		if lk.misses > 0 {
			m.segMisses.Add(float64(lk.misses))
		}
	}
	return ids, err
}

func (r *Registry) remoteTokens(ctx context.Context, req Request) ([]uint32, error) {
	if r.remote == nil {
		return nil, errors.New("no remote tokenizer configured")
	}
	return r.remote.Tokenize(ctx, req.Model, req)
}
