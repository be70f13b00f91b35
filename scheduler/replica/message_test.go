package replica

import (
	"bytes"
	"fmt"
	"reflect"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// TestReplicaMessageRoundTrip: what append writes, decode reads back, and
// an independent decoder reads the same fields.
func TestReplicaMessageRoundTrip(t *testing.T) {
	msgs := []replicaMessage{
		{ReplicaID: 1, Kind: "free", Model: "m", Tenant: "default", RequestID: "r"},
		{ReplicaID: 1<<64 - 1, Kind: "add", Model: "org/m", Tenant: "t", RequestID: "x1", WorkerID: 7, DPRank: 1<<32 - 1,
			BlockSize: 16, Hashes: []uint64{0, 1 << 63, 1<<64 - 1}, PrefillTokens: 1 << 40},
	}
	for _, m := range msgs {
		b := m.append(nil)
		var got replicaMessage
		if err := got.decode(b); err != nil || !reflect.DeepEqual(got, m) {
			t.Errorf("decode(append(%+v)) = %+v, %v", m, got, err)
		}
		var other map[string]any
		dec := msgpack.NewDecoder(bytes.NewReader(b))
		dec.UseLooseInterfaceDecoding(true)
		if err := dec.Decode(&other); err != nil {
			t.Fatal(err)
		}
		if other["request_id"] != m.RequestID || fmt.Sprint(other["replica_id"]) != fmt.Sprint(m.ReplicaID) || (m.WorkerID != 0) != (other["worker_id"] != nil) {
			t.Errorf("independent decoder read %v from %+v", other, m)
		}
	}
}

// TestReplicaMessageBounds: numbers outside their field's range are errors.
func TestReplicaMessageBounds(t *testing.T) {
	for _, doc := range []map[string]any{
		{"replica_id": -1},
		{"dp_rank": uint64(1) << 32},
		{"block_size": uint64(1) << 31},
		{"worker_id": "7"},
		{"prefill_tokens": uint64(1) << 63},
		{"hashes": []any{"x"}},
		{"kind": 5},
	} {
		b, err := msgpack.Marshal(doc)
		if err != nil {
			t.Fatal(err)
		}
		var m replicaMessage
		if err := m.decode(b); err == nil {
			t.Errorf("%v decoded as %+v", doc, m)
		}
	}
}

// FuzzReplicaMessage: any payload decodes or fails without panicking, and
// what decodes encodes back to a payload that decodes the same.
func FuzzReplicaMessage(f *testing.F) {
	f.Add((&replicaMessage{ReplicaID: 1, Kind: "add", Model: "m", RequestID: "r", Hashes: []uint64{1, 2}}).append(nil))
	f.Add([]byte{0x81, 0xa4, 'k', 'i', 'n', 'd', 0xc0})
	f.Fuzz(func(t *testing.T, payload []byte) {
		var m replicaMessage
		if m.decode(payload) != nil {
			return
		}
		var again replicaMessage
		if err := again.decode(m.append(nil)); err != nil {
			t.Fatalf("re-encoded %+v: %v", m, err)
		}
		if len(m.Hashes) == 0 {
			m.Hashes = nil
		}
		if !reflect.DeepEqual(again, m) {
			t.Fatalf("round trip %+v -> %+v", m, again)
		}
	})
}
