package main

import (
	"bytes"
	"github.com/kvgate/kvgate/bench/engine"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// Engine publishers' PUB writer goroutines never end (zmq4 v0.17.0).
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction(engine.LeakedGoroutine))
}

func TestRunSmall(t *testing.T) {
	for _, enc := range []string{"map", "array"} {
		var out bytes.Buffer
		cfg := config{publishers: 2, batches: 50, events: 2, blocks: 3, blockSize: 4, eventThreads: 2, encoding: enc}
		if err := run(cfg, &out); err != nil {
			t.Fatal(err)
		}
		// 2 publishers x (50 batches x 2 stored + 49 removed + 1 final removed).
		if !strings.Contains(out.String(), "batches=100 events=300 block_ops=1200 ") {
			t.Errorf("unexpected report:\n%s", out.String())
		}
	}
}

func TestRunRejectsBadConfig(t *testing.T) {
	if err := run(config{encoding: "map"}, &bytes.Buffer{}); err == nil {
		t.Error("zero config accepted")
	}
	if err := run(config{publishers: 1, batches: 1, events: 1, blocks: 1, blockSize: 1, eventThreads: 1, encoding: "json"}, &bytes.Buffer{}); err == nil {
		t.Error("unknown encoding accepted")
	}
}
