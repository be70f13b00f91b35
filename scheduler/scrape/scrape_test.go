package scrape

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvgate/kvgate/bench/sim"
	"github.com/kvgate/kvgate/indexer"
	"github.com/kvgate/kvgate/internal/poll"
	"github.com/kvgate/kvgate/scheduler"
	"github.com/kvgate/kvgate/scheduler/catalog"
)

// These tests drive the Scraper against real HTTP servers: simulated
// vLLM workers (bench/sim) and pages served from testdata or built here,
// and the metrics correction of the cost (CostOptions.MetricsWeight).
// Expected costs are worked out by hand from the formula of
// CostOptions.MetricsWeight:
//
//	reported = (w + 1) * waiting * b + used_blocks   (used: usage * num_gpu_blocks, else running * b)
//	tracked  = w * active_prefill / block_size + active_decode_blocks
//	cost    += weight * max(0, reported - tracked)

// pages serves vLLM pages by path, changed by the test.
type pages struct {
	ts      *httptest.Server
	mu      sync.Mutex
	byPath  map[string]pageAnswer
	release chan struct{} // closed at cleanup: unblocks hanging answers
}

type pageAnswer struct {
	status int
	body   string
	hang   bool // answer nothing until the request ends
	flood  bool // answer an endless page
	// hold, when not nil, is told of the request and answers once it is
	// closed.
	hold chan chan struct{}
}

func newPages(t *testing.T) *pages {
	p := &pages{byPath: map[string]pageAnswer{}, release: make(chan struct{})}
	p.ts = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		a, ok := p.byPath[r.URL.Path]
		p.mu.Unlock()
		switch {
		case !ok:
			http.NotFound(w, r)
			return
		case a.hang:
			select {
			case <-r.Context().Done():
			case <-p.release:
			}
			return
		case a.flood:
			line := []byte("# padding padding padding padding padding padding padding padding\n")
			for r.Context().Err() == nil {
				if _, err := w.Write(line); err != nil {
					return
				}
			}
			return
		case a.hold != nil:
			done := make(chan struct{})
			select {
			case a.hold <- done:
			case <-p.release:
				return
			}
			select {
			case <-done:
			case <-p.release:
				return
			}
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		w.WriteHeader(cmpOr(a.status, http.StatusOK))
		_, _ = w.Write([]byte(a.body))
	}))
	t.Cleanup(p.ts.Close)
	t.Cleanup(func() { close(p.release) }) // runs first
	return p
}

func cmpOr(v, d int) int {
	if v == 0 {
		return d
	}
	return v
}

// set makes path answer a.
func (p *pages) set(path string, a pageAnswer) {
	p.mu.Lock()
	p.byPath[path] = a
	p.mu.Unlock()
}

// endpoint is a worker endpoint whose metrics page is base/metrics.
func (p *pages) endpoint(base string) string { return p.ts.URL + base }

// vllmPage returns a page with the values of loads by engine label ("":
// no engine label) for model; NaN values are left out.
func vllmPage(model string, loads map[string]scheduler.EngineLoad) string {
	var b strings.Builder
	engines := slices.Sorted(func(yield func(string) bool) {
		for e := range loads {
			if !yield(e) {
				return
			}
		}
	})
	for _, m := range []struct {
		name, typ string
		v         func(scheduler.EngineLoad) float64
	}{
		{metricWaiting, "gauge", func(l scheduler.EngineLoad) float64 { return l.Waiting }},
		{metricRunning, "gauge", func(l scheduler.EngineLoad) float64 { return l.Running }},
		{metricUsage, "gauge", func(l scheduler.EngineLoad) float64 { return l.KVUsage }},
	} {
		fmt.Fprintf(&b, "# HELP %s help\n# TYPE %s %s\n", m.name, m.name, m.typ)
		for _, e := range engines {
			if v := m.v(loads[e]); !math.IsNaN(v) {
				fmt.Fprintf(&b, "%s{%s} %v\n", m.name, labels(model, e), v)
			}
		}
	}
	fmt.Fprintf(&b, "# TYPE %s gauge\n", metricCacheConfig)
	for _, e := range engines {
		if v := loads[e].KVBlocks; !math.IsNaN(v) {
			fmt.Fprintf(&b, "%s{block_size=\"16\",%s,num_gpu_blocks=\"%v\"} 1.0\n", metricCacheConfig, labels(model, e), v)
		}
	}
	return b.String()
}

func labels(model, engine string) string {
	s := fmt.Sprintf("model_name=%q", model)
	if engine != "" {
		s += fmt.Sprintf(",engine=%q", engine)
	}
	return s
}

// engLoad returns an EngineLoad; pass NaN for a value not reported.
func engLoad(waiting, running, usage, blocks float64) scheduler.EngineLoad {
	return scheduler.EngineLoad{Waiting: waiting, Running: running, KVUsage: usage, KVBlocks: blocks}
}

var nan = math.NaN()

