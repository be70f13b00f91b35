package jinja

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any leaves a goroutine running.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
