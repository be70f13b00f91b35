// Package poll waits in tests for a condition to hold, by polling it. It
// is for tests only; non-test code must not import it.
package poll

import (
	"testing"
	"time"
)

// Until polls cond until it holds, failing the test after a generous
// deadline. It is condition polling, not a sleep: it returns as soon as
// cond holds, and the deadline only bounds a test that would otherwise hang.
func Until(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
