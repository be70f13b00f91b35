//go:build !matchphases

package indexer

// phaseHook and phaseClock time nothing unless built with -tags
// matchphases (see phases.go): their methods are empty, and inlined away.
type (
	phaseHook  struct{}
	phaseClock struct{}
)

func (*phaseHook) set(func(MatchPhases)) bool { return false }
func (*phaseHook) begin() phaseClock          { return phaseClock{} }
func (*phaseClock) lap(int)                   {}
func (*phaseClock) done(int)                  {}
