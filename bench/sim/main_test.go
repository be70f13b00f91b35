package sim

import (
	"testing"

	"github.com/kvgate/kvgate/bench/engine"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction(engine.LeakedGoroutine))
}
