package catalog

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"slices"
	"strings"
)

// This file registers workers in the selection service's shape (seed 003,
// POST and PATCH /workers): a request endpoint, a DP range and a KV event
// publisher per rank, declared together. Registering a worker again
// replaces its registration (an upsert, as in the selection service).

// WorkerSpec is a worker as the selection service declares it.
type WorkerSpec struct {
	WorkerKey
	BlockSize int
	// Endpoint is where the worker's requests go: an http(s) URL or
	// host:port. Without it the worker is registered incomplete
	// (StatusIncomplete) until a WorkerPatch supplies it.
	Endpoint        string
	DPStart, DPSize uint32
	// Events are the KV event publishers' endpoints by rank; every rank
	// must be inside the DP range.
	Events map[uint32]string
	// Replay is the replay endpoint of every rank's publisher ("" for none).
	Replay string
	// Topic is the ZMQ topic prefix subscribed to on every publisher (""
	// for every topic).
	Topic  string
	Source string
}

// WorkerPatch changes the supplied fields of a registered worker.
type WorkerPatch struct {
	WorkerKey
	BlockSize       *int // must be the worker's: block sizes are fixed
	Endpoint        *string
	DPStart, DPSize *uint32 // the range [DPStart, DPStart+DPSize); the other defaults to the current one
	// Events, when not nil, replace every publisher (empty: none). A rank
	// keeping its endpoint keeps its listener and blocks.
	Events map[uint32]string
	Replay *string // for every publisher
}

// layout is what a worker registration declares.
type layout struct {
	endpoint string
	ranks    []uint32 // sorted
	events   map[uint32]Publisher
}

// rangeRanks returns the ranks of the DP range [start, start+size).
func rangeRanks(start, size uint32) ([]uint32, error) {
	if size == 0 || size > MaxDPSize {
		return nil, fmt.Errorf("%w: data_parallel_size must be between 1 and %d, not %d", ErrInvalid, MaxDPSize, size)
	}
	if uint64(start)+uint64(size) > 1<<32 {
		return nil, fmt.Errorf("%w: dp range %d+%d overflows", ErrInvalid, start, size)
	}
	ranks := make([]uint32, size)
	for i := range size {
		ranks[i] = start + i
	}
	return ranks, nil
}

// CheckRequestEndpoint checks a worker's request endpoint: an http(s) URL
// with a host, or host:port. Its error wraps ErrInvalid.
func CheckRequestEndpoint(ep string) error {
	if strings.Contains(ep, "://") {
		if u, err := url.Parse(ep); err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Hostname() != "" {
			return nil
		}
	} else if host, port, err := net.SplitHostPort(ep); err == nil && host != "" && port != "" {
		return nil
	}
	return fmt.Errorf("%w: endpoint %.80q is not an http(s) URL or host:port", ErrInvalid, ep)
}

// checkReplay checks a replay endpoint ("" for none).
func (c *Catalog) checkReplay(ep string) error {
	if ep == "" {
		return nil
	}
	if err := c.listeners.CheckEndpoint(ep); err != nil {
		return fmt.Errorf("%w: replay_endpoint: %w", ErrInvalid, err)
	}
	return nil
}

// validate checks l on its own: the endpoint, when set, and every
// publisher, which must be on one of the ranks.
func (c *Catalog) validate(l layout) error {
	if l.endpoint != "" {
		if err := CheckRequestEndpoint(l.endpoint); err != nil {
			return err
		}
	}
	for _, rank := range slices.Sorted(maps.Keys(l.events)) {
		p := l.events[rank]
		if _, found := slices.BinarySearch(l.ranks, rank); !found {
			return fmt.Errorf("%w: kv_events_endpoints rank %d is not one of the worker's dp ranks (%d..%d)",
				ErrInvalid, rank, l.ranks[0], l.ranks[len(l.ranks)-1])
		}
		if err := c.listeners.CheckEndpoint(p.Endpoint); err != nil {
			return fmt.Errorf("%w: kv_events_endpoints rank %d: %w", ErrInvalid, rank, err)
		}
		if err := c.checkReplay(p.Replay); err != nil {
			return err
		}
	}
	return nil
}

