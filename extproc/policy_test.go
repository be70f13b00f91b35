package extproc

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/indexer"
	"github.com/kvgate/kvgate/indexer/kvevents"
	"github.com/kvgate/kvgate/internal/listeners"
	"github.com/kvgate/kvgate/scheduler"
	"github.com/kvgate/kvgate/scheduler/catalog"
	"github.com/kvgate/kvgate/tokenize"
)

func TestParsePolicy(t *testing.T) {
	for _, p := range Policies {
		if got, err := ParsePolicy(string(p)); err != nil || got != p {
			t.Errorf("ParsePolicy(%q) = %q, %v", p, got, err)
		}
	}
	for _, s := range []string{"", "KV", "roundrobin", "kv "} {
		if _, err := ParsePolicy(s); err == nil || !strings.Contains(err.Error(), "round-robin") {
			t.Errorf("ParsePolicy(%q): err %v, want the list of policies", s, err)
		}
	}
}

func loadsOf(reqs ...int) []scheduler.Load {
	out := make([]scheduler.Load, len(reqs))
	for i, r := range reqs {
		out[i] = scheduler.Load{Worker: indexer.WorkerRank{Worker: uint64(i + 1)}, Requests: r, PrefillTokens: int64(100 * r)}
	}
	return out
}

func TestBaselinePick(t *testing.T) {
	key := indexer.Key{Model: "m", Tenant: "t"}
	picks := func(b *baseline, n int, loads []scheduler.Load) []uint64 {
		var out []uint64
		for range n {
			out = append(out, b.pick(key, loads, nil).Worker)
		}
		return out
	}
	if got := picks(newBaseline(PolicyRoundRobin, 1), 7, loadsOf(5, 0, 9)); !slices.Equal(got, []uint64{1, 2, 3, 1, 2, 3, 1}) {
		t.Errorf("round-robin: %v", got)
	}
	if got := picks(newBaseline(PolicyLeastLoaded, 1), 5, loadsOf(5, 0, 9)); !slices.Equal(got, []uint64{2, 2, 2, 2, 2}) {
		t.Errorf("least-loaded: %v, want worker 2 (no requests)", got)
	}
	// Ties on requests go to the fewest prefill tokens, then at random
	// among equals: both tied ranks get some.
	tied := loadsOf(1, 1, 3)
	tied[0].PrefillTokens = 50
	if got := picks(newBaseline(PolicyLeastLoaded, 1), 5, tied); !slices.Equal(got, []uint64{1, 1, 1, 1, 1}) {
		t.Errorf("least-loaded tie on requests: %v, want worker 1 (fewer prefill tokens)", got)
	}
	if got := picks(newBaseline(PolicyLeastLoaded, 1), 64, loadsOf(2, 2, 3, 2)); slices.Contains(got, 3) ||
		!slices.Contains(got, 1) || !slices.Contains(got, 2) || !slices.Contains(got, 4) {
		t.Errorf("least-loaded ties: %v, want workers 1, 2 and 4 only, each sometimes", got)
	}
	r1, r2 := picks(newBaseline(PolicyRandom, 7), 64, loadsOf(0, 0, 0)), picks(newBaseline(PolicyRandom, 7), 64, loadsOf(0, 0, 0))
	if !slices.Equal(r1, r2) {
		t.Error("random: the same seed gave different choices")
	}
	for w := uint64(1); w <= 3; w++ {
		if !slices.Contains(r1, w) {
			t.Errorf("random: worker %d never chosen in 64 picks: %v", w, r1)
		}
	}
}

func TestChunkHashes(t *testing.T) {
	a := []byte(strings.Repeat("a", 64) + strings.Repeat("b", 64) + strings.Repeat("c", 70))
	b := slices.Clone(a)
	b[64+10] = 'x' // second chunk differs
	ha, hb := chunkHashes(a), chunkHashes(b)
	if len(ha) != 3 || len(hb) != 3 {
		t.Fatalf("%d and %d chunks, want 3 (a partial chunk is not hashed)", len(ha), len(hb))
	}
	if ha[0] != hb[0] || ha[1] == hb[1] || ha[2] == hb[2] {
		t.Errorf("chained hashes: %x vs %x: want equal first chunk, then different", ha, hb)
	}
	if n := len(chunkHashes(make([]byte, 64*(prefixMaxChunks+10)))); n != prefixMaxChunks {
		t.Errorf("%d chunks of a long prompt, want the first %d", n, prefixMaxChunks)
	}
	if n := len(chunkHashes(make([]byte, 63))); n != 0 {
		t.Errorf("%d chunks of 63 bytes", n)
	}
}

