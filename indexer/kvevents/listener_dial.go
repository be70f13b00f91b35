package kvevents

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
)

// This file connects a listener's SUB socket, through a tcp transport whose
// ZMTP handshake has a deadline.

// dial connects a SUB socket to the publisher and subscribes.
func (l *listener) dial(ctx context.Context) (zmq4.Socket, error) {
	hs := &handshake{timeout: l.g.opts.DialTimeout}
	sub := zmq4.NewSub(context.WithValue(ctx, handshakeKey{}, hs), zmq4.WithDialerMaxRetries(0),
		zmq4.WithDialerTimeout(l.g.opts.DialTimeout), zmq4.WithAutomaticReconnect(false))
	if err := sub.SetOption(zmq4.OptionSubscribe, l.reg.Topic); err != nil {
		closeSocket(sub)
		return nil, fmt.Errorf("subscribe %q: %w", l.reg.Topic, err)
	}
	if err := dialBounded(sub, hs, l.reg.Endpoint); err != nil {
		closeSocket(sub)
		return nil, fmt.Errorf("connect %s: %w", l.reg.Endpoint, err)
	}
	return sub, nil
}

// zmq4 v0.17.0's Dial waits for the peer's ZMTP greeting without a
// deadline, so a peer that accepts TCP connections and then says nothing
// (a wrong port, a hung engine) would block a listener, and its shutdown,
// forever. kvgate therefore dials tcp endpoints through its own transport,
// registered with zmq4 once, which puts a deadline on the connection until
// the handshake is done.

// boundedTCP is the zmq4 transport name of tcp with a bounded handshake.
const boundedTCP = "kvgate-tcp"

var registerBoundedTCP = sync.OnceValue(func() error {
	return zmq4.RegisterTransport(boundedTCP, boundedTransport{})
})

// handshake travels in the socket's context to the transport: the
// deadline to put on the connection, and the connection, to lift it.
type handshake struct {
	timeout time.Duration
	mu      sync.Mutex
	conn    net.Conn
}

type handshakeKey struct{}

type boundedTransport struct{}

func (boundedTransport) Dial(ctx context.Context, d transport.Dialer, addr string) (net.Conn, error) {
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	// Cancelling the socket's context (stopping the listener) interrupts a
	// handshake in progress; afterwards the socket's Close closes it anyway.
	context.AfterFunc(ctx, func() { conn.Close() })
	if hs, ok := ctx.Value(handshakeKey{}).(*handshake); ok && hs.timeout > 0 {
		if err := conn.SetDeadline(time.Now().Add(hs.timeout)); err != nil {
			conn.Close()
			return nil, err
		}
		hs.mu.Lock()
		hs.conn = conn
		hs.mu.Unlock()
	}
	return conn, nil
}

func (boundedTransport) Listen(context.Context, string) (net.Listener, error) {
	return nil, errors.New("kvgate-tcp is for dialling only")
}

func (boundedTransport) Addr(ep string) (string, error) {
	if _, _, err := net.SplitHostPort(ep); err != nil {
		return "", fmt.Errorf("invalid tcp address %q: %w", ep, err)
	}
	return ep, nil
}

// dialBounded dials endpoint on s, a socket created with hs in its
// context, bounding a tcp handshake by hs.timeout.
func dialBounded(s zmq4.Socket, hs *handshake, endpoint string) error {
	if rest, ok := strings.CutPrefix(endpoint, "tcp://"); ok {
		if err := registerBoundedTCP(); err != nil {
			return err
		}
		endpoint = boundedTCP + "://" + rest
	}
	if err := s.Dial(endpoint); err != nil {
		hs.mu.Lock()
		if hs.conn != nil {
			hs.conn.Close() // zmq4 leaves it open when the handshake fails
		}
		hs.mu.Unlock()
		return err
	}
	hs.mu.Lock()
	defer hs.mu.Unlock()
	if hs.conn != nil {
		// Connected: lift the deadline, also for the read already waiting.
		if err := hs.conn.SetDeadline(time.Time{}); err != nil {
			return fmt.Errorf("clear handshake deadline: %w", err)
		}
	}
	return nil
}

// closeSocket closes a zmq4 socket and drains what its reader goroutines
// may still be trying to hand over, so none of them stays blocked.
func closeSocket(s zmq4.Socket) {
	_ = s.Close()
	// On a closed socket Recv picks at random between failing and handing
	// over a queued message: drain until it has failed 64 times in a row.
	for misses := 0; misses < 64; {
		if _, err := s.Recv(); err != nil {
			misses++
		} else {
			misses = 0
		}
	}
}
