// Package envoy owns kvgate's reference Envoy configuration (envoy.yaml, a
// complete v3 bootstrap that runs kvgate as the ext_proc endpoint picker in
// front of an ORIGINAL_DST cluster) and the tests that validate it against
// Envoy's v3 API: every typed config resolved and checked with the generated
// protoc-gen-validate rules, plus the routing semantics kvgate relies on.
//
// The package has no runtime code and nothing in kvgate imports it. It must
// not touch the ext_proc server itself (package extproc), kvgate's flags or
// go.mod, and its tests must not need the network or an Envoy binary.
package envoy
