package indexer

// Interface is the contract of a KV block index of one (model, tenant):
// which worker ranks hold which blocks, on which tiers. Index implements
// it for speed, with a sharded, path-compressed tree; package
// indexer/reference implements it as plainly as it can be written, with
// maps and a mutex; the tests apply the same events to both and compare
// them after every step.
//
// A block is known by its key, the sequence hash of the prompt's prefix
// that ends with it (see SequenceHashes): a root block's key is its local
// hash, another's follows from its parent's key and its own local hash
// (NextSequenceHash). A worker rank holds a block on one tier or more,
// and names it with one engine id or more, the ids of Event.Blocks and
// Event.IDs; an engine id names one block. Implementations are safe
// for concurrent use; events of one rank must be applied in order.
type Interface interface {
	// Apply applies one event. On error (ErrBadEvent, ErrUnknownParent)
	// the index is unchanged.
	//
	// Stored: block i is the child of block i-1, block 0 of the block
	// the rank names Parent (ErrUnknownParent if it names none), or a
	// root. Each id comes to name its block, and the rank to hold the
	// block on Tier: Stored counts the (block, tier) entries that are
	// new. An id that named another block takes that one off every tier
	// first, counted in Removed. A rank's first Stored event makes it.
	//
	// Stored with ByID: Tier is added to the blocks the ids name where
	// the rank holds them on some tier, counted in Stored; the other ids
	// are counted Unknown.
	//
	// Removed: one id after the other, Tier comes off the block the id
	// names, and the id goes if the rank then holds that block on no
	// tier. Removed counts the ids whose block was on Tier, Unknown the
	// others.
	//
	// Cleared: the tiers in Tier come off every block the rank names, and
	// ids go, as for Removed; Removed counts the (block, tier) entries
	// that went.
	Apply(Event) (ApplyResult, error)

	// Match appends to dst, in no particular order, an Overlap for each
	// rank that holds seq[0] on some tier, and returns the extended
	// slice. seq is a prompt's block keys. For each tier class (device;
	// device or host; any), an Overlap counts seq's blocks, from the
	// first, that the rank holds on a tier of the class; Blocks is how
	// many engine ids the rank uses (see BlockCounts).
	Match(seq []uint64, dst []Overlap) []Overlap

	// RemoveWorker drops every rank of the worker; a match never sees
	// one half removed.
	RemoveWorker(worker uint64)
	// RemoveWorkerRank drops one rank; a match never sees it half
	// removed.
	RemoveWorkerRank(WorkerRank)

	// BlockCounts returns how many engine ids each rank uses, for every
	// rank made and not removed.
	BlockCounts() map[WorkerRank]int
	// Stats returns the index's size: Workers and Entries count the
	// ranks and their engine ids, as BlockCounts does; Nodes counts
	// blocks as the implementation keeps them.
	Stats() Stats

	// Dump returns Stored events from which Load, into an empty index,
	// rebuilds one that matches every prompt as this one does. A block
	// that a rank holds without every block from a root to it, which no
	// match of the rank reaches, is left out, and with it its engine ids
	// (in BlockCounts and Overlap.Blocks).
	Dump() []Event
	// Load applies the Stored events of a dump in order. Events whose
	// parent is unknown are skipped and counted; any other error stops
	// the load.
	Load(events []Event) (skipped int, err error)

	// BlockSize returns the number of tokens per block.
	BlockSize() int
}

var _ Interface = (*Index)(nil)
