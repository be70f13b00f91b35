package indexer

import (
	"fmt"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

func TestBlockTable(t *testing.T) {
	var bt blockTable
	steps := []struct {
		op  string // put, del, get
		id  uint64
		key uint32 // the node id
		ok  bool   // del: was there; get: found
		n   int    // len after
	}{
		{"get", 5, 0, false, 0},
		{"del", 5, 0, false, 0},
		{"put", 5, 50, false, 1},
		{"get", 5, 50, true, 1},
		{"put", 0, 7, false, 2}, // id 0 is kept aside
		{"get", 0, 7, true, 2},
		{"put", 5, 51, false, 2}, // overwrite
		{"get", 5, 51, true, 2},
		{"put", 1<<40 | 5, 9, false, 3}, // the same low half
		{"get", 1<<40 | 5, 9, true, 3},
		{"get", 5, 51, true, 3},
		{"del", 1<<40 | 5, 0, true, 2},
		{"get", 1<<40 | 5, 0, false, 2},
		{"del", 0, 0, true, 1},
		{"get", 0, 0, false, 1},
		{"del", 5, 0, true, 0},
		{"get", 5, 0, false, 0},
	}
	for i, s := range steps {
		switch s.op {
		case "put":
			bt.put(s.id, s.key)
		case "del":
			if got := bt.del(s.id); got != s.ok {
				t.Fatalf("step %d: del(%d) = %v, want %v", i, s.id, got, s.ok)
			}
		case "get":
			if key, ok := bt.get(s.id); ok != s.ok || key != s.key {
				t.Fatalf("step %d: get(%d) = %d, %v, want %d, %v", i, s.id, key, ok, s.key, s.ok)
			}
		}
		if bt.len() != s.n {
			t.Fatalf("step %d: len %d, want %d", i, bt.len(), s.n)
		}
	}
	if bt.tab != nil {
		t.Errorf("an emptied table keeps %d slots", len(bt.tab))
	}
}

// TestBlockTableSize checks how a blockTable's size follows its entries:
// reserve makes room for a whole event at once, and trim gives back what a
// peak left unused, but only below load 7/10.
func TestBlockTableSize(t *testing.T) {
	cases := []struct {
		name     string
		put, del int // entries put (ids 1..put), then deleted (the first del)
		reserve  int // reserved after the puts
		trim     bool
		wantSize int // slots after
	}{
		{name: "empty", wantSize: 0},
		{name: "grows by half", put: 15, wantSize: 24},
		{name: "reserve grows once to fit", put: 15, reserve: 1000, wantSize: 1128},
		{name: "reserve within the load", put: 10, reserve: 4, wantSize: 16},
		{name: "trim above 7/10 keeps", put: 1000, del: 0, trim: true, wantSize: 1369},
		{name: "trim below 7/10 shrinks to 4/5", put: 1000, del: 100, trim: true, wantSize: 1126},
		{name: "no trim, no shrink", put: 1000, del: 500, wantSize: 1369},
		{name: "trim of a small table", put: 10, del: 8, trim: true, wantSize: 16},
		{name: "emptied", put: 100, del: 100, trim: true, wantSize: 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var bt blockTable
			for id := uint64(1); id <= uint64(c.put); id++ {
				bt.put(id, uint32(id*10))
			}
			if c.reserve > 0 {
				before := len(bt.tab)
				bt.reserve(c.reserve)
				for id := uint64(c.put + 1); id <= uint64(c.put+c.reserve); id++ {
					bt.put(id, uint32(id*10))
				}
				if len(bt.tab) != c.wantSize {
					t.Fatalf("after reserving %d (from %d slots) and putting them: %d slots, want %d", c.reserve, before, len(bt.tab), c.wantSize)
				}
				return
			}
			for id := uint64(1); id <= uint64(c.del); id++ {
				if !bt.del(id) {
					t.Fatalf("del(%d) found nothing", id)
				}
			}
			if c.trim {
				bt.trim()
			}
			if len(bt.tab) != c.wantSize {
				t.Fatalf("%d slots, want %d", len(bt.tab), c.wantSize)
			}
			for id := uint64(1); id <= uint64(c.put); id++ {
				key, ok := bt.get(id)
				if want := id > uint64(c.del); ok != want || ok && key != uint32(id*10) {
					t.Fatalf("get(%d) = %d, %v after trimming", id, key, ok)
				}
			}
		})
	}
}

