package scrape

import (
	"testing"

	"github.com/kvgate/kvgate/bench/engine"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// The tests' engine publishers use zmq4 PUB sockets, whose writer
		// goroutine never ends: zmq4 v0.17.0's socket Close does not stop it.
		// kvgate's own listeners use SUB and DEALER sockets only, and those
		// are checked here.
		goleak.IgnoreAnyFunction(engine.LeakedGoroutine))
}
