package indexer

import (
	"errors"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"
)

// chain builds the Stored blocks of a token sequence with block size 4:
// engine ids are id0, id0+1, ... and local hashes are real LocalHashes.
func chain(id0 uint64, tokens ...uint32) []Block {
	local := LocalHashes(nil, tokens, 4, BaseSeed, nil)
	bs := make([]Block, len(local))
	for i, l := range local {
		bs[i] = Block{ID: id0 + uint64(i), Local: l}
	}
	return bs
}

// longChain returns blocks from..from+k-1 of one long chain of distinct
// blocks, the same for every w, under engine ids w<<40 | i.
func longChain(w uint64, from, k int) []Block {
	bs := make([]Block, k)
	for i := range bs {
		bs[i] = Block{ID: w<<40 | uint64(from+i), Local: uint64(from+i)*0x9e3779b97f4a7c15 + 1}
	}
	return bs
}

// longChainSeq returns the sequence hashes of the first n blocks of
// longChain's chain.
func longChainSeq(n int) []uint64 {
	local := make([]uint64, n)
	for i, b := range longChain(0, 0, n) {
		local[i] = b.Local
	}
	return SequenceHashes(nil, local)
}

func wr(w uint64, r uint32) WorkerRank { return WorkerRank{Worker: w, Rank: r} }

func stored(w WorkerRank, t Tier, parent *uint64, blocks []Block) Event {
	ev := Event{Kind: Stored, Worker: w, Tier: t, Blocks: blocks}
	if parent != nil {
		ev.Parent, ev.HasParent = *parent, true
	}
	return ev
}

func removed(w WorkerRank, t Tier, hashes ...uint64) Event {
	return Event{Kind: Removed, Worker: w, Tier: t, IDs: hashes}
}

func ptr(v uint64) *uint64 { return &v }

// prompt is 4 blocks of 4 tokens; sub-slices of it share prefixes.
var prompt = []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}

