package sim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/fixture"
)

// byteFleet starts one worker without a tokenizer (text prompts are their
// bytes) and with one adapter, fast enough for tests; mod adjusts it.
func byteFleet(t *testing.T, mod func(*Config)) *Fleet {
	t.Helper()
	cfg := Config{
		LoRA: []string{"adapter"},
		Seed: 1,
		Engine: EngineConfig{
			BlockSize: 16, NumBlocks: 64, MaxModelLen: 512, Speedup: 1000,
		},
	}
	if mod != nil {
		mod(&cfg)
	}
	return startFleet(t, cfg)
}

// qwenFleet is a fleet with the Qwen2.5 tokenizer and chat template (the
// copy in the repository).
func qwenFleet(t *testing.T) *Fleet {
	t.Helper()
	dir := fixture.Family(t, "qwen2.5")
	return byteFleet(t, func(c *Config) {
		c.Tokenizer = dir
		c.Engine.NumBlocks, c.Engine.MaxModelLen = 256, 2048
	})
}

// api is an HTTP client for one worker, with its own connections (closed
// at cleanup, so that no keep-alive goroutine outlives the test).
type api struct {
	t    *testing.T
	base string
	hc   *http.Client
}

func newAPI(t *testing.T, w *Worker) *api {
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &api{t: t, base: w.URL(), hc: &http.Client{Transport: tr, Timeout: 60 * time.Second}}
}

// request builds a request; body is sent as is when a string, else as
// JSON; hdr are header name, value pairs.
func (a *api) request(ctx context.Context, method, path string, body any, hdr ...string) *http.Request {
	a.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		data, err := json.Marshal(b)
		if err != nil {
			a.t.Fatal(err)
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, rd)
	if err != nil {
		a.t.Fatal(err)
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	return req
}

// call sends a request and reads the whole response.
func (a *api) call(method, path string, body any, hdr ...string) (int, http.Header, []byte) {
	a.t.Helper()
	resp, err := a.hc.Do(a.request(context.Background(), method, path, body, hdr...))
	if err != nil {
		a.t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		a.t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, data
}

// post sends a JSON body and wants status 200, returning the body.
func (a *api) post(path string, body any, hdr ...string) []byte {
	a.t.Helper()
	status, _, data := a.call(http.MethodPost, path, body, hdr...)
	if status != http.StatusOK {
		a.t.Fatalf("POST %s: status %d: %s", path, status, data)
	}
	return data
}

// open starts a streaming request and checks its status and content type.
func (a *api) open(ctx context.Context, path string, body any, hdr ...string) *http.Response {
	a.t.Helper()
	resp, err := a.hc.Do(a.request(ctx, http.MethodPost, path, body, hdr...))
	if err != nil {
		a.t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		a.t.Fatalf("POST %s: status %d, content type %q: %s", path, resp.StatusCode, resp.Header.Get("Content-Type"), data)
	}
	return resp
}

// nextEvent reads one server-sent event and returns its data.
func nextEvent(t *testing.T, rd *bufio.Reader) string {
	t.Helper()
	var data []string
	for {
		line, err := rd.ReadString('\n')
		if err != nil {
			t.Fatalf("read event: %v (after %q)", err, line)
		}
		line = strings.TrimRight(line, "\r\n")
		if line == "" {
			if data == nil {
				continue
			}
			return strings.Join(data, "\n")
		}
		d, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("unexpected SSE line %q", line)
		}
		data = append(data, d)
	}
}

// events streams a request to its end: the data of every event before
// [DONE], failing if the stream ends otherwise or sends more after it.
func (a *api) events(path string, body any, hdr ...string) []string {
	a.t.Helper()
	resp := a.open(context.Background(), path, body, hdr...)
	defer resp.Body.Close()
	rd := bufio.NewReader(resp.Body)
	var out []string
	for {
		d := nextEvent(a.t, rd)
		if d == "[DONE]" {
			break
		}
		out = append(out, d)
	}
	if rest, _ := io.ReadAll(rd); len(bytes.TrimSpace(rest)) > 0 {
		a.t.Fatalf("data after [DONE]: %q", rest)
	}
	return out
}

func decode[T any](t *testing.T, data []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatalf("decode %s: %v", data, err)
	}
	return v
}

// Response shapes as clients read them.
type usageJSON struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

func (u *usageJSON) cached(t *testing.T) int {
	t.Helper()
	if u == nil || u.PromptTokensDetails == nil {
		t.Fatalf("usage %+v has no prompt_tokens_details", u)
	}
	return u.PromptTokensDetails.CachedTokens
}

type completionJSON struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index        int     `json:"index"`
		Text         string  `json:"text"`
		FinishReason *string `json:"finish_reason"`
		Delta        *struct {
			Role    string  `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
		Message *struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
	} `json:"choices"`
	Usage *usageJSON `json:"usage"`
}

type errorJSON struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    int     `json:"code"`
	} `json:"error"`
}

// words counts the words of simulated output (one per token).
func words(s string) int { return strings.Count(s, " ") }

// text is a byte-tokenizer prompt of n tokens.
func text(seed, n int) string {
	var b strings.Builder
	for i := range n {
		b.WriteByte(byte('a' + (seed*7+i*i)%26))
	}
	return b.String()
}

// checkKeys fails unless obj has exactly these keys, null or not.
func checkKeys(t *testing.T, what string, obj map[string]any, keys ...string) {
	t.Helper()
	for _, k := range keys {
		if _, ok := obj[k]; !ok {
			t.Errorf("%s: no %q in %v", what, k, obj)
		}
	}
	if len(obj) != len(keys) {
		t.Errorf("%s: keys %v, want %v", what, obj, keys)
	}
}
