package extproc

import (
	"container/list"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/zeebo/xxh3"

	"github.com/kvgate/kvgate/indexer"
	"github.com/kvgate/kvgate/scheduler"
)

// Policy is how the gateway picks a worker rank. PolicyKV is kvgate's
// KV-aware selection: the scheduler's cost over the index and the active
// loads, with the charge for the cached prefix a choice gives up
// (scheduler.CostOptions.ReuseWeight, kvgate serve's --reuse-weight; 0
// leaves the spec's cost, as the Dynamo-compatible /select answers). The
// others are the baselines it is measured against (make demo,
// bench/routing). They use neither the index nor the cost function, but
// book their requests in the same active loads, so the lifecycle, the load
// limit and /loads work alike.
type Policy string

// The routing policies.
const (
	PolicyKV          Policy = "kv"
	PolicyRoundRobin  Policy = "round-robin"
	PolicyRandom      Policy = "random"
	PolicyLeastLoaded Policy = "least-loaded"
	// PolicyPrefixHash is approximate prefix routing, as gateways without KV
	// events do (the Gateway API Inference Extension's prefix-cache
	// scorer): the prompt's bytes are hashed in chained chunks, the gateway
	// remembers which rank it sent each chunk to, and a rank's score is
	// the share of the prompt's leading chunks it was sent, weighed
	// against its queue (see prefixTable).
	PolicyPrefixHash Policy = "prefix-hash"
)

// Policies lists the policies, PolicyKV first.
var Policies = []Policy{PolicyKV, PolicyRoundRobin, PolicyRandom, PolicyLeastLoaded, PolicyPrefixHash}

// ParsePolicy returns the policy named s.
func ParsePolicy(s string) (Policy, error) {
	if slices.Contains(Policies, Policy(s)) {
		return Policy(s), nil
	}
	names := make([]string, len(Policies))
	for i, p := range Policies {
		names[i] = string(p)
	}
	return "", fmt.Errorf("unknown routing policy %q: want one of %s", s, strings.Join(names, ", "))
}

// Approximate prefix routing's parameters, the defaults of the Gateway API
// Inference Extension's prefix-cache scorer: 64-byte chunks, at most 256
// leading chunks looked at, 31 250 chunks remembered per rank (LRU); and
// its default scheduling profile's weights: prefix 3, queue 1 (its
// KV-cache-utilization scorer, weight 1, needs engine metrics and is left
// out).
const (
	prefixChunkBytes   = 64
	prefixMaxChunks    = 256
	prefixLRUPerRank   = 31250
	prefixWeight       = 3.0
	prefixQueueWeight  = 1.0
	policyRandomSeedLo = 0x6b766761 // "kvga"
)

// baseline picks ranks for the policies other than PolicyKV.
type baseline struct {
	policy Policy
	rr     atomic.Uint64

	mu   sync.Mutex // guards rand
	rand *rand.Rand

	pmu    sync.Mutex // guards prefix
	prefix map[indexer.Key]*prefixTable
}

func newBaseline(p Policy, seed uint64) *baseline {
	return &baseline{policy: p, rand: rand.New(rand.NewPCG(seed, policyRandomSeedLo)), prefix: map[indexer.Key]*prefixTable{}}
}

// pick returns the rank for a request of key among loads (the candidate
// ranks with their active loads, sorted by worker and rank; not empty).
// prompt is what approximate prefix routing hashes.
func (b *baseline) pick(key indexer.Key, loads []scheduler.Load, prompt []byte) indexer.WorkerRank {
	switch b.policy {
	case PolicyRoundRobin:
		return loads[(b.rr.Add(1)-1)%uint64(len(loads))].Worker
	case PolicyRandom:
		return loads[b.intN(len(loads))].Worker
	case PolicyLeastLoaded:
		return b.leastLoaded(loads).Worker
	case PolicyPrefixHash:
		return b.table(key).pick(b, loads, prompt)
	}
	panic("extproc: baseline pick for policy " + string(b.policy))
}

func (b *baseline) intN(n int) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.rand.IntN(n)
}

// leastLoaded returns the load with the fewest active requests, then the
// fewest prefill tokens; ties are broken at random, so that equal ranks
// share the traffic.
func (b *baseline) leastLoaded(loads []scheduler.Load) scheduler.Load {
	best, ties := 0, 1
	for i := 1; i < len(loads); i++ {
		switch c := cmpLoad(loads[i], loads[best]); {
		case c < 0:
			best, ties = i, 1
		case c == 0:
			ties++
			if b.intN(ties) == 0 { // reservoir sampling among the ties
				best = i
			}
		}
	}
	return loads[best]
}

func cmpLoad(a, b scheduler.Load) int {
	if a.Requests != b.Requests {
		return a.Requests - b.Requests
	}
	switch {
	case a.PrefillTokens < b.PrefillTokens:
		return -1
	case a.PrefillTokens > b.PrefillTokens:
		return 1
	}
	return 0
}

func (b *baseline) table(key indexer.Key) *prefixTable {
	b.pmu.Lock()
	defer b.pmu.Unlock()
	t := b.prefix[key]
	if t == nil {
		t = &prefixTable{ranks: map[indexer.WorkerRank]*rankChunks{}, owners: map[uint64][]indexer.WorkerRank{}}
		b.prefix[key] = t
	}
	return t
}

