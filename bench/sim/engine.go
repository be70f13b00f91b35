package sim

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/kvgate/kvgate/bench/engine"
)

// Timing is the engine's cost model, in milliseconds of simulated time per
// step. The defaults are those of Dynamo's mocker for vLLM.
type Timing struct {
	// Prefill ms = PrefillA*T^2 + PrefillB*T + PrefillC for T uncached
	// prompt tokens computed in the step.
	PrefillA, PrefillB, PrefillC float64
	// Decode ms = DecodeA*u^2 + DecodeB*u + DecodeC for KV usage fraction u,
	// at least DecodeMin.
	DecodeA, DecodeB, DecodeC, DecodeMin float64
}

// DefaultTiming returns Dynamo's mocker constants.
func DefaultTiming() Timing {
	return Timing{
		PrefillA: 4.209989e-7, PrefillB: 0.01518344, PrefillC: 16.50142,
		DecodeA: -25.74, DecodeB: 54.01, DecodeC: 5.74, DecodeMin: 1,
	}
}

// Prefill returns the simulated time to compute tokens prompt tokens in a step.
func (t Timing) Prefill(tokens int) time.Duration {
	if tokens <= 0 {
		return 0
	}
	x := float64(tokens)
	return ms(t.PrefillA*x*x + t.PrefillB*x + t.PrefillC)
}

// Decode returns the simulated time of a decode step at KV usage u (0..1).
func (t Timing) Decode(u float64) time.Duration {
	return ms(math.Max(t.DecodeA*u*u+t.DecodeB*u+t.DecodeC, t.DecodeMin))
}

func ms(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }

// EngineConfig describes one DP rank's engine: its KV cache, its
// scheduler's limits and its timing. Zero fields take the defaults.
type EngineConfig struct {
	BlockSize        int     // tokens per KV block (16)
	NumBlocks        int     // KV cache blocks per rank (8192)
	MaxNumSeqs       int     // running requests per rank (256)
	MaxBatchedTokens int     // tokens computed per step (8192)
	MaxModelLen      int     // prompt + output tokens per request (32768, or what the cache holds if less)
	Watermark        float64 // fraction of blocks kept free when admitting (0.01)
	VocabSize        int     // output token ids are drawn from [0, VocabSize) (32000)
	Timing           Timing  // zero: DefaultTiming
	// Speedup divides every simulated duration to get the wall-clock time
	// a step takes (1: real time; 10: ten times faster).
	Speedup float64
}

func (c *EngineConfig) normalize() error {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.BlockSize, 16)
	def(&c.NumBlocks, 8192)
	def(&c.MaxNumSeqs, 256)
	def(&c.MaxBatchedTokens, 8192)
	def(&c.MaxModelLen, min(32768, c.NumBlocks*c.BlockSize))
	def(&c.VocabSize, 32000)
	if c.Watermark == 0 {
		c.Watermark = 0.01
	}
	if c.Timing == (Timing{}) {
		c.Timing = DefaultTiming()
	}
	if c.Speedup == 0 {
		c.Speedup = 1
	}
	switch {
	case c.BlockSize < 1 || c.NumBlocks < 1 || c.MaxNumSeqs < 1 || c.MaxBatchedTokens < 1 || c.MaxModelLen < 2 || c.VocabSize < 1:
		return fmt.Errorf("engine: block size, blocks, max seqs, batched tokens and vocabulary must be positive, max model len at least 2 (got %d, %d, %d, %d, %d, %d)",
			c.BlockSize, c.NumBlocks, c.MaxNumSeqs, c.MaxBatchedTokens, c.MaxModelLen, c.VocabSize)
	case c.Watermark < 0 || c.Watermark >= 1:
		return fmt.Errorf("engine: watermark %v not in [0, 1)", c.Watermark)
	case c.Speedup < 0 || math.IsInf(c.Speedup, 0) || math.IsNaN(c.Speedup):
		return fmt.Errorf("engine: speedup %v must be positive", c.Speedup)
	case c.MaxModelLen > c.NumBlocks*c.BlockSize:
		return fmt.Errorf("engine: max model len %d exceeds the KV cache (%d blocks of %d tokens)", c.MaxModelLen, c.NumBlocks, c.BlockSize)
	}
	return nil
}

