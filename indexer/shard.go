package indexer

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
)

// shard is the index of the worker ranks of some workers (see Index): a
// spanTree, and the copy of it that matches read. Its comment is where
// the index's concurrency is written down; others point here.
//
// Writers take turns on write, held for a whole operation (an event, a
// rank's removal) and by the calls that read the writers' tree (counts,
// stats, dumps). Matches take no lock and never wait for a writer.
//
// What a match reads of the tree is a view: the spans, the table of span
// heads, the ranks' heads (who), the block slab and the holder sets. A
// shard keeps two views: views[front], published, which matches read,
// and the writers' own, the tree's. The spans, heads and who arrays are
// each view's own; the slab's chunks and the sets' array are one for
// both.
//
// In an operation, a writer changes its own view's arrays, and of the
// shared ones only blocks and sets that the published view does not
// reach: what the tree lets go of (blocks, sets, diff arrays) is pending
// (spanTree.pend), not freed, and it logs what it changed
// (spanTree.dirty, headLog). Then it publishes its view (publish): it
// copies the view's headers into the other slot of views and makes that
// front; waits until no match reads the view published before (drain);
// brings that one up to date from the log and takes it as its own
// (spanTree.catchUp); and frees what was pending, which no view reaches
// any more. A match so sees every operation whole or not at all, and
// never a rank half removed.
//
// A match counts itself into the readers of views[front] (enter: it adds
// itself, then checks that front did not change meanwhile, else undoes
// and retries), reads the view with plain loads, and counts itself out
// (leave). A writer that must wait for matches to leave looks
// publishSpin times where Go runs goroutines on more than one core
// (GOMAXPROCS, read as it waits), then gives up its core between looks
// (cede); matches then give it back once cedeMatches of them have ended,
// as Go would take the core from a goroutine matching back to back only
// after 10 ms.
//
// A writer also gives up its core every writeChunk blocks of a long
// operation (relax) where the index's shards are at least as many as the
// cores Go uses (GOMAXPROCS, read then): their writers can then keep
// every core busy, and a match, or a request, would wait for a core
// until Go preempts a writer, after 10 ms.
//
// Every byte a match reads is one no writer writes while a match may read
// it, so the race detector checks the scheme in every test run.
// docs/design.md gives the measurements that chose it and its parts.
type shard struct {
	// What matches read, a cache line from what they write (see
	// cacheLine): what writers set once an operation, or as they give up
	// their core.
	//
	// views are the two copies of what matches read; front is the one
	// they read now, which only a writer changes, in its turn. ceded
	// is set while a writer has given up its core (see cede), and
	// cededMatches counts the matches that ended meanwhile.
	views        [2]view
	front        atomic.Uint32
	ceded        atomic.Bool
	_            [cacheLine]byte
	cededMatches atomic.Int32
	_            [cacheLine - 4]byte

	// readers[i] counts the matches reading views[i], each a cache line
	// from the other, as matches on several cores add to both.
	readers [2]struct {
		n atomic.Int64
		_ [cacheLine - 8]byte
	}
	_ [cacheLine]byte

	// What only writers read and write: their turn, and their tree.
	write sync.Mutex
	tree  *spanTree
	// peers is how many shards the index has, this one included.
	peers int
	// held counts the blocks the writer applied since it last gave up
	// its core (see relax).
	held int
	// warmth sums what spanTree.warm read, so that its loads are kept.
	warmth uint64
}

// newShard returns an empty shard of an index of peers shards.
func newShard(peers int) *shard {
	ix := &shard{tree: newSpanTree(), peers: peers}
	ix.tree.yield = ix.relax
	ix.views[0] = ix.tree.view // its arrays are empty, but the sets'
	return ix
}

// writeChunk is how many blocks a writer applies, and the step that
// reaches it, before it gives up its core where the index's shards are
// at least as many as Go's cores (see shard.relax).
const writeChunk = 64

// relax is called by a writer after each step of an operation (see
// spanTree.yield), with n the blocks the step applied. Every writeChunk
// blocks, where the shards can keep every core Go uses busy, it gives
// up its core (cede) to any goroutine waiting for one.
func (ix *shard) relax(n int) {
	if ix.held += n; ix.held >= writeChunk {
		ix.held = 0
		if ix.peers >= runtime.GOMAXPROCS(0) {
			ix.cede()
		}
	}
}

// cede gives up the writer's core to any goroutine waiting for one
// (runtime.Gosched), which matches give back after cedeMatches (see
// shard).
func (ix *shard) cede() {
	ix.cededMatches.Store(0)
	ix.ceded.Store(true)
	runtime.Gosched()
	ix.ceded.Store(false)
}

// publish makes the writers' view the one matches read, and gives the
// writers the other, once no match reads it, brought up to date: called
// by a writer, in its turn, after each operation.
func (ix *shard) publish() {
	w := 1 - ix.front.Load() // only writers change front, in turn
	ix.views[w] = ix.tree.view
	ix.front.Store(w)
	// A match that read front before the Store may still be counting
	// itself in; it then sees front changed, and counts itself out.
	if ix.readers[1-w].n.Load() != 0 {
		ix.drain(1 - w)
	}
	ix.tree.catchUp(&ix.views[w], &ix.views[1-w])
}

