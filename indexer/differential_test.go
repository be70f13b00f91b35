package indexer_test

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/kvgate/kvgate/indexer"
	"github.com/kvgate/kvgate/indexer/reference"
)

// The tests of this file apply the same operations to an indexer.Index
// and to a reference.Index, the plain implementation of the same
// contract (indexer.Interface), and compare them after every step: the
// answers of Apply, the matches of a set of prompts, the block counts
// and sizes; and they check the tree's invariants.

// fatalf is what the checks need of *testing.T and *rapid.T.
type fatalf interface {
	Helper()
	Fatalf(format string, args ...any)
}

// pair is an index and its reference, given the same operations.
type pair struct {
	tree *indexer.Index
	ref  *reference.Index
}

func newPair(blockSize, shards int) *pair {
	return &pair{indexer.NewShardedIndex(blockSize, shards), reference.New(blockSize)}
}

// apply applies ev to both, and fails t unless both give the same result
// and error, by kind.
func (p *pair) apply(t fatalf, ev indexer.Event) error {
	t.Helper()
	got, gerr := p.tree.Apply(ev)
	want, werr := p.ref.Apply(ev)
	if got != want || errKind(gerr) != errKind(werr) {
		t.Fatalf("apply %s: index %+v, %v; reference %+v, %v", describe(ev), got, gerr, want, werr)
	}
	return gerr
}

// errKind is the sentinel err wraps, or err.
func errKind(err error) error {
	for _, k := range []error{indexer.ErrBadEvent, indexer.ErrUnknownParent} {
		if errors.Is(err, k) {
			return k
		}
	}
	return err
}

func (p *pair) removeRank(wr indexer.WorkerRank) {
	p.tree.RemoveWorkerRank(wr)
	p.ref.RemoveWorkerRank(wr)
}

func (p *pair) removeWorker(w uint64) {
	p.tree.RemoveWorker(w)
	p.ref.RemoveWorker(w)
}

// check fails t unless the tree's invariants hold and the two agree on
// every query's match, the block counts, and the ranks' and entries'
// counts.
func (p *pair) check(t fatalf, queries [][]uint64, when string) {
	t.Helper()
	indexer.CheckInvariants(t, p.tree)
	same(t, p.tree, p.ref, queries, when)
}

// same fails t unless a and b agree on every query's match, the block
// counts, and the ranks' and entries' counts.
func same(t fatalf, a, b indexer.Interface, queries [][]uint64, when string) {
	t.Helper()
	for _, q := range queries {
		if got, want := sorted(a.Match(q, nil)), sorted(b.Match(q, nil)); !slices.Equal(got, want) {
			t.Fatalf("%s: match of %d blocks = %v, want %v", when, len(q), got, want)
		}
	}
	if got, want := a.BlockCounts(), b.BlockCounts(); !maps.Equal(got, want) {
		t.Fatalf("%s: block counts %v, want %v", when, got, want)
	}
	if got, want := a.Stats(), b.Stats(); got.Workers != want.Workers || got.Entries != want.Entries {
		t.Fatalf("%s: %d ranks with %d entries, want %d with %d", when, got.Workers, got.Entries, want.Workers, want.Entries)
	}
}

// roundTrip dumps both and loads each dump into an empty index and an
// empty reference; it fails t unless every load places every event and
// all four agree, and returns the pair loaded from their own dumps (the
// index in shards shards).
func (p *pair) roundTrip(t fatalf, shards int, queries [][]uint64, when string) *pair {
	t.Helper()
	bs := p.tree.BlockSize()
	treeDump, refDump := p.tree.Dump(), p.ref.Dump()
	load := func(into indexer.Interface, dump []indexer.Event, what string) indexer.Interface {
		if skipped, err := into.Load(dump); skipped != 0 || err != nil {
			t.Fatalf("%s: loading %s: skipped %d, err %v", when, what, skipped, err)
		}
		return into
	}
	loaded := &pair{
		load(indexer.NewShardedIndex(bs, shards), treeDump, "the index's dump into an index").(*indexer.Index),
		load(reference.New(bs), refDump, "the reference's dump into a reference").(*reference.Index),
	}
	loaded.check(t, queries, when+", both loaded")
	cross := load(indexer.NewShardedIndex(bs, 1+shards%3), refDump, "the reference's dump into an index")
	same(t, cross, loaded.ref, queries, when+", the reference's dump loaded into an index")
	indexer.CheckInvariants(t, cross.(*indexer.Index))
	same(t, load(reference.New(bs), treeDump, "the index's dump into a reference"), loaded.ref, queries, when+", the index's dump loaded into a reference")
	return loaded
}

