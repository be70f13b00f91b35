package indexer

import (
	"testing"

	"pgregory.net/rapid"
)

func TestBlockTable(t *testing.T) {
	var bt blockTable
	// An id whose mix shares 5's low half: the table keeps mixes in two
	// halves.
	sameLow := unmix(mix(5) + 1<<32)
	steps := []struct {
		op  string // put, del, get
		id  uint64
		key uint32 // the word
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
		{"put", sameLow, 9, false, 3}, // its mix has 5's low half
		{"get", sameLow, 9, true, 3},
		{"get", 5, 51, true, 3},
		{"del", sameLow, 0, true, 2},
		{"get", sameLow, 0, false, 2},
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
// reserve makes room for a whole event at once, at load 4/5, and trim
// gives back what a peak left unused, but only below load 6/10.
func TestBlockTableSize(t *testing.T) {
	cases := []struct {
		name     string
		put, del int // entries put (ids 1..put), then deleted (the first del)
		reserve  int // reserved after the puts
		trim     bool
		wantSize int // slots after
	}{
		{name: "empty", wantSize: 0},
		{name: "grows by a quarter", put: 15, wantSize: 20},
		{name: "reserve grows once to load 4/5", put: 15, reserve: 1000, wantSize: 1269},
		{name: "reserve within the load", put: 10, reserve: 4, wantSize: 16},
		{name: "trim above 6/10 keeps", put: 1000, del: 100, trim: true, wantSize: 1293},
		{name: "trim below 6/10 shrinks to 4/5", put: 1000, del: 300, trim: true, wantSize: 876},
		{name: "no trim, no shrink", put: 1000, del: 500, wantSize: 1293},
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
				trim(&bt)
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
					trim(&bt)
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
		checkBlockTable(t, &bt)
		got := map[uint64]uint32{}
		bt.each(func(id uint64, node uint32) { got[id] = node })
		if len(got) != len(ref) {
			t.Fatalf("each lists %d entries, want %d", len(got), len(ref))
		}
		for id, key := range ref {
			if got[id] != key {
				t.Fatalf("each: id %d has key %d, want %d", id, got[id], key)
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
func checkRobinHood(t fatalHelper, name string, size int, distOf func(i int) int) {
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

// checkBlockTable fails t unless bt's entries are in Robin Hood order
// (homes in order along a run) and those with the same home in order of
// their mixed ids (what find relies on).
func checkBlockTable(t fatalHelper, bt *blockTable) {
	size := len(bt.tab)
	distOf := func(i int) int {
		if m := bt.tab[i].mixed(); m != 0 {
			return dist(m, i, size)
		}
		return -1
	}
	checkRobinHood(t, "engine-id table", size, distOf)
	for i := range size {
		j := (i + 1) % size
		mi, mj := bt.tab[i].mixed(), bt.tab[j].mixed()
		if mi != 0 && mj != 0 && home(mi, size) == home(mj, size) && mi >= mj {
			t.Fatalf("engine-id table: slot %d (mix %#x) is after slot %d (mix %#x), of the same home", j, mj, i, mi)
		}
	}
}

// TestBlockTableResizeWraps resizes tables whose runs wrap around the end,
// which resized places by shifting, and checks every entry is found.
func TestBlockTableResizeWraps(t *testing.T) {
	cases := []struct {
		name      string
		low, high int // entries with the smallest and with the largest mixes
		size      int // resized to
	}{
		{"grow", 4, 12, 64},
		{"shrink", 4, 12, 20},
		{"only the end", 0, 15, 18},
		{"full run to the end", 10, 10, 21},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var bt blockTable
			var ids []uint64
			for k := range c.low {
				ids = append(ids, unmix(uint64(k+1)))
			}
			for k := range c.high {
				ids = append(ids, unmix(^uint64(0)-uint64(k)))
			}
			for _, id := range ids {
				bt.put(id, uint32(id))
			}
			checkBlockTable(t, &bt)
			if size := len(bt.tab); bt.tab[0].mixed() == 0 || home(bt.tab[0].mixed(), size) == 0 {
				t.Fatalf("the run at slot 0 does not wrap: the test sets nothing up")
			}
			bt.tab = bt.resized(c.size)
			checkBlockTable(t, &bt)
			for _, id := range ids {
				if w, ok := bt.get(id); !ok || w != uint32(id) {
					t.Fatalf("get(%#x) = %d, %v after resizing to %d", id, w, ok, c.size)
				}
			}
		})
	}
}

func TestUnmix(t *testing.T) {
	for _, k := range []uint64{0, 1, 5, 1 << 40, ^uint64(0), 0x9e3779b97f4a7c15} {
		if got := unmix(mix(k)); got != k {
			t.Errorf("unmix(mix(%#x)) = %#x", k, got)
		}
	}
}

// trim shrinks bt as a writer does after removals (see spanTree.trimmed).
func trim(bt *blockTable) {
	if tab := bt.trimmed(); tab != nil {
		bt.tab = tab
	}
}

// put sets the word of id, whether or not id has one. The index never
// overwrites (see spanTree.claim); the tests do.
func (t *blockTable) put(id uint64, word uint32) {
	if !t.add(id, word, 1) {
		i, _ := t.lookup(id)
		if i < 0 {
			t.zeroWord = word
		} else {
			t.tab[i].word = word
		}
	}
}

// del removes id and reports whether it was there.
func (t *blockTable) del(id uint64) bool {
	i, ok := t.lookup(id)
	if ok {
		t.delAt(i)
	}
	return ok
}