// loadsEqual compares loads, NaN equal to NaN.
func loadsEqual(a, b map[uint32]scheduler.EngineLoad) bool {
	if len(a) != len(b) {
		return false
	}
	eq := func(x, y float64) bool { return x == y || (math.IsNaN(x) && math.IsNaN(y)) }
	for r, x := range a {
		y, ok := b[r]
		if !ok || !eq(x.Waiting, y.Waiting) || !eq(x.Running, y.Running) || !eq(x.KVUsage, y.KVUsage) || !eq(x.KVBlocks, y.KVBlocks) {
			return false
		}
	}
	return true
}

// newScraper returns a scraper of the rig's catalog (its clock, the rig's
// loads'), which the rig's views and decisions read from then on.
func (r *rig) newScraper(t *testing.T, opts Options) *Scraper {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = quiet
	}
	if opts.Now == nil {
		opts.Now = r.now
	}
	s := New(r.cat, opts, r.reg)
	t.Cleanup(s.client.CloseIdleConnections)
	r.sc = s
	return s
}

func TestMetricsURL(t *testing.T) {
	tests := []struct{ endpoint, want string }{
		{"10.0.0.7:8000", "http://10.0.0.7:8000/metrics"},
		{"[::1]:8000", "http://[::1]:8000/metrics"},
		{"http://worker:8000", "http://worker:8000/metrics"},
		{"http://worker:8000/", "http://worker:8000/metrics"},
		{"https://worker/v1", "https://worker/metrics"},
		{"http://worker:8000/v1/?x=1", "http://worker:8000/metrics"},
		{"http://lb/pool/w3", "http://lb/pool/w3/metrics"},
		{"http://lb/pool/w3/v1", "http://lb/pool/w3/metrics"},
	}
	for _, tt := range tests {
		if got, err := metricsURL(tt.endpoint); err != nil || got != tt.want {
			t.Errorf("metricsURL(%q) = %q, %v; want %q", tt.endpoint, got, err, tt.want)
		}
	}
	for _, bad := range []string{"", "worker", "ftp://worker:21", "http://:8000"} {
		if got, err := metricsURL(bad); !errors.Is(err, scheduler.ErrInvalid) {
			t.Errorf("metricsURL(%q) = %q, %v; want ErrInvalid", bad, got, err)
		}
	}
}

