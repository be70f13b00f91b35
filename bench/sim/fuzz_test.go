package sim

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// FuzzHandler posts arbitrary bodies to the worker's request decoders
// (completions, chat, tokenize): every answer is a 200 or a vLLM error
// JSON with a 4xx status, never a panic or a 5xx, and no request stays
// in the engine afterwards.
func FuzzHandler(f *testing.F) {
	f.Add("/v1/completions", `{"model":"sim-model","prompt":"hello","max_tokens":2}`)
	f.Add("/v1/completions", `{"model":"sim-model","prompt":[1,2,3],"max_tokens":1,"stream":true,"stream_options":{"include_usage":true}}`)
	f.Add("/v1/completions", `{"prompt":[[5,6]],"n":2}`)
	f.Add("/v1/completions", `{"model":"x","prompt":["a","b"]}`)
	f.Add("/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":"hi"}]}`)
	f.Add("/tokenize", `{"model":"sim-model","prompt":"abc","add_special_tokens":false}`)
	f.Add("/tokenize", `{"messages":[]}`)
	f.Add("/v1/completions", `{"model":"sim-model","prompt":"x","max_tokens":-1}`)
	f.Add("/v1/completions", `{"model":"sim-model","prompt":"x","max_tokens":1e30}`)
	f.Add("/v1/completions", `[`)
	fleet, err := Start(context.Background(), Config{Engine: EngineConfig{NumBlocks: 256, MaxModelLen: 1024, Speedup: 1e9}})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { fleet.Close() })
	w := fleet.Workers()[0]
	h := w.handler()
	f.Fuzz(func(t *testing.T, path, body string) {
		switch path {
		case "/v1/completions", "/v1/chat/completions", "/tokenize":
		default:
			path = "/v1/completions"
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		req := httptest.NewRequestWithContext(ctx, http.MethodPost, path, strings.NewReader(body))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		switch {
		case rec.Code == http.StatusOK:
		case rec.Code >= 400 && rec.Code < 500:
			var e struct {
				Error struct {
					Message string `json:"message"`
					Code    int    `json:"code"`
				} `json:"error"`
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.Error.Message == "" || e.Error.Code != rec.Code {
				t.Fatalf("status %d with body %q", rec.Code, rec.Body.String())
			}
		default:
			t.Fatalf("status %d for %s %q: %s", rec.Code, path, body, rec.Body.String())
		}
		for _, r := range w.Ranks() {
			if st := r.Stats(); st.Running != 0 || st.Waiting != 0 {
				t.Fatalf("after the response: %d running, %d waiting", st.Running, st.Waiting)
			}
		}
	})
}
