package indexer

import (
	"fmt"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// refModel is a naive reference for Index: every worker rank maps engine ids
// to the full path of symbols from the root, with its tiers. It uses no
// sequence hashes and no tree.
type refModel struct {
	ranks map[WorkerRank]map[uint64]refEntry
}

type refEntry struct {
	path  string // symbols from the root, e.g. "0312"
	tiers Tier
}

// Symbols are block contents; a path is a string of symbols '0'..'3'.
func symLocal(c byte) uint64 {
	s := uint32(c - '0')
	return LocalHash([]uint32{s, s + 10, s + 20, s + 30}, BaseSeed, nil)
}

// pathID is the engine id of a path: content-derived, as vLLM's are.
func pathID(path string) uint64 {
	return LocalHash([]uint32{uint32(len(path))}, 99, []uint64{uint64(len(path))}) ^ hashString(path)
}

func hashString(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h = (h ^ uint64(s[i])) * 1099511628211
	}
	return h
}

func (m *refModel) store(w WorkerRank, t Tier, parent string, hasParent bool, blocks string) bool {
	held := m.ranks[w]
	if hasParent {
		if _, ok := held[pathID(parent)]; !ok {
			return false
		}
	}
	if held == nil {
		held = make(map[uint64]refEntry)
		m.ranks[w] = held
	}
	base := ""
	if hasParent {
		base = held[pathID(parent)].path
	}
	for i := range blocks {
		p := base + blocks[:i+1]
		id := pathID(p)
		e := held[id]
		e.path, e.tiers = p, e.tiers|t
		held[id] = e
	}
	return true
}

func (m *refModel) remove(w WorkerRank, t Tier, ids []uint64) {
	for _, id := range ids {
		if e, ok := m.ranks[w][id]; ok {
			e.tiers &^= t
			if e.tiers == 0 {
				delete(m.ranks[w], id)
			} else {
				m.ranks[w][id] = e
			}
		}
	}
}

// storeByID adds t to the blocks of ids the rank holds.
func (m *refModel) storeByID(w WorkerRank, t Tier, ids []uint64) {
	for _, id := range ids {
		if e, ok := m.ranks[w][id]; ok {
			e.tiers |= t
			m.ranks[w][id] = e
		}
	}
}

func (m *refModel) clear(w WorkerRank, t Tier) {
	for id := range m.ranks[w] {
		m.remove(w, t, []uint64{id})
	}
}

func (m *refModel) tiersOf(w WorkerRank, path string) Tier {
	var t Tier
	for _, e := range m.ranks[w] {
		if e.path == path {
			t |= e.tiers
		}
	}
	return t
}

func (m *refModel) match(query string) []Overlap {
	var out []Overlap
	for w := range m.ranks {
		o := Overlap{Worker: w}
		devOn, hostOn := true, true
		for d := range query {
			t := m.tiersOf(w, query[:d+1])
			if t == 0 {
				break
			}
			devOn = devOn && t&TierDevice != 0
			hostOn = hostOn && t&(TierDevice|TierHost) != 0
			if devOn {
				o.Device++
			}
			if hostOn {
				o.Host++
			}
			o.Disk++
		}
		if o.Disk > 0 {
			out = append(out, o)
		}
	}
	sortOverlaps(out)
	return out
}

// reachable counts, per rank, blocks whose every ancestor the rank holds.
func (m *refModel) reachable() map[WorkerRank]int {
	out := make(map[WorkerRank]int)
	for w, held := range m.ranks {
		for _, e := range held {
			ok := true
			for l := 1; l < len(e.path) && ok; l++ {
				ok = m.tiersOf(w, e.path[:l]) != 0
			}
			if ok {
				out[w]++
			}
		}
	}
	return out
}

func (m *refModel) counts() map[WorkerRank]int {
	out := make(map[WorkerRank]int)
	for w, held := range m.ranks {
		if len(held) > 0 {
			out[w] = len(held)
		}
	}
	return out
}

func sortOverlaps(o []Overlap) {
	slices.SortFunc(o, func(a, b Overlap) int { return cmpWorkerRank(a.Worker, b.Worker) })
}

