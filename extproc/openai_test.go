package extproc

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

func TestParsePrompt(t *testing.T) {
	for _, tc := range []struct {
		name, path, body string
		status           int // 0: ok
		check            func(t *testing.T, p Prompt)
	}{
		{name: "completion text", path: "/v1/completions", body: `{"model":"m","prompt":"hi","stream":true}`, check: func(t *testing.T, p Prompt) {
			if p.Kind != KindCompletion || p.Tokenize.Text != "hi" || !p.Stream || p.Tokenize.Model != "m" || p.Tokenize.AddSpecialTokens != nil {
				t.Errorf("%+v", p)
			}
		}},
		{name: "completion ids", path: "/v1/completions?x=1", body: `{"model":"m","prompt":[1,2,3]}`, check: func(t *testing.T, p Prompt) {
			if !slices.Equal(p.IDs, []uint32{1, 2, 3}) {
				t.Errorf("ids %v", p.IDs)
			}
		}},
		{name: "completion batch of texts", path: "/v1/completions", body: `{"model":"m","prompt":["a","b"],"add_special_tokens":false}`, check: func(t *testing.T, p Prompt) {
			if p.Tokenize.Text != "a" || *p.Tokenize.AddSpecialTokens {
				t.Errorf("%+v", p)
			}
		}},
		{name: "completion batch of ids", path: "/v1/completions/", body: `{"model":"m","prompt":[[4,5],[6]]}`, check: func(t *testing.T, p Prompt) {
			if !slices.Equal(p.IDs, []uint32{4, 5}) {
				t.Errorf("ids %v", p.IDs)
			}
		}},
		{name: "chat", path: "/v1/chat/completions", body: `{"model":"m","messages":[{"role":"user","content":"x"}],"tools":null,"chat_template_kwargs":{"enable_thinking":false}}`, check: func(t *testing.T, p Prompt) {
			c := p.Tokenize.Chat
			if c == nil || !c.AddGenerationPrompt || c.Tools != nil || string(c.Kwargs) != `{"enable_thinking":false}` {
				t.Errorf("%+v", c)
			}
		}},
		{name: "chat continue final message", path: "/v1/chat/completions", body: `{"model":"m","messages":[{"role":"assistant","content":"x"}],"continue_final_message":true}`, check: func(t *testing.T, p Prompt) {
			if c := p.Tokenize.Chat; c.AddGenerationPrompt || !c.ContinueFinalMessage {
				t.Errorf("%+v", c)
			}
		}},
		{name: "responses string", path: "/v1/responses", body: `{"model":"m","input":"q","instructions":"be brief"}`, check: func(t *testing.T, p Prompt) {
			want := `[{"content":"be brief","role":"system"},{"content":"q","role":"user"}]`
			if got := string(p.Tokenize.Chat.Messages); got != want {
				t.Errorf("messages %s, want %s", got, want)
			}
		}},
		{name: "responses items and tools", path: "/v1/responses", body: `{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"q"}]},{"type":"function_call_output","call_id":"c","output":"r"}],"tools":[{"type":"function","name":"f","parameters":{}}]}`, check: func(t *testing.T, p Prompt) {
			var msgs []map[string]any
			if err := json.Unmarshal(p.Tokenize.Chat.Messages, &msgs); err != nil || len(msgs) != 2 {
				t.Fatalf("%s %v", p.Tokenize.Chat.Messages, err)
			}
			if parts := msgs[0]["content"].([]any); parts[0].(map[string]any)["type"] != "text" {
				t.Errorf("input_text not turned into text: %v", parts)
			}
			if msgs[1]["type"] != "function_call_output" {
				t.Errorf("item lost: %v", msgs[1])
			}
			if !strings.Contains(string(p.Tokenize.Chat.Tools), `"function":{"name":"f"`) {
				t.Errorf("tools %s", p.Tokenize.Chat.Tools)
			}
		}},
		{name: "embeddings are load only", path: "/v1/embeddings", body: `{"model":"m","input":"abc"}`, check: func(t *testing.T, p Prompt) {
			if !p.LoadOnly || p.Kind != KindEmbeddings {
				t.Errorf("%+v", p)
			}
		}},
		{name: "other path", path: "/v1/audio", body: `{"model":"m"}`, check: func(t *testing.T, p Prompt) {
			if !p.LoadOnly {
				t.Errorf("%+v", p)
			}
		}},
		{name: "empty body", path: "/v1/completions", body: " ", status: 400},
		{name: "bad json", path: "/v1/completions", body: `{"model":`, status: 400},
		{name: "wrong type", path: "/v1/chat/completions", body: `{"model":1,"messages":[]}`, status: 400},
		{name: "no model", path: "/v1/completions", body: `{"prompt":"x"}`, status: 400},
		{name: "no prompt", path: "/v1/completions", body: `{"model":"m"}`, status: 400},
		{name: "empty ids", path: "/v1/completions", body: `{"model":"m","prompt":[]}`, status: 400},
		{name: "negative id", path: "/v1/completions", body: `{"model":"m","prompt":[-1]}`, status: 400},
		{name: "empty batch", path: "/v1/completions", body: `{"model":"m","prompt":[[]]}`, status: 400},
		{name: "no messages", path: "/v1/chat/completions", body: `{"model":"m","messages":null}`, status: 400},
		{name: "responses without input", path: "/v1/responses", body: `{"model":"m"}`, status: 400},
		{name: "responses bad item", path: "/v1/responses", body: `{"model":"m","input":[{"content":"x"}]}`, status: 400},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, e := ParsePrompt(tc.path, []byte(tc.body))
			if tc.status != 0 {
				if e == nil || e.Status != tc.status {
					t.Fatalf("error %v, want status %d", e, tc.status)
				}
				var body struct {
					Error struct {
						Message string `json:"message"`
						Code    int    `json:"code"`
					} `json:"error"`
				}
				if err := json.Unmarshal(e.Body(), &body); err != nil || body.Error.Code != tc.status || body.Error.Message == "" {
					t.Errorf("error body %s", e.Body())
				}
				return
			}
			if e != nil {
				t.Fatal(e)
			}
			tc.check(t, p)
		})
	}
}