func TestIndexSemantics(t *testing.T) {
	a, b := wr(1, 0), wr(2, 0)
	tests := []struct {
		name   string
		events []Event
		errs   []error // per event; nil entries mean success
		query  []uint32
		want   []Overlap
		counts map[WorkerRank]int
	}{
		{
			name:   "full chain on device",
			events: []Event{stored(a, TierDevice, nil, chain(100, prompt...))},
			query:  prompt,
			want:   []Overlap{ov(a, 4, 4, 4)},
			counts: map[WorkerRank]int{a: 4},
		},
		{
			name:   "query shorter than held chain and partial block ignored",
			events: []Event{stored(a, TierDevice, nil, chain(100, prompt...))},
			query:  prompt[:10],
			want:   []Overlap{ov(a, 2, 2, 2)},
		},
		{
			name: "child stored through its parent",
			events: []Event{
				stored(a, TierDevice, nil, chain(100, prompt[:8]...)),
				stored(a, TierDevice, ptr(101), chain(100, prompt...)[2:]),
			},
			query: prompt,
			want:  []Overlap{ov(a, 4, 4, 4)},
		},
		{
			name: "unknown parent is rejected and changes nothing",
			events: []Event{
				stored(a, TierDevice, nil, chain(100, prompt[:4]...)),
				stored(a, TierDevice, ptr(999), chain(100, prompt...)[2:]),
			},
			errs:   []error{nil, ErrUnknownParent},
			query:  prompt,
			want:   []Overlap{ov(a, 1, 1, 1)},
			counts: map[WorkerRank]int{a: 1},
		},
		{
			name: "parent held by another worker is unknown",
			events: []Event{
				stored(a, TierDevice, nil, chain(100, prompt[:4]...)),
				stored(b, TierDevice, ptr(100), chain(100, prompt[:8]...)[1:]),
			},
			errs:  []error{nil, ErrUnknownParent},
			query: prompt,
			want:  []Overlap{ov(a, 1, 1, 1)},
		},
		{
			name: "same content under another parent does not match",
			events: []Event{
				// Block 2 of prompt stored at the root: a different position.
				stored(a, TierDevice, nil, chain(100, prompt[4:8]...)),
			},
			query: prompt,
			want:  nil,
		},
		{
			name: "removal in the middle of a chain cuts the prefix",
			events: []Event{
				stored(a, TierDevice, nil, chain(100, prompt...)),
				removed(a, TierDevice, 101),
			},
			query:  prompt,
			want:   []Overlap{ov(a, 1, 1, 1)},
			counts: map[WorkerRank]int{a: 3},
		},
		{
			name: "re-storing the removed block reconnects the held children",
			events: []Event{
				stored(a, TierDevice, nil, chain(100, prompt...)),
				removed(a, TierDevice, 101),
				stored(a, TierDevice, ptr(100), chain(100, prompt[:8]...)[1:]),
			},
			query: prompt,
			want:  []Overlap{ov(a, 4, 4, 4)},
		},
		{
			name: "clear drops one tier only",
			events: []Event{
				stored(a, TierDevice, nil, chain(100, prompt...)),
				stored(a, TierHost, nil, chain(100, prompt[:8]...)),
				{Kind: Cleared, Worker: a, Tier: TierDevice},
			},
			query:  prompt,
			want:   []Overlap{ov(a, 0, 2, 2)},
			counts: map[WorkerRank]int{a: 2},
		},
		{
			name: "clear all tiers",
			events: []Event{
				stored(a, TierDevice, nil, chain(100, prompt...)),
				stored(a, TierDisk, nil, chain(100, prompt...)),
				{Kind: Cleared, Worker: a, Tier: AllTiers},
			},
			query:  prompt,
			want:   nil,
			counts: map[WorkerRank]int{a: 0},
		},
		{
			name: "tiers are cumulative: device then host then disk",
			events: []Event{
				stored(a, TierDevice, nil, chain(100, prompt[:4]...)),
				stored(a, TierHost, ptr(100), chain(100, prompt[:8]...)[1:]),
				stored(a, TierDisk, ptr(101), chain(100, prompt...)[2:]),
			},
			query: prompt,
			want:  []Overlap{ov(a, 1, 2, 4)},
		},
		{
			name: "a device block after a host gap counts for host and disk only",
			events: []Event{
				stored(a, TierHost, nil, chain(100, prompt[:4]...)),
				stored(a, TierDevice, ptr(100), chain(100, prompt...)[1:]),
			},
			query: prompt,
			want:  []Overlap{ov(a, 0, 4, 4)},
		},
		{
			name: "removing one tier of a block keeps the others",
			events: []Event{
				stored(a, TierDevice, nil, chain(100, prompt...)),
				stored(a, TierHost, nil, chain(100, prompt...)),
				removed(a, TierDevice, 102),
			},
			query: prompt,
			want:  []Overlap{ov(a, 2, 4, 4)},
		},
		{
			name: "same block on many workers and ranks",
			events: []Event{
				stored(wr(3, 1), TierDevice, nil, chain(500, prompt[:8]...)),
				stored(a, TierDevice, nil, chain(100, prompt...)),
				stored(wr(3, 0), TierDevice, nil, chain(900, prompt[:4]...)),
				stored(b, TierHost, nil, chain(7, prompt[:12]...)),
			},
			query: prompt,
			want:  []Overlap{ov(wr(3, 1), 2, 2, 2), ov(a, 4, 4, 4), ov(wr(3, 0), 1, 1, 1), ov(b, 0, 3, 3)},
		},
		{
			name: "lora blocks never match the base model or each other",
			events: []Event{
				stored(a, TierDevice, nil, loraChain(100, "x", prompt...)),
				stored(b, TierDevice, nil, loraChain(200, "y", prompt...)),
			},
			query: prompt,
			want:  nil,
		},
		{
			name: "unknown removal is harmless",
			events: []Event{
				stored(a, TierDevice, nil, chain(100, prompt...)),
				removed(a, TierDevice, 12345),
				removed(b, TierDevice, 100),
				removed(a, TierHost, 100),
			},
			query: prompt,
			want:  []Overlap{ov(a, 4, 4, 4)},
		},
		{
			name: "engine id reused for other content replaces the block",
			events: []Event{
				stored(a, TierDevice, nil, chain(100, prompt...)),
				stored(a, TierDevice, nil, chain(103, 9, 9, 9, 9)),
			},
			query:  prompt,
			want:   []Overlap{ov(a, 3, 3, 3)},
			counts: map[WorkerRank]int{a: 4},
		},
		{
			// Block 100 (prompt[:4]) is the parent of the event, and its id
			// is reused for the next block: the rank no longer holds the
			// parent, and the new block hangs under no held block.
			name: "engine id of the parent reused for its child",
			events: []Event{
				stored(a, TierDevice, nil, chain(100, prompt[:4]...)),
				stored(a, TierDevice, ptr(100), chain(99, prompt[:8]...)[1:2]),
			},
			query:  prompt,
			want:   nil,
			counts: map[WorkerRank]int{a: 1},
		},
		{
			name: "parent stored anew under a child held without it",
			events: []Event{
				stored(a, TierDevice, nil, chain(100, prompt[:4]...)),
				stored(b, TierDevice, nil, chain(200, prompt[:4]...)),
				stored(a, TierDevice, ptr(100), chain(99, prompt[:8]...)[1:2]),
				removed(b, TierDevice, 200),
				stored(a, TierDevice, nil, chain(300, prompt[:4]...)),
			},
			query:  prompt,
			want:   []Overlap{ov(a, 2, 2, 2)},
			counts: map[WorkerRank]int{a: 2},
		},
		{
			name: "malformed events are rejected",
			events: []Event{
				{Kind: 0, Worker: a},
				stored(a, TierDevice|TierHost, nil, chain(100, prompt...)),
				{Kind: Removed, Worker: a, Tier: 0},
				{Kind: Cleared, Worker: a, Tier: 0},
			},
			errs:  []error{ErrBadEvent, ErrBadEvent, ErrBadEvent, ErrBadEvent},
			query: prompt,
			want:  nil,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ix := NewIndex(4)
			for i, ev := range tt.events {
				_, err := ix.Apply(ev)
				var want error
				if i < len(tt.errs) {
					want = tt.errs[i]
				}
				if (want == nil) != (err == nil) || (want != nil && !errors.Is(err, want)) {
					t.Fatalf("event %d: err = %v, want %v", i, err, want)
				}
			}
			got := trees(t, ix, ix.MatchTokens(tt.query, "", nil))
			if !slices.Equal(got, tt.want) {
				t.Fatalf("match = %v, want %v", got, tt.want)
			}
			for w, n := range tt.counts {
				if c := ix.BlockCounts()[w]; c != n {
					t.Errorf("block count of %v = %d, want %d", w, c, n)
				}
			}
			checkInvariants(t, ix)
		})
	}
}

