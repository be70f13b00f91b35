package engine

import (
	"context"
	"testing"
)

// Start starts a publisher for a test, on a free loopback port when
// cfg.Endpoint is empty, and closes it when the test ends.
func Start(tb testing.TB, cfg Config) *Publisher {
	tb.Helper()
	if cfg.Endpoint == "" {
		cfg.Endpoint = "tcp://127.0.0.1:0"
	}
	p, err := NewPublisher(context.Background(), cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = p.Close() })
	return p
}
