//go:build matchphases

package indexer

import (
	"testing"
	"time"
)

// TestRanAgainBooksTheFaultedRunAsWait checks that a run of an unlocked
// match that faulted (see unlocked.go) is counted, and its phases moved to
// the match's wait, so that the phases of the run that went through stand
// alone.
func TestRanAgainBooksTheFaultedRunAsWait(t *testing.T) {
	var got MatchPhases
	f := func(p MatchPhases) { got = p }
	c := phaseClock{f: &f, last: time.Now()}
	c.d = [nPhases]time.Duration{phaseWait: 1, phaseStart: 2, phaseWalk: 3, phaseEmit: 4}
	c.ranAgain()
	if c.d[phaseWait] < 10 || c.d[phaseStart]+c.d[phaseWalk]+c.d[phaseEmit] != 0 {
		t.Errorf("phases after ranAgain: %v, want all 10ns and more in the wait", c.d)
	}
	c.lap(phaseStart)
	c.ranAgain()
	c.done(3)
	if got.Again != 2 || got.Start != 0 || got.Wait < 10 || got.Ranks != 3 {
		t.Errorf("done after two runs again: %+v, want Again 2, Start 0, Wait 10ns and more", got)
	}
	untimed := phaseClock{}
	untimed.ranAgain()
	if untimed.again != 0 {
		t.Errorf("a match not timed counted %d runs again", untimed.again)
	}
}
