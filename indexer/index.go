package indexer

import (
	"errors"
	"fmt"
	"sync/atomic"
)

// Tier is a set of KV cache storage tiers, as a bit mask.
type Tier uint8

// The storage tiers. External storage (network, shared pools) is reported
// together with disk.
const (
	TierDevice Tier = 1 << iota // GPU / NPU memory (G1)
	TierHost                    // host memory, pinned or not (G2)
	TierDisk                    // local disk, NVMe, external storage (G3)

	// AllTiers selects every tier, e.g. in a Cleared event.
	AllTiers = TierDevice | TierHost | TierDisk
)

// String returns the tier's name in the dump format: "device",
// "host_pinned", "disk", or a "|"-joined list for several tiers.
func (t Tier) String() string {
	switch t {
	case TierDevice:
		return "device"
	case TierHost:
		return "host_pinned"
	case TierDisk:
		return "disk"
	case 0:
		return "none"
	}
	s := ""
	for _, one := range []Tier{TierDevice, TierHost, TierDisk} {
		if t&one != 0 {
			if s != "" {
				s += "|"
			}
			s += one.String()
		}
	}
	return s
}

// single reports whether t names exactly one known tier.
func (t Tier) single() bool { return t == TierDevice || t == TierHost || t == TierDisk }

// WorkerRank identifies one data-parallel rank of a worker (an engine
// instance). Every rank has its own KV cache.
type WorkerRank struct {
	Worker uint64 // the worker's instance id
	Rank   uint32 // its data-parallel rank
}

func (w WorkerRank) String() string { return fmt.Sprintf("worker %d rank %d", w.Worker, w.Rank) }

// Block is one stored KV block: the engine's opaque id for it, and the
// router's own local hash of its tokens (LocalHash).
type Block struct {
	ID    uint64 // engine block id; used only to link parents and to remove
	Local uint64 // LocalHash of the block's tokens
}

// EventKind says what an Event does.
type EventKind uint8

// The kinds of Event.
const (
	Stored  EventKind = iota + 1 // Blocks were stored under Parent
	Removed                      // IDs were evicted from Tier
	Cleared                      // every block on the tiers in Tier was dropped
)

func (k EventKind) String() string {
	switch k {
	case Stored:
		return "stored"
	case Removed:
		return "removed"
	case Cleared:
		return "cleared"
	}
	return fmt.Sprintf("EventKind(%d)", uint8(k))
}

// Event is one change to the KV cache of one worker rank, already decoded
// from its wire format and hashed.
type Event struct {
	Kind   EventKind
	Worker WorkerRank
	// Tier is the tier of a Stored or Removed event (exactly one tier), or
	// the tiers a Cleared event empties (any non-empty mask).
	Tier Tier
	// Parent is the engine id of the block before Blocks[0]; HasParent is
	// false for a sequence that starts at the root.
	Parent    uint64
	HasParent bool
	Blocks    []Block  // Stored: in order, each the child of the previous
	IDs       []uint64 // Removed: engine ids
	// ByID marks a Stored event that names blocks by engine id only, with
	// no tokens (Mooncake's store publisher reports objects that way): Tier
	// is added to those of IDs the worker rank already holds, on any
	// tier; the others are counted Unknown. Parent and Blocks are unused.
	ByID bool
}

// Errors returned by Apply. They leave the index unchanged.
var (
	// ErrUnknownParent: a Stored event names a parent block the worker rank
	// does not hold. The event cannot be placed; for a worker with a replay
	// endpoint it signals missed events.
	ErrUnknownParent = errors.New("unknown parent block")
	// ErrBadEvent: the event is malformed (unknown kind, tier, ...).
	ErrBadEvent = errors.New("malformed event")
)

// ApplyResult counts what an applied event did, for metrics.
type ApplyResult struct {
	Stored  int // (block, tier) entries added
	Removed int // (block, tier) entries removed
	// Unknown counts removals of blocks the worker rank did not hold on
	// that tier: benign after a dump recovery or a lost Stored event.
	Unknown int
}

// Overlap is how far a worker rank holds a prompt's prefix, in blocks, per
// tier. The counts are cumulative: Device is the longest prefix held in
// device memory; Host the longest prefix held in device or host memory;
// Disk the longest prefix held in any tier. So Device <= Host <= Disk.
//
// The counts are int32, so that an Overlap is 32 bytes: a match writes one
// per rank holding the prompt's first block, hundreds in a large fleet.
type Overlap struct {
	Worker WorkerRank
	Device int32
	Host   int32
	Disk   int32
	// Blocks is how many engine ids the rank holds in all, of any prompt
	// and on any tier (see RankBlocks), as of the match.
	Blocks int32
}

