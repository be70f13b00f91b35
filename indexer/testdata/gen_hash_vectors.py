#!/usr/bin/python3
"""Golden vectors for kvgate's block hashing (shared/spec/hashing.md).

An independent implementation on Debian's python3-xxhash; it shares no code
with the Go side. Regenerate with:

    apt-get install -y python3-xxhash
    /usr/bin/python3 indexer/testdata/gen_hash_vectors.py > indexer/testdata/hash_vectors.json
"""
import json
import random
import struct

import xxhash

BASE_SEED = 1337
MASK = (1 << 64) - 1


def lora_seed(name):
    if not name:
        return BASE_SEED
    return (BASE_SEED + xxhash.xxh3_64_intdigest(name.encode("utf-8"))) & MASK


def block_seed(lora, salt):
    """Dynamo's compute_salt_hash (lib/kv-hashing/src/salt.rs): the LoRA
    seed plus, for a non-empty cache salt, XXH3-64 of the salt with seed 1."""
    seed = lora_seed(lora)
    if salt:
        seed = (seed + xxhash.xxh3_64_intdigest(salt.encode("utf-8"), seed=1)) & MASK
    return seed


def local_hash(tokens, seed, extra):
    data = b"".join(struct.pack("<I", t) for t in tokens)
    data += b"".join(struct.pack("<Q", k) for k in sorted(extra))
    return xxhash.xxh3_64_intdigest(data, seed=seed)


def case(name, tokens, block_size, lora=None, extra=None, salt=None):
    seed = block_seed(lora, salt)
    local = []
    for i in range(len(tokens) // block_size):
        keys = extra[i] if extra and i < len(extra) else []
        local.append(local_hash(tokens[i * block_size:(i + 1) * block_size], seed, keys))
    seq = []
    for i, h in enumerate(local):
        if i == 0:
            seq.append(h)
        else:
            seq.append(xxhash.xxh3_64_intdigest(struct.pack("<QQ", seq[-1], h), seed=BASE_SEED))
    return {
        "name": name,
        "tokens": tokens,
        "block_size": block_size,
        "lora_name": lora or "",
        "cache_salt": salt or "",
        "extra_keys": extra or [],
        "seed": seed,
        "local": local,
        "sequence": seq,
    }


def main():
    rng = random.Random(20261120)
    cases = [
        case("single block of 4", [1, 2, 3, 4], 4),
        case("partial tail ignored", [1, 2, 3, 4, 5, 6], 4),
        case("shorter than a block", [7, 8, 9], 4),
        case("empty", [], 16),
        case("max uint32 tokens", [0xFFFFFFFF, 0, 0x80000000, 1], 2),
        case("three blocks of 16", [rng.randrange(0, 152064) for _ in range(48)], 16),
        case("block of 64", [rng.randrange(0, 128256) for _ in range(130)], 64),
        case("large block 512", [rng.randrange(0, 32000) for _ in range(1024)], 512),
        case("lora adapter", [1, 2, 3, 4, 5, 6, 7, 8], 4, lora="sql-adapter"),
        case("lora unicode name", [1, 2, 3, 4, 5, 6, 7, 8], 4, lora="lora-ünï-☃"),
        case("extra keys unsorted", [1, 2, 3, 4, 5, 6, 7, 8], 4,
             extra=[[0xDEADBEEF, 5, 0xFFFFFFFFFFFFFFFF], [42]]),
        case("extra keys on first block only", [10, 11, 12, 13, 14, 15, 16, 17], 4, extra=[[1 << 63]]),
        case("lora and extra keys", [rng.randrange(0, 50000) for _ in range(32)], 8,
             lora="adapter-b", extra=[[3, 1, 2], [], [9]]),
        case("cache salt", [1, 2, 3, 4, 5, 6, 7, 8], 4, salt="tenant-a"),
        case("cache salt unicode", [1, 2, 3, 4, 5, 6, 7, 8], 4, salt="sel-ünï-☃"),
        case("cache salt and lora", [rng.randrange(0, 50000) for _ in range(24)], 8,
             lora="sql-adapter", salt="tenant-a"),
    ]
    seeds = [{"name": n, "seed": lora_seed(n)} for n in ["", "a", "sql-adapter", "lora-ünï-☃"]]
    salt_seeds = [{"lora_name": l, "cache_salt": s, "seed": block_seed(l, s)}
                  for l, s in [("", ""), ("", "a"), ("", "tenant-a"), ("sql-adapter", ""),
                               ("sql-adapter", "tenant-a"), ("a", "a")]]
    json.dump({"generator": "gen_hash_vectors.py (python3-xxhash %s)" % xxhash.VERSION,
               "cases": cases, "lora_seeds": seeds, "salt_seeds": salt_seeds}, fp=__import__("sys").stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
