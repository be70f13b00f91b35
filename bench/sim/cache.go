package sim

import (
	"crypto/sha256"
	"encoding/binary"

	"github.com/kvgate/kvgate/bench/engine"
)

// blockHash is the engine's id of a full block: the first 8 bytes of
// SHA-256 over the parent's id, the adapter name and the block's tokens,
// as vLLM chains its sha256 block hashes. It is deliberately unrelated to
// kvgate's own hashing: the router must learn the engine's ids from events.
func blockHash(parent uint64, lora string, tokens []uint32) uint64 {
	h := sha256.New()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], parent)
	h.Write(b[:])
	binary.LittleEndian.PutUint64(b[:], uint64(len(lora)))
	h.Write(b[:])
	h.Write([]byte(lora))
	buf := make([]byte, 4*len(tokens))
	for i, t := range tokens {
		binary.LittleEndian.PutUint32(buf[4*i:], t)
	}
	h.Write(buf)
	var sum [sha256.Size]byte
	return binary.LittleEndian.Uint64(h.Sum(sum[:0]))
}

// block is one slot of the KV cache.
type block struct {
	id   int
	refs int // running requests using it
	// hash is the block's id in the prefix cache; cached says it has one
	// (a block is cached once it is full and computed).
	hash   uint64
	cached bool
	// The free queue: blocks with refs == 0, least recently freed first.
	prev, next *block
	free       bool
}

// cache is one DP rank's KV cache: a fixed pool of blocks with prefix
// caching, as vLLM's block pool keeps it. Blocks not used by a running
// request sit in a free queue in LRU order; allocating takes the queue's
// head and, if that block was cached, evicts it (a BlockRemoved event).
// Every change to the set of cached blocks is appended to events, in
// order, for the rank to publish at the end of its step.
//
// A cache is not safe for concurrent use; its rank's lock guards it.
type cache struct {
	blockSize int
	blocks    []block
	byHash    map[uint64]*block
	head      *block // free queue, head = next to evict
	tail      *block
	nFree     int
	medium    string
	events    []engine.Event
}

func newCache(numBlocks, blockSize int) *cache {
	c := &cache{
		blockSize: blockSize,
		blocks:    make([]block, numBlocks),
		byHash:    make(map[uint64]*block),
		medium:    "GPU",
	}
	for i := range c.blocks {
		c.blocks[i].id = i
		c.pushTail(&c.blocks[i])
	}
	return c
}

func (c *cache) pushTail(b *block) {
	b.prev, b.next, b.free = c.tail, nil, true
	if c.tail != nil {
		c.tail.next = b
	} else {
		c.head = b
	}
	c.tail = b
	c.nFree++
}

func (c *cache) unlink(b *block) {
	if b.prev != nil {
		b.prev.next = b.next
	} else {
		c.head = b.next
	}
	if b.next != nil {
		b.next.prev = b.prev
	} else {
		c.tail = b.prev
	}
	b.prev, b.next, b.free = nil, nil, false
	c.nFree--
}

// usage is the fraction of blocks held by running requests (vLLM's
// kv_cache_usage_perc: cached blocks nobody uses count as free).
func (c *cache) usage() float64 {
	return 1 - float64(c.nFree)/float64(len(c.blocks))
}

// lookup returns the longest run of cached blocks for the given chain of
// full-block hashes, without touching them.
func (c *cache) lookup(hashes []uint64) []*block {
	var out []*block
	for _, h := range hashes {
		b, ok := c.byHash[h]
		if !ok {
			break
		}
		out = append(out, b)
	}
	return out
}

// touch pins cached blocks for a request.
func (c *cache) touch(bs []*block) {
	for _, b := range bs {
		if b.free {
			c.unlink(b)
		}
		b.refs++
	}
}

// allocate takes n blocks from the free queue's head, evicting cached
// ones. The caller has checked that n blocks are free.
func (c *cache) allocate(n int) []*block {
	out := make([]*block, 0, n)
	var evicted []uint64
	for range n {
		b := c.head
		c.unlink(b)
		if b.cached {
			delete(c.byHash, b.hash)
			evicted = append(evicted, b.hash)
			b.cached, b.hash = false, 0
		}
		b.refs = 1
		out = append(out, b)
	}
	if len(evicted) > 0 {
		c.events = append(c.events, engine.BlockRemoved{BlockHashes: evicted, Medium: c.medium})
	}
	return out
}

// release unpins a request's blocks, last block first, so that a
// sequence's tail is evicted before its head (vLLM frees in reverse).
func (c *cache) release(bs []*block) {
	for i := len(bs) - 1; i >= 0; i-- {
		b := bs[i]
		b.refs--
		if b.refs == 0 {
			c.pushTail(b)
		}
	}
}

// commit makes full, computed blocks of a request cacheable: block i of bs
// gets hashes[i] for i in [from, to). A hash already cached by another
// block (another request computed the same content) stays with that block.
// The newly cached blocks are reported as one BlockStored event, chained
// to the block before from.
func (c *cache) commit(bs []*block, hashes []uint64, tokens []uint32, lora string, from, to int) {
	var stored []uint64
	first := -1
	for i := from; i < to; i++ {
		b := bs[i]
		if b.cached {
			continue
		}
		if _, dup := c.byHash[hashes[i]]; dup {
			continue
		}
		b.cached, b.hash = true, hashes[i]
		c.byHash[b.hash] = b
		if first < 0 {
			first = i
		} else if i != first+len(stored) {
			// A gap (a duplicate in between): close this run.
			c.emitStored(hashes, tokens, lora, first, stored)
			first, stored = i, nil
		}
		stored = append(stored, b.hash)
	}
	if len(stored) > 0 {
		c.emitStored(hashes, tokens, lora, first, stored)
	}
}

func (c *cache) emitStored(hashes []uint64, tokens []uint32, lora string, first int, stored []uint64) {
	ev := engine.BlockStored{
		BlockHashes: stored,
		TokenIDs:    append([]uint32(nil), tokens[first*c.blockSize:(first+len(stored))*c.blockSize]...),
		BlockSize:   c.blockSize,
		Medium:      c.medium,
		LoRAName:    lora,
	}
	if first > 0 {
		p := hashes[first-1]
		ev.Parent = &p
	}
	c.events = append(c.events, ev)
}

// reset drops every cached block nobody uses; it reports false, changing
// nothing, while any block is in use (as vLLM's reset_prefix_cache).
func (c *cache) reset() bool {
	if c.nFree != len(c.blocks) {
		return false
	}
	for i := range c.blocks {
		c.blocks[i].cached, c.blocks[i].hash = false, 0
	}
	clear(c.byHash)
	c.events = append(c.events, engine.AllBlocksCleared{})
	return true
}

// takeEvents returns and forgets the events since the last call.
func (c *cache) takeEvents() []engine.Event {
	ev := c.events
	c.events = nil
	return ev
}

// chainHashes returns the hashes of the full blocks of tokens, each
// chained to the one before, starting after prev (the hash of the block
// before tokens[0], or 0 at the root) and appending to dst.
func chainHashes(dst []uint64, prev uint64, lora string, tokens []uint32, blockSize int) []uint64 {
	for i := 0; i+blockSize <= len(tokens); i += blockSize {
		prev = blockHash(prev, lora, tokens[i:i+blockSize])
		dst = append(dst, prev)
	}
	return dst
}
