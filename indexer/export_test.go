package indexer

// Test hooks: methods only tests use, kept out of the production files,
// and what the tests of package indexer_test (differential_test.go) use
// of the package's insides and its tests' helpers.

// len returns how many heads the table holds.
func (t *headTable) len() int {
	if t.zero {
		return t.n + 1
	}
	return t.n
}

// CheckInvariants fails t unless every shard's tree is consistent (see
// checkSpanTree) and its two views agree (checkViews).
func CheckInvariants(t interface {
	Helper()
	Fatalf(format string, args ...any)
}, ix *Index) {
	t.Helper()
	checkInvariants(t, ix)
}

// Paths of symbols '0'..'3', each a block of 4 tokens (see symLocal):
// BlocksOf returns the blocks of path base+blocks past base, under engine
// ids derived from their paths (PathID), and SeqOf a path's block keys.
var (
	BlocksOf = blocksOf
	SeqOf    = seqOf
	PathID   = pathID
)
