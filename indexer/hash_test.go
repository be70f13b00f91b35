package indexer

import (
	"encoding/json"
	"os"
	"slices"
	"testing"
)

// TestHashGoldenVectors checks LocalHash, SequenceHashes, LoRASeed and
// BlockSeed against
// vectors produced by an independent implementation
// (testdata/gen_hash_vectors.py on Debian's python3-xxhash).
func TestHashGoldenVectors(t *testing.T) {
	raw, err := os.ReadFile("testdata/hash_vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Cases []struct {
			Name      string     `json:"name"`
			Tokens    []uint32   `json:"tokens"`
			BlockSize int        `json:"block_size"`
			LoRAName  string     `json:"lora_name"`
			CacheSalt string     `json:"cache_salt"`
			ExtraKeys [][]uint64 `json:"extra_keys"`
			Seed      uint64     `json:"seed"`
			Local     []uint64   `json:"local"`
			Sequence  []uint64   `json:"sequence"`
		} `json:"cases"`
		LoRASeeds []struct {
			Name string `json:"name"`
			Seed uint64 `json:"seed"`
		} `json:"lora_seeds"`
		SaltSeeds []struct {
			LoRAName  string `json:"lora_name"`
			CacheSalt string `json:"cache_salt"`
			Seed      uint64 `json:"seed"`
		} `json:"salt_seeds"`
	}
	if err := json.Unmarshal(raw, &file); err != nil {
		t.Fatal(err)
	}
	if len(file.Cases) < 10 || len(file.LoRASeeds) < 3 || len(file.SaltSeeds) < 4 {
		t.Fatalf("too few vectors: %d cases, %d seeds, %d salt seeds", len(file.Cases), len(file.LoRASeeds), len(file.SaltSeeds))
	}
	for _, c := range file.Cases {
		t.Run(c.Name, func(t *testing.T) {
			seed := BlockSeed(c.LoRAName, c.CacheSalt)
			if seed != c.Seed {
				t.Fatalf("BlockSeed(%q, %q) = %d, want %d", c.LoRAName, c.CacheSalt, seed, c.Seed)
			}
			extras := slices.Clone(c.ExtraKeys)
			for i := range extras {
				extras[i] = slices.Clone(extras[i])
			}
			local := LocalHashes(nil, c.Tokens, c.BlockSize, seed, extras)
			if !slices.Equal(local, c.Local) && (len(local) != 0 || len(c.Local) != 0) {
				t.Fatalf("local hashes = %v, want %v", local, c.Local)
			}
			if !slices.EqualFunc(extras, c.ExtraKeys, slices.Equal[[]uint64]) {
				t.Fatalf("LocalHashes modified the extra keys: %v", extras)
			}
			seq := SequenceHashes(nil, local)
			if !slices.Equal(seq, c.Sequence) && (len(seq) != 0 || len(c.Sequence) != 0) {
				t.Fatalf("sequence hashes = %v, want %v", seq, c.Sequence)
			}
		})
	}
	for _, s := range file.LoRASeeds {
		if got := LoRASeed(s.Name); got != s.Seed {
			t.Errorf("LoRASeed(%q) = %d, want %d", s.Name, got, s.Seed)
		}
	}
	for _, s := range file.SaltSeeds {
		if got := BlockSeed(s.LoRAName, s.CacheSalt); got != s.Seed {
			t.Errorf("BlockSeed(%q, %q) = %d, want %d", s.LoRAName, s.CacheSalt, got, s.Seed)
		}
	}
}

// TestBlockSeed checks BlockSeed's rule by hand: no salt is LoRASeed, a
// salt adds the XXH3 of its bytes with seed 1 to the LoRA seed.
func TestBlockSeed(t *testing.T) {
	if got := BlockSeed("", ""); got != BaseSeed {
		t.Errorf("BlockSeed(\"\", \"\") = %d, want BaseSeed", got)
	}
	if got, want := BlockSeed("x", ""), LoRASeed("x"); got != want {
		t.Errorf("BlockSeed(x, \"\") = %d, want LoRASeed(x) %d", got, want)
	}
	if got, want := BlockSeed("", "s")-BaseSeed, BlockSeed("x", "s")-LoRASeed("x"); got != want {
		t.Errorf("the salt's share of the seed differs with the adapter: %d != %d", got, want)
	}
	if BlockSeed("", "s") == BlockSeed("s", "") {
		t.Error("a salt and an adapter of the same name share a seed")
	}
}

func TestLocalHashProperties(t *testing.T) {
	block := []uint32{1, 2, 3, 4}
	base := LocalHash(block, BaseSeed, nil)
	tests := []struct {
		name string
		got  uint64
		same bool
	}{
		{"empty extra keys equal none", LocalHash(block, BaseSeed, []uint64{}), true},
		{"extra key order does not matter", LocalHash(block, BaseSeed, []uint64{2, 1}) ^ LocalHash(block, BaseSeed, []uint64{1, 2}) ^ base, true},
		{"extra key changes the hash", LocalHash(block, BaseSeed, []uint64{0}), false},
		{"lora changes the hash", LocalHash(block, LoRASeed("x"), nil), false},
		{"empty lora name is the base model", LocalHash(block, LoRASeed(""), nil), true},
		{"token order matters", LocalHash([]uint32{2, 1, 3, 4}, BaseSeed, nil), false},
	}
	for _, tt := range tests {
		if (tt.got == base) != tt.same {
			t.Errorf("%s: hash %d vs base %d, want same=%v", tt.name, tt.got, base, tt.same)
		}
	}
	if h1, h2 := LocalHash(block, LoRASeed("a"), nil), LocalHash(block, LoRASeed("b"), nil); h1 == h2 {
		t.Error("two adapters produced the same hash")
	}
	big := make([]uint32, 2*maxStackBlock)
	for i := range big {
		big[i] = uint32(i)
	}
	if LocalHash(big, BaseSeed, nil) == LocalHash(big[:maxStackBlock], BaseSeed, nil) {
		t.Error("large block hashed like its first half")
	}
}

func TestLocalHashesZeroBlockSize(t *testing.T) {
	if got := LocalHashes(nil, []uint32{1, 2}, 0, BaseSeed, nil); len(got) != 0 {
		t.Fatalf("block size 0 produced %v", got)
	}
}

func BenchmarkLocalHash16(b *testing.B)  { benchLocalHash(b, 16) }
func BenchmarkLocalHash512(b *testing.B) { benchLocalHash(b, 512) }

func benchLocalHash(b *testing.B, size int) {
	block := make([]uint32, size)
	for i := range block {
		block[i] = uint32(i * 7919)
	}
	b.SetBytes(int64(4 * size))
	b.ReportAllocs()
	for b.Loop() {
		LocalHash(block, BaseSeed, nil)
	}
}
