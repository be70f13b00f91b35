package indexer

import (
	"math/bits"
	"slices"
)

// This file is the match: walking a published view of a spanTree for a
// prompt's sequence hashes.

// classTiers are the tiers of each tier class: device; device or host;
// any.
var classTiers = [nClasses]Tier{TierDevice, TierDevice | TierHost, AllTiers}

// runMatch is the state of one match on a spanTree.
type runMatch struct {
	cands [nClasses][]uint64
	reach [nClasses][]int32 // per slot, where it dropped out of each class
	all   []uint64
}

func (m *runMatch) reset(slots int) {
	w := (slots + 63) / 64
	for c := range nClasses {
		m.cands[c] = slices.Grow(m.cands[c][:0], w)[:w]
		clear(m.cands[c])
	}
	for c := range nClasses {
		m.reach[c] = slices.Grow(m.reach[c][:0], slots)[:slots]
	}
	m.all = slices.Grow(m.all[:0], w)[:w]
}

// match appends to dst the Overlap of every rank holding seq[0].
func (t *view) match(seq []uint64, m *runMatch, dst []Overlap) []Overlap {
	if len(seq) == 0 {
		return dst
	}
	s, ok := t.childSpan(noBlock, seq[0])
	if !ok {
		return dst
	}
	m.reset(len(t.who))
	S := &t.spans[s]
	first := &t.sets[S.set]
	for c := range nClasses {
		copy(m.cands[c], first.classBits(c))
	}
	copy(m.all, m.cands[classAny])
	// A rank not in a class from the first block has 0 in it; others get
	// the depth where they drop out (in reach), or the match's end.
	for c := range nClasses {
		for i, x := range m.all {
			for x &^= m.cands[c][i]; x != 0; x &= x - 1 {
				m.reach[c][i*64+bits.TrailingZeros64(x)] = 0
			}
		}
	}
	live := 0 // ranks in cands[classAny]
	for _, x := range m.cands[classAny] {
		live += bits.OnesCount64(x)
	}
	n := live // ranks emitted: all of m.all
	last := uint32(len(seq) - 1)
	var reached uint32 // where the ranks still in cands end
	for {
		end := S.depth + S.n - 1
		hi := min(end, last)
		key := S.end
		if hi != end {
			key = t.blocks.at(S.first + hi - S.depth).key
		}
		if seq[hi] != key {
			reached = t.diverge(seq, S, hi) + 1
			break
		}
		if hi == last {
			reached = last + 1
			break
		}
		c, ok := t.childSpan(S.first+S.n-1, seq[end+1])
		if !ok {
			reached = end + 1
			break
		}
		fromID := S.set
		S = &t.spans[c]
		if S.set == fromID {
			continue
		}
		if t.freshDiff(c, fromID) {
			// The ranks whose tiers differ here, and only they: at most
			// two per bit-set word (see diffCap).
			for _, e := range S.diff {
				s, here := e>>3, tiersOfElem(e)
				i, bit := s>>6, uint64(1)<<(s&63)
				for k := range nClasses {
					if here&classTiers[k] == 0 && m.cands[k][i]&bit != 0 {
						m.cands[k][i] &^= bit
						m.reach[k][s] = int32(end + 1)
						if k == classAny {
							live--
						}
					}
				}
			}
		} else {
			// Candidates are within from's ranks: only words where the
			// two sets differ can drop any.
			from, set := &t.sets[fromID], &t.sets[S.set]
			for k := range nClasses {
				fb, cb := from.classBits(k), set.classBits(k)
				reach := m.reach[k]
				for i, x := range m.cands[k] {
					var f, in uint64
					if i < len(fb) {
						f = fb[i]
					}
					if i < len(cb) {
						in = cb[i]
					}
					if f == in {
						continue
					}
					d := x &^ in
					if d == 0 {
						continue
					}
					m.cands[k][i] = x &^ d
					if k == classAny {
						live -= bits.OnesCount64(d)
					}
					for ; d != 0; d &= d - 1 {
						reach[i*64+bits.TrailingZeros64(d)] = int32(end + 1)
					}
				}
			}
		}
		if live == 0 {
			break // reached is not read: no rank is left in cands
		}
	}
	at := len(dst)
	dst = slices.Grow(dst, n)[:at+n]
	out := dst[at:]
	k := 0
	rd, rh, ra := m.reach[classDev], m.reach[classHost], m.reach[classAny]
	end := int32(reached)
	for i, x := range m.all {
		cd, ch, ca := m.cands[classDev][i], m.cands[classHost][i], m.cands[classAny][i]
		for ; x != 0; x &= x - 1 {
			j := bits.TrailingZeros64(x)
			s := i*64 + j
			r := &t.who[s]
			o := &out[k]
			k++
			o.Worker, o.Blocks = r.wr, r.blocks
			o.Device, o.Host, o.Disk = rd[s], rh[s], ra[s]
			if cd>>j&1 != 0 {
				o.Device = end
			}
			if ch>>j&1 != 0 {
				o.Host = end
			}
			if ca>>j&1 != 0 {
				o.Disk = end
			}
		}
	}
	return dst
}

// classBits returns the set's bit-set words of tier class c.
func (h *holdSet) classBits(c int) []uint64 { return h.bits[c*h.words : (c+1)*h.words] }

// diverge returns the depth of the last block of span S that seq matches,
// given that it matches S's first and not depth hi: the probes of a round
// are independent loads, so that their cache misses overlap.
func (t *view) diverge(seq []uint64, S *span, hi uint32) uint32 {
	lo := S.depth
	at := func(d uint32) uint64 { return t.blocks.at(S.first + d - S.depth).key }
	for hi-lo > 4 {
		q := (hi - lo) / 4
		d1, d2, d3 := lo+q, lo+2*q, lo+3*q
		k1, k2, k3 := at(d1), at(d2), at(d3)
		switch {
		case seq[d3] == k3:
			lo = d3
		case seq[d2] == k2:
			lo, hi = d2, d3
		case seq[d1] == k1:
			lo, hi = d1, d2
		default:
			hi = d1
		}
	}
	for lo+1 < hi && seq[lo+1] == at(lo+1) {
		lo++
	}
	return lo
}

// blockCounts sets, in out, how many engine ids each rank holds.
func (t *spanTree) blockCounts(out map[WorkerRank]int) {
	for wr, slot := range t.slotOf {
		out[wr] = t.ranks[slot].names.len()
	}
}
