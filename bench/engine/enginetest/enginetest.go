// Package enginetest starts engine publishers (package engine) for tests and
// stops them when the test ends. It is the only place that ties the engine to
// package testing, so that binaries using the engine (kvgate sim) do not link
// it. Only _test.go files import this package.
package enginetest

import (
	"context"
	"testing"

	"github.com/kvgate/kvgate/bench/engine"
)

// Start starts a publisher for a test, on a free loopback port when
// cfg.Endpoint is empty, and closes it when the test ends.
func Start(tb testing.TB, cfg engine.Config) *engine.Publisher {
	tb.Helper()
	if cfg.Endpoint == "" {
		cfg.Endpoint = "tcp://127.0.0.1:0"
	}
	p, err := engine.NewPublisher(context.Background(), cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = p.Close() })
	return p
}
