package tokenize

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// tinyModel writes a small byte-level BPE model directory: every byte is a
// token (ids 0-255 in GPT-2's byte-to-unicode order), a few merges, "<s>"
// (id 300) prepended by the post-processor, and a chat template that
// raises on a conversation not starting with a user or system message.
func tinyModel(t *testing.T) string {
	t.Helper()
	var bs []int
	for b := '!'; b <= '~'; b++ {
		bs = append(bs, int(b))
	}
	for b := 0xA1; b <= 0xAC; b++ {
		bs = append(bs, b)
	}
	for b := 0xAE; b <= 0xFF; b++ {
		bs = append(bs, b)
	}
	cs := slices.Clone(bs)
	n := 0
	for b := range 256 {
		if !slices.Contains(bs, b) {
			bs, cs = append(bs, b), append(cs, 256+n)
			n++
		}
	}
	vocab := map[string]int{}
	char := map[int]string{}
	for i, b := range bs {
		char[b] = string(rune(cs[i]))
	}
	for b := range 256 {
		vocab[char[b]] = b
	}
	sp := char[' ']
	merges := []string{"h e", "l l", "he ll", "hell o", sp + " w", "o r", sp + "w or"}
	next := 256
	for _, m := range merges {
		vocab[strings.ReplaceAll(m, " ", "")] = next
		next++
	}
	tj := map[string]any{
		"version": "1.0", "truncation": nil, "padding": nil,
		"added_tokens":  []any{map[string]any{"id": 300, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}},
		"normalizer":    nil,
		"pre_tokenizer": map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
		"post_processor": map[string]any{"type": "TemplateProcessing",
			"single":         []any{map[string]any{"SpecialToken": map[string]any{"id": "<s>", "type_id": 0}}, map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}}},
			"pair":           []any{map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}}, map[string]any{"Sequence": map[string]any{"id": "B", "type_id": 1}}},
			"special_tokens": map[string]any{"<s>": map[string]any{"id": "<s>", "ids": []int{300}, "tokens": []string{"<s>"}}}},
		"decoder": map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
		"model": map[string]any{"type": "BPE", "dropout": nil, "unk_token": nil, "continuing_subword_prefix": nil, "end_of_word_suffix": nil,
			"fuse_unk": false, "byte_fallback": false, "ignore_merges": false, "vocab": vocab, "merges": merges},
	}
	cfg := map[string]any{
		"bos_token": "<s>",
		"chat_template": "{% if messages[0]['role'] not in ['user', 'system'] %}{{ raise_exception('Conversation must start with a user or system message') }}{% endif %}" +
			"{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}",
	}
	dir := t.TempDir()
	for name, v := range map[string]any{"tokenizer.json": tj, "tokenizer_config.json": cfg} {
		data, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestParseConfig(t *testing.T) {
	for _, tc := range []struct {
		name, yaml, err string
		want            ModelConfig // after normalize
	}{
		{name: "defaults with tokenizer", yaml: "models:\n- name: m\n  tokenizer: /d\n",
			want: ModelConfig{Name: "m", Tokenizer: "/d", BlockSize: 16, ApproxBlockBytes: 64, Fallbacks: []Path{PathLocal, PathRemote, PathApproximate}}},
		{name: "defaults without tokenizer", yaml: "models:\n- name: m\n  block_size: 32\n",
			want: ModelConfig{Name: "m", BlockSize: 32, ApproxBlockBytes: 128, Fallbacks: []Path{PathRemote, PathApproximate}}},
		{name: "explicit", yaml: "models:\n- name: m\n  tokenizer: /d\n  lora: [a, b]\n  block_size: 64\n  fallbacks: [local, approximate]\n  approx_block_bytes: 100\n",
			want: ModelConfig{Name: "m", Tokenizer: "/d", LoRA: []string{"a", "b"}, BlockSize: 64, ApproxBlockBytes: 100, Fallbacks: []Path{PathLocal, PathApproximate}}},
		{name: "JSON works too", yaml: `{"models": [{"name": "m", "fallbacks": ["approximate"]}]}`,
			want: ModelConfig{Name: "m", BlockSize: 16, ApproxBlockBytes: 64, Fallbacks: []Path{PathApproximate}}},
		{name: "unknown field", yaml: "models:\n- name: m\n  tokeniser: /d\n", err: "tokeniser"},
		{name: "unknown fallback", yaml: "models:\n- name: m\n  fallbacks: [guess]\n", err: `unknown fallback "guess"`},
		{name: "local without tokenizer", yaml: "models:\n- name: m\n  fallbacks: [local]\n", err: "needs a tokenizer"},
		{name: "local not first", yaml: "models:\n- name: m\n  tokenizer: /d\n  fallbacks: [remote, local]\n", err: "must come first"},
		{name: "negative block size", yaml: "models:\n- name: m\n  block_size: -1\n", err: "block_size"},
		{name: "block size over the bound", yaml: "models:\n- name: m\n  block_size: 65537\n", err: "block_size must be between 1 and 65536, not 65537"},
		{name: "block size 2^63-1", yaml: "models:\n- name: m\n  block_size: 9223372036854775807\n", err: "between 1 and 65536"},
		{name: "largest block size", yaml: "models:\n- name: m\n  block_size: 65536\n",
			want: ModelConfig{Name: "m", BlockSize: 65536, ApproxBlockBytes: 4 * 65536, Fallbacks: []Path{PathRemote, PathApproximate}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseConfig([]byte(tc.yaml))
			if err == nil && len(c.Models) == 1 {
				err = c.Models[0].normalize()
			}
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want one mentioning %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := c.Models[0]
			if got.Name != tc.want.Name || got.Tokenizer != tc.want.Tokenizer || got.BlockSize != tc.want.BlockSize ||
				got.ApproxBlockBytes != tc.want.ApproxBlockBytes || !slices.Equal(got.Fallbacks, tc.want.Fallbacks) || !slices.Equal(got.LoRA, tc.want.LoRA) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestNewRegistryErrors(t *testing.T) {
	dir := tinyModel(t)
	for _, tc := range []struct {
		name string
		cfg  Config
		err  string
	}{
		{"missing name", Config{Models: []ModelConfig{{Tokenizer: dir}}}, "name is required"},
		{"duplicate", Config{Models: []ModelConfig{{Name: "a", Tokenizer: dir}, {Name: "b", LoRA: []string{"a"}}}}, "configured twice"},
		{"missing directory", Config{Models: []ModelConfig{{Name: "a", Tokenizer: filepath.Join(dir, "nope")}}}, "nope"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := NewRegistry(tc.cfg, RegistryOptions{}); err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("err = %v, want one mentioning %q", err, tc.err)
			}
		})
	}
}

// fakeVLLM is a worker's /tokenize: it answers with the ids the local
// tokenizer gives (as an engine with the same tokenizer would), after
// checking the request has vLLM's shape, or fails with status fail.
type fakeVLLM struct {
	reg  *Registry // local-only registry of the same model
	fail int

	mu    sync.Mutex
	calls []tokenizeRequest
}

func (f *fakeVLLM) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/tokenize" || r.Header.Get("Content-Type") != "application/json" {
		http.Error(w, "bad request line", http.StatusNotFound)
		return
	}
	body, _ := io.ReadAll(r.Body)
	var req tokenizeRequest
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	f.calls = append(f.calls, req)
	f.mu.Unlock()
	if f.fail != 0 {
		http.Error(w, `{"error": "engine down"}`, f.fail)
		return
	}
	lr := Request{Model: "local"}
	if req.Prompt != nil {
		lr.Text, lr.AddSpecialTokens = *req.Prompt, &req.AddSpecialTokens
	} else {
		lr.Chat = &ChatRequest{Messages: req.Messages, Tools: req.Tools, AddGenerationPrompt: req.AddGenerationPrompt != nil && *req.AddGenerationPrompt,
			ContinueFinalMessage: req.ContinueFinalMessage, Kwargs: req.ChatTemplateKwargs, Documents: req.Documents}
	}
	res, err := f.reg.Tokenize(r.Context(), lr)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	json.NewEncoder(w).Encode(map[string]any{"count": len(res.Tokens), "max_model_len": 4096, "tokens": res.Tokens, "token_strs": nil})
}

func TestRegistryPaths(t *testing.T) {
	dir := tinyModel(t)
	local, err := NewRegistry(Config{Models: []ModelConfig{{Name: "local", Tokenizer: dir}}}, RegistryOptions{})
	if err != nil {
		t.Fatal(err)
	}
	engine := &fakeVLLM{reg: local}
	up := httptest.NewServer(engine)
	defer up.Close()
	down := httptest.NewServer(&fakeVLLM{reg: local, fail: http.StatusServiceUnavailable})
	defer down.Close()

	reg := prometheus.NewRegistry()
	r, err := NewRegistry(Config{Models: []ModelConfig{
		{Name: "base", Tokenizer: dir, LoRA: []string{"adapter"}, BlockSize: 4},
		{Name: "remote-only", BlockSize: 4},
		{Name: "remote-down", BlockSize: 4, Fallbacks: []Path{PathRemote, PathApproximate}},
		{Name: "approx", BlockSize: 4, ApproxBlockBytes: 8, Fallbacks: []Path{PathApproximate}},
		{Name: "nothing-works", Fallbacks: []Path{PathRemote}},
	}}, RegistryOptions{Registerer: reg, Remote: &HTTPRemote{Client: up.Client(), Endpoints: func(model string) []string {
		switch model {
		case "remote-only":
			return []string{down.URL, up.URL + "/"} // the first worker fails: the next answers
		case "remote-down":
			return []string{down.URL}
		}
		return nil
	}}})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	enc := func(s string, special bool) []uint32 {
		ids, err := tok.Encode(s, special)
		if err != nil {
			t.Fatal(err)
		}
		return ids
	}
	no := false
	chat := &ChatRequest{Messages: json.RawMessage(`[{"role":"user","content":"hello world"}]`), AddGenerationPrompt: true}
	chatText := "<s><|user|>hello world\n<|assistant|>"

	for _, tc := range []struct {
		name      string
		req       Request
		path      Path
		model     string
		lora      string
		tokens    []uint32
		approxLen int
	}{
		{name: "completion adds special tokens", req: Request{Model: "base", Text: "hello world"}, path: PathLocal, model: "base", tokens: enc("hello world", true)},
		{name: "completion without special tokens", req: Request{Model: "base", Text: "hello world", AddSpecialTokens: &no}, path: PathLocal, model: "base", tokens: enc("hello world", false)},
		{name: "chat renders the template, no special tokens added", req: Request{Model: "base", Chat: chat}, path: PathLocal, model: "base", tokens: enc(chatText, false)},
		{name: "adapter tokenizes like its base", req: Request{Model: "adapter", Text: "hello"}, path: PathLocal, model: "base", lora: "adapter", tokens: enc("hello", true)},
		{name: "remote after a failing worker", req: Request{Model: "remote-only", Text: "hello world"}, path: PathRemote, model: "remote-only", tokens: enc("hello world", true)},
		{name: "remote chat", req: Request{Model: "remote-only", Chat: chat}, path: PathRemote, model: "remote-only", tokens: enc(chatText, false)},
		{name: "approximate when the remote fails", req: Request{Model: "remote-down", Text: strings.Repeat("x", 70)}, path: PathApproximate, model: "remote-down", approxLen: 70 / 16},
		{name: "approximate only", req: Request{Model: "approx", Text: strings.Repeat("y", 17)}, path: PathApproximate, model: "approx", approxLen: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := r.Tokenize(t.Context(), tc.req)
			if err != nil {
				t.Fatal(err)
			}
			if res.Path != tc.path || res.Model != tc.model || res.LoRA != tc.lora || res.BlockSize != 4 {
				t.Fatalf("result %+v, want path %s model %s lora %q", res, tc.path, tc.model, tc.lora)
			}
			if !slices.Equal(res.Tokens, tc.tokens) || len(res.Approx) != tc.approxLen {
				t.Fatalf("tokens %v approx %d, want tokens %v approx %d", res.Tokens, len(res.Approx), tc.tokens, tc.approxLen)
			}
		})
	}

	// What the engine was sent: vLLM's /tokenize shapes.
	engine.mu.Lock()
	calls := slices.Clone(engine.calls)
	engine.mu.Unlock()
	if len(calls) != 2 || calls[0].Prompt == nil || *calls[0].Prompt != "hello world" || !calls[0].AddSpecialTokens || calls[0].Model != "remote-only" {
		t.Fatalf("completion call %+v", calls)
	}
	if c := calls[1]; c.Prompt != nil || string(c.Messages) != string(chat.Messages) || c.AddGenerationPrompt == nil || !*c.AddGenerationPrompt || c.AddSpecialTokens {
		t.Fatalf("chat call %+v", c)
	}

	for _, tc := range []struct {
		name string
		req  Request
		is   error
		as   bool // a *TemplateError
		msg  string
	}{
		{name: "unknown model", req: Request{Model: "nope", Text: "x"}, is: ErrUnknownModel},
		{name: "template raises: no fallback", req: Request{Model: "base", Chat: &ChatRequest{Messages: json.RawMessage(`[{"role":"assistant","content":"hi"}]`)}}, as: true, msg: "must start with a user or system message"},
		{name: "text and messages", req: Request{Model: "base", Text: "x", Chat: chat}, is: ErrBadRequest},
		{name: "malformed messages on the approximate path", req: Request{Model: "approx", Chat: &ChatRequest{Messages: json.RawMessage(`{"role":1}`)}}, is: ErrBadRequest},
		{name: "every path failed", req: Request{Model: "nothing-works", Text: "x"}, msg: "every path failed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := r.Tokenize(t.Context(), tc.req)
			var te *TemplateError
			switch {
			case err == nil:
				t.Fatal("no error")
			case tc.is != nil && !errors.Is(err, tc.is):
				t.Fatalf("err %v, want %v", err, tc.is)
			case tc.as && !errors.As(err, &te):
				t.Fatalf("err %v (%T), want a *TemplateError", err, err)
			case !strings.Contains(err.Error(), tc.msg):
				t.Fatalf("err %v, want it to mention %q", err, tc.msg)
			}
		})
	}

	// Every path taken and every fall-through is counted.
	for _, c := range []struct {
		metric      *prometheus.CounterVec
		model, path string
		want        float64
	}{
		{r.m.paths, "base", "local", 4},
		{r.m.paths, "remote-only", "remote", 2},
		{r.m.paths, "remote-down", "approximate", 1},
		{r.m.failures, "remote-down", "remote", 1},
		{r.m.failures, "nothing-works", "remote", 1},
	} {
		if got := testutil.ToFloat64(c.metric.WithLabelValues(c.model, c.path)); got != c.want {
			t.Errorf("%s/%s counted %v, want %v", c.model, c.path, got, c.want)
		}
	}
}