func loraChain(id0 uint64, lora string, tokens ...uint32) []Block {
	local := LocalHashes(nil, tokens, 4, LoRASeed(lora), nil)
	bs := make([]Block, len(local))
	for i, l := range local {
		bs[i] = Block{ID: id0 + uint64(i), Local: l}
	}
	return bs
}

func TestLoRAMatchesItself(t *testing.T) {
	ix := NewIndex(4)
	a := wr(1, 0)
	if _, err := ix.Apply(stored(a, TierDevice, nil, loraChain(1, "x", prompt...))); err != nil {
		t.Fatal(err)
	}
	if got := trees(t, ix, ix.MatchTokens(prompt, "x", nil)); !slices.Equal(got, []Overlap{ov(a, 4, 4, 4)}) {
		t.Fatalf("lora x match = %v", got)
	}
	if got := ix.MatchTokens(prompt, "y", nil); got != nil {
		t.Fatalf("lora y matched %v", got)
	}
}

func TestApplyResultCounts(t *testing.T) {
	ix := NewIndex(4)
	a := wr(1, 0)
	tests := []struct {
		ev   Event
		want ApplyResult
	}{
		{stored(a, TierDevice, nil, chain(100, prompt...)), ApplyResult{Stored: 4}},
		{stored(a, TierDevice, nil, chain(100, prompt[:8]...)), ApplyResult{}},
		{stored(a, TierHost, nil, chain(100, prompt[:8]...)), ApplyResult{Stored: 2}},
		{removed(a, TierHost, 100, 102, 7), ApplyResult{Removed: 1, Unknown: 2}},
		{Event{Kind: Cleared, Worker: a, Tier: AllTiers}, ApplyResult{Removed: 5}},
	}
	for i, tt := range tests {
		got, err := ix.Apply(tt.ev)
		if err != nil || got != tt.want {
			t.Fatalf("event %d: got %+v, %v; want %+v", i, got, err, tt.want)
		}
	}
}