// missing returns why l is not schedulable, in the selection service's
// words (nil when complete).
func missing(l layout) []string {
	if l.endpoint == "" {
		return []string{"endpoint is required"}
	}
	return nil
}

// PutWorker registers a worker in the selection service's shape, or
// replaces the registration of an existing one: its range, request
// endpoint and publishers (a rank whose publisher goes or changes endpoint
// loses its listener and blocks; a rank leaving the range also its active
// requests). On error nothing changes, but for a failure to stop a
// listener (ErrUnavailable).
func (c *Catalog) PutWorker(s WorkerSpec) error {
	s.WorkerKey = normKey(s.WorkerKey)
	ranks, err := rangeRanks(s.DPStart, s.DPSize)
	if err != nil {
		return err
	}
	if err := c.checkReplay(s.Replay); err != nil {
		return err
	}
	l := layout{endpoint: s.Endpoint, ranks: ranks, events: make(map[uint32]Publisher, len(s.Events))}
	for rank, ep := range s.Events {
		l.events[rank] = Publisher{Endpoint: ep, Replay: s.Replay, Topic: s.Topic}
	}
	if err := c.validate(l); err != nil {
		return err
	}
	w, err := c.lock(s.WorkerKey, s.BlockSize)
	defer c.unlock()
	if err != nil {
		return err
	}
	return c.apply(w, s.WorkerKey, s.BlockSize, s.Source, l)
}

// PatchWorker changes the supplied fields of a registered worker (see
// WorkerPatch); an unknown worker is ErrNotFound. Narrowing the range drops
// the ranks left out, as PutWorker does. On error nothing changes, as for
// PutWorker.
func (c *Catalog) PatchWorker(p WorkerPatch) error {
	p.WorkerKey = normKey(p.WorkerKey)
	if p.Endpoint != nil && *p.Endpoint == "" {
		return fmt.Errorf("%w: endpoint must not be empty", ErrInvalid)
	}
	if p.Replay != nil {
		if err := c.checkReplay(*p.Replay); err != nil {
			return err
		}
	}
	c.opMu.Lock()
	c.mu.Lock()
	defer c.unlock()
	w := c.workers[p.WorkerKey]
	if w == nil {
		return fmt.Errorf("%w: %s is not registered", ErrNotFound, p.WorkerKey)
	}
	if p.BlockSize != nil {
		if err := checkBlockSize(*p.BlockSize); err != nil {
			return err
		}
	}
	if p.BlockSize != nil && *p.BlockSize != w.BlockSize {
		return fmt.Errorf("%w: %s has block_size %d, not %d", ErrConflict, p.WorkerKey, w.BlockSize, *p.BlockSize)
	}
	l, err := patched(w, p)
	if err != nil {
		return err
	}
	if err := c.validate(l); err != nil {
		return err
	}
	return c.apply(w, p.WorkerKey, w.BlockSize, w.Source, l)
}

// patched returns w's layout with p applied.
func patched(w *Worker, p WorkerPatch) (layout, error) {
	l := layout{endpoint: w.Endpoint, ranks: w.Ranks, events: maps.Clone(w.Events)}
	if p.Endpoint != nil {
		l.endpoint = *p.Endpoint
	}
	if (p.DPStart != nil || p.DPSize != nil) && len(w.Ranks) > 0 {
		start, size := w.Ranks[0], w.Ranks[len(w.Ranks)-1]-w.Ranks[0]+1
		if p.DPStart != nil {
			start = *p.DPStart
		}
		if p.DPSize != nil {
			size = *p.DPSize
		}
		var err error
		if l.ranks, err = rangeRanks(start, size); err != nil {
			return l, err
		}
		maps.DeleteFunc(l.events, func(rank uint32, _ Publisher) bool {
			_, found := slices.BinarySearch(l.ranks, rank)
			return !found
		})
	}
	if p.Events != nil {
		replay := ""
		for _, pub := range w.Events {
			replay = pub.Replay // they share one when registered in this shape
		}
		l.events = make(map[uint32]Publisher, len(p.Events))
		for rank, ep := range p.Events {
			old, ok := w.Events[rank]
			if !ok || old.Endpoint != ep {
				old = Publisher{Endpoint: ep, Replay: replay}
			}
			l.events[rank] = old
		}
	}
	if p.Replay != nil {
		for rank, pub := range l.events {
			pub.Replay = *p.Replay
			l.events[rank] = pub
		}
	}
	return l, nil
}

