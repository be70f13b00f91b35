package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvgate/kvgate/bench/sim"
	"github.com/kvgate/kvgate/internal/envoytest"
)

// gatewayRig is a simulated fleet (with a real tokenizer) and kvgate
// routing it, with its ext_proc server and embedded proxy.
type gatewayRig struct {
	t       *testing.T
	ctx     context.Context
	eps     sim.Endpoints
	api     apiClient
	extProc string // host:port
	proxy   string // http://host:port
	models  string // the models file
	envoy   *envoytest.Client
	http    *http.Client
}

var listenRE = regexp.MustCompile(`msg="(ext_proc|proxy) listening" addr=(\S+)`)

func startGatewayRig(t *testing.T, extra ...string) *gatewayRig {
	t.Helper()
	tok := needTokenizer(t, "qwen2.5")
	ctx := e2eContext(t)
	dir := t.TempDir()
	epFile := filepath.Join(dir, "endpoints.json")
	sim := startKvgate(t, ctx, "sim", "--workers", "3", "--dp-size", "2", "--base-port", "0", "--event-base-port", "0",
		"--replay-base-port", "0", "--speedup", "200", "--model", "qwen", "--tokenizer", tok, "--endpoints-file", epFile)
	if _, err := sim.waitLine(ctx, func(l string) bool { return strings.Contains(l, `msg="sim fleet ready"`) }); err != nil {
		t.Fatal(err)
	}
	r := &gatewayRig{t: t, ctx: ctx, http: testClient(t)}
	data, err := os.ReadFile(epFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &r.eps); err != nil {
		t.Fatal(err)
	}
	r.models = filepath.Join(dir, "models.yaml")
	if err := os.WriteFile(r.models, fmt.Appendf(nil, "models:\n  - name: qwen\n    tokenizer: %s\n    block_size: 16\n", tok), 0o644); err != nil {
		t.Fatal(err)
	}
	r.api, r.extProc, r.proxy = r.serve(extra...)
	if r.envoy, err = envoytest.Dial(r.extProc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.envoy.Close() })
	return r
}

// serve starts a kvgate serve over the rig's fleet with the extra flags,
// waits until it follows every rank, and returns its admin client, ext_proc
// address and proxy URL.
func (r *gatewayRig) serve(extra ...string) (api apiClient, extProc, proxy string) {
	t := r.t
	t.Helper()
	args := append([]string{"serve", "--admin-addr", "127.0.0.1:0", "--ext-proc-addr", "127.0.0.1:0", "--proxy-addr", "127.0.0.1:0",
		"--models", r.models}, r.eps.ServeArgs...)
	kv := startKvgate(t, r.ctx, append(args, extra...)...)
	api = apiClient{t: t, ctx: r.ctx, c: r.http, base: "http://" + kv.adminAddr(t, r.ctx)}
	if _, err := kv.waitLine(r.ctx, func(l string) bool {
		if m := listenRE.FindStringSubmatch(l); m != nil {
			if m[1] == "ext_proc" {
				extProc = m[2]
			} else {
				proxy = "http://" + m[2]
			}
		}
		return extProc != "" && proxy != ""
	}); err != nil {
		t.Fatal(err)
	}
	api.eventually(func() string {
		if body := api.must(http.StatusOK, "GET", "/workers", nil); strings.Count(body, `"active"`) < 6 {
			return "listeners not all active: " + body
		}
		return ""
	})
	return api, extProc, proxy
}

// chat returns a chat body: a long shared system prompt, the turns, and
// the user's new message.
func chatBody(stream bool, turns ...string) []byte {
	system := strings.Repeat("You are a careful assistant who answers questions about the history of computing in detail. ", 30)
	msgs := []map[string]string{{"role": "system", "content": system}}
	for i, t := range turns {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		msgs = append(msgs, map[string]string{"role": role, "content": t})
	}
	b, _ := json.Marshal(map[string]any{"model": "qwen", "messages": msgs, "max_tokens": 4, "stream": stream,
		"stream_options": map[string]any{"include_usage": stream}})
	if !stream {
		b, _ = json.Marshal(map[string]any{"model": "qwen", "messages": msgs, "max_tokens": 4})
	}
	return b
}

