// Package indexer owns kvgate's knowledge of which worker holds which KV
// cache blocks: Dynamo-compatible block hashing (hash.go), the tier-aware
// prefix index per (model, tenant) (index.go) with its pointer-free storage
// (store.go), how its writers and matches share a lock (lock.go), its dump
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
// Storage (store.go) holds no Go pointers in bulk, so the garbage collector
// never scans it: nodes live by value in a chunked slab, named by uint32
// ids; sequence hash -> node id and, per worker rank, engine id -> node id
// are open-addressing tables of plain words. A node's only holder is
// stored inline and its ends derived from it; nodes held by several ranks
// keep their holders in an arena of plain holders, by size class, named
// from the inline holder's words, and only those held by many keep end
// lists and bit sets. A deleted node that other nodes are still linked to,
// or engine ids still name, stays in the slab, dead, until the last of them
// goes, so a link or an engine id's node is a plain id. Every node but a root is linked (to a dead stand-in if its
// parent's key has no node), and its link names its parent's key: nodes
// do not keep it.
//
// Concurrency: an index is split by worker id into shards (Options.
// IndexShards), each a whole tree with its own RWMutex, so that the apply
// goroutines of different shards never wait for each other; a match walks
// every shard, and a block held in several shards has a node in each. In
// a shard, writers take turns for a whole operation on a mutex of their
// own, so at most one writer waits for the lock and a match never queues
// behind several. Matches share the lock with each other and with the
// writer looking up the first chunk of an event (keys hashed, table slots
// and nodes loaded into cache). A writer holds it exclusively for at most
// writeChunk blocks, then releases it and, where the shards are at least
// as many as the cores Go uses, gives up its core for a moment
// (runtime.Gosched), so that writers busy on every core do not keep a
// match of another shard, or a request, waiting for one. Where the shards
// are fewer, so that a core is spare, a match finding the lock held by a
// writer hands itself to the writer and spins, and the writer runs it
// before its next block (at most one in serveAfter blocks, over time, and
// at once after a spell without matches: see serveBurst); writers
// there take the lock by spinning for a while, rather than by sleeping
// (see lock.go). Other matches waiting for the lock have the writer yield
// it at its next block once writers have applied yieldAfter blocks since
// they last yielded to one: 1 while matches come now and then, up to
// yieldChunk while they come back to back. A writer resizes its rank's
// table of engine ids without the lock: only the goroutine applying the
// rank's events changes it, and matches never read it. Matches write only
// the hints of where they found a stretch's end, atomically (see
// runHints). Where every rank of a shard is closed, a match looking ahead
// counts a node's holders per tier class instead of comparing them with
// the ranks still matching (see matcher.holdsAll).
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
