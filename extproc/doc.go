// Package extproc is kvgate's gateway: the routing decision for OpenAI
// requests and its two fronts, an Envoy ext_proc server implementing the
// Gateway API Inference Extension endpoint-picker protocol (server.go) and
// an embedded OpenAI-compatible reverse proxy (proxy.go).
//
// It owns request parsing (openai.go: /v1/completions, /v1/chat/completions,
// /v1/responses, /v1/embeddings), the decision pipeline (gateway.go: model
// -> tokenize.Registry -> block hashes -> scheduler.Scheduler with booking)
// and each request's lifecycle from the response stream: the first body
// chunk marks the prefill done, the end of the stream, an error or a
// cancel frees the booking, usage feeds the metrics; and the response
// headers that tell the client which worker served it (served.go).
//
// It must not touch the index or the loads directly: it decides through
// the scheduler and accounts through scheduler.Loads.
package extproc
