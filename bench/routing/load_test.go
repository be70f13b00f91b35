package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// sseServer answers /v1/completions with respond(w, body) and records
// the bodies it got.
type sseServer struct {
	*httptest.Server
	mu     sync.Mutex
	bodies []map[string]json.RawMessage
}

func newSSEServer(t *testing.T, respond func(w http.ResponseWriter, prompt []uint32)) *sseServer {
	s := &sseServer{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/completions" || r.Method != http.MethodPost {
			http.Error(w, "wrong route", http.StatusNotFound)
			return
		}
		var body map[string]json.RawMessage
		data, _ := io.ReadAll(r.Body)
		if err := json.Unmarshal(data, &body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var prompt []uint32
		_ = json.Unmarshal(body["prompt"], &prompt)
		s.mu.Lock()
		s.bodies = append(s.bodies, body)
		s.mu.Unlock()
		respond(w, prompt)
	}))
	t.Cleanup(s.Close)
	return s
}

// stream writes SSE data lines.
func stream(w http.ResponseWriter, events ...string) {
	w.Header().Set("Content-Type", "text/event-stream")
	for _, e := range events {
		fmt.Fprintf(w, "data: %s\n\n", e)
		w.(http.Flusher).Flush()
	}
}

const content = `{"id":"c","object":"text_completion","model":"m","choices":[{"index":0,"text":" lorem","finish_reason":null}]}`

func usage(prompt, cached, completion int) string {
	return fmt.Sprintf(`{"id":"c","choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"prompt_tokens_details":{"cached_tokens":%d}}}`, prompt, completion, cached)
}

func TestLoaderOutcomes(t *testing.T) {
	req := Request{Line: 3, InputLength: 700, OutputLength: 9, HashIDs: []uint64{4, 5}}
	tests := []struct {
		name    string
		respond func(w http.ResponseWriter, prompt []uint32)
		want    Outcome // TTFT and E2E only checked for being set
		wantErr string
	}{
		{name: "completes", respond: func(w http.ResponseWriter, p []uint32) {
			stream(w, content, content, usage(len(p), 512, 2), "[DONE]")
		}, want: Outcome{Line: 3, PromptTokens: 700, CachedTokens: 512, OutputTokens: 2, Status: 200}},
		{name: "refused", respond: func(w http.ResponseWriter, _ []uint32) {
			http.Error(w, `{"error":"no"}`, http.StatusServiceUnavailable)
		}, wantErr: `status 503: {"error":"no"}`},
		{name: "no DONE", respond: func(w http.ResponseWriter, p []uint32) { stream(w, content, usage(len(p), 0, 1)) },
			wantErr: "stream ended without [DONE]"},
		{name: "no usage", respond: func(w http.ResponseWriter, _ []uint32) { stream(w, content, "[DONE]") }, wantErr: "stream without usage"},
		{name: "no content", respond: func(w http.ResponseWriter, p []uint32) { stream(w, usage(len(p), 0, 0), "[DONE]") },
			wantErr: "stream without content"},
		{name: "engine error", respond: func(w http.ResponseWriter, _ []uint32) {
			stream(w, content, `{"error":{"message":"engine restarted","code":500}}`, "[DONE]")
		}, wantErr: "error in stream"},
		{name: "bad chunk", respond: func(w http.ResponseWriter, _ []uint32) { stream(w, "{nope", "[DONE]") }, wantErr: "bad stream chunk"},
		{name: "prompt tokens differ", respond: func(w http.ResponseWriter, p []uint32) {
			stream(w, content, usage(len(p)-1, 0, 1), "[DONE]")
		}, wantErr: "usage.prompt_tokens 699, sent 700"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv := newSSEServer(t, tc.respond)
			l := Loader{Client: srv.Client(), URL: srv.URL, Model: "m", TokensPerHash: 512, MaxTokens: 4}
			outs := l.Run(t.Context(), []Request{req}, 1, func() {})
			if len(outs) != 1 {
				t.Fatalf("%d outcomes", len(outs))
			}
			o := outs[0]
			if tc.wantErr != "" {
				if !strings.Contains(o.Err, tc.wantErr) {
					t.Fatalf("error %q, want %q", o.Err, tc.wantErr)
				}
				return
			}
			if o.Err != "" || o.TTFT <= 0 || o.E2E < o.TTFT {
				t.Fatalf("outcome %+v", o)
			}
			o.TTFT, o.E2E, o.Sent, o.Scheduled = 0, 0, 0, 0
			if o != tc.want {
				t.Errorf("got %+v, want %+v", o, tc.want)
			}
			// What was sent.
			b := srv.bodies[0]
			var prompt []uint32
			_ = json.Unmarshal(b["prompt"], &prompt)
			if !slices.Equal(prompt, PromptTokens(req, 512)) || string(b["max_tokens"]) != "4" || string(b["model"]) != `"m"` ||
				string(b["stream"]) != "true" || string(b["stream_options"]) != `{"include_usage":true}` {
				t.Errorf("body max_tokens %s model %s stream %s options %s, prompt of %d tokens", b["max_tokens"], b["model"], b["stream"], b["stream_options"], len(prompt))
			}
		})
	}
}

