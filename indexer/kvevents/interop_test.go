package kvevents

import (
	"bufio"
	"encoding/json"
	"github.com/kvgate/kvgate/indexer"
	"os"
	"os/exec"
	"testing"
)

// pyPublisher drives testdata/interop_pub.py, an engine publisher built on
// libzmq and msgpack-python, the libraries vLLM and SGLang use.
type pyPublisher struct {
	t      *testing.T
	cmd    *exec.Cmd
	in     *json.Encoder
	out    *bufio.Scanner
	pub    string
	replay string
}

// python is Debian's interpreter, which has python3-zmq and python3-msgpack
// once `make test` installed them.
const python = "/usr/bin/python3"

func startPyPublisher(t *testing.T, args ...string) *pyPublisher {
	t.Helper()
	if err := exec.Command(python, "-c", "import zmq, msgpack").Run(); err != nil {
		if os.Getenv("KVGATE_INTEROP") != "" {
			t.Fatalf("%s cannot import zmq and msgpack (apt-get install -y python3-zmq python3-msgpack): %v", python, err)
		}
		t.Skipf("libzmq interop test needs %s with python3-zmq and python3-msgpack; `make test` installs them", python)
	}
	cmd := exec.Command(python, append([]string{"testdata/interop_pub.py"}, args...)...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &pyPublisher{t: t, cmd: cmd, in: json.NewEncoder(stdin), out: bufio.NewScanner(stdout)}
	t.Cleanup(func() {
		_ = stdin.Close() // end of input: the script exits
		if err := cmd.Wait(); err != nil {
			t.Errorf("interop publisher: %v", err)
		}
	})
	var ports struct{ Pub, Replay string }
	p.read(&ports)
	p.pub, p.replay = ports.Pub, ports.Replay
	return p
}

func (p *pyPublisher) read(v any) {
	p.t.Helper()
	if !p.out.Scan() {
		p.t.Fatalf("interop publisher exited: %v", p.out.Err())
	}
	if err := json.Unmarshal(p.out.Bytes(), v); err != nil {
		p.t.Fatalf("interop publisher said %q: %v", p.out.Text(), err)
	}
}

func (p *pyPublisher) call(cmd map[string]any, reply any) {
	p.t.Helper()
	if err := p.in.Encode(cmd); err != nil {
		p.t.Fatal(err)
	}
	p.read(reply)
}

// pyEvent is one event as the script takes it, and as the index should see it.
type pyEvent map[string]any

func (p *pyPublisher) publish(encoding string, drop bool, rank any, twoElement bool, evs ...pyEvent) uint64 {
	p.t.Helper()
	var reply struct {
		Seq   *uint64
		Error string
	}
	p.call(map[string]any{"cmd": "publish", "encoding": encoding, "drop": drop,
		"batch": map[string]any{"ts": 1.5, "rank": rank, "two_element": twoElement, "events": evs}}, &reply)
	if reply.Seq == nil {
		p.t.Fatalf("publish: %s", reply.Error)
	}
	return *reply.Seq
}

func pyStored(ids []uint64, parent *uint64, tokens []uint32, medium any) pyEvent {
	ev := pyEvent{"type": "BlockStored", "block_hashes": ids, "token_ids": tokens, "block_size": testBS, "medium": medium}
	if parent != nil {
		ev["parent_block_hash"] = *parent
	}
	return ev
}

// TestInteropLibzmq ingests everything a libzmq publisher sends, in both
// event encodings and both replay reply styles, including a batch dropped
// from the live stream that only replay delivers.
func TestInteropLibzmq(t *testing.T) {
	for _, style := range []string{"new", "old"} {
		t.Run(style, func(t *testing.T) {
			py := startPyPublisher(t, "--reply-style", style, "--topic", "kv@rank0")
			r := newRig(t, IngestOptions{})
			if err := r.g.Register(Registration{Key: testKey, BlockSize: testBS, Worker: 9, Endpoint: py.pub,
				ReplayEndpoint: py.replay, Topic: "kv"}); err != nil {
				t.Fatal(err)
			}
			var ok struct{ OK bool }
			py.call(map[string]any{"cmd": "wait_sub"}, &ok)

			w0, w2 := indexer.WorkerRank{Worker: 9, Rank: 0}, indexer.WorkerRank{Worker: 9, Rank: 2}
			big := uint64(1<<63 + 77)
			a := root(big, 2)
			b := child(big+1, 20, 2) // arrives only through replay
			c := root(30, 1)
			d := root(40, 2)
			var want []indexer.Event
			py.publish("map", false, nil, false, pyStored(a.BlockHashes, nil, a.TokenIDs, "GPU"))
			want = append(want, indexEvent(w0, indexer.TierDevice, a))
			py.publish("array", true, nil, false, pyStored(b.BlockHashes, b.Parent, b.TokenIDs, nil))
			want = append(want, indexEvent(w0, indexer.TierDevice, b))
			py.publish("array", false, nil, true, pyStored(c.BlockHashes, nil, c.TokenIDs, "CPU"),
				pyEvent{"type": "BlockRemoved", "block_hashes": []uint64{21}, "medium": nil})
			want = append(want, indexEvent(w0, indexer.TierHost, c), removed(w0, indexer.TierDevice, 21))
			py.publish("map", false, 2, false, pyStored(d.BlockHashes, nil, d.TokenIDs, nil))
			want = append(want, indexEvent(w2, indexer.TierDevice, d))
			last := py.publish("array", false, 2, false, pyEvent{"type": "AllBlocksCleared"})
			want = append(want, indexer.Event{Kind: indexer.Cleared, Worker: w2, Tier: indexer.AllTiers})

			r.waitApplied(9, 0, last)
			r.check(expect(t, want...))
			if got := counter(t, r.m.batchesReplayed); got < 1 {
				t.Errorf("replayed %v batches, want >= 1", got)
			}
			for _, reason := range []string{lostGap, lostBeforeJoin} {
				if got := counter(t, r.m.batchesLost.WithLabelValues(reason)); got != 0 {
					t.Errorf("lost %v batches (%s)", got, reason)
				}
			}
			if got := counter(t, r.m.decodeErrors); got != 0 {
				t.Errorf("%v decode errors", got)
			}
		})
	}
}