func TestRemoveWorker(t *testing.T) {
	ix := NewIndex(4)
	for _, w := range []WorkerRank{wr(1, 0), wr(1, 1), wr(2, 0)} {
		if _, err := ix.Apply(stored(w, TierDevice, nil, chain(100, prompt...))); err != nil {
			t.Fatal(err)
		}
	}
	ix.RemoveWorkerRank(wr(1, 1))
	if got := trees(t, ix, ix.MatchTokens(prompt, "", nil)); !slices.Equal(got, []Overlap{ov(wr(1, 0), 4, 4, 4), ov(wr(2, 0), 4, 4, 4)}) {
		t.Fatalf("after removing rank 1: %v", got)
	}
	ix.RemoveWorker(1)
	if got := trees(t, ix, ix.MatchTokens(prompt, "", nil)); !slices.Equal(got, []Overlap{ov(wr(2, 0), 4, 4, 4)}) {
		t.Fatalf("after removing worker 1: %v", got)
	}
	// A removed rank comes back empty, and reuses a slot cleanly.
	if _, err := ix.Apply(stored(wr(1, 1), TierDevice, nil, chain(100, prompt[:4]...))); err != nil {
		t.Fatal(err)
	}
	if got := trees(t, ix, ix.MatchTokens(prompt, "", nil)); !slices.Equal(got, []Overlap{ov(wr(1, 1), 1, 1, 1), ov(wr(2, 0), 4, 4, 4)}) {
		t.Fatalf("after re-adding: %v", got)
	}
	ix.RemoveWorker(2)
	ix.RemoveWorker(1)
	ix.RemoveWorker(42)
	if s := ix.Stats(); s != (Stats{}) {
		t.Fatalf("empty index has stats %+v", s)
	}
	checkInvariants(t, ix)
}

// longEvent is a long event's length in blocks, in the tests: some
// events are several times as long.
const longEvent = 64

func TestLongEvents(t *testing.T) {
	ix := NewIndex(4)
	tokens := make([]uint32, 4*(3*longEvent+5))
	for i := range tokens {
		tokens[i] = uint32(i)
	}
	a := wr(7, 0)
	blocks := chain(1, tokens...)
	if _, err := ix.Apply(stored(a, TierDevice, nil, blocks)); err != nil {
		t.Fatal(err)
	}
	n := len(blocks)
	if got := trees(t, ix, ix.MatchTokens(tokens, "", nil)); !slices.Equal(got, []Overlap{ov(a, n, n, n)}) {
		t.Fatalf("match = %v", got)
	}
	hashes := make([]uint64, n)
	for i, b := range blocks {
		hashes[i] = b.ID
	}
	res, _ := ix.Apply(removed(a, TierDevice, hashes[n/2:]...))
	if res.Removed != n-n/2 {
		t.Fatalf("removed %d, want %d", res.Removed, n-n/2)
	}
	if got := trees(t, ix, ix.MatchTokens(tokens, "", nil)); !slices.Equal(got, []Overlap{ov(a, n/2, n/2, n/2)}) {
		t.Fatalf("match = %v", got)
	}
	ix.RemoveWorkerRank(a)
	if s := ix.Stats(); s != (Stats{}) {
		t.Fatalf("stats after removal %+v", s)
	}
}

// checkInvariants verifies the internal consistency of every shard's tree
// (see checkSpanTree).
func checkInvariants(t fatalHelper, ix *Index) {
	t.Helper()
	for _, s := range ix.shards {
		s.write.Lock()
		checkSpanTree(t, s.tree)
		checkViews(t, &s.tree.view, &s.views[s.front.Load()])
		s.write.Unlock()
	}
}

// checkViews checks that the writers' view, caught up after an
// operation, has what the published one has, in arrays of its own where
// they must be (see spanTree.catchUp).
func checkViews(t fatalHelper, w, pub *view) {
	t.Helper()
	if len(w.spans) != len(pub.spans) {
		t.Fatalf("writers' view has %d spans, published %d", len(w.spans), len(pub.spans))
	}
	if len(w.spans) > 0 && &w.spans[0] == &pub.spans[0] {
		t.Fatalf("writers' and published views share their spans")
	}
	for s := range w.spans {
		a, b := w.spans[s], pub.spans[s]
		if !slices.Equal(a.diff, b.diff) {
			t.Fatalf("span %d: writers' diff %v, published %v", s, a.diff, b.diff)
		}
		a.diff, b.diff = nil, nil
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("span %d: writers' %+v, published %+v", s, a, b)
		}
	}
	if w.heads.len() != pub.heads.len() {
		t.Fatalf("writers' view has %d heads, published %d", w.heads.len(), pub.heads.len())
	}
	for _, h := range w.heads.slots {
		if got, ok := pub.heads.get(h.key); h.key != 0 && (!ok || got != h.val) {
			t.Fatalf("head %x: writers' %d, published %d (%v)", h.key, h.val, got, ok)
		}
	}
	if got, ok := pub.heads.get(0); ok != w.heads.zero || got != w.heads.zv {
		t.Fatalf("head 0: writers' %d (%v), published %d (%v)", w.heads.zv, w.heads.zero, got, ok)
	}
	if !slices.Equal(w.who, pub.who) {
		t.Fatalf("writers' ranks %v, published %v", w.who, pub.who)
	}
	if len(w.who) > 0 && &w.who[0] == &pub.who[0] {
		t.Fatalf("writers' and published views share their ranks")
	}
	if len(w.sets) != len(pub.sets) || len(w.blocks.chunks) != len(pub.blocks.chunks) {
		t.Fatalf("writers' view has %d sets and %d chunks, published %d and %d", len(w.sets), len(w.blocks.chunks), len(pub.sets), len(pub.blocks.chunks))
	}
}

