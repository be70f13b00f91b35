// Package sim is a simulated vLLM engine fleet: workers that are, at every
// interface kvgate uses, indistinguishable from vLLM serving a model, for
// the demo, load tests and end-to-end tests where no GPU engine can run.
//
// Each Worker serves vLLM's OpenAI-compatible HTTP API (server.go) in front
// of its data-parallel Ranks. A Rank (engine.go) is one engine core: a KV
// cache of a fixed number of blocks with prefix caching and LRU eviction
// (cache.go), a continuous-batching scheduler with a token budget per
// step, chunked prefill and preemption, and a timing model (Dynamo
// mocker's constants) that turns each step into simulated time, divided
// by Speedup to get wall-clock time. Every block stored, evicted or
// cleared is published as vLLM KV events, one batch per step, through
// bench/engine's Publisher (live PUB socket plus replay ROUTER). Prompts
// are tokenized by kvgate's tokenize package, so token ids agree with
// the gateway's exactly as they would with a real engine serving the same
// tokenizer. A request with max_tokens gets exactly that many output
// tokens; without it the simulated model ends its answer after a length
// drawn per request (output.go), so that a plain chat answers in a
// fraction of a second rather than running to the context limit. Fleet (fleet.go) starts workers on consecutive ports and
// injects faults: dropped event batches, engine restarts, delays and
// failed requests.
//
// Block ids in events are the engine's own: a SHA-256 chain over parent,
// adapter and tokens, unrelated to kvgate's hashing, so the router has to
// learn them from the events as it does with vLLM.
//
// The package must not import kvgate's indexer or scheduler outside tests:
// it is the other side of the wire, and its tests check kvgate against it.
//
// # Goroutines
//
// A Fleet owns one step loop per rank, one HTTP server per worker and,
// with Faults.RestartEvery, the restart loop; Close stops them all and
// waits. bench/engine's publishers leave one parked goroutine each (see
// engine.LeakedGoroutine).
package sim
