package discovery

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/kvgate/kvgate/bench/engine"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// The engine publishers of the listener test use zmq4 PUB sockets,
		// whose writer goroutine never ends (see bench/engine's doc).
		goleak.IgnoreAnyFunction(engine.LeakedGoroutine))
}