func TestParseAndResolvePage(t *testing.T) {
	sample, err := os.ReadFile("testdata/vllm_metrics_dp2.txt")
	must(t, err)
	const llama = "meta-llama/Llama-3.1-8B-Instruct"
	tests := []struct {
		name    string
		page    string
		model   string
		ranks   []uint32
		err     string // a parse error containing it
		want    map[uint32]scheduler.EngineLoad
		invalid int // series dropped for their value
		unknown int // series dropped for their engine
	}{
		{name: "vLLM DP 2 page", page: string(sample), model: llama, ranks: []uint32{0, 1},
			want: map[uint32]scheduler.EngineLoad{0: engLoad(0, 3, 0.125, 2048), 1: engLoad(4, 8, 0.6875, 2048)}},
		{name: "another model name: every series", page: string(sample), model: "m", ranks: []uint32{0, 1},
			want: map[uint32]scheduler.EngineLoad{0: engLoad(0, 3, 0.125, 2048), 1: engLoad(4, 8, 0.6875, 2048)}},
		{name: "engines by position (worker at dp start 4)", page: string(sample), model: llama, ranks: []uint32{4, 5},
			want: map[uint32]scheduler.EngineLoad{4: engLoad(0, 3, 0.125, 2048), 5: engLoad(4, 8, 0.6875, 2048)}},
		{name: "one rank of two engines", page: string(sample), model: llama, ranks: []uint32{1},
			want: map[uint32]scheduler.EngineLoad{1: engLoad(4, 8, 0.6875, 2048)}, unknown: 4},
		{name: "engines that are no rank, not as many", page: string(sample), model: llama, ranks: []uint32{7},
			want: map[uint32]scheduler.EngineLoad{}, unknown: 8},
		{name: "worker-level series apply to every rank",
			page: vllmPage("m", map[string]scheduler.EngineLoad{"": engLoad(2, 1, 0.5, nan)}), model: "m", ranks: []uint32{0, 1},
			want: map[uint32]scheduler.EngineLoad{0: engLoad(2, 1, 0.5, nan), 1: engLoad(2, 1, 0.5, nan)}},
		{name: "a rank's own series before the worker's",
			page:  vllmPage("m", map[string]scheduler.EngineLoad{"": engLoad(2, 1, 0.5, 100), "1": engLoad(5, nan, nan, nan)}),
			model: "m", ranks: []uint32{0, 1},
			want: map[uint32]scheduler.EngineLoad{0: engLoad(2, 1, 0.5, 100), 1: engLoad(5, 1, 0.5, 100)}},
		{name: "the worker's model preferred",
			page: vllmPage("m", map[string]scheduler.EngineLoad{"0": engLoad(1, 1, 0.25, nan)}) +
				strings.ReplaceAll(vllmPage("other", map[string]scheduler.EngineLoad{"0": engLoad(9, 9, 0.75, nan)}), "# ", "# x "),
			model: "m", ranks: []uint32{0}, want: map[uint32]scheduler.EngineLoad{0: engLoad(1, 1, 0.25, nan)}},
		{name: "several models: counts add up, usage is the largest",
			page: "vllm:num_requests_waiting{model_name=\"a\",engine=\"0\"} 1\nvllm:num_requests_waiting{model_name=\"b\",engine=\"0\"} 2\n" +
				"vllm:kv_cache_usage_perc{model_name=\"a\",engine=\"0\"} 0.5\nvllm:kv_cache_usage_perc{model_name=\"b\",engine=\"0\"} 0.25\n",
			model: "m", ranks: []uint32{0}, want: map[uint32]scheduler.EngineLoad{0: engLoad(3, nan, 0.5, nan)}},
		{name: "untyped, no labels, older usage name",
			page:  "vllm:num_requests_waiting 2\nvllm:gpu_cache_usage_perc 0.5\n",
			model: "m", ranks: []uint32{3}, want: map[uint32]scheduler.EngineLoad{3: engLoad(2, nan, 0.5, nan)}},
		{name: "waiting only", page: "vllm:num_requests_waiting{engine=\"0\"} 7\n", model: "m", ranks: []uint32{0},
			want: map[uint32]scheduler.EngineLoad{0: engLoad(7, nan, nan, nan)}},
		{name: "cache size unknown", page: "vllm:kv_cache_usage_perc 0.5\nvllm:cache_config_info{num_gpu_blocks=\"None\"} 1\n",
			model: "m", ranks: []uint32{0}, want: map[uint32]scheduler.EngineLoad{0: engLoad(nan, nan, 0.5, nan)}},
		{name: "NaN, infinite, negative and over-full values dropped",
			page: "vllm:num_requests_waiting{engine=\"0\"} NaN\nvllm:num_requests_waiting{engine=\"1\"} 3\n" +
				"vllm:num_requests_running{engine=\"0\"} +Inf\nvllm:num_requests_running{engine=\"1\"} -1\n" +
				"vllm:kv_cache_usage_perc{engine=\"0\"} 1.5\nvllm:kv_cache_usage_perc{engine=\"1\"} 1\n" +
				"vllm:num_requests_waiting{engine=\"2\"} 1e300\n",
			model: "m", ranks: []uint32{0, 1, 2}, want: map[uint32]scheduler.EngineLoad{1: engLoad(3, nan, 1, nan)}, invalid: 5},
		{name: "unparsable engine label dropped",
			page:  "vllm:num_requests_waiting{engine=\"x\"} 1\nvllm:num_requests_waiting{engine=\"0\"} 2\n",
			model: "m", ranks: []uint32{0, 1}, want: map[uint32]scheduler.EngineLoad{0: engLoad(2, nan, nan, nan)}, unknown: 1},
		{name: "running alone is no load metric", page: "vllm:num_requests_running 3\n", err: "no valid"},
		{name: "only NaN", page: "vllm:num_requests_waiting NaN\nvllm:kv_cache_usage_perc NaN\n", err: "no valid"},
		{name: "other metrics only", page: "# TYPE python_info gauge\npython_info{version=\"3.12\"} 1\n", err: "no valid"},
		{name: "empty page", page: "", err: "no valid"},
		{name: "garbage", page: "<html><body>502 Bad Gateway</body></html>\n", err: "not a Prometheus text page"},
		{name: "truncated line", page: "vllm:num_requests_waiting{engine=\"0\"", err: "not a Prometheus text page"},
		{name: "JSON", page: `{"waiting": 3}`, err: "not a Prometheus text page"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := parsePage([]byte(tt.page))
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("error %v, want one with %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got, unknown := p.resolve(tt.model, tt.ranks)
			if !loadsEqual(got, tt.want) || p.invalid != tt.invalid || unknown != tt.unknown {
				t.Errorf("loads %v, %d invalid, %d of unknown engines; want %v, %d, %d", got, p.invalid, unknown, tt.want, tt.invalid, tt.unknown)
			}
		})
	}
}

