package tokenize

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/fixture"
)

var tplGoldenNow = time.Date(2024, 7, 23, 15, 4, 5, 0, time.UTC)

func tplFixedClock() time.Time { return tplGoldenNow }

type tplGoldenFile struct {
	Templates map[string]struct {
		Model   string            `json:"model"`
		Dir     string            `json:"dir"`
		File    string            `json:"file"`
		Special map[string]string `json:"special"`
	} `json:"templates"`
	Messages  map[string]string `json:"messages"`
	Tools     string            `json:"tools"`
	Documents string            `json:"documents"`
	Cases     []struct {
		Template             string  `json:"template"`
		Messages             string  `json:"messages"`
		AddGenerationPrompt  bool    `json:"add_generation_prompt"`
		ContinueFinalMessage bool    `json:"continue_final_message"`
		Tools                bool    `json:"tools"`
		Documents            bool    `json:"documents"`
		Kwargs               *string `json:"kwargs"`
		Output               *string `json:"output"`
		Error                *string `json:"error"`
		ErrorType            string  `json:"error_type"`
	} `json:"cases"`
}

func tplLoadGolden(t testing.TB) *tplGoldenFile {
	t.Helper()
	path := "testdata/templates/golden.json"
	if p := os.Getenv("KVGATE_TEMPLATE_GOLDEN"); p != "" {
		path = p // an alternative matrix in the same format, e.g. a randomized one
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var g tplGoldenFile
	if err := json.Unmarshal(raw, &g); err != nil {
		t.Fatal(err)
	}
	return &g
}

func tplGoldenTemplate(t testing.TB, g *tplGoldenFile, name string) *ChatTemplate {
	t.Helper()
	ref, ok := g.Templates[name]
	if !ok {
		t.Fatalf("golden template %q not described", name)
	}
	var c *ChatTemplate
	var err error
	switch {
	case ref.Model != "":
		c, err = LoadChatTemplate(fixture.Family(t, ref.Model))
	case ref.Dir != "":
		c, err = LoadChatTemplate(filepath.Join("testdata/templates", ref.Dir))
	default:
		var src []byte
		if src, err = os.ReadFile(filepath.Join("testdata/templates", ref.File)); err == nil {
			c, err = ParseChatTemplate(string(src), ref.Special)
		}
	}
	if err != nil {
		t.Fatalf("template %s: %v", name, err)
	}
	return c.withClock(tplFixedClock)
}

// TestChatTemplateGolden renders the gen.py matrix (real and synthetic templates x
// conversations x flags) and compares byte for byte with Python Jinja2 + the vLLM
// request handling transcribed in gen.py.
func TestChatTemplateGolden(t *testing.T) {
	g := tplLoadGolden(t)
	var models []string // the real models, whose files may be absent
	for _, ref := range g.Templates {
		if ref.Model != "" && !slices.Contains(models, ref.Model) {
			models = append(models, ref.Model)
		}
	}
	slices.Sort(models)
	absent := map[string]bool{}
	for i, dir := range fixture.Optional(t, models...) {
		absent[models[i]] = dir == ""
	}
	templates := map[string]*ChatTemplate{}
	matched, skipped := 0, 0
	for i, c := range g.Cases {
		if absent[g.Templates[c.Template].Model] {
			skipped++
			continue
		}
		tpl := templates[c.Template]
		if tpl == nil {
			tpl = tplGoldenTemplate(t, g, c.Template)
			templates[c.Template] = tpl
		}
		req := ChatRequest{
			Messages:             json.RawMessage(g.Messages[c.Messages]),
			AddGenerationPrompt:  c.AddGenerationPrompt,
			ContinueFinalMessage: c.ContinueFinalMessage,
		}
		if c.Tools {
			req.Tools = json.RawMessage(g.Tools)
		}
		if c.Documents {
			req.Documents = json.RawMessage(g.Documents)
		}
		if c.Kwargs != nil {
			req.Kwargs = json.RawMessage(*c.Kwargs)
		}
		name := fmt.Sprintf("#%d %s/%s agp=%v cfm=%v tools=%v", i, c.Template, c.Messages, c.AddGenerationPrompt, c.ContinueFinalMessage, c.Tools)
		if c.Kwargs != nil {
			name += " kwargs=" + *c.Kwargs
		}
		got, err := tpl.Render(req)
		switch {
		case c.Error != nil:
			var te *TemplateError
			if !errors.As(err, &te) {
				t.Errorf("%s: want %s %q, got output %q, err %v", name, c.ErrorType, *c.Error, got, err)
				continue
			}
			if te.Message != *c.Error {
				t.Errorf("%s: error message\n got: %q\nwant: %q", name, te.Message, *c.Error)
				continue
			}
		case err != nil:
			t.Errorf("%s: unexpected error %v", name, err)
			continue
		case got != *c.Output:
			t.Errorf("%s: output differs\n%s", name, tplFirstDiff(got, *c.Output))
			continue
		}
		matched++
	}
	t.Logf("%d/%d golden cases match", matched, len(g.Cases)-skipped)
	if skipped > 0 {
		t.Logf("skipped %d cases of real models whose files are absent", skipped)
	}
}

func tplFirstDiff(got, want string) string {
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	lo := i - 60
	if lo < 0 {
		lo = 0
	}
	clip := func(s string) string {
		if i+60 < len(s) {
			return s[lo : i+60]
		}
		return s[lo:]
	}
	return fmt.Sprintf("at byte %d\n got: %q\nwant: %q", i, clip(got), clip(want))
}

func TestLoadChatTemplate(t *testing.T) {
	// chat_template.jinja wins over the config field; its trailing newline is dropped.
	c, err := LoadChatTemplate("testdata/templates/models/jinja_override")
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.Render(ChatRequest{Messages: json.RawMessage(`[{"role":"user","content":"hi"}]`), AddGenerationPrompt: true})
	if err != nil {
		t.Fatal(err)
	}
	if want := "<bos><user>hi<eos><assistant>"; got != want {
		t.Errorf("jinja override: got %q, want %q", got, want)
	}

	// a list of named templates: "default", or "tool_use" when the request has tools
	c, err = LoadChatTemplate("testdata/templates/models/multi")
	if err != nil {
		t.Fatal(err)
	}
	msgs := json.RawMessage(`[{"role":"user","content":"hi"}]`)
	got, err = c.Render(ChatRequest{Messages: msgs})
	if err != nil || got != "<s>[user] hi\n" {
		t.Errorf("default template: got %q, %v", got, err)
	}
	got, err = c.Render(ChatRequest{Messages: msgs, Tools: json.RawMessage(`[{"type":"function","function":{"name":"f"}}]`)})
	if err != nil || got != "<s>TOOLS f\n[user] hi" { // trim_blocks eats the newline after endif
		t.Errorf("tool_use template: got %q, %v", got, err)
	}
	got, err = c.Render(ChatRequest{Messages: msgs, Tools: json.RawMessage(`null`)})
	if err != nil || got != "<s>[user] hi\n" {
		t.Errorf("tools null: got %q, %v", got, err)
	}

	if _, err := LoadChatTemplate("testdata/templates/models/none"); !errors.Is(err, ErrNoChatTemplate) {
		t.Errorf("no template: got %v, want ErrNoChatTemplate", err)
	}
	if _, err := LoadChatTemplate("testdata/templates/models/does-not-exist"); err == nil || errors.Is(err, ErrNoChatTemplate) {
		t.Errorf("missing dir: got %v, want a file-system error", err)
	}
}

func TestLoadRealChatTemplates(t *testing.T) {
	fixture.Families(t, "llama3", "qwen2.5", "qwen3", "phi3", "llama2")
	msgs := json.RawMessage(`[{"role":"user","content":"Hi"}]`)
	for model, want := range map[string]string{
		"llama3":  "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
		"qwen2.5": "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
		"qwen3":   "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
		"phi3":    "<|user|>\nHi<|end|>\n<|assistant|>\n",
	} {
		c, err := LoadChatTemplate(fixture.Family(t, model))
		if err != nil {
			t.Fatalf("%s: %v", model, err)
		}
		got, err := c.Render(ChatRequest{Messages: msgs, AddGenerationPrompt: true})
		if err != nil || got != want {
			t.Errorf("%s: got %q, %v; want %q", model, got, err, want)
		}
	}
	if _, err := LoadChatTemplate(fixture.Family(t, "llama2")); !errors.Is(err, ErrNoChatTemplate) {
		t.Errorf("llama2 has no chat template: got %v", err)
	}
}

func TestContentFormatDetection(t *testing.T) {
	for _, tc := range []struct {
		src  string
		want contentFormat
	}{
		{`{% for m in messages %}{{ m.content }}{% endfor %}`, formatString},
		{`{% for m in messages %}{% for p in m.content %}{{ p.text }}{% endfor %}{% endfor %}`, formatOpenAI},
		{`{% for m in messages %}{% for p in m['content'] %}{{ p.text }}{% endfor %}{% endfor %}`, formatOpenAI},
		{`{% set loop_messages = messages[1:] %}{% for m in loop_messages %}{% for p in m.content | list %}{% endfor %}{% endfor %}`, formatOpenAI},
		{`{% set ms = messages | selectattr('role') %}{% for m in ms %}{% for p in m.content %}{% endfor %}{% endfor %}`, formatOpenAI},
		{`{% for m in messages %}{% set content = m.content %}{% for p in content %}{% endfor %}{% endfor %}`, formatOpenAI},
		{`{% for m in other %}{% for p in m.content %}{% endfor %}{% endfor %}`, formatString},
		{`{% for a, b in messages %}{% endfor %}{% for m in messages %}{% for p in m.content %}{% endfor %}{% endfor %}`, formatString},
		{`{% for m in messages %}{% if m.content is string %}{{ m.content }}{% endif %}{% endfor %}`, formatString},
	} {
		c, err := ParseChatTemplate(tc.src, nil)
		if err != nil {
			t.Fatalf("%s: %v", tc.src, err)
		}
		if c.format != tc.want {
			t.Errorf("%s: format %d, want %d", tc.src, c.format, tc.want)
		}
	}
}

func TestRenderRequestErrors(t *testing.T) {
	c, err := ParseChatTemplate(`{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}`, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		req  ChatRequest
		want string
	}{
		{ChatRequest{Messages: json.RawMessage(`{`)}, "invalid messages"},
		{ChatRequest{Messages: json.RawMessage(`{"role":"user"}`)}, "messages must be an array"},
		{ChatRequest{Messages: json.RawMessage(`[]`)}, "list index out of range"},
		{ChatRequest{Messages: json.RawMessage(`[1]`)}, "messages[0] must be an object"},
		{ChatRequest{Messages: json.RawMessage(`[{"content":"x"}]`)}, "messages[0].role must be a string"},
		{ChatRequest{Messages: json.RawMessage(`[{"role":"user","content":5}]`)}, "content must be a string or an array"},
		{ChatRequest{Messages: json.RawMessage(`[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]`)}, "image_url parts are not supported"},
		{ChatRequest{Messages: json.RawMessage(`[{"role":"user","content":"x"}]`), Tools: json.RawMessage(`[{"type":"function"}]`)}, "tools[0].function must be an object"},
		{ChatRequest{Messages: json.RawMessage(`[{"role":"user","content":"x"}]`), Kwargs: json.RawMessage(`[1]`)}, "chat_template_kwargs must be an object"},
		{ChatRequest{Messages: json.RawMessage(`[{"role":"user","content":"x"}]`), Kwargs: json.RawMessage(`{"tokenize": true}`)}, "Found unexpected chat template kwargs from request: {'tokenize'}"},
		{ChatRequest{Messages: json.RawMessage(`[{"role":"user","content":"x"}]`), Kwargs: json.RawMessage(`{"messages": []}`)}, "multiple values for keyword argument 'messages'"},
		{ChatRequest{Messages: json.RawMessage(`[{"role":"user","content":"x"}]`), AddGenerationPrompt: true, ContinueFinalMessage: true}, "Cannot set both"},
	} {
		_, err := c.Render(tc.req)
		var te *TemplateError
		if !errors.As(err, &te) || !strings.Contains(te.Message, tc.want) {
			t.Errorf("%s: got %v, want TemplateError containing %q", tc.req.Messages, err, tc.want)
		}
	}
	if _, err := ParseChatTemplate(`{% if x %}`, nil); err == nil {
		t.Error("unclosed if: want a parse error")
	}
	if _, err := ParseChatTemplate(`{{ x | nosuchfilter }}`, nil); err == nil {
		t.Error("unknown filter outside if: want a parse error")
	}
	if _, err := ParseChatTemplate(`{% if x %}{{ x | nosuchfilter }}{% endif %}`, nil); err != nil {
		t.Errorf("unknown filter inside if is a runtime error in jinja2: %v", err)
	}
}

// TestRenderConcurrent renders from many goroutines at once (run with -race).
func TestRenderConcurrent(t *testing.T) {
	src, err := os.ReadFile("testdata/templates/features.jinja")
	if err != nil {
		t.Fatal(err)
	}
	c, err := ParseChatTemplate(string(src), map[string]string{"bos_token": "<s>", "eos_token": "</s>"})
	if err != nil {
		t.Fatal(err)
	}
	c = c.withClock(tplFixedClock)
	reqs := []ChatRequest{
		{Messages: json.RawMessage(`[{"role":"user","content":"Hello there?"}]`), AddGenerationPrompt: true},
		{Messages: json.RawMessage(`[{"role":"system","content":"s"},{"role":"user","content":"a b c"},{"role":"assistant","content":"<think>x</think>y"},{"role":"user","content":"Why?"}]`)},
		{Messages: json.RawMessage(`[{"role":"user","content":"t"}]`), Tools: json.RawMessage(tplLoadGolden(t).Tools), Kwargs: json.RawMessage(`{"enable_thinking":false}`)},
	}
	want := make([]string, len(reqs))
	for i, r := range reqs {
		if want[i], err = c.Render(r); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for n := 0; n < 50; n++ {
				i := (g + n) % len(reqs)
				got, err := c.Render(reqs[i])
				if err != nil || got != want[i] {
					errs <- fmt.Errorf("goroutine %d request %d: %v / output differs", g, i, err)
					return
				}
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

var tplBenchMessages = json.RawMessage(`[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"What is the capital of France?"},{"role":"assistant","content":"The capital of France is Paris."},{"role":"user","content":"And what is its population?"}]`)

func BenchmarkRender(b *testing.B) {
	models := []string{"qwen2.5", "llama3", "qwen3"}
	for i, dir := range fixture.Families(b, models...) {
		model := models[i]
		c, err := LoadChatTemplate(dir)
		if err != nil {
			b.Fatal(err)
		}
		req := ChatRequest{Messages: tplBenchMessages, AddGenerationPrompt: true}
		b.Run(model, func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				if _, err := c.Render(req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// FuzzRender feeds arbitrary messages (and tools/kwargs) to real and synthetic
// templates: rendering must never panic, and failures must be errors.
func FuzzRender(f *testing.F) {
	f.Add([]byte(`[{"role":"user","content":"hi"}]`), []byte(``), []byte(``), true, false)
	f.Add([]byte(`[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"a"},"b"]},{"role":"assistant","content":null,"tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{\"x\":1}"}}]},{"role":"tool","tool_call_id":"1","content":"r"}]`), []byte(`[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"x":{"type":"integer"}}}}}]`), []byte(`{"enable_thinking":false}`), true, false)
	f.Add([]byte(`[{"role":"user","content":"a"},{"role":"assistant","content":"<think>r</think>b "}]`), []byte(`null`), []byte(`{}`), false, true)
	f.Add([]byte(`[{"role":"developer","content":"d"},{"role":"user","content":"u","name":"n"}]`), []byte(``), []byte(`{"bos_token":"X"}`), true, false)
	var templates []*ChatTemplate
	for _, dir := range fixture.Optional(f, "llama3", "qwen2.5", "qwen3", "phi3") {
		if dir == "" {
			continue
		}
		c, err := LoadChatTemplate(dir)
		if err != nil {
			f.Fatal(err)
		}
		templates = append(templates, c)
	}
	for _, name := range []string{"features", "hermes_like", "llama31_like", "mistral_like", "openai_content"} {
		src, err := os.ReadFile(filepath.Join("testdata/templates", name+".jinja"))
		if err != nil {
			f.Fatal(err)
		}
		c, err := ParseChatTemplate(string(src), map[string]string{"bos_token": "<s>", "eos_token": "</s>"})
		if err != nil {
			f.Fatal(err)
		}
		templates = append(templates, c.withClock(tplFixedClock))
	}
	f.Fuzz(func(t *testing.T, msgs, tools, kwargs []byte, agp, cfm bool) {
		req := ChatRequest{Messages: msgs, Tools: tools, Kwargs: kwargs, AddGenerationPrompt: agp, ContinueFinalMessage: cfm}
		for _, c := range templates {
			out, err := c.Render(req)
			if err != nil {
				if strings.Contains(err.Error(), "internal error") {
					t.Fatalf("render panicked: %v", err)
				}
				if out != "" {
					t.Fatalf("error with output")
				}
			}
		}
	})
}

// FuzzChatTemplateSource parses arbitrary template sources and renders the ones that
// parse: the interpreter must never panic or hang on a template.
func FuzzChatTemplateSource(f *testing.F) {
	for _, name := range []string{"features", "hermes_like", "llama31_like", "mistral_like", "openai_content"} {
		src, err := os.ReadFile(filepath.Join("testdata/templates", name+".jinja"))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(string(src))
	}
	raw, err := os.ReadFile("jinja/testdata/jinja_golden.json")
	if err != nil {
		f.Fatal(err)
	}
	var g struct {
		Cases []struct {
			T string `json:"t"`
		} `json:"cases"`
	}
	if err := json.Unmarshal(raw, &g); err != nil {
		f.Fatal(err)
	}
	for _, c := range g.Cases {
		f.Add(c.T)
	}
	req := ChatRequest{
		Messages:            json.RawMessage(`[{"role":"system","content":"s"},{"role":"user","content":"u"},{"role":"assistant","content":"a","tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{\"x\":[1,2]}"}}]},{"role":"tool","tool_call_id":"1","content":"r"}]`),
		Tools:               json.RawMessage(`[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"x":{"type":"array","items":{"type":"integer"}}}}}}]`),
		Kwargs:              json.RawMessage(`{"enable_thinking":false,"x":"hello","d":{"b":2,"a":1},"lst":[1,2,3]}`),
		AddGenerationPrompt: true,
	}
	f.Fuzz(func(t *testing.T, src string) {
		if len(src) > 4096 {
			return
		}
		c, err := ParseChatTemplate(src, map[string]string{"bos_token": "<s>"})
		if err != nil {
			return
		}
		c = c.withClock(tplFixedClock)
		if _, err := c.Render(req); err != nil && strings.Contains(err.Error(), "internal error") {
			t.Fatalf("render panicked on %q: %v", src, err)
		}
	})
}
