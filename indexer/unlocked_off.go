//go:build !unlockedmatch

package indexer

// unlockedMatches is not set: matches take mu (see unlocked.go).
const unlockedMatches = false

// doUnlocked is never called: matches take mu.
func (m *matcher) doUnlocked() { panic("indexer: built without -tags unlockedmatch") }
