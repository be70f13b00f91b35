package engine

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// zmq4 never stops a PUB socket's writer goroutine (see the package
	// doc). It parks in sync.Cond.Wait, so IgnoreTopFunction cannot name it;
	// IgnoreAnyFunction with that one function can.
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction(LeakedGoroutine))
}