// TestBlockTableMatchesMap checks blockTable against a Go map under random
// puts, overwrites, deletions and growth, with ids drawn from a small range
// (collisions, id 0) or anywhere.
func TestBlockTableMatchesMap(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		genID := rapid.OneOf(rapid.Uint64Range(0, 40), rapid.Uint64())
		var bt blockTable
		ref := map[uint64]uint32{}
		var ids []uint64
		for i, n := 0, rapid.IntRange(1, 400).Draw(t, "ops"); i < n; i++ {
			switch op := rapid.IntRange(0, 10).Draw(t, "op"); {
			case op == 10: // what an event does before and after its blocks
				if rapid.Bool().Draw(t, "trim") {
					bt.trim()
				} else {
					bt.reserve(rapid.IntRange(0, 50).Draw(t, "reserve"))
				}
			case op < 6:
				id, key := genID.Draw(t, "id"), rapid.Uint32().Draw(t, "node")
				bt.put(id, key)
				ref[id] = key
				ids = append(ids, id)
			case op < 9:
				id := genID.Draw(t, "id")
				if len(ids) > 0 && op == 8 {
					id = rapid.SampledFrom(ids).Draw(t, "known")
				}
				_, had := ref[id]
				if got := bt.del(id); got != had {
					t.Fatalf("del(%d) = %v, want %v", id, got, had)
				}
				delete(ref, id)
			default:
				id := genID.Draw(t, "id")
				key, ok := bt.get(id)
				if want, had := ref[id]; ok != had || key != want {
					t.Fatalf("get(%d) = %d, %v, want %d, %v", id, key, ok, want, had)
				}
			}
			if bt.len() != len(ref) {
				t.Fatalf("len %d, want %d", bt.len(), len(ref))
			}
			if len(bt.tab) > 0 && bt.n*blockLoadDen > len(bt.tab)*blockLoadNum {
				t.Fatalf("%d entries overload %d slots", bt.n, len(bt.tab))
			}
		}
		for id, want := range ref {
			if key, ok := bt.get(id); !ok || key != want {
				t.Fatalf("get(%d) = %d, %v, want %d", id, key, ok, want)
			}
		}
		checkRobinHood(t, "engine-id table", len(bt.tab), func(i int) int {
			if id := bt.tab[i].engineID(); id != 0 {
				return dist(id, i, len(bt.tab))
			}
			return -1
		})
		got := map[uint64]uint32{}
		bt.each(func(id uint64, node uint32) { got[id] = node })
		if len(got) != len(ref) || len(bt.ids(nil)) != len(ref) {
			t.Fatalf("each lists %d entries, ids %d, want %d", len(got), len(bt.ids(nil)), len(ref))
		}
		for id, key := range ref {
			if got[id] != key {
				t.Fatalf("each: id %d has key %d, want %d", id, got[id], key)
			}
		}
	})
}