// Tokens returns the overlap in tokens, for blocks of blockSize tokens.
func (o Overlap) Tokens(blockSize int) (device, host, disk int) {
	return int(o.Device) * blockSize, int(o.Host) * blockSize, int(o.Disk) * blockSize
}

// Index is the KV block index of one (model, tenant): which worker ranks
// hold which blocks, on which tiers; it implements Interface. It is safe
// for concurrent use: matches run concurrently with each other and with
// event application, and never wait for it (see shard). Events of one
// worker rank must be applied in order, as a Set does.
//
// An index is split by worker id into shards, each a whole prefix tree
// with writers of its own, so that events of workers in different shards apply
// in parallel: a Set's apply goroutines each feed one shard when the shard
// count divides theirs. A match walks every shard; a block held by workers
// of several shards is in each.
type Index struct {
	blockSize int
	shards    []*shard
	removed   atomic.Bool // dropped from its Set: queued events are dropped
}

// MaxBlockSize is the largest block size, in tokens, that kvgate accepts
// anywhere a block size enters (flags, --models, registration routes, a
// peer's dump): 1..MaxBlockSize. Engines use 16 to a few hundred.
const MaxBlockSize = 1 << 16

// NewIndex returns an empty index of one shard for blocks of blockSize
// tokens.
func NewIndex(blockSize int) *Index { return NewShardedIndex(blockSize, 1) }

// NewShardedIndex returns an empty index of n shards (at least one) for
// blocks of blockSize tokens.
func NewShardedIndex(blockSize, n int) *Index {
	ix := &Index{blockSize: blockSize, shards: make([]*shard, max(n, 1))}
	for i := range ix.shards {
		ix.shards[i] = newShard(len(ix.shards))
	}
	return ix
}

// BlockSize returns the number of tokens per block.
func (ix *Index) BlockSize() int { return ix.blockSize }

// shardFor returns the shard of every rank of worker.
func (ix *Index) shardFor(worker uint64) *shard {
	if len(ix.shards) == 1 {
		return ix.shards[0]
	}
	return ix.shards[shardOf(worker, len(ix.shards))]
}

// Apply applies one event. On error the index is unchanged.
func (ix *Index) Apply(ev Event) (ApplyResult, error) {
	return ix.shardFor(ev.Worker.Worker).apply(ev)
}

// Match walks the prefix given by seq (the prompt's sequence hashes, see
// SequenceHashes) and appends to dst one Overlap per worker rank holding at
// least its first block, shard by shard. It returns the extended slice.
func (ix *Index) Match(seq []uint64, dst []Overlap) []Overlap {
	for _, s := range ix.shards {
		dst = s.match(seq, dst)
	}
	return dst
}

// MatchTokens hashes the full blocks of tokens (for adapter lora, "" for the
// base model) and matches them; see Match.
func (ix *Index) MatchTokens(tokens []uint32, lora string, dst []Overlap) []Overlap {
	local := LocalHashes(make([]uint64, 0, len(tokens)/max(ix.blockSize, 1)), tokens, ix.blockSize, LoRASeed(lora), nil)
	return ix.Match(SequenceHashes(local[:0:0], local), dst)
}

// RemoveWorker drops every block of every rank of worker.
func (ix *Index) RemoveWorker(worker uint64) { ix.shardFor(worker).removeWorker(worker) }

// RemoveWorkerRank drops every block of one worker rank. Matches never see
// the rank half-removed.
func (ix *Index) RemoveWorkerRank(wr WorkerRank) { ix.shardFor(wr.Worker).removeWorkerRank(wr) }

// BlockCounts returns how many engine ids each worker rank holds, of
// blocks on any tier (see Overlap.Blocks).
func (ix *Index) BlockCounts() map[WorkerRank]int {
	out := make(map[WorkerRank]int)
	for _, s := range ix.shards {
		s.blockCounts(out)
	}
	return out
}

// RankBlocks returns how many engine ids one worker rank holds (see
// BlockCounts).
func (ix *Index) RankBlocks(wr WorkerRank) int { return ix.shardFor(wr.Worker).rankBlocks(wr) }

// Stats describes the size of an index.
type Stats struct {
	Workers int // worker ranks with state
	Nodes   int // block positions, counted once per shard that has them
	Entries int // (block, worker rank) pairs, counted as the ranks' engine ids
}

// Stats returns the index's current size.
func (ix *Index) Stats() Stats {
	var st Stats
	for _, s := range ix.shards {
		t := s.stats()
		st.Workers += t.Workers
		st.Nodes += t.Nodes
		st.Entries += t.Entries
	}
	return st
}

// Tier classes: Match reports, per rank, the longest prefix held in each.
const (
	classDev  = iota // on device
	classHost        // on device or host
	classAny         // on any tier
	nClasses
)
