package indexer

// Test hooks: methods only tests use, kept out of the production files.

// len returns how many heads the table holds.
func (t *headTable) len() int {
	if t.zero {
		return t.n + 1
	}
	return t.n
}
