package tokenize

import (
	"hash/maphash"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// The segment cache reuses the ids of the text between added tokens across calls (see
// the package documentation for why that is exact). Chat prompts alternate special
// tokens and message text, so the earlier turns of a multi-turn conversation are
// segments the cache has already seen.

// DefaultSegmentCacheBytes is the segment-cache budget NewRegistry gives each loaded
// tokenizer unless RegistryOptions.SegmentCacheBytes says otherwise.
const DefaultSegmentCacheBytes = 64 << 20

// DefaultSegmentCacheMinBytes is the default shortest segment (in bytes) the cache
// stores and looks up. Shorter segments ("\n", "user", "assistant\n" between the
// special tokens of a chat template) are encoded again: they cost a few hundred
// nanoseconds through the word cache, and caching them would mostly fill the cache
// with per-entry overhead.
const DefaultSegmentCacheMinBytes = 16

// SegmentCacheOptions configure Tokenizer.WithSegmentCache.
type SegmentCacheOptions struct {
	// MaxBytes bounds the cache: the text of the cached segments, their ids (4 bytes
	// each) and a fixed per-entry overhead (segEntryOverhead) never add up to more.
	// Zero or less disables the cache.
	MaxBytes int64
	// MinBytes is the shortest segment cached; 0 means DefaultSegmentCacheMinBytes.
	MinBytes int
}

// SegmentCacheStats describe a segment cache. Hits and Misses count lookups of
// segments at least MinBytes long since the cache was made.
type SegmentCacheStats struct {
	Hits, Misses uint64
	Entries      int
	Bytes        int64 // accounted size of the entries, at most MaxBytes
	MaxBytes     int64
	MinBytes     int
}

// segEntryOverhead is what an entry costs beyond its text and ids, charged against
// the budget: the entry record, its map slot, its reference bit and the slice and
// string headers, rounded up.
const segEntryOverhead = 128

// segEntrySize is the accounted size of an entry.
func segEntrySize(keyLen, nIDs int) int64 {
	return int64(keyLen) + 4*int64(nIDs) + segEntryOverhead
}

// segShards is the largest number of shards; small budgets use fewer (see
// newSegCache) so that a shard can still hold a long segment.
const (
	segMaxShards      = 16
	segMinShardBudget = 1 << 20
)

// segCache is a bounded, concurrency-safe map from (segment text, at start of input)
// to the segment's ids. It is sharded by hash; each shard is a map from the 64-bit hash
// to an entry slot, guarded by a RWMutex, and evicts with CLOCK (second chance): a hit
// sets the entry's reference bit under the read lock; the insert that needs room
// sweeps the hand, clearing set bits and evicting the first entry whose bit is clear.
// The hash only selects a slot: a hit also compares the text and the flag, so a
// collision is a miss, never a wrong answer.
//
// Entries are immutable once inserted: the key and ids are private copies, ids are
// only ever copied out (get returns the shared slice to AppendEncode, which appends
// it to the caller's dst and never writes to it).
type segCache struct {
	seed    maphash.Seed
	minLen  int
	max     int64
	shift   uint // shard = hash >> shift
	shards  []segShard
	hits    atomic.Uint64
	misses  atomic.Uint64
	entries atomic.Int64 // for Stats without taking every lock
}

type segShard struct {
	mu      sync.RWMutex
	index   map[uint64]int32 // hash → slot in entries
	entries []segEntry
	refs    []uint32 // CLOCK reference bits, parallel to entries; set atomically by readers
	free    []int32  // dead slots in entries
	hand    int
	bytes   int64
	budget  int64
	_       [64]byte // keep neighbouring shards' locks off one cache line
}

type segEntry struct {
	key   string
	ids   []uint32
	hash  uint64
	first bool
	live  bool
}

// segFirstMix separates the hash of a segment at the start of the input from the same
// text elsewhere (the entries also record the flag, so this only spreads them).
const segFirstMix = 0x9e3779b97f4a7c15

func newSegCache(opts SegmentCacheOptions) *segCache {
	if opts.MaxBytes <= 0 {
		return nil
	}
	c := &segCache{seed: maphash.MakeSeed(), minLen: opts.MinBytes, max: opts.MaxBytes}
	if c.minLen <= 0 {
		c.minLen = DefaultSegmentCacheMinBytes
	}
	n := 1
	for n < segMaxShards && opts.MaxBytes/int64(2*n) >= segMinShardBudget {
		n *= 2
	}
	bits := uint(0)
	for 1<<bits < n {
		bits++
	}
	c.shift = 64 - bits
	c.shards = make([]segShard, n)
	for i := range c.shards {
		c.shards[i].index = map[uint64]int32{}
		// The shard budgets add up to at most MaxBytes.
		c.shards[i].budget = opts.MaxBytes / int64(n)
	}
	return c
}

func (c *segCache) hash(s string, first bool) uint64 {
	h := maphash.String(c.seed, s)
	if first {
		h ^= segFirstMix
	}
	return h
}

func (c *segCache) shard(h uint64) *segShard {
	return &c.shards[h>>c.shift] // (a shift by 64 gives 0: one shard)
}

// get returns the cached ids of segment s (read-only: the caller must copy them).
func (c *segCache) get(h uint64, s string, first bool) ([]uint32, bool) {
	sh := c.shard(h)
	sh.mu.RLock()
	i, ok := sh.index[h]
	var ids []uint32
	if ok {
		e := &sh.entries[i]
		if ok = e.first == first && e.key == s; ok {
			ids = e.ids
			if atomic.LoadUint32(&sh.refs[i]) == 0 {
				atomic.StoreUint32(&sh.refs[i], 1)
			}
		}
	}
	sh.mu.RUnlock()
	return ids, ok
}

// put stores a copy of s and ids, evicting as needed. An entry larger than its shard's
// whole budget is not stored.
func (c *segCache) put(h uint64, s string, first bool, ids []uint32) {
	size := segEntrySize(len(s), len(ids))
	sh := c.shard(h)
	if size > sh.budget {
		return
	}
	e := segEntry{key: strings.Clone(s), ids: slices.Clip(slices.Clone(ids)), hash: h, first: first, live: true}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if i, ok := sh.index[h]; ok {
		if old := &sh.entries[i]; old.first == first && old.key == s {
			return // another goroutine stored it first
		}
		c.remove(sh, i) // a hash collision: the newer segment takes the slot
	}
	for sh.bytes+size > sh.budget {
		c.evict(sh)
	}
	var i int32
	if n := len(sh.free); n > 0 {
		i = sh.free[n-1]
		sh.free = sh.free[:n-1]
		sh.entries[i] = e
		sh.refs[i] = 0
	} else {
		i = int32(len(sh.entries))
		sh.entries = append(sh.entries, e)
		sh.refs = append(sh.refs, 0)
	}
	sh.index[h] = i
	sh.bytes += size
	c.entries.Add(1)
}

// evict removes one entry with CLOCK. Called with the shard locked and bytes > 0, so a
// live entry exists; a first sweep clears every reference bit, so it ends within two.
func (c *segCache) evict(sh *segShard) {
	for {
		if sh.hand >= len(sh.entries) {
			sh.hand = 0
		}
		i := sh.hand
		sh.hand++
		if !sh.entries[i].live {
			continue
		}
		if sh.refs[i] != 0 {
			sh.refs[i] = 0
			continue
		}
		c.remove(sh, int32(i))
		return
	}
}

func (c *segCache) remove(sh *segShard, i int32) {
	e := &sh.entries[i]
	sh.bytes -= segEntrySize(len(e.key), len(e.ids))
	delete(sh.index, e.hash)
	*e = segEntry{}
	sh.refs[i] = 0
	sh.free = append(sh.free, i)
	c.entries.Add(-1)
}

func (c *segCache) stats() SegmentCacheStats {
	if c == nil {
		return SegmentCacheStats{}
	}
	s := SegmentCacheStats{Hits: c.hits.Load(), Misses: c.misses.Load(), Entries: int(c.entries.Load()), MaxBytes: c.max, MinBytes: c.minLen}
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.RLock()
		s.Bytes += sh.bytes
		sh.mu.RUnlock()
	}
	return s
}