// apply makes worker wk (entry w, nil when new) match l, which is valid.
// Call it holding opMu and mu, after the block size checks of lock; it
// releases mu while it stops listeners.
func (c *Catalog) apply(w *Worker, wk WorkerKey, blockSize int, source string, l layout) error {
	ranks := slices.Sorted(maps.Keys(l.events))
	// One publisher (worker, rank, endpoint) feeds one index: check them
	// all before starting any.
	for _, li := range c.listeners.States() {
		if p, ok := l.events[li.Rank]; ok && li.ID == wk.ID && li.Endpoint == p.Endpoint && li.Key != wk.Key {
			return fmt.Errorf("%w: %s rank %d: publisher %s already feeds %s", ErrConflict, wk, li.Rank, p.Endpoint, li.Key)
		}
	}
	if _, err := c.set.Index(wk.Key, blockSize); err != nil {
		return fmt.Errorf("%w: %w", ErrConflict, err)
	}
	var stop []uint32 // ranks whose publisher goes or changes endpoint
	if w != nil {
		for rank, p := range w.Events {
			if q, ok := l.events[rank]; !ok || q.Endpoint != p.Endpoint {
				stop = append(stop, rank)
			}
		}
	}
	if len(stop) > 0 {
		c.mu.Unlock() // readers may go on; opMu keeps changes out
		err := c.stopRanks(wk, stop)
		c.mu.Lock()
		if err != nil {
			return fmt.Errorf("%w: stopping the listeners of %s: %w", ErrUnavailable, wk, err)
		}
		for _, rank := range stop {
			delete(w.Events, rank)
		}
	}
	for _, rank := range ranks {
		if err := c.listeners.Listen(Listener{WorkerKey: wk, Rank: rank, BlockSize: blockSize, Publisher: l.events[rank]}); err != nil {
			if len(stop) > 0 {
				c.emit(Changed, w, nil) // it lost the publishers stopped
			}
			return listenError(err)
		}
	}
	w, kind := c.add(w, wk, blockSize, source)
	var gone []uint32
	for _, rank := range w.Ranks {
		if _, found := slices.BinarySearch(l.ranks, rank); !found {
			gone = append(gone, rank)
		}
	}
	w.Endpoint = l.endpoint
	w.Ranks = slices.Clone(l.ranks)
	w.Events = l.events
	w.NotSchedulable = missing(l)
	c.emit(kind, w, gone)
	c.log.Info("registered worker", "model", wk.Key.Model, "tenant", wk.Key.Tenant, "worker", wk.ID, "endpoint", l.endpoint,
		"dp_start", w.Ranks[0], "dp_size", len(w.Ranks), "kv_events_ranks", ranks, "source", w.Source, "not_schedulable_reasons", w.NotSchedulable)
	return nil
}

// stopRanks stops the listeners of ranks of wk and drops their blocks.
func (c *Catalog) stopRanks(wk WorkerKey, ranks []uint32) error {
	ctx, cancel := context.WithTimeout(context.Background(), c.opts.UnregisterTimeout)
	defer cancel()
	var errs []error
	for _, rank := range ranks {
		if err := c.listeners.Stop(ctx, wk, &rank); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
