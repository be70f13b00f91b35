package scheduler

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/indexer"
)

// This file is the active-load accounting (the slot tracker of
// shared/spec/scheduling.md): per (model, tenant), the requests booked on
// each worker rank, their prefill tokens still to compute, and the unique
// prompt blocks (by sequence hash) and output blocks they hold.

// DefaultRequestTTL is how long a request may stay booked without being
// freed before it is expired.
const DefaultRequestTTL = 300 * time.Second

// LoadOptions configure Loads.
type LoadOptions struct {
	// Now is the clock; default time.Now. Tests inject a fake one.
	Now func() time.Time
	// TTL is the age at which a request is expired. Default DefaultRequestTTL.
	TTL time.Duration
}

// Booking is one request to account on a worker rank.
type Booking struct {
	ID     string
	Worker indexer.WorkerRank
	// Hashes are the prompt's sequence hashes, one per full block.
	Hashes []uint64
	// PrefillTokens are the tokens the worker must compute (not cached).
	PrefillTokens int64
}

// Load is the active load of one worker rank.
type Load struct {
	Key           indexer.Key
	Worker        indexer.WorkerRank
	PrefillTokens int64
	// DecodeBlocks counts the unique prompt blocks held by active requests
	// plus their (possibly decayed) output blocks.
	DecodeBlocks float64
	Requests     int
}

// LifecycleKind says what a Lifecycle event did.
type LifecycleKind uint8

// The lifecycle events replicas share (output blocks stay local).
const (
	LifecycleAdd LifecycleKind = iota + 1
	LifecyclePrefillComplete
	LifecycleFree
)

// Lifecycle is one successful change to the accounting: a booking (with
// Booking set), a prefill completion or a free of Booking.ID.
type Lifecycle struct {
	Kind    LifecycleKind
	Key     indexer.Key
	Booking Booking
}

// Loads holds the active-load accounting of every (model, tenant). It is
// safe for concurrent use.
type Loads struct {
	now func() time.Time
	ttl time.Duration

	observer atomic.Pointer[func(Lifecycle)]

	mu       sync.RWMutex
	trackers map[indexer.Key]*tracker
}

// tracker is the accounting of one (model, tenant).
type tracker struct {
	key       indexer.Key
	blockSize int

	mu    sync.Mutex
	ranks map[indexer.WorkerRank]*rankLoad
	order []*rankLoad // ranks sorted by worker and rank, for deterministic scans
	reqs  map[string]*request
	// holders lists, per sequence hash, the ranks whose active requests
	// hold it, with reference counts: the held blocks of a prompt on every
	// rank are found in one pass over its hashes.
	holders map[uint64][]holderRef
	pass    uint64 // countHeld's current pass
}

type rankLoad struct {
	wr      indexer.WorkerRank
	prefill int64
	blocks  int     // unique sequence hashes held by active requests
	output  float64 // weighted output blocks
	reqs    int
	seen    int // countHeld scratch: prompt hashes held, valid when mark is the pass
	mark    uint64
}

type holderRef struct {
	rank *rankLoad
	refs int32
}

type request struct {
	rank    *rankLoad
	hashes  []uint64
	prefill int64 // remaining prefill tokens; 0 once prefill completed
	// prefillDone is set by the first prefill completion.
	prefillDone bool
	output      float64
	added       time.Time
}

// NewLoads returns empty accounting.
func NewLoads(opts LoadOptions) *Loads {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.TTL <= 0 {
		opts.TTL = DefaultRequestTTL
	}
	return &Loads{now: opts.Now, ttl: opts.TTL, trackers: make(map[indexer.Key]*tracker)}
}

// Observe sets f to be called after every local Add, PrefillComplete and
// Free that changed something (and every booking by Scheduler.Select),
// outside any lock, in the caller's goroutine. Changes made with Apply are
// not observed. Replica sync uses it to publish.
// Observe(nil) removes the observer.
func (l *Loads) Observe(f func(Lifecycle)) {
	if f == nil {
		l.observer.Store(nil)
		return
	}
	l.observer.Store(&f)
}

