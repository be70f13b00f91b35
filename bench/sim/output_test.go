package sim

import (
	"context"
	"math"
	"slices"
	"testing"
	"time"
)

// TestNaturalLengthDistribution: the lengths drawn for many requests are
// lognormal with the configured mean (median mean/sqrt(e)), at least 1
// token, and the same for the same key.
func TestNaturalLengthDistribution(t *testing.T) {
	for _, mean := range []float64{DefaultMeanOutputTokens, 343, 3} {
		const n = 20000
		ls := make([]int, n)
		sum := 0.0
		for i := range ls {
			ls[i] = naturalLength(mean, outputKey(1, "", prompt(i, 10), nil))
			if ls[i] < 1 {
				t.Fatalf("mean %g: length %d", mean, ls[i])
			}
			sum += float64(ls[i])
		}
		slices.Sort(ls)
		median, wantMedian := float64(ls[n/2]), mean/math.Sqrt(math.E)
		if math.Abs(median-wantMedian) > 0.05*wantMedian+1 {
			t.Errorf("mean %g: median %g, want about %.1f", mean, median, wantMedian)
		}
		if got := sum / n; math.Abs(got-mean) > 0.1*mean+0.5 {
			t.Errorf("mean %g: mean length %.1f", mean, got)
		}
	}
	if naturalLength(100, 42) != naturalLength(100, 42) {
		t.Error("not deterministic")
	}
	if got := naturalLength(1e300, 0); got != math.MaxInt32 {
		t.Errorf("huge mean: %d", got)
	}
}

// TestOutputKey: the length depends on the fleet's seed, the adapter, the
// prompt and the request's seed, and on nothing else.
func TestOutputKey(t *testing.T) {
	p := prompt(1, 20)
	seed := int64(7)
	base := outputKey(1, "", p, nil)
	if outputKey(1, "", slices.Clone(p), nil) != base {
		t.Error("same request, different key")
	}
	for name, k := range map[string]uint64{
		"fleet seed":   outputKey(2, "", p, nil),
		"adapter":      outputKey(1, "a", p, nil),
		"prompt":       outputKey(1, "", prompt(2, 20), nil),
		"longer":       outputKey(1, "", append(slices.Clone(p), 0), nil),
		"request seed": outputKey(1, "", p, &seed),
	} {
		if k == base {
			t.Errorf("%s does not change the key", name)
		}
	}
}