// TestNodeStoreMatchesMap checks nodeStore against a Go map of key to id
// under random adds, deletions, id reuse and growth. Keys come from a small
// range, anywhere, or from the keys of one of its tables.
func TestNodeStoreMatchesMap(t *testing.T) {
	// Keys of one table (shard 0), so that it grows and its runs wrap.
	var oneTable []uint64
	for k := uint64(0); len(oneTable) < 300; k++ {
		if tableOf(tagOf(k)) == 0 {
			oneTable = append(oneTable, k)
		}
	}
	rapid.Check(t, func(t *rapid.T) {
		genKey := rapid.OneOf(rapid.Uint64Range(0, 60), rapid.Uint64(), rapid.SampledFrom(oneTable))
		var s nodeStore
		ref := map[uint64]uint32{}
		for i, n := 0, rapid.IntRange(1, 400).Draw(t, "ops"); i < n; i++ {
			key := genKey.Draw(t, "key")
			id, live := ref[key]
			switch op := rapid.IntRange(0, 2).Draw(t, "op"); {
			case op == 0 && !live:
				nid, nd := s.add(key)
				if nid == 0 || nd.key != key || s.get(nid) != nd {
					t.Fatalf("add(%d) = %d with key %d", key, nid, nd.key)
				}
				for k, other := range ref {
					if other == nid {
						t.Fatalf("add(%d) reused id %d of live key %d", key, nid, k)
					}
				}
				nd.local = key ^ 1 // the node is the caller's to fill
				ref[key] = nid
			case op == 1 && live:
				s.del(id)
				delete(ref, key)
			default:
				if got := s.find(key); got != id {
					t.Fatalf("find(%d) = %d, want %d", key, got, id)
				}
			}
			if s.live != len(ref) {
				t.Fatalf("live %d, want %d", s.live, len(ref))
			}
			total := 0
			for sh, tab := range s.tabs {
				total += int(s.counts[sh])
				if int(s.counts[sh])*maxLoadDen > len(tab)*maxLoadNum {
					t.Fatalf("%d nodes overload the %d slots of table %d", s.counts[sh], len(tab), sh)
				}
				checkRobinHood(t, fmt.Sprintf("node table %d", sh), len(tab), func(i int) int {
					if tab[i] != 0 {
						return tagDist(tab[i], i, len(tab))
					}
					return -1
				})
			}
			if total != s.live {
				t.Fatalf("tables count %d nodes, %d live", total, s.live)
			}
		}
		seen := 0
		s.each(func(id uint32, n *node) {
			seen++
			if ref[n.key] != id || n.local != n.key^1 {
				t.Fatalf("each: node %d has key %d local %d, want id %d", id, n.key, n.local, ref[n.key])
			}
		})
		if seen != len(ref) {
			t.Fatalf("each lists %d nodes, want %d", seen, len(ref))
		}
		for key, id := range ref {
			if got := s.find(key); got != id {
				t.Fatalf("find(%d) = %d, want %d", key, got, id)
			}
		}
	})
}

// TestNodeIDsAcrossChunks fills more than one slab chunk, frees every other
// node and refills: ids are reused and every node
// stays where its id says.
func TestNodeIDsAcrossChunks(t *testing.T) {
	var s nodeStore
	const n = nodeChunk + nodeChunk/2
	ids := make([]uint32, n)
	for i := range n {
		ids[i], _ = s.add(uint64(i) * 0x9e3779b97f4a7c15)
	}
	if len(s.chunks) != 2 {
		t.Fatalf("%d chunks for %d nodes", len(s.chunks), n)
	}
	for i := 0; i < n; i += 2 {
		s.del(ids[i])
	}
	for i := 0; i < n; i += 2 {
		id, nd := s.add(uint64(i)*0x9e3779b97f4a7c15 + 1)
		if id >= uint32(n)+1 || nd.key != uint64(i)*0x9e3779b97f4a7c15+1 {
			t.Fatalf("refill %d got id %d: freed ids not reused", i, id)
		}
	}
	if len(s.chunks) != 2 || s.live != n {
		t.Fatalf("%d chunks, %d live after refill", len(s.chunks), s.live)
	}
	for i := range n {
		key := uint64(i) * 0x9e3779b97f4a7c15
		if i%2 == 0 {
			key++
		}
		if id := s.find(key); id == 0 || s.get(id).key != key {
			t.Fatalf("key of node %d not found", i)
		}
	}
}

// TestTableResize: a table resized without the lock is put in place only
// if the rank's table did not change meanwhile.
func TestTableResize(t *testing.T) {
	cases := []struct {
		name      string
		size      int
		meanwhile func(bt *blockTable)
		applied   bool
	}{
		{"unchanged", 100, func(*blockTable) {}, true},
		{"nothing to do", 0, func(*blockTable) {}, false},
		{"an entry added", 100, func(bt *blockTable) { bt.put(1000, 1) }, false},
		{"an entry deleted", 100, func(bt *blockTable) { bt.del(3) }, false},
		{"grown meanwhile", 100, func(bt *blockTable) { bt.reserve(200) }, false},
		{"an entry renamed", 100, func(bt *blockTable) { bt.put(5, 77) }, false},
		{"one deleted, another added", 100, func(bt *blockTable) { bt.del(3); bt.put(1000, 1) }, false},
		{"emptied", 100, func(bt *blockTable) {
			for id := uint64(1); id <= 20; id++ {
				bt.del(id)
			}
		}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var bt blockTable
			for id := uint64(1); id <= 20; id++ {
				bt.put(id, uint32(id))
			}
			r := prepareResize(&bt, c.size)
			c.meanwhile(&bt)
			want := map[uint64]uint32{}
			bt.each(func(id uint64, x uint32) { want[id] = x })
			before := len(bt.tab)
			r.apply(&bt)
			if applied := len(bt.tab) == c.size && before != c.size; applied != c.applied {
				t.Fatalf("%d slots -> %d, applied %v, want %v", before, len(bt.tab), applied, c.applied)
			}
			if bt.len() != len(want) {
				t.Fatalf("%d entries, want %d", bt.len(), len(want))
			}
			for id, w := range want {
				if x, ok := bt.get(id); !ok || x != w {
					t.Fatalf("get(%d) = %d, %v, want %d", id, x, ok, w)
				}
			}
		})
	}
}

