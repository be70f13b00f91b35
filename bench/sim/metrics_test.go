package sim

import (
	"bytes"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvgate/kvgate/internal/poll"
)

// scrape reads /metrics as Prometheus does.
func scrape(t *testing.T, a *api) map[string]*metricFamily {
	t.Helper()
	status, hdr, data := a.call(http.MethodGet, "/metrics", nil)
	if status != 200 || !strings.HasPrefix(hdr.Get("Content-Type"), "text/plain") {
		t.Fatalf("/metrics: %d %s", status, hdr.Get("Content-Type"))
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("parse /metrics: %v\n%s", err, data)
	}
	out := map[string]*metricFamily{}
	for name, mf := range mfs {
		fam := &metricFamily{typ: mf.GetType().String(), byEngine: map[string]float64{}}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			v := m.GetGauge().GetValue() + m.GetCounter().GetValue()
			fam.byEngine[labels["engine"]] = v
			fam.labels = append(fam.labels, labels)
		}
		out[name] = fam
	}
	return out
}

type metricFamily struct {
	typ      string
	byEngine map[string]float64
	labels   []map[string]string
}

func TestMetrics(t *testing.T) {
	f := byteFleet(t, func(c *Config) { c.DPSize = 2 })
	w := f.Workers()[0]
	a := newAPI(t, w)
	p := text(5, 150)
	for range 2 {
		a.post("/v1/completions", map[string]any{"prompt": p, "max_tokens": 3}, "X-data-parallel-rank", "1")
	}
	a.post("/v1/completions", map[string]any{"prompt": "tiny", "max_tokens": 2}, "X-data-parallel-rank", "0")
	mfs := scrape(t, a)
	stats := []RankStats{w.Ranks()[0].Stats(), w.Ranks()[1].Stats()}
	for _, tc := range []struct {
		name, typ string
		value     func(RankStats) float64
	}{
		{"vllm:num_requests_running", "GAUGE", func(s RankStats) float64 { return float64(s.Running) }},
		{"vllm:num_requests_waiting", "GAUGE", func(s RankStats) float64 { return float64(s.Waiting) }},
		{"vllm:kv_cache_usage_perc", "GAUGE", func(s RankStats) float64 { return s.Usage }},
		{"vllm:prefix_cache_queries_total", "COUNTER", func(s RankStats) float64 { return float64(s.PrefixQueries) }},
		{"vllm:prefix_cache_hits_total", "COUNTER", func(s RankStats) float64 { return float64(s.PrefixHits) }},
		{"vllm:prompt_tokens_total", "COUNTER", func(s RankStats) float64 { return float64(s.PromptTokens) }},
		{"vllm:generation_tokens_total", "COUNTER", func(s RankStats) float64 { return float64(s.GenerationTokens) }},
		{"vllm:num_preemptions_total", "COUNTER", func(s RankStats) float64 { return float64(s.Preemptions) }},
	} {
		mf := mfs[tc.name]
		if mf == nil {
			t.Errorf("no %s", tc.name)
			continue
		}
		if mf.typ != tc.typ || len(mf.labels) != 2 {
			t.Errorf("%s: type %s, %d series", tc.name, mf.typ, len(mf.labels))
		}
		for _, l := range mf.labels {
			if l["model_name"] != "sim-model" || len(l) != 2 {
				t.Errorf("%s labels %v", tc.name, l)
			}
		}
		for r, st := range stats {
			if got, want := mf.byEngine[[]string{"0", "1"}[r]], tc.value(st); got != want {
				t.Errorf("%s{engine=%d} = %v, want %v", tc.name, r, got, want)
			}
		}
	}
	// Spot checks against what was sent.
	if got := mfs["vllm:prompt_tokens_total"].byEngine; got["1"] != 300 || got["0"] != 4 {
		t.Errorf("prompt tokens %v", got)
	}
	if got := mfs["vllm:prefix_cache_hits_total"].byEngine["1"]; got != (150-1)/16*16 {
		t.Errorf("prefix cache hits %v", got)
	}
	if got := mfs["vllm:generation_tokens_total"].byEngine; got["1"] != 6 || got["0"] != 2 {
		t.Errorf("generation tokens %v", got)
	}
	// The step loops publish the requests' events after the responses.
	poll.Until(t, "published events in /metrics", func() bool {
		m := scrape(t, a)
		return m["kvgate_sim_events_published_total"].byEngine[""] > 0 && m["kvgate_sim_event_batches_published_total"].byEngine[""] > 0
	})
	if m := scrape(t, a); m["kvgate_sim_event_publish_errors_total"] == nil || m["kvgate_sim_event_publish_errors_total"].byEngine[""] != 0 {
		t.Errorf("publish errors: %+v", m["kvgate_sim_event_publish_errors_total"])
	}
}
