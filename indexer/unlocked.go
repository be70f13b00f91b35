//go:build unlockedmatch

package indexer

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// unlockedMatches is set in a binary built with -tags unlockedmatch: a
// measuring instrument for benchmarks, never for use. Its matches take no
// lock and do not wait for writers, but read the tree while writers
// change it: they may see a torn state, and answer wrong, and a match
// that faults on what it read is run again (see doUnlocked). A torn read
// may also, rarely, leave a pointer past the object it was read from,
// which the garbage collector may take for a bad pointer and end the
// process. It times what any scheme of reads that never wait for a writer
// could reach at best, on the same tree (see bench/indexload).
const unlockedMatches = true

// maxTornRuns bounds how often an unlocked match is run again after a
// fault, before it is run under mu: a fault on every run is a bug, not a
// torn read, and the run under mu then shows it.
const maxTornRuns = 100

// doUnlocked runs the match without mu, again (after letting other
// goroutines run: a writer stopped in the middle of a step, say) until
// it does not fault, at most maxTornRuns times; then under mu. Each run
// again is counted in m.clock (MatchPhases.Again), and the time of those
// that faulted is booked as the match's wait.
func (m *matcher) doUnlocked() {
	at := len(m.dst)
	for range maxTornRuns {
		if m.tryUnlocked() {
			return
		}
		m.dst = m.dst[:at]
		m.clock.ranAgain()
		runtime.Gosched()
	}
	m.ix.mu.RLock()
	defer m.ix.mu.RUnlock()
	m.do()
}

// tryUnlocked runs the match without mu, and reports whether it ran
// through: a match reading a torn state may index out of range, read
// past a slice whose header it read torn, or walk in a cycle (see the
// count of spans in runTree.match).
func (m *matcher) tryUnlocked() (ok bool) {
	old := debug.SetPanicOnFault(true)
	defer func() {
		debug.SetPanicOnFault(old)
		if r := recover(); r != nil {
			if _, runtimeErr := r.(runtime.Error); !runtimeErr && r != errTorn {
				panic(fmt.Sprintf("indexer: unlocked match: %v", r)) // not a torn read
			}
			ok = false
		}
	}()
	m.do()
	return true
}
