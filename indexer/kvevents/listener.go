package kvevents

import (
	"context"
	"github.com/kvgate/kvgate/indexer"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// This file is a listener's life: its replay cursor, start, stop and pause,
// and the loop that connects, consumes and reconnects with backoff.

// mark is a publisher's replay cursor. Only the publisher's running
// listener writes it (one at a time: a listener is stopped before its
// successor starts); last may be read from anywhere.
type mark struct {
	next  atomic.Uint64 // 1 + last applied sequence number; 0: none yet
	epoch string        // SGLang's topic epoch, when it sends one
	// armed allows one full-buffer resync after an event with an unknown
	// parent; a new connection, a gap or a restart arm it, a resync
	// disarms it, so parents the engine no longer has cost one resync, not
	// one per batch.
	armed bool
	// unknown is 1 + the sequence number of the latest batch with an event
	// whose parent was unknown (set from the apply goroutines).
	unknown atomic.Uint64

	mu    sync.Mutex
	ranks map[uint32]bool // ranks the publisher's batches named
}

func (m *mark) addRank(r uint32) {
	m.mu.Lock()
	m.ranks[r] = true
	m.mu.Unlock()
}

func (m *mark) rankList() []uint32 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Sorted(maps.Keys(m.ranks))
}

func (m *mark) last() (seq uint64, ok bool) {
	n := m.next.Load()
	return n - 1, n > 0
}

// listener consumes one publisher.
type listener struct {
	g    *Ingester
	reg  Registration
	ix   *indexer.Index
	mark *mark

	mu        sync.Mutex
	status    ListenerStatus
	lastError string
	cancel    context.CancelFunc
	done      chan struct{}

	// Used only by the run goroutine.
	dec     decoder
	objects map[uint64]object // Mooncake objects by key hash
	limiter logLimiter
}

// object is what a listener remembers of a Mooncake store object, to apply
// its BlockUpdateEvents, which name it by key only.
type object struct {
	block     indexer.Block
	parent    uint64
	hasParent bool
	tiers     indexer.Tier
}

func (l *listener) start() {
	ctx, cancel := context.WithCancel(l.g.ctx)
	done := make(chan struct{})
	l.mu.Lock()
	l.cancel, l.done = cancel, done
	l.mu.Unlock()
	go func() {
		defer close(done)
		l.run(ctx)
	}()
}

// stop stops the run goroutine, if any, and waits until it has exited,
// however many callers stop it at once. It returns the stopped
// goroutine's done channel (nil if none ran).
func (l *listener) stop() chan struct{} {
	l.mu.Lock()
	cancel, done := l.cancel, l.done
	l.mu.Unlock()
	if done == nil {
		return nil
	}
	cancel()
	<-done
	return done
}

// running reports whether a run goroutine exists and has not exited; one
// being stopped still counts, so it is never started twice.
func (l *listener) running() bool {
	l.mu.Lock()
	done := l.done
	l.mu.Unlock()
	if done == nil {
		return false
	}
	select {
	case <-done:
		return false
	default:
		return true
	}
}

// pausedAfter marks the listener paused, unless it was restarted after the
// goroutine of done stopped.
func (l *listener) pausedAfter(done chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.done == done {
		l.status = StatusPaused
		l.g.gen.Add(1)
	}
}

func (l *listener) setStatus(s ListenerStatus, lastError string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.status != s {
		l.g.m.transitions.WithLabelValues(string(s)).Inc()
		l.g.gen.Add(1)
	}
	l.status = s
	if s != StatusPaused {
		l.lastError = lastError
	}
}

func (l *listener) info() ListenerInfo {
	l.mu.Lock()
	info := ListenerInfo{Registration: l.reg, Status: l.status, LastError: l.lastError}
	l.mu.Unlock()
	info.Seq, info.HasSeq = l.mark.last()
	return info
}

// run connects, consumes until the connection breaks, and reconnects with
// backoff, until ctx ends.
func (l *listener) run(ctx context.Context) {
	failures := 0
	for {
		sub, err := l.dial(ctx)
		if ctx.Err() != nil {
			if err == nil {
				closeSocket(sub)
			}
			return
		}
		if err == nil {
			failures = 0
			l.setStatus(StatusActive, "")
			l.g.log.Info("kv event listener connected", "worker", l.reg.Worker, "rank", l.reg.Rank, "endpoint", l.reg.Endpoint)
			err = l.consume(ctx, sub)
			closeSocket(sub)
			if ctx.Err() != nil {
				return
			}
			l.g.m.reconnects.Inc()
			l.g.log.Warn("kv event listener disconnected", "worker", l.reg.Worker, "rank", l.reg.Rank, "endpoint", l.reg.Endpoint, "err", err)
		}
		failures++
		status := StatusPending
		if failures >= l.g.opts.FailAfter {
			status = StatusFailed
		}
		l.setStatus(status, err.Error())
		wait := l.g.opts.MinBackoff << min(failures-1, 20)
		if wait > l.g.opts.MaxBackoff || wait <= 0 {
			wait = l.g.opts.MaxBackoff
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}