// TestOrphanLinks covers blocks stored under a parent the rank names by
// engine id only (it no longer holds it): the parent block stays, pinned
// by that engine id, for Match, removals and the dump. Nothing leaks: once
// every rank is gone, the tree is empty.
func TestOrphanLinks(t *testing.T) {
	a, b := wr(1, 0), wr(2, 0)
	type step struct {
		ev   Event
		want []Overlap // Match of the whole prompt after ev
	}
	cases := []struct {
		name  string
		steps []step
	}{
		{
			name: "second engine id of a block, its node gone",
			steps: []step{
				{stored(a, TierDevice, nil, chain(100, prompt[:4]...)), []Overlap{ov(a, 1, 1, 1)}},
				{stored(a, TierDevice, nil, chain(200, prompt[:4]...)), []Overlap{ov(a, 1, 1, 1)}},
				{removed(a, TierDevice, 100), nil}, // 200 still names block 1, held by no one
				{stored(a, TierDevice, ptr(200), chain(399, prompt[:8]...)[1:2]), nil},
				{stored(a, TierDevice, ptr(400), chain(400, prompt[:12]...)[2:3]), nil},
				// b stores block 1 and 2: block 2 moves to the live parent.
				{stored(b, TierDevice, nil, chain(500, prompt[:8]...)), []Overlap{ov(b, 2, 2, 2)}},
				{stored(a, TierDevice, nil, chain(300, prompt[:4]...)), []Overlap{ov(a, 3, 3, 3), ov(b, 2, 2, 2)}},
				{removed(b, TierDevice, 501, 500), []Overlap{ov(a, 3, 3, 3)}},
			},
		},
		{
			// Any engine id of a block the rank holds acts on its holder,
			// whichever node the id was given for.
			name: "engine ids of one block, removed in turn",
			steps: []step{
				{stored(a, TierDevice, nil, chain(100, prompt[:4]...)), []Overlap{ov(a, 1, 1, 1)}},
				{stored(a, TierDevice, nil, chain(200, prompt[:4]...)), []Overlap{ov(a, 1, 1, 1)}},
				{stored(b, TierDevice, nil, chain(500, prompt[:4]...)), []Overlap{ov(a, 1, 1, 1), ov(b, 1, 1, 1)}},
				{removed(a, TierDevice, 100), []Overlap{ov(b, 1, 1, 1)}},
				{removed(b, TierDevice, 500), nil}, // 200 names a dead node
				{stored(a, TierHost, nil, chain(300, prompt[:4]...)), []Overlap{ov(a, 0, 1, 1)}},
				{Event{Kind: Stored, ByID: true, Worker: a, Tier: TierDisk, IDs: []uint64{200}}, []Overlap{ov(a, 0, 1, 1)}},
				{removed(a, TierHost, 200), []Overlap{ov(a, 0, 0, 1)}},
				{removed(a, TierDisk, 200), nil}, // 300 names a dead node now
				{stored(b, TierDevice, nil, chain(600, prompt[:8]...)), []Overlap{ov(b, 2, 2, 2)}},
				{removed(a, TierDevice, 300), []Overlap{ov(b, 2, 2, 2)}},
			},
		},
		{
			name: "parent's engine id reused for the child",
			steps: []step{
				{stored(a, TierDevice, nil, chain(100, prompt[:4]...)), []Overlap{ov(a, 1, 1, 1)}},
				{stored(a, TierDevice, ptr(100), chain(99, prompt[:8]...)[1:2]), nil},
				{stored(a, TierHost, ptr(100), chain(100, prompt[:12]...)[2:3]), nil},
				{stored(b, TierDisk, nil, chain(7, prompt...)), []Overlap{ov(b, 0, 0, 4)}},
				{stored(a, TierDevice, nil, chain(50, prompt[:4]...)), []Overlap{ov(a, 2, 3, 3), ov(b, 0, 0, 4)}},
			},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ix := NewIndex(4)
			for i, s := range c.steps {
				if _, err := ix.Apply(s.ev); err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
				if got := trees(t, ix, ix.MatchTokens(prompt, "", nil)); !slices.Equal(got, s.want) {
					t.Fatalf("step %d: match = %v, want %v", i, got, s.want)
				}
				checkInvariants(t, ix)
			}
			loaded := NewIndex(4)
			if _, err := loaded.Load(ix.Dump()); err != nil {
				t.Fatal(err)
			}
			for n := 0; n <= len(prompt); n += 4 {
				if got, want := trees(t, loaded, loaded.MatchTokens(prompt[:n], "", nil)), trees(t, ix, ix.MatchTokens(prompt[:n], "", nil)); !slices.Equal(got, want) {
					t.Fatalf("prefix %d: loaded %v, original %v", n, got, want)
				}
			}
			ix.RemoveWorker(1)
			ix.RemoveWorker(2)
			checkInvariants(t, ix)
			if tr := ix.shards[0].tree; tr.live != 0 || tr.blocks.len() != 0 || tr.heads.len() != 0 || len(tr.spans) != len(tr.free) {
				t.Fatalf("emptied index: %d live blocks of %d, %d heads, %d spans of %d free", tr.live, tr.blocks.len(), tr.heads.len(), len(tr.spans), len(tr.free))
			}
		})
	}
}

