// Package httpapi is kvgate's admin HTTP APIs over the core packages: the
// index's overlap queries in Dynamo's standalone indexer and Mooncake's
// conductor shapes (index.go), the dump and the peer list with startup
// recovery from a peer's dump (peers.go). It owns their JSON types and
// error shapes (docs/http-api.md); routing, limits and the admin token are
// internal/admin's.
//
// Only package main imports it. It must not hold state of its own beyond
// the peer list, nor reach into the index's or the scheduler's internals.
package httpapi