// TestScrapeOutcomes scrapes, in one round, workers whose pages fail in
// every way, and checks what each worker shows and the outcome counts.
func TestScrapeOutcomes(t *testing.T) {
	p := newPages(t)
	sample, err := os.ReadFile("testdata/vllm_metrics_dp2.txt")
	must(t, err)
	s := newRig(t, testBS, nil)
	refused := "http://" + strings.TrimPrefix(closedPort(t), "tcp://")
	tests := []struct {
		name    string
		answer  *pageAnswer // nil: the endpoint refuses connections
		outcome string
		errHas  string
	}{
		{"success", &pageAnswer{body: string(sample)}, outcomeSuccess, ""},
		{"server error", &pageAnswer{status: 500, body: "Internal Server Error"}, outcomeStatus, "500"},
		{"not found", &pageAnswer{status: 404}, outcomeStatus, "404"},
		{"garbage", &pageAnswer{body: "<html>hello</html>"}, outcomeInvalid, "not a Prometheus text page"},
		{"no load metric", &pageAnswer{body: "python_info 1\n"}, outcomeInvalid, "no valid"},
		{"endless page", &pageAnswer{flood: true}, outcomeTooLarge, "exceeds 65536 bytes"},
		{"no answer", &pageAnswer{hang: true}, outcomeTimeout, "no answer within"},
		{"connection refused", nil, outcomeError, "refused"},
	}
	for i, tt := range tests {
		ep := refused
		if tt.answer != nil {
			base := fmt.Sprintf("/w%d", i)
			p.set(base+"/metrics", *tt.answer)
			ep = p.endpoint(base)
		}
		s.putWorker(uint64(i+1), ep, 0, 2)
	}
	sc := s.newScraper(t, Options{Interval: time.Minute, Timeout: 300 * time.Millisecond, MaxBytes: 64 << 10, Concurrency: 3})
	must(t, sc.ScrapeOnce(t.Context()))
	for i, tt := range tests {
		em := s.engineMetrics(uint64(i + 1))
		switch {
		case em == nil:
			t.Errorf("%s: no engine_metrics", tt.name)
		case tt.errHas == "" && (em.LastError != "" || !em.Fresh || em.ScrapedAt == nil || len(em.Ranks) != 2):
			t.Errorf("%s: %+v, want fresh values of ranks 0 and 1", tt.name, em)
		case tt.errHas != "" && (!strings.Contains(em.LastError, tt.errHas) || em.Fresh || em.ScrapedAt != nil || len(em.Ranks) != 0):
			t.Errorf("%s: %+v, want no values and an error with %q", tt.name, em, tt.errHas)
		}
	}
	counts := map[string]int{}
	for _, tt := range tests {
		counts[tt.outcome]++
	}
	for o, n := range counts {
		if got := testutil.ToFloat64(sc.m.scrapes.WithLabelValues(o)); got != float64(n) {
			t.Errorf("kvgate_scrape_total{outcome=%q} = %v, want %d", o, got, n)
		}
	}
	mfs, err := s.reg.Gather()
	must(t, err)
	for _, mf := range mfs {
		if mf.GetName() == "kvgate_scrape_duration_seconds" {
			if n := mf.GetMetric()[0].GetHistogram().GetSampleCount(); n != uint64(len(tests)) {
				t.Errorf("kvgate_scrape_duration_seconds counts %d scrapes, want %d", n, len(tests))
			}
		}
	}
	if got := testutil.ToFloat64(sc.m.targets); got != float64(len(tests)) {
		t.Errorf("kvgate_scrape_targets = %v, want %d", got, len(tests))
	}
	s.checkScrapes()
}

// TestScrapeSimWorker scrapes a simulated vLLM worker with two DP ranks,
// rank 1 running one request and queueing two, and checks the values
// shown and their effect on the choice of a rank.
func TestScrapeSimWorker(t *testing.T) {
	fleet, err := sim.Start(t.Context(), sim.Config{Workers: 1, DPSize: 2, NoReplay: true,
		Engine: sim.EngineConfig{MaxNumSeqs: 1, Speedup: 1e-6}}) // a step lasts hours: the state holds
	must(t, err)
	t.Cleanup(func() { must(t, fleet.Close()) })
	fw := fleet.Workers()[0]
	busy := fw.Ranks()[1]
	for i := range 3 {
		prompt := make([]uint32, 64)
		for j := range prompt {
			prompt[j] = uint32(1000*i + j)
		}
		if _, err := busy.Submit(sim.Request{Prompt: prompt, MaxTokens: 8}); err != nil {
			t.Fatal(err)
		}
	}
	poll.Until(t, "rank 1 running 1 request, 2 waiting", func() bool {
		st := busy.Stats()
		return st.Running == 1 && st.Waiting == 2
	})
	const bs = 16 // the simulator's
	s := newRig(t, bs, nil)
	s.key = indexer.Key{Model: fleet.Config().Model, Tenant: indexer.DefaultTenant}
	s.putWorker(fw.ID, fw.URL(), 0, 2)
	if em := s.engineMetrics(fw.ID); em != nil {
		t.Fatalf("engine_metrics %+v before any scrape", em)
	}
	sc := s.newScraper(t, Options{Interval: time.Minute})
	must(t, sc.ScrapeOnce(t.Context()))

	em := s.engineMetrics(fw.ID)
	if em == nil || em.URL != fw.URL()+"/metrics" || em.LastError != "" || !em.Fresh || em.ScrapedAt == nil {
		t.Fatalf("engine_metrics %+v, want a fresh scrape of %s/metrics", em, fw.URL())
	}
	for r, rank := range fw.Ranks() {
		st := rank.Stats()
		got := em.Ranks[fmt.Sprint(r)]
		if got.Waiting == nil || *got.Waiting != float64(st.Waiting) || got.Running == nil || *got.Running != float64(st.Running) ||
			got.KVCacheUsage == nil || *got.KVCacheUsage != st.Usage || got.KVBlocks != nil {
			t.Errorf("rank %d: %s, want waiting %d running %d usage %v and no cache size", r, jsonOf(got), st.Waiting, st.Running, st.Usage)
		}
	}

	// A prompt of 4 blocks (b = 4), nothing cached, overlap weight 1: each
	// idle rank costs 64/16 + 4 = 8; rank 1 reports 2 waiting and 1
	// running request (no cache size): (1+1)*2*4 + 1*4 = 20 more.
	req := scheduler.SelectRequest{Key: s.key, Local: promptOf(5, 4)}
	for seed := range uint64(4) {
		d, err := s.scheduler(seed, scheduler.CostOptions{MetricsWeight: 1}).Select(req)
		if err != nil || d.Worker != rk(fw.ID, 0) || d.Cost != 8 {
			t.Fatalf("seed %d: %+v %v, want rank 0 at cost 8", seed, d, err)
		}
	}
	// 400 prefill tokens booked on rank 0 (its engine reports none of
	// them: no correction) make it cost 8 + 25 = 33: rank 1 wins at 28.
	must(t, s.loads.Add(s.key, scheduler.Booking{ID: "local", Worker: rk(fw.ID, 0), PrefillTokens: 400}))
	d, err := s.scheduler(0, scheduler.CostOptions{MetricsWeight: 1}).Select(req)
	if err != nil || d.Worker != rk(fw.ID, 1) || d.Cost != 28 {
		t.Fatalf("%+v %v, want rank 1 at cost 28", d, err)
	}
	d, err = s.scheduler(0, scheduler.CostOptions{}).Select(req)
	if err != nil || d.Worker != rk(fw.ID, 1) || d.Cost != 8 {
		t.Fatalf("without the correction: %+v %v, want rank 1 at cost 8", d, err)
	}
}