// TestOverlapSize: a match writes an Overlap per candidate rank, so its
// size is part of the match's cost (see Overlap).
func TestOverlapSize(t *testing.T) {
	if n := unsafe.Sizeof(Overlap{}); n != 32 {
		t.Fatalf("Overlap is %d bytes, want 32", n)
	}
}

// ov is an expected overlap; its tree size is checked by trees.
func ov(w WorkerRank, dev, host, disk int) Overlap {
	return Overlap{Worker: w, Device: int32(dev), Host: int32(host), Disk: int32(disk)}
}

// trees checks each overlap's tree size against ix.RankBlocks and returns
// the overlaps without it, to compare with ov's.
func trees(t testing.TB, ix *Index, got []Overlap) []Overlap {
	t.Helper()
	out := slices.Clone(got)
	for i := range out {
		if n := ix.RankBlocks(out[i].Worker); int(out[i].Blocks) != n {
			t.Errorf("%v: overlap says %d blocks, RankBlocks %d", out[i].Worker, out[i].Blocks, n)
		}
		out[i].Blocks = 0
	}
	return out
}

// TestStoredReservesForNewIDs: a Stored event grows its rank's engine-id
// table for the engine ids it adds, once, and not at all when it only
// copies held blocks to another tier.
func TestStoredReservesForNewIDs(t *testing.T) {
	const held = 1000 // blocks 0..held-1, stored first, in a table then made full
	cases := []struct {
		name   string
		tier   Tier
		blocks []Block // continue the held blocks from the root
		fresh  int     // engine ids they add
	}{
		{"copy to host", TierHost, longChain(1, 0, held), 0},
		{"stored again", TierDevice, longChain(1, 0, 300), 0},
		{"new blocks", TierDevice, longChain(1, 0, held+900)[held:], 900},
		{"a chunk copied, then new blocks", TierHost, longChain(1, held-100, 1000), 900},
		{"a few new blocks after a copy", TierHost, longChain(1, held-200, 210), 10},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ix := NewIndex(4)
			a := wr(1, 0)
			if _, err := ix.Apply(stored(a, TierDevice, nil, longChain(1, 0, held))); err != nil {
				t.Fatal(err)
			}
			bt := &ix.shards[0].tree.ranks[ix.shards[0].tree.slotOf[a]].names
			bt.tab = bt.resized((held*blockLoadDen + blockLoadNum - 1) / blockLoadNum)
			before := *bt
			if (before.n+1)*blockLoadDen <= len(before.tab)*blockLoadNum {
				t.Fatalf("setup: %d entries in %d slots leave room", before.n, len(before.tab))
			}
			var parent *uint64
			if c.blocks[0].ID != 1<<40 {
				parent = ptr(c.blocks[0].ID - 1)
			}
			if _, err := ix.Apply(stored(a, c.tier, parent, c.blocks)); err != nil {
				t.Fatal(err)
			}
			want := len(before.tab)
			if c.fresh > 0 {
				want = before.reserveSize(c.fresh)
			}
			if len(bt.tab) != want || bt.len() != held+c.fresh {
				t.Errorf("%d entries in %d slots, want %d in %d", bt.len(), len(bt.tab), held+c.fresh, want)
			}
			checkInvariants(t, ix)
		})
	}
}