// Request is one generation request for a rank.
type Request struct {
	Prompt    []uint32
	LoRA      string // adapter name; "" for the base model
	MaxTokens int    // most output tokens to generate (at least 1)
	// StopAfter is where the model ends its answer on its own (as a real
	// one samples its end-of-sequence token): after StopAfter output
	// tokens the request finishes with FinishReason "stop". 0, or a value
	// above MaxTokens, means it runs to MaxTokens ("length").
	StopAfter int
	Seed      uint64 // seeds the output token ids
}

// Finish reasons of Progress, as vLLM names them.
const (
	FinishStop   = "stop"   // the model ended its answer (Request.StopAfter)
	FinishLength = "length" // cut at Request.MaxTokens
)

// Errors of Rank.Submit and Seq.Wait.
var (
	ErrTooLong   = errors.New("prompt plus max tokens exceed the model's maximum length")
	ErrAborted   = errors.New("request aborted")
	ErrRestarted = errors.New("engine restarted")
	ErrStopped   = errors.New("engine stopped")
)

// Progress is what a request produced since the previous Seq.Wait.
type Progress struct {
	Tokens       []uint32 // new output token ids
	CachedTokens int      // prompt tokens found in the prefix cache
	Done         bool     // the request finished; Tokens holds its last ids
	FinishReason string   // FinishStop or FinishLength when Done
}

// Seq is a submitted request; its owner reads its output with Wait.
type Seq struct {
	r      *Rank
	req    Request
	notify chan struct{} // cap 1: progress since the last Wait

	// Guarded by r.mu.
	tokens   []uint32 // prompt, then output
	hashes   []uint64 // full-block hashes of tokens, as far as computed
	blocks   []*block
	computed int // tokens whose KV is computed
	cached   int // prompt tokens served from the cache at first admission
	admitted bool
	nOut     int
	rng      uint64
	state    seqState
	err      error
	read     int // output tokens already returned by Wait
}

type seqState uint8

const (
	waiting seqState = iota
	running
	finished
)

// Wait blocks until the request has new output or has finished, and
// returns what is new. It fails when the request was aborted or its
// engine restarted or stopped (ErrAborted, ErrRestarted, ErrStopped), or
// when ctx ends. Once Done has been returned, Wait keeps returning Done
// with no tokens.
func (s *Seq) Wait(ctx context.Context) (Progress, error) {
	for {
		s.r.mu.Lock()
		out := s.tokens[len(s.req.Prompt):]
		p := Progress{CachedTokens: s.cached}
		if s.read < len(out) {
			p.Tokens = slices.Clone(out[s.read:])
			s.read = len(out)
		}
		done, err := s.state == finished, s.err
		reason := FinishLength
		if s.req.StopAfter > 0 && s.nOut == s.req.StopAfter {
			reason = FinishStop
		}
		s.r.mu.Unlock()
		if err != nil {
			return Progress{}, err
		}
		if done {
			p.Done, p.FinishReason = true, reason
			return p, nil
		}
		if len(p.Tokens) > 0 {
			return p, nil
		}
		select {
		case <-s.notify:
		case <-ctx.Done():
			return Progress{}, ctx.Err()
		}
	}
}

// Abort ends the request if it has not finished, freeing its blocks.
func (s *Seq) Abort() {
	s.r.mu.Lock()
	defer s.r.mu.Unlock()
	s.r.end(s, ErrAborted)
}

