// Package discovery keeps the worker catalog in step with a Kubernetes
// Gateway API Inference Extension InferencePool: it watches one pool and
// the pods its selector matches, and registers one catalog worker per
// Ready pod and target port (source "kubernetes").
//
// It owns the watches (client-go informers), the mapping of pods to worker
// registrations and the registrations it made. It must not touch workers
// it did not register (static --workers and HTTP registrations live side
// by side), the catalog's internals, or the index; it changes the catalog
// only through the small Catalog interface (PutWorker, Unregister).
//
// # Pool
//
// The pool is read from inference.networking.k8s.io/v1 (spec.selector.
// matchLabels, spec.targetPorts[].number) or from the older
// inference.networking.x-k8s.io/v1alpha2 (spec.selector, a plain label
// map, and spec.targetPortNumber). Config.APIVersion "auto" watches both
// and uses the v1 pool when both have it; a version the API server does
// not serve is then retried quietly (debug log only). An invalid pool (no
// selector, no or bad target port) counts as no pool: logged, counted in
// kvgate_discovery_errors_total{kind="pool"}, and its workers removed.
// When the selector changes the pod watch restarts with the new one; the
// old workers stay until the new watch has listed the pods, then those
// that no longer match go.
//
// # Pods and workers
//
// A pod counts when it matches the selector, is Ready (condition PodReady
// True), is not terminating (no DeletionTimestamp) and has a pod IP. Its
// target port i becomes DP rank i of its own catalog worker, named
// "<pod>-rank-<i>" in logs: request endpoint "podIP:port_i", DP range
// [i, i+1), KV events {i: events endpoint}, id WorkerID(namespace, pod, i)
// (xxh3 of "<namespace>/<pod>-rank-<i>", below 2^63; stable across pod
// restarts with the same name, as with a StatefulSet).
//
// The model name is Config.Model, or the value of the pod label
// Config.ModelLabel when set and present. A changed model unregisters the
// old worker before registering the new one.
//
// # Event and replay endpoints
//
// The annotations AnnotationEvents (kvgate.io/kv-events-endpoints) and
// AnnotationReplay (kvgate.io/kv-replay-endpoints) override the templates
// Config.EventsTemplate (default "tcp://{podIP}:{5557+rank}", vLLM's
// default offset by DP rank) and Config.ReplayTemplate (default none). An
// annotation holds one template for every rank or a comma list with one
// entry per target port; present but empty, it means none for that pod.
// Templates are literal text with the placeholders
//
//	{podIP}   the pod's IP (bracketed when IPv6)
//	{rank}    the DP rank i
//	{port}    the rank's target port
//	{N+rank}  the decimal number N plus the rank, e.g. {5557+rank}
//
// and must expand to tcp://host:port or ipc://path. A bad configured
// template is an error of New; a bad annotation skips the pod (logged once
// per change, counted in kvgate_discovery_errors_total{kind="pod"}).
//
// # Lifecycle
//
// Run owns every goroutine: the informers and one goroutine per pod watch
// that waits for its first list; they all stop before Run returns. Run
// reconciles level-triggered on a single goroutine: every informer event
// marks the state dirty, and a reconcile compares what the pool and pods
// want with what discovery registered (tracked by itself, by worker id),
// then unregisters and registers the difference. A failed registration is
// retried with backoff (1s doubling to 1m) and counted in
// kvgate_discovery_changes_total{outcome="error"}.
//
// When Run's context ends it leaves its workers registered: discovery
// stops when the process shuts down, and the catalog and its listeners go
// with it; unregistering first would only spend the shutdown dropping
// every worker's blocks (up to the catalog's unregister timeout each).
// (A lost API server connection does not end Run: the informers keep their
// last state, so the workers stay, and retry.)
//
// # Permissions
//
// The service account needs get, list and watch on pods, and on
// inferencepools in the API groups it watches, in the pool's namespace.
package discovery