// drain waits until no match reads views[i] (see shard). With one core
// (GOMAXPROCS, read now, as it can change) the matches run only once the
// writer cedes, so it does not look before.
func (ix *shard) drain(i uint32) {
	spin := 0
	if runtime.GOMAXPROCS(0) > 1 {
		spin = publishSpin
	}
	for n := 0; ix.readers[i].n.Load() != 0; n++ {
		if n >= spin {
			ix.cede()
		}
	}
}

// cedeMatches is how many matches may end while a writer that ceded its
// core waits for one, before one gives its own up (see shard.cede).
const cedeMatches = 4

// publishSpin is how many times a writer looks for the matches still
// reading the copy it is to bring up to date before it gives up its
// core between looks (see drain): a match takes a few microseconds,
// unless the system has stopped its thread.
const publishSpin = 256

// enter returns the view matches read now, with its index for leave,
// counting the match in its readers (see shard).
func (ix *shard) enter() (*view, uint32) {
	for {
		i := ix.front.Load()
		ix.readers[i].n.Add(1)
		if ix.front.Load() == i {
			return &ix.views[i], i
		}
		ix.readers[i].n.Add(-1) // a writer published the other meanwhile
	}
}

// leave ends a match's read of views[i] (see enter).
func (ix *shard) leave(i uint32) { ix.readers[i].n.Add(-1) }

// apply applies one event. On error the shard is unchanged.
func (ix *shard) apply(ev Event) (ApplyResult, error) {
	switch ev.Kind {
	case Stored:
		if !ev.Tier.single() {
			return ApplyResult{}, fmt.Errorf("%w: stored event with tier %s", ErrBadEvent, ev.Tier)
		}
	case Removed:
		if !ev.Tier.single() {
			return ApplyResult{}, fmt.Errorf("%w: removed event with tier %s", ErrBadEvent, ev.Tier)
		}
	case Cleared:
		if ev.Tier == 0 || ev.Tier&^AllTiers != 0 {
			return ApplyResult{}, fmt.Errorf("%w: cleared event with tier %s", ErrBadEvent, ev.Tier)
		}
	default:
		return ApplyResult{}, fmt.Errorf("%w: kind %d", ErrBadEvent, ev.Kind)
	}
	ix.write.Lock()
	defer ix.write.Unlock()
	ix.warmth += ix.tree.warm(ev)
	ix.held = 0
	res, err := ix.tree.apply(ev)
	ix.publish()
	if ev.Kind == Removed || ev.Kind == Cleared {
		ix.tree.trim(ev.Worker) // if removals emptied its table enough
	}
	if errors.Is(err, ErrUnknownParent) {
		err = fmt.Errorf("%w %d for %s", ErrUnknownParent, ev.Parent, ev.Worker)
	}
	return res, err
}

// removeWorker drops every rank of worker.
func (ix *shard) removeWorker(worker uint64) {
	ix.removeRanks(func(wr WorkerRank) bool { return wr.Worker == worker })
}

// removeWorkerRank drops one rank.
func (ix *shard) removeWorkerRank(wr WorkerRank) {
	ix.removeRanks(func(r WorkerRank) bool { return r == wr })
}

// removeRanks drops the ranks for which gone is true, in the writers'
// turn, and publishes the tree without them.
func (ix *shard) removeRanks(gone func(WorkerRank) bool) {
	ix.write.Lock()
	defer ix.write.Unlock()
	leaving := ix.tree.leaving(gone)
	if len(leaving) == 0 {
		return
	}
	for _, r := range leaving {
		ix.tree.removeRank(r.wr, r.ids)
	}
	ix.publish()
}

var matchPool = sync.Pool{New: func() any { return new(runMatch) }}

// match appends to dst the Overlaps of the shard's ranks holding seq's
// first block (see Index.Match), in slot order, as of the view the
// shard published last.
func (ix *shard) match(seq []uint64, dst []Overlap) []Overlap {
	if len(seq) == 0 {
		return dst
	}
	m := matchPool.Get().(*runMatch)
	dst = ix.read(seq, m, dst)
	matchPool.Put(m)
	if ix.ceded.Load() && ix.cededMatches.Add(1) >= cedeMatches {
		// A writer of the shard, waiting for a match to leave the view
		// it must bring up to date, gave up its core cedeMatches
		// matches ago.
		runtime.Gosched()
	}
	return dst
}

// read runs m on the view the shard published last: a match that
// panicked would otherwise be counted as reading it for ever, and keep
// writers waiting (see publish).
func (ix *shard) read(seq []uint64, m *runMatch, dst []Overlap) []Overlap {
	v, i := ix.enter()
	defer ix.leave(i)
	return v.match(seq, m, dst)
}

// blockCounts sets, in out, how many engine ids each worker rank holds.
func (ix *shard) blockCounts(out map[WorkerRank]int) {
	ix.write.Lock()
	defer ix.write.Unlock()
	ix.tree.blockCounts(out)
}

// rankBlocks returns how many engine ids one worker rank holds.
func (ix *shard) rankBlocks(wr WorkerRank) int {
	ix.write.Lock()
	defer ix.write.Unlock()
	if slot, ok := ix.tree.slotOf[wr]; ok {
		return ix.tree.ranks[slot].names.len()
	}
	return 0
}

// stats returns the shard's current size.
func (ix *shard) stats() Stats {
	ix.write.Lock()
	defer ix.write.Unlock()
	st := Stats{Workers: len(ix.tree.slotOf), Nodes: ix.tree.live}
	for _, slot := range ix.tree.slotOf {
		st.Entries += ix.tree.ranks[slot].names.len()
	}
	return st
}