func nonZero(m map[WorkerRank]int) map[WorkerRank]int {
	out := make(map[WorkerRank]int)
	for k, v := range m {
		if v > 0 {
			out[k] = v
		}
	}
	return out
}

func seqOf(path string) []uint64 {
	local := make([]uint64, len(path))
	for i := range path {
		local[i] = symLocal(path[i])
	}
	return SequenceHashes(nil, local)
}

func blocksOf(base, blocks string) []Block {
	out := make([]Block, len(blocks))
	for i := range blocks {
		out[i] = Block{Hash: pathID(base + blocks[:i+1]), Local: symLocal(blocks[i])}
	}
	return out
}

func matchSorted(ix *Index, query string) []Overlap {
	got := ix.Match(seqOf(query), nil)
	sortOverlaps(got)
	return got
}

func TestIndexMatchesReferenceModel(t *testing.T) {
	genPath := rapid.StringOfN(rapid.RuneFrom([]rune("0123")), 1, 5, -1)
	genWorker := rapid.Custom(func(t *rapid.T) WorkerRank {
		return WorkerRank{Worker: rapid.Uint64Range(1, 3).Draw(t, "worker"), Rank: rapid.Uint32Range(0, 1).Draw(t, "rank")}
	})
	genTier := rapid.SampledFrom([]Tier{TierDevice, TierHost, TierDisk})
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
			ids[i] = pathID(p)
		}
		return ids
	}

	rapid.Check(t, func(t *rapid.T) {
		ix := NewShardedIndex(4, rapid.IntRange(1, 3).Draw(t, "shards"))
		m := &refModel{ranks: make(map[WorkerRank]map[uint64]refEntry)}
		layout(t, ix, m)
		var queries []string
		mine := make(map[WorkerRank][]string) // paths each rank stored
		steps := rapid.IntRange(1, 60).Draw(t, "steps")
		for step := 0; step < steps; step++ {
			w := genWorker.Draw(t, "w")
			var log string
			switch op := rapid.IntRange(0, 10).Draw(t, "op"); {
			case op < 5: // store, often under a parent
				path := genPath.Draw(t, "path")
				k := rapid.IntRange(0, len(path)-1).Draw(t, "split")
				tier := genTier.Draw(t, "tier")
				ev := stored(w, tier, nil, blocksOf(path[:k], path[k:]))
				if k > 0 {
					ev.Parent, ev.HasParent = pathID(path[:k]), true
				}
				_, err := ix.Apply(ev)
				ok := m.store(w, tier, path[:k], k > 0, path[k:])
				if ok != (err == nil) {
					t.Fatalf("store %v %s %q|%q: index err %v, model ok %v", w, tier, path[:k], path[k:], err, ok)
				}
				queries = append(queries, path)
				mine[w] = append(mine[w], path)
				log = fmt.Sprintf("store %v %s %q|%q", w, tier, path[:k], path[k:])
			case op < 7:
				tier := genTier.Draw(t, "tier")
				paths := named(t, mine[w])
				ids := idsOf(paths)
				if _, err := ix.Apply(removed(w, tier, ids...)); err != nil {
					t.Fatal(err)
				}
				m.remove(w, tier, ids)
				log = fmt.Sprintf("remove %v %s %v", w, tier, paths)
			case op < 8:
				tiers := Tier(rapid.IntRange(1, 7).Draw(t, "tiers"))
				if _, err := ix.Apply(Event{Kind: Cleared, Worker: w, Tier: tiers}); err != nil {
					t.Fatal(err)
				}
				m.clear(w, tiers)
				log = fmt.Sprintf("clear %v %s", w, tiers)
			case op < 9:
				ix.RemoveWorkerRank(w)
				delete(m.ranks, w)
				log = fmt.Sprintf("remove rank %v", w)
			case op < 10: // another tier for blocks named by id (Mooncake)
				tier := genTier.Draw(t, "tier")
				paths := named(t, mine[w])
				ids := idsOf(paths)
				if _, err := ix.Apply(Event{Kind: Stored, ByID: true, Worker: w, Tier: tier, Hashes: ids}); err != nil {
					t.Fatal(err)
				}
				m.storeByID(w, tier, ids)
				log = fmt.Sprintf("store by id %v %s %v", w, tier, paths)
			default:
				ix.RemoveWorker(w.Worker)
				for r := range m.ranks {
					if r.Worker == w.Worker {
						delete(m.ranks, r)
					}
				}
				log = fmt.Sprintf("remove worker %d", w.Worker)
			}
			queries = append(queries, genPath.Draw(t, "probe"))
			checkQueries(t, ix, m, m.counts(), queries, fmt.Sprintf("after step %d (%s)", step, log))
			checkInvariants(t, ix)
			if got, want := nonZero(ix.BlockCounts()), m.counts(); !mapsEqual(got, want) {
				t.Fatalf("after step %d (%s): block counts %v, want %v", step, log, got, want)
			}
		}
		checkInvariants(t, ix)

		// load(dump(x)) answers every query like x.
		loaded := NewShardedIndex(4, rapid.IntRange(1, 3).Draw(t, "loadedShards"))
		if skipped, err := loaded.Load(ix.Dump()); err != nil || skipped != 0 {
			t.Fatalf("load: skipped %d, err %v", skipped, err)
		}
		checkQueries(t, loaded, m, m.reachable(), queries, "loaded index")
		if got, want := nonZero(loaded.BlockCounts()), nonZero(m.reachable()); !mapsEqual(got, want) {
			t.Fatalf("loaded block counts %v, want reachable %v", got, want)
		}
	})
}