func (l *Loads) notify(ev Lifecycle) {
	if f := l.observer.Load(); f != nil {
		(*f)(ev)
	}
}

// Apply applies an event from elsewhere (a replica) without observing it:
// an add books ev.Booking, a prefill completion or free applies to
// ev.Booking.ID. Errors are those of Add, PrefillComplete and Free.
func (l *Loads) Apply(ev Lifecycle) error {
	switch ev.Kind {
	case LifecycleAdd:
		return l.add(ev.Key, ev.Booking)
	case LifecyclePrefillComplete:
		_, err := l.prefillComplete(ev.Key, ev.Booking.ID)
		return err
	case LifecycleFree:
		_, err := l.free(ev.Key, ev.Booking.ID)
		return err
	}
	return fmt.Errorf("%w: lifecycle kind %d", ErrInvalid, ev.Kind)
}

func (l *Loads) tracker(key indexer.Key) *tracker {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.trackers[key]
}

func (l *Loads) trackerOrErr(key indexer.Key) (*tracker, error) {
	t := l.tracker(key)
	if t == nil {
		return nil, fmt.Errorf("%w: no worker registered for model_name %q tenant_id %q", ErrNotFound, key.Model, key.Tenant)
	}
	return t, nil
}

// AddRanks makes worker ranks known to key's tracker, creating it with
// blockSize if needed. Ranks already known keep their load.
func (l *Loads) AddRanks(key indexer.Key, blockSize int, ranks ...indexer.WorkerRank) {
	l.mu.Lock()
	t := l.trackers[key]
	if t == nil {
		t = &tracker{key: key, blockSize: blockSize, ranks: make(map[indexer.WorkerRank]*rankLoad),
			reqs: make(map[string]*request), holders: make(map[uint64][]holderRef)}
		l.trackers[key] = t
	}
	l.mu.Unlock()
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, wr := range ranks {
		if t.ranks[wr] == nil {
			rl := &rankLoad{wr: wr}
			t.ranks[wr] = rl
			i, _ := slices.BinarySearchFunc(t.order, wr, func(x *rankLoad, wr indexer.WorkerRank) int { return cmpRank(x.wr, wr) })
			t.order = slices.Insert(t.order, i, rl)
		}
	}
}

func cmpRank(a, b indexer.WorkerRank) int {
	return cmp.Or(cmp.Compare(a.Worker, b.Worker), cmp.Compare(a.Rank, b.Rank))
}

// RemoveRanks forgets the ranks of worker in key (one rank when rank is not
// nil) and every request booked on them.
func (l *Loads) RemoveRanks(key indexer.Key, worker uint64, rank *uint32) {
	t := l.tracker(key)
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for id, r := range t.reqs {
		if r.rank.wr.Worker == worker && (rank == nil || r.rank.wr.Rank == *rank) {
			t.release(id, r)
		}
	}
	for wr := range t.ranks {
		if wr.Worker == worker && (rank == nil || wr.Rank == *rank) {
			delete(t.ranks, wr)
		}
	}
	t.order = slices.DeleteFunc(t.order, func(rl *rankLoad) bool { return t.ranks[rl.wr] != rl })
}

// Add books a request. A duplicate id is ErrConflict; an unknown (model,
// tenant) or worker rank is ErrNotFound. Expired requests are swept first.
func (l *Loads) Add(key indexer.Key, b Booking) error {
	if err := l.add(key, b); err != nil {
		return err
	}
	l.notify(Lifecycle{Kind: LifecycleAdd, Key: key, Booking: b})
	return nil
}

func (l *Loads) add(key indexer.Key, b Booking) error {
	t, err := l.trackerOrErr(key)
	if err != nil {
		return err
	}
	now := l.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.sweep(now.Add(-l.ttl))
	return t.add(b, now)
}

