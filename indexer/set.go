package indexer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// DefaultTenant is the tenant of a model when none is given.
const DefaultTenant = "default"

// Key names one index: a model and a tenant.
type Key struct {
	Model  string
	Tenant string
}

// String returns "model:tenant", the form used by the dump format.
func (k Key) String() string { return k.Model + ":" + k.Tenant }

// ParseKey parses "model:tenant", splitting at the last ':' (model names may
// contain ':'). Both parts must be non-empty.
func ParseKey(s string) (Key, error) {
	i := strings.LastIndexByte(s, ':')
	if i <= 0 || i == len(s)-1 {
		return Key{}, fmt.Errorf("index key %q is not model:tenant", truncate(s, 80))
	}
	return Key{Model: s[:i], Tenant: s[i+1:]}, nil
}

// Errors of Set.
var (
	// ErrBlockSizeConflict: an index exists for the key with another block size.
	ErrBlockSizeConflict = errors.New("block size conflict")
	// ErrClosed: the Set was closed.
	ErrClosed = errors.New("indexer closed")
	// ErrRemoved: the event's index was removed from the Set (Set.Remove)
	// before the event applied; the event was dropped.
	ErrRemoved = errors.New("index removed")
)

// Options configure a Set.
type Options struct {
	// EventThreads is the number of goroutines applying events, sharded by
	// worker id so that each worker's events apply in order. Default 4.
	EventThreads int
	// IndexShards is how many shards each index is split into (see
	// Index): more apply events in parallel and make every match walk
	// each. With a count that divides EventThreads, each goroutine applies
	// to one shard only. Default 1.
	IndexShards int
	// QueueLen is the number of pending jobs per goroutine before Submit
	// blocks. Default 1024.
	QueueLen int
	// Hold starts the Set holding: events and Do functions queue (Submit
	// blocks once a queue is full) but none applies until Release. Peer
	// recovery uses it to subscribe to workers before loading a peer's dump
	// and apply what arrived meanwhile afterwards.
	Hold bool
}

// job is one unit of work for an apply goroutine: an event, or a function
// ordered with the worker's events.
type job struct {
	ix   *Index
	ev   Event
	done func(ApplyResult, error)
	fn   func()
}

// Set holds every index of the process, one per (model, tenant), and the
// goroutines that apply events to them.
type Set struct {
	mu      sync.RWMutex
	indexes map[Key]*Index
	shards  int // of each index

	closeMu sync.RWMutex // held for reading while submitting
	closed  bool
	queues  []chan job
	wg      sync.WaitGroup

	release     chan struct{} // closed when the apply goroutines may run
	releaseOnce sync.Once

	dropped atomic.Uint64 // events dropped because their index was removed
}

// NewSet starts a Set's apply goroutines. Close stops them.
func NewSet(opts Options) *Set {
	if opts.EventThreads <= 0 {
		opts.EventThreads = 4
	}
	if opts.QueueLen <= 0 {
		opts.QueueLen = 1024
	}
	if opts.IndexShards <= 0 {
		opts.IndexShards = 1
	}
	s := &Set{indexes: make(map[Key]*Index), shards: opts.IndexShards, queues: make([]chan job, opts.EventThreads), release: make(chan struct{})}
	if !opts.Hold {
		s.Release()
	}
	for i := range s.queues {
		q := make(chan job, opts.QueueLen)
		s.queues[i] = q
		s.wg.Go(func() {
			<-s.release
			for j := range q {
				if j.fn != nil {
					j.fn()
					continue
				}
				if j.ix.removed.Load() {
					s.dropped.Add(1)
					if j.done != nil {
						j.done(ApplyResult{}, ErrRemoved)
					}
					continue
				}
				res, err := j.ix.Apply(j.ev)
				if j.done != nil {
					j.done(res, err)
				}
			}
		})
	}
	return s
}

// Release lets a Set created with Options.Hold apply what it queued and
// everything after. Further calls do nothing.
func (s *Set) Release() { s.releaseOnce.Do(func() { close(s.release) }) }

// Held reports whether the Set is holding events (see Options.Hold).
func (s *Set) Held() bool {
	select {
	case <-s.release:
		return false
	default:
		return true
	}
}

// Close releases a held Set, applies every job already submitted, then
// stops the goroutines. Later Submit and Do calls fail with ErrClosed.
func (s *Set) Close() {
	s.Release()
	s.closeMu.Lock()
	if !s.closed {
		s.closed = true
		for _, q := range s.queues {
			close(q)
		}
	}
	s.closeMu.Unlock()
	s.wg.Wait()
}