// sorted returns o sorted by worker rank, as Match gives no order.
func sorted(o []indexer.Overlap) []indexer.Overlap {
	slices.SortFunc(o, func(a, b indexer.Overlap) int {
		return cmp.Or(cmp.Compare(a.Worker.Worker, b.Worker.Worker), cmp.Compare(a.Worker.Rank, b.Worker.Rank))
	})
	return o
}

// describe is ev in a line, for failures.
func describe(ev indexer.Event) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s %s", ev.Kind, ev.Worker, ev.Tier)
	if ev.ByID {
		b.WriteString(" by id")
	}
	if ev.HasParent {
		fmt.Fprintf(&b, " under %x", ev.Parent)
	}
	for _, bl := range ev.Blocks {
		fmt.Fprintf(&b, " %x", bl.ID)
	}
	for _, h := range ev.IDs {
		fmt.Fprintf(&b, " %x", h)
	}
	return b.String()
}

// TestTreeMatchesReference applies random operations, from fixed seeds,
// to an index and its reference and compares them after every step (see
// pair.check): Stored events under a parent or from the root, Removed
// events along what ranks stored, in either order, id-only Stored
// events, Cleared events, malformed events, ranks' and workers' removals
// and dump-load round trips, for several workers of two ranks each, three
// tiers, one to three shards and three LoRA adapters; on some seeds the
// engine ids come from a pool of a dozen, so that ids name several
// blocks in turn and blocks get several ids, and on some a hundred other
// ranks come first, so that those under test lie past a bit-set word.
func TestTreeMatchesReference(t *testing.T) {
	seeds := 60
	if testing.Short() {
		seeds = 10
	}
	for seed := range uint64(seeds) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { differential(t, seed) })
	}
}

// prompt is a prompt for a LoRA adapter ("": the base model): a path of
// blocks, each a symbol '0'..'2' standing for 4 tokens.
type prompt struct {
	lora string
	path string
}

const diffBlockSize = 4

// tokens returns p's tokens.
func (p prompt) tokens() []uint32 {
	var toks []uint32
	for i := range p.path {
		s := uint32(p.path[i] - '0')
		toks = append(toks, s, s+10, s+20, s+30)
	}
	return toks
}

// seq returns p's block keys.
func (p prompt) seq() []uint64 {
	return indexer.SequenceHashes(nil, indexer.LocalHashes(nil, p.tokens(), diffBlockSize, indexer.LoRASeed(p.lora), nil))
}

// diffRun is one seed's run: the pair, what the ranks stored, and the
// queries compared.
type diffRun struct {
	rng     *rand.Rand
	p       *pair
	pool    uint64 // engine ids are 0..pool-1, if not 0
	alias   uint64 // which of a block's two ids an event uses, in pool mode
	stored  map[indexer.WorkerRank][]prompt
	queries []prompt
}

// id returns the engine id of block i of q: one of its content, or in
// pool mode one of two drawn from the pool, as alias says.
func (r *diffRun) id(q prompt, i int) uint64 {
	h := uint64(14695981039346656037)
	for _, c := range []byte(q.lora + "/" + q.path[:i+1]) {
		h = (h ^ uint64(c)) * 1099511628211
	}
	if r.pool > 0 { // a block under one id or another, each id naming several
		return (h >> (20 * r.alias)) % r.pool
	}
	return h
}

// ids returns the engine ids of blocks from..to of q, in that order.
func (r *diffRun) ids(q prompt, from, to int) []uint64 {
	var out []uint64
	for i := from; ; {
		out = append(out, r.id(q, i))
		if i == to {
			return out
		}
		if from < to {
			i++
		} else {
			i--
		}
	}
}

func (r *diffRun) tier() indexer.Tier {
	return []indexer.Tier{indexer.TierDevice, indexer.TierHost, indexer.TierDisk}[r.rng.IntN(3)]
}

// prompt returns a new prompt, or one a rank stored, often extended.
func (r *diffRun) prompt(w indexer.WorkerRank) prompt {
	loras := []string{"", "", "adapter-a", "adapter-b"}
	if mine := r.stored[w]; len(mine) > 0 && r.rng.IntN(3) > 0 {
		q := mine[r.rng.IntN(len(mine))]
		if r.rng.IntN(2) == 0 {
			q.path += r.path(1, 4)
		}
		return q
	}
	return prompt{lora: loras[r.rng.IntN(len(loras))], path: r.path(1, 8)}
}