func TestSizeClass(t *testing.T) {
	cases := []struct {
		n, class, size int
	}{
		{2, 0, 2},
		{3, 1, 3},
		{16, 14, 16},
		{17, 15, 18},
		{18, 15, 18},
		{19, 16, 20},
		{32, 22, 32},
		{33, 23, 36},
		{256, 46, 256},
		{257, 47, 288},
	}
	for _, c := range cases {
		if got := sizeClass(c.n); got != c.class {
			t.Errorf("sizeClass(%d) = %d, want %d", c.n, got, c.class)
		}
		if got := classSize(c.class); got != c.size {
			t.Errorf("classSize(%d) = %d, want %d", c.class, got, c.size)
		}
	}
	// Every length fits its class, which is the smallest that fits it and
	// wastes at most an eighth.
	for n := 2; n < 1<<20; n++ {
		c := sizeClass(n)
		size := classSize(c)
		if size < n || c > 0 && classSize(c-1) >= n {
			t.Fatalf("n %d: class %d of size %d (previous %d)", n, c, size, classSize(c-1))
		}
		if n <= exactUpTo && size != n || size > n+n/8+1 {
			t.Fatalf("n %d: class %d of size %d wastes too much", n, c, size)
		}
	}
}

// TestHolderArena drives lists through their size classes and back.
func TestHolderArena(t *testing.T) {
	h := func(s uint32) holder {
		return holder{slot: s, tiers: TierDevice, kids: [nClasses]uint16{uint16(s), 1, 2}}
	}
	steps := []struct {
		op   string // insert, remove, more
		i    int    // position (more: the extMore index to set)
		want []uint32
	}{
		{"insert", 0, []uint32{0, 10, 20}},
		{"more", 7, []uint32{0, 10, 20}},
		{"insert", 3, []uint32{0, 10, 20, 3}},
		{"remove", 0, []uint32{10, 20, 3}},
		{"remove", 2, []uint32{10, 20}},
		{"more", 0, []uint32{10, 20}},
	}
	var a holderArena
	at := a.pair(h(10), h(20))
	n := 2
	more := uint32(0)
	for k, st := range steps {
		switch st.op {
		case "insert":
			at = a.insert(at, n, st.i, h(st.want[st.i]))
			n++
		case "remove":
			at = a.remove(at, n, st.i)
			n--
		case "more":
			a.setMore(at, n, uint32(st.i))
			more = uint32(st.i)
		}
		l := a.list(at, n)
		got := make([]uint32, len(l))
		for j, x := range l {
			got[j] = x.slot
			if x != h(x.slot) {
				t.Fatalf("step %d: holder %d is %+v", k, j, x)
			}
		}
		if !slices.Equal(got, st.want) {
			t.Fatalf("step %d (%s %d): list %v, want %v", k, st.op, st.i, got, st.want)
		}
		if m := a.more(at, n); m != more {
			t.Fatalf("step %d: extMore %d, want %d", k, m, more)
		}
	}
	a.release(sizeClass(n), at)
	if at2 := a.pair(h(1), h(2)); at2 != at {
		t.Errorf("a freed block of class 0 was not reused: %d, freed %d", at2, at)
	}
	for c := range a.classes {
		if want := map[int]int{0: 1}[c]; a.classes[c].used != want {
			t.Errorf("class %d: %d blocks used, want %d", c, a.classes[c].used, want)
		}
	}
}

