// Package indexer owns kvgate's knowledge of which worker holds which KV
// cache blocks: Dynamo-compatible block hashing (hash.go), the tier-aware
// prefix index per (model, tenant) (index.go), its path-compressed tree
// (tree.go) and pointer-free tables (hashtables.go), the index's contract
// (contract.go, with a plain reference implementation in package
// indexer/reference), the two views of a shard that matches read while
// writers publish in turn (shard.go), its dump and
// recovery format (dump.go), and the set of indexes with the goroutines
// that apply events to them in per-worker order (set.go). Engines' events
// reach it through package indexer/kvevents; its HTTP views are in
// internal/httpapi.
//
// # The index
//
// Blocks are keyed by their sequence hash, which encodes the whole prefix up
// to the block, so a block is reachable only through its parent. Each
// worker rank (worker id, data-parallel rank) that holds a block is recorded
// on the block with the tiers it holds it on (device, host, disk). Engines'
// own block ids are opaque: they only link a stored block to its parent and
// find blocks on removal. Match walks a prompt's blocks from the root and
// reports, per worker rank, the cumulative reach per tier: device <= host
// <= disk, where host counts blocks held in device or host memory and disk
// blocks held anywhere.
//
// LoRA adapters and cache salts are isolated by the hash seed (LoRASeed,
// BlockSeed), tenants and models by separate indexes.
//
// Each shard is a tree of spans (tree.go): chains of blocks in which
// every block is the only child of the one before and all are held by the
// same ranks on the same tiers. A span splits where that stops being so
// and merges back when it is so again; a match crosses a span with one
// key comparison, so its cost follows the places where ranks drop out,
// not the prompt's length. Blocks live by value in a slab (ids, not
// pointers; free ranges reused), spans name their holders by an interned
// set with a bit set per tier class, and the key of a span's first block
// -> span and, per worker rank, engine id -> block are open-addressing
// tables of plain words (hashtables.go). Engine ids only name blocks; a rank's
// tiers are recorded per block, and a block the rank no longer holds
// stays while one of its engine ids still names it (see blockRec.pins).
//
// Concurrency: an index is split by worker id into shards (Options.
// IndexShards), each a whole tree with writers of its own, so that the
// apply goroutines of different shards never wait for each other; a match
// walks every shard, and a block held in several shards is in each. Within
// a shard, matches never wait for writers; the scheme is written down
// once, on the shard type (shard.go), and docs/design.md gives the
// measurements behind it.
//
// The package is a leaf: it imports nothing of kvgate, and must not know
// wire formats, HTTP, the worker catalog or scheduling.
package indexer
