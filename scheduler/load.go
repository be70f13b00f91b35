package scheduler

import (
	"cmp"
	"fmt"
	"math/bits"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/indexer"
	"github.com/kvgate/kvgate/scheduler/catalog"
)

// This file is the active-load accounting (the slot tracker of
// docs/scheduling.md): per (model, tenant), the requests booked on
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
	// Chained says Hashes are the request's own sequence hashes, chained
	// from the first block (docs/hashing.md), as the scheduler
	// derives them from local hashes: each names its whole prefix, so the
	// hashes of two chained lists agree up to their first difference and
	// never after it, and a decision counting the blocks of a chained
	// prompt held by this request stops there. Hashes a client gives are
	// not taken to be chained.
	Chained bool
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
	// expired counts the requests freed for their age, by every sweep.
	expired atomic.Uint64

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
	find  rankTable   // the ranks again, for the lookups of a decision
	reqs  map[string]*request
	byAge ageHeap // the requests of reqs, oldest first, for expiry
	// holders lists, per sequence hash, the ranks whose active requests
	// hold it, each once (the reference counts are in rankLoad.held): the
	// held blocks of a prompt on every rank are found in one pass over its
	// hashes.
	holders map[uint64][]*rankLoad
	pass    uint64 // the current pass (see begin)
	counts  uint64 // countHeld's current pass
	// negative counts the ranks whose output went below 0 (float residue
	// of releases): a decision's cost bounds assume there are none.
	negative int
	expired  *atomic.Uint64 // Loads.expired
}

// rankLoad is the load of one rank. What a decision reads of every rank
// comes first, to share a cache line (64 bytes, to held.n).
type rankLoad struct {
	wr      indexer.WorkerRank
	prefill int64
	output  float64 // weighted output blocks
	// ovMark and ovAt: when ovMark is the tracker's pass (see
	// tracker.begin), the rank's overlap is the decision's overlaps[ovAt].
	ovMark uint64
	ovAt   int32
	// schedulable says whether the worker is schedulable in the catalog's
	// View schedView (see costing.eligible).
	schedulable bool
	schedView   *catalog.View
	// held counts, per unique sequence hash held by active requests, the
	// references to it, and keeps the rank's position in tracker.holders.
	held hashRefs
	// mark: countHeld's count of prompt hashes held (seen) is valid when
	// it equals the tracker's counts pass (see tracker.countHeld).
	mark uint64
	seen int
	// pos is the index in tracker.order, head the worker's first rank
	// there, which keeps the worker's eligibility for a decision, valid
	// when eligMark is the pass.
	pos      int
	head     *rankLoad
	eligMark uint64
	eligible bool

	reqs int
	// active are the rank's requests (request.at is the index), refs the
	// sum of their hashes: refs == held.len() when no hash is held twice.
	active []*request
	refs   int
}

// blocks returns the number of unique sequence hashes the rank's active
// requests hold.
func (rl *rankLoad) blocks() int { return rl.held.len() }