// TestStopAfter: a request ends after StopAfter tokens with "stop" when
// that comes before MaxTokens, else at MaxTokens with "length" (vLLM v1
// checks the length first, so a tie is "length").
func TestStopAfter(t *testing.T) {
	for _, tc := range []struct {
		max, stop, want int
		reason          string
	}{
		{10, 3, 3, FinishStop},
		{10, 1, 1, FinishStop},
		{10, 0, 10, FinishLength},
		{10, 10, 10, FinishLength},
		{10, 50, 10, FinishLength},
	} {
		r := testRank(t, EngineConfig{NumBlocks: 64})
		s := submit(t, r, Request{Prompt: prompt(1, 40), MaxTokens: tc.max, StopAfter: tc.stop})
		drive(t, r, s)
		var out []uint32
		var last Progress
		for !last.Done {
			p, err := s.Wait(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			out, last = append(out, p.Tokens...), p
		}
		if len(out) != tc.want || last.FinishReason != tc.reason {
			t.Errorf("max %d stop %d: %d tokens, %q; want %d, %q", tc.max, tc.stop, len(out), last.FinishReason, tc.want, tc.reason)
		}
	}
	r := testRank(t, EngineConfig{NumBlocks: 64})
	if _, err := r.Submit(Request{Prompt: prompt(1, 4), MaxTokens: 4, StopAfter: -1}); err == nil {
		t.Error("negative StopAfter accepted")
	}
}

// TestOutputLengthOverHTTP: without max_tokens a chat ends on its own
// ("stop") after the drawn length, or at the context ("length") when the
// draw is longer; a completion without max_tokens is cut at vLLM's default
// of 16; with max_tokens every request gets exactly that many tokens, as
// trace replays need. Before, a chat without max_tokens ran to the context
// limit.
func TestOutputLengthOverHTTP(t *testing.T) {
	type result struct {
		n      int
		reason string
	}
	get := func(a *api, path string, body map[string]any) result {
		t.Helper()
		r := decode[completionJSON](t, a.post(path, body))
		if len(r.Choices) != 1 || r.Choices[0].FinishReason == nil || r.Usage == nil {
			t.Fatalf("%s: %+v", path, r)
		}
		return result{r.Usage.CompletionTokens, *r.Choices[0].FinishReason}
	}
	msgs := []map[string]any{{"role": "user", "content": "hi"}}

	t.Run("chat", func(t *testing.T) {
		f := qwenFleet(t)
		a := newAPI(t, f.Workers()[0])
		cfg := f.Config()
		ids := decode[tokenizeResponse](t, a.post("/tokenize", map[string]any{"messages": msgs})).Tokens
		want := naturalLength(cfg.MeanOutputTokens, outputKey(cfg.Seed, "", ids, nil))
		if got := get(a, "/v1/chat/completions", map[string]any{"messages": msgs}); got != (result{want, "stop"}) {
			t.Errorf("chat without max_tokens: %+v, want %d tokens, stop", got, want)
		}
		// The same request, streamed: the same length.
		evs := a.events("/v1/chat/completions", map[string]any{"messages": msgs, "stream": true, "stream_options": map[string]any{"include_usage": true}})
		var reason string
		var usage *usageJSON
		for _, ev := range evs {
			c := decode[completionJSON](t, []byte(ev))
			if len(c.Choices) > 0 && c.Choices[0].FinishReason != nil {
				reason = *c.Choices[0].FinishReason
			}
			if c.Usage != nil {
				usage = c.Usage
			}
		}
		if reason != "stop" || usage == nil || usage.CompletionTokens != want {
			t.Errorf("streamed: finish %q usage %+v, want stop after %d", reason, usage, want)
		}
		// A request seed draws another length.
		seeded := naturalLength(cfg.MeanOutputTokens, outputKey(cfg.Seed, "", ids, ptr(int64(5))))
		if got := get(a, "/v1/chat/completions", map[string]any{"messages": msgs, "seed": 5}); got != (result{seeded, "stop"}) {
			t.Errorf("seeded chat: %+v, want %d tokens, stop", got, seeded)
		}
		// max_tokens: exactly that many, far beyond the drawn length.
		if got := get(a, "/v1/chat/completions", map[string]any{"messages": msgs, "max_tokens": want + 300}); got != (result{want + 300, "length"}) {
			t.Errorf("chat with max_tokens %d: %+v", want+300, got)
		}
		if got := get(a, "/v1/chat/completions", map[string]any{"messages": msgs, "max_completion_tokens": 2}); got != (result{2, "length"}) {
			t.Errorf("chat with max_completion_tokens 2: %+v", got)
		}
	})

	t.Run("chat cut by the context", func(t *testing.T) {
		f := startFleet(t, Config{Tokenizer: qwenFleet(t).Config().Tokenizer, Seed: 1, MeanOutputTokens: 1e6,
			Engine: EngineConfig{BlockSize: 16, NumBlocks: 64, MaxModelLen: 200, Speedup: 1e6}})
		a := newAPI(t, f.Workers()[0])
		ids := decode[tokenizeResponse](t, a.post("/tokenize", map[string]any{"messages": msgs})).Tokens
		if got := get(a, "/v1/chat/completions", map[string]any{"messages": msgs}); got != (result{200 - len(ids), "length"}) {
			t.Errorf("chat: %+v, want %d tokens, length", got, 200-len(ids))
		}
	})

	t.Run("completions", func(t *testing.T) {
		// A mean of 4: most answers end before 16 tokens, some after.
		f := byteFleet(t, func(c *Config) { c.MeanOutputTokens = 4 })
		a := newAPI(t, f.Workers()[0])
		reasons := map[string]int{}
		for i := range 40 {
			p := text(i, 20)
			ids := make([]uint32, len(p))
			for j := range len(p) {
				ids[j] = uint32(p[j])
			}
			want := result{16, "length"}
			if n := naturalLength(4, outputKey(1, "", ids, nil)); n < 16 {
				want = result{n, "stop"}
			}
			got := get(a, "/v1/completions", map[string]any{"prompt": p})
			if got != want {
				t.Errorf("completion %q: %+v, want %+v", p, got, want)
			}
			reasons[got.reason]++
			if got := get(a, "/v1/completions", map[string]any{"prompt": p, "max_tokens": 20}); got != (result{20, "length"}) {
				t.Errorf("completion %q with max_tokens 20: %+v", p, got)
			}
		}
		if reasons["stop"] == 0 || reasons["length"] == 0 {
			t.Errorf("finish reasons %v: want both", reasons)
		}
	})
}

// TestQuickStartChatIsFast: the README's quick-start chat ("hi", Qwen2.5's
// template, the default seed and mean output length) ends on its own
// within well under a second of simulated time at speedup 1: its prefill
// and one decode step per token on an idle engine with the default timing.
func TestQuickStartChatIsFast(t *testing.T) {
	f := qwenFleet(t)
	a := newAPI(t, f.Workers()[0])
	msgs := []map[string]any{{"role": "user", "content": "hi"}}
	ids := decode[tokenizeResponse](t, a.post("/tokenize", map[string]any{"model": "sim-model", "messages": msgs})).Tokens
	n := naturalLength(DefaultMeanOutputTokens, outputKey(1, "", ids, nil))
	r := testRank(t, EngineConfig{})
	s := submit(t, r, Request{Prompt: ids, MaxTokens: r.cfg.MaxModelLen - len(ids), StopAfter: n})
	_, total := drive(t, r, s)
	if total > 500*time.Millisecond {
		t.Errorf("quick-start chat: %d prompt tokens, %d output tokens take %v of simulated time, want under 0.5 s", len(ids), n, total)
	}
	t.Logf("quick-start chat: %d prompt tokens, %d output tokens, %v", len(ids), n, total)
}

func ptr[T any](v T) *T { return &v }