// prefixTable remembers, for one (model, tenant), which ranks were sent
// which prompt chunks: each rank keeps its last prefixLRUPerRank chunk
// hashes (an LRU), and owners maps a chunk hash to the ranks holding it.
type prefixTable struct {
	mu     sync.Mutex
	ranks  map[indexer.WorkerRank]*rankChunks
	owners map[uint64][]indexer.WorkerRank
}

type rankChunks struct {
	lru   *list.List // of uint64 chunk hashes, most recent first
	elems map[uint64]*list.Element
}

// chunkHashes returns the chained hashes of prompt's leading full chunks
// (at most prefixMaxChunks): chunk i's hash covers chunks 0..i.
func chunkHashes(prompt []byte) []uint64 {
	n := min(len(prompt)/prefixChunkBytes, prefixMaxChunks)
	hs := make([]uint64, n)
	var prev [8]byte
	buf := make([]byte, 8+prefixChunkBytes)
	for i := range n {
		copy(buf, prev[:])
		copy(buf[8:], prompt[i*prefixChunkBytes:(i+1)*prefixChunkBytes])
		hs[i] = xxh3.Hash(buf)
		binary.LittleEndian.PutUint64(prev[:], hs[i])
	}
	return hs
}

// pick scores every candidate, score = prefixWeight * (leading chunks the
// rank was sent / chunks) + prefixQueueWeight * queue score (1 for the
// fewest active requests, 0 for the most), picks the best (ties at
// random), and records the prompt's chunks on it.
func (t *prefixTable) pick(b *baseline, loads []scheduler.Load, prompt []byte) indexer.WorkerRank {
	hs := chunkHashes(prompt)
	t.mu.Lock()
	defer t.mu.Unlock()
	matched := make(map[indexer.WorkerRank]int, len(loads))
	for i, h := range hs {
		owners := t.owners[h]
		if len(owners) == 0 {
			break
		}
		still := false
		for _, wr := range owners {
			if matched[wr] == i { // held every chunk before this one too
				matched[wr] = i + 1
				still = true
			}
		}
		if !still {
			break
		}
	}
	minQ, maxQ := loads[0].Requests, loads[0].Requests
	for _, l := range loads[1:] {
		minQ, maxQ = min(minQ, l.Requests), max(maxQ, l.Requests)
	}
	best, bestScore, ties := -1, 0.0, 0
	for i, l := range loads {
		score := prefixQueueWeight
		if maxQ > minQ {
			score = prefixQueueWeight * float64(maxQ-l.Requests) / float64(maxQ-minQ)
		}
		if len(hs) > 0 {
			score += prefixWeight * float64(matched[l.Worker]) / float64(len(hs))
		}
		switch {
		case best < 0 || score > bestScore:
			best, bestScore, ties = i, score, 1
		case score == bestScore:
			ties++
			if b.intN(ties) == 0 {
				best = i
			}
		}
	}
	wr := loads[best].Worker
	t.record(wr, hs)
	return wr
}

// record notes that wr was sent the chunks hs, evicting its least recently
// sent chunks beyond prefixLRUPerRank. Call with t.mu held.
func (t *prefixTable) record(wr indexer.WorkerRank, hs []uint64) {
	rc := t.ranks[wr]
	if rc == nil {
		rc = &rankChunks{lru: list.New(), elems: map[uint64]*list.Element{}}
		t.ranks[wr] = rc
	}
	for _, h := range hs {
		if e := rc.elems[h]; e != nil {
			rc.lru.MoveToFront(e)
			continue
		}
		rc.elems[h] = rc.lru.PushFront(h)
		t.owners[h] = append(t.owners[h], wr)
		if rc.lru.Len() > prefixLRUPerRank {
			old := rc.lru.Remove(rc.lru.Back()).(uint64)
			delete(rc.elems, old)
			t.drop(old, wr)
		}
	}
}

// drop removes wr from h's owners. Call with t.mu held.
func (t *prefixTable) drop(h uint64, wr indexer.WorkerRank) {
	owners := slices.DeleteFunc(t.owners[h], func(o indexer.WorkerRank) bool { return o == wr })
	if len(owners) == 0 {
		delete(t.owners, h)
		return
	}
	t.owners[h] = owners
}

// forget drops every rank of key not among live (gone from the catalog).
func (b *baseline) forget(key indexer.Key, live []scheduler.Load) {
	b.pmu.Lock()
	t := b.prefix[key]
	b.pmu.Unlock()
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for wr, rc := range t.ranks {
		if slices.ContainsFunc(live, func(l scheduler.Load) bool { return l.Worker == wr }) {
			continue
		}
		for h := range rc.elems {
			t.drop(h, wr)
		}
		delete(t.ranks, wr)
	}
}

// promptBytes returns what approximate prefix routing hashes: the text of
// a completion, the messages of a chat as the client sent them (JSON), or
// a completion's token ids (4 bytes each, little endian).
func promptBytes(p *Prompt) []byte {
	switch {
	case p.IDs != nil:
		b := make([]byte, 4*len(p.IDs))
		for i, id := range p.IDs {
			binary.LittleEndian.PutUint32(b[4*i:], id)
		}
		return b
	case p.Tokenize.Chat != nil:
		return p.Tokenize.Chat.Messages
	}
	return []byte(p.Tokenize.Text)
}