// path returns a path of lo..hi symbols.
func (r *diffRun) path(lo, hi int) string {
	b := make([]byte, lo+r.rng.IntN(hi-lo+1))
	for i := range b {
		b[i] = "012"[r.rng.IntN(3)]
	}
	return string(b)
}

func (r *diffRun) seqs() [][]uint64 {
	out := make([][]uint64, len(r.queries))
	for i, q := range r.queries {
		out[i] = q.seq()
	}
	return out
}

func differential(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 43))
	r := &diffRun{rng: rng, p: newPair(diffBlockSize, 1+rng.IntN(3)), stored: make(map[indexer.WorkerRank][]prompt)}
	if rng.IntN(2) == 0 {
		r.pool = 8
	}
	if rng.IntN(3) == 0 { // ranks past the first bit-set word
		for i := range 60 + rng.IntN(70) {
			pad := prompt{path: "9"}
			r.p.apply(t, indexer.Event{Kind: indexer.Stored, Worker: indexer.WorkerRank{Worker: 1000 + uint64(i)}, Tier: indexer.TierDevice,
				Blocks: []indexer.Block{{ID: 1 << 50, Local: pad.seq()[0]}}})
		}
	}
	for step := range 50 + rng.IntN(50) {
		w := indexer.WorkerRank{Worker: 1 + rng.Uint64N(4), Rank: rng.Uint32N(2)}
		r.alias = rng.Uint64N(2)
		var what string
		switch op := rng.IntN(100); {
		case op < 40: // stored, from the root or under a parent the rank may name
			q := r.prompt(w)
			k := rng.IntN(len(q.path))
			seq := q.seq()
			local := indexer.LocalHashes(nil, q.tokens(), diffBlockSize, indexer.LoRASeed(q.lora), nil)
			ev := indexer.Event{Kind: indexer.Stored, Worker: w, Tier: r.tier()}
			if k > 0 {
				ev.Parent, ev.HasParent = r.id(q, k-1), true
			}
			for i := k; i < len(q.path); i++ {
				ev.Blocks = append(ev.Blocks, indexer.Block{ID: r.id(q, i), Local: local[i]})
			}
			if rng.IntN(20) == 0 {
				ev.Tier = []indexer.Tier{0, indexer.TierDevice | indexer.TierHost}[rng.IntN(2)]
			}
			if r.p.apply(t, ev) == nil {
				r.stored[w] = append(r.stored[w], q)
			}
			r.queries = append(r.queries, q)
			what = fmt.Sprintf("stored %s %q|%q (%d keys)", q.lora, q.path[:k], q.path[k:], len(seq))
		case op < 58, op < 72: // removed, or stored by id, along what the rank stored
			q := r.prompt(w)
			from, to := rng.IntN(len(q.path)), len(q.path)-1
			if rng.IntN(2) == 0 {
				from, to = to, from
			}
			ev := indexer.Event{Kind: indexer.Removed, Worker: w, Tier: r.tier(), IDs: r.ids(q, from, to)}
			if op >= 58 {
				ev.Kind, ev.ByID = indexer.Stored, true
			}
			if rng.IntN(4) == 0 { // and an id the rank may not use
				ev.IDs = append(ev.IDs, r.id(r.prompt(w), 0))
			}
			r.p.apply(t, ev)
			what = fmt.Sprintf("%s %q blocks %d..%d", describe(ev), q.path, from, to)
		case op < 79:
			ev := indexer.Event{Kind: indexer.Cleared, Worker: w, Tier: indexer.Tier(rng.IntN(8))}
			r.p.apply(t, ev)
			what = describe(ev)
		case op < 82:
			ev := indexer.Event{Kind: indexer.EventKind(4 + rng.IntN(2)), Worker: w, Tier: indexer.TierDevice}
			r.p.apply(t, ev)
			what = describe(ev)
		case op < 89:
			r.p.removeRank(w)
			delete(r.stored, w)
			what = fmt.Sprintf("removed %s", w)
		case op < 92:
			r.p.removeWorker(w.Worker)
			for x := range r.stored {
				if x.Worker == w.Worker {
					delete(r.stored, x)
				}
			}
			what = fmt.Sprintf("removed worker %d", w.Worker)
		default:
			r.queries = append(r.queries, r.prompt(w))
			r.p = r.p.roundTrip(t, 1+rng.IntN(3), r.seqs(), fmt.Sprintf("seed %d step %d", seed, step))
			what = "dumped and loaded"
		}
		r.queries = append(r.queries, r.prompt(w))
		if n := len(r.queries); n > 40 {
			r.queries = slices.Delete(r.queries, 0, n-40)
		}
		r.p.check(t, r.seqs(), fmt.Sprintf("seed %d step %d (%s)", seed, step, what))
	}
	for _, q := range r.queries {
		if got, want := sorted(r.p.tree.MatchTokens(q.tokens(), q.lora, nil)), sorted(r.p.tree.Match(q.seq(), nil)); !slices.Equal(got, want) {
			t.Fatalf("seed %d: MatchTokens of %s %q = %v, Match of its keys %v", seed, q.lora, q.path, got, want)
		}
	}
	r.p.roundTrip(t, 1+rng.IntN(3), r.seqs(), fmt.Sprintf("seed %d, the end", seed))
}