// viaEnvoy routes req through the ext_proc server, sends the request where
// the picker said (as Envoy's ORIGINAL_DST cluster does), passes the
// response back through the stream, and returns the exchange and body.
func (r *gatewayRig) viaEnvoy(req envoytest.Request) (*envoytest.Exchange, []byte) {
	r.t.Helper()
	x, err := r.envoy.Route(r.ctx, req)
	if err != nil {
		r.t.Fatal(err)
	}
	if x.Immediate != nil {
		return x, x.Immediate.GetBody()
	}
	dest := x.Headers["x-gateway-destination-endpoint"]
	if dest == "" || dest != x.Metadata || !x.ClearRouteCache {
		r.t.Fatalf("picker answer: header %q, metadata %q, clear route cache %v", dest, x.Metadata, x.ClearRouteCache)
	}
	if !bytes.Equal(x.Body, req.Body) || x.Headers["content-length"] != fmt.Sprint(len(req.Body)) {
		r.t.Fatalf("body changed on the way: %d bytes -> %d, content-length %q", len(req.Body), len(x.Body), x.Headers["content-length"])
	}
	first, _, _ := strings.Cut(dest, ",")
	hreq, err := http.NewRequestWithContext(r.ctx, x.Headers[":method"], "http://"+first+x.Headers[":path"], bytes.NewReader(x.Body))
	if err != nil {
		r.t.Fatal(err)
	}
	for k, v := range x.Headers {
		if !strings.HasPrefix(k, ":") {
			hreq.Header.Set(k, v)
		}
	}
	resp, err := r.http.Do(hreq)
	if err != nil {
		r.t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := x.Respond(envoytest.Response{Status: resp.StatusCode, Headers: map[string]string{"content-type": resp.Header.Get("Content-Type")}, Body: resp.Body})
	if err != nil {
		r.t.Fatal(err)
	}
	// The client learns the worker and rank the picker chose.
	id, rank := r.checkServed("via Envoy", func(k string) []string {
		if v, ok := x.ResponseHeaders[k]; ok {
			return []string{v}
		}
		return nil
	}, x.ResponseHeaders)
	if want := r.workerAt(first); id != want || rank != x.Headers["x-data-parallel-rank"] {
		r.t.Errorf("via Envoy: response names worker %s rank %s; the request went to worker %s (%s) rank %s",
			id, rank, want, first, x.Headers["x-data-parallel-rank"])
	}
	return x, out
}

// workerAt returns the id of the fleet's worker at host:port ep.
func (r *gatewayRig) workerAt(ep string) string {
	for _, w := range r.eps.Workers {
		if strings.TrimPrefix(w.URL, "http://") == ep {
			return fmt.Sprint(w.ID)
		}
	}
	return "none at " + ep
}

// checkServed checks a response's x-kvgate-worker-id and x-kvgate-dp-rank
// (values reads one header's values): one each, a worker of the fleet and
// one of its 2 ranks, and no worker address in any response header. It
// returns them.
func (r *gatewayRig) checkServed(name string, values func(string) []string, all map[string]string) (id, rank string) {
	r.t.Helper()
	ids, ranks := values("x-kvgate-worker-id"), values("x-kvgate-dp-rank")
	if len(ids) != 1 || len(ranks) != 1 {
		r.t.Errorf("%s: served headers %q %q, want one value each", name, ids, ranks)
		return "", ""
	}
	id, rank = ids[0], ranks[0]
	if !slices.ContainsFunc(r.eps.Workers, func(w sim.EndpointWorker) bool { return fmt.Sprint(w.ID) == id }) ||
		(rank != "0" && rank != "1") {
		r.t.Errorf("%s: served by worker %q rank %q: not in the fleet", name, id, rank)
	}
	for k, v := range all {
		for _, w := range r.eps.Workers {
			if ep := strings.TrimPrefix(w.URL, "http://"); strings.Contains(v, ep) {
				r.t.Errorf("%s: response header %s: %q reveals worker address %s", name, k, v, ep)
			}
		}
	}
	return id, rank
}

// proxyHeaders flattens a proxy response's headers for checkServed.
func proxyHeaders(h http.Header) map[string]string {
	out := map[string]string{}
	for k, vs := range h {
		out[k] = strings.Join(vs, ", ")
	}
	return out
}

// usageOf returns usage's prompt_tokens and
// prompt_tokens_details.cached_tokens from a response body, JSON or SSE.
func usageOf(t *testing.T, body []byte) (prompt, cached int) {
	t.Helper()
	for _, doc := range append([][]byte{body}, bytes.Split(body, []byte("\n"))...) {
		doc = bytes.TrimPrefix(bytes.TrimSpace(doc), []byte("data: "))
		var v struct {
			Usage *struct {
				Prompt  int `json:"prompt_tokens"`
				Details struct {
					Cached int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if json.Unmarshal(doc, &v) == nil && v.Usage != nil {
			return v.Usage.Prompt, v.Usage.Details.Cached
		}
	}
	t.Fatalf("no usage in %s", body)
	return 0, 0
}

// checkFollowUp checks that a follow-up turn found the whole earlier
// conversation cached (all but the last partial block and the generation
// prompt the next turn replaces), more than the first turn did.
func checkFollowUp(t *testing.T, first, second []byte) {
	t.Helper()
	p1, c1 := usageOf(t, first)
	_, c2 := usageOf(t, second)
	if c2 <= c1 || c2 < p1-32 {
		t.Errorf("follow-up found %d cached tokens; the first turn had %d prompt tokens, %d of them cached", c2, p1, c1)
	}
}

// loadsZero waits until no request is active on any worker.
func (r *gatewayRig) loadsZero() {
	r.t.Helper()
	r.api.eventually(func() string {
		body := r.api.must(http.StatusOK, "GET", "/loads", nil)
		var v any
		if err := json.Unmarshal([]byte(body), &v); err != nil {
			return "bad /loads: " + body
		}
		if nonZeroLoad(v) {
			return "loads not back to zero: " + body
		}
		return ""
	})
}

func nonZeroLoad(v any) bool {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if n, ok := e.(float64); ok && strings.HasPrefix(k, "active_") && n != 0 {
				return true
			}
			if nonZeroLoad(e) {
				return true
			}
		}
	case []any:
		for _, e := range x {
			if nonZeroLoad(e) {
				return true
			}
		}
	}
	return false
}

// TestE2EGatewayExtProc drives kvgate's ext_proc server as Envoy does, in
// both modes, against a simulated fleet.
func TestE2EGatewayExtProc(t *testing.T) {
	r := startGatewayRig(t)
	for _, mode := range []envoytest.Mode{envoytest.FullDuplex, envoytest.Buffered} {
		t.Run(mode.String(), func(t *testing.T) {
			r.t = t
			topic := mode.String()
			first := chatBody(true, "Tell me about "+topic+" mode and the first computers.")
			x1, body1 := r.viaEnvoy(envoytest.Request{Path: "/v1/chat/completions", Body: first, Mode: mode, Chunk: 1000})
			// The next turn repeats the conversation: it must land on the
			// same worker and rank, and find its prefix cached there.
			second := chatBody(true, "Tell me about "+topic+" mode and the first computers.", "They were large.", "And later ones?")
			x2, body2 := r.viaEnvoy(envoytest.Request{Path: "/v1/chat/completions", Body: second, Mode: mode, Chunk: 777})
			if x1.Headers["x-gateway-destination-endpoint"] != x2.Headers["x-gateway-destination-endpoint"] ||
				x1.Headers["x-data-parallel-rank"] != x2.Headers["x-data-parallel-rank"] || x1.Headers["x-data-parallel-rank"] == "" {
				t.Errorf("the follow-up went to %s rank %s, the first to %s rank %s",
					x2.Headers["x-gateway-destination-endpoint"], x2.Headers["x-data-parallel-rank"],
					x1.Headers["x-gateway-destination-endpoint"], x1.Headers["x-data-parallel-rank"])
			}
			checkFollowUp(t, body1, body2)
			if !bytes.Contains(body2, []byte("data: [DONE]")) {
				t.Errorf("stream body did not pass through: %s", body2)
			}
			r.loadsZero()
		})
	}
	r.t = t

	t.Run("subset hint", func(t *testing.T) {
		r.t = t
		want := strings.TrimPrefix(r.eps.Workers[2].URL, "http://")
		for _, subset := range []any{[]string{want}, "10.255.255.1:1, " + want} {
			x, _ := r.viaEnvoy(envoytest.Request{Path: "/v1/completions", Body: []byte(`{"model":"qwen","prompt":"hello there","max_tokens":2}`), Subset: subset, ValueHeaders: true})
			if got := x.Headers["x-gateway-destination-endpoint"]; got != want {
				t.Errorf("subset %v: routed to %s", subset, got)
			}
		}
		r.loadsZero()
	})

	t.Run("bad input", func(t *testing.T) {
		r.t = t
		for _, tc := range []struct {
			name   string
			req    envoytest.Request
			status int
		}{
			{"bad json", envoytest.Request{Path: "/v1/chat/completions", Body: []byte(`{"model":`)}, 400},
			{"no model", envoytest.Request{Path: "/v1/completions", Body: []byte(`{"prompt":"x"}`)}, 400},
			{"no prompt", envoytest.Request{Path: "/v1/completions", Body: []byte(`{"model":"qwen"}`), Mode: envoytest.Buffered}, 400},
			{"unknown model", envoytest.Request{Path: "/v1/completions", Body: []byte(`{"model":"nope","prompt":"x"}`)}, 404},
			{"template error", envoytest.Request{Path: "/v1/chat/completions", Body: []byte(`{"model":"qwen","messages":[{"role":"user","content":{"bad":1}}]}`)}, 400},
			{"empty subset", envoytest.Request{Path: "/v1/completions", Body: []byte(`{"model":"qwen","prompt":"x"}`), Subset: []string{}}, 503},
			{"subset of strangers", envoytest.Request{Path: "/v1/completions", Body: []byte(`{"model":"qwen","prompt":"x"}`), Subset: "10.255.255.1:1"}, 503},
		} {
			x, body := r.viaEnvoy(tc.req)
			if x.Immediate == nil || int(x.Immediate.GetStatus().GetCode()) != tc.status {
				t.Errorf("%s: immediate response %v, want status %d", tc.name, x.Immediate, tc.status)
				continue
			}
			var e struct {
				Error struct {
					Message string `json:"message"`
					Code    int    `json:"code"`
				} `json:"error"`
			}
			if err := json.Unmarshal(body, &e); err != nil || e.Error.Message == "" || e.Error.Code != tc.status {
				t.Errorf("%s: body %s", tc.name, body)
			}
		}
		// The next good request goes through.
		x, _ := r.viaEnvoy(envoytest.Request{Path: "/v1/completions", Body: []byte(`{"model":"qwen","prompt":[1,2,3,4],"max_tokens":1}`)})
		if x.Immediate != nil {
			t.Errorf("good request after bad ones refused: %v", x.Immediate)
		}
		r.loadsZero()
	})

	t.Run("cancel and bodyless", func(t *testing.T) {
		r.t = t
		x, err := r.envoy.Route(r.ctx, envoytest.Request{Path: "/v1/completions", Body: []byte(`{"model":"qwen","prompt":"abandoned","max_tokens":5}`)})
		if err != nil || x.Immediate != nil {
			t.Fatal(err, x.Immediate)
		}
		x.Cancel() // the client left before any response
		// A request without a body is routed on load only.
		y, err := r.envoy.Route(r.ctx, envoytest.Request{Method: "GET", Path: "/v1/models"})
		if err != nil || y.Immediate != nil || y.Headers["x-gateway-destination-endpoint"] == "" {
			t.Fatalf("bodyless request: %v %v %v", err, y.Immediate, y.Headers)
		}
		y.Cancel()
		r.loadsZero()
	})

	t.Run("200 concurrent streams", func(t *testing.T) {
		r.t = t
		var wg sync.WaitGroup
		errs := make(chan error, 200)
		for i := range 200 {
			wg.Go(func() {
				body := fmt.Appendf(nil, `{"model":"qwen","prompt":[%d,%d,%d,%d,5,6,7,8,9,10,11,12,13,14,15,16,17],"max_tokens":3,"stream":true}`, i%7, i, i, i)
				x, err := r.envoy.Route(r.ctx, envoytest.Request{Path: "/v1/completions", Body: body, Chunk: 10})
				if err != nil || x.Immediate != nil {
					errs <- fmt.Errorf("request %d: %v %v", i, err, x.Immediate)
					return
				}
				ep, _, _ := strings.Cut(x.Headers["x-gateway-destination-endpoint"], ",")
				hreq, _ := http.NewRequestWithContext(r.ctx, "POST", "http://"+ep+"/v1/completions", bytes.NewReader(x.Body))
				hreq.Header.Set("X-Data-Parallel-Rank", x.Headers["x-data-parallel-rank"])
				resp, err := r.http.Do(hreq)
				if err != nil {
					x.Cancel()
					errs <- err
					return
				}
				defer resp.Body.Close()
				out, err := x.Respond(envoytest.Response{Status: resp.StatusCode, Headers: map[string]string{"content-type": resp.Header.Get("Content-Type")}, Body: resp.Body, Trailers: i%2 == 0})
				if err != nil || !bytes.Contains(out, []byte("[DONE]")) {
					errs <- fmt.Errorf("request %d: %v %q", i, err, out)
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		r.loadsZero()
	})

	t.Run("health", func(t *testing.T) {
		r.t = t
		h := grpc_health_v1.NewHealthClient(r.envoy.Conn())
		for _, svc := range []string{"", "liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor"} {
			resp, err := h.Check(r.ctx, &grpc_health_v1.HealthCheckRequest{Service: svc})
			if err != nil || resp.GetStatus() != grpc_health_v1.HealthCheckResponse_SERVING {
				t.Errorf("health %q: %v %v", svc, resp.GetStatus(), err)
			}
		}
	})
}

// TestE2EGatewayProxy sends OpenAI requests through the embedded proxy,
// streaming and not.
func TestE2EGatewayProxy(t *testing.T) {
	r := startGatewayRig(t, "--metrics-scrape-interval", "50ms", "--metrics-load-weight", "0.5")
	post := func(proxy string, body []byte) (int, []byte, http.Header) {
		t.Helper()
		resp, err := r.http.Post(proxy+"/v1/chat/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		out, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, out, resp.Header
	}
	served := func(name string, h http.Header) string {
		t.Helper()
		id, rank := r.checkServed(name, h.Values, proxyHeaders(h))
		return id + "/" + rank
	}
	for _, stream := range []bool{false, true} {
		topic := fmt.Sprint("streaming ", stream)
		status, first, h1 := post(r.proxy, chatBody(stream, "Explain "+topic))
		if status != 200 {
			t.Fatalf("first: %d %s", status, first)
		}
		status, out, h2 := post(r.proxy, chatBody(stream, "Explain "+topic, "Sure.", "More please"))
		if status != 200 {
			t.Fatalf("follow-up: %d %s", status, out)
		}
		checkFollowUp(t, first, out)
		if stream && !bytes.HasSuffix(bytes.TrimSpace(out), []byte("data: [DONE]")) {
			t.Errorf("stream did not end with [DONE]: %s", out)
		}
		// The follow-up found its prefix where the first turn ran: both
		// responses name that worker and rank.
		if a, b := served(topic+" first", h1), served(topic+" follow-up", h2); a != b {
			t.Errorf("%s: the first turn names %s, the follow-up %s", topic, a, b)
		}
	}
	status, out, h := post(r.proxy, []byte(`{"model":"nope","messages":[{"role":"user","content":"x"}]}`))
	if status != 404 || !bytes.Contains(out, []byte(`"error"`)) {
		t.Errorf("unknown model through the proxy: %d %s", status, out)
	}
	if h.Get("x-kvgate-worker-id") != "" || h.Get("x-kvgate-dp-rank") != "" {
		t.Errorf("a refused request names a worker: %q %q", h.Get("x-kvgate-worker-id"), h.Get("x-kvgate-dp-rank"))
	}
	r.loadsZero()
	// The workers' vLLM metrics are scraped and shown, per DP rank.
	r.api.eventually(func() string {
		var ws []struct {
			ID      uint64 `json:"instance_id"`
			Metrics *struct {
				Fresh bool                       `json:"fresh"`
				Ranks map[string]json.RawMessage `json:"ranks"`
			} `json:"engine_metrics"`
		}
		body := r.api.must(http.StatusOK, "GET", "/workers", nil)
		if err := json.Unmarshal([]byte(body), &ws); err != nil || len(ws) != 3 {
			return fmt.Sprintf("workers: %v %s", err, body)
		}
		for _, w := range ws {
			if w.Metrics == nil || !w.Metrics.Fresh || len(w.Metrics.Ranks) != 2 {
				return "engine metrics not scraped for every rank: " + body
			}
		}
		return ""
	})

	// A baseline policy names the worker too, through both fronts: a
	// second kvgate over the same fleet routes round-robin.
	_, extProc, proxy := r.serve("--routing-policy", "round-robin")
	seen := map[string]bool{}
	for i := range 6 {
		status, out, h := post(proxy, chatBody(false, fmt.Sprint("Round ", i)))
		if status != 200 {
			t.Fatalf("round-robin request %d: %d %s", i, status, out)
		}
		seen[served(fmt.Sprint("round-robin request ", i), h)] = true
	}
	if len(seen) != 6 {
		t.Errorf("6 round-robin requests served by %v, want each of the 6 ranks", seen)
	}
	envoy, err := envoytest.Dial(extProc)
	if err != nil {
		t.Fatal(err)
	}
	defer envoy.Close()
	kvEnvoy := r.envoy
	defer func() { r.envoy = kvEnvoy }() // the rig's cleanup closes it
	r.envoy = envoy                      // viaEnvoy checks the served headers
	for _, mode := range []envoytest.Mode{envoytest.FullDuplex, envoytest.Buffered} {
		if x, body := r.viaEnvoy(envoytest.Request{Path: "/v1/chat/completions", Body: chatBody(true, "Round robin via Envoy"), Mode: mode}); x.Immediate != nil {
			t.Errorf("round-robin via Envoy, %s: refused: %s", mode, body)
		}
	}
}
