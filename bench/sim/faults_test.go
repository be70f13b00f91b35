package sim

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/poll"
)

func TestInjectedFailures(t *testing.T) {
	f := byteFleet(t, func(c *Config) { c.Faults.FailRate = 1 })
	a := newAPI(t, f.Workers()[0])
	for _, tc := range []struct {
		path string
		body map[string]any
	}{
		{"/v1/completions", map[string]any{"prompt": "x"}},
		{"/v1/completions", map[string]any{"prompt": "x", "stream": true}},
		{"/v1/chat/completions", map[string]any{"messages": []any{}}}, // fails earlier: no template
	} {
		status, _, data := a.call(http.MethodPost, tc.path, tc.body)
		want, typ := 500, "InternalServerError"
		if tc.path == "/v1/chat/completions" {
			want, typ = 400, "BadRequestError"
		}
		if e := decode[errorJSON](t, data); status != want || e.Error.Type != typ || e.Error.Code != want {
			t.Errorf("%s %v: %d %s", tc.path, tc.body, status, data)
		}
	}
	// Only generation fails.
	a.post("/tokenize", map[string]any{"prompt": "x"})
	if st := f.Workers()[0].Ranks()[0].Stats(); st.PromptTokens != 0 {
		t.Errorf("failed requests reached the engine: %+v", st)
	}
}

func TestDelay(t *testing.T) {
	const delay = 40 * time.Millisecond
	f := byteFleet(t, func(c *Config) { c.Faults.Delay = delay })
	a := newAPI(t, f.Workers()[0])
	start := time.Now()
	a.post("/v1/completions", map[string]any{"prompt": "x", "max_tokens": 1})
	if took := time.Since(start); took < delay {
		t.Errorf("request took %v, less than the delay %v", took, delay)
	}
	// Streams are held too, before their headers.
	start = time.Now()
	resp := a.open(context.Background(), "/v1/completions", map[string]any{"prompt": "x", "max_tokens": 1, "stream": true})
	resp.Body.Close()
	if took := time.Since(start); took < delay {
		t.Errorf("stream started after %v, less than the delay %v", took, delay)
	}
}

// waitIdle waits until no request runs or waits on any of w's ranks and
// no block is in use.
func waitIdle(t *testing.T, w *Worker) {
	t.Helper()
	poll.Until(t, "idle ranks with free blocks", func() bool {
		for _, r := range w.Ranks() {
			if st := r.Stats(); st.Running != 0 || st.Waiting != 0 || st.Usage != 0 {
				return false
			}
		}
		return true
	})
}

// realTime is a fleet in real time (a decode step takes ~6 ms), so that a
// long request is still running while a test acts on it.
func realTime(t *testing.T) *Fleet {
	return byteFleet(t, func(c *Config) { c.Engine.Speedup = 1 })
}

func TestClientCancelFreesBlocks(t *testing.T) {
	f := realTime(t)
	w := f.Workers()[0]
	rank := w.Ranks()[0]
	a := newAPI(t, w)
	const maxTokens = 400 // > 2 s of decoding

	t.Run("streaming", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		resp := a.open(ctx, "/v1/completions", map[string]any{"prompt": text(6, 40), "max_tokens": maxTokens, "stream": true})
		defer resp.Body.Close()
		rd := bufio.NewReader(resp.Body)
		first := decode[completionJSON](t, []byte(nextEvent(t, rd)))
		if len(first.Choices) != 1 || first.Choices[0].FinishReason != nil {
			t.Fatalf("first chunk %+v", first)
		}
		if st := rank.Stats(); st.Running != 1 || st.Usage == 0 {
			t.Fatalf("stats while streaming: %+v", st)
		}
		// Requests run, so the prefix cache cannot be reset.
		status, _, data := a.call(http.MethodPost, "/reset_prefix_cache", nil)
		if e := decode[errorJSON](t, data); status != http.StatusConflict || e.Error.Code != 409 {
			t.Errorf("reset while running: %d %s", status, data)
		}
		before := rank.Stats().GenerationTokens
		cancel()
		waitIdle(t, w)
		if got := rank.Stats().GenerationTokens; got >= before+maxTokens-1 {
			t.Errorf("the request ran to its end (%d tokens generated) instead of being aborted", got-before)
		}
	})

	t.Run("non-streaming", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		errc := make(chan error, 1)
		go func() {
			resp, err := a.hc.Do(a.request(ctx, http.MethodPost, "/v1/completions", map[string]any{"prompt": text(7, 40), "max_tokens": maxTokens}))
			if err == nil {
				resp.Body.Close()
			}
			errc <- err
		}()
		poll.Until(t, "the request to run", func() bool { return rank.Stats().Running == 1 })
		before := rank.Stats().GenerationTokens
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Errorf("client: %v", err)
		}
		waitIdle(t, w)
		if got := rank.Stats().GenerationTokens; got >= before+maxTokens-1 {
			t.Errorf("the request ran to its end (%d tokens generated) instead of being aborted", got-before)
		}
	})
}

func TestRestartFailsRequests(t *testing.T) {
	f := realTime(t)
	w := f.Workers()[0]
	a := newAPI(t, w)
	restart := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := w.Restart(ctx); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("streaming", func(t *testing.T) {
		resp := a.open(context.Background(), "/v1/completions", map[string]any{"prompt": text(8, 40), "max_tokens": 400, "stream": true})
		defer resp.Body.Close()
		rd := bufio.NewReader(resp.Body)
		nextEvent(t, rd)
		restart()
		// vLLM ends a failed stream with an error event, then [DONE]; a
		// chunk or two may come before it.
		for {
			ev := nextEvent(t, rd)
			if ev == "[DONE]" {
				t.Fatal("[DONE] without an error event")
			}
			if strings.HasPrefix(ev, `{"error"`) {
				if e := decode[errorJSON](t, []byte(ev)); e.Error.Code != 500 || e.Error.Type != "InternalServerError" {
					t.Errorf("error event %s", ev)
				}
				break
			}
		}
		if ev := nextEvent(t, rd); ev != "[DONE]" {
			t.Errorf("after the error: %q", ev)
		}
	})

	t.Run("non-streaming", func(t *testing.T) {
		type result struct {
			status int
			data   []byte
		}
		done := make(chan result, 1)
		go func() {
			resp, err := a.hc.Do(a.request(context.Background(), http.MethodPost, "/v1/completions", map[string]any{"prompt": text(9, 40), "max_tokens": 400}))
			if err != nil {
				done <- result{data: []byte(err.Error())}
				return
			}
			defer resp.Body.Close()
			data, _ := io.ReadAll(resp.Body)
			done <- result{resp.StatusCode, data}
		}()
		poll.Until(t, "the request to run", func() bool { return w.Ranks()[0].Stats().Running == 1 })
		restart()
		r := <-done
		if e := decode[errorJSON](t, r.data); r.status != 500 || e.Error.Type != "InternalServerError" || !strings.Contains(e.Error.Message, "restarted") {
			t.Errorf("%d %s", r.status, r.data)
		}
	})
}
