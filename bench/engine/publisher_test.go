package engine

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
)

// testTimeout bounds every socket operation of a test, so a lost message
// fails the test instead of hanging it.
const testTimeout = 20 * time.Second

func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

var fixedNow = func() time.Time { return time.Unix(1700000000, 250_000_000) }

const fixedTS = 1700000000.25

func startPublisher(t *testing.T, cfg Config) *Publisher {
	t.Helper()
	if cfg.Endpoint == "" {
		cfg.Endpoint = "tcp://127.0.0.1:0"
	}
	if cfg.Now == nil {
		cfg.Now = fixedNow
	}
	p, err := NewPublisher(context.Background(), cfg)
	if err != nil {
		t.Fatalf("NewPublisher: %v", err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return p
}

// subscribe connects a SUB to p, subscribed to prefix, and waits until p
// sees the subscription. The SUB is closed at cleanup, before p.
func subscribe(t *testing.T, ctx context.Context, p *Publisher, prefix string) zmq4.Socket {
	t.Helper()
	sub := zmq4.NewSub(ctx)
	t.Cleanup(func() { _ = sub.Close() })
	if err := sub.SetOption(zmq4.OptionSubscribe, prefix); err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	if err := sub.Dial(p.Endpoint()); err != nil {
		t.Fatalf("dial SUB: %v", err)
	}
	if err := p.WaitSubscribed(ctx); err != nil {
		t.Fatalf("WaitSubscribed: %v", err)
	}
	return sub
}

func dealer(t *testing.T, ctx context.Context, p *Publisher) zmq4.Socket {
	t.Helper()
	d := zmq4.NewDealer(ctx)
	t.Cleanup(func() { _ = d.Close() })
	if err := d.Dial(p.ReplayEndpoint()); err != nil {
		t.Fatalf("dial DEALER: %v", err)
	}
	return d
}

func recv(t *testing.T, s zmq4.Socket) [][]byte {
	t.Helper()
	msg, err := s.Recv()
	if err != nil {
		t.Fatalf("Recv: %v", err)
	}
	return msg.Frames
}

func seq8(seq uint64) []byte { return binary.BigEndian.AppendUint64(nil, seq) }

// replayed is one replay reply as a DEALER sees it.
type replayed struct {
	seq     uint64
	payload string
}

// requestReplay sends a well-formed replay request for start and collects
// the replies up to the end marker, checking the framing of each.
func requestReplay(t *testing.T, d zmq4.Socket, start uint64, style ReplyStyle, topic string) []replayed {
	t.Helper()
	if err := d.Send(zmq4.NewMsgFrom(nil, seq8(start))); err != nil {
		t.Fatalf("send replay request: %v", err)
	}
	return collectReplay(t, d, style, topic)
}

func collectReplay(t *testing.T, d zmq4.Socket, style ReplyStyle, topic string) []replayed {
	t.Helper()
	var out []replayed
	for {
		f := recv(t, d)
		var seq, payload []byte
		switch style {
		case ReplyWithTopic:
			if len(f) != 4 || len(f[0]) != 0 {
				t.Fatalf("reply %q: want 4 frames with an empty first", f)
			}
			seq, payload = f[2], f[3]
			wantTopic := topic
			if bytes.Equal(seq, seq8(EndSeq)) {
				wantTopic = ""
			}
			if string(f[1]) != wantTopic {
				t.Fatalf("reply topic %q, want %q", f[1], wantTopic)
			}
		case ReplyLegacy:
			if len(f) != 3 || len(f[0]) != 0 {
				t.Fatalf("reply %q: want 3 frames with an empty first", f)
			}
			seq, payload = f[1], f[2]
		}
		if len(seq) != 8 {
			t.Fatalf("reply seq frame %x: want 8 bytes", seq)
		}
		if s := binary.BigEndian.Uint64(seq); s != EndSeq {
			out = append(out, replayed{s, string(payload)})
			continue
		}
		if len(payload) != 0 {
			t.Fatalf("end marker payload %x, want empty", payload)
		}
		return out
	}
}

func TestLive(t *testing.T) {
	tests := []struct {
		name   string
		topic  string
		prefix string
	}{
		{"empty topic", "", ""},
		{"topic, subscribed to all", "kv@rank0", ""},
		{"topic, subscribed to a prefix", "kv@rank0", "kv@"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := testContext(t)
			cfg := Config{Topic: tt.topic, Rank: ptr(1), Now: fixedNow}
			p := startPublisher(t, cfg)
			sub := subscribe(t, ctx, p, tt.prefix)

			batches := [][]Event{
				{BlockStored{BlockHashes: []uint64{1, 2}, TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 2}},
				{BlockRemoved{BlockHashes: []uint64{2}}, AllBlocksCleared{}},
				{},
			}
			for i, evs := range batches {
				seq, err := p.Publish(evs...)
				if err != nil {
					t.Fatalf("Publish: %v", err)
				}
				if seq != uint64(i) {
					t.Fatalf("Publish seq %d, want %d", seq, i)
				}
			}
			if got := p.Seq(); got != uint64(len(batches)) {
				t.Errorf("Seq() = %d, want %d", got, len(batches))
			}
			for i, evs := range batches {
				want, err := EncodeBatch(fixedTS, evs, cfg)
				if err != nil {
					t.Fatal(err)
				}
				f := recv(t, sub)
				if len(f) != 3 {
					t.Fatalf("live message has %d frames, want 3: %q", len(f), f)
				}
				if string(f[0]) != tt.topic {
					t.Errorf("topic %q, want %q", f[0], tt.topic)
				}
				if !bytes.Equal(f[1], seq8(uint64(i))) {
					t.Errorf("seq frame %x, want %x", f[1], seq8(uint64(i)))
				}
				if !bytes.Equal(f[2], want) {
					t.Errorf("payload %x, want %x", f[2], want)
				}
			}
		})
	}
}

func TestPublishRawAndDrop(t *testing.T) {
	ctx := testContext(t)
	p := startPublisher(t, Config{
		ReplayEndpoint: "tcp://127.0.0.1:0",
		Drop:           func(seq uint64) bool { return seq%2 == 1 },
	})
	sub := subscribe(t, ctx, p, "")
	d := dealer(t, ctx, p)

	payload := []byte("garbage")
	for i := range 5 {
		if seq, err := p.PublishRaw(payload); err != nil || seq != uint64(i) {
			t.Fatalf("PublishRaw = %d, %v; want %d", seq, err, i)
		}
	}
	payload[0] = 'G' // PublishRaw must have copied it

	// The last batch is not dropped, so receiving it means the dropped ones
	// would have arrived before it.
	for _, want := range []uint64{0, 2, 4} {
		f := recv(t, sub)
		if got := binary.BigEndian.Uint64(f[1]); got != want || string(f[2]) != "garbage" {
			t.Fatalf("live seq %d payload %q, want %d %q", got, f[2], want, "garbage")
		}
	}
	got := requestReplay(t, d, 0, ReplyWithTopic, "")
	if len(got) != 5 {
		t.Fatalf("replayed %v, want all 5 batches", got)
	}
	for i, r := range got {
		if r.seq != uint64(i) || r.payload != "garbage" {
			t.Errorf("replayed[%d] = %v", i, r)
		}
	}
}

func TestReplay(t *testing.T) {
	for _, style := range []ReplyStyle{ReplyWithTopic, ReplyLegacy} {
		t.Run(style.String(), func(t *testing.T) {
			ctx := testContext(t)
			const topic = "kv"
			p := startPublisher(t, Config{ReplayEndpoint: "tcp://127.0.0.1:0", ReplyStyle: style, Topic: topic, BufferSteps: 4})
			d := dealer(t, ctx, p)

			if got := requestReplay(t, d, 0, style, topic); len(got) != 0 {
				t.Fatalf("replay of an empty buffer = %v", got)
			}
			for i := range 6 {
				if _, err := p.PublishRaw([]byte(fmt.Sprint("batch", i))); err != nil {
					t.Fatal(err)
				}
			}
			tests := []struct {
				start uint64
				want  []uint64
			}{
				{0, []uint64{2, 3, 4, 5}}, // 0 and 1 were evicted
				{3, []uint64{3, 4, 5}},
				{5, []uint64{5}},
				{6, nil},
				{EndSeq - 1, nil},
			}
			for _, tt := range tests {
				got := requestReplay(t, d, tt.start, style, topic)
				var want []replayed
				for _, s := range tt.want {
					want = append(want, replayed{s, fmt.Sprint("batch", s)})
				}
				if fmt.Sprint(got) != fmt.Sprint(want) {
					t.Errorf("replay from %d = %v, want %v", tt.start, got, want)
				}
			}
		})
	}
}

func TestReplayIgnoresMalformedRequests(t *testing.T) {
	ctx := testContext(t)
	p := startPublisher(t, Config{ReplayEndpoint: "tcp://127.0.0.1:0"})
	d := dealer(t, ctx, p)
	for i := range 3 {
		if _, err := p.PublishRaw([]byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	bad := []zmq4.Msg{
		zmq4.NewMsgFrom(seq8(0)),                      // no empty delimiter
		zmq4.NewMsgFrom([]byte("x"), seq8(0)),         // non-empty delimiter
		zmq4.NewMsgFrom(nil, []byte{0, 0, 0, 0}),      // short seq
		zmq4.NewMsgFrom(nil, seq8(0), []byte("more")), // extra frame
	}
	for _, m := range bad {
		if err := d.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	// Requests on one connection are served in order, so if any malformed
	// request were answered, its replies would come first.
	got := requestReplay(t, d, 2, ReplyWithTopic, "")
	if len(got) != 1 || got[0].seq != 2 {
		t.Fatalf("first replies %v, want only seq 2", got)
	}
}

func TestReplayConcurrentWithPublish(t *testing.T) {
	ctx := testContext(t)
	p := startPublisher(t, Config{ReplayEndpoint: "tcp://127.0.0.1:0", BufferSteps: 16})
	var wg sync.WaitGroup
	wg.Go(func() {
		for range 200 {
			if _, err := p.PublishRaw([]byte("x")); err != nil {
				t.Error(err)
				return
			}
		}
	})
	for range 3 {
		wg.Go(func() {
			d := zmq4.NewDealer(ctx)
			defer d.Close()
			if err := d.Dial(p.ReplayEndpoint()); err != nil {
				t.Error(err)
				return
			}
			for range 10 {
				if err := d.Send(zmq4.NewMsgFrom(nil, seq8(0))); err != nil {
					t.Error(err)
					return
				}
				var last uint64
				for n := 0; ; n++ {
					msg, err := d.Recv()
					if err != nil {
						t.Error(err)
						return
					}
					s := binary.BigEndian.Uint64(msg.Frames[2])
					if s == EndSeq {
						break
					}
					if n > 0 && s != last+1 {
						t.Errorf("replay not consecutive: %d after %d", s, last)
					}
					if n >= 16 {
						t.Errorf("replay longer than the buffer")
					}
					last = s
				}
			}
		})
	}
	wg.Wait()
}

func TestRestartOnSamePort(t *testing.T) {
	ctx := testContext(t)
	first, err := NewPublisher(ctx, Config{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	ep, rep := first.Endpoint(), first.ReplayEndpoint()
	// A connected subscriber and replay client make the server side hold
	// accepted connections when it closes.
	sub := zmq4.NewSub(ctx)
	defer sub.Close()
	if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		t.Fatal(err)
	}
	if err := sub.Dial(ep); err != nil {
		t.Fatal(err)
	}
	if err := first.WaitSubscribed(ctx); err != nil {
		t.Fatal(err)
	}
	d := dealer(t, ctx, first)
	for range 3 {
		if _, err := first.PublishRaw([]byte("old")); err != nil {
			t.Fatal(err)
		}
	}
	if got := requestReplay(t, d, 0, ReplyWithTopic, ""); len(got) != 3 {
		t.Fatalf("replay before restart = %v", got)
	}
	if err := first.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, err := first.PublishRaw(nil); !errors.Is(err, ErrClosed) {
		t.Errorf("PublishRaw after Close = %v, want ErrClosed", err)
	}
	if err := first.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}

	second := startPublisher(t, Config{Endpoint: ep, ReplayEndpoint: rep})
	if second.Endpoint() != ep || second.ReplayEndpoint() != rep {
		t.Fatalf("restarted on %s %s, want %s %s", second.Endpoint(), second.ReplayEndpoint(), ep, rep)
	}
	if s := second.Seq(); s != 0 {
		t.Errorf("Seq after restart = %d, want 0", s)
	}
	fresh := subscribe(t, ctx, second, "")
	if seq, err := second.PublishRaw([]byte("new")); err != nil || seq != 0 {
		t.Fatalf("PublishRaw after restart = %d, %v", seq, err)
	}
	if f := recv(t, fresh); !bytes.Equal(f[1], seq8(0)) || string(f[2]) != "new" {
		t.Errorf("live after restart %q", f)
	}
	got := requestReplay(t, dealer(t, ctx, second), 0, ReplyWithTopic, "")
	if len(got) != 1 || got[0] != (replayed{0, "new"}) {
		t.Errorf("replay after restart = %v", got)
	}
}

func TestRanksFreePorts(t *testing.T) {
	ctx := testContext(t)
	pubs, err := Ranks(ctx, Config{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0"}, 3)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for r, p := range pubs {
		t.Cleanup(func() { _ = p.Close() })
		for _, ep := range []string{p.Endpoint(), p.ReplayEndpoint()} {
			if seen[ep] {
				t.Errorf("rank %d reuses %s", r, ep)
			}
			seen[ep] = true
		}
		if _, err := p.Publish(); err != nil {
			t.Fatal(err)
		}
		got := requestReplay(t, dealer(t, ctx, p), 0, ReplyWithTopic, "")
		if len(got) != 1 {
			t.Fatalf("rank %d replay %v", r, got)
		}
		batch := decode(t, []byte(got[0].payload)).([]any)
		if batch[2] != int64(r) {
			t.Errorf("rank %d batch rank %v", r, batch[2])
		}
	}
}

func TestRanksOffsetPorts(t *testing.T) {
	const n = 3
	ctx := testContext(t)
	// Explicit ports may be taken: by other processes, or by client sockets
	// in TIME_WAIT, which block a bind for a minute. Bases are drawn below
	// Linux's default ephemeral range (32768-60999) to avoid the latter, and
	// a base with a taken port is replaced.
	for attempt := 0; ; attempt++ {
		base := 20000 + rand.IntN(10000)
		cfg := Config{
			Endpoint:       "tcp://127.0.0.1:" + strconv.Itoa(base),
			ReplayEndpoint: "tcp://127.0.0.1:" + strconv.Itoa(base+n),
		}
		pubs, err := Ranks(ctx, cfg, n)
		if errors.Is(err, syscall.EADDRINUSE) && attempt < 20 {
			t.Logf("attempt %d: %v", attempt, err)
			continue
		}
		if err != nil {
			t.Fatalf("Ranks: %v", err)
		}
		for r, p := range pubs {
			t.Cleanup(func() { _ = p.Close() })
			if want := "tcp://127.0.0.1:" + strconv.Itoa(base+r); p.Endpoint() != want {
				t.Errorf("rank %d endpoint %s, want %s", r, p.Endpoint(), want)
			}
			if want := "tcp://127.0.0.1:" + strconv.Itoa(base+n+r); p.ReplayEndpoint() != want {
				t.Errorf("rank %d replay endpoint %s, want %s", r, p.ReplayEndpoint(), want)
			}
		}
		// A second set on the same ports fails and closes what it opened.
		if _, err := Ranks(ctx, cfg, n); !errors.Is(err, syscall.EADDRINUSE) {
			t.Errorf("Ranks on taken ports = %v, want EADDRINUSE", err)
		}
		return
	}
}

func TestOffsetEndpoint(t *testing.T) {
	tests := []struct {
		ep   string
		rank int
		want string
		err  bool
	}{
		{"tcp://*:5557", 0, "tcp://*:5557", false},
		{"tcp://*:5557", 2, "tcp://*:5559", false},
		{"tcp://127.0.0.1:0", 3, "tcp://127.0.0.1:0", false},
		{"tcp://[::1]:5558", 1, "tcp://[::1]:5559", false},
		{"ipc:///tmp/kv", 1, "ipc:///tmp/kv_dp1", false},
		{"inproc://kv", 0, "inproc://kv_dp0", false},
		{"tcp://host", 1, "", true},
		{"tcp://host:http", 1, "", true},
		{"udp://host:1", 1, "", true},
		{"host:1", 1, "", true},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.ep, "/", tt.rank), func(t *testing.T) {
			got, err := OffsetEndpoint(tt.ep, tt.rank)
			if (err != nil) != tt.err || got != tt.want {
				t.Errorf("OffsetEndpoint = %q, %v; want %q, error %v", got, err, tt.want, tt.err)
			}
		})
	}
}

func TestNewPublisherErrors(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name string
		ctx  context.Context
		cfg  Config
	}{
		{"cancelled context", cancelled, Config{Endpoint: "tcp://127.0.0.1:0"}},
		{"no endpoint", context.Background(), Config{}},
		{"negative buffer", context.Background(), Config{Endpoint: "tcp://127.0.0.1:0", BufferSteps: -1}},
		{"bad endpoint", context.Background(), Config{Endpoint: "bogus"}},
		{"bad replay endpoint", context.Background(), Config{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://256.0.0.1:1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if p, err := NewPublisher(tt.ctx, tt.cfg); err == nil {
				_ = p.Close()
				t.Error("NewPublisher succeeded, want an error")
			}
		})
	}
}

func TestWaitSubscribed(t *testing.T) {
	p := startPublisher(t, Config{Topic: "kv"})
	t.Run("no subscriber", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		if err := p.WaitSubscribed(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("WaitSubscribed = %v, want DeadlineExceeded", err)
		}
	})
	t.Run("other topic does not count", func(t *testing.T) {
		ctx := testContext(t)
		sub := zmq4.NewSub(ctx)
		defer sub.Close()
		if err := sub.SetOption(zmq4.OptionSubscribe, "other"); err != nil {
			t.Fatal(err)
		}
		if err := sub.Dial(p.Endpoint()); err != nil {
			t.Fatal(err)
		}
		short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		if err := p.WaitSubscribed(short); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("WaitSubscribed = %v, want DeadlineExceeded", err)
		}
	})
	t.Run("closed", func(t *testing.T) {
		q := startPublisher(t, Config{})
		if err := q.Close(); err != nil {
			t.Fatal(err)
		}
		if err := q.WaitSubscribed(testContext(t)); !errors.Is(err, ErrClosed) {
			t.Errorf("WaitSubscribed = %v, want ErrClosed", err)
		}
	})
}

// TestCloseWhileReplaying closes a publisher whose ROUTER is flooded with
// pipelined requests for large batches that the requester does not read:
// Close must not hang, and zmq4's connection readers, blocked on the
// ROUTER's full receive queue, must exit (goleak checks).
func TestCloseWhileReplaying(t *testing.T) {
	ctx := testContext(t)
	p, err := NewPublisher(ctx, Config{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	for range 4 {
		if _, err := p.PublishRaw(bytes.Repeat([]byte("x"), 1<<20)); err != nil {
			t.Fatal(err)
		}
	}
	d := zmq4.NewDealer(ctx)
	defer d.Close()
	if err := d.Dial(p.ReplayEndpoint()); err != nil {
		t.Fatal(err)
	}
	for range 30 {
		if err := d.Send(zmq4.NewMsgFrom(nil, seq8(0))); err != nil {
			t.Fatal(err)
		}
	}
	closed := make(chan error, 1)
	go func() { closed <- p.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("Close: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("Close hung")
	}
	// The DEALER's reader, too, may be blocked on its full queue; it exits
	// after queueing the error for the closed connection, so read up to it.
	for {
		if _, err := d.Recv(); err != nil {
			break
		}
	}
}
