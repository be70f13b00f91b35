//go:build matchphases

package indexer

import (
	"sync/atomic"
	"time"
)

// phaseHook is a shard's observer of its matches' phases, built with
// -tags matchphases (see Index.ObservePhases).
type phaseHook struct {
	f atomic.Pointer[func(MatchPhases)]
}

// set makes f the observer (nil: none) and reports true: phases are timed.
func (h *phaseHook) set(f func(MatchPhases)) bool {
	if f == nil {
		h.f.Store(nil)
	} else {
		h.f.Store(&f)
	}
	return true
}

// phaseClock times the phases of one match of one shard.
type phaseClock struct {
	f    *func(MatchPhases)
	last time.Time
	d    [nPhases]time.Duration
}

// begin starts timing a match, if there is an observer.
func (h *phaseHook) begin() phaseClock {
	f := h.f.Load()
	if f == nil {
		return phaseClock{}
	}
	return phaseClock{f: f, last: time.Now()}
}

// lap ends phase i: it took the time since the last lap (or begin).
func (c *phaseClock) lap(i int) {
	if c.f == nil {
		return
	}
	now := time.Now()
	c.d[i] += now.Sub(c.last)
	c.last = now
}

// done reports the match's phases, and ranks, the Overlaps it appended.
func (c *phaseClock) done(ranks int) {
	if c.f == nil {
		return
	}
	(*c.f)(MatchPhases{Wait: c.d[phaseWait], Start: c.d[phaseStart], Walk: c.d[phaseWalk], Emit: c.d[phaseEmit], Ranks: ranks})
}
