package sim

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/kvgate/kvgate/bench/engine"
)

func TestTiming(t *testing.T) {
	tm := DefaultTiming()
	for _, tc := range []struct {
		name string
		got  time.Duration
		want float64 // ms
	}{
		{"prefill 0 tokens", tm.Prefill(0), 0},
		{"prefill 1 token", tm.Prefill(1), 4.209989e-7 + 0.01518344 + 16.50142},
		{"prefill 1000 tokens", tm.Prefill(1000), 4.209989e-7*1e6 + 15.18344 + 16.50142},
		{"prefill 8192 tokens", tm.Prefill(8192), 4.209989e-7*8192*8192 + 0.01518344*8192 + 16.50142},
		{"decode empty cache", tm.Decode(0), 5.74},
		{"decode half full", tm.Decode(0.5), -25.74/4 + 54.01/2 + 5.74},
		{"decode full", tm.Decode(1), -25.74 + 54.01 + 5.74},
		{"decode floor", Timing{DecodeMin: 1}.Decode(0.3), 1},
	} {
		if diff := float64(tc.got)/1e6 - tc.want; diff > 1e-6 || diff < -1e-6 {
			t.Errorf("%s = %v, want %.6f ms", tc.name, tc.got, tc.want)
		}
	}
}

func TestEngineConfigValidation(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  EngineConfig
		ok   bool
	}{
		{"defaults", EngineConfig{}, true},
		{"negative blocks", EngineConfig{NumBlocks: -1}, false},
		{"watermark 1", EngineConfig{Watermark: 1}, false},
		{"negative speedup", EngineConfig{Speedup: -2}, false},
		{"model longer than cache", EngineConfig{NumBlocks: 10, BlockSize: 16, MaxModelLen: 161}, false},
		{"model as long as cache", EngineConfig{NumBlocks: 10, BlockSize: 16, MaxModelLen: 160}, true},
	} {
		err := tc.cfg.normalize()
		if (err == nil) != tc.ok {
			t.Errorf("%s: normalize() = %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
}

// testRank returns a rank without publisher, driven by step.
func testRank(t *testing.T, cfg EngineConfig) *Rank {
	t.Helper()
	if err := cfg.normalize(); err != nil {
		t.Fatal(err)
	}
	return newRank(cfg, 0, nil)
}

func prompt(seed, n int) []uint32 {
	p := make([]uint32, n)
	for i := range p {
		p[i] = uint32(seed*100003 + i)
	}
	return p
}

// drive steps r until every seq finished, and returns the simulated time
// until each produced its first token and until all finished.
func drive(t *testing.T, r *Rank, seqs ...*Seq) (ttft []time.Duration, total time.Duration) {
	t.Helper()
	ttft = make([]time.Duration, len(seqs))
	for range 100000 {
		d, ok := r.step()
		if !ok {
			break
		}
		total += d
		for i, s := range seqs {
			r.mu.Lock()
			if ttft[i] == 0 && s.nOut > 0 {
				ttft[i] = total
			}
			r.mu.Unlock()
		}
		checkRank(t, r)
	}
	for i, s := range seqs {
		r.mu.Lock()
		st, err, n := s.state, s.err, s.nOut
		r.mu.Unlock()
		want := s.req.MaxTokens
		if s.req.StopAfter > 0 {
			want = s.req.StopAfter
		}
		if st != finished || err != nil || n != want {
			t.Fatalf("seq %d: state %d err %v, %d/%d tokens", i, st, err, n, want)
		}
	}
	return ttft, total
}

// checkRank verifies the cache's bookkeeping: every block is either free
// (refs 0, in the queue) or used; the hash map points at cached blocks;
// running requests hold blocks for their computed tokens.
func checkRank(t *testing.T, r *Rank) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.cache
	n := 0
	for b := c.head; b != nil; b = b.next {
		if !b.free || b.refs != 0 {
			t.Fatalf("block %d in free queue with free=%v refs=%d", b.id, b.free, b.refs)
		}
		n++
	}
	if n != c.nFree {
		t.Fatalf("free queue has %d blocks, nFree %d", n, c.nFree)
	}
	refs := map[*block]int{}
	for _, s := range r.running {
		if len(s.blocks) < ceilDiv(s.computed, r.cfg.BlockSize) {
			t.Fatalf("running seq holds %d blocks for %d computed tokens", len(s.blocks), s.computed)
		}
		for _, b := range s.blocks {
			refs[b]++
		}
	}
	for i := range c.blocks {
		b := &c.blocks[i]
		if b.refs != refs[b] {
			t.Fatalf("block %d refs %d, running requests hold it %d times", b.id, b.refs, refs[b])
		}
		if b.free != (b.refs == 0) {
			t.Fatalf("block %d free=%v refs=%d", b.id, b.free, b.refs)
		}
		if b.cached && c.byHash[b.hash] != b {
			t.Fatalf("cached block %d not in the hash map", b.id)
		}
	}
	for h, b := range c.byHash {
		if !b.cached || b.hash != h {
			t.Fatalf("hash map entry %x -> block %d (cached %v hash %x)", h, b.id, b.cached, b.hash)
		}
	}
}

func submit(t *testing.T, r *Rank, req Request) *Seq {
	t.Helper()
	s, err := r.Submit(req)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestRepeatedPrefixIsCachedAndFaster(t *testing.T) {
	r := testRank(t, EngineConfig{NumBlocks: 1024})
	p := prompt(1, 4000)
	first := submit(t, r, Request{Prompt: p, MaxTokens: 4})
	ttft1, _ := drive(t, r, first)
	second := submit(t, r, Request{Prompt: p, MaxTokens: 4})
	ttft2, _ := drive(t, r, second)
	// A variant sharing the first 2000 tokens.
	variant := append(slices.Clone(p[:2000]), prompt(2, 2000)...)
	third := submit(t, r, Request{Prompt: variant, MaxTokens: 4})
	drive(t, r, third)

	for _, tc := range []struct {
		s    *Seq
		want int
	}{{first, 0}, {second, 3984}, {third, 2000}} {
		p, err := tc.s.Wait(context.Background())
		if err != nil || !p.Done {
			t.Fatalf("Wait = %+v, %v", p, err)
		}
		if p.CachedTokens != tc.want {
			t.Errorf("cached tokens %d, want %d", p.CachedTokens, tc.want)
		}
	}
	if ttft2[0] >= ttft1[0]/4 {
		t.Errorf("cached prompt's TTFT %v not far below the uncached one's %v", ttft2[0], ttft1[0])
	}
	st := r.Stats()
	if st.PrefixQueries != 12000 || st.PrefixHits != 3984+2000 {
		t.Errorf("prefix queries/hits %d/%d, want 12000/%d", st.PrefixQueries, st.PrefixHits, 3984+2000)
	}
	if st.Running != 0 || st.Usage != 0 {
		t.Errorf("after all finished: running %d usage %v", st.Running, st.Usage)
	}
}

func TestWholePromptHitStillComputesLastToken(t *testing.T) {
	r := testRank(t, EngineConfig{NumBlocks: 64})
	p := prompt(3, 64) // exactly 4 blocks
	drive(t, r, submit(t, r, Request{Prompt: p, MaxTokens: 1}))
	s := submit(t, r, Request{Prompt: p, MaxTokens: 1})
	drive(t, r, s)
	got, _ := s.Wait(context.Background())
	if got.CachedTokens != 48 {
		t.Errorf("cached %d, want 48 (the last block is recomputed to sample)", got.CachedTokens)
	}
}

func TestChunkedPrefill(t *testing.T) {
	r := testRank(t, EngineConfig{MaxBatchedTokens: 512})
	s := submit(t, r, Request{Prompt: prompt(4, 2000), MaxTokens: 2})
	steps := 0
	for {
		if _, ok := r.step(); !ok {
			break
		}
		steps++
	}
	// ceil(2000/512) = 4 prefill steps, then one decode step.
	if steps != 5 {
		t.Errorf("%d steps, want 5", steps)
	}
	if p, err := s.Wait(context.Background()); err != nil || !p.Done || len(p.Tokens) != 2 {
		t.Errorf("Wait = %+v, %v", p, err)
	}
}

func TestEvictionUnderPressureEmitsRemoved(t *testing.T) {
	r := testRank(t, EngineConfig{NumBlocks: 40, MaxModelLen: 640})
	var model eventModel
	for i := range 10 {
		drive(t, r, submit(t, r, Request{Prompt: prompt(10+i, 200), MaxTokens: 3}))
		r.mu.Lock()
		model.apply(t, r.cache.takeEvents())
		r.mu.Unlock()
		model.check(t, r)
	}
	if model.removed == 0 {
		t.Fatal("no BlockRemoved under pressure")
	}
	// The newest prompt is still cached, the oldest is gone.
	if n := r.cachedPrefix(prompt(19, 200), ""); n != 12 {
		t.Errorf("newest prompt: %d cached blocks, want 12", n)
	}
	if n := r.cachedPrefix(prompt(10, 200), ""); n != 0 {
		t.Errorf("oldest prompt: %d cached blocks, want 0", n)
	}
}

func TestLoRABlocksAreSeparate(t *testing.T) {
	r := testRank(t, EngineConfig{NumBlocks: 256})
	p := prompt(5, 100)
	drive(t, r, submit(t, r, Request{Prompt: p, MaxTokens: 1}))
	s := submit(t, r, Request{Prompt: p, LoRA: "adapter", MaxTokens: 1})
	drive(t, r, s)
	if got, _ := s.Wait(context.Background()); got.CachedTokens != 0 {
		t.Errorf("adapter request hit %d base-model tokens", got.CachedTokens)
	}
	if r.cachedPrefix(p, "adapter") != 6 || r.cachedPrefix(p, "") != 6 {
		t.Error("both the base model's and the adapter's blocks should be cached")
	}
	r.mu.Lock()
	evs := r.cache.takeEvents()
	r.mu.Unlock()
	var lora []string
	for _, ev := range evs {
		if st, ok := ev.(engine.BlockStored); ok {
			lora = append(lora, st.LoRAName)
		}
	}
	if !slices.Equal(lora, []string{"", "adapter"}) {
		t.Errorf("stored events' adapters %q", lora)
	}
}

func TestPreemptionRecomputes(t *testing.T) {
	// 20 blocks: two requests of 100 prompt + 150 output tokens (16 blocks
	// each at the end) cannot both stay.
	r := testRank(t, EngineConfig{NumBlocks: 20, MaxModelLen: 320, Watermark: 0.001})
	a := submit(t, r, Request{Prompt: prompt(6, 100), MaxTokens: 150, Seed: 1})
	b := submit(t, r, Request{Prompt: prompt(7, 100), MaxTokens: 150, Seed: 2})
	drive(t, r, a, b)
	if st := r.Stats(); st.Preemptions == 0 {
		t.Error("no preemption")
	}
	// Output tokens do not depend on preemption: same seed, same tokens.
	r2 := testRank(t, EngineConfig{NumBlocks: 64})
	a2 := submit(t, r2, Request{Prompt: prompt(6, 100), MaxTokens: 150, Seed: 1})
	drive(t, r2, a2)
	if !slices.Equal(a.tokens, a2.tokens) {
		t.Error("a preempted request produced different tokens")
	}
}

func TestAbortAndErrors(t *testing.T) {
	r := testRank(t, EngineConfig{NumBlocks: 64, MaxModelLen: 1000})
	if _, err := r.Submit(Request{Prompt: prompt(1, 990), MaxTokens: 11}); !errors.Is(err, ErrTooLong) {
		t.Errorf("too long: %v", err)
	}
	for _, req := range []Request{{Prompt: nil, MaxTokens: 1}, {Prompt: prompt(1, 5), MaxTokens: 0}} {
		if _, err := r.Submit(req); err == nil {
			t.Errorf("Submit(%+v) accepted", req)
		}
	}
	s := submit(t, r, Request{Prompt: prompt(8, 300), MaxTokens: 50})
	for range 3 {
		r.step()
	}
	if st := r.Stats(); st.Running != 1 || st.Usage == 0 {
		t.Fatalf("running %d usage %v", st.Running, st.Usage)
	}
	s.Abort()
	checkRank(t, r)
	if st := r.Stats(); st.Running != 0 || st.Usage != 0 {
		t.Errorf("after abort: running %d usage %v", st.Running, st.Usage)
	}
	if _, err := s.Wait(context.Background()); !errors.Is(err, ErrAborted) {
		t.Errorf("Wait after abort: %v", err)
	}
	// Aborting a waiting request, and twice.
	w := submit(t, r, Request{Prompt: prompt(9, 10), MaxTokens: 1})
	w.Abort()
	w.Abort()
	if st := r.Stats(); st.Waiting != 0 {
		t.Errorf("waiting %d after abort", st.Waiting)
	}
	r.stop()
	if _, err := r.Submit(Request{Prompt: prompt(1, 5), MaxTokens: 1}); !errors.Is(err, ErrStopped) {
		t.Errorf("Submit after stop: %v", err)
	}
}

func TestResetPrefixCache(t *testing.T) {
	r := testRank(t, EngineConfig{NumBlocks: 64})
	s := submit(t, r, Request{Prompt: prompt(1, 100), MaxTokens: 5})
	r.step()
	if r.ResetPrefixCache() {
		t.Error("reset while a request runs")
	}
	drive(t, r, s)
	if !r.ResetPrefixCache() {
		t.Fatal("reset refused when idle")
	}
	if st := r.Stats(); st.CachedBlocks != 0 {
		t.Errorf("%d cached blocks after reset", st.CachedBlocks)
	}
	r.mu.Lock()
	evs := r.cache.takeEvents()
	r.mu.Unlock()
	if _, ok := evs[len(evs)-1].(engine.AllBlocksCleared); !ok {
		t.Errorf("last event %T, want AllBlocksCleared", evs[len(evs)-1])
	}
}

// TestRandomWorkloadEventsReproduceCache runs a random workload (shared
// prefixes, aborts, pressure, adapters) and checks after every step that
// the events emitted so far, applied in order, give exactly the cache's
// set of cached blocks with their chain and tokens.
func TestRandomWorkloadEventsReproduceCache(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	r := testRank(t, EngineConfig{NumBlocks: 96, MaxBatchedTokens: 300, MaxNumSeqs: 6, MaxModelLen: 1000})
	bases := [][]uint32{prompt(1, 600), prompt(2, 600), prompt(3, 600)}
	var model eventModel
	var live []*Seq
	for step := range 3000 {
		if rng.IntN(3) == 0 {
			base := bases[rng.IntN(len(bases))]
			p := append(slices.Clone(base[:rng.IntN(len(base))+1]), prompt(100+step, rng.IntN(100))...)
			lora := ""
			if rng.IntN(5) == 0 {
				lora = "a"
			}
			live = append(live, submit(t, r, Request{Prompt: p, LoRA: lora, MaxTokens: rng.IntN(60) + 1, Seed: uint64(step)}))
		}
		if len(live) > 0 && rng.IntN(20) == 0 {
			live[rng.IntN(len(live))].Abort()
		}
		if step%500 == 499 {
			for _, s := range live {
				s.Abort()
			}
			if !r.ResetPrefixCache() {
				t.Fatal("reset refused with no request running")
			}
		}
		r.step()
		checkRank(t, r)
		r.mu.Lock()
		model.apply(t, r.cache.takeEvents())
		r.mu.Unlock()
		model.check(t, r)
	}
	if model.removed == 0 || model.stored == 0 || model.cleared == 0 {
		t.Errorf("workload too tame: %d stored, %d removed, %d cleared", model.stored, model.removed, model.cleared)
	}
}

// eventModel is what a consumer knows from the events alone.
type eventModel struct {
	blocks                   map[uint64]storedBlock
	stored, removed, cleared int
}

type storedBlock struct {
	parent uint64
	tokens []uint32
	lora   string
}

func (m *eventModel) apply(t *testing.T, evs []engine.Event) {
	t.Helper()
	if m.blocks == nil {
		m.blocks = map[uint64]storedBlock{}
	}
	for _, ev := range evs {
		switch ev := ev.(type) {
		case engine.BlockStored:
			parent := uint64(0)
			if ev.Parent != nil {
				parent = *ev.Parent
			}
			if len(ev.TokenIDs) != len(ev.BlockHashes)*ev.BlockSize {
				t.Fatalf("stored %d blocks with %d tokens", len(ev.BlockHashes), len(ev.TokenIDs))
			}
			for i, h := range ev.BlockHashes {
				if _, dup := m.blocks[h]; dup {
					t.Fatalf("block %x stored twice", h)
				}
				m.blocks[h] = storedBlock{parent, ev.TokenIDs[i*ev.BlockSize : (i+1)*ev.BlockSize], ev.LoRAName}
				parent = h
				m.stored++
			}
		case engine.BlockRemoved:
			for _, h := range ev.BlockHashes {
				if _, ok := m.blocks[h]; !ok {
					t.Fatalf("block %x removed but not stored", h)
				}
				delete(m.blocks, h)
				m.removed++
			}
		case engine.AllBlocksCleared:
			clear(m.blocks)
			m.cleared++
		default:
			t.Fatalf("unexpected event %T", ev)
		}
	}
}

func (m *eventModel) check(t *testing.T, r *Rank) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(m.blocks) != len(r.cache.byHash) {
		t.Fatalf("events say %d blocks cached, the cache has %d", len(m.blocks), len(r.cache.byHash))
	}
	for h, b := range m.blocks {
		if _, ok := r.cache.byHash[h]; !ok {
			t.Fatalf("block %x from the events is not cached", h)
		}
		if blockHash(b.parent, b.lora, b.tokens) != h {
			t.Fatalf("block %x: hash of (parent, adapter, tokens) differs", h)
		}
	}
}