// within returns what ch gives, failing t if it gives nothing within 30s.
func within[T any](t *testing.T, what string, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: not within 30s", what)
		panic("unreachable")
	}
}

// matchAsync matches seq on ix in another goroutine.
func matchAsync(ix *Index, seq []uint64) <-chan []Overlap {
	ch := make(chan []Overlap, 1)
	go func() { ch <- ix.Match(seq, nil) }()
	return ch
}

// TestMatchesNeverWaitForWriters holds a writer's turn in the middle of
// an operation, half of it applied to the writers' tree: matches
// meanwhile answer at once, with the state before the operation, and
// once the writer publishes, with the state after.
func TestMatchesNeverWaitForWriters(t *testing.T) {
	ix := NewIndex(4)
	a, b := wr(1, 0), wr(2, 0)
	path := blocksOf("", strings.Repeat("01", longEvent))
	if _, err := ix.Apply(stored(a, TierDevice, nil, path)); err != nil {
		t.Fatal(err)
	}
	seq := seqOf(strings.Repeat("01", longEvent))
	before := []Overlap{{Worker: a, Device: 2 * longEvent, Host: 2 * longEvent, Disk: 2 * longEvent, Blocks: 2 * longEvent}}
	sh := ix.shards[0]
	sh.write.Lock() // the writer's turn
	half := len(path) / 2
	if _, err := sh.tree.apply(stored(b, TierHost, nil, path[:half])); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if got := within(t, "a match while a writer is halfway", matchAsync(ix, seq)); !slices.Equal(got, before) {
			t.Fatalf("match while a writer is halfway = %+v, want %+v", got, before)
		}
	}
	if _, err := sh.tree.apply(stored(b, TierHost, &path[half-1].ID, path[half:])); err != nil {
		t.Fatal(err)
	}
	if got := within(t, "a match before the writer publishes", matchAsync(ix, seq)); !slices.Equal(got, before) {
		t.Fatalf("match before the writer publishes = %+v, want %+v", got, before)
	}
	sh.publish()
	sh.write.Unlock()
	after := append(before, Overlap{Worker: b, Device: 0, Host: 2 * longEvent, Disk: 2 * longEvent, Blocks: 2 * longEvent})
	if got := ix.Match(seq, nil); !slices.Equal(got, after) {
		t.Fatalf("match after the operation = %+v, want %+v", got, after)
	}
	checkInvariants(t, ix)
}

// TestPublishWaitsForReaders holds a match in the view the shard
// published, as a writer publishes the next: the writer does not change
// the held view (the race detector checks that too) and does not finish
// its operation until the match leaves it.
func TestPublishWaitsForReaders(t *testing.T) {
	ix := NewIndex(4)
	a, b := wr(1, 0), wr(2, 0)
	if _, err := ix.Apply(stored(a, TierDevice, nil, blocksOf("", "0123"))); err != nil {
		t.Fatal(err)
	}
	sh := ix.shards[0]
	seq := seqOf("0123")
	var rm runMatch
	v, i := sh.enter()
	want := v.match(seq, &rm, nil)
	applied := make(chan error, 1)
	go func() {
		_, err := ix.Apply(stored(b, TierDevice, nil, blocksOf("", "01")))
		applied <- err
	}()
	for sh.front.Load() == i { // the writer has published
		runtime.Gosched()
	}
	if got := ix.Match(seq, nil); len(got) != 2 {
		t.Fatalf("match of the view published next = %+v, want both ranks", got)
	}
	for range 1000 {
		select {
		case <-applied:
			t.Fatal("a writer finished its operation while a match read the view it had to change")
		default:
		}
		runtime.Gosched()
	}
	if got := v.match(seq, &rm, nil); !slices.Equal(got, want) {
		t.Fatalf("the held view changed: %+v, was %+v", got, want)
	}
	sh.leave(i)
	if err := within(t, "the writer's operation", applied); err != nil {
		t.Fatal(err)
	}
	checkInvariants(t, ix)
}

// field is a field's name and where it lies in its struct.
type field struct {
	name     string
	from, to uintptr // bytes [from, to)
}

// fieldsOf lists the fields of struct type t, the blank ones (padding)
// left out.
func fieldsOf(t reflect.Type) []field {
	var out []field
	for i := range t.NumField() {
		if f := t.Field(i); f.Name != "_" {
			out = append(out, field{f.Name, f.Offset, f.Offset + f.Type.Size()})
		}
	}
	return out
}