// Index returns the index of key, creating it with blockSize if it does not
// exist. An existing index with another block size is an error wrapping
// ErrBlockSizeConflict.
func (s *Set) Index(key Key, blockSize int) (*Index, error) {
	if blockSize < 1 || blockSize > MaxBlockSize {
		return nil, fmt.Errorf("index %s: block size %d out of range 1..%d", key, blockSize, MaxBlockSize)
	}
	s.mu.RLock()
	ix := s.indexes[key]
	s.mu.RUnlock()
	if ix == nil {
		s.mu.Lock()
		if ix = s.indexes[key]; ix == nil {
			ix = NewShardedIndex(blockSize, s.shards)
			s.indexes[key] = ix
		}
		s.mu.Unlock()
	}
	if ix.BlockSize() != blockSize {
		return nil, fmt.Errorf("index %s has block size %d, not %d: %w", key, ix.BlockSize(), blockSize, ErrBlockSizeConflict)
	}
	return ix, nil
}

// Lookup returns the index of key, or nil.
func (s *Set) Lookup(key Key) *Index {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.indexes[key]
}

// Remove drops the index of key, if any, and reports whether there was
// one. Events still queued for it are dropped, each counted in Dropped and
// reported to its done function with ErrRemoved; one already applying
// finishes on the dropped index. The dropped index never comes back: a
// later Index for key creates a new, empty one.
func (s *Set) Remove(key Key) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	ix := s.indexes[key]
	if ix == nil {
		return false
	}
	ix.removed.Store(true)
	delete(s.indexes, key)
	return true
}

// Dropped returns how many queued events were dropped because their index
// was removed (see Remove).
func (s *Set) Dropped() uint64 { return s.dropped.Load() }

// Keys returns the keys of all indexes, sorted.
func (s *Set) Keys() []Key {
	s.mu.RLock()
	keys := make([]Key, 0, len(s.indexes))
	for k := range s.indexes {
		keys = append(keys, k)
	}
	s.mu.RUnlock()
	slices.SortFunc(keys, func(a, b Key) int { return strings.Compare(a.String(), b.String()) })
	return keys
}

// Submit queues ev for ix on the goroutine that owns ev.Worker.Worker and
// returns once it is queued (blocking while that queue is full, until ctx
// ends). done, if not nil, is called on that goroutine with the result.
// Events of one worker submitted from one goroutine apply in order.
func (s *Set) Submit(ctx context.Context, ix *Index, ev Event, done func(ApplyResult, error)) error {
	return s.enqueue(ctx, ev.Worker.Worker, job{ix: ix, ev: ev, done: done})
}

// Do runs fn on the goroutine that owns worker, after every event of that
// worker submitted before it, and waits for it to finish or ctx to end. If
// ctx ends after fn was queued, fn still runs, in order, later.
func (s *Set) Do(ctx context.Context, worker uint64, fn func()) error {
	finished := make(chan struct{})
	if err := s.enqueue(ctx, worker, job{fn: func() { fn(); close(finished) }}); err != nil {
		return err
	}
	select {
	case <-finished:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("worker %d: %w", worker, ctx.Err())
	}
}

func (s *Set) enqueue(ctx context.Context, worker uint64, j job) error {
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	if s.closed {
		return ErrClosed
	}
	q := s.queues[shardOf(worker, len(s.queues))]
	select {
	case q <- j:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("queue event of worker %d: %w", worker, ctx.Err())
	}
}

// shardOf spreads worker ids (often small and consecutive, or random lease
// ids) evenly over n goroutines.
func shardOf(worker uint64, n int) int {
	worker ^= worker >> 33
	worker *= 0xff51afd7ed558ccd
	worker ^= worker >> 33
	return int(worker % uint64(n))
}

// Dump dumps every index, sorted by key.
func (s *Set) Dump() []IndexDump {
	keys := s.Keys()
	out := make([]IndexDump, 0, len(keys))
	for _, k := range keys {
		ix := s.Lookup(k)
		if ix == nil {
			continue // removed meanwhile
		}
		out = append(out, IndexDump{Key: k, BlockSize: ix.BlockSize(), Events: ix.Dump()})
	}
	return out
}

// Load loads dumps (as from a peer's /dump) into the set, creating indexes
// as needed. It returns how many events could not be placed.
func (s *Set) Load(dumps []IndexDump) (skipped int, err error) {
	for _, d := range dumps {
		ix, err := s.Index(d.Key, d.BlockSize)
		if err != nil {
			return skipped, fmt.Errorf("load dump: %w", err)
		}
		n, err := ix.Load(d.Events)
		skipped += n
		if err != nil {
			return skipped, fmt.Errorf("load dump %s: %w", d.Key, err)
		}
	}
	return skipped, nil
}
