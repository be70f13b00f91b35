package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/indexer"
)

func TestDumpOverHTTP(t *testing.T) {
	r := serveAPI(t, nil, 0)
	fixture(t, r.set)
	tiny, err := r.set.Index(indexer.Key{Model: "tiny", Tenant: "t"}, 2)
	if err != nil {
		t.Fatal(err)
	}
	place(t, tiny, hold{w: wr(7, 1), tier: indexer.TierHost, tokens: mcTokens, from: 0, to: 2})
	code, h, body := r.call(t, http.MethodGet, "/dump", "")
	if code != http.StatusOK || h.Get("Content-Type") != "application/json" {
		t.Fatalf("GET /dump: %d %q: %s", code, h.Get("Content-Type"), body)
	}

	// The shape, on the one-rank index: one event per block, breadth first.
	var doc map[string]struct {
		BlockSize int               `json:"block_size"`
		Events    []json.RawMessage `json:"events"`
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for k := range doc {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if want := []string{"deepseek-v3:default", "m:acme", "m:default", "org/m:v1:default", "tiny:t"}; !slices.Equal(keys, want) {
		t.Fatalf("dump keys %v, want %v", keys, want)
	}
	for k, bs := range map[string]int{"m:default": 2, "org/m:v1:default": 4, "tiny:t": 2} {
		if doc[k].BlockSize != bs {
			t.Errorf("%s: block_size %d, want %d", k, doc[k].BlockSize, bs)
		}
	}
	local := indexer.LocalHashes(nil, mcTokens, 2, indexer.BaseSeed, nil)
	seq := indexer.SequenceHashes(nil, local)
	if ev := doc["tiny:t"].Events; len(ev) != 2 {
		t.Fatalf("tiny:t: %d events", len(ev))
	} else {
		jsonEq(t, ev[0], fmt.Sprintf(`{"worker_id": 7, "storage_tier": "host_pinned", "event": {"event_id": 0, "dp_rank": 1,
			"data": {"stored": {"parent_hash": null, "blocks": [{"block_hash": %d, "tokens_hash": %d}]}}}}`, seq[0], local[0]))
		jsonEq(t, ev[1], fmt.Sprintf(`{"worker_id": 7, "storage_tier": "host_pinned", "event": {"event_id": 1, "dp_rank": 1,
			"data": {"stored": {"parent_hash": %d, "blocks": [{"block_hash": %d, "tokens_hash": %d}]}}}}`, seq[0], seq[1], local[1]))
	}

	// Replayed into an empty Set, the dump answers every query the same.
	dumps, err := indexer.UnmarshalDump(body)
	if err != nil {
		t.Fatal(err)
	}
	if i := slices.IndexFunc(dumps, func(d indexer.IndexDump) bool { return d.Key.Model == "org/m:v1" }); i < 0 || dumps[i].Key.Tenant != indexer.DefaultTenant {
		t.Fatalf("org/m:v1 not split at the last ':': %v", dumps)
	}
	loaded := serveAPI(t, nil, 0)
	if skipped, err := loaded.set.Load(dumps); err != nil || skipped != 0 {
		t.Fatalf("load: %d skipped, %v", skipped, err)
	}
	sameAnswers(t, r, loaded)
}

// sameAnswers checks that a and b answer a set of queries over the fixture
// alike.
func sameAnswers(t *testing.T, a, b *apiRig) {
	t.Helper()
	for _, q := range []struct{ path, body string }{
		{"/query", obj("model_name", "m", "token_ids", fxTokens)},
		{"/query", obj("model_name", "m", "token_ids", otherTokens)},
		{"/query", obj("model_name", "m", "tenant_id", "acme", "token_ids", fxTokens)},
		{"/query", obj("model_name", "org/m:v1", "lora_name", "sql", "token_ids", fxTokens)},
		{"/conductor/query", obj("model", "deepseek-v3", "token_ids", mcTokens)},
		{"/query_by_hash", obj("model_name", "m", "block_hashes", indexer.LocalHashes(nil, fxTokens[:6], 2, indexer.BaseSeed, nil))},
	} {
		want := a.expect(t, q.path, q.body, http.StatusOK, "")
		t.Run(q.path, func(t *testing.T) {
			b.expect(t, q.path, q.body, http.StatusOK, string(want))
		})
	}
}

func TestPeersAPI(t *testing.T) {
	r := serveAPI(t, nil, 0)
	peers := func(want string) {
		t.Helper()
		code, _, got := r.call(t, http.MethodGet, "/peers", "")
		if code != http.StatusOK {
			t.Fatalf("GET /peers: %d %s", code, got)
		}
		jsonEq(t, got, want)
	}
	peers(`[]`)
	const ok = `{"status": "ok"}`
	for _, u := range []string{"http://b.example:8080/", "http://b.example:8080", "  https://a.example:9000//  ", "http://a.example:1", "http://a.example:1/#", "HTTP://A.Example:1"} {
		r.expect(t, "/register_peer", obj("url", u), http.StatusCreated, ok)
	}
	peers(`["http://a.example:1", "http://b.example:8080", "https://a.example:9000"]`)

	for _, tt := range []struct{ body, want string }{
		{`{}`, "url"},
		{`{"url": null}`, "url"},
		{`{"url": 5}`, "url"},
		{`{"url": ""}`, ""},
		{`{"url": "not a url"}`, ""},
		{`{"url": "ftp://a.example:1"}`, ""},
		{`{"url": "a.example:1"}`, ""},
		{`{"url": "http://"}`, ""},
		{`{"url": "http://a.example:1/?x=1"}`, ""},
		{`{"url": "http://user:pw@a.example:1"}`, ""},
		{`{"url": "http://:80"}`, ""}, // no host name
		{`[]`, ""},
		{``, ""},
	} {
		for _, path := range []string{"/register_peer", "/deregister_peer"} {
			t.Run(path+" "+tt.body, func(t *testing.T) {
				code, h, got := r.call(t, http.MethodPost, path, tt.body)
				checkError(t, code, h, got, http.StatusBadRequest, tt.want)
			})
		}
	}
	peers(`["http://a.example:1", "http://b.example:8080", "https://a.example:9000"]`)

	// "http://c.example:1/?" has an empty query: it must be refused or
	// normalized without the '?', or Recover would fetch "/?/dump" (GET /
	// with query "/dump").
	code, h, got := r.call(t, http.MethodPost, "/register_peer", `{"url": "http://c.example:1/?"}`)
	if code == http.StatusCreated {
		if !r.peers.Remove("http://c.example:1") {
			t.Errorf(`"http://c.example:1/?" registered as %q`, r.peers.List())
			r.peers.Remove("http://c.example:1/?")
		}
	} else {
		checkError(t, code, h, got, http.StatusBadRequest)
	}

	r.expect(t, "/deregister_peer", obj("url", "http://b.example:8080/"), http.StatusOK, ok)
	code, h, got = r.call(t, http.MethodPost, "/deregister_peer", obj("url", "http://b.example:8080"))
	checkError(t, code, h, got, http.StatusNotFound, "http://b.example:8080")
	peers(`["http://a.example:1", "https://a.example:9000"]`)

	if p, err := NewPeers([]string{"http://x.example/", "http://x.example"}); err != nil || !slices.Equal(p.List(), []string{"http://x.example"}) {
		t.Errorf("NewPeers: %v, %v", p, err)
	}
	if _, err := NewPeers([]string{"http://x.example", "x.example"}); err == nil {
		t.Error("NewPeers accepted a URL without scheme")
	}
}

// onlyDeadline lets Recover's per-peer deadline reach requests to one host
// only, so that the other peers answer however slow the machine.
type onlyDeadline struct {
	rt   http.RoundTripper
	host string
}

func (o onlyDeadline) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Host != o.host {
		req = req.WithContext(context.WithoutCancel(req.Context()))
	}
	return o.rt.RoundTrip(req)
}

// unusablePeers starts peers Recover must skip: a closed port, a 500, a
// body that is not JSON, a JSON document that is not a dump, and one that
// never answers (the last, whose host the returned client's deadline
// applies to).
func unusablePeers(t *testing.T) ([]string, *http.Client) {
	t.Helper()
	var urls []string
	serve := func(h http.HandlerFunc) *httptest.Server {
		s := httptest.NewServer(h)
		t.Cleanup(s.Close)
		urls = append(urls, s.URL)
		return s
	}
	serve(nil).Close()
	serve(func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "boom", http.StatusInternalServerError) })
	for _, doc := range []string{`{"m:default": {"block_size": 2, "events": [`, `{"no-colon": {"block_size": 2, "events": []}}`} {
		serve(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, doc) })
	}
	release := make(chan struct{})
	hang := serve(func(_ http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	t.Cleanup(func() { close(release) }) // runs before hang.Close
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return urls, &http.Client{Transport: onlyDeadline{rt: tr, host: hang.Listener.Addr().String()}}
}

var discardLog = slog.New(slog.DiscardHandler)

func TestRecover(t *testing.T) {
	src := serveAPI(t, nil, 0)
	fixture(t, src.set)
	conflict := indexer.Key{Model: "conflict", Tenant: indexer.DefaultTenant}
	cix, _ := src.set.Index(conflict, 2)
	place(t, cix, hold{w: wr(1, 0), tier: indexer.TierDevice, tokens: fxTokens, from: 0, to: 1})

	// The recovering Set holds live events until the dump is loaded; it
	// already has the conflicting index with another block size.
	dst := serveAPI(t, indexer.NewSet(indexer.Options{Hold: true}), 0)
	t.Cleanup(dst.set.Close)
	local, _ := dst.set.Index(conflict, 4)
	// A live event queued before recovery extends worker 2's B1..B4 (from
	// the dump) by a fifth block: it only applies on top of the dump.
	five := append(slices.Clone(fxTokens), 1, 2)
	fl := indexer.LocalHashes(nil, five, 2, indexer.BaseSeed, nil)
	fs := indexer.SequenceHashes(nil, fl)
	live := indexer.Event{Kind: indexer.Stored, Worker: wr(2, 0), Tier: indexer.TierDevice, Parent: fs[3], HasParent: true, Blocks: []indexer.Block{{ID: fs[4], Local: fl[4]}}}
	var liveErr atomic.Value
	m, _ := dst.set.Index(indexer.Key{Model: "m", Tenant: indexer.DefaultTenant}, 2)
	if err := dst.set.Submit(context.Background(), m, live, func(_ indexer.ApplyResult, err error) { liveErr.Store(fmt.Sprint(err)) }); err != nil {
		t.Fatal(err)
	}

	urls, client := unusablePeers(t)
	rec := Recover(context.Background(), dst.set, append(urls, src.url), client, 20*time.Millisecond, discardLog, nil)
	events := 0
	for _, d := range src.set.Dump() {
		if d.Key != conflict {
			events += len(d.Events)
		}
	}
	if want := (Recovery{Peer: src.url, Indexes: 5, Events: events, Conflicts: []string{"conflict:default"}}); !reflect.DeepEqual(rec, want) {
		t.Fatalf("recovery %+v, want %+v", rec, want)
	}
	if dst.set.Lookup(conflict) != local || local.BlockSize() != 4 || local.Stats() != (indexer.Stats{}) {
		t.Errorf("conflicting local index changed: %+v", local.Stats())
	}
	sameAnswers(t, src, dst)

	dst.set.Release()
	if err := dst.set.Do(context.Background(), live.Worker.Worker, func() {}); err != nil {
		t.Fatal(err)
	}
	if got := liveErr.Load(); got != "<nil>" {
		t.Fatalf("live event queued during recovery: %v", got)
	}
	if o := trees(t, m, m.MatchTokens(five, "", nil)); !slices.Contains(o, ov(wr(2, 0), 5, 5, 5)) {
		t.Errorf("after release: %v", o)
	}
}

func TestRecoverNoPeer(t *testing.T) {
	set := indexer.NewSet(indexer.Options{})
	t.Cleanup(set.Close)
	fixture(t, set)
	before, err := indexer.MarshalDump(set.Dump())
	if err != nil {
		t.Fatal(err)
	}
	urls, client := unusablePeers(t)
	for _, peers := range [][]string{nil, urls} {
		if rec := Recover(context.Background(), set, peers, client, 20*time.Millisecond, discardLog, nil); !reflect.DeepEqual(rec, Recovery{}) {
			t.Errorf("recovery from %v: %+v", peers, rec)
		}
	}
	if after, _ := indexer.MarshalDump(set.Dump()); !bytes.Equal(before, after) {
		t.Errorf("index changed:\n%s\n%s", before, after)
	}
}

// TestRecoverSkipsUnplaceable loads a peer's dump one event of which names a
// parent nobody holds: it is counted in Skipped, the rest is loaded.
func TestRecoverSkipsUnplaceable(t *testing.T) {
	const dump = `{"x:default": {"block_size": 2, "events": [
		{"worker_id": 1, "storage_tier": "device", "event": {"event_id": 0, "dp_rank": 0,
			"data": {"stored": {"parent_hash": null, "blocks": [{"block_hash": 1, "tokens_hash": 11}]}}}},
		{"worker_id": 1, "storage_tier": "device", "event": {"event_id": 1, "dp_rank": 0,
			"data": {"stored": {"parent_hash": 999, "blocks": [{"block_hash": 2, "tokens_hash": 12}]}}}},
		{"worker_id": 1, "storage_tier": "disk", "event": {"event_id": 2, "dp_rank": 0,
			"data": {"stored": {"parent_hash": 1, "blocks": [{"block_hash": 3, "tokens_hash": 13}]}}}}]}}`
	peer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, dump) }))
	t.Cleanup(peer.Close)
	set := indexer.NewSet(indexer.Options{})
	t.Cleanup(set.Close)
	rec := Recover(context.Background(), set, []string{peer.URL}, peer.Client(), time.Minute, discardLog, nil)
	if want := (Recovery{Peer: peer.URL, Indexes: 1, Events: 2, Skipped: 1}); !reflect.DeepEqual(rec, want) {
		t.Fatalf("recovery %+v, want %+v", rec, want)
	}
	if ix := set.Lookup(indexer.Key{Model: "x", Tenant: indexer.DefaultTenant}); ix == nil || ix.Stats() != (indexer.Stats{Workers: 1, Nodes: 2, Entries: 2}) {
		t.Fatalf("loaded index: %v", ix)
	}
}