func jsonOf(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// TestMetricsCorrection checks the correction's value, case by case, on
// worker 2 of two one-rank workers (block size 4, costPrompt: 10 blocks,
// isl 40, so b = 10). Worker 2 caches the prompt's first block: without a
// correction it costs (40-4)/4 + 10 = 19, worker 1 40/4 + 10 = 20.
func TestMetricsCorrection(t *testing.T) {
	p := newPages(t)
	s := newRig(t, testBS, nil)
	s.putWorker(1, p.endpoint("/w1"), 0, 1)
	s.putWorker(2, p.endpoint("/w2"), 0, 1)
	s.store(rk(2, 0), indexer.TierDevice, costPrompt, 0, 1)
	p.set("/w1/metrics", pageAnswer{body: vllmPage("m", map[string]scheduler.EngineLoad{"0": engLoad(0, 0, 0, nan)})})
	sc := s.newScraper(t, Options{Interval: time.Minute})
	tests := []struct {
		name   string
		opts   scheduler.CostOptions
		engine scheduler.EngineLoad
		book   *scheduler.Booking // booked on worker 2 first
		cost   float64            // of worker 2
	}{
		{name: "off by default", engine: engLoad(3, 2, 0.5, 100), cost: 19},
		// 0.5 * (2 * 1 * 10) = 10.
		{name: "one waiting request", opts: scheduler.CostOptions{MetricsWeight: 0.5}, engine: engLoad(1, 0, 0, nan), cost: 29},
		// 0.5 * (2 * 1 * 2) = 2.
		{name: "configured request size", opts: scheduler.CostOptions{MetricsWeight: 0.5, MetricsRequestBlocks: 2}, engine: engLoad(1, 0, 0, nan), cost: 21},
		// Overlap weight 0: 1 * (1 * 1 * 10) = 10; the base is 10.
		{name: "overlap weight 0", opts: scheduler.CostOptions{MetricsWeight: 1, OverlapWeight: scheduler.NoOverlapWeight}, engine: engLoad(1, 0, 0, nan), cost: 20},
		// 1 * (0.5 * 8) = 4 blocks in use.
		{name: "blocks in use", opts: scheduler.CostOptions{MetricsWeight: 1}, engine: engLoad(0, 3, 0.5, 8), cost: 23},
		// No cache size: 3 running requests of 10 blocks: 30.
		{name: "running requests without cache size", opts: scheduler.CostOptions{MetricsWeight: 1}, engine: engLoad(0, 3, 0.5, nan), cost: 49},
		// A booking of 2 other blocks and 4 prefill tokens: the base is
		// (4+36)/4 + 2 + 10 = 22; tracked 4/4 + 2 = 3 < 4 reported: +1.
		{name: "only the excess over the tracked load", opts: scheduler.CostOptions{MetricsWeight: 1}, engine: engLoad(0, 0, 0.5, 8),
			book: &scheduler.Booking{ID: "b", Worker: rk(2, 0), Hashes: []uint64{71, 72}, PrefillTokens: 4}, cost: 23},
		// Tracked 3 >= reported 2: nothing.
		{name: "tracked load covers it", opts: scheduler.CostOptions{MetricsWeight: 1}, engine: engLoad(0, 0, 0.25, 8),
			book: &scheduler.Booking{ID: "b", Worker: rk(2, 0), Hashes: []uint64{71, 72}, PrefillTokens: 4}, cost: 22},
		{name: "negative weight is off", opts: scheduler.CostOptions{MetricsWeight: -1}, engine: engLoad(3, 0, 0, nan), cost: 19},
		{name: "NaN weight is off", opts: scheduler.CostOptions{MetricsWeight: nan}, engine: engLoad(3, 0, 0, nan), cost: 19},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p.set("/w2/metrics", pageAnswer{body: vllmPage("m", map[string]scheduler.EngineLoad{"0": tt.engine})})
			must(t, sc.ScrapeOnce(t.Context()))
			if tt.book != nil {
				must(t, s.loads.Add(s.key, *tt.book))
				defer s.loads.Free(s.key, tt.book.ID)
			}
			d, err := s.scheduler(1, tt.opts).Select(scheduler.SelectRequest{Key: s.key, Local: costPrompt, Workers: []uint64{2}})
			if err != nil || d.Worker != rk(2, 0) || d.Cost != tt.cost {
				t.Errorf("%+v %v, want worker 2 at cost %v", d, err, tt.cost)
			}
		})
	}
}

