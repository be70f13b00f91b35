// Package deploy holds kvgate's Kubernetes manifests: Kustomize bases,
// components and overlays that run kvgate as the endpoint picker (EPP) of a
// Gateway API Inference Extension InferencePool, with an example vLLM fleet
// that publishes KV cache events. Go code here only validates them.
//
// The tests decode every manifest strictly (unknown fields fail) into the
// Kubernetes API types, or, for the InferencePool and Gateway API objects,
// into small structs that mirror their published schemas; build the base
// and every overlay with kustomize (krusty); and cross-check the result: the
// pool's picker reference against kvgate's Service and ports, probes,
// RBAC, kvgate's flags against `kvgate serve --help`, the models
// configuration, and vLLM's KV event endpoints against kvgate's templates.
//
// This package owns deploy/ only. It must not touch kvgate's code: it reads
// the tokenize and scheduler packages' parsers and runs the kvgate binary,
// nothing more.
package deploy