// The two rapid tests below drive the pair with paths of symbols, whose
// blocks indexer.BlocksOf makes (engine ids derived from the path, as
// vLLM's are) and whose queries indexer.SeqOf hashes.

func storedPath(w indexer.WorkerRank, t indexer.Tier, parent *uint64, blocks []indexer.Block) indexer.Event {
	ev := indexer.Event{Kind: indexer.Stored, Worker: w, Tier: t, Blocks: blocks}
	if parent != nil {
		ev.Parent, ev.HasParent = *parent, true
	}
	return ev
}

func seqsOf(paths []string) [][]uint64 {
	out := make([][]uint64, len(paths))
	for i, q := range paths {
		out[i] = indexer.SeqOf(q)
	}
	return out
}

// layout registers up to 130 other ranks first, each holding a block no
// query starts with, so that the ranks under test sit in the first
// bit-set word or further on, across word boundaries.
func layout(t *rapid.T, p *pair) {
	for i := range rapid.IntRange(0, 130).Draw(t, "padRanks") {
		w := indexer.WorkerRank{Worker: 1000 + uint64(i)}
		if err := p.apply(t, storedPath(w, indexer.TierDevice, nil, indexer.BlocksOf("", "9"))); err != nil {
			t.Fatal(err)
		}
	}
}

func TestIndexMatchesReferenceModel(t *testing.T) {
	genPath := rapid.StringOfN(rapid.RuneFrom([]rune("0123")), 1, 5, -1)
	genWorker := rapid.Custom(func(t *rapid.T) indexer.WorkerRank {
		return indexer.WorkerRank{Worker: rapid.Uint64Range(1, 3).Draw(t, "worker"), Rank: rapid.Uint32Range(0, 1).Draw(t, "rank")}
	})
	genTier := rapid.SampledFrom([]indexer.Tier{indexer.TierDevice, indexer.TierHost, indexer.TierDisk})
	// named draws the blocks a Removed or id-only Stored event names: a
	// few paths, or a stretch of the blocks of one path, often one of
	// stored (the rank's), in either order, as engines name a request's
	// blocks.
	named := func(t *rapid.T, stored []string) []string {
		if !rapid.Bool().Draw(t, "stretch") {
			return rapid.SliceOfN(genPath, 1, 4).Draw(t, "paths")
		}
		p := genPath.Draw(t, "along")
		if len(stored) > 0 && rapid.Bool().Draw(t, "stored") {
			p = rapid.SampledFrom(stored).Draw(t, "along stored")
		}
		var paths []string
		for k := rapid.IntRange(1, len(p)).Draw(t, "from"); k <= len(p); k++ {
			paths = append(paths, p[:k])
		}
		if rapid.Bool().Draw(t, "last first") {
			slices.Reverse(paths)
		}
		return paths
	}
	idsOf := func(paths []string) []uint64 {
		ids := make([]uint64, len(paths))
		for i, p := range paths {
			ids[i] = indexer.PathID(p)
		}
		return ids
	}

	rapid.Check(t, func(t *rapid.T) {
		p := newPair(4, rapid.IntRange(1, 3).Draw(t, "shards"))
		layout(t, p)
		var queries []string
		mine := make(map[indexer.WorkerRank][]string) // paths each rank stored
		steps := rapid.IntRange(1, 60).Draw(t, "steps")
		for step := 0; step < steps; step++ {
			w := genWorker.Draw(t, "w")
			var log string
			switch op := rapid.IntRange(0, 10).Draw(t, "op"); {
			case op < 5: // store, often under a parent
				path := genPath.Draw(t, "path")
				k := rapid.IntRange(0, len(path)-1).Draw(t, "split")
				tier := genTier.Draw(t, "tier")
				ev := storedPath(w, tier, nil, indexer.BlocksOf(path[:k], path[k:]))
				if k > 0 {
					ev.Parent, ev.HasParent = indexer.PathID(path[:k]), true
				}
				p.apply(t, ev)
				queries = append(queries, path)
				mine[w] = append(mine[w], path)
				log = fmt.Sprintf("store %v %s %q|%q", w, tier, path[:k], path[k:])
			case op < 7:
				tier := genTier.Draw(t, "tier")
				paths := named(t, mine[w])
				if err := p.apply(t, indexer.Event{Kind: indexer.Removed, Worker: w, Tier: tier, IDs: idsOf(paths)}); err != nil {
					t.Fatal(err)
				}
				log = fmt.Sprintf("remove %v %s %v", w, tier, paths)
			case op < 8:
				tiers := indexer.Tier(rapid.IntRange(1, 7).Draw(t, "tiers"))
				if err := p.apply(t, indexer.Event{Kind: indexer.Cleared, Worker: w, Tier: tiers}); err != nil {
					t.Fatal(err)
				}
				log = fmt.Sprintf("clear %v %s", w, tiers)
			case op < 9:
				p.removeRank(w)
				log = fmt.Sprintf("remove rank %v", w)
			case op < 10: // another tier for blocks named by id (Mooncake)
				tier := genTier.Draw(t, "tier")
				paths := named(t, mine[w])
				if err := p.apply(t, indexer.Event{Kind: indexer.Stored, ByID: true, Worker: w, Tier: tier, IDs: idsOf(paths)}); err != nil {
					t.Fatal(err)
				}
				log = fmt.Sprintf("store by id %v %s %v", w, tier, paths)
			default:
				p.removeWorker(w.Worker)
				log = fmt.Sprintf("remove worker %d", w.Worker)
			}
			queries = append(queries, genPath.Draw(t, "probe"))
			p.check(t, seqsOf(queries), fmt.Sprintf("after step %d (%s)", step, log))
		}

		// load(dump(x)) answers every query like x, but for blocks the
		// dump leaves out, as the reference's does.
		p.roundTrip(t, rapid.IntRange(1, 3).Draw(t, "loadedShards"), seqsOf(queries), "loaded index")
	})
}

