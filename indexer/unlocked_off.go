//go:build !unlockedmatch

package indexer

// unlockedMatches is not set: matches take mu (see unlocked.go).
const unlockedMatches = false

func (m *matcher) doUnlocked() { panic("indexer: built without -tags unlockedmatch") }
