package indexer

import (
	"encoding/binary"
	"slices"
	"unsafe"

	"github.com/zeebo/xxh3"
)

// BaseSeed is the XXH3 seed of every block hash without a LoRA adapter,
// and of every sequence hash.
const BaseSeed uint64 = 1337

// LoRASeed returns the seed for local block hashes of adapter name: BaseSeed
// plus the unseeded XXH3 of the name (wrapping). The empty name is the base
// model and yields BaseSeed.
func LoRASeed(name string) uint64 {
	if name == "" {
		return BaseSeed
	}
	return BaseSeed + xxh3.HashString(name)
}

// BlockSeed returns the seed for local block hashes of a request for
// adapter lora with cache salt salt, as Dynamo's router derives it
// (dynamo_kv_hashing::compute_salt_hash): LoRASeed(lora), plus, for a
// non-empty salt, the XXH3 of the salt with seed 1 (wrapping). The salt
// changes the seed of every block, not an extra key of the first; sequence
// hashes keep BaseSeed. An empty salt is no salt.
func BlockSeed(lora, salt string) uint64 {
	seed := LoRASeed(lora)
	if salt != "" {
		seed += xxh3.HashStringSeed(salt, 1)
	}
	return seed
}

// maxStackBlock is the largest block (in tokens, extra keys counting as two)
// whose bytes are assembled on the stack rather than the heap.
const maxStackBlock = 256

// nativeLittleEndian reports whether a []uint32 already holds its tokens as
// 4 little-endian bytes each, so a block can be hashed in place.
var nativeLittleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// LocalHash returns the local block hash of one block's tokens: XXH3-64 with
// seed over each token as 4 little-endian bytes, followed by the extra keys
// (multimodal hashes, cache salt) sorted ascending, each as 8 little-endian
// bytes. extra is not modified.
func LocalHash(tokens []uint32, seed uint64, extra []uint64) uint64 {
	if len(extra) == 0 && nativeLittleEndian {
		if len(tokens) == 0 {
			return xxh3.HashSeed(nil, seed)
		}
		return xxh3.HashSeed(unsafe.Slice((*byte)(unsafe.Pointer(&tokens[0])), 4*len(tokens)), seed)
	}
	n := 4*len(tokens) + 8*len(extra)
	var stack [4 * maxStackBlock]byte
	var buf []byte
	if n <= len(stack) {
		buf = stack[:n]
	} else {
		buf = make([]byte, n)
	}
	for i, t := range tokens {
		binary.LittleEndian.PutUint32(buf[4*i:], t)
	}
	if len(extra) > 0 {
		keys := extra
		if !slices.IsSorted(keys) {
			keys = slices.Clone(extra)
			slices.Sort(keys)
		}
		off := 4 * len(tokens)
		for i, k := range keys {
			binary.LittleEndian.PutUint64(buf[off+8*i:], k)
		}
	}
	return xxh3.HashSeed(buf, seed)
}

// LocalHashes appends to dst the local hash of every full block of tokens
// (a partial last block is ignored) and returns the extended slice.
// extra, when non-nil, holds the extra keys of block i at extra[i]; blocks
// beyond len(extra) have none.
func LocalHashes(dst []uint64, tokens []uint32, blockSize int, seed uint64, extra [][]uint64) []uint64 {
	if blockSize <= 0 {
		return dst
	}
	for i := 0; (i+1)*blockSize <= len(tokens); i++ {
		var keys []uint64
		if i < len(extra) {
			keys = extra[i]
		}
		dst = append(dst, LocalHash(tokens[i*blockSize:(i+1)*blockSize], seed, keys))
	}
	return dst
}

// NextSequenceHash returns the sequence hash of a block whose predecessor
// has sequence hash prev and whose own local hash is local:
// XXH3-64(seed 1337) of prev and local as 8 little-endian bytes each.
func NextSequenceHash(prev, local uint64) uint64 {
	var buf [16]byte
	binary.LittleEndian.PutUint64(buf[:8], prev)
	binary.LittleEndian.PutUint64(buf[8:], local)
	return xxh3.HashSeed(buf[:], BaseSeed)
}

// SequenceHashes appends to dst the sequence hash of every prefix of local:
// seq[0] = local[0], seq[i] = NextSequenceHash(seq[i-1], local[i]).
func SequenceHashes(dst []uint64, local []uint64) []uint64 {
	for i, l := range local {
		if i == 0 {
			dst = append(dst, l)
			continue
		}
		dst = append(dst, NextSequenceHash(dst[len(dst)-1], l))
	}
	return dst
}