type request struct {
	id      string
	rank    *rankLoad
	hashes  []uint64
	prefill int64 // remaining prefill tokens; 0 once prefill completed
	// prefillDone is set by the first prefill completion.
	prefillDone bool
	chained     bool // Booking.Chained
	output      float64
	added       time.Time
	age         int // position in tracker.byAge
	at          int // position in rank.active
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
// ev.Booking.ID. It reports whether it changed anything (a repeated
// prefill completion, or a free of a request not active, does not).
// Errors are those of Add, PrefillComplete and Free.
func (l *Loads) Apply(ev Lifecycle) (changed bool, err error) {
	switch ev.Kind {
	case LifecycleAdd:
		err := l.add(ev.Key, ev.Booking)
		return err == nil, err
	case LifecyclePrefillComplete:
		return l.prefillComplete(ev.Key, ev.Booking.ID)
	case LifecycleFree:
		return l.free(ev.Key, ev.Booking.ID)
	}
	return false, fmt.Errorf("%w: lifecycle kind %d", ErrInvalid, ev.Kind)
}

func (l *Loads) tracker(key indexer.Key) *tracker {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.trackers[key]
}

// BlockSize returns the block size of key's ranks, and false when no rank
// of key was ever known.
func (l *Loads) BlockSize(key indexer.Key) (int, bool) {
	if t := l.tracker(key); t != nil {
		return t.blockSize, true
	}
	return 0, false
}

func (l *Loads) trackerOrErr(key indexer.Key) (*tracker, error) {
	t := l.tracker(key)
	if t == nil {
		return nil, fmt.Errorf("%w: no worker registered for model_name %q tenant_id %q", ErrNotFound, key.Model, key.Tenant)
	}
	return t, nil
}

// addRanks makes worker ranks known to key's tracker, creating it with
// blockSize if needed. Ranks already known keep their load.
func (l *Loads) addRanks(key indexer.Key, blockSize int, ranks ...indexer.WorkerRank) {
	l.mu.Lock()
	t := l.trackers[key]
	if t == nil {
		t = &tracker{key: key, blockSize: blockSize, expired: &l.expired, ranks: make(map[indexer.WorkerRank]*rankLoad),
			reqs: make(map[string]*request), holders: make(map[uint64][]*rankLoad)}
		l.trackers[key] = t
	}
	l.mu.Unlock()
	t.mu.Lock()
	defer t.mu.Unlock()
	added := false
	for _, wr := range ranks {
		if t.ranks[wr] == nil {
			rl := &rankLoad{wr: wr}
			t.ranks[wr] = rl
			i, _ := slices.BinarySearchFunc(t.order, wr, func(x *rankLoad, wr indexer.WorkerRank) int { return cmpRank(x.wr, wr) })
			t.order = slices.Insert(t.order, i, rl)
			added = true
		}
	}
	if added {
		t.reorder()
	}
}

// reorder updates what follows t.order: the ranks' positions and heads,
// and t.find. Call with t.mu held.
func (t *tracker) reorder() {
	for i, rl := range t.order {
		rl.pos, rl.head = i, rl
		if i > 0 && t.order[i-1].wr.Worker == rl.wr.Worker {
			rl.head = t.order[i-1].head
		}
	}
	t.find.build(t.order)
}

func cmpRank(a, b indexer.WorkerRank) int {
	return cmp.Or(cmp.Compare(a.Worker, b.Worker), cmp.Compare(a.Rank, b.Rank))
}

// Follow keeps the known ranks in step with a change of the catalog (see
// Catalog.Watch): the ranks a worker lost are forgotten with the requests
// booked on them, and its ranks are made known. When the last worker of a
// (model, tenant) is removed, its accounting goes: the key is unknown
// again, and may come back with another block size.
func (l *Loads) Follow(ch catalog.Change) {
	w := ch.Worker
	if ch.Kind == catalog.Removed {
		l.removeRanks(w.Key, w.ID, nil)
		l.dropIfEmpty(w.Key)
		return
	}
	for _, rank := range ch.Gone {
		l.removeRanks(w.Key, w.ID, &rank)
	}
	wrs := make([]indexer.WorkerRank, len(w.Ranks))
	for i, rank := range w.Ranks {
		wrs[i] = indexer.WorkerRank{Worker: w.ID, Rank: rank}
	}
	l.addRanks(w.Key, w.BlockSize, wrs...)
}

// removeRanks forgets the ranks of worker in key (one rank when rank is not
// nil) and every request booked on them.
func (l *Loads) removeRanks(key indexer.Key, worker uint64, rank *uint32) {
	t := l.tracker(key)
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, r := range t.reqs {
		if r.rank.wr.Worker == worker && (rank == nil || r.rank.wr.Rank == *rank) {
			t.release(r)
		}
	}
	for wr := range t.ranks {
		if wr.Worker == worker && (rank == nil || wr.Rank == *rank) {
			delete(t.ranks, wr)
		}
	}
	t.order = slices.DeleteFunc(t.order, func(rl *rankLoad) bool { return t.ranks[rl.wr] != rl })
	t.reorder()
}

// dropIfEmpty forgets key's tracker when it has no rank left.
func (l *Loads) dropIfEmpty(key indexer.Key) {
	l.mu.Lock()
	defer l.mu.Unlock()
	t := l.trackers[key]
	if t == nil {
		return
	}
	t.mu.Lock()
	empty := len(t.ranks) == 0
	t.mu.Unlock()
	if empty {
		delete(l.trackers, key)
	}
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
	if b.PrefillTokens < 0 || b.PrefillTokens > MaxTokens {
		return fmt.Errorf("%w: prefill tokens %d must be between 0 and %d", ErrInvalid, b.PrefillTokens, int64(MaxTokens))
	}
	if _, dup := t.reqs[b.ID]; dup {
		return fmt.Errorf("%w: request %q is already active", ErrConflict, b.ID)
	}
	rl := t.ranks[b.Worker]
	if rl == nil {
		return fmt.Errorf("%w: worker %d dp_rank %d is not registered for model_name %q tenant_id %q",
			ErrNotFound, b.Worker.Worker, b.Worker.Rank, t.key.Model, t.key.Tenant)
	}
	r := &request{id: b.ID, rank: rl, hashes: slices.Clone(b.Hashes), prefill: b.PrefillTokens, added: now, chained: b.Chained}
	rl.held.reserve(len(r.hashes))
	// A hash nobody held gets a one-slot holder list cut from slab: one
	// allocation per booking, not one per block.
	var slab []*rankLoad
	for _, h := range r.hashes {
		if e, first := rl.held.inc(h); first {
			hs := t.holders[h]
			e.pos = int32(len(hs))
			if hs == nil {
				if len(slab) == 0 {
					slab = make([]*rankLoad, len(r.hashes))
				}
				hs, slab = slab[:0:1], slab[1:]
			}
			t.holders[h] = append(hs, rl)
		}
	}
	rl.prefill = addTokens(rl.prefill, r.prefill)
	rl.reqs++
	r.at, rl.active, rl.refs = len(rl.active), append(rl.active, r), rl.refs+len(r.hashes)
	t.reqs[b.ID] = r
	t.byAge.push(r)
	return nil
}

// release removes request r's load; call with t.mu held.
func (t *tracker) release(r *request) {
	rl := r.rank
	for _, h := range r.hashes {
		i, lastRef := rl.held.dec(h)
		if !lastRef {
			continue
		}
		// The rank's last reference: swap it out of the hash's holders.
		hs := t.holders[h]
		last := len(hs) - 1
		if last == 0 {
			delete(t.holders, h)
			continue
		}
		if int(i) != last {
			hs[i] = hs[last]
			hs[i].held.get(h).pos = i
		}
		hs[last] = nil
		t.holders[h] = hs[:last]
	}
	rl.held.fit()
	rl.prefill = subTokens(rl.prefill, r.prefill)
	wasNegative := rl.output < 0
	rl.output -= r.output
	last := len(rl.active) - 1
	rl.active[r.at], rl.active[last].at = rl.active[last], r.at
	rl.active[last] = nil
	rl.active, rl.refs = rl.active[:last], rl.refs-len(r.hashes)
	if rl.reqs--; rl.reqs == 0 {
		rl.output, rl.prefill = 0, 0 // no float residue, nor a saturated sum's, once idle
	}
	if isNegative := rl.output < 0; isNegative != wasNegative {
		if isNegative {
			t.negative++
		} else {
			t.negative--
		}
	}
	delete(t.reqs, r.id)
	t.byAge.remove(r)
}

// sweep expires requests added before cutoff; call with t.mu held. It
// costs O(log n) per expired request, nothing when none is due.
func (t *tracker) sweep(cutoff time.Time) int {
	n := 0
	for len(t.byAge) > 0 && t.byAge[0].added.Before(cutoff) {
		r := t.byAge[0]
		t.release(r)
		n++
	}
	if n > 0 {
		t.expired.Add(uint64(n))
	}
	return n
}

// expiredTotal returns how many requests were freed for their age (by Expire
// or by the sweeps of bookings) since l was made: each is a free that
// never came, or came after the TTL.
func (l *Loads) expiredTotal() uint64 { return l.expired.Load() }

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
		r.rank.prefill = subTokens(r.rank.prefill, r.prefill)
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
	return l.withRequest(key, id, true, func(t *tracker, r *request) {
		r.output += 1 - decay
		rl := r.rank
		wasNegative := rl.output < 0
		if rl.output += 1 - decay; wasNegative && rl.output >= 0 {
			t.negative--
		}
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
		t.release(r)
		freed = true
	})
	return freed, err
}