// TestMetricsCorrectionChoosesAndExpires: the correction decides between
// two ranks that are otherwise equal, and stops mattering once its scrape
// is stale or fails.
func TestMetricsCorrectionChoosesAndExpires(t *testing.T) {
	clock := newFakeClock()
	p := newPages(t)
	s := newRig(t, testBS, clock.Now)
	s.putWorker(1, p.endpoint("/w1"), 0, 1)
	s.putWorker(2, p.endpoint("/w2"), 0, 1)
	idle := pageAnswer{body: vllmPage("m", map[string]scheduler.EngineLoad{"0": engLoad(0, 0, 0, nan)})}
	queued := pageAnswer{body: vllmPage("m", map[string]scheduler.EngineLoad{"0": engLoad(1, 0, 0, nan)})}
	p.set("/w1/metrics", idle)
	p.set("/w2/metrics", queued)
	const stale = 30 * time.Second
	sc := s.newScraper(t, Options{Interval: 10 * time.Second, StaleAfter: stale})
	must(t, sc.ScrapeOnce(t.Context()))
	opts := scheduler.CostOptions{MetricsWeight: 0.5}
	req := scheduler.SelectRequest{Key: s.key, Local: costPrompt}
	chosen := func(opts scheduler.CostOptions) map[indexer.WorkerRank]float64 {
		out := map[indexer.WorkerRank]float64{}
		for seed := range uint64(16) {
			d, err := s.scheduler(seed, opts).Select(req)
			must(t, err)
			out[d.Worker] = d.Cost
		}
		return out
	}
	// Both cost 40/4 + 10 = 20; worker 2's queued request adds 0.5 *
	// (2 * 1 * 10) = 10.
	if got := chosen(scheduler.CostOptions{}); !reflect.DeepEqual(got, map[indexer.WorkerRank]float64{rk(1, 0): 20, rk(2, 0): 20}) {
		t.Fatalf("without the correction: chose %v, want both workers (a tie) at 20", got)
	}
	if got := chosen(opts); !reflect.DeepEqual(got, map[indexer.WorkerRank]float64{rk(1, 0): 20}) {
		t.Fatalf("with the correction: chose %v, want worker 1 only", got)
	}
	d, err := s.scheduler(0, opts).Select(scheduler.SelectRequest{Key: s.key, Local: costPrompt, Workers: []uint64{2}})
	if err != nil || d.Cost != 30 {
		t.Fatalf("worker 2: %+v %v, want cost 30", d, err)
	}

	// Worker 2 caches a block: 19 without the correction, 29 with it.
	s.store(rk(2, 0), indexer.TierDevice, costPrompt, 0, 1)
	want := func(what string, worker uint64, cost float64) {
		t.Helper()
		if got := chosen(opts); !reflect.DeepEqual(got, map[indexer.WorkerRank]float64{rk(worker, 0): cost}) {
			t.Fatalf("%s: chose %v, want worker %d at %v", what, got, worker, cost)
		}
	}
	want("fresh scrape", 1, 20)
	clock.Advance(stale - time.Nanosecond)
	want("scrape almost stale", 1, 20)
	clock.Advance(time.Nanosecond)
	want("stale scrape", 2, 19)
	if em := s.engineMetrics(2); em == nil || em.Fresh || em.LastError != "" || len(em.Ranks) != 1 {
		t.Errorf("stale engine_metrics %+v, want its values, not fresh", em)
	}
	must(t, sc.ScrapeOnce(t.Context()))
	want("scraped again", 1, 20)
	scrapedAt := s.engineMetrics(2).ScrapedAt

	p.set("/w2/metrics", pageAnswer{status: http.StatusInternalServerError, body: "engine dead"})
	clock.Advance(time.Second)
	must(t, sc.ScrapeOnce(t.Context()))
	want("failed scrape", 2, 19)
	em := s.engineMetrics(2)
	if em == nil || em.Fresh || !strings.Contains(em.LastError, "500") || em.ScrapedAt == nil || !em.ScrapedAt.Equal(*scrapedAt) ||
		!em.AttemptedAt.Equal(clock.Now()) || em.Ranks["0"].Waiting == nil || *em.Ranks["0"].Waiting != 1 {
		t.Errorf("engine_metrics after a failure: %s, want the last values (scraped at %v), the error, not fresh", jsonOf(em), scrapedAt)
	}
	p.set("/w2/metrics", queued)
	must(t, sc.ScrapeOnce(t.Context()))
	want("recovered", 1, 20)
	if em := s.engineMetrics(2); em == nil || !em.Fresh || em.LastError != "" {
		t.Errorf("engine_metrics after recovering: %+v", em)
	}
}

