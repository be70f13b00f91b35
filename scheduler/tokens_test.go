package scheduler

import (
	"errors"
	"math"
	"testing"
)

func TestAddSubTokens(t *testing.T) {
	const top = math.MaxInt64
	for _, c := range []struct{ a, b, sum, diff int64 }{
		{0, 0, 0, 0},
		{3, 5, 8, 0},
		{5, 3, 8, 2},
		{top - 1, 1, top, top - 2},
		{top - 1, 2, top, top - 3},
		{top, top, top, 0},
		{top, 0, top, top},
		{MaxTokens, MaxTokens, 2 * MaxTokens, 0},
	} {
		if got := addTokens(c.a, c.b); got != c.sum {
			t.Errorf("addTokens(%d, %d) = %d, want %d", c.a, c.b, got, c.sum)
		}
		if got := addTokens(c.b, c.a); got != c.sum {
			t.Errorf("addTokens(%d, %d) = %d, want %d", c.b, c.a, got, c.sum)
		}
		if got := subTokens(c.a, c.b); got != c.diff {
			t.Errorf("subTokens(%d, %d) = %d, want %d", c.a, c.b, got, c.diff)
		}
	}
}

// TestLoadsTokenBounds: a booking above MaxTokens is refused, and a rank's
// prefill saturates rather than wraps, so a loaded rank never looks idle.
func TestLoadsTokenBounds(t *testing.T) {
	l := NewLoads(LoadOptions{})
	l.addRanks(loadKey, 16, rk(1, 0))
	for _, n := range []int64{MaxTokens + 1, math.MaxInt64, -1} {
		if err := l.Add(loadKey, Booking{ID: "big", Worker: rk(1, 0), PrefillTokens: n}); !errors.Is(err, ErrInvalid) {
			t.Errorf("prefill %d: err = %v, want ErrInvalid", n, err)
		}
	}
	must(t, l.Add(loadKey, Booking{ID: "a", Worker: rk(1, 0), PrefillTokens: MaxTokens}))
	must(t, l.Add(loadKey, Booking{ID: "b", Worker: rk(1, 0), PrefillTokens: MaxTokens}))
	if got := loadsOf(l, loadKey)[rk(1, 0)].prefill; got != 2*MaxTokens {
		t.Fatalf("two bookings of MaxTokens: prefill %d, want %d", got, int64(2*MaxTokens))
	}

	// Past what bookings can reach: a rank at the top of int64 stays there.
	l.trackers[loadKey].order[0].prefill = math.MaxInt64 - 1
	must(t, l.Add(loadKey, Booking{ID: "c", Worker: rk(1, 0), PrefillTokens: 10}))
	if got := loadsOf(l, loadKey)[rk(1, 0)].prefill; got != math.MaxInt64 {
		t.Errorf("saturated prefill %d, want %d", got, int64(math.MaxInt64))
	}
	pots, err := l.potentials(loadKey, []uint64{1, 2}, MaxTokens)
	if err != nil || len(pots) != 1 || pots[0].PrefillTokens != math.MaxInt64 {
		t.Errorf("potentials of a saturated rank: %+v, %v; want prefill %d", pots, err, int64(math.MaxInt64))
	}
	for _, id := range []string{"a", "b", "c"} {
		if _, err := l.Free(loadKey, id); err != nil {
			t.Fatal(err)
		}
		if got := loadsOf(l, loadKey)[rk(1, 0)].prefill; got < 0 {
			t.Fatalf("after freeing %s: prefill %d", id, got)
		}
	}
	if got := loadsOf(l, loadKey)[rk(1, 0)]; got != (load{}) {
		t.Errorf("idle rank: %+v, want no load", got)
	}
}