func TestPrefixHashPolicy(t *testing.T) {
	key := indexer.Key{Model: "m", Tenant: "t"}
	b := newBaseline(PolicyPrefixHash, 1)
	convA := []byte(strings.Repeat("system prompt A. ", 40))
	convB := []byte(strings.Repeat("another conversation B. ", 40))
	first := b.pick(key, loadsOf(0, 0, 0), convA)
	// The conversation grows; its rank now has a request more than the
	// others, but the shared prefix outweighs the queue.
	loads := loadsOf(0, 0, 0)
	loads[first.Worker-1].Requests = 1
	next := b.pick(key, loads, append(slices.Clone(convA), []byte(strings.Repeat(" more turns", 30))...))
	if next != first {
		t.Errorf("a grown prompt went to %v, its prefix to %v", next, first)
	}
	// Another conversation goes to an idle rank, not the busy one.
	if other := b.pick(key, loads, convB); other == first {
		t.Errorf("an unrelated prompt went to the busy rank %v", other)
	}
	// A prompt shorter than a chunk is routed on the queue alone.
	loads = loadsOf(3, 1, 2)
	if got := b.pick(key, loads, []byte("hi")); got.Worker != 2 {
		t.Errorf("a short prompt went to %v, want the least busy worker 2", got)
	}
}

func TestPrefixTableBounded(t *testing.T) {
	tab := &prefixTable{ranks: map[indexer.WorkerRank]*rankChunks{}, owners: map[uint64][]indexer.WorkerRank{}}
	w1, w2 := indexer.WorkerRank{Worker: 1}, indexer.WorkerRank{Worker: 2}
	hs := make([]uint64, prefixLRUPerRank+100)
	for i := range hs {
		hs[i] = uint64(i + 1)
	}
	tab.record(w1, hs)
	tab.record(w2, hs[:10])
	if n := tab.ranks[w1].lru.Len(); n != prefixLRUPerRank {
		t.Errorf("rank holds %d chunks, want the bound %d", n, prefixLRUPerRank)
	}
	if len(tab.owners[hs[0]]) != 1 || tab.owners[hs[0]][0] != w2 {
		t.Errorf("owners of an evicted chunk: %v, want only worker 2", tab.owners[hs[0]])
	}
	if _, ok := tab.owners[hs[50]]; ok {
		t.Error("a chunk evicted from its only rank is still owned")
	}
	if len(tab.owners) != prefixLRUPerRank+10 {
		t.Errorf("%d owned chunks, want %d", len(tab.owners), prefixLRUPerRank+10)
	}
	b := &baseline{prefix: map[indexer.Key]*prefixTable{{Model: "m"}: tab}}
	b.forget(indexer.Key{Model: "m"}, []scheduler.Load{{Worker: w2}})
	if len(tab.ranks) != 1 || len(tab.owners) != 10 {
		t.Errorf("after forgetting worker 1: %d ranks, %d owned chunks; want 1 and 10", len(tab.ranks), len(tab.owners))
	}
}

func TestPromptBytes(t *testing.T) {
	if got := promptBytes(&Prompt{IDs: []uint32{1, 0x01020304}}); !slices.Equal(got, []byte{1, 0, 0, 0, 4, 3, 2, 1}) {
		t.Errorf("ids: %v", got)
	}
	msgs := json.RawMessage(`[{"role":"user","content":"hi"}]`)
	if got := promptBytes(&Prompt{Tokenize: tokenize.Request{Chat: &tokenize.ChatRequest{Messages: msgs}}}); string(got) != string(msgs) {
		t.Errorf("chat: %s", got)
	}
	if got := promptBytes(&Prompt{Tokenize: tokenize.Request{Text: "abc"}}); string(got) != "abc" {
		t.Errorf("text: %s", got)
	}
}