func (s *Seq) wake() {
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// RankStats is a rank's state, for /metrics and tests.
type RankStats struct {
	Waiting, Running int
	Usage            float64 // fraction of KV blocks used by running requests
	CachedBlocks     int     // blocks in the prefix cache
	// Counters since start, in tokens (prefix cache queries and hits as
	// vLLM counts them: prompt tokens looked up and found).
	PrefixQueries, PrefixHits      uint64
	PromptTokens, GenerationTokens uint64
	Preemptions                    uint64
}

// Rank is one data-parallel rank of a simulated engine: a KV cache with
// prefix caching, a continuous-batching scheduler, and the publisher of
// the cache's events. Its methods are safe for concurrent use.
type Rank struct {
	cfg  EngineConfig
	rank int
	wake chan struct{} // cap 1: new work for the step loop

	mu      sync.Mutex
	cache   *cache
	waiting []*Seq // FIFO
	running []*Seq // admission order; the last is preempted first
	stats   RankStats
	pub     *engine.Publisher
	stopped bool
}

// newRank returns a rank whose events go to pub (nil: none).
func newRank(cfg EngineConfig, rank int, pub *engine.Publisher) *Rank {
	return &Rank{
		cfg:   cfg,
		rank:  rank,
		wake:  make(chan struct{}, 1),
		cache: newCache(cfg.NumBlocks, cfg.BlockSize),
		pub:   pub,
	}
}

// Submit queues a request. It fails with ErrTooLong when prompt and output
// cannot fit MaxModelLen, and with ErrStopped after the rank stopped.
func (r *Rank) Submit(req Request) (*Seq, error) {
	if req.MaxTokens < 1 {
		return nil, fmt.Errorf("max_tokens must be at least 1, got %d", req.MaxTokens)
	}
	if len(req.Prompt) == 0 {
		return nil, errors.New("empty prompt")
	}
	if len(req.Prompt)+req.MaxTokens > r.cfg.MaxModelLen {
		return nil, fmt.Errorf("%w: %d prompt tokens + %d output tokens > %d", ErrTooLong, len(req.Prompt), req.MaxTokens, r.cfg.MaxModelLen)
	}
	if req.StopAfter < 0 {
		return nil, fmt.Errorf("stop after %d tokens: must not be negative", req.StopAfter)
	}
	if req.StopAfter >= req.MaxTokens {
		req.StopAfter = 0 // max tokens comes first (or at the same token: vLLM says "length")
	}
	out := req.MaxTokens
	if req.StopAfter > 0 {
		out = req.StopAfter
	}
	s := &Seq{
		r:      r,
		req:    req,
		notify: make(chan struct{}, 1),
		tokens: append(make([]uint32, 0, len(req.Prompt)+out), req.Prompt...),
		rng:    req.Seed ^ 0x9e3779b97f4a7c15,
	}
	r.mu.Lock()
	if r.stopped {
		r.mu.Unlock()
		return nil, ErrStopped
	}
	r.waiting = append(r.waiting, s)
	r.mu.Unlock()
	r.signal()
	return s, nil
}

func (r *Rank) signal() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Stats returns the rank's current state.
func (r *Rank) Stats() RankStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.stats
	st.Waiting, st.Running = len(r.waiting), len(r.running)
	st.Usage = r.cache.usage()
	st.CachedBlocks = len(r.cache.byHash)
	return st
}

// load is the rank's share of work, as vLLM's DP balancer weighs it.
func (r *Rank) load() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return 4*len(r.waiting) + len(r.running)
}

// ResetPrefixCache drops every cached block and publishes
// AllBlocksCleared. Like vLLM it refuses (false) while requests run.
func (r *Rank) ResetPrefixCache() bool {
	r.mu.Lock()
	ok := len(r.running) == 0 && r.cache.reset()
	r.mu.Unlock()
	if ok {
		r.signal()
	}
	return ok
}

// cachedPrefix returns how many leading full blocks of tokens (for the
// adapter lora) the prefix cache holds.
func (r *Rank) cachedPrefix(tokens []uint32, lora string) int {
	hashes := chainHashes(nil, 0, lora, tokens, r.cfg.BlockSize)
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.cache.lookup(hashes))
}

// end finishes s with err (nil: completed), freeing its blocks. r.mu held.
func (r *Rank) end(s *Seq, err error) {
	switch s.state {
	case finished:
		return
	case waiting:
		r.waiting = slices.DeleteFunc(r.waiting, func(x *Seq) bool { return x == s })
	case running:
		r.running = slices.DeleteFunc(r.running, func(x *Seq) bool { return x == s })
		r.cache.release(s.blocks)
		s.blocks = nil
	}
	s.state, s.err = finished, err
	s.wake()
}

