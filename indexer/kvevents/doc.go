// Package kvevents feeds the index from engines: it decodes vLLM's,
// SGLang's and Mooncake's KV event batches (wire.go, on
// internal/msgpack's allocation-free reader) into indexer.Events, and
// runs an Ingester: one ZMQ SUB listener per registered publisher of a
// worker rank that reconnects with backoff, keeps a sequence cursor per
// publisher that survives unregistering, replays a gap over a DEALER
// socket, and clears a restarted engine's blocks (ingest.go,
// listener*.go). Every batch, event and block that is not applied is
// counted in a metric with its reason (metrics.go). The formats are in
// docs/kv-events.md.
//
// It applies events through indexer.Set and must not reach into the
// index's internals, know the worker catalog or scheduling, or serve HTTP.
package kvevents