// layout registers up to 130 other ranks first, each holding a block no
// query starts with, so that the ranks under test sit in the first
// bit-set word or further on, across word boundaries.
func layout(t *rapid.T, ix *Index, m *refModel) {
	for i := range rapid.IntRange(0, 130).Draw(t, "padRanks") {
		w := WorkerRank{Worker: 1000 + uint64(i)}
		if _, err := ix.Apply(stored(w, TierDevice, nil, blocksOf("", "9"))); err != nil {
			t.Fatal(err)
		}
		m.store(w, TierDevice, "", false, "9")
	}
}

// checkQueries compares every query's match in ix with the model's, and
// each overlap's tree size with blocks.
func checkQueries(t *rapid.T, ix *Index, m *refModel, blocks map[WorkerRank]int, queries []string, when string) {
	for _, q := range queries {
		got := matchSorted(ix, q)
		for i, o := range got {
			if int(o.Blocks) != blocks[o.Worker] {
				t.Fatalf("%s: match %q: %v holds %d blocks, want %d", when, q, o.Worker, o.Blocks, blocks[o.Worker])
			}
			got[i].Blocks = 0 // the model's overlaps leave it out
		}
		if want := m.match(q); !slices.Equal(got, want) {
			t.Fatalf("%s: match %q (%d blocks) = %v, want %v", when, q, len(q), got, want)
		}
	}
}

