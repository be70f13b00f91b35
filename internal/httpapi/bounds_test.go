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
