package sim

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/tokenize"
)

func TestCompletions(t *testing.T) {
	f := byteFleet(t, nil)
	a := newAPI(t, f.Workers()[0])
	ids := []uint32{5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21}
	ids2 := []uint32{105, 106, 107, 108, 109, 110, 111, 112, 113, 114, 115, 116, 117, 118, 119, 120, 121, 122}
	for _, tc := range []struct {
		name    string
		body    map[string]any
		prompt  int    // prompt tokens
		max     int    // output tokens
		model   string // in the response
		stream  bool
		usage   bool // a final usage chunk when streaming
		contUse bool // usage in every chunk
	}{
		{name: "string", body: map[string]any{"model": "sim-model", "prompt": "hello world", "max_tokens": 5}, prompt: 11, max: 5, model: "sim-model"},
		{name: "default max_tokens, no model", body: map[string]any{"prompt": "hello"}, prompt: 5, max: 16, model: "sim-model"},
		{name: "token ids", body: map[string]any{"model": "sim-model", "prompt": ids, "max_tokens": 3}, prompt: len(ids), max: 3, model: "sim-model"},
		{name: "one string in a list", body: map[string]any{"model": "sim-model", "prompt": []string{"abc"}, "max_tokens": 2}, prompt: 3, max: 2, model: "sim-model"},
		{name: "one id list in a list", body: map[string]any{"model": "sim-model", "prompt": [][]uint32{ids[:4]}, "max_tokens": 2}, prompt: 4, max: 2, model: "sim-model"},
		{name: "adapter", body: map[string]any{"model": "adapter", "prompt": "hi there", "max_tokens": 4, "n": 1}, prompt: 8, max: 4, model: "adapter"},
		{name: "stream", body: map[string]any{"model": "sim-model", "prompt": "stream me", "max_tokens": 6, "stream": true}, prompt: 9, max: 6, model: "sim-model", stream: true},
		{name: "stream with usage", body: map[string]any{"model": "sim-model", "prompt": ids2, "max_tokens": 7, "stream": true, "stream_options": map[string]any{"include_usage": true}}, prompt: len(ids2), max: 7, model: "sim-model", stream: true, usage: true},
		{name: "stream with continuous usage", body: map[string]any{"model": "adapter", "prompt": "abcdef", "max_tokens": 4, "stream": true, "stream_options": map[string]any{"include_usage": true, "continuous_usage_stats": true}}, prompt: 6, max: 4, model: "adapter", stream: true, usage: true, contUse: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := &api{t: t, base: a.base, hc: a.hc}
			if !tc.stream {
				data := a.post("/v1/completions", tc.body)
				var raw map[string]any
				if err := json.Unmarshal(data, &raw); err != nil {
					t.Fatal(err)
				}
				checkKeys(t, "response", raw, "id", "object", "created", "model", "choices", "usage", "service_tier", "system_fingerprint", "kv_transfer_params")
				checkKeys(t, "choice", raw["choices"].([]any)[0].(map[string]any), "index", "text", "logprobs", "finish_reason", "stop_reason", "prompt_logprobs")
				r := decode[completionJSON](t, data)
				if !strings.HasPrefix(r.ID, "cmpl-") || r.Object != "text_completion" || r.Model != tc.model || r.Created == 0 {
					t.Errorf("header fields: %s", data)
				}
				if len(r.Choices) != 1 || r.Choices[0].FinishReason == nil || *r.Choices[0].FinishReason != "length" || words(r.Choices[0].Text) != tc.max {
					t.Errorf("choices: %s", data)
				}
				if u := r.Usage; u == nil || u.PromptTokens != tc.prompt || u.CompletionTokens != tc.max || u.TotalTokens != tc.prompt+tc.max || u.cached(t) != 0 {
					t.Errorf("usage: %s", data)
				}
				return
			}
			evs := a.events("/v1/completions", tc.body)
			var got strings.Builder
			var last *usageJSON
			nContent := 0
			for i, ev := range evs {
				r := decode[completionJSON](t, []byte(ev))
				if r.Object != "text_completion" || !strings.HasPrefix(r.ID, "cmpl-") || r.Model != tc.model {
					t.Errorf("chunk %d: %s", i, ev)
				}
				if len(r.Choices) == 0 {
					if !tc.usage || i != len(evs)-1 || r.Usage == nil {
						t.Errorf("unexpected usage chunk %d: %s", i, ev)
					}
					if !strings.Contains(ev, `"choices":[]`) {
						t.Errorf("usage chunk without an empty choices list: %s", ev)
					}
					last = r.Usage
					continue
				}
				var raw struct {
					Choices []map[string]any `json:"choices"`
				}
				_ = json.Unmarshal([]byte(ev), &raw)
				checkKeys(t, "chunk choice", raw.Choices[0], "index", "text", "logprobs", "finish_reason", "stop_reason")
				nContent++
				got.WriteString(r.Choices[0].Text)
				final := got.Len() > 0 && words(got.String()) == tc.max
				if fr := r.Choices[0].FinishReason; final != (fr != nil) || (fr != nil && *fr != "length") {
					t.Errorf("chunk %d finish_reason: %s", i, ev)
				}
				if tc.contUse != (r.Usage != nil) {
					t.Errorf("chunk %d usage: %s", i, ev)
				}
				if r.Usage != nil && (r.Usage.PromptTokens != tc.prompt || r.Usage.CompletionTokens != words(got.String())) {
					t.Errorf("chunk %d continuous usage: %s", i, ev)
				}
			}
			if words(got.String()) != tc.max || nContent == 0 {
				t.Errorf("streamed %q in %d chunks, want %d words", got.String(), nContent, tc.max)
			}
			if tc.usage {
				if last == nil || last.PromptTokens != tc.prompt || last.CompletionTokens != tc.max || last.TotalTokens != tc.prompt+tc.max || last.cached(t) != 0 {
					t.Errorf("final usage %+v", last)
				}
			} else if last != nil {
				t.Errorf("usage chunk without include_usage")
			}
		})
	}
}

