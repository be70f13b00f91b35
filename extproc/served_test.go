package extproc

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/indexer"
	"github.com/kvgate/kvgate/internal/envoytest"
	"github.com/kvgate/kvgate/scheduler"
	"github.com/kvgate/kvgate/scheduler/catalog"
	"github.com/kvgate/kvgate/tokenize"
)

// fakeWorker answers every request with its id and the rank it was told,
// and with forged served headers that must not reach the client.
func fakeWorker(t *testing.T, id uint64) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Fake-Worker", fmt.Sprint(id))
		w.Header().Set("X-Got-Rank", r.Header.Get(RankHeader))
		w.Header().Set(WorkerIDHeader, "999")
		w.Header().Set(DPRankHeader, "42")
		_, _ = io.WriteString(w, `{"choices":[{"text":"ok"}],"usage":{"prompt_tokens":32,"completion_tokens":1}}`)
	}))
	t.Cleanup(s.Close)
	return s
}

// closedEndpoint returns a host:port nothing listens on.
func closedEndpoint(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func completionBody(conv, n int) []byte {
	ids := make([]string, 32+n)
	for i := range ids {
		ids[i] = fmt.Sprint(conv*1000 + i)
	}
	return fmt.Appendf(nil, `{"model":"m","prompt":[%s],"max_tokens":1}`, strings.Join(ids, ","))
}

// checkServed checks a response's served headers: the worker that
// answered, its rank as it was told (or 0 with one rank), nothing forged
// and no endpoint anywhere in kvgate's headers.
func checkServed(t *testing.T, name string, h http.Header, ranks map[string]int, endpoints []string) {
	t.Helper()
	id, rank := h.Get(WorkerIDHeader), h.Get(DPRankHeader)
	if len(h.Values(WorkerIDHeader)) != 1 || len(h.Values(DPRankHeader)) != 1 {
		t.Errorf("%s: served headers %q %q, want one value each", name, h.Values(WorkerIDHeader), h.Values(DPRankHeader))
	}
	if id != h.Get("X-Fake-Worker") {
		t.Errorf("%s: %s %q, but worker %s answered", name, WorkerIDHeader, id, h.Get("X-Fake-Worker"))
	}
	switch want := h.Get("X-Got-Rank"); {
	case ranks[id] > 1 && (want == "" || rank != want):
		t.Errorf("%s: %s %q, the worker was told rank %q", name, DPRankHeader, rank, want)
	case ranks[id] <= 1 && (want != "" || rank != "0"):
		t.Errorf("%s: %s %q on a single-rank worker told rank %q, want 0 and not told", name, DPRankHeader, rank, want)
	}
	for k, vs := range h {
		for _, v := range vs {
			for _, ep := range endpoints {
				if strings.Contains(v, ep) {
					t.Errorf("%s: header %s: %q reveals endpoint %s", name, k, v, ep)
				}
			}
		}
	}
}

// TestProxyServedHeaders sends requests through the embedded proxy with
// every routing policy: each response names the worker that answered and
// its rank; with the chosen worker unreachable, the fallback that
// answered is named, and is sent its own rank.
func TestProxyServedHeaders(t *testing.T) {
	logger, cat, sched, reg := newTestCore(t, tokenize.ModelConfig{Name: "m", BlockSize: 16})
	key := indexer.Key{Model: "m", Tenant: indexer.DefaultTenant}
	ranks := map[string]int{"1": 2, "2": 1, "3": 2}
	var endpoints []string
	for id := uint64(1); id <= 2; id++ {
		ep := strings.TrimPrefix(fakeWorker(t, id).URL, "http://")
		endpoints = append(endpoints, ep)
		if err := cat.PutWorker(catalog.WorkerSpec{WorkerKey: catalog.WorkerKey{Key: key, ID: id}, BlockSize: 16, Endpoint: "http://" + ep,
			DPSize: uint32(ranks[fmt.Sprint(id)])}); err != nil {
			t.Fatal(err)
		}
	}
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	serve := func(t *testing.T, opts Options) string {
		opts.Logger, opts.Registerer, opts.Seed = logger, prometheus.NewRegistry(), 5
		hs := httptest.NewServer(NewProxy(New(reg, cat, sched, opts), ProxyOptions{Transport: tr, Logger: logger}))
		t.Cleanup(hs.Close)
		return hs.URL
	}
	post := func(t *testing.T, url string, body []byte) http.Header {
		t.Helper()
		resp, err := client.Post(url+"/v1/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, out)
		}
		return resp.Header
	}
	for _, policy := range Policies {
		t.Run(string(policy), func(t *testing.T) {
			url := serve(t, Options{Policy: policy})
			seen := map[string]bool{}
			for i := range 8 {
				h := post(t, url, completionBody(i, i))
				checkServed(t, fmt.Sprint("request ", i), h, ranks, endpoints)
				seen[h.Get(WorkerIDHeader)+"/"+h.Get(DPRankHeader)] = true
			}
			if policy == PolicyRoundRobin && len(seen) != 3 {
				t.Errorf("round-robin served by %v, want the 3 ranks", seen)
			}
		})
	}

	t.Run("fallback", func(t *testing.T) {
		// Worker 3, idle, is the best choice, but nothing listens there
		// (the last subtest: it stays registered).
		down := closedEndpoint(t)
		if err := cat.PutWorker(catalog.WorkerSpec{WorkerKey: catalog.WorkerKey{Key: key, ID: 3}, BlockSize: 16, Endpoint: down, DPSize: 2}); err != nil {
			t.Fatal(err)
		}
		for i, wr := range []indexer.WorkerRank{{Worker: 2}, {Worker: 1}, {Worker: 1, Rank: 1}} {
			b := scheduler.Booking{ID: fmt.Sprint("busy", i), Worker: wr, PrefillTokens: int64(5000 * (3 - i))}
			if err := sched.Loads().Add(key, b); err != nil {
				t.Fatal(err)
			}
			defer func() {
				if _, err := sched.Loads().Free(key, b.ID); err != nil {
					t.Error(err)
				}
			}()
		}
		p, e := ParsePrompt("/v1/completions", completionBody(100, 0))
		if e != nil {
			t.Fatal(e)
		}
		r, e := New(reg, cat, sched, Options{Fallbacks: 2, Logger: logger, Registerer: prometheus.NewRegistry()}).Decide(t.Context(), &p, nil, "")
		if e != nil {
			t.Fatal(e)
		}
		r.Finish()
		if r.Worker != 3 || len(r.fallbackPicks) != 2 || r.fallbackPicks[0] != (pick{endpoint: endpoints[0], worker: 1, rank: 1, setRank: true}) ||
			r.fallbackPicks[1].worker != 2 || r.fallbackPicks[1].setRank {
			t.Fatalf("decision: worker %d, fallbacks %+v; want worker 3, then worker 1 rank 1, then worker 2", r.Worker, r.fallbackPicks)
		}
		url := serve(t, Options{Fallbacks: 2})
		for i := range 3 {
			h := post(t, url, completionBody(100+i, i))
			checkServed(t, fmt.Sprint("fallback request ", i), h, ranks, append(endpoints, down))
			if h.Get(WorkerIDHeader) != "1" || h.Get("X-Got-Rank") != "1" {
				t.Errorf("request %d: served by worker %s told rank %q, want the first fallback, worker 1 rank 1", i, h.Get("X-Fake-Worker"), h.Get("X-Got-Rank"))
			}
		}
	})
}

// TestExtProcServedHeaders passes responses through the ext_proc server
// as Envoy does, in both body modes: the response headers name the
// picked worker and rank, or the fallback the proxy reports as served,
// and never a forged value.
func TestExtProcServedHeaders(t *testing.T) {
	logger, cat, sched, reg := newTestCore(t, tokenize.ModelConfig{Name: "m", BlockSize: 16})
	key := indexer.Key{Model: "m", Tenant: indexer.DefaultTenant}
	workerOf := map[string]string{}
	for id := uint64(1); id <= 3; id++ {
		ep := fmt.Sprintf("10.0.0.%d:8000", id)
		workerOf[ep] = fmt.Sprint(id)
		if err := cat.PutWorker(catalog.WorkerSpec{WorkerKey: catalog.WorkerKey{Key: key, ID: id}, BlockSize: 16, Endpoint: ep, DPSize: uint32(id%2 + 1)}); err != nil {
			t.Fatal(err)
		}
	}
	for _, policy := range []Policy{PolicyKV, PolicyRoundRobin} {
		t.Run(string(policy), func(t *testing.T) {
			g := New(reg, cat, sched, Options{Policy: policy, Fallbacks: 1, Logger: logger, Registerer: prometheus.NewRegistry()})
			srv, err := NewServer(g, ServerOptions{Logger: logger})
			if err != nil {
				t.Fatal(err)
			}
			addr, served := serveOnLoopback(t, srv)
			defer func() {
				srv.Shutdown(t.Context())
				if err := <-served; err != nil {
					t.Error(err)
				}
			}()
			envoy, err := envoytest.Dial(addr)
			if err != nil {
				t.Fatal(err)
			}
			defer envoy.Close()
			for i, mode := range []envoytest.Mode{envoytest.FullDuplex, envoytest.Buffered, envoytest.FullDuplex, envoytest.Buffered, envoytest.FullDuplex} {
				x, err := envoy.Route(t.Context(), envoytest.Request{Path: "/v1/completions", Body: completionBody(i, i), Mode: mode})
				if err != nil || x.Immediate != nil {
					t.Fatalf("request %d: %v %v", i, err, x.Immediate)
				}
				eps := strings.Split(x.Headers[DestinationHeader], ",")
				resp := envoytest.Response{Status: 200, Body: strings.NewReader(`{"usage":{"prompt_tokens":3}}`),
					Headers: map[string]string{"content-type": "application/json", WorkerIDHeader: "999", DPRankHeader: "42"}}
				wantID, wantRank := workerOf[eps[0]], x.Headers[RankHeader]
				switch {
				case i == 2 && len(eps) > 1: // the proxy reports a fallback
					resp.Served, wantID, wantRank = eps[1], workerOf[eps[1]], ""
				case i == 4: // ... or an endpoint kvgate did not pick
					resp.Served, wantID, wantRank = "10.9.9.9:1", "", ""
				}
				if wantRank == "" && wantID != "" {
					wantRank = "0"
					if id := wantID; id == "1" || id == "3" { // two ranks each
						wantRank = "*"
					}
				}
				if _, err := x.Respond(resp); err != nil {
					t.Fatal(err)
				}
				h := x.ResponseHeaders
				if h[WorkerIDHeader] != wantID || (wantRank != "*" && h[DPRankHeader] != wantRank) ||
					(wantRank == "*" && h[DPRankHeader] != "0" && h[DPRankHeader] != "1") || (wantID == "" && h[DPRankHeader] != "") {
					t.Errorf("request %d (%s, to %v, served %q): served headers %q %q, want %q %q",
						i, mode, eps, resp.Served, h[WorkerIDHeader], h[DPRankHeader], wantID, wantRank)
				}
				for k, v := range h {
					if k != ":status" && k != "content-type" && k != WorkerIDHeader && k != DPRankHeader {
						t.Errorf("request %d: unexpected response header %s: %q", i, k, v)
					}
				}
			}
		})
	}
}