// TestMatchFieldsApart checks that the fields of a shard that matches
// only read, those they write (the counts of readers, one per view, each
// padded to a line), and those only writers use lie at least a cache
// line apart, so that no line holds two groups, however the struct is
// aligned.
func TestMatchFieldsApart(t *testing.T) {
	groups := [][]string{{"views", "front", "ceded"}, {"readers", "cededMatches"}, {"write", "tree", "peers", "held", "warmth"}}
	fields := fieldsOf(reflect.TypeFor[shard]())
	groupOf := func(name string) int {
		for g, names := range groups {
			if slices.Contains(names, name) {
				return g
			}
		}
		t.Fatalf("shard field %s is in no group", name)
		return -1
	}
	for i, a := range fields {
		for _, b := range fields[i+1:] {
			if groupOf(a.name) != groupOf(b.name) && a.to+cacheLine > b.from && b.to+cacheLine > a.from {
				t.Errorf("%s (bytes %d-%d) and %s (%d-%d) are less than a cache line apart", a.name, a.from, a.to, b.name, b.from, b.to)
			}
		}
	}
	if r, _ := reflect.TypeFor[shard]().FieldByName("readers"); r.Type.Elem().Size() < cacheLine {
		t.Errorf("a view's count of readers takes %d bytes, less than a cache line", r.Type.Elem().Size())
	}
}

// TestMatchesLetAWaitingWriterRun checks, with one P, that matches back
// to back give the P back to a writer that gave it up, every writeChunk
// blocks of a long event (see shard.relax), or waits for one of them to
// leave the view it has to bring up to date (see shard.publish): Go
// takes the P from a goroutine that keeps it only after 10 ms, so the
// writer would otherwise wait that long each time, matches running all
// the while.
func TestMatchesLetAWaitingWriterRun(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	for _, tc := range []struct {
		name   string
		blocks int
	}{
		{"events shorter than writeChunk", writeChunk / 2},
		{"events of several writeChunks", 3 * writeChunk},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ix := NewIndex(4)
			path := strings.Repeat("0123", tc.blocks/4)
			if _, err := ix.Apply(stored(wr(1, 0), TierDevice, nil, blocksOf("", path))); err != nil {
				t.Fatal(err)
			}
			seq := seqOf(path)
			var stop atomic.Bool
			var matches atomic.Int64
			done := make(chan struct{})
			go func() {
				for !stop.Load() {
					ix.Match(seq, nil)
					matches.Add(1)
				}
				close(done)
			}()
			const events = 20
			during := int64(0) // matches run while Apply ran
			for i := range events {
				// The matches take the P, until Go takes it from
				// them (mostly in the middle of one, which the
				// writer then waits for).
				for m := matches.Load(); matches.Load() == m; {
					runtime.Gosched()
				}
				m := matches.Load()
				if _, err := ix.Apply(stored(wr(uint64(i+2), 0), TierDevice, nil, blocksOf("", path))); err != nil {
					t.Fatal(err)
				}
				during += matches.Load() - m
			}
			stop.Store(true)
			<-done
			if most := int64(2 * cedeMatches * events * (1 + tc.blocks/writeChunk)); during > most {
				t.Fatalf("%d matches ran while %d events applied (at most %d)", during, events, most)
			}
		})
	}
}

// TestWritersGiveUpTheCPU checks that where the shards are as many as
// the cores, a writer applying a long event lets a goroutine waiting for
// a core run before the event ends: with one P and one shard, a goroutine
// made runnable as the event begins runs before Apply returns.
func TestWritersGiveUpTheCPU(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	ix := NewIndex(4)
	w := WorkerRank{Worker: 1}
	blocks := make([]Block, 4*writeChunk)
	for i := range blocks {
		blocks[i] = Block{ID: uint64(i + 1), Local: uint64(i + 1)}
	}
	var applying, over atomic.Bool
	ranDuring := make(chan bool, 1)
	go func() {
		// Should it run before the event starts (this goroutine
		// preempted in between), it gives the P back until it has.
		for !applying.Load() {
			runtime.Gosched()
		}
		ranDuring <- !over.Load()
	}()
	applying.Store(true)
	_, err := ix.Apply(stored(w, TierDevice, nil, blocks))
	over.Store(true)
	if err != nil {
		t.Fatal(err)
	}
	if !<-ranDuring {
		t.Fatal("the other goroutine ran only once the event was applied")
	}
}