// TestHolderArenaMatchesSlices checks many lists growing and shrinking
// across chunks and classes against plain slices.
func TestHolderArenaMatchesSlices(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var a holderArena
		type list struct {
			at    uint32
			slots []uint32
			more  uint32
		}
		var lists []*list
		for step := range rapid.IntRange(1, 400).Draw(t, "steps") {
			switch op := rapid.IntRange(0, 9).Draw(t, "op"); {
			case op == 0 || len(lists) == 0:
				lists = append(lists, &list{at: a.pair(holder{slot: 1}, holder{slot: 2}), slots: []uint32{1, 2}})
			default:
				l := lists[rapid.IntRange(0, len(lists)-1).Draw(t, "list")]
				n := len(l.slots)
				switch {
				case op < 6: // grow, often far
					for range rapid.IntRange(1, 40).Draw(t, "grow") {
						i := rapid.IntRange(0, len(l.slots)).Draw(t, "at")
						s := uint32(step*1000 + len(l.slots))
						l.at = a.insert(l.at, len(l.slots), i, holder{slot: s})
						l.slots = slices.Insert(l.slots, i, s)
					}
				case op < 8 && n > 2:
					i := rapid.IntRange(0, n-1).Draw(t, "del")
					l.at = a.remove(l.at, n, i)
					l.slots = slices.Delete(l.slots, i, i+1)
				case op == 8:
					l.more = uint32(step + 1)
					a.setMore(l.at, n, l.more)
				default: // free it
					a.release(sizeClass(n), l.at)
					lists = slices.DeleteFunc(lists, func(x *list) bool { return x == l })
				}
			}
			used := map[[2]uint32]bool{}
			for k, l := range lists {
				got := a.list(l.at, len(l.slots))
				for j := range got {
					if got[j].slot != l.slots[j] {
						t.Fatalf("step %d: list %d holds %v at %d, want %v", step, k, got[j].slot, j, l.slots[j])
					}
				}
				if m := a.more(l.at, len(l.slots)); m != l.more {
					t.Fatalf("step %d: list %d extMore %d, want %d", step, k, m, l.more)
				}
				used[[2]uint32{uint32(sizeClass(len(l.slots))), l.at}] = true
			}
			// Freed lists keep no extMore in this test's books either.
			rec := &recorder{}
			checkArena(rec, &a, used)
			if len(rec.errs) > 0 {
				t.Fatal(rec.errs)
			}
		}
	})
}

// checkRobinHood fails t unless the table of size slots whose slot i is
// distOf(i) from its entry's home (-1: empty) is in Robin Hood order, so
// that a lookup can stop at the first entry closer to its home than the
// key would be: along the table, no entry is further from its home than
// the one before it by more than a slot, and none is displaced behind an
// empty slot.
func checkRobinHood(t interface{ Fatalf(string, ...any) }, name string, size int, distOf func(i int) int) {
	for i := range size {
		d := distOf(i)
		if d < 0 {
			continue
		}
		if d > 0 && distOf((i+size-1)%size) < 0 {
			t.Fatalf("%s: slot %d is displaced behind an empty slot", name, i)
		}
		j := (i + 1) % size
		if next := distOf(j); next > d+1 {
			t.Fatalf("%s: slot %d is %d from its home, slot %d %d", name, j, next, i, d)
		}
	}
}

// TestNodeTablesGrowAhead checks that storing grows the node tables
// before taking the lock for a chunk of new blocks, so that add never
// rehashes a table under it, and that the grown tables hold every node.
func TestNodeTablesGrowAhead(t *testing.T) {
	ix := NewIndex(4)
	sh := ix.shards[0]
	const events, chain = 40, 1000 // 40 000 nodes, ~40 per table
	for e := range events {
		blocks := make([]Block, chain)
		for i := range blocks {
			blocks[i] = Block{Hash: uint64(e*chain + i + 1), Local: uint64(e)<<32 | uint64(i)}
		}
		if _, err := ix.Apply(stored(WorkerRank{Worker: uint64(e % 3)}, TierDevice, nil, blocks)); err != nil {
			t.Fatal(err)
		}
	}
	if sh.nodes.live != events*chain {
		t.Fatalf("%d nodes, want %d", sh.nodes.live, events*chain)
	}
	if sh.nodes.rehashes != 0 {
		t.Errorf("%d tables grew under the lock", sh.nodes.rehashes)
	}
	for i, tab := range sh.nodes.tabs {
		if int(sh.nodes.counts[i])*maxLoadDen > len(tab)*maxLoadNum {
			t.Fatalf("table %d holds %d nodes in %d slots", i, sh.nodes.counts[i], len(tab))
		}
	}
	checkInvariants(t, ix)
}
