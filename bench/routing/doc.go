// Command routing is kvgate's routing-quality benchmark and the engine of
// `make demo`: it replays a time-compressed window of a Mooncake trace
// through kvgate's embedded proxy in front of a simulated vLLM fleet
// (`kvgate sim`), once per routing policy, and compares the policies on
// prefix-cache hit rate, time to first token, end-to-end latency and
// throughput, next to the oracle: the best hit rate any router could reach
// on that window with unbounded caches.
//
// For every (load level, policy) it starts a fresh fleet and a fresh
// `kvgate serve --routing-policy <policy>` as child processes in their own
// process groups (fleet.go), waits until kvgate is ready and subscribed to
// every rank, sends every request of the window at its compressed
// timestamp (open loop, load.go), then stops both. The runner never routes
// anything itself: every request goes through kvgate's proxy, and the
// policies are kvgate's.
//
// Trace hash ids become deterministic token blocks (trace.go): id h is the
// block of TokensPerHash ids splitmix64(h*TokensPerHash+j) % vocab, the
// last block of a prompt cut to its input_length, so equal ids at the same
// position are equal prompt prefixes for kvgate and the engines alike.
//
// Results (report.go, plot.go) are a Markdown table on stdout and, in the
// output directory, results.csv, results.md, requests.csv (one line per
// request), a TTFT CDF per load level and, for a load sweep, mean TTFT
// against offered load. Each run also splits the reusable tokens it did
// not find cached by cause (gap.go): prefixes still being computed when
// the request was sent, and, from kvgate's routed debug log when it runs
// with -serve-args "--log-level debug", decisions off the rank with the
// longest cached prefix.
//
// The package owns bench/routing only. It must not import kvgate's
// routing packages (scheduler, extproc, indexer) nor route requests: it is
// a client of the kvgate binary, like a user's load generator.
//
// # Goroutines
//
// run owns everything it starts: per child process one goroutine waiting
// for it (stopped by stopping the process), per policy run the dispatcher
// and one goroutine per in-flight request (ended by the request's
// completion or its context), and the progress bar's ticker (stopped when
// the run ends). Every one is waited for before run returns.
package main
