//go:build unlockedmatch

package indexer

import "runtime/debug"

// unlockedMatches is set in a binary built with -tags unlockedmatch: a
// measuring instrument, never for use. Its matches take no lock and do
// not wait for writers, but read the tree while writers change it: they
// may see a torn state, and answer wrong, and a match that faults on
// what it read is run again (see doUnlocked). It times what any scheme
// of reads that never wait for a writer could reach at best, on the
// same tree (see bench/indexload's -tags unlockedmatch).
const unlockedMatches = true

// doUnlocked runs the match without mu, again until it does not fault.
func (m *matcher) doUnlocked() {
	at := len(m.dst)
	for !m.tryUnlocked() {
		m.dst = m.dst[:at]
	}
}

// tryUnlocked runs the match without mu, and reports whether it ran
// through: a match reading a torn state may index out of range, read
// memory freed meanwhile, or walk in a cycle (see walkGuard).
func (m *matcher) tryUnlocked() (ok bool) {
	old := debug.SetPanicOnFault(true)
	defer func() {
		debug.SetPanicOnFault(old)
		if recover() != nil {
			ok = false
		}
	}()
	m.do()
	return true
}