func TestApproximateBlocks(t *testing.T) {
	chat := func(msgs string) Request {
		return Request{Chat: &ChatRequest{Messages: json.RawMessage(msgs)}}
	}
	blocks := func(req Request, model string) []uint64 {
		t.Helper()
		b, err := approximate(req, model, 8)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	a := blocks(chat(`[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"hi there"}]`), "m")
	spaced := blocks(chat(`[ {"content": "You are a helpful assistant.", "role": "system"},
		{"role": "user", "content": [{"type": "text", "text": "hi there"}]} ]`), "m")
	if len(a) == 0 || !slices.Equal(a, spaced) {
		t.Fatalf("the same conversation gave different blocks: %x vs %x", a, spaced)
	}
	longer := blocks(chat(`[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"hi there"},{"role":"assistant","content":"hello! how can I help?"}]`), "m")
	if len(longer) <= len(a) || !slices.Equal(longer[:len(a)-1], a[:len(a)-1]) {
		t.Fatalf("a continued conversation does not extend the prefix: %x vs %x", longer, a)
	}
	if other := blocks(chat(`[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"hi there"}]`), "other"); slices.Equal(other, a) {
		t.Fatal("two models share pseudo-blocks")
	}
	if got := blocks(Request{Text: "0123456789abcdef0"}, "m"); len(got) != 2 {
		t.Fatalf("17 bytes in blocks of 8 gave %d blocks, want 2 (only full blocks)", len(got))
	}
}

func TestRegistryConcurrent(t *testing.T) {
	dir := tinyModel(t)
	r, err := NewRegistry(Config{Models: []ModelConfig{{Name: "m", Tokenizer: dir}, {Name: "n", Tokenizer: dir}}}, RegistryOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if r.models["m"].tok != r.models["n"].tok {
		t.Fatal("two models with one tokenizer directory loaded it twice")
	}
	want, err := r.Tokenize(context.Background(), Request{Model: "m", Text: "hello world hello"})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for range 200 {
				got, err := r.Tokenize(context.Background(), Request{Model: []string{"m", "n"}[g%2], Text: "hello world hello"})
				if err != nil || !slices.Equal(got.Tokens, want.Tokens) {
					t.Errorf("concurrent tokenize: %v %v", got.Tokens, err)
					return
				}
			}
		})
	}
	wg.Wait()
}
