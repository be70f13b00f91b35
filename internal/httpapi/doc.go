// Package httpapi is kvgate's admin HTTP APIs over the core packages, each
// a function returning its routes: the index's overlap queries in Dynamo's
// standalone indexer and Mooncake's conductor shapes, the dump and the peer
// list with startup recovery from a peer's dump (IndexRoutes, Recover;
// index.go, peers.go); the worker catalog's registration and status routes
// (WorkerRoutes; workers.go); Dynamo's slot tracker and selection service
// with reservations (ServiceRoutes for one port serving both, else
// SlotTrackerRoutes and SelectionServiceRoutes; service.go); replica
// sync's peer routes (ReplicaRoutes; replica.go); which of those routes
// each service serves on a listener of its own (Service.Routes;
// listeners.go). It owns their JSON types and error shapes
// (docs/http-api.md); routing, limits and the admin token are
// internal/admin's.
//
// Only package main imports it. It holds no state of its own beyond the
// peer list, and must not reach into the index's or the scheduler's
// internals.
package httpapi