func TestSeedMakesOutputReproducible(t *testing.T) {
	f := byteFleet(t, nil)
	a := newAPI(t, f.Workers()[0])
	body := map[string]any{"prompt": "same seed", "max_tokens": 12, "seed": 42}
	first := decode[completionJSON](t, a.post("/v1/completions", body)).Choices[0].Text
	second := decode[completionJSON](t, a.post("/v1/completions", body)).Choices[0].Text
	body["stream"] = true
	var streamed strings.Builder
	for _, ev := range a.events("/v1/completions", body) {
		streamed.WriteString(decode[completionJSON](t, []byte(ev)).Choices[0].Text)
	}
	if first != second || first != streamed.String() {
		t.Errorf("seed 42 gave %q, %q and streamed %q", first, second, streamed.String())
	}
	body["seed"] = 43
	delete(body, "stream")
	if other := decode[completionJSON](t, a.post("/v1/completions", body)).Choices[0].Text; other == first {
		t.Errorf("seeds 42 and 43 both gave %q", other)
	}
}

func TestCachedTokens(t *testing.T) {
	f := byteFleet(t, nil)
	a := newAPI(t, f.Workers()[0])
	p := text(1, 200)
	want := (200 - 1) / 16 * 16
	for i, wantCached := range []int{0, want} {
		r := decode[completionJSON](t, a.post("/v1/completions", map[string]any{"prompt": p, "max_tokens": 4}))
		if got := r.Usage.cached(t); got != wantCached {
			t.Errorf("request %d: cached_tokens %d, want %d", i, got, wantCached)
		}
	}
	evs := a.events("/v1/completions", map[string]any{"prompt": p, "max_tokens": 4, "stream": true, "stream_options": map[string]any{"include_usage": true}})
	if u := decode[completionJSON](t, []byte(evs[len(evs)-1])).Usage; u.cached(t) != want {
		t.Errorf("streamed cached_tokens %d, want %d", u.cached(t), want)
	}
	// The same prompt under the adapter shares nothing with the base model.
	r := decode[completionJSON](t, a.post("/v1/completions", map[string]any{"model": "adapter", "prompt": p, "max_tokens": 4}))
	if got := r.Usage.cached(t); got != 0 {
		t.Errorf("adapter: cached_tokens %d, want 0", got)
	}
}

