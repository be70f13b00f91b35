package kvevents

import "testing"

// BenchmarkDecode decodes a vLLM batch of two map-form BlockStored events
// of 4 blocks of 16 tokens and one BlockRemoved.
func BenchmarkDecode(b *testing.B) {
	stored := func(id uint64) mp {
		return mp{}.mapN(5).str("type").str("BlockStored").str("block_hashes").uints(id, id+1, id+2, id+3).
			str("parent_block_hash").nil().str("token_ids").tokens(seqTokens(int(id), 64)).str("block_size").uint(16)
	}
	payload := mp{}.arr(3).f64(1.7e9).arr(3).raw(stored(1<<40)).raw(stored(1<<40+8)).
		mapN(2).str("type").str("BlockRemoved").str("block_hashes").uints(1, 2, 3, 4).uint(0)
	var d decoder
	b.SetBytes(int64(len(payload)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := d.Decode(payload); err != nil {
			b.Fatal(err)
		}
	}
}