// add books b; call with t.mu held.
func (t *tracker) add(b Booking, now time.Time) error {
	if b.ID == "" {
		return fmt.Errorf("%w: request_id is required", ErrInvalid)
	}
	if b.PrefillTokens < 0 {
		return fmt.Errorf("%w: prefill tokens %d must not be negative", ErrInvalid, b.PrefillTokens)
	}
	if _, dup := t.reqs[b.ID]; dup {
		return fmt.Errorf("%w: request %q is already active", ErrConflict, b.ID)
	}
	rl := t.ranks[b.Worker]
	if rl == nil {
		return fmt.Errorf("%w: worker %d dp_rank %d is not registered for model_name %q tenant_id %q",
			ErrNotFound, b.Worker.Worker, b.Worker.Rank, t.key.Model, t.key.Tenant)
	}
	r := &request{rank: rl, hashes: slices.Clone(b.Hashes), prefill: b.PrefillTokens, added: now}
	for _, h := range r.hashes {
		refs := t.holders[h]
		i := slices.IndexFunc(refs, func(x holderRef) bool { return x.rank == rl })
		if i < 0 {
			t.holders[h] = append(refs, holderRef{rank: rl, refs: 1})
			rl.blocks++
			continue
		}
		refs[i].refs++
	}
	rl.prefill += r.prefill
	rl.reqs++
	t.reqs[b.ID] = r
	return nil
}

// release removes request id's load; call with t.mu held.
func (t *tracker) release(id string, r *request) {
	rl := r.rank
	for _, h := range r.hashes {
		refs := t.holders[h]
		i := slices.IndexFunc(refs, func(x holderRef) bool { return x.rank == rl })
		if i < 0 {
			continue // a hash listed twice in one prompt was released already
		}
		if refs[i].refs--; refs[i].refs == 0 {
			refs = slices.Delete(refs, i, i+1)
			rl.blocks--
			if len(refs) == 0 {
				delete(t.holders, h)
			} else {
				t.holders[h] = refs
			}
		}
	}
	rl.prefill -= r.prefill
	rl.output -= r.output
	if rl.reqs--; rl.reqs == 0 {
		rl.output = 0 // no float residue once idle
	}
	delete(t.reqs, id)
}

// sweep expires requests added before cutoff; call with t.mu held.
func (t *tracker) sweep(cutoff time.Time) int {
	n := 0
	for id, r := range t.reqs {
		if r.added.Before(cutoff) {
			t.release(id, r)
			n++
		}
	}
	return n
}

// Expire frees every request older than the TTL and returns how many.
// Run it periodically; Add also sweeps its own (model, tenant).
func (l *Loads) Expire() int {
	cutoff := l.now().Add(-l.ttl)
	l.mu.RLock()
	ts := make([]*tracker, 0, len(l.trackers))
	for _, t := range l.trackers {
		ts = append(ts, t)
	}
	l.mu.RUnlock()
	n := 0
	for _, t := range ts {
		t.mu.Lock()
		n += t.sweep(cutoff)
		t.mu.Unlock()
	}
	return n
}

// PrefillComplete clears a request's remaining prefill tokens. Repeating it
// does nothing; an unknown request is ErrNotFound.
func (l *Loads) PrefillComplete(key indexer.Key, id string) error {
	first, err := l.prefillComplete(key, id)
	if err != nil {
		return err
	}
	if first {
		l.notify(Lifecycle{Kind: LifecyclePrefillComplete, Key: key, Booking: Booking{ID: id}})
	}
	return nil
}

// prefillComplete reports whether this was the request's first completion.
func (l *Loads) prefillComplete(key indexer.Key, id string) (first bool, err error) {
	err = l.withRequest(key, id, true, func(_ *tracker, r *request) {
		first = !r.prefillDone
		r.rank.prefill -= r.prefill
		r.prefill, r.prefillDone = 0, true
	})
	return first, err
}

// withRequest runs fn on request id of key under its tracker's lock. An
// unknown key is ErrNotFound; an unknown request is too when must, else fn
// is not called.
func (l *Loads) withRequest(key indexer.Key, id string, must bool, fn func(*tracker, *request)) error {
	t, err := l.trackerOrErr(key)
	if err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	r := t.reqs[id]
	if r == nil {
		if must {
			return fmt.Errorf("%w: request %q is not active", ErrNotFound, id)
		}
		return nil
	}
	fn(t, r)
	return nil
}

