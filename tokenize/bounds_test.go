package tokenize

import (
	"testing"

	"github.com/kvgate/kvgate/indexer"
)

// TestMaxBlockSizeIsTheIndexes: a model's block_size has the index's
// bound, which this package states again rather than import the index.
func TestMaxBlockSizeIsTheIndexes(t *testing.T) {
	if maxBlockSize != indexer.MaxBlockSize {
		t.Fatalf("maxBlockSize %d, indexer.MaxBlockSize %d", maxBlockSize, indexer.MaxBlockSize)
	}
}