// TestScrapeFollowsCatalog: workers registered later are scraped, what is
// kept of a worker goes with it (or with its rank, or its old endpoint),
// and a scrape finishing after its worker left is dropped.
func TestScrapeFollowsCatalog(t *testing.T) {
	p := newPages(t)
	s := newRig(t, testBS, nil)
	page := pageAnswer{body: vllmPage("m", map[string]scheduler.EngineLoad{"0": engLoad(1, 1, 0.5, 64), "1": engLoad(2, 2, 0.25, 64)})}
	p.set("/a/metrics", page)
	p.set("/b/metrics", page)
	sc := s.newScraper(t, Options{Interval: time.Minute})
	must(t, sc.ScrapeOnce(t.Context())) // nothing to scrape
	s.putWorker(1, p.endpoint("/a"), 0, 2)
	s.putWorker(2, p.endpoint("/a"), 0, 2)                                                                                                 // the same page: fetched once
	must(t, s.cat.RegisterRange(catalog.RangeRegistration{WorkerKey: catalog.WorkerKey{Key: s.key, ID: 3}, BlockSize: testBS, DPSize: 1})) // no endpoint
	must(t, sc.ScrapeOnce(t.Context()))
	if got := testutil.ToFloat64(sc.m.scrapes.WithLabelValues(outcomeSuccess)); got != 1 {
		t.Errorf("%v successful scrapes, want 1 for the page of workers 1 and 2", got)
	}
	for _, id := range []uint64{1, 2} {
		if em := s.engineMetrics(id); em == nil || len(em.Ranks) != 2 || !em.Fresh {
			t.Errorf("worker %d: engine_metrics %+v, want both ranks", id, em)
		}
	}
	if em := s.engineMetrics(3); em != nil {
		t.Errorf("worker 3 has no request endpoint, but engine_metrics %+v", em)
	}
	st := sc.st
	ranksOf := func() []indexer.WorkerRank {
		st.mu.RLock()
		defer st.mu.RUnlock()
		return slices.SortedFunc(func(yield func(indexer.WorkerRank) bool) {
			for wr := range st.ranks[s.key] {
				if !yield(wr) {
					return
				}
			}
		}, cmpRank)
	}
	if got := ranksOf(); !slices.Equal(got, []indexer.WorkerRank{rk(1, 0), rk(1, 1), rk(2, 0), rk(2, 1)}) {
		t.Fatalf("ranks kept for decisions %v", got)
	}

	// Rank 1 of worker 1 leaves; worker 2 moves to another page.
	one := uint32(1)
	_, err := s.cat.Unregister("m", nil, 1, &one)
	must(t, err)
	must(t, s.cat.PatchWorker(catalog.WorkerPatch{WorkerKey: catalog.WorkerKey{Key: s.key, ID: 2}, Endpoint: ptrTo(p.endpoint("/b"))}))
	if em := s.engineMetrics(1); em == nil || len(em.Ranks) != 1 || em.Ranks["0"].Waiting == nil {
		t.Errorf("worker 1 without rank 1: engine_metrics %+v, want rank 0's only", em)
	}
	if em := s.engineMetrics(2); em != nil {
		t.Errorf("worker 2 on another endpoint: engine_metrics %+v, want none until scraped there", em)
	}
	if got := ranksOf(); !slices.Equal(got, []indexer.WorkerRank{rk(1, 0)}) {
		t.Errorf("ranks kept for decisions %v, want worker 1 rank 0 only", got)
	}
	// PUT narrows worker 2's range to rank 1.
	must(t, sc.ScrapeOnce(t.Context()))
	s.putWorker(2, p.endpoint("/b"), 1, 1)
	if em := s.engineMetrics(2); em == nil || len(em.Ranks) != 1 || em.Ranks["1"].Waiting == nil {
		t.Errorf("worker 2 narrowed to rank 1: engine_metrics %+v", em)
	}

	// Worker 1 leaves while its page is being answered.
	hold := make(chan chan struct{})
	p.set("/a/metrics", pageAnswer{body: page.body, hold: hold})
	done := make(chan error, 1)
	go func() { done <- sc.ScrapeOnce(t.Context()) }()
	answer := <-hold
	_, err = s.cat.Unregister("m", nil, 1, nil)
	must(t, err)
	close(answer)
	must(t, <-done)
	if got := testutil.ToFloat64(sc.m.dropped.WithLabelValues(dropWorkerChanged)); got != 1 {
		t.Errorf("%v scrapes dropped for a changed worker, want 1", got)
	}
	if s.listed(1) {
		t.Fatal("worker 1 still registered")
	}
	st.mu.RLock()
	_, kept := st.workers[catalog.WorkerKey{Key: s.key, ID: 1}]
	st.mu.RUnlock()
	if kept || !slices.Equal(ranksOf(), []indexer.WorkerRank{rk(2, 1)}) {
		t.Errorf("after worker 1 left: kept %v, ranks %v", kept, ranksOf())
	}
	// Registered again, it starts with nothing scraped.
	s.putWorker(1, p.endpoint("/a"), 0, 1)
	if em := s.engineMetrics(1); em != nil {
		t.Errorf("worker 1 registered again: engine_metrics %+v", em)
	}
	s.checkScrapes()
}

