package httpapi

import (
	"bytes"
	"net/http"
	"testing"

	"github.com/kvgate/kvgate/indexer"
	"github.com/kvgate/kvgate/scheduler"
)

// These tests give the selection service's prompt-taking routes the same
// prompt as token_ids and in the hash form, and expect the same answer.

// promptForms returns toks as token_ids (with lora_name lora when not
// empty) and in the hash form kvgate derives from them for block size 16.
func promptForms(toks []uint32, lora string) (tokens, hashes jsonObj) {
	local := indexer.LocalHashes(nil, toks, 16, indexer.LoRASeed(lora), nil)
	tokens = jsonObj{"model_name": "model", "token_ids": toks}
	if lora != "" {
		tokens["lora_name"] = lora
	}
	hashes = jsonObj{"model_name": "model", "block_hashes": local,
		"sequence_hashes": indexer.SequenceHashes(nil, local), "isl_tokens": len(toks)}
	return tokens, hashes
}

func TestPromptTokenIDs(t *testing.T) {
	r := svcSelectRig(t, scheduler.CostOptions{})
	toks := make([]uint32, 40) // two blocks and a partial one
	for i := range toks {
		toks[i] = uint32(1000 + i)
	}
	base := indexer.LocalHashes(nil, toks, 16, indexer.BaseSeed, nil)
	adapter := indexer.LocalHashes(nil, toks, 16, indexer.LoRASeed("ad"), nil)
	r.svcStore("model", 1, 1, indexer.TierDevice, base...)
	r.svcStore("model", 1, 0, indexer.TierDevice, adapter[:1]...)
	for _, lora := range []string{"", "ad"} {
		tokens, hashes := promptForms(toks, lora)
		booking := jsonObj{"reservation_id": "r1", "worker_id": 1, "dp_rank": 1}
		for _, c := range []struct {
			path, free string
			extra      jsonObj
		}{
			{path: "/select"},
			{path: "/select_and_reserve", free: "/reservations/r1?model_name=model", extra: jsonObj{"reservation_id": "r1"}},
			{path: "/potential_loads"},
			{path: "/overlap_scores"},
			{path: "/reservations", free: "/reservations/r1?model_name=model", extra: booking},
		} {
			var got [2]reply
			for i, body := range []jsonObj{tokens, hashes} {
				for k, v := range c.extra {
					body = body.with(k, v)
				}
				if c.path == "/overlap_scores" {
					body = body.without("sequence_hashes", "isl_tokens")
				}
				got[i] = r.post(c.path, body)
				if c.free != "" {
					r.do(http.MethodDelete, c.free, nil).expect(t, http.StatusOK)
				}
			}
			if got[0].status != http.StatusOK && got[0].status != http.StatusCreated || got[0].status != got[1].status || !bytes.Equal(got[0].body, got[1].body) {
				t.Errorf("%s, lora %q: token_ids answer %d %s\nthe hash form %d %s", c.path, lora, got[0].status, got[0].body, got[1].status, got[1].body)
			}
		}
	}
	// The tokens matched: rank 1 holds both full blocks, rank 0 the
	// adapter's first one.
	tokens, _ := promptForms(toks, "ad")
	svcJSON(t, "overlap by tokens", r.post("/overlap_scores", tokens), 200,
		`{"block_size":16,"num_blocks":2,"workers":[
		{"worker_id":1,"dp_rank":0,"device_blocks":1,"host_pinned_blocks":1,"disk_blocks":1,"host_pinned_extension_blocks":0,"disk_extension_blocks":0,"shared_beyond_device_blocks":null,"router_credit_blocks":1},
		{"worker_id":1,"dp_rank":1,"device_blocks":0,"host_pinned_blocks":0,"disk_blocks":0,"host_pinned_extension_blocks":0,"disk_extension_blocks":0,"shared_beyond_device_blocks":null,"router_credit_blocks":0}],
		"shared_cache":{"enabled":false,"total_hit_blocks":0,"ranges":[],"error":null}}`)
	tokens, _ = promptForms(toks, "")
	svcJSON(t, "reservation by tokens", r.post("/reservations", tokens.with("reservation_id", "r2", "worker_id", 1)), 201,
		`{"status":"ok","reservation_id":"r2","model_name":"model","tenant_id":"default","worker_id":1,"dp_rank":0,"endpoint":"http://worker:8000"}`)
	r.do(http.MethodDelete, "/reservations/r2?model_name=model", nil).expect(t, http.StatusOK)

	var calls []svcCall
	for _, path := range []string{"/select", "/select_and_reserve", "/potential_loads", "/overlap_scores", "/reservations"} {
		tok := tokens.with("reservation_id", "r3", "worker_id", 1)
		unknown := 404
		if path == "/select" || path == "/select_and_reserve" {
			unknown = 503
		}
		calls = append(calls,
			svcCall{name: path + " both forms", path: path, body: tok.with("block_hashes", []any{1, 2}), status: 400, errHas: []string{"token_ids"}},
			svcCall{name: path + " tokens and sequence hashes", path: path, body: tok.with("sequence_hashes", []any{1, 2}), status: 400, errHas: []string{"token_ids"}},
			svcCall{name: path + " neither", path: path, body: tok.without("token_ids"), status: 400, errHas: []string{"token_ids"}},
			svcCall{name: path + " token over uint32", path: path, body: tok.with("token_ids", []any{1, 1 << 32}), status: 400, errHas: []string{"token_ids"}},
			svcCall{name: path + " negative token", path: path, body: tok.with("token_ids", []any{-1}), status: 400, errHas: []string{"token_ids"}},
			svcCall{name: path + " unknown model", path: path, body: tok.with("model_name", "nope"), status: unknown, errHas: []string{"nope"}},
		)
		if path != "/overlap_scores" {
			calls = append(calls, svcCall{name: path + " isl_tokens differs", path: path, body: tok.with("isl_tokens", 39), status: 400, errHas: []string{"isl_tokens"}})
		}
	}
	r.svcCalls(t, calls)
}
