// Package engine is a stand-in for an inference engine's KV-event side: a
// Go publisher that speaks vLLM's KV-event protocol (and the older vLLM and
// SGLang variants of it) on real ZMQ sockets, for tests and benchmarks of
// kvgate's consumer.
//
// It owns the engine end of the wire only: the msgpack encoding of event
// batches (EncodeBatch), the PUB socket that carries live batches as
// [topic, seq, payload] messages, the ring buffer of recent batches, and the
// ROUTER socket that replays them on request. The wire formats are those of
// the shared KV-events spec (kv-events.md); see Encoding, HashEncoding,
// ReplyStyle and Config for the variants.
//
// The package must not import kvgate's indexer (the indexer's tests import
// this package) nor decode events: the consumer has its own hand-written
// decoder, and this package's encoder, built on vmihailenco/msgpack, is an
// independent implementation against which to check it.
//
// # Sockets and goroutines
//
// A Publisher owns one PUB socket, an optional ROUTER socket and one
// goroutine serving replay requests; Close stops that goroutine and closes
// both sockets. go-zeromq/zmq4 v0.17.0 never stops the writer goroutine of a
// PUB socket (its (*pubMWriter).run waits on a condition variable that
// socket Close does not signal), so each Publisher leaves that one goroutine
// parked after Close. Tests that use goleak must ignore it:
//
//	goleak.IgnoreAnyFunction(engine.LeakedGoroutine)
//
// IgnoreTopFunction does not match it: the top of its stack is the
// runtime's condition-variable wait.
//
// Sends on the PUB socket are queued and written by that goroutine, so
// Publish returns before the batch is on the wire, and batches still queued
// when Close is called may be lost, as with a real engine that exits.
package engine

// LeakedGoroutine is the function of the goroutine that go-zeromq/zmq4
// leaves behind for every PUB socket, closed or not. Pass it to
// goleak.IgnoreAnyFunction.
const LeakedGoroutine = "github.com/go-zeromq/zmq4.(*pubMWriter).run"