func TestUsageScanner(t *testing.T) {
	sse := "data: {\"choices\":[{\"text\":\"a\"}],\"usage\":null}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":8}}}\n\ndata: [DONE]\n\n"
	for _, tc := range []struct {
		name   string
		sse    bool
		chunks []string
		want   *Usage
	}{
		{"sse split anywhere", true, []string{sse[:30], sse[30:101], sse[101:]}, &Usage{PromptTokens: 10, CompletionTokens: 2, CachedTokens: 8}},
		{"sse without usage", true, []string{"data: {\"usage\":null}\n\ndata: [DONE]\n\n"}, nil},
		{"json", false, []string{`{"usage":{"prompt_tokens":3,`, `"completion_tokens":1}}`}, &Usage{PromptTokens: 3, CompletionTokens: 1}},
		{"json error", false, []string{`{"error":{}}`}, nil},
		{"json too big", false, []string{strings.Repeat(" ", maxUsageBody), `{"usage":{"prompt_tokens":3}}`}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := usageScanner{sse: tc.sse}
			for _, c := range tc.chunks {
				s.write([]byte(c))
			}
			got := s.result()
			if (got == nil) != (tc.want == nil) || (got != nil && *got != *tc.want) {
				t.Errorf("usage %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestSubsetHintAndHeaders(t *testing.T) {
	md := func(v *structpb.Value) *corev3.Metadata {
		return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{SubsetNamespace: {Fields: map[string]*structpb.Value{SubsetKey: v}}}}
	}
	list, _ := structpb.NewList([]any{"1.2.3.4:80", " 5.6.7.8:80 "})
	for _, tc := range []struct {
		name string
		md   *corev3.Metadata
		want []string
		err  bool
	}{
		{"none", nil, nil, false},
		{"other namespace", &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"x": {}}}, nil, false},
		{"list", md(structpb.NewListValue(list)), []string{"1.2.3.4:80", "5.6.7.8:80"}, false},
		{"comma string", md(structpb.NewStringValue("1.2.3.4:80,5.6.7.8:80")), []string{"1.2.3.4:80", "5.6.7.8:80"}, false},
		{"empty list", md(structpb.NewListValue(&structpb.ListValue{})), nil, true},
		{"empty string", md(structpb.NewStringValue(" ")), nil, true},
	} {
		got, e := subsetHint(tc.md)
		if !slices.Equal(got, tc.want) || (e != nil) != tc.err {
			t.Errorf("%s: %v %v", tc.name, got, e)
		}
	}
	h := headerMap(&corev3.HeaderMap{Headers: []*corev3.HeaderValue{
		{Key: ":Path", RawValue: []byte("/v1/x")}, {Key: "x-request-id", Value: "abc"},
	}})
	if h[":path"] != "/v1/x" || h["x-request-id"] != "abc" {
		t.Errorf("headers %v", h)
	}
	for in, want := range map[string]string{"http://h:1/v1": "h:1", "h:2": "h:2", "https://h:3": "h:3"} {
		if got := HostPort(in); got != want {
			t.Errorf("HostPort(%q) = %q", in, got)
		}
	}
}

// FuzzParsePrompt: any body on any path is parsed or refused with a 4xx
// error, never a panic.
func FuzzParsePrompt(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","prompt":"hi"}`, `{"model":"m","prompt":[[1],[2]]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"x"}]}]}`,
		`{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"q"}]},{"type":"x"}],"tools":[{"type":"function","name":"f"}]}`,
		`{"model":"m","input":"x","instructions":"y"}`, `[]`, `null`, `{"prompt":1e400}`,
	} {
		for _, path := range []string{"/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/embeddings"} {
			f.Add(path, []byte(s))
		}
	}
	f.Fuzz(func(t *testing.T, path string, body []byte) {
		p, e := ParsePrompt(path, body)
		if e != nil {
			if e.Status < 400 || e.Status >= 500 || !json.Valid(e.Body()) {
				t.Fatalf("error %d %s", e.Status, e.Body())
			}
			return
		}
		if p.Model == "" {
			t.Fatal("accepted without a model")
		}
		if c := p.Tokenize.Chat; c != nil && !json.Valid(c.Messages) {
			t.Fatalf("messages not JSON: %s", c.Messages)
		}
	})
}