func TestLoaderMaxTokens(t *testing.T) {
	r := Request{OutputLength: 9}
	for _, tc := range []struct{ limit, want int }{{0, 9}, {4, 4}, {20, 9}} {
		if got := (&Loader{MaxTokens: tc.limit}).maxTokens(r); got != tc.want {
			t.Errorf("cap %d: %d, want %d", tc.limit, got, tc.want)
		}
	}
}

// TestLoaderOpenLoop: requests go out at their compressed times, without
// waiting for earlier answers; cancelling fails the ones not sent yet.
func TestLoaderOpenLoop(t *testing.T) {
	release := make(chan struct{})
	var arrived atomic.Int32
	srv := newSSEServer(t, func(w http.ResponseWriter, p []uint32) {
		if arrived.Add(1) == 3 {
			close(release)
		}
		<-release // answers wait until every request has arrived: none waited for another's answer
		stream(w, content, usage(len(p), 0, 1), "[DONE]")
	})
	defer srv.CloseClientConnections()
	reqs := []Request{
		{Line: 1, At: 0, InputLength: 1, OutputLength: 1, HashIDs: []uint64{1}},
		{Line: 2, At: 20 * time.Millisecond, InputLength: 1, OutputLength: 1, HashIDs: []uint64{2}},
		{Line: 3, At: 40 * time.Millisecond, InputLength: 1, OutputLength: 1, HashIDs: []uint64{3}},
	}
	l := Loader{Client: srv.Client(), URL: srv.URL, Model: "m", TokensPerHash: 512}
	var done atomic.Int32
	outs := l.Run(t.Context(), reqs, 2, func() { done.Add(1) })
	if done.Load() != 3 {
		t.Errorf("done called %d times", done.Load())
	}
	for i, o := range outs {
		if o.Err != "" {
			t.Fatalf("request %d: %s", i, o.Err)
		}
		if want := reqs[i].At / 2; o.Scheduled != want || o.Sent < want {
			t.Errorf("request %d scheduled %v sent %v, want at %v", i, o.Scheduled, o.Sent, want)
		}
	}

	// Cancelled before the later requests are due.
	ctx, cancel := context.WithCancel(t.Context())
	srv2 := newSSEServer(t, func(w http.ResponseWriter, p []uint32) {
		cancel()
		stream(w, content, usage(len(p), 0, 1), "[DONE]")
	})
	late := []Request{reqs[0], {Line: 9, At: time.Hour, InputLength: 1, OutputLength: 1, HashIDs: []uint64{1}}}
	l.Client, l.URL = srv2.Client(), srv2.URL
	outs = l.Run(ctx, late, 1, func() {})
	if outs[1].Err != context.Canceled.Error() || outs[1].Line != 9 || outs[1].Scheduled != time.Hour {
		t.Errorf("unsent request: %+v", outs[1])
	}
}