// TestGatewayPolicies routes through a Gateway with each baseline policy:
// requests are booked where the policy says, subset hints and the load
// limit hold, and every booking is freed.
func TestGatewayPolicies(t *testing.T) {
	logger, cat, sched, reg := newTestCore(t, tokenize.ModelConfig{Name: "m", BlockSize: 16})
	key := indexer.Key{Model: "m", Tenant: indexer.DefaultTenant}
	for id := uint64(1); id <= 3; id++ {
		ws := catalog.WorkerSpec{WorkerKey: catalog.WorkerKey{Key: key, ID: id}, BlockSize: 16, Endpoint: fmt.Sprintf("10.0.0.%d:8000", id), DPSize: 2}
		if err := cat.PutWorker(ws); err != nil {
			t.Fatal(err)
		}
	}
	prompt := func(conv, turns int) *Prompt {
		var ids []uint32
		for i := range 64 * turns {
			ids = append(ids, uint32(conv*100000+i))
		}
		return &Prompt{Kind: KindCompletion, Model: "m", IDs: ids, Tokenize: tokenize.Request{Model: "m"}}
	}
	booked := func() map[indexer.WorkerRank]int {
		out := map[indexer.WorkerRank]int{}
		for _, l := range sched.Loads().Snapshot("m", indexer.DefaultTenant) {
			if l.Requests > 0 {
				out[l.Worker] = l.Requests
			}
		}
		return out
	}
	tests := []struct {
		policy Policy
		limit  int
		check  func(t *testing.T, rs []*Route)
	}{
		{policy: PolicyRoundRobin, check: func(t *testing.T, rs []*Route) {
			for i, r := range rs[:6] { // six ranks, in order
				want := indexer.WorkerRank{Worker: uint64(i/2 + 1), Rank: uint32(i % 2)}
				if (indexer.WorkerRank{Worker: r.Worker, Rank: r.Rank}) != want || !r.SetRank {
					t.Errorf("request %d on %d/%d (set rank %v), want %v", i, r.Worker, r.Rank, r.SetRank, want)
				}
			}
		}},
		{policy: PolicyLeastLoaded, check: func(t *testing.T, rs []*Route) {
			for wr, n := range booked() { // 12 requests held on 6 ranks
				if n != 2 {
					t.Errorf("rank %v has %d requests, want 2 on every rank", wr, n)
				}
			}
		}},
		{policy: PolicyRandom, check: func(t *testing.T, rs []*Route) {
			if len(booked()) < 2 {
				t.Errorf("random routing used %d ranks for 12 requests", len(booked()))
			}
		}},
		{policy: PolicyPrefixHash, check: func(t *testing.T, rs []*Route) {
			// Requests 2i and 2i+1 are turns 1 and 2 of conversation i.
			for i := 0; i+1 < len(rs); i += 2 {
				if rs[i].Worker != rs[i+1].Worker || rs[i].Rank != rs[i+1].Rank {
					t.Errorf("conversation %d: turn 1 on %d/%d, turn 2 on %d/%d", i/2, rs[i].Worker, rs[i].Rank, rs[i+1].Worker, rs[i+1].Rank)
				}
			}
		}},
		{policy: PolicyLeastLoaded, limit: 2, check: func(t *testing.T, rs []*Route) {
			if _, e := rs[0].g.Decide(t.Context(), prompt(99, 1), nil, ""); e == nil || e.Status != 429 {
				t.Errorf("13th request with every rank at its limit: %v, want 429", e)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%s limit %d", tc.policy, tc.limit), func(t *testing.T) {
			g := New(reg, cat, sched, Options{Policy: tc.policy, Seed: 3, MaxRequestsPerRank: tc.limit, Logger: logger, Registerer: prometheus.NewRegistry()})
			var rs []*Route
			for i := range 12 {
				r, e := g.Decide(t.Context(), prompt(i/2, 1+i%2), nil, "")
				if e != nil {
					t.Fatalf("request %d: %v", i, e)
				}
				if r.Endpoint != fmt.Sprintf("10.0.0.%d:8000", r.Worker) || r.Fallbacks != nil {
					t.Errorf("request %d: endpoint %q fallbacks %v for worker %d", i, r.Endpoint, r.Fallbacks, r.Worker)
				}
				rs = append(rs, r)
			}
			tc.check(t, rs)
			// A subset hint limits the choice to its endpoints.
			r, e := g.Decide(t.Context(), prompt(50, 1), []string{"10.0.0.3:8000"}, "")
			if e != nil && tc.limit == 0 || e == nil && r.Worker != 3 {
				t.Errorf("subset hint: %v %+v", e, r)
			}
			rs = append(rs, r)
			for _, r := range rs {
				r.Finish()
			}
			if b := booked(); len(b) != 0 {
				t.Errorf("after every Finish: %v still booked", b)
			}
		})
	}
}

// TestGatewayKVReuseCharge routes through a Gateway with PolicyKV: its
// decisions pay for the cached prefix they give up (the scheduler's
// ReuseWeight, 16 by default), unlike /select. Worker 1 holds 6 of the
// prompt's 8 blocks (block size 16, 128 tokens) and runs a request of 500
// prefill tokens; worker 2 is idle and empty. The spec's cost: worker 1
// (500 + 32)/16 + 8 = 41.25, worker 2 128/16 + 8 = 16, so the prompt
// would leave its prefix; charged, worker 2 also pays 16 * 96/16 = 96 and
// worker 1 keeps it. The fallback is the next best under the same rule.
func TestGatewayKVReuseCharge(t *testing.T) {
	for _, tc := range []struct {
		name           string
		reuse          float64
		worker, second uint64
		cached         int
	}{
		{name: "default reuse weight", worker: 1, second: 2, cached: 6},
		{name: "reuse weight off: the spec's cost", reuse: scheduler.NoReuseWeight, worker: 2, second: 1, cached: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logger, _, _, reg := newTestCore(t, tokenize.ModelConfig{Name: "m", BlockSize: 16}) // its registry
			set := indexer.NewSet(indexer.Options{})
			t.Cleanup(set.Close)
			ingest := kvevents.NewIngester(set, kvevents.IngestOptions{Logger: logger})
			t.Cleanup(ingest.Close)
			cat := catalog.New(set, listeners.New(ingest), nil, catalog.Options{Logger: logger})
			loads := scheduler.NewLoads(scheduler.LoadOptions{})
			cat.Watch(loads.Follow)
			sched := scheduler.NewScheduler(cat, set, loads, scheduler.CostOptions{ReuseWeight: tc.reuse}, 1, nil)
			key := indexer.Key{Model: "m", Tenant: indexer.DefaultTenant}
			for id := uint64(1); id <= 2; id++ {
				ws := catalog.WorkerSpec{WorkerKey: catalog.WorkerKey{Key: key, ID: id}, BlockSize: 16, Endpoint: fmt.Sprintf("10.0.0.%d:8000", id), DPSize: 1}
				if err := cat.PutWorker(ws); err != nil {
					t.Fatal(err)
				}
			}
			ids := make([]uint32, 128)
			for i := range ids {
				ids[i] = uint32(7000 + i)
			}
			local := indexer.LocalHashes(nil, ids, 16, indexer.LoRASeed(""), nil)
			ev := indexer.Event{Kind: indexer.Stored, Worker: indexer.WorkerRank{Worker: 1}, Tier: indexer.TierDevice}
			for i := range 6 {
				ev.Blocks = append(ev.Blocks, indexer.Block{ID: uint64(i + 1), Local: local[i]})
			}
			ix, err := set.Index(key, 16)
			if err == nil {
				_, err = ix.Apply(ev)
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := loads.Add(key, scheduler.Booking{ID: "busy", Worker: indexer.WorkerRank{Worker: 1}, PrefillTokens: 500}); err != nil {
				t.Fatal(err)
			}
			g := New(reg, cat, sched, Options{Fallbacks: 1, Logger: logger, Registerer: prometheus.NewRegistry()})
			r, e := g.Decide(t.Context(), &Prompt{Kind: KindCompletion, Model: "m", IDs: ids, Tokenize: tokenize.Request{Model: "m"}}, nil, "")
			if e != nil {
				t.Fatal(e)
			}
			second := fmt.Sprintf("10.0.0.%d:8000", tc.second)
			if r.Worker != tc.worker || r.CachedBlocks != tc.cached || r.Blocks != 8 || !slices.Equal(r.Fallbacks, []string{second}) {
				t.Errorf("routed to worker %d with %d of %d blocks cached, fallbacks %v; want worker %d, %d cached, fallback %s",
					r.Worker, r.CachedBlocks, r.Blocks, r.Fallbacks, tc.worker, tc.cached, second)
			}
			r.Finish()
			if _, err := loads.Free(key, "busy"); err != nil {
				t.Fatal(err)
			}
			for _, l := range loads.Snapshot("m", indexer.DefaultTenant) {
				if l.Requests != 0 || l.PrefillTokens != 0 || l.DecodeBlocks != 0 {
					t.Errorf("after Finish: %+v", l)
				}
			}
		})
	}
}