func mapsEqual(a, b map[WorkerRank]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestDeepMatchesReferenceModel drives long spans and their splits, merges
// and divergences inside them (see spanTree.diverge):
// long device-only paths over a 2-symbol alphabet (so ranks share long
// prefixes and diverge anywhere), evicted tail-first as engines do, mixed
// with occasional out-of-order removals and other tiers that split spans
// in the middle.
func TestDeepMatchesReferenceModel(t *testing.T) {
	genPath := rapid.StringOfN(rapid.RuneFrom([]rune("01")), 1, 100, -1)
	rapid.Check(t, func(t *rapid.T) {
		ix := NewShardedIndex(4, rapid.IntRange(1, 3).Draw(t, "shards"))
		m := &refModel{ranks: make(map[WorkerRank]map[uint64]refEntry)}
		layout(t, ix, m)
		var queries []string
		steps := rapid.IntRange(1, 25).Draw(t, "steps")
		for step := 0; step < steps; step++ {
			w := WorkerRank{Worker: rapid.Uint64Range(1, 4).Draw(t, "worker")}
			path := genPath.Draw(t, "path")
			switch op := rapid.IntRange(0, 19).Draw(t, "op"); {
			case op < 12:
				tier := TierDevice
				if op == 0 {
					tier = TierHost
				}
				if _, err := ix.Apply(stored(w, tier, nil, blocksOf("", path))); err != nil {
					t.Fatal(err)
				}
				m.store(w, tier, "", false, path)
			case op < 18: // evict a tail, children first
				k := rapid.IntRange(1, len(path)).Draw(t, "cut")
				var ids []uint64
				for l := len(path); l >= k; l-- {
					ids = append(ids, pathID(path[:l]))
				}
				ix.Apply(removed(w, TierDevice, ids...))
				m.remove(w, TierDevice, ids)
			case op < 19: // evict one block out of order: orphans its children
				k := rapid.IntRange(1, len(path)).Draw(t, "hole")
				ix.Apply(removed(w, TierDevice, pathID(path[:k])))
				m.remove(w, TierDevice, []uint64{pathID(path[:k])})
			default:
				ix.Apply(Event{Kind: Cleared, Worker: w, Tier: AllTiers})
				m.clear(w, AllTiers)
			}
			queries = append(queries, path, genPath.Draw(t, "probe"))
			checkQueries(t, ix, m, m.counts(), queries, fmt.Sprintf("after step %d (op on %v, path len %d)", step, w, len(path)))
			checkInvariants(t, ix)
		}
		checkInvariants(t, ix)
	})
}

// TestEngineIDCollisions applies random events whose engine ids come from
// a small pool, so that one block gets several ids in a rank and one id is
// reused for other content (the reference model gives each block one id,
// so it cannot judge these): after every step the index's invariants hold
// (pins count the engine ids naming each block, blocks no rank holds are
// kept only while named), and at the end load(dump(x)) answers
// every query like x.
func TestEngineIDCollisions(t *testing.T) {
	genPath := rapid.StringOfN(rapid.RuneFrom([]rune("012")), 1, 6, -1)
	genID := rapid.Uint64Range(0, 9) // 0 is kept aside by the tables
	rapid.Check(t, func(t *rapid.T) {
		ix := NewShardedIndex(4, rapid.IntRange(1, 3).Draw(t, "shards"))
		var queries []string
		steps := rapid.IntRange(1, 40).Draw(t, "steps")
		for step := 0; step < steps; step++ {
			w := WorkerRank{Worker: rapid.Uint64Range(1, 3).Draw(t, "worker")}
			tier := rapid.SampledFrom([]Tier{TierDevice, TierHost, TierDisk}).Draw(t, "tier")
			path := genPath.Draw(t, "path")
			switch op := rapid.IntRange(0, 9).Draw(t, "op"); {
			case op < 6:
				blocks := blocksOf("", path)
				for i := range blocks {
					blocks[i].Hash = genID.Draw(t, "id")
				}
				var parent *uint64
				if rapid.Bool().Draw(t, "under a parent") {
					parent = ptr(genID.Draw(t, "parent"))
				}
				// An unknown parent is an error that changes nothing.
				_, _ = ix.Apply(stored(w, tier, parent, blocks))
			case op < 8:
				var ids []uint64
				for range rapid.IntRange(1, 4).Draw(t, "removals") {
					ids = append(ids, genID.Draw(t, "removed id"))
				}
				ix.Apply(removed(w, tier, ids...))
			case op < 9:
				ix.Apply(Event{Kind: Cleared, Worker: w, Tier: tier})
			default:
				ix.RemoveWorkerRank(w)
			}
			queries = append(queries, path)
			checkInvariants(t, ix)
		}
		loaded := NewShardedIndex(4, rapid.IntRange(1, 3).Draw(t, "loadedShards"))
		if _, err := loaded.Load(ix.Dump()); err != nil {
			t.Fatalf("load: %v", err)
		}
		checkInvariants(t, loaded)
		for _, q := range queries {
			got, want := matchSorted(loaded, q), matchSorted(ix, q)
			for i := range got {
				got[i].Blocks = 0 // a dump leaves out blocks no query reaches
			}
			for i := range want {
				want[i].Blocks = 0
			}
			if !slices.Equal(got, want) {
				t.Fatalf("match %q: loaded %v, original %v", q, got, want)
			}
		}
	})
}