// TestRecoverLeavesOutBadIndexes loads a peer's dump with an index of an
// impossible block size and one with an invalid event: both are left out,
// named in Unloadable and counted in
// kvgate_peer_recovery_skipped_indexes_total; the valid index loads.
func TestRecoverLeavesOutBadIndexes(t *testing.T) {
	const dump = `{"huge:default": {"block_size": 9223372036854775807, "events": []},
		"badevent:default": {"block_size": 2, "events": [{"worker_id": 1, "event": {"data": {}}}]},
		"x:default": {"block_size": 2, "events": [
		{"worker_id": 1, "storage_tier": "device", "event": {"event_id": 0, "dp_rank": 0,
			"data": {"stored": {"parent_hash": null, "blocks": [{"block_hash": 1, "tokens_hash": 11}]}}}}]}}`
	peer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, dump) }))
	t.Cleanup(peer.Close)
	set := indexer.NewSet(indexer.Options{})
	t.Cleanup(set.Close)
	reg := prometheus.NewRegistry()
	rec := Recover(context.Background(), set, []string{peer.URL}, peer.Client(), time.Minute, discardLog, reg)
	if want := (Recovery{Peer: peer.URL, Indexes: 3, Events: 1, Unloadable: []string{"badevent:default", "huge:default"}}); !reflect.DeepEqual(rec, want) {
		t.Fatalf("recovery %+v, want %+v", rec, want)
	}
	if ix := set.Lookup(indexer.Key{Model: "x", Tenant: indexer.DefaultTenant}); ix == nil || ix.Stats() != (indexer.Stats{Workers: 1, Nodes: 1, Entries: 1}) {
		t.Fatalf("loaded index: %v", ix)
	}
	if keys := set.Keys(); len(keys) != 1 {
		t.Errorf("indexes %v, want x:default alone", keys)
	}
	got := map[string]float64{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "kvgate_peer_recovery_skipped_indexes_total" {
			for _, m := range mf.GetMetric() {
				got[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
			}
		}
	}
	if want := map[string]float64{"invalid": 2, "conflict": 0, "refused": 0}; !reflect.DeepEqual(got, want) {
		t.Errorf("kvgate_peer_recovery_skipped_indexes_total %v, want %v", got, want)
	}
	// A second recovery with the same registry counts on the same series.
	Recover(context.Background(), set, []string{peer.URL}, peer.Client(), time.Minute, discardLog, reg)
}
