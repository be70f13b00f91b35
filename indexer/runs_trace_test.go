package indexer

import (
	"bufio"
	"container/list"
	"encoding/json"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"testing"
	"time"
)

func TestRunTreeTrace(t *testing.T) {
	path := os.Getenv("RUNTREE_TRACE")
	if path == "" {
		t.Skip()
	}
	prompts := readTrace(path, 32)
	events, _ := simulate(256, 16384, prompts)
	queries := make([][]uint64, len(prompts))
	for i, p := range prompts {
		local := make([]uint64, len(p))
		for j, id := range p {
			local[j] = localOf(id)
		}
		queries[i] = SequenceHashes(nil, local)
	}
	ops := 0
	for _, ev := range events {
		ops += len(ev.Blocks) + len(ev.Hashes)
	}
	for round := range 2 {
		t0 := time.Now()
		ix := NewIndex(16)
		for _, ev := range events {
			ix.Apply(ev)
		}
		di := time.Since(t0)
		ix = nil
		runtime.GC()
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		t0 = time.Now()
		tr := newRunTree()
		for _, ev := range events {
			if _, err := tr.apply(ev); err != nil {
				t.Fatal(err)
			}
		}
		dt := time.Since(t0)
		runtime.GC()
		runtime.ReadMemStats(&m1)
		entries := 0
		for _, r := range tr.ranks {
			entries += r.names.len()
		}
		t.Logf("runTree memory: %d entries, %.1f B per entry", entries, (float64(m1.HeapAlloc)-float64(m0.HeapAlloc))/float64(entries))
		ix = NewIndex(16)
		for _, ev := range events {
			ix.Apply(ev)
		}
		t.Logf("round %d apply: index %.2f M/s, runTree %.2f M/s; %d spans, %d sets", round, float64(ops)/di.Seconds()/1e6, float64(ops)/dt.Seconds()/1e6, len(tr.spans)-len(tr.free), len(tr.sets)-len(tr.freeS))
		var li, lt []time.Duration
		var rm runMatch
		var buf []Overlap
		bad, outs := 0, 0
		for _, q := range queries {
			t0 := time.Now()
			buf = ix.Match(q, buf[:0])
			li = append(li, time.Since(t0))
			a := slices.Clone(buf)
			t0 = time.Now()
			buf = tr.match(q, &rm, buf[:0], new(phaseClock))
			lt = append(lt, time.Since(t0))
			outs += len(buf)
			sortOverlaps(a)
			sortOverlaps(buf)
			if !slices.Equal(a, buf) {
				bad++
			}
		}
		var lt2, lt3 []time.Duration
		for _, q := range queries {
			t0 := time.Now()
			buf = tr.match(q, &rm, buf[:0], new(phaseClock))
			lt2 = append(lt2, time.Since(t0))
		}
		for _, q := range queries {
			t0 := time.Now()
			tr.match(q[:1], &rm, buf[:0], new(phaseClock))
			lt3 = append(lt3, time.Since(t0))
		}
		var li3 []time.Duration
		for _, q := range queries {
			t0 := time.Now()
			buf = ix.Match(q[:1], buf[:0])
			li3 = append(li3, time.Since(t0))
		}
		slices.Sort(li3)
		t.Logf("index first block only: p50 %v p99 %v", li3[len(li3)/2], li3[len(li3)*99/100])
		slices.Sort(lt2)
		slices.Sort(lt3)
		slices.Sort(li)
		slices.Sort(lt)
		at := func(l []time.Duration, p float64) time.Duration { return l[int(float64(len(l)-1)*p/100)] }
		t.Logf("idle match: index p50 %v p99 %v; runTree p50 %v p99 %v; %d differ, %.1f overlaps per match", at(li, 50), at(li, 99), at(lt, 50), at(lt, 99), bad, float64(outs)/float64(len(queries)))
		t.Logf("runTree alone: p50 %v p99 %v; first block only: p50 %v p99 %v", at(lt2, 50), at(lt2, 99), at(lt3, 50), at(lt3, 99))
	}
}

func readTrace(path string, split int) [][]uint64 {
	f, err := os.Open(path)
	if err != nil {
		panic(err)
	}
	defer f.Close()
	var out [][]uint64
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var r struct {
			HashIDs []uint64 `json:"hash_ids"`
		}
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			continue
		}
		ids := make([]uint64, 0, len(r.HashIDs)*split)
		for _, h := range r.HashIDs {
			for j := range split {
				ids = append(ids, h*uint64(split)+uint64(j)+1)
			}
		}
		out = append(out, ids)
	}
	return out
}

func localOf(id uint64) uint64 {
	var toks [16]uint32
	x := id
	for i := range toks {
		x = x*6364136223846793005 + 1442695040888963407
		toks[i] = uint32(x>>33) % 128000
	}
	return LocalHash(toks[:], BaseSeed, nil)
}

type lru struct {
	order *list.List
	at    map[uint64]*list.Element
}

func simulate(workers, capacity int, prompts [][]uint64) ([]Event, []int) {
	firsts := make([]int, len(prompts))
	rng := rand.New(rand.NewPCG(1, 0x6b7667617465))
	caches := make([]lru, workers)
	for i := range caches {
		caches[i] = lru{order: list.New(), at: make(map[uint64]*list.Element)}
	}
	var events []Event
	for r, p := range prompts {
		firsts[r] = len(events)
		w := rng.IntN(workers)
		c := &caches[w]
		wr := WorkerRank{Worker: uint64(w)}
		miss := 0
		for miss < len(p) {
			if _, ok := c.at[p[miss]]; !ok {
				break
			}
			miss++
		}
		if miss < len(p) {
			ev := Event{Kind: Stored, Worker: wr, Tier: TierDevice}
			if miss > 0 {
				ev.Parent, ev.HasParent = p[miss-1], true
			}
			for _, id := range p[miss:] {
				ev.Blocks = append(ev.Blocks, Block{Hash: id, Local: localOf(id)})
			}
			events = append(events, ev)
		}
		for i := len(p) - 1; i >= 0; i-- {
			if e, ok := c.at[p[i]]; ok {
				c.order.MoveToFront(e)
			} else {
				c.at[p[i]] = c.order.PushFront(p[i])
			}
		}
		if c.order.Len() > capacity {
			ev := Event{Kind: Removed, Worker: wr, Tier: TierDevice}
			for c.order.Len() > capacity {
				id := c.order.Remove(c.order.Back()).(uint64)
				delete(c.at, id)
				ev.Hashes = append(ev.Hashes, id)
			}
			events = append(events, ev)
		}
	}
	return events, firsts
}
