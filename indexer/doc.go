// Package indexer owns kvgate's knowledge of which worker holds which KV
// cache blocks: Dynamo-compatible block hashing (hash.go), the tier-aware
// prefix index per (model, tenant) (index.go), its path-compressed tree
// (tree.go) and pointer-free tables (hashtables.go), the two copies of what
// matches read, which writers publish in turn (index.go), its dump and
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
// LoRA adapters are isolated by the hash seed (LoRASeed), tenants and models
// by separate indexes.
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
// apply goroutines of different shards never wait for each other; a
// match walks every shard, and a block held in several shards is in
// each. In a shard, writers take turns for a whole operation (an event,
// a rank's removal) on a mutex, and matches never wait for them (see
// shard in index.go): what a match reads of the tree (the spans, the
// table of heads, the ranks; the view) is kept twice. Writers change
// their own copy and, after each operation, publish it: matches read
// the published copy, each counting itself in that copy's readers, and
// the writer waits until no match reads the other copy, brings it up to
// date with the spans the operation wrote and the heads it put or
// deleted, and makes it its own (spanTree.catchUp). The blocks' slab and
// the holder sets are one for both copies: writers rewrite only blocks
// and sets no copy reaches, so a block, set or diff array the tree lets
// go of is freed only at the next publication, once no match reads the
// copy that may still reach it (spanTree.pend). A match so sees every
// operation whole or not at all, never waits for a writer the system
// has stopped, and costs writers nothing but the copy. Where the shards
// are at least as many as the cores Go uses, a writer gives up its core
// for a moment every writeChunk blocks, and while it waits for a match
// to leave the copy it must bring up to date (runtime.Gosched), so that
// writers busy on every core do not keep a match, or a request, from
// one; matches back to back give it back every cedeMatches matches
// (shard.cede). Before it changes the tree, a writer builds its rank's table of
// engine ids grown for a Stored event (or, after removals, shrunk, or a
// new rank's first), lists the engine ids a Cleared event or a rank's
// removal takes (spanTree.clearOrder), makes larger copies of the arrays
// an event may outgrow and the slab's next chunks (spanTree.prepare), and
// reads where the event's engine ids and blocks lie, all at once, so
// that it then finds them in the cache (spanTree.warm).
//
// The package is a leaf: it imports nothing of kvgate, and must not know
// wire formats, HTTP, the worker catalog or scheduling.
package indexer