// TestScraperRun: Run scrapes each interval until its context ends,
// picking up workers as they come.
func TestScraperRun(t *testing.T) {
	p := newPages(t)
	s := newRig(t, testBS, nil)
	p.set("/a/metrics", pageAnswer{body: vllmPage("m", map[string]scheduler.EngineLoad{"0": engLoad(1, 1, 0.5, 64)})})
	s.putWorker(1, p.endpoint("/a"), 0, 1)
	for _, tt := range []struct {
		interval time.Duration
		err      error
	}{{0, nil}, {-time.Second, scheduler.ErrInvalid}} {
		sc := New(s.cat, Options{Interval: tt.interval, Logger: quiet}, nil)
		if err := sc.Run(t.Context()); !errors.Is(err, tt.err) || (tt.err == nil && err != nil) {
			t.Errorf("interval %v: Run = %v, want %v", tt.interval, err, tt.err)
		}
		if em := viewOf(sc.Worker(catalog.WorkerKey{Key: s.key, ID: 1})); em != nil {
			t.Fatalf("scraped without a positive interval: %+v", em)
		}
	}
	sc := s.newScraper(t, Options{Interval: 5 * time.Millisecond, Timeout: 5 * time.Second})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- sc.Run(ctx) }()
	poll.Until(t, "worker 1 scraped", func() bool { em := s.engineMetrics(1); return em != nil && em.Fresh })
	s.putWorker(2, p.endpoint("/a"), 0, 1)
	poll.Until(t, "worker 2 scraped", func() bool { em := s.engineMetrics(2); return em != nil && em.Fresh })
	_, err := s.cat.Unregister("m", nil, 1, nil)
	must(t, err)
	n := testutil.ToFloat64(sc.m.scrapes.WithLabelValues(outcomeSuccess))
	poll.Until(t, "two more scrapes", func() bool { return testutil.ToFloat64(sc.m.scrapes.WithLabelValues(outcomeSuccess)) >= n+2 })
	sc.st.mu.RLock()
	_, kept := sc.st.workers[catalog.WorkerKey{Key: s.key, ID: 1}]
	sc.st.mu.RUnlock()
	if kept {
		t.Error("worker 1 unregistered, but its scrape is kept")
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run = %v after its context ended, want nil", err)
	}
}

// TestScrapeWhileSelecting scrapes in a loop while decisions weigh the
// scraped loads and workers come and go (for the race detector, and for
// lock order: a deadlock hangs the test).
func TestScrapeWhileSelecting(t *testing.T) {
	p := newPages(t)
	s := newRig(t, testBS, nil)
	p.set("/a/metrics", pageAnswer{body: vllmPage("m", map[string]scheduler.EngineLoad{"0": engLoad(2, 1, 0.5, 64), "1": engLoad(0, 1, 0.25, 64)})})
	for id := uint64(1); id <= 4; id++ {
		s.putWorker(id, p.endpoint("/a"), 0, 2)
	}
	sc := s.newScraper(t, Options{Interval: time.Millisecond, Timeout: 5 * time.Second})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- sc.Run(ctx) }()
	poll.Until(t, "a scrape", func() bool { return testutil.ToFloat64(sc.m.scrapes.WithLabelValues(outcomeSuccess)) > 0 })
	sch := s.scheduler(1, scheduler.CostOptions{MetricsWeight: 1})
	var wg sync.WaitGroup
	for g := range 3 {
		wg.Go(func() {
			for i := range 300 {
				req := scheduler.SelectRequest{Key: s.key, Local: promptOf(i%3, 6), Reserve: true, ReservationID: fmt.Sprint(g, "-", i)}
				if g == 0 {
					req.Temperature = ptrTo(1.0)
				}
				if _, err := sch.Select(req); err != nil {
					t.Error(err)
					return
				}
				if _, err := s.loads.Free(s.key, req.ReservationID); err != nil {
					t.Error(err)
					return
				}
				for _, w := range s.cat.Workers("", "") { // reads every worker's scrape
					if ws := sc.Worker(w.WorkerKey); ws != nil && ws.Fresh && ws.LastError != "" {
						t.Errorf("worker %d: fresh with error %q", w.ID, ws.LastError)
					}
				}
			}
		})
	}
	wg.Go(func() {
		for i := range 100 {
			if err := s.cat.PutWorker(catalog.WorkerSpec{WorkerKey: catalog.WorkerKey{Key: s.key, ID: 5}, BlockSize: s.bs, Endpoint: p.endpoint("/a"),
				DPStart: uint32(i % 2), DPSize: 1}); err != nil {
				t.Error(err)
				return
			}
			if _, err := s.cat.Unregister("m", nil, 5, nil); err != nil {
				t.Error(err)
				return
			}
		}
	})
	wg.Wait()
	cancel()
	must(t, <-done)
}