// restart drops every request (ErrRestarted) and the whole cache without
// events, as an engine process that dies and comes back does, and swaps
// in the new publisher.
func (r *Rank) restart(pub *engine.Publisher) (old *engine.Publisher) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range slices.Concat(r.waiting, r.running) {
		s.state, s.err = finished, ErrRestarted
		s.blocks = nil
		s.wake()
	}
	r.waiting, r.running = nil, nil
	r.cache = newCache(r.cfg.NumBlocks, r.cfg.BlockSize)
	old, r.pub = r.pub, pub
	return old
}

// stop fails every request with ErrStopped and refuses new ones.
func (r *Rank) stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stopped = true
	for _, s := range slices.Concat(r.waiting, r.running) {
		r.end(s, ErrStopped)
	}
}

// work is one request's share of a step: n tokens to compute.
type work struct {
	s *Seq
	n int
}

// schedule plans one step, as vLLM's scheduler does: running requests
// first (a decode token each, or the next prefill chunk), preempting the
// newest running request when blocks run out; then waiting requests in
// arrival order while the token budget, the sequence limit and the free
// blocks (above the watermark) allow. It returns the plan and the step's
// simulated duration; an empty plan means there is nothing to do. r.mu held.
func (r *Rank) schedule(plan []work) ([]work, time.Duration) {
	budget := r.cfg.MaxBatchedTokens
	bs := r.cfg.BlockSize
	for i := 0; i < len(r.running) && budget > 0; i++ {
		s := r.running[i]
		n := min(len(s.tokens)-s.computed, budget)
		need := ceilDiv(s.computed+n, bs) - len(s.blocks)
		for need > r.cache.nFree {
			victim := r.running[len(r.running)-1]
			r.preempt(victim)
			if victim == s {
				break
			}
		}
		if s.state != running {
			break // s itself was preempted: so is everything after it
		}
		if need > 0 {
			s.blocks = append(s.blocks, r.cache.allocate(need)...)
		}
		plan = append(plan, work{s, n})
		budget -= n
	}
	reserve := int(r.cfg.Watermark * float64(r.cfg.NumBlocks))
	for len(r.waiting) > 0 && budget > 0 && len(r.running) < r.cfg.MaxNumSeqs {
		s := r.waiting[0]
		if !r.admit(s, budget, reserve) {
			break
		}
		r.waiting = r.waiting[1:]
		r.running = append(r.running, s)
		s.state = running
		n := min(len(s.tokens)-s.computed, budget)
		plan = append(plan, work{s, n})
		budget -= n
	}
	var prefill, decodes int
	for _, w := range plan {
		if w.n == 1 && w.s.nOut > 0 {
			decodes++
		} else {
			prefill += w.n // a prompt chunk, or the recomputation of a preempted request
		}
	}
	var d time.Duration
	if prefill > 0 {
		d += r.cfg.Timing.Prefill(prefill)
	}
	if decodes > 0 {
		d += r.cfg.Timing.Decode(r.cache.usage())
	}
	return plan, d
}

// admit looks s up in the prefix cache and allocates the blocks of its
// first chunk, or reports false (changing nothing) when the free blocks
// would fall under reserve. r.mu held.
func (r *Rank) admit(s *Seq, budget, reserve int) bool {
	bs := r.cfg.BlockSize
	s.hashUpTo(len(s.tokens)/bs, bs)
	hit := r.cache.lookup(s.hashes)
	// The last token is always computed, to sample from.
	hit = hit[:min(len(hit), (len(s.tokens)-1)/bs)]
	hitTokens := len(hit) * bs
	n := min(len(s.tokens)-hitTokens, budget)
	need := ceilDiv(hitTokens+n, bs) - len(hit)
	pinned := 0
	for _, b := range hit {
		if b.free {
			pinned++
		}
	}
	if r.cache.nFree-pinned-need < reserve {
		return false
	}
	r.cache.touch(hit)
	s.blocks = append(hit[:len(hit):len(hit)], r.cache.allocate(need)...)
	s.computed = hitTokens
	if !s.admitted {
		s.admitted, s.cached = true, hitTokens
		r.stats.PrefixQueries += uint64(len(s.tokens))
		r.stats.PrefixHits += uint64(hitTokens)
		r.stats.PromptTokens += uint64(len(s.tokens))
	}
	return true
}