// Holding returns the keys of tenant ("" matches any) with an active
// request id, sorted by model and tenant: a request id the caller scopes
// to no model may be active under several.
func (l *Loads) Holding(id, tenant string) []indexer.Key {
	l.mu.RLock()
	ts := make([]*tracker, 0, len(l.trackers))
	for k, t := range l.trackers {
		if tenant == "" || k.Tenant == tenant {
			ts = append(ts, t)
		}
	}
	l.mu.RUnlock()
	var out []indexer.Key
	for _, t := range ts {
		t.mu.Lock()
		if t.reqs[id] != nil {
			out = append(out, t.key)
		}
		t.mu.Unlock()
	}
	slices.SortFunc(out, func(a, b indexer.Key) int {
		return cmp.Or(strings.Compare(a.Model, b.Model), strings.Compare(a.Tenant, b.Tenant))
	})
	return out
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
			out = append(out, Load{Key: t.key, Worker: rl.wr, PrefillTokens: rl.prefill, DecodeBlocks: float64(rl.blocks()) + rl.output, Requests: rl.reqs})
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

// potentials projects, for every known rank of key, its load with a request
// of hashes (sequence hashes) and newPrefill uncached tokens added: prefill
// grows by newPrefill, decode blocks by the prompt blocks the rank's active
// requests do not already hold.
func (l *Loads) potentials(key indexer.Key, hashes []uint64, newPrefill int64) ([]Potential, error) {
	t, err := l.trackerOrErr(key)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.countHeld(hashes)
	out := make([]Potential, 0, len(t.order))
	for _, rl := range t.order {
		out = append(out, Potential{Worker: rl.wr, PrefillTokens: addTokens(rl.prefill, newPrefill),
			DecodeBlocks: float64(rl.blocks()) + rl.output + float64(len(hashes)-t.held(rl))})
	}
	return out, nil
}

// begin starts a new pass of a decision: the scratch of every rank from
// older ones (a decision's overlaps and eligibility) reads as unset. Call
// with t.mu held.
func (t *tracker) begin() { t.pass++ }

// countHeld counts, for every rank, how many of hashes its active requests
// hold, in one pass over the hashes' holders; read the counts with held
// until the next call. Call with t.mu held.
func (t *tracker) countHeld(hashes []uint64) {
	t.counts++ // counts of older calls read as 0
	for _, h := range hashes {
		for _, rl := range t.holders[h] {
			if rl.mark != t.counts {
				rl.mark, rl.seen = t.counts, 0
			}
			rl.seen++
		}
	}
}

// held returns rl's count of the last countHeld (0 if it held none of the
// hashes).
func (t *tracker) held(rl *rankLoad) int {
	if rl.mark != t.counts {
		return 0
	}
	return rl.seen
}

// heldOf counts how many of hashes rl's active requests hold, without
// countHeld. sc.counted(hashes) counts hashes (occurrences in refs), on
// first use; repeats says whether a hash occurs twice in them, chained
// whether they are chained sequence hashes (see Booking.Chained). It costs
// about heldCost lookups.
//
// When no hash occurs twice, in hashes or over the rank's requests, it is
// the sum over the requests of their common prefix with hashes (compared
// in order, no lookups) plus the rest of their hashes found in the prompt's
// counts, which a chained request of a chained prompt need not look up.
// Otherwise it looks up each hash of rl.held in prompt (a small table,
// so the lookups stay in cache while rl.held is read in order), or each
// of hashes in rl.held when that is much larger.
func (rl *rankLoad) heldOf(hashes []uint64, sc *scratch, repeats, chained bool) int {
	n := 0
	switch {
	case !repeats && rl.refs == rl.held.len():
		var prompt *hashRefs
		for _, r := range rl.active {
			q := r.hashes
			k := 0
			for k < len(q) && k < len(hashes) && q[k] == hashes[k] {
				k++
			}
			n += k
			if chained && r.chained {
				continue // see Booking.Chained: nothing after k matches
			}
			if prompt == nil {
				prompt = sc.counted(hashes)
			}
			for _, h := range q[k:] {
				if prompt.has(h) {
					n++
				}
			}
		}
	case len(rl.held.slots) <= scanRatio*len(hashes):
		prompt := sc.counted(hashes)
		for i := range rl.held.slots {
			if e := &rl.held.slots[i]; e.refs != 0 {
				if p := prompt.get(e.hash); p != nil {
					n += int(p.refs)
				}
			}
		}
	default:
		for _, h := range hashes {
			if rl.held.has(h) {
				n++
			}
		}
	}
	return n
}

// scanRatio is how many slots of a rank's hashRefs heldOf reads in order
// rather than look up one prompt hash at random in it.
const scanRatio = 8

// heldCost estimates the work of heldOf, in lookups.
func (rl *rankLoad) heldCost(hashes []uint64) int { return min(len(hashes), rl.held.len()) }

// hashRefs is a set of sequence hashes with a reference count and a
// position per hash: an open-addressing hash table (linear probing,
// backward-shift deletion), because a decision may look up every hash of a
// prompt in the sets of some ranks, and a map lookup is several times
// slower. The zero value is an empty set.
type hashRefs struct {
	n     int
	shift uint8     // 64 - log2(len(slots))
	slots []hashRef // nil or a power of two long, at most half full
}

// hashRef is one slot of a hashRefs; refs 0 marks a free slot.
type hashRef struct {
	hash uint64
	refs int32
	pos  int32 // the rank's index in tracker.holders[hash]
}

const minHashRefs = 8 // slots of a non-empty hashRefs, at least

func (s *hashRefs) len() int { return s.n }

// home returns the slot where h's probe sequence starts.
func (s *hashRefs) home(h uint64) int { return int((h * 0x9e3779b97f4a7c15) >> s.shift) }

// find returns the slot of h, or of the free slot that ends its probe
// sequence. The set must have slots.
func (s *hashRefs) find(h uint64) int {
	mask := len(s.slots) - 1
	i := s.home(h)
	for s.slots[i].refs != 0 && s.slots[i].hash != h {
		i = (i + 1) & mask
	}
	return i
}

// get returns the entry of h, or nil. It is valid until the next inc or
// dec.
func (s *hashRefs) get(h uint64) *hashRef {
	if s.n == 0 {
		return nil
	}
	if e := &s.slots[s.find(h)]; e.refs != 0 {
		return e
	}
	return nil
}

// has reports whether h is in the set.
func (s *hashRefs) has(h uint64) bool { return s.get(h) != nil }

// inc adds a reference to h and returns its entry (valid until the next
// inc or dec), and whether it is the first.
func (s *hashRefs) inc(h uint64) (e *hashRef, first bool) {
	if 2*(s.n+1) > len(s.slots) {
		s.resize(max(minHashRefs, 2*len(s.slots)))
	}
	e = &s.slots[s.find(h)]
	if e.refs == 0 {
		*e = hashRef{hash: h}
		s.n++
		first = true
	}
	e.refs++
	return e, first
}

// dec drops a reference to h, which must be in the set. On the last one
// it removes h and reports its position.
func (s *hashRefs) dec(h uint64) (pos int32, last bool) {
	i := s.find(h)
	if s.slots[i].refs--; s.slots[i].refs > 0 {
		return 0, false
	}
	pos = s.slots[i].pos
	s.n--
	// Backward-shift deletion: move later entries of the probe run into
	// the hole when their home slot is not between the hole and them.
	mask := len(s.slots) - 1
	for j := (i + 1) & mask; s.slots[j].refs != 0; j = (j + 1) & mask {
		if (j-s.home(s.slots[j].hash))&mask >= (j-i)&mask {
			s.slots[i] = s.slots[j]
			i = j
		}
	}
	s.slots[i] = hashRef{}
	return pos, true
}

// reserve makes room for n more hashes, so that adding them rehashes at
// most once.
func (s *hashRefs) reserve(n int) {
	if need := 2 * (s.n + n); need > len(s.slots) {
		s.resize(max(minHashRefs, 1<<bits.Len(uint(need-1))))
	}
}

// fit shrinks the slots of a set that lost most of its hashes (dec does
// not, so that removing many costs no rehash each): an empty set keeps
// none.
func (s *hashRefs) fit() {
	switch {
	case s.n == 0:
		*s = hashRefs{} // an idle rank keeps no memory
	case len(s.slots) > minHashRefs && 8*s.n < len(s.slots):
		s.resize(max(minHashRefs, 1<<bits.Len(uint(2*s.n-1))))
	}
}

// clear empties the set, keeping its slots.
func (s *hashRefs) clear() {
	if s.n > 0 {
		clear(s.slots)
		s.n = 0
	}
}

// resize rehashes the set into n slots (a power of two).
func (s *hashRefs) resize(n int) {
	old := s.slots
	s.slots = make([]hashRef, n)
	s.shift = uint8(64 - bits.TrailingZeros(uint(n)))
	for _, e := range old {
		if e.refs != 0 {
			s.slots[s.find(e.hash)] = e
		}
	}
}

// rankTable finds a tracker's ranks by WorkerRank: an open-addressing hash
// table rebuilt whenever the ranks change, because a decision looks up
// every rank the index reports, and a map lookup is several times slower.
type rankTable struct {
	slots []*rankLoad // a power of two long, at most half full; nil: free
	shift uint8
}

func (rt *rankTable) home(wr indexer.WorkerRank) int {
	return int(((wr.Worker ^ uint64(wr.Rank)<<40 ^ uint64(wr.Rank)) * 0x9e3779b97f4a7c15) >> rt.shift)
}

// build fills the table with ranks.
func (rt *rankTable) build(ranks []*rankLoad) {
	n := minHashRefs
	for n < 2*len(ranks) {
		n *= 2
	}
	if len(rt.slots) == n {
		clear(rt.slots)
	} else {
		rt.slots = make([]*rankLoad, n)
	}
	rt.shift = uint8(64 - bits.TrailingZeros(uint(n)))
	for _, rl := range ranks {
		i := rt.home(rl.wr)
		for rt.slots[i] != nil {
			i = (i + 1) & (n - 1)
		}
		rt.slots[i] = rl
	}
}

// get returns the rank wr, or nil.
func (rt *rankTable) get(wr indexer.WorkerRank) *rankLoad {
	if len(rt.slots) == 0 {
		return nil
	}
	for i := rt.home(wr); ; i = (i + 1) & (len(rt.slots) - 1) {
		rl := rt.slots[i]
		if rl == nil || rl.wr == wr {
			return rl
		}
	}
}

// ageHeap is a min-heap of requests by the time they were added, each
// knowing its position (request.age), so that expiry finds the stale ones
// without scanning every request, and a free removes its request in
// O(log n).
type ageHeap []*request

func (h *ageHeap) push(r *request) {
	r.age = len(*h)
	*h = append(*h, r)
	h.up(r.age)
}

// remove removes r, which must be in the heap.
func (h *ageHeap) remove(r *request) {
	q := *h
	i, last := r.age, len(q)-1
	if i != last {
		q.swap(i, last)
	}
	q[last] = nil
	*h = q[:last]
	if i != last {
		if !h.down(i) {
			h.up(i)
		}
	}
}

func (h ageHeap) less(i, j int) bool { return h[i].added.Before(h[j].added) }

func (h ageHeap) swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].age, h[j].age = i, j
}

func (h ageHeap) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !h.less(i, p) {
			return
		}
		h.swap(i, p)
		i = p
	}
}

// down moves element i down to its place and reports whether it moved.
func (h ageHeap) down(i int) bool {
	start := i
	for {
		c := 2*i + 1
		if c >= len(h) {
			break
		}
		if r := c + 1; r < len(h) && h.less(r, c) {
			c = r
		}
		if !h.less(c, i) {
			break
		}
		h.swap(i, c)
		i = c
	}
	return i > start
}
