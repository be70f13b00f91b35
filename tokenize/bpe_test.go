package tokenize

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
)

// TestMergeStrategiesAgree checks that the quadratic scan and the priority queue
// apply the same merges, and that segmenting long words changes nothing, on words
// from real tokenizers.
func TestMergeStrategiesAgree(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	texts := goldenTexts(t)
	for _, name := range []string{"llama2", "qwen2.5", "phi2"} {
		t.Run(name, func(t *testing.T) {
			tk := loadReal(t, name)
			m := tk.model
			st := &encScratch{}
			var words []string
			for _, s := range texts {
				words = append(words, s)
				for _, f := range strings.Fields(s) {
					words = append(words, f, "▁"+f, " "+f)
				}
			}
			for i := 0; i < 300; i++ {
				words = append(words, randomText(r, 1+r.IntN(120)))
			}
			for _, w := range words {
				if w == "" {
					continue
				}
				var syms []uint32
				if m.byteMode {
					for i := 0; i < len(w); i++ {
						syms = append(syms, m.byteIDs[w[i]])
					}
				} else {
					var err error
					if syms, err = m.charSymbols(nil, w, st); err != nil {
						t.Fatal(err)
					}
				}
				a := m.mergeScan(slices.Clone(syms), st)
				b := m.mergeHeap(slices.Clone(syms), st)
				if !slices.Equal(a, b) {
					t.Fatalf("%q: scan %v, heap %v", w, a, b)
				}
				if m.cross == nil {
					t.Fatal("segmentation is off for a real tokenizer")
				}
				seg, err := m.encodeSegments(nil, w, st)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(seg, b) {
					t.Fatalf("%q: segmented %v, whole %v", w, seg, b)
				}
			}
		})
	}
}

// TestMergeTableGrow checks the open-addressing table across growth.
func TestMergeTableGrow(t *testing.T) {
	tb := newMergeTable(0)
	for i := uint32(0); i < 5000; i++ {
		tb.put(i, i*7+1, i, i+100)
	}
	tb.put(3, 22, 99, 1) // replaces
	for i := uint32(0); i < 5000; i++ {
		want := uint64(i)<<32 | uint64(i+100)
		if i == 3 {
			want = 99<<32 | 1
		}
		if got := tb.get(i, i*7+1); got != want {
			t.Fatalf("get(%d) = %x, want %x", i, got, want)
		}
	}
	if tb.get(1, 1) != noMerge {
		t.Error("missing pair found")
	}
	var empty mergeTable
	if empty.get(1, 2) != noMerge {
		t.Error("empty table found a pair")
	}
}

func TestByteLevelTables(t *testing.T) {
	seen := map[rune]bool{}
	for b := 0; b < 256; b++ {
		r := byteLevelChars[b]
		if seen[r] {
			t.Fatalf("byte %d maps to a duplicate char %q", b, r)
		}
		seen[r] = true
		if back, ok := byteLevelByte(r); !ok || int(back) != b {
			t.Fatalf("byteLevelByte(%q) = %d, %v; want %d", r, back, ok, b)
		}
	}
	for _, r := range []rune{' ', 0x7f, 0xad, 0x100 + 68, 0x4e00} {
		if _, ok := byteLevelByte(r); ok {
			t.Errorf("byteLevelByte(%q) is a byte", r)
		}
	}
	if byteLevelChars[' '] != 'Ġ' || byteLevelChars['\n'] != 'Ċ' {
		t.Error("GPT-2 mapping of space/newline changed")
	}
}

func TestWordCache(t *testing.T) {
	c := newWordCache(64)
	words := make([]string, 200)
	for i := range words {
		words[i] = fmt.Sprintf("word%d", i)
	}
	for i, w := range words {
		c.put(c.hash(w), w, []uint32{uint32(i), 7})
		if ids, ok := c.get(c.hash(w), w); !ok || !slices.Equal(ids, []uint32{uint32(i), 7}) {
			t.Fatalf("get(%q) right after put = %v, %v", w, ids, ok)
		}
	}
	hits := 0
	for i, w := range words {
		if ids, ok := c.get(c.hash(w), w); ok {
			hits++
			if !slices.Equal(ids, []uint32{uint32(i), 7}) {
				t.Fatalf("get(%q) = %v", w, ids)
			}
		}
	}
	if hits == 0 || hits > 64 {
		t.Errorf("%d hits in a 64-slot cache", hits)
	}
	// Concurrent use (run with -race).
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 2000; i++ {
				w := words[(i*g+i)%len(words)]
				h := c.hash(w)
				if ids, ok := c.get(h, w); ok && ids[1] != 7 {
					t.Errorf("corrupt entry for %q", w)
				}
				c.put(h, w, []uint32{1, 7})
			}
		}(g)
	}
	wg.Wait()
}
