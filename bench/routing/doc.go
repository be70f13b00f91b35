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
// # results.csv
//
// One row per (load level, policy), then an "oracle" row per level that
// fills only the hit rate columns. The columns:
//
//   - trace, window_start_s, window_s, requests: the window replayed
//     (window_start_s is -start, 0 by default);
//   - compression, speedup, load: the load level (load = compression /
//     speedup, the offered load against the engines' real speed);
//   - policy, completed, errors: the run and its requests;
//   - prompt_tokens, cached_tokens, hit_rate: from the responses' usage
//     (cached_tokens is prompt_tokens_details.cached_tokens);
//     oracle_hit_rate and hit_rate_of_oracle compare it with the oracle;
//   - ttft_*_ms, e2e_*_ms: latencies in wall-clock milliseconds through
//     kvgate's proxy; output_tokens, duration_s, output_tokens_per_s,
//     requests_per_s: throughput; offered_requests_per_s: the rate sent;
//     send_lag_p99_ms: how late the runner sent requests;
//   - requests_per_worker: kvgate's routed counter per worker, in worker
//     order, "/"-separated;
//   - preemptions: the engines' vllm:num_preemptions_total, summed; 0
//     unless some rank ran out of KV blocks (with the demo's 65536
//     blocks per rank it rarely does: lower -num-blocks to see it);
//   - kvgate_cpu_s, fleet_cpu_s, runner_cpu_s, other_cpu_s, wall_s: CPU
//     seconds of each process and of everything else on the machine
//     during the run, from /proc: all 0 off Linux;
//   - contended: why the run's latencies are not reliable (busy machine,
//     late runner), empty when they are; such runs are marked "(!)" in
//     the tables and the TTFT CDF;
//   - lost_in_flight_of_oracle: the share of the oracle's reusable tokens
//     lost because their prefix was still being computed when the
//     request was sent (gap.go), empty when the window has none; 0 is
//     common at low load, where a conversation's next turn comes after
//     the previous one finished;
//   - lost_off_best_of_oracle, decisions_off_best, decisions_logged: only
//     when kvgate ran with -serve-args "--log-level debug" and logged its
//     decisions (otherwise they would always be 0, so they are left out):
//     the share lost to decisions off the rank with the longest cached
//     prefix, how many such decisions, and how many decisions were read.
//     Policies that do not look at the cache (the baselines) log none:
//     their first two cells are empty.
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