func TestChat(t *testing.T) {
	f := qwenFleet(t)
	w := f.Workers()[0]
	a := newAPI(t, w)
	msgs := []map[string]any{
		{"role": "system", "content": "You are terse."},
		{"role": "user", "content": "Say something about prefix caches."},
	}
	// The prompt as vLLM's /tokenize renders it.
	tok := decode[tokenizeResponse](t, a.post("/tokenize", map[string]any{"model": "sim-model", "messages": msgs}))
	if tok.Count == 0 || tok.Count != len(tok.Tokens) || tok.MaxModelLen != 2048 {
		t.Fatalf("/tokenize: %+v", tok)
	}

	t.Run("non-streaming", func(t *testing.T) {
		a := &api{t: t, base: a.base, hc: a.hc}
		data := a.post("/v1/chat/completions", map[string]any{"model": "sim-model", "messages": msgs, "max_completion_tokens": 5})
		var raw map[string]any
		_ = json.Unmarshal(data, &raw)
		checkKeys(t, "response", raw, "id", "object", "created", "model", "choices", "usage", "service_tier", "system_fingerprint", "prompt_logprobs", "kv_transfer_params")
		choice := raw["choices"].([]any)[0].(map[string]any)
		checkKeys(t, "choice", choice, "index", "message", "logprobs", "finish_reason", "stop_reason")
		r := decode[completionJSON](t, data)
		if !strings.HasPrefix(r.ID, "chatcmpl-") || r.Object != "chat.completion" || r.Model != "sim-model" {
			t.Errorf("header fields: %s", data)
		}
		c := r.Choices[0]
		if c.Message == nil || c.Message.Role != "assistant" || words(c.Message.Content) != 5 || c.FinishReason == nil || *c.FinishReason != "length" {
			t.Errorf("choice: %s", data)
		}
		if u := r.Usage; u.PromptTokens != tok.Count || u.CompletionTokens != 5 || u.TotalTokens != tok.Count+5 {
			t.Errorf("usage: %s", data)
		}
		// max_tokens works too; max_completion_tokens wins over it.
		r = decode[completionJSON](t, a.post("/v1/chat/completions", map[string]any{"messages": msgs, "max_tokens": 3}))
		if r.Usage.CompletionTokens != 3 {
			t.Errorf("max_tokens 3: %+v", r.Usage)
		}
		r = decode[completionJSON](t, a.post("/v1/chat/completions", map[string]any{"messages": msgs, "max_tokens": 3, "max_completion_tokens": 2}))
		if r.Usage.CompletionTokens != 2 {
			t.Errorf("max_completion_tokens 2: %+v", r.Usage)
		}
	})

	t.Run("streaming", func(t *testing.T) {
		a := &api{t: t, base: a.base, hc: a.hc}
		// A conversation of its own, so that nothing of it is cached yet.
		msgs := []map[string]any{
			{"role": "system", "content": "You are verbose."},
			{"role": "user", "content": "Tell me about block hashes."},
		}
		tok := decode[tokenizeResponse](t, a.post("/tokenize", map[string]any{"messages": msgs}))
		evs := a.events("/v1/chat/completions", map[string]any{
			"model": "sim-model", "messages": msgs, "max_tokens": 6, "stream": true,
			"stream_options": map[string]any{"include_usage": true},
		})
		if len(evs) < 3 {
			t.Fatalf("%d events: %q", len(evs), evs)
		}
		var content strings.Builder
		for i, ev := range evs {
			r := decode[completionJSON](t, []byte(ev))
			if r.Object != "chat.completion.chunk" || !strings.HasPrefix(r.ID, "chatcmpl-") || r.ID != decode[completionJSON](t, []byte(evs[0])).ID {
				t.Errorf("chunk %d: %s", i, ev)
			}
			switch {
			case i == 0:
				if !strings.Contains(ev, `"delta":{"role":"assistant","content":""}`) || !strings.Contains(ev, `"finish_reason":null`) || r.Usage != nil {
					t.Errorf("first chunk: %s", ev)
				}
			case i == len(evs)-1:
				if !strings.Contains(ev, `"choices":[]`) || r.Usage == nil || r.Usage.PromptTokens != tok.Count || r.Usage.CompletionTokens != 6 || r.Usage.cached(t) != 0 {
					t.Errorf("usage chunk: %s", ev)
				}
			default:
				d := r.Choices[0].Delta
				if d == nil || d.Role != "" || d.Content == nil || strings.Contains(ev, `"role"`) {
					t.Fatalf("content chunk %d: %s", i, ev)
				}
				content.WriteString(*d.Content)
				lastContent := i == len(evs)-2
				if fr := r.Choices[0].FinishReason; lastContent != (fr != nil) || (fr != nil && *fr != "length") {
					t.Errorf("content chunk %d finish_reason: %s", i, ev)
				}
				if lastContent && !strings.Contains(ev, `"stop_reason":null`) {
					t.Errorf("last content chunk without stop_reason: %s", ev)
				}
			}
		}
		if words(content.String()) != 6 {
			t.Errorf("streamed content %q, want 6 words", content.String())
		}
		// The same conversation again hits the prefix cache.
		r := decode[completionJSON](t, a.post("/v1/chat/completions", map[string]any{"messages": msgs, "max_tokens": 1}))
		if want := (tok.Count - 1) / 16 * 16; r.Usage.cached(t) != want {
			t.Errorf("repeated conversation: cached_tokens %d, want %d", r.Usage.cached(t), want)
		}
	})

	t.Run("tokenize via HTTPRemote", func(t *testing.T) {
		remote := &tokenize.HTTPRemote{Client: a.hc, Endpoints: func(string) []string { return []string{w.URL()} }}
		got, err := remote.Tokenize(context.Background(), "sim-model", tokenize.Request{Model: "sim-model", Chat: &tokenize.ChatRequest{
			Messages: mustJSON(t, msgs), AddGenerationPrompt: true,
		}})
		if err != nil {
			t.Fatal(err)
		}
		if !equalIDs(got, tok.Tokens) {
			t.Errorf("HTTPRemote chat: %v, /tokenize %v", got, tok.Tokens)
		}
		// Tools change the prompt.
		tools := mustJSON(t, []map[string]any{{"type": "function", "function": map[string]any{"name": "lookup", "parameters": map[string]any{"type": "object"}}}})
		withTools, err := remote.Tokenize(context.Background(), "adapter", tokenize.Request{Model: "adapter", Chat: &tokenize.ChatRequest{
			Messages: mustJSON(t, msgs), Tools: tools, AddGenerationPrompt: true,
		}})
		if err != nil {
			t.Fatal(err)
		}
		if len(withTools) <= len(got) {
			t.Errorf("tools did not change the prompt: %d tokens, without %d", len(withTools), len(got))
		}
		r := decode[completionJSON](t, a.post("/v1/chat/completions", map[string]any{"model": "adapter", "messages": msgs, "tools": json.RawMessage(tools), "max_tokens": 1}))
		if r.Usage.PromptTokens != len(withTools) || r.Model != "adapter" {
			t.Errorf("chat with tools: %+v, model %q; want %d prompt tokens", r.Usage, r.Model, len(withTools))
		}
		text, err := remote.Tokenize(context.Background(), "sim-model", tokenize.Request{Model: "sim-model", Text: "Hello world"})
		if err != nil || len(text) == 0 {
			t.Errorf("HTTPRemote text: %v, %v", text, err)
		}
	})

	t.Run("template errors", func(t *testing.T) {
		a := &api{t: t, base: a.base, hc: a.hc}
		for _, tc := range []struct {
			name string
			body map[string]any
		}{
			{"no messages", map[string]any{"messages": []any{}}},
			{"continue and generation prompt", map[string]any{"messages": msgs, "continue_final_message": true, "add_generation_prompt": true}},
			{"tools not a list", map[string]any{"messages": msgs, "tools": "lookup"}},
			{"bad kwargs", map[string]any{"messages": msgs, "chat_template_kwargs": []int{1}}},
		} {
			for _, path := range []string{"/v1/chat/completions", "/tokenize"} {
				status, _, data := a.call(http.MethodPost, path, tc.body)
				if e := decode[errorJSON](t, data); status != 400 || e.Error.Type != "BadRequestError" || e.Error.Code != 400 || e.Error.Message == "" {
					t.Errorf("%s %s: %d %s", tc.name, path, status, data)
				}
			}
		}
	})
}