// preempt sends a running request back to the head of the queue, freeing
// its blocks; it will be recomputed (its output so far included). r.mu held.
func (r *Rank) preempt(s *Seq) {
	r.running = slices.DeleteFunc(r.running, func(x *Seq) bool { return x == s })
	r.cache.release(s.blocks)
	s.blocks, s.computed, s.state = nil, 0, waiting
	r.waiting = slices.Insert(r.waiting, 0, s)
	r.stats.Preemptions++
}

// finish applies a step's plan: computed KV becomes cached (BlockStored),
// requests whose tokens are all computed sample their next token, and
// those at their output length finish. Requests that ended or were
// preempted since schedule are skipped. r.mu held.
func (r *Rank) finish(plan []work) {
	bs := r.cfg.BlockSize
	for _, w := range plan {
		s := w.s
		if s.state != running || s.computed+w.n > len(s.tokens) {
			continue
		}
		before := s.computed / bs
		s.computed += w.n
		after := s.computed / bs
		if after > before {
			s.hashUpTo(after, bs)
			r.cache.commit(s.blocks, s.hashes, s.tokens, s.req.LoRA, before, after)
		}
		if s.computed < len(s.tokens) {
			continue // prefill continues next step
		}
		s.tokens = append(s.tokens, s.nextToken(r.cfg.VocabSize))
		s.nOut++
		r.stats.GenerationTokens++
		if s.nOut >= s.req.MaxTokens || s.nOut == s.req.StopAfter {
			r.end(s, nil)
		} else {
			s.wake()
		}
	}
}

// hashUpTo extends s.hashes to the first n full blocks of s.tokens. Tokens
// only grow, so the hashes already there stay valid.
func (s *Seq) hashUpTo(n, bs int) {
	k := len(s.hashes)
	if k >= n {
		return
	}
	prev := uint64(0)
	if k > 0 {
		prev = s.hashes[k-1]
	}
	s.hashes = chainHashes(s.hashes, prev, s.req.LoRA, s.tokens[k*bs:n*bs], bs)
}

// nextToken draws the next output id (splitmix64).
func (s *Seq) nextToken(vocab int) uint32 {
	s.rng += 0x9e3779b97f4a7c15
	return uint32(mix(s.rng) % uint64(vocab))
}

// step runs one whole step without waiting: schedule, then finish. It
// returns the step's simulated duration and false when there was nothing
// to do. Tests drive ranks with it; run uses schedule and finish with the
// wait in between.
func (r *Rank) step() (time.Duration, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	plan, d := r.schedule(nil)
	if len(plan) == 0 {
		return 0, false
	}
	r.finish(plan)
	return d, true
}

// run is the rank's step loop: it schedules a step, waits its simulated
// duration divided by Speedup, applies it and publishes the step's events
// as one batch, until ctx ends. It owns the publishing: events are sent
// in the order the cache produced them.
func (r *Rank) run(ctx context.Context, published func(n int, err error)) {
	var plan []work
	timer := time.NewTimer(0)
	<-timer.C
	defer timer.Stop()
	for {
		r.mu.Lock()
		var d time.Duration
		plan, d = r.schedule(plan[:0])
		r.mu.Unlock()
		if len(plan) > 0 {
			timer.Reset(time.Duration(float64(d) / r.cfg.Speedup))
			select {
			case <-ctx.Done():
				return
			case <-timer.C:
			}
			r.mu.Lock()
			r.finish(plan)
			r.mu.Unlock()
		}
		r.mu.Lock()
		events, pub := r.cache.takeEvents(), r.pub
		r.mu.Unlock()
		if len(events) > 0 && pub != nil {
			_, err := pub.Publish(events...)
			if published != nil {
				published(len(events), err)
			}
		}
		if len(plan) == 0 {
			select {
			case <-ctx.Done():
				return
			case <-r.wake:
			}
		}
	}
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }
