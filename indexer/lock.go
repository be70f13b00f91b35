package indexer

import (
	"runtime"
	"time"
)

// How writers and matches share a shard's lock, mu.
//
// A writer holds mu exclusively for writeChunk blocks, and the step that
// reaches it (at most maxStretch blocks: see runTree.yield), at most; it
// calls relax after each step.
// A match that finds mu free takes it shared. One that finds it held by a
// writer, where the shard has a spare core (shard.spare), hands itself to
// that writer (handOver): it publishes itself in shard.handed and spins,
// and the writer runs it after its current step (serve), on its own core.
// The match so waits for the writer's current step, not for the writer
// to let mu go and for Go to
// wake the match's goroutine, and it runs where the blocks the writer
// just wrote are in cache. If mu comes free first, the match takes itself
// back and runs itself; if no writer takes it within handWait, or the
// writer finishes no step for stallWait, it waits for mu as the others
// do. So does a match that finds itself on the CPU the writer took mu on
// (shard.cpu), without handing itself over: mostly, the system has put it
// there, so the writer, whose CPU it took, is waiting for it, and would
// wait for as long as it spun. (The writer may have moved since; the
// match then only waits for mu where it could have been handed over.)
// Only one match at a time is handed over; others wait for mu and tell
// the writer (shard.waiting), which then lets mu go early (relax).
//
// Writers take mu by spinning (lock), for a while, rather than by
// sleeping: Go wakes a goroutine that slept on a lock on the core of the
// goroutine that let the lock go, so a writer woken by a match would
// hold mu without running until that core was free, while the match's
// goroutine went on to spin in its next hand-over.

// yieldChunk bounds how many blocks writers apply, at least, between two
// yields of the lock to waiting matches (see shard.yieldAfter), so that
// matches back to back do not starve them. Smaller cuts the latency of
// matches back to back and costs apply throughput under them.
const yieldChunk = 1 << maxYieldShift

// maxYieldShift is the largest shard.yieldShift.
const maxYieldShift = 5

// serveAfter is how many blocks writers apply per handed match they run,
// over time, so that matches back to back do not starve them. Larger
// makes such matches wait longer, and lets writers apply more under them.
const serveAfter = 8

// serveBurst bounds the credit writers build up for handed matches
// (shard.serveCredit): each block adds one, up to serveBurst, and each
// handed match run takes serveAfter. After a spell without matches,
// writers so run the next serveBurst/serveAfter or so at once, one per
// step: matches that come now and then, as a router's do, wait for the
// writer's current step only, and matches back to back get one run
// every serveAfter blocks.
const serveBurst = writeChunk

// handWait is how long a handed match waits for a writer to run it (see
// shard.handWait), if mu does not come free meanwhile, before it waits for
// mu instead: a writer that does not reach its next step by then is not
// running.
const handWait = 50 * time.Microsecond

// stallWait is how long a handed match waits for a writer that finishes
// no step (see shard.steps), at most, before it waits for mu instead. A
// step takes a few microseconds, so such a writer is not finishing steps:
// mostly the system has taken its core from it (or it waits in relax for
// matches to let mu go, where waiting for mu does as well). The match then
// stops spinning, and the system may run the writer on the core the match
// leaves. Shorter
// also gives up on the writer through the machine's brief hold-ups (see
// -holdups in bench/indexload), after which the match must be woken; a
// shorter handWait would give up on writers that are running, too (see
// BENCHMARKS.md, twenty-fourth session).
const stallWait = 25 * time.Microsecond

// lockSpin is how long a writer spins for mu, at most, before it sleeps
// on it, and so keeps new matches out: matches coming back to back
// could keep it from ever finding mu free.
const lockSpin = 100 * time.Microsecond

// relax is called by a writer holding mu after each step of an operation
// (see runTree.yield), with n the blocks the step applied; shard.held
// counts the blocks it applied since it took mu, n not included. It
// first runs the match handed to it, if any, if writers have the credit
// for it (see serveBurst). Once held reaches writeChunk, or a match waits
// for mu and writers have applied yieldAfter blocks since they last
// yielded to one, relax releases mu (see unlock) and takes it again.
// Only matches and other readers run meanwhile (writers take turns on
// shard.write), so what the writer knew still holds. Where no match waits
// and the shard has no spare core, it also gives up its core in between
// (runtime.Gosched) to any goroutine waiting for one.
func (ix *shard) relax(n int) {
	ix.steps.Store(ix.steps.Load() + 1) // only the writer holding mu writes it
	ix.held += n
	ix.sinceYield += n
	ix.serveCredit = min(ix.serveCredit+n, serveBurst)
	if m := ix.handed.Load(); m != nil && ix.serveCredit >= serveAfter {
		ix.serve(m)
	}
	waiting := ix.waiting.Load() != 0
	switch {
	case !waiting:
		ix.arrived = 0 // a match seen waiting got mu as the writer let it go
	case ix.arrived == 0:
		ix.arrived = ix.sinceYield
	}
	if ix.held >= writeChunk || waiting && ix.sinceYield >= ix.yieldAfter() {
		if waiting {
			switch {
			case ix.arrived > yieldChunk && ix.yieldShift > 0:
				ix.yieldShift--
			case ix.arrived <= yieldChunk && ix.yieldShift < maxYieldShift:
				ix.yieldShift++
			}
			ix.sinceYield, ix.arrived = 0, 0
		}
		ix.unlock()
		if waiting {
			// The matches Unlock woke wait for this core: sleep, and let
			// them have it.
			ix.mu.Lock()
			ix.noteCPU()
		} else {
			if !ix.spare {
				runtime.Gosched()
			}
			ix.lock()
		}
	}
}

