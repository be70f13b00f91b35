// Package indexer owns kvgate's knowledge of which worker holds which KV
// cache blocks: Dynamo-compatible block hashing (hash.go), the tier-aware
// prefix index per (model, tenant) (index.go), its path-compressed tree
// (tree.go) and pointer-free tables (store.go), how its writers and
// matches share a lock (lock.go; the CPU a thread runs on, cpu_*.go and
// cpu_linux_amd64.s),
// its dump
// and recovery format (dump.go), the set of indexes with the goroutines
// that apply events to them in per-worker order (set.go), and the event
// path that feeds it from engines: decoding of vLLM, SGLang and Mooncake
// KV event batches (wire.go, on a small allocation-free msgpack reader in
// msgpack.go) and the ZMQ listeners with gap detection and replay
// (ingest.go, metrics.go); and the index's HTTP views: Dynamo's and
// Mooncake's overlap queries, the dump, and the peer list with startup
// recovery from a peer's dump (http.go).
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
// tables of plain words (store.go). Engine ids only name blocks; a rank's
// tiers are recorded per block, and a block the rank no longer holds
// stays while one of its engine ids still names it (see blockRec.pins).
//
// Concurrency: an index is split by worker id into shards (Options.
// IndexShards), each a whole tree with its own RWMutex, so that the apply
// goroutines of different shards never wait for each other; a match walks
// every shard, and a block held in several shards is in each. In a shard,
// writers take turns for a whole operation on a mutex of their own, so at
// most one writer waits for the lock and a match never queues behind
// several. A writer holds the lock exclusively in steps of at most 16
// blocks (a stretch of a Stored event, a run of the engine ids of a
// Removed or Cleared event, a rank's removal or an id-only Stored event),
// and lets it go every writeChunk blocks and, for a waiting match, once
// writers have applied yieldAfter blocks since they last yielded to one: 1
// while matches come now and then, up to yieldChunk while they come back
// to back. Where the shards are at least as many as the cores Go uses, a
// writer letting the lock go also gives up its core for a moment
// (runtime.Gosched), so that writers busy on every core do not keep a
// match of another shard, or a request, waiting for one. Where the shards
// are fewer, so that a core is spare, a match finding the lock held by a
// writer hands itself to the writer and spins, and the writer runs it
// after its current step (at most one in serveAfter blocks, over time, and
// at once after a spell without matches: see serveBurst). It waits for the
// lock instead, leaving its CPU, where it runs on the CPU the writer took
// the lock on (mostly, the system took the writer's CPU for the match),
// and once the writer finishes no step for stallWait (mostly, the system
// has taken its CPU); writers there
// take the lock by spinning for a while, rather than by sleeping (see
// lock.go). A writer builds its rank's table of engine ids grown for a
// Stored event, or shrunk after removals, or a new rank's first, without
// the lock: only writers change the tree, and matches never read that
// table. Without the lock too, it lists the engine ids a Cleared event or
// a rank's removal takes (runTree.clearOrder), makes larger copies of the
// arrays an event may outgrow (spans, holder sets, heads) and the slab's
// next chunks, which it puts in place under the lock (runTree.prepare),
// and it reads where the event's engine ids and blocks lie, all at once,
// so that under the lock it finds them in the cache (runTree.warm).
// A rank being removed is ignored by matches from the start, so that none
// sees it half removed.
//
// # The event path
//
// An Ingester runs one listener per registered publisher of a worker rank:
// a ZMQ SUB socket that reconnects with backoff, a sequence cursor per
// publisher that survives unregistering, replay over a DEALER socket when a
// gap shows, and a restart check that clears a restarted engine's blocks.
// Every batch, event and block that is not applied is counted in a metric
// with its reason.
//
// The index itself (index.go, set.go) knows nothing of wire formats or
// HTTP; http.go adapts it to the APIs through internal/admin. The package
// must not know the worker catalog or scheduling (package scheduler).
package indexer