// TestDeepMatchesReferenceModel drives long spans and their splits, merges
// and divergences inside them: long device-only paths over a 2-symbol
// alphabet (so ranks share long prefixes and diverge anywhere), evicted
// tail-first as engines do, mixed with occasional out-of-order removals
// and other tiers that split spans in the middle.
func TestDeepMatchesReferenceModel(t *testing.T) {
	genPath := rapid.StringOfN(rapid.RuneFrom([]rune("01")), 1, 100, -1)
	rapid.Check(t, func(t *rapid.T) {
		p := newPair(4, rapid.IntRange(1, 3).Draw(t, "shards"))
		layout(t, p)
		var queries []string
		steps := rapid.IntRange(1, 25).Draw(t, "steps")
		for step := 0; step < steps; step++ {
			w := indexer.WorkerRank{Worker: rapid.Uint64Range(1, 4).Draw(t, "worker")}
			path := genPath.Draw(t, "path")
			switch op := rapid.IntRange(0, 19).Draw(t, "op"); {
			case op < 12:
				tier := indexer.TierDevice
				if op == 0 {
					tier = indexer.TierHost
				}
				if err := p.apply(t, storedPath(w, tier, nil, indexer.BlocksOf("", path))); err != nil {
					t.Fatal(err)
				}
			case op < 18: // evict a tail, children first
				k := rapid.IntRange(1, len(path)).Draw(t, "cut")
				var ids []uint64
				for l := len(path); l >= k; l-- {
					ids = append(ids, indexer.PathID(path[:l]))
				}
				p.apply(t, indexer.Event{Kind: indexer.Removed, Worker: w, Tier: indexer.TierDevice, IDs: ids})
			case op < 19: // evict one block out of order: orphans its children
				k := rapid.IntRange(1, len(path)).Draw(t, "hole")
				p.apply(t, indexer.Event{Kind: indexer.Removed, Worker: w, Tier: indexer.TierDevice, IDs: []uint64{indexer.PathID(path[:k])}})
			default:
				p.apply(t, indexer.Event{Kind: indexer.Cleared, Worker: w, Tier: indexer.AllTiers})
			}
			queries = append(queries, path, genPath.Draw(t, "probe"))
			p.check(t, seqsOf(queries), fmt.Sprintf("after step %d (op on %v, path len %d)", step, w, len(path)))
		}
	})
}