func mustJSON(t *testing.T, v any) json.RawMessage {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func equalIDs(a, b []uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestDataParallelRankHeader(t *testing.T) {
	f := byteFleet(t, func(c *Config) { c.DPSize = 2 })
	w := f.Workers()[0]
	a := newAPI(t, w)
	p := text(2, 40)
	for i, rank := range []int{1, 1, 0} {
		a.post("/v1/completions", map[string]any{"prompt": p, "max_tokens": 2}, "X-data-parallel-rank", []string{"0", "1"}[rank])
		want := [2]uint64{}
		for _, r := range []int{1, 1, 0}[:i+1] {
			want[r] += 40
		}
		for r, rk := range w.Ranks() {
			if got := rk.Stats().PromptTokens; got != want[r] {
				t.Errorf("after request %d: rank %d has %d prompt tokens, want %d", i, r, got, want[r])
			}
		}
	}
	// The second request on rank 1 found the first one's blocks.
	if st := w.Ranks()[1].Stats(); st.PrefixHits != (40-1)/16*16 {
		t.Errorf("rank 1 prefix hits %d", st.PrefixHits)
	}
	// A stream goes to the chosen rank too.
	a.events("/v1/completions", map[string]any{"prompt": "xyz", "max_tokens": 2, "stream": true}, "X-data-parallel-rank", "0")
	if got := w.Ranks()[0].Stats().PromptTokens; got != 43 {
		t.Errorf("rank 0 has %d prompt tokens after the stream, want 43", got)
	}
	for _, bad := range []string{"2", "-1", "one", "1.0"} {
		status, _, data := a.call(http.MethodPost, "/v1/completions", map[string]any{"prompt": "x"}, "X-data-parallel-rank", bad)
		if e := decode[errorJSON](t, data); status != 400 || e.Error.Type != "BadRequestError" {
			t.Errorf("rank %q: %d %s", bad, status, data)
		}
	}
}

func TestErrors(t *testing.T) {
	f := byteFleet(t, nil)
	a := newAPI(t, f.Workers()[0])
	long := text(3, 600)
	for _, tc := range []struct {
		name         string
		method, path string
		body         any
		status       int
		typ          string
		msg          string // in the message
	}{
		{"bad JSON", "POST", "/v1/completions", `{"prompt": `, 400, "BadRequestError", "invalid JSON"},
		{"empty body", "POST", "/v1/completions", nil, 400, "BadRequestError", ""},
		{"not an object", "POST", "/v1/completions", `[1]`, 400, "BadRequestError", ""},
		{"wrong field type", "POST", "/v1/completions", `{"prompt": "x", "max_tokens": "many"}`, 400, "BadRequestError", ""},
		{"no prompt", "POST", "/v1/completions", map[string]any{"model": "sim-model"}, 400, "BadRequestError", "prompt"},
		{"empty prompt", "POST", "/v1/completions", map[string]any{"prompt": ""}, 400, "BadRequestError", "empty"},
		{"empty id list", "POST", "/v1/completions", map[string]any{"prompt": []int{}}, 400, "BadRequestError", "empty"},
		{"two prompts", "POST", "/v1/completions", map[string]any{"prompt": []string{"a", "b"}}, 400, "BadRequestError", "one prompt"},
		{"two id lists", "POST", "/v1/completions", map[string]any{"prompt": [][]int{{1}, {2}}}, 400, "BadRequestError", "one prompt"},
		{"negative id", "POST", "/v1/completions", map[string]any{"prompt": []int{1, -2}}, 400, "BadRequestError", "prompt"},
		{"n 2", "POST", "/v1/completions", map[string]any{"prompt": "x", "n": 2}, 400, "BadRequestError", "n"},
		{"max_tokens 0", "POST", "/v1/completions", map[string]any{"prompt": "x", "max_tokens": 0}, 400, "BadRequestError", "at least 1"},
		{"prompt too long", "POST", "/v1/completions", map[string]any{"prompt": long}, 400, "BadRequestError", "maximum context length is 512"},
		{"max_tokens too large", "POST", "/v1/completions", map[string]any{"prompt": "x", "max_tokens": 512}, 400, "BadRequestError", "maximum context length is 512"},
		{"stream options without stream", "POST", "/v1/completions", map[string]any{"prompt": "x", "stream_options": map[string]any{"include_usage": true}}, 400, "BadRequestError", "stream"},
		{"unknown model", "POST", "/v1/completions", map[string]any{"model": "gpt-9", "prompt": "x"}, 404, "NotFoundError", "The model `gpt-9` does not exist."},
		{"chat unknown model", "POST", "/v1/chat/completions", map[string]any{"model": "gpt-9", "messages": []any{}}, 404, "NotFoundError", "does not exist"},
		{"chat without messages", "POST", "/v1/chat/completions", map[string]any{"model": "sim-model"}, 400, "BadRequestError", "messages"},
		{"chat n 3", "POST", "/v1/chat/completions", map[string]any{"messages": []any{}, "n": 3}, 400, "BadRequestError", "n"},
		{"chat without a template", "POST", "/v1/chat/completions", map[string]any{"messages": []map[string]any{{"role": "user", "content": "hi"}}}, 400, "BadRequestError", "chat template"},
		{"GET completions", "GET", "/v1/completions", nil, 405, "Method Not Allowed", ""},
		{"GET chat", "GET", "/v1/chat/completions", nil, 405, "Method Not Allowed", ""},
		{"POST models", "POST", "/v1/models", nil, 405, "Method Not Allowed", ""},
		{"GET tokenize", "GET", "/tokenize", nil, 405, "Method Not Allowed", ""},
		{"GET reset", "GET", "/reset_prefix_cache", nil, 405, "Method Not Allowed", ""},
		{"unknown path", "GET", "/v2/nothing", nil, 404, "Not Found", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := &api{t: t, base: a.base, hc: a.hc}
			status, hdr, data := a.call(tc.method, tc.path, tc.body)
			if status != tc.status || !strings.HasPrefix(hdr.Get("Content-Type"), "application/json") {
				t.Fatalf("status %d (%s), want %d: %s", status, hdr.Get("Content-Type"), tc.status, data)
			}
			var raw map[string]map[string]any
			if err := json.Unmarshal(data, &raw); err != nil {
				t.Fatalf("%s: %v", data, err)
			}
			checkKeys(t, "error", raw["error"], "message", "type", "param", "code")
			e := decode[errorJSON](t, data)
			if e.Error.Type != tc.typ || e.Error.Code != tc.status || e.Error.Param != nil || !strings.Contains(e.Error.Message, tc.msg) {
				t.Errorf("error %+v, want type %q, message with %q", e.Error, tc.typ, tc.msg)
			}
			if tc.status == 405 && hdr.Get("Allow") == "" {
				t.Errorf("405 without Allow")
			}
		})
	}
	// Nothing reached the engine.
	if st := f.Workers()[0].Ranks()[0].Stats(); st.PromptTokens != 0 {
		t.Errorf("invalid requests reached the engine: %+v", st)
	}
}

func TestModels(t *testing.T) {
	f := byteFleet(t, func(c *Config) { c.LoRA = []string{"a1", "a2"} })
	a := newAPI(t, f.Workers()[0])
	status, _, data := a.call(http.MethodGet, "/v1/models", nil)
	if status != 200 {
		t.Fatalf("%d %s", status, data)
	}
	var list struct {
		Object string           `json:"object"`
		Data   []map[string]any `json:"data"`
	}
	if err := json.Unmarshal(data, &list); err != nil {
		t.Fatal(err)
	}
	if list.Object != "list" || len(list.Data) != 3 {
		t.Fatalf("%s", data)
	}
	for i, want := range []struct {
		id, parent string
		maxLen     any
	}{{"sim-model", "", 512.0}, {"a1", "sim-model", nil}, {"a2", "sim-model", nil}} {
		c := list.Data[i]
		checkKeys(t, "card", c, "id", "object", "created", "owned_by", "root", "parent", "max_model_len", "permission")
		var parent any
		if want.parent != "" {
			parent = want.parent
		}
		if c["id"] != want.id || c["object"] != "model" || c["owned_by"] != "vllm" || c["root"] != want.id || c["parent"] != parent || c["max_model_len"] != want.maxLen {
			t.Errorf("card %d: %v", i, c)
		}
		perms, _ := c["permission"].([]any)
		if len(perms) != 1 || perms[0].(map[string]any)["object"] != "model_permission" {
			t.Errorf("card %d permission: %v", i, c["permission"])
		}
	}
	if status, _, _ := a.call(http.MethodHead, "/v1/models", nil); status != 200 {
		t.Errorf("HEAD /v1/models: %d", status)
	}
}

func TestTokenize(t *testing.T) {
	f := byteFleet(t, nil)
	w := f.Workers()[0]
	a := newAPI(t, w)
	data := a.post("/tokenize", map[string]any{"model": "sim-model", "prompt": "Hi!"})
	var raw map[string]any
	_ = json.Unmarshal(data, &raw)
	checkKeys(t, "response", raw, "count", "max_model_len", "tokens", "token_strs")
	if r := decode[tokenizeResponse](t, data); r.Count != 3 || r.MaxModelLen != 512 || !equalIDs(r.Tokens, []uint32{'H', 'i', '!'}) || r.TokenStrs != nil {
		t.Errorf("%s", data)
	}
	for _, tc := range []struct {
		name   string
		body   map[string]any
		status int
	}{
		{"adapter, no special tokens", map[string]any{"model": "adapter", "prompt": "ab", "add_special_tokens": false}, 200},
		{"no model", map[string]any{"prompt": "ab"}, 200},
		{"empty prompt", map[string]any{"prompt": ""}, 200},
		{"unknown model", map[string]any{"model": "nope", "prompt": "ab"}, 404},
		{"neither prompt nor messages", map[string]any{"model": "sim-model"}, 400},
		{"both", map[string]any{"prompt": "a", "messages": []any{}}, 400},
		{"chat without a template", map[string]any{"messages": []map[string]any{{"role": "user", "content": "hi"}}}, 400},
	} {
		status, _, data := a.call(http.MethodPost, "/tokenize", tc.body)
		if status != tc.status {
			t.Errorf("%s: %d %s", tc.name, status, data)
		}
	}
	if r := decode[tokenizeResponse](t, a.post("/tokenize", map[string]any{"prompt": ""})); r.Tokens == nil || r.Count != 0 {
		t.Errorf("empty prompt: %+v", r)
	}
	// kvgate's remote tokenizer path, against the simulator.
	remote := &tokenize.HTTPRemote{Client: a.hc, Endpoints: func(string) []string { return []string{w.URL()} }}
	got, err := remote.Tokenize(context.Background(), "adapter", tokenize.Request{Model: "adapter", Text: "héllo"})
	if err != nil || !equalIDs(got, []uint32{'h', 0xc3, 0xa9, 'l', 'l', 'o'}) {
		t.Errorf("HTTPRemote: %v, %v", got, err)
	}
	if _, err := remote.Tokenize(context.Background(), "sim-model", tokenize.Request{Model: "sim-model", Chat: &tokenize.ChatRequest{Messages: json.RawMessage(`[]`)}}); err == nil || !strings.Contains(err.Error(), "status 400") {
		t.Errorf("HTTPRemote chat without a template: %v", err)
	}
}

func TestHealthAndResetPrefixCache(t *testing.T) {
	f := byteFleet(t, func(c *Config) { c.DPSize = 2 })
	w := f.Workers()[0]
	a := newAPI(t, w)
	if status, _, data := a.call(http.MethodGet, "/health", nil); status != 200 || len(data) != 0 {
		t.Errorf("/health: %d %q", status, data)
	}
	p := text(4, 100)
	for rank := range 2 {
		a.post("/v1/completions", map[string]any{"prompt": p, "max_tokens": 1}, "X-data-parallel-rank", []string{"0", "1"}[rank])
	}
	for r, rk := range w.Ranks() {
		if rk.Stats().CachedBlocks == 0 {
			t.Fatalf("rank %d caches nothing", r)
		}
	}
	if status, _, data := a.call(http.MethodPost, "/reset_prefix_cache", nil); status != 200 || len(data) != 0 {
		t.Fatalf("/reset_prefix_cache: %d %q", status, data)
	}
	for r, rk := range w.Ranks() {
		if n := rk.Stats().CachedBlocks; n != 0 {
			t.Errorf("rank %d still caches %d blocks", r, n)
		}
	}
	r := decode[completionJSON](t, a.post("/v1/completions", map[string]any{"prompt": p, "max_tokens": 1}, "X-data-parallel-rank", "1"))
	if r.Usage.cached(t) != 0 {
		t.Errorf("cached_tokens %d after the reset", r.Usage.cached(t))
	}
}