// OutputBlock adds one output block to a request's decode load, weighted
// 1 - decay (decay in [0, 1]: 0 counts a whole block). An unknown request
// is ErrNotFound.
func (l *Loads) OutputBlock(key indexer.Key, id string, decay float64) error {
	if !(decay >= 0 && decay <= 1) {
		return fmt.Errorf("%w: decay_fraction %v is not in [0, 1]", ErrInvalid, decay)
	}
	return l.withRequest(key, id, true, func(_ *tracker, r *request) {
		r.output += 1 - decay
		r.rank.output += 1 - decay
	})
}

// Free releases a request. It is idempotent: an unknown request id is not
// an error, an unknown (model, tenant) is ErrNotFound. It reports whether
// the request was active.
func (l *Loads) Free(key indexer.Key, id string) (bool, error) {
	freed, err := l.free(key, id)
	if freed {
		l.notify(Lifecycle{Kind: LifecycleFree, Key: key, Booking: Booking{ID: id}})
	}
	return freed, err
}

func (l *Loads) free(key indexer.Key, id string) (freed bool, err error) {
	err = l.withRequest(key, id, false, func(t *tracker, r *request) {
		t.release(id, r)
		freed = true
	})
	return freed, err
}

// Snapshot returns the load of every known rank of model and tenant (""
// matches any), sorted by model, tenant, worker and rank.
func (l *Loads) Snapshot(model, tenant string) []Load {
	l.mu.RLock()
	ts := make([]*tracker, 0, len(l.trackers))
	for k, t := range l.trackers {
		if (model == "" || k.Model == model) && (tenant == "" || k.Tenant == tenant) {
			ts = append(ts, t)
		}
	}
	l.mu.RUnlock()
	var out []Load
	for _, t := range ts {
		t.mu.Lock()
		for _, rl := range t.ranks {
			out = append(out, Load{Key: t.key, Worker: rl.wr, PrefillTokens: rl.prefill, DecodeBlocks: float64(rl.blocks) + rl.output, Requests: rl.reqs})
		}
		t.mu.Unlock()
	}
	slices.SortFunc(out, func(a, b Load) int {
		return cmp.Or(strings.Compare(a.Key.Model, b.Key.Model), strings.Compare(a.Key.Tenant, b.Key.Tenant),
			cmp.Compare(a.Worker.Worker, b.Worker.Worker), cmp.Compare(a.Worker.Rank, b.Worker.Rank))
	})
	return out
}

// Potential is the projected load of a rank if a request were added to it.
type Potential struct {
	Worker        indexer.WorkerRank
	PrefillTokens int64
	DecodeBlocks  float64
}

// Potentials projects, for every known rank of key, its load with a request
// of hashes (sequence hashes) and newPrefill uncached tokens added: prefill
// grows by newPrefill, decode blocks by the prompt blocks the rank's active
// requests do not already hold.
func (l *Loads) Potentials(key indexer.Key, hashes []uint64, newPrefill int64) ([]Potential, error) {
	t, err := l.trackerOrErr(key)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.countHeld(hashes)
	out := make([]Potential, 0, len(t.order))
	for _, rl := range t.order {
		out = append(out, Potential{Worker: rl.wr, PrefillTokens: rl.prefill + newPrefill,
			DecodeBlocks: float64(rl.blocks) + rl.output + float64(len(hashes)-t.held(rl))})
	}
	return out, nil
}

// countHeld counts, for every rank, how many of hashes its active requests
// hold; read the counts with held until the next call. Call with t.mu held.
func (t *tracker) countHeld(hashes []uint64) {
	t.pass++ // a new pass: counts of older passes read as 0
	for _, h := range hashes {
		for _, ref := range t.holders[h] {
			rl := ref.rank
			if rl.mark != t.pass {
				rl.mark, rl.seen = t.pass, 0
			}
			rl.seen++
		}
	}
}

// held returns the count of the tracker's last countHeld pass.
func (t *tracker) held(rl *rankLoad) int {
	if rl.mark != t.pass {
		return 0
	}
	return rl.seen
}