// yieldAfter is how many blocks writers apply, at least, between two
// yields of mu to waiting matches: 1 while matches come now and then, as
// a router's do, so that one waits for the writer's current step only;
// doubling, up to yieldChunk, with each match that comes within
// yieldChunk blocks of the last yield (matches back to back), and halving
// with each that comes later.
func (ix *shard) yieldAfter() int { return 1 << ix.yieldShift }

// lock takes mu for a writer: where matches are handed over, by spinning
// for up to lockSpin, and then by sleeping, and it then notes the CPU it
// runs on (shard.cpu).
func (ix *shard) lock() {
	if !ix.spare {
		ix.mu.Lock()
		return
	}
	var timer handTimer // it reads the clock every 1024 turns
	for i := 1; !ix.mu.TryLock(); i++ {
		if i%1024 == 0 && timer.expired(ix.now(), 0, lockSpin, lockSpin) {
			ix.mu.Lock()
			break
		}
	}
	ix.noteCPU()
}

// noteCPU notes, for a writer that has just taken mu, the CPU it runs on
// (shard.cpu), where matches are handed over.
func (ix *shard) noteCPU() {
	if ix.spare {
		ix.cpu.Store(ix.onCPU())
	}
}

// unlock releases mu, taken by a writer, and resets held: whoever takes
// mu next has applied no blocks under it yet.
func (ix *shard) unlock() {
	ix.held = 0
	ix.mu.Unlock()
}

// rlock takes mu for reading, found held by a writer (a TryRLock
// failed), telling writers that a match waits.
func (ix *shard) rlock() {
	ix.waiting.Add(1)
	ix.mu.RLock()
	ix.waiting.Add(-1)
}

// The states of a handed match (matcher.state).
const (
	handPending = iota
	handDone
)

// handOver hands m, which found mu held by a writer, to that writer,
// which runs it (see serve), and spins until it has. If mu comes free
// first, it takes m back and runs it itself. It reports whether m ran:
// false if matches are not handed over, another is, m runs on the CPU the
// writer took mu on, or no writer took m within ix.handWait, or its
// writer finished no step for ix.stallWait (m is then not run; the caller
// waits for mu).
func (ix *shard) handOver(m *matcher) bool {
	if !ix.spare {
		m.clock.via(PathBusy)
		return false
	}
	if cpu := ix.onCPU(); cpu >= 0 && cpu == ix.cpu.Load() {
		// The system runs this match on the CPU the writer took mu on,
		// so the writer is most likely waiting for it: spinning would
		// keep it waiting.
		m.clock.via(PathSameCPU)
		return false
	}
	m.state.Store(handPending)
	if !ix.handed.CompareAndSwap(nil, m) {
		m.clock.via(PathBusy)
		return false
	}
	var timer handTimer
	for i := 1; ; i++ {
		if m.state.Load() == handDone {
			return true
		}
		if i%32 != 0 {
			continue
		}
		if ix.mu.TryRLock() {
			if ix.handed.CompareAndSwap(m, nil) {
				m.clock.via(PathTakenBack)
				m.do()
				ix.mu.RUnlock()
				return true
			}
			// A writer took m, and ran it before it let mu go.
			ix.mu.RUnlock()
			continue
		}
		if i%1024 != 0 || !timer.expired(ix.now(), ix.steps.Load(), ix.handWait, ix.stallWait) {
			continue
		}
		if ix.handed.CompareAndSwap(m, nil) {
			m.clock.via(PathHandGaveUp)
			return false
		}
		for m.state.Load() != handDone { // a writer is running it
			runtime.Gosched()
		}
		return true
	}
}

// handTimer tells a handed match when to stop waiting for the writer
// (see handOver), and a writer when to stop spinning for mu (lock, with
// no steps to count).
type handTimer struct {
	since time.Time // the first reading
	still time.Time // when the writer's step count last changed
	seen  uint32    // that count
}

// expired reports, with now read from the clock and steps the writer's
// step count, whether the match has waited handWait since the first
// reading, or stallWait without the writer finishing a step.
func (h *handTimer) expired(now time.Time, steps uint32, handWait, stallWait time.Duration) bool {
	if h.since.IsZero() {
		h.since, h.still, h.seen = now, now, steps
		return false
	}
	if steps != h.seen {
		h.still, h.seen = now, steps
	}
	return now.Sub(h.since) >= handWait || now.Sub(h.still) >= stallWait
}

// serve runs m, handed to the shard, unless it was taken back: called by
// a writer holding mu, between two steps.
func (ix *shard) serve(m *matcher) {
	if ix.handed.CompareAndSwap(m, nil) {
		ix.run(m)
	}
}

// run runs m, which a writer holding mu has taken from shard.handed, and
// tells it so.
func (ix *shard) run(m *matcher) {
	m.do()
	m.clock.via(PathHanded)
	m.state.Store(handDone)
	ix.serveCredit -= serveAfter
	ix.handedRuns.Add(1)
}
