package httpapi

import (
	"math"
	"net/http"
	"strconv"
	"testing"

	"github.com/kvgate/kvgate/indexer"
	"github.com/kvgate/kvgate/scheduler"
)

// TestBlockSizeBounds: every route that takes a block_size takes
// 1..indexer.MaxBlockSize and answers 400 naming the field and the range
// for anything else, changing nothing.
func TestBlockSizeBounds(t *testing.T) {
	r := newSvcRig(t, rigOptions{}, scheduler.CostOptions{})
	r.svcCalls(t, []svcCall{{name: "a worker to patch", path: "/workers", body: svcSSWorker.with("kv_events_endpoints", nil), status: 201}})
	max := strconv.Itoa(indexer.MaxBlockSize)
	routes := []struct {
		name, method, path string
		body               func(model string, bs any) jsonObj
		created            int
	}{
		{"register rank", http.MethodPost, "/register", func(m string, bs any) jsonObj {
			return rankBody(m, "", 1, 0, deadEndpoint(m)).with("block_size", bs)
		}, 201},
		{"register range", http.MethodPost, "/register", func(m string, bs any) jsonObj {
			return rangeBody(m, "", 1, 0, 1).with("block_size", bs)
		}, 201},
		{"POST /workers", http.MethodPost, "/workers", func(m string, bs any) jsonObj {
			return svcSSWorker.with("model_name", m, "block_size", bs, "kv_events_endpoints", nil)
		}, 201},
		{"PATCH /workers", http.MethodPatch, "/workers/1", func(_ string, bs any) jsonObj {
			return jsonObj{"model_name": "model", "block_size": bs}
		}, 0},
	}
	for i, rt := range routes {
		for _, bs := range []any{0, -1, indexer.MaxBlockSize + 1, math.MaxInt32, int64(math.MaxInt64)} {
			model := "m" + strconv.Itoa(i)
			r.svcCalls(t, []svcCall{{name: rt.name + " block_size " + strconv.FormatInt(toInt64(bs), 10), method: rt.method, path: rt.path,
				body: rt.body(model, bs), status: 400, errHas: []string{"block_size", "1 and " + max}}})
		}
		if rt.created != 0 {
			r.svcCalls(t, []svcCall{{name: rt.name + " block_size " + max, method: rt.method, path: rt.path,
				body: rt.body("m"+strconv.Itoa(i), indexer.MaxBlockSize), status: rt.created}})
		}
	}
}

func toInt64(v any) int64 {
	switch v := v.(type) {
	case int:
		return int64(v)
	case int64:
		return v
	}
	return 0
}

// TestTokenCountBounds: token counts above scheduler.MaxTokens are a 400
// naming the field; two /add of 2^63-1 used to wrap a rank's
// active_prefill_tokens to -2, making the loaded worker look idle.
func TestTokenCountBounds(t *testing.T) {
	r := newSvcRig(t, rigOptions{}, scheduler.CostOptions{})
	r.register(svcSTWorker)
	max := strconv.FormatInt(scheduler.MaxTokens, 10)
	var calls []svcCall
	for _, n := range []int64{scheduler.MaxTokens + 1, math.MaxInt64} {
		for _, id := range []string{"r1", "r2"} {
			calls = append(calls, svcCall{name: "/add " + id + " " + strconv.FormatInt(n, 10), path: "/add",
				body: svcSTAdd.with("request_id", id, "new_isl_tokens", n), status: 400, errHas: []string{"new_isl_tokens", max}})
		}
		calls = append(calls,
			svcCall{name: "/potential_loads new_isl_tokens", path: "/potential_loads", body: jsonObj{"model_name": "llama-3-8b", "sequence_hashes": []any{1}, "new_isl_tokens": n}, status: 400, errHas: []string{"new_isl_tokens", max}},
			svcCall{name: "/potential_loads isl_tokens", path: "/potential_loads", body: jsonObj{"model_name": "llama-3-8b", "block_hashes": []any{1}, "isl_tokens": n}, status: 400, errHas: []string{"isl_tokens", max}},
			svcCall{name: "/select isl_tokens", path: "/select", body: jsonObj{"model_name": "llama-3-8b", "block_hashes": []any{1}, "isl_tokens": n}, status: 400, errHas: []string{"isl_tokens", max}},
			svcCall{name: "/reservations isl_tokens", path: "/reservations", body: jsonObj{"model_name": "llama-3-8b", "reservation_id": "res", "worker_id": 7, "block_hashes": []any{1}, "isl_tokens": n}, status: 400, errHas: []string{"isl_tokens", max}},
		)
	}
	r.svcCalls(t, calls)

	// At the bound, two bookings add up exactly.
	r.svcCalls(t, []svcCall{
		{name: "first /add at the bound", path: "/add", body: svcSTAdd.with("request_id", "a", "new_isl_tokens", scheduler.MaxTokens), status: 201},
		{name: "second /add at the bound", path: "/add", body: svcSTAdd.with("request_id", "b", "new_isl_tokens", scheduler.MaxTokens), status: 201},
	})
	svcJSON(t, "loads", r.svcGet("/loads?worker_id=7&model_name=llama-3-8b"), 200, `[
		{"model_name":"llama-3-8b","tenant_id":"default","worker_id":7,"dp_rank":0,"active_prefill_tokens":`+strconv.FormatInt(2*scheduler.MaxTokens, 10)+`,"active_decode_blocks":3},
		{"model_name":"llama-3-8b","tenant_id":"default","worker_id":7,"dp_rank":1,"active_prefill_tokens":0,"active_decode_blocks":0}]`)
}
