package httpapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/indexer"
	"github.com/kvgate/kvgate/internal/admin"
)

// hold is a run of blocks one worker rank holds on one tier: blocks
// [from, to) of the chain of tokens, hashed for adapter lora.
type hold struct {
	w        indexer.WorkerRank
	tier     indexer.Tier
	tokens   []uint32
	from, to int
	lora     string
	salt     string // cache salt the engine hashed with
}

// place stores holds in ix, in order. A block's engine id is its sequence
// hash, so a rank's copies of one block on several tiers share one id.
func place(t testing.TB, ix *indexer.Index, holds ...hold) {
	t.Helper()
	for _, h := range holds {
		local := indexer.LocalHashes(nil, h.tokens, ix.BlockSize(), indexer.BlockSeed(h.lora, h.salt), nil)
		seq := indexer.SequenceHashes(nil, local)
		ev := indexer.Event{Kind: indexer.Stored, Worker: h.w, Tier: h.tier}
		if h.from > 0 {
			ev.Parent, ev.HasParent = seq[h.from-1], true
		}
		for i := h.from; i < h.to; i++ {
			ev.Blocks = append(ev.Blocks, indexer.Block{ID: seq[i], Local: local[i]})
		}
		if _, err := ix.Apply(ev); err != nil {
			t.Fatalf("place %+v: %v", h, err)
		}
	}
}

var (
	// mcTokens is the prompt of the Mooncake seed's example: blocks H1 H2 H3
	// at block size 2.
	mcTokens = []uint32{101, 15, 100, 55, 89, 63}
	// fxTokens extends it by a fourth block: B1..B4 (B1..B3 = H1..H3).
	fxTokens    = []uint32{101, 15, 100, 55, 89, 63, 7, 8}
	otherTokens = []uint32{900, 901, 902, 903, 904, 905}

	// mooncakeHolds is the Mooncake seed's example at dp2: H1 on GPU of dp0
	// and dp1, on CPU and on DISK; H2 on GPU of dp0 and on CPU; H3 on DISK.
	// kvgate keeps tiers per rank: the CPU and DISK copies are dp0's.
	mooncakeHolds = []hold{
		{w: wr(1, 0), tier: indexer.TierDevice, tokens: fxTokens, from: 0, to: 2},
		{w: wr(1, 0), tier: indexer.TierHost, tokens: fxTokens, from: 0, to: 2},
		{w: wr(1, 0), tier: indexer.TierDisk, tokens: fxTokens, from: 0, to: 1},
		{w: wr(1, 0), tier: indexer.TierDisk, tokens: fxTokens, from: 2, to: 3},
		{w: wr(1, 1), tier: indexer.TierDevice, tokens: fxTokens, from: 0, to: 1},
	}
	// fixtureHolds adds, at block size 2: worker 2 with B1..B4 on device;
	// worker 3 with B1 B2 on host only; worker 4 with an unrelated prefix;
	// worker 5 rank 2 with B1 on device, B2 on disk, and the unrelated
	// prefix (3 blocks) on device.
	fixtureHolds = slices.Concat(mooncakeHolds, []hold{
		{w: wr(2, 0), tier: indexer.TierDevice, tokens: fxTokens, from: 0, to: 4},
		{w: wr(3, 0), tier: indexer.TierHost, tokens: fxTokens, from: 0, to: 2},
		{w: wr(4, 0), tier: indexer.TierDevice, tokens: otherTokens, from: 0, to: 3},
		{w: wr(5, 2), tier: indexer.TierDevice, tokens: fxTokens, from: 0, to: 1},
		{w: wr(5, 2), tier: indexer.TierDisk, tokens: fxTokens, from: 1, to: 2},
		{w: wr(5, 2), tier: indexer.TierDevice, tokens: otherTokens, from: 0, to: 3},
	})
)

// fixture builds the indexes most tests query:
//   - m:default (block size 2): fixtureHolds;
//   - m:acme (2): worker 9 with B1 on device;
//   - deepseek-v3:default (2): the Mooncake example alone;
//   - org/m:v1:default (4): worker 1 with fxTokens' 2 blocks for the base
//     model, worker 2 with the same tokens for adapter "sql".
func fixture(t testing.TB, set *indexer.Set) {
	t.Helper()
	for _, x := range []struct {
		key   indexer.Key
		bs    int
		holds []hold
	}{
		{indexer.Key{Model: "m", Tenant: indexer.DefaultTenant}, 2, fixtureHolds},
		{indexer.Key{Model: "m", Tenant: "acme"}, 2, []hold{{w: wr(9, 0), tier: indexer.TierDevice, tokens: fxTokens, from: 0, to: 1}}},
		{indexer.Key{Model: "deepseek-v3", Tenant: indexer.DefaultTenant}, 2, mooncakeHolds},
		{indexer.Key{Model: "org/m:v1", Tenant: indexer.DefaultTenant}, 4, []hold{
			{w: wr(1, 0), tier: indexer.TierDevice, tokens: fxTokens, from: 0, to: 2},
			{w: wr(2, 0), tier: indexer.TierDevice, tokens: fxTokens, from: 0, to: 2, lora: "sql"},
		}},
	} {
		ix, err := set.Index(x.key, x.bs)
		if err != nil {
			t.Fatal(err)
		}
		place(t, ix, x.holds...)
	}
}

// apiRig is an admin HTTP server with the index routes over a Set.
type apiRig struct {
	set    *indexer.Set
	peers  *Peers
	reg    *prometheus.Registry
	url    string
	client *http.Client
}

// serveAPI serves set (a new empty Set if nil) with a body limit of maxBody
// (0: the default) until the test ends.
func serveAPI(t testing.TB, set *indexer.Set, maxBody int64) *apiRig {
	t.Helper()
	if set == nil {
		set = indexer.NewSet(indexer.Options{IndexShards: 2})
		t.Cleanup(set.Close)
	}
	peers, err := NewPeers(nil)
	if err != nil {
		t.Fatal(err)
	}
	r := &apiRig{set: set, peers: peers, reg: prometheus.NewRegistry()}
	srv := admin.New(admin.Options{MaxBody: maxBody})
	srv.Handle(IndexRoutes(set, peers, r.reg)...)
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)
	r.url, r.client = ts.URL, ts.Client()
	return r
}

// call sends one request and returns the answer's status, header and body.
func (r *apiRig) call(t testing.TB, method, path, body string) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, r.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := r.client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, data
}

// expect POSTs body to path, checks the status and, unless want is "", the
// JSON answer, and returns the answer.
func (r *apiRig) expect(t testing.TB, path, body string, status int, want string) []byte {
	t.Helper()
	code, h, got := r.call(t, http.MethodPost, path, body)
	if code != status {
		t.Fatalf("POST %s %s: status %d, want %d: %s", path, body, code, status, got)
	}
	if ct := h.Get("Content-Type"); ct != "application/json" {
		t.Errorf("POST %s: Content-Type %q", path, ct)
	}
	if want != "" {
		jsonEq(t, got, want)
	}
	return got
}

// jsonEq checks that got and want hold the same JSON value (object key
// order aside; numbers compared as written).
func jsonEq(t testing.TB, got []byte, want string) {
	t.Helper()
	g, w := decodeAny(t, got), decodeAny(t, []byte(want))
	if !reflect.DeepEqual(g, w) {
		gb, _ := json.Marshal(g)
		wb, _ := json.Marshal(w)
		t.Errorf("JSON differs:\n got %s\nwant %s", gb, wb)
	}
}

// decodeAny decodes exactly one JSON value, numbers as json.Number.
func decodeAny(t testing.TB, data []byte) any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("not JSON (%v): %q", err, data)
	}
	if _, err := dec.Token(); err != io.EOF {
		t.Fatalf("more than one JSON value: %q", data)
	}
	return v
}

// obj renders key/value pairs as a JSON object.
func obj(kv ...any) string {
	m := make(map[string]any, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i].(string)] = kv[i+1]
	}
	b, err := json.Marshal(m)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// hashArray renders hashes as a JSON array: "unsigned" numbers, "signed"
// numbers (values >= 2^63 negative, as Dynamo's clients send them), or
// decimal "string"s.
func hashArray(hs []uint64, form string) json.RawMessage {
	parts := make([]string, len(hs))
	for i, h := range hs {
		switch form {
		case "signed":
			parts[i] = strconv.FormatInt(int64(h), 10)
		case "string":
			parts[i] = strconv.Quote(strconv.FormatUint(h, 10))
		default:
			parts[i] = strconv.FormatUint(h, 10)
		}
	}
	return json.RawMessage("[" + strings.Join(parts, ",") + "]")
}

// checkError checks an error answer: its status and a body that is exactly
// one JSON object {"error": "<non-empty>"} mentioning each of want.
func checkError(t testing.TB, code int, h http.Header, body []byte, status int, want ...string) {
	t.Helper()
	if code != status {
		t.Errorf("status %d, want %d: %s", code, status, body)
	}
	if ct := h.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q", ct)
	}
	m, ok := decodeAny(t, body).(map[string]any)
	msg, _ := m["error"].(string)
	if !ok || len(m) != 1 || msg == "" {
		t.Errorf("error body %q is not {\"error\": \"...\"}", body)
		return
	}
	for _, w := range want {
		if !strings.Contains(msg, w) {
			t.Errorf("error %q does not mention %q", msg, w)
		}
	}
}

const (
	// emptyDynamo is the answer when no worker rank holds the first block.
	emptyDynamo = `{"scores":{},"frequencies":[],"tree_sizes":{},"instances":{}}`

	// mooncakeExampleDynamo is the answer to mcTokens on deepseek-v3, by
	// hand, with the cumulative tiers of docs/http-api.md:
	//   dp0: device prefix H1 H2 = 2 blocks; device-or-host prefix H1 H2
	//        (H3 is on disk only) = 2; any-tier prefix H1 H2 H3 = 3.
	//   dp1: H1 on device, H2 not held: 1, 1, 1.
	//   Instance 1: gpu = max(2, 1)*2 = 4, cpu = max(2, 1)*2 = 4,
	//   disk = max(3, 1)*2 = 6, longest_matched = 6, dp {0: 4, 1: 2}.
	//   frequencies: H1 on device at dp0 and dp1 (2), H2 at dp0 (1); the
	//   device walk stops at H3, which no rank holds on device.
	//   tree_sizes: dp0 holds H1 H2 H3 (3 blocks), dp1 holds H1 (1).
	// The seed's own example says DISK 4: Mooncake counts the disk hits (H1,
	// H3) rather than a prefix. The spec's cumulative reading gives 6.
	mooncakeExampleDynamo = `{
		"scores": {"1": {"0": 4, "1": 2}},
		"frequencies": [2, 1],
		"tree_sizes": {"1": {"0": 3, "1": 1}},
		"instances": {"1": {"longest_matched": 6, "gpu": 4, "cpu": 4, "disk": 6, "dp": {"0": 4, "1": 2}}}}`
	mooncakeExample = `{"data": {"1": {"longest_matched": 6, "GPU": 4, "DP": {"0": 4, "1": 2}, "CPU": 4, "DISK": 6}}}`
)

func TestQueryDynamoContract(t *testing.T) {
	r := serveAPI(t, nil, 0)
	fixture(t, r.set)
	// tree_sizes of m:default, by hand: worker 1 dp0 holds B1 B2 B3, dp1 B1;
	// worker 2 B1..B4; worker 3 B1 B2; worker 5 rank 2 B1 B2 and 3 unrelated
	// blocks. Worker 4 matches nothing and is never listed.
	const treeSizes = `{"1": {"0": 3, "1": 1}, "2": {"0": 4}, "3": {"0": 2}, "5": {"2": 5}}`
	tests := []struct {
		name, path, body, want string
	}{{
		// Per rank (device, device-or-host, any tier) prefixes in blocks:
		//   w1 dp0 (2, 2, 3) as in the Mooncake example; w1 dp1 (1, 1, 1);
		//   w2 (4, 4, 4); w3 (0, 2, 2): host only, so not in scores;
		//   w5 rank 2 (1, 1, 2): B2 is on disk only.
		// frequencies: ranks with B1 on device: w1 dp0, w1 dp1, w2, w5 = 4;
		// B2: w1 dp0, w2 = 2; B3: w2 = 1; B4: w2 = 1.
		name: "full prompt",
		path: "/query",
		body: obj("model_name", "m", "token_ids", fxTokens),
		want: `{
			"scores": {"1": {"0": 4, "1": 2}, "2": {"0": 8}, "5": {"2": 2}},
			"frequencies": [4, 2, 1, 1],
			"tree_sizes": ` + treeSizes + `,
			"instances": {
				"1": {"longest_matched": 6, "gpu": 4, "cpu": 4, "disk": 6, "dp": {"0": 4, "1": 2}},
				"2": {"longest_matched": 8, "gpu": 8, "cpu": 8, "disk": 8, "dp": {"0": 8}},
				"3": {"longest_matched": 4, "gpu": 0, "cpu": 4, "disk": 4, "dp": {"0": 0}},
				"5": {"longest_matched": 4, "gpu": 2, "cpu": 2, "disk": 4, "dp": {"2": 2}}}}`,
	}, {
		// One block: every rank holding B1 reaches 1 block on its tiers.
		name: "one block, partial second block ignored",
		path: "/query",
		body: obj("model_name", "m", "tenant_id", "", "token_ids", fxTokens[:3]),
		want: `{
			"scores": {"1": {"0": 2, "1": 2}, "2": {"0": 2}, "5": {"2": 2}},
			"frequencies": [4],
			"tree_sizes": ` + treeSizes + `,
			"instances": {
				"1": {"longest_matched": 2, "gpu": 2, "cpu": 2, "disk": 2, "dp": {"0": 2, "1": 2}},
				"2": {"longest_matched": 2, "gpu": 2, "cpu": 2, "disk": 2, "dp": {"0": 2}},
				"3": {"longest_matched": 2, "gpu": 0, "cpu": 2, "disk": 2, "dp": {"0": 0}},
				"5": {"longest_matched": 2, "gpu": 2, "cpu": 2, "disk": 2, "dp": {"2": 2}}}}`,
	}, {
		name: "mooncake example, explicit default tenant, unknown fields ignored",
		path: "/query",
		body: obj("model_name", "deepseek-v3", "tenant_id", "default", "token_ids", mcTokens,
			"future_field", map[string]any{"x": []int{1, 2}}, "priority", 3),
		want: mooncakeExampleDynamo,
	}, {
		// Workers 4 and 5 share the unrelated prefix; tree_sizes counts all
		// of a rank's blocks, not only the matched ones.
		name: "unrelated prefix",
		path: "/query",
		body: obj("model_name", "m", "token_ids", otherTokens[:2]),
		want: `{"scores": {"4": {"0": 2}, "5": {"2": 2}}, "frequencies": [2], "tree_sizes": {"4": {"0": 3}, "5": {"2": 5}},
			"instances": {"4": {"longest_matched": 2, "gpu": 2, "cpu": 2, "disk": 2, "dp": {"0": 2}},
				"5": {"longest_matched": 2, "gpu": 2, "cpu": 2, "disk": 2, "dp": {"2": 2}}}}`,
	}, {
		name: "tenant isolation",
		path: "/query",
		body: obj("model_name", "m", "tenant_id", "acme", "token_ids", fxTokens),
		want: `{"scores": {"9": {"0": 2}}, "frequencies": [1], "tree_sizes": {"9": {"0": 1}},
			"instances": {"9": {"longest_matched": 2, "gpu": 2, "cpu": 2, "disk": 2, "dp": {"0": 2}}}}`,
	}, {
		name: "no match",
		path: "/query",
		body: obj("model_name", "m", "token_ids", []uint32{1, 2, 3, 4}),
		want: emptyDynamo,
	}, {
		name: "no full block",
		path: "/query",
		body: obj("model_name", "m", "token_ids", []uint32{101}),
		want: emptyDynamo,
	}, {
		name: "empty token_ids",
		path: "/query",
		body: `{"model_name": "m", "token_ids": []}`,
		want: emptyDynamo,
	}, {
		name: "by hash",
		path: "/query_by_hash",
		body: obj("model_name", "deepseek-v3", "block_hashes", indexer.LocalHashes(nil, mcTokens, 2, indexer.BaseSeed, nil)),
		want: mooncakeExampleDynamo,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r.expect(t, tt.path, tt.body, http.StatusOK, tt.want)
		})
	}
	for _, key := range []indexer.Key{{Model: "nope", Tenant: indexer.DefaultTenant}, {Model: "m", Tenant: "other"}, {Model: "deepseek-v3", Tenant: "acme"}} {
		body := obj("model_name", key.Model, "tenant_id", key.Tenant, "token_ids", fxTokens, "block_hashes", []uint64{1})
		for _, path := range []string{"/query", "/query_by_hash"} {
			code, h, got := r.call(t, http.MethodPost, path, body)
			checkError(t, code, h, got, http.StatusNotFound)
		}
	}
}

func TestQueryLoRA(t *testing.T) {
	r := serveAPI(t, nil, 0)
	fixture(t, r.set)
	// org/m:v1 (block size 4): worker 1 holds fxTokens' 2 blocks for the
	// base model, worker 2 the same tokens for adapter "sql".
	const base = `{"scores": {"1": {"0": 8}}, "frequencies": [1, 1], "tree_sizes": {"1": {"0": 2}},
		"instances": {"1": {"longest_matched": 8, "gpu": 8, "cpu": 8, "disk": 8, "dp": {"0": 8}}}}`
	const sql = `{"scores": {"2": {"0": 8}}, "frequencies": [1, 1], "tree_sizes": {"2": {"0": 2}},
		"instances": {"2": {"longest_matched": 8, "gpu": 8, "cpu": 8, "disk": 8, "dp": {"0": 8}}}}`
	const sqlMooncake = `{"data": {"2": {"longest_matched": 8, "GPU": 8, "DP": {"0": 8}, "CPU": 8, "DISK": 8}}}`
	for _, tt := range []struct{ path, body, want string }{
		{"/query", obj("model_name", "org/m:v1", "token_ids", fxTokens), base},
		{"/query", obj("model_name", "org/m:v1", "lora_name", "", "token_ids", fxTokens), base},
		{"/query", obj("model_name", "org/m:v1", "lora_name", "sql", "token_ids", fxTokens), sql},
		{"/query", obj("model_name", "org/m:v1", "lora_name", "other", "token_ids", fxTokens), emptyDynamo},
		{"/conductor/query", obj("model", "org/m:v1", "lora_name", "sql", "lora_id", -1, "token_ids", fxTokens), sqlMooncake},
		// Local hashes carry the adapter: by hash, the seed decides.
		{"/query_by_hash", obj("model_name", "org/m:v1", "block_hashes", indexer.LocalHashes(nil, fxTokens, 4, indexer.LoRASeed("sql"), nil)), sql},
		{"/query_by_hash", obj("model_name", "org/m:v1", "block_hashes", indexer.LocalHashes(nil, fxTokens, 4, indexer.BaseSeed, nil)), base},
	} {
		r.expect(t, tt.path, tt.body, http.StatusOK, tt.want)
	}
}

func TestQueryCacheSalt(t *testing.T) {
	r := serveAPI(t, nil, 0)
	ix, err := r.set.Index(indexer.Key{Model: "salty", Tenant: indexer.DefaultTenant}, 2)
	if err != nil {
		t.Fatal(err)
	}
	// Worker 1 holds fxTokens' 4 blocks unsalted, worker 2 salted with
	// "tenant-a", worker 3 salted with "tenant-a" for adapter "sql".
	place(t, ix,
		hold{w: wr(1, 0), tier: indexer.TierDevice, tokens: fxTokens, to: 4},
		hold{w: wr(2, 0), tier: indexer.TierDevice, tokens: fxTokens, to: 4, salt: "tenant-a"},
		hold{w: wr(3, 0), tier: indexer.TierDevice, tokens: fxTokens, to: 4, lora: "sql", salt: "tenant-a"})
	only := func(w string) string {
		return `{"scores": {"` + w + `": {"0": 8}}, "frequencies": [1, 1, 1, 1], "tree_sizes": {"` + w + `": {"0": 4}},
		"instances": {"` + w + `": {"longest_matched": 8, "gpu": 8, "cpu": 8, "disk": 8, "dp": {"0": 8}}}}`
	}
	for _, tt := range []struct{ path, body, want string }{
		{"/query", obj("model_name", "salty", "token_ids", fxTokens), only("1")},
		{"/query", obj("model_name", "salty", "cache_salt", "", "token_ids", fxTokens), only("1")},
		{"/query", obj("model_name", "salty", "cache_salt", "tenant-a", "token_ids", fxTokens), only("2")},
		{"/query", obj("model_name", "salty", "cache_salt", "tenant-a", "lora_name", "sql", "token_ids", fxTokens), only("3")},
		{"/query", obj("model_name", "salty", "cache_salt", "tenant-b", "token_ids", fxTokens), emptyDynamo},
		{"/query", obj("model_name", "salty", "lora_name", "sql", "token_ids", fxTokens), emptyDynamo},
		// By hash, the salt is in the hashes already.
		{"/query_by_hash", obj("model_name", "salty", "block_hashes", indexer.LocalHashes(nil, fxTokens, 2, indexer.BlockSeed("", "tenant-a"), nil)), only("2")},
	} {
		r.expect(t, tt.path, tt.body, http.StatusOK, tt.want)
	}
	for _, path := range []string{"/query_by_hash", "/conductor/query_by_hash"} {
		for _, salt := range []string{"tenant-a", ""} {
			code, h, got := r.call(t, http.MethodPost, path, obj("model_name", "salty", "cache_salt", salt, "block_hashes", []uint64{1}))
			checkError(t, code, h, got, http.StatusBadRequest, "cache_salt")
		}
	}
}

func TestQueryByHashEncodings(t *testing.T) {
	r := serveAPI(t, nil, 0)
	fixture(t, r.set)
	// Local hashes of the prompt in three spellings all answer as /query.
	want := r.expect(t, "/query", obj("model_name", "m", "token_ids", fxTokens), http.StatusOK, "")
	local := indexer.LocalHashes(nil, fxTokens, 2, indexer.BaseSeed, nil)
	for _, form := range []string{"unsigned", "signed", "string"} {
		r.expect(t, "/query_by_hash", obj("model_name", "m", "block_hashes", hashArray(local, form)), http.StatusOK, string(want))
	}

	// Extreme hashes round-trip exactly. Worker 1 holds a root block with
	// local hash 2^64-1 and under it one with 2^53+1; worker 2 a root block
	// with 2^53. Through float64, 2^53+1 would become 2^53.
	const max64, p53 = uint64(1<<64 - 1), uint64(1 << 53)
	ix, err := r.set.Index(indexer.Key{Model: "edge", Tenant: indexer.DefaultTenant}, 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range []indexer.Event{
		{Kind: indexer.Stored, Worker: wr(1, 0), Tier: indexer.TierDevice, Blocks: []indexer.Block{{ID: 1, Local: max64}, {ID: 2, Local: p53 + 1}}},
		{Kind: indexer.Stored, Worker: wr(2, 0), Tier: indexer.TierDevice, Blocks: []indexer.Block{{ID: 1, Local: p53}}},
	} {
		if _, err := ix.Apply(ev); err != nil {
			t.Fatal(err)
		}
	}
	w1 := func(blocks int) string {
		n := 2 * blocks
		return fmt.Sprintf(`{"scores": {"1": {"0": %d}}, "frequencies": %s, "tree_sizes": {"1": {"0": 2}},
			"instances": {"1": {"longest_matched": %d, "gpu": %d, "cpu": %d, "disk": %d, "dp": {"0": %d}}}}`,
			n, []string{"", "[1]", "[1,1]"}[blocks], n, n, n, n, n)
	}
	const w2 = `{"scores": {"2": {"0": 2}}, "frequencies": [1], "tree_sizes": {"2": {"0": 1}},
		"instances": {"2": {"longest_matched": 2, "gpu": 2, "cpu": 2, "disk": 2, "dp": {"0": 2}}}}`
	for _, tt := range []struct{ hashes, want string }{
		{`[-1]`, w1(1)},
		{`[18446744073709551615]`, w1(1)},
		{`["18446744073709551615"]`, w1(1)},
		{`["-1"]`, w1(1)},
		{`[-1, 9007199254740993]`, w1(2)},
		{`[18446744073709551615, "9007199254740993"]`, w1(2)},
		{`[-1, 9007199254740992]`, w1(1)}, // 2^53 is not worker 1's second block
		{`[9007199254740992]`, w2},
		{`[9007199254740993]`, emptyDynamo}, // nobody holds 2^53+1 as a root
		{`[-9223372036854775808]`, emptyDynamo},
		{`[]`, emptyDynamo},
	} {
		r.expect(t, "/query_by_hash", `{"model_name": "edge", "block_hashes": `+tt.hashes+`}`, http.StatusOK, tt.want)
	}
	for _, bad := range []string{`[18446744073709551616]`, `[-9223372036854775809]`, `[1.5]`, `[1e3]`, `["abc"]`, `[""]`, `[true]`, `[null]`, `[{}]`} {
		code, h, got := r.call(t, http.MethodPost, "/query_by_hash", `{"model_name": "edge", "block_hashes": `+bad+`}`)
		checkError(t, code, h, got, http.StatusBadRequest)
	}
}

func TestQueryMooncakeShapes(t *testing.T) {
	r := serveAPI(t, nil, 0)
	fixture(t, r.set)
	local := indexer.LocalHashes(nil, mcTokens, 2, indexer.BaseSeed, nil)
	for _, tt := range []struct {
		name, path, body, want string
	}{
		{"conductor query", "/conductor/query", obj("model", "deepseek-v3", "token_ids", mcTokens), mooncakeExample},
		{"lora_id -1 is none", "/conductor/query", obj("model", "deepseek-v3", "lora_id", -1, "token_ids", mcTokens), mooncakeExample},
		{"lora_id 0 is none", "/conductor/query", obj("model", "deepseek-v3", "lora_id", 0, "token_ids", mcTokens), mooncakeExample},
		{"query with model key", "/query", obj("model", "deepseek-v3", "token_ids", mcTokens), mooncakeExample},
		{"query with both keys is Dynamo", "/query", obj("model", "deepseek-v3", "model_name", "deepseek-v3", "token_ids", mcTokens), mooncakeExampleDynamo},
		{"by hash, strings", "/conductor/query_by_hash", obj("model", "deepseek-v3", "block_hash", hashArray(local, "string")), mooncakeExample},
		{"by hash, signed", "/conductor/query_by_hash", obj("model", "deepseek-v3", "lora_id", -1, "block_hash", hashArray(local, "signed")), mooncakeExample},
		{"no match", "/conductor/query", obj("model", "m", "token_ids", []uint32{1, 2}), `{"data": {}}`},
		// The conductor answers an unregistered model with no engines.
		{"unknown model", "/conductor/query", obj("model", "nope", "token_ids", mcTokens), `{"data": {}}`},
		{"unknown model, by hash", "/conductor/query_by_hash", obj("model", "nope", "block_hash", local), `{"data": {}}`},
		{"unknown tenant", "/conductor/query", obj("model", "m", "tenant_id", "other", "token_ids", mcTokens), `{"data": {}}`},
		{"unknown model, query with model key", "/query", obj("model", "nope", "token_ids", mcTokens), `{"data": {}}`},
		// The fixture's m:default at the Mooncake example's prompt: per
		// instance as in TestQueryDynamoContract's full prompt, minus B4.
		{"several engines", "/conductor/query", obj("model", "m", "token_ids", mcTokens), `{"data": {
			"1": {"longest_matched": 6, "GPU": 4, "DP": {"0": 4, "1": 2}, "CPU": 4, "DISK": 6},
			"2": {"longest_matched": 6, "GPU": 6, "DP": {"0": 6}, "CPU": 6, "DISK": 6},
			"3": {"longest_matched": 4, "GPU": 0, "DP": {"0": 0}, "CPU": 4, "DISK": 4},
			"5": {"longest_matched": 4, "GPU": 2, "DP": {"2": 2}, "CPU": 2, "DISK": 4}}}`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r.expect(t, tt.path, tt.body, http.StatusOK, tt.want)
		})
	}
	for _, tt := range []struct{ path, body, want string }{
		{"/conductor/query", obj("model", "deepseek-v3", "lora_id", 12, "token_ids", mcTokens), "lora_id"},
		{"/conductor/query", obj("model", "deepseek-v3", "lora_id", 12, "lora_name", "sql", "token_ids", mcTokens), "lora_name"},
		{"/conductor/query_by_hash", obj("model", "deepseek-v3", "lora_id", 1, "block_hash", local), "lora_id"},
		{"/query", obj("model", "deepseek-v3", "lora_id", 3, "token_ids", mcTokens), "lora_id"},
	} {
		code, h, got := r.call(t, http.MethodPost, tt.path, tt.body)
		checkError(t, code, h, got, http.StatusBadRequest, tt.want)
	}
}

func TestAPIErrors(t *testing.T) {
	const limit = 1 << 10
	r := serveAPI(t, nil, limit)
	fixture(t, r.set)
	big := obj("model_name", "m", "token_ids", make([]uint32, limit))
	tests := []struct {
		method, path, body string
		status             int
		want               []string // substrings of the error message
	}{
		{"POST", "/query", `{"model_name": "m", "token_ids": [1, 2]`, 400, nil},
		{"POST", "/query", `{model_name: "m"}`, 400, nil},
		{"POST", "/query", ``, 400, []string{"empty"}},
		{"POST", "/query", " \n\t", 400, []string{"empty"}},
		{"POST", "/query", `{"model_name": "m", "token_ids": [1, 2]} {}`, 400, nil},
		{"POST", "/query", `{"model_name": "m", "token_ids": [1, 2]} x`, 400, nil},
		{"POST", "/query", `[]`, 400, nil},
		{"POST", "/query", `"m"`, 400, nil},
		{"POST", "/query", `null`, 400, []string{"model_name"}},
		{"POST", "/query", `{"token_ids": [1, 2]}`, 400, []string{"model_name"}},
		{"POST", "/query", `{"model_name": "", "token_ids": [1, 2]}`, 400, []string{"model_name"}},
		{"POST", "/query", `{"model_name": 7, "token_ids": [1, 2]}`, 400, []string{"model_name"}},
		{"POST", "/query", `{"model_name": "m"}`, 400, []string{"token_ids"}},
		{"POST", "/query", `{"model_name": "m", "token_ids": null}`, 400, []string{"token_ids"}},
		{"POST", "/query", `{"model_name": "m", "token_ids": [-1]}`, 400, []string{"token_ids"}},
		{"POST", "/query", `{"model_name": "m", "token_ids": ["1"]}`, 400, []string{"token_ids"}},
		{"POST", "/query", `{"model_name": "m", "token_ids": "1 2"}`, 400, []string{"token_ids"}},
		{"POST", "/query", `{"model_name": "m", "token_ids": [4294967296]}`, 400, []string{"token_ids"}},
		{"POST", "/query", `{"model_name": "m", "token_ids": [1.5]}`, 400, []string{"token_ids"}},
		{"POST", "/query", `{"model_name": "m", "tenant_id": 5, "token_ids": [1]}`, 400, []string{"tenant_id"}},
		{"POST", "/query", `{"model_name": "m", "lora_name": ["x"], "token_ids": [1]}`, 400, []string{"lora_name"}},
		{"POST", "/query", `{"model_name": "nope", "token_ids": [1, 2]}`, 404, []string{"nope"}},
		{"POST", "/query", `{"model_name": "m", "tenant_id": "other", "token_ids": [1, 2]}`, 404, []string{"other"}},
		{"POST", "/query", big, 413, nil},
		{"POST", "/query_by_hash", `{"model_name": "m"}`, 400, []string{"block_hashes"}},
		{"POST", "/query_by_hash", `{"model_name": "m", "block_hashes": "1"}`, 400, []string{"block_hashes"}},
		{"POST", "/query_by_hash", `{"model_name": "m", "block_hashes": [1.5]}`, 400, []string{"1.5"}},
		{"POST", "/query_by_hash", `{"block_hashes": [1]}`, 400, []string{"model_name"}},
		{"POST", "/query_by_hash", `{}`, 400, nil},
		{"POST", "/conductor/query", `{"token_ids": [1, 2]}`, 400, []string{"model"}},
		{"POST", "/conductor/query", `{"model": "m"}`, 400, []string{"token_ids"}},
		{"POST", "/conductor/query", `{"model": "m", "lora_id": "3", "token_ids": [1, 2]}`, 400, []string{"lora_id"}},
		{"POST", "/conductor/query_by_hash", `{"model": "m"}`, 400, []string{"block_hash"}},
		{"POST", "/conductor/query_by_hash", `{"block_hash": [1]}`, 400, []string{"model"}},
		{"POST", "/conductor/query_by_hash", big, 413, nil},
		{"POST", "/register_peer", obj("url", strings.Repeat("x", limit)), 413, nil},
		{"GET", "/nope", ``, 404, nil},
		{"POST", "/query/", `{}`, 404, nil},
		{"POST", "/conductor", `{}`, 404, nil},
		{"GET", "/", ``, 404, nil},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.path+" "+tt.body[:min(len(tt.body), 60)], func(t *testing.T) {
			code, h, got := r.call(t, tt.method, tt.path, tt.body)
			checkError(t, code, h, got, tt.status, tt.want...)
		})
	}
	// Wrong methods: 405 with the route's methods in Allow.
	for _, tt := range []struct{ method, path, allow string }{
		{"GET", "/query", "POST"},
		{"PUT", "/query_by_hash", "POST"},
		{"GET", "/conductor/query", "POST"},
		{"DELETE", "/conductor/query_by_hash", "POST"},
		{"POST", "/dump", "GET"},
		{"DELETE", "/peers", "GET"},
		{"GET", "/register_peer", "POST"},
		{"PATCH", "/deregister_peer", "POST"},
	} {
		code, h, got := r.call(t, tt.method, tt.path, "")
		checkError(t, code, h, got, http.StatusMethodNotAllowed)
		if allow := h.Get("Allow"); !strings.Contains(allow, tt.allow) {
			t.Errorf("%s %s: Allow %q, want %s", tt.method, tt.path, allow, tt.allow)
		}
	}
}

// samples returns the registry's kvgate_index_* samples as
// `name{label="value",...}` -> value (for a histogram, its sample count).
func samples(t *testing.T, reg prometheus.Gatherer) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "kvgate_index_") {
			continue
		}
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			name := mf.GetName() + "{" + strings.Join(labels, ",") + "}"
			if h := m.GetHistogram(); h != nil {
				out[name] = float64(h.GetSampleCount())
			} else {
				out[name] = m.GetGauge().GetValue()
			}
		}
	}
	return out
}

func TestAPIMetrics(t *testing.T) {
	// One shard: a block held by workers of two shards counts twice.
	set := indexer.NewSet(indexer.Options{IndexShards: 1})
	t.Cleanup(set.Close)
	r := serveAPI(t, set, 0)
	fixture(t, r.set)
	for _, q := range []struct{ path, body string }{
		{"/query", obj("model_name", "m", "token_ids", fxTokens)},
		{"/query_by_hash", obj("model_name", "m", "block_hashes", []uint64{1})},
		{"/query", obj("model_name", "org/m:v1", "token_ids", fxTokens)},
		{"/conductor/query", obj("model", "m", "token_ids", fxTokens)},
		{"/conductor/query_by_hash", obj("model", "m", "block_hash", []uint64{1})},
	} {
		if code, _, got := r.call(t, http.MethodPost, q.path, q.body); code != http.StatusOK {
			t.Fatalf("%s: %d %s", q.path, code, got)
		}
	}
	// Index sizes by hand (fixture's comments): m:default has 6 ranks (w1 dp0
	// and dp1, w2, w3, w4, w5 rank 2), 7 positions (B1..B4 and 3 unrelated
	// blocks shared by w4 and w5), 3+1+4+2+3+5 = 18 entries; deepseek-v3 2
	// ranks, H1..H3, 3+1 entries; m:acme 1, 1, 1; org/m:v1 2 ranks, 2 base
	// and 2 adapter positions, 4 entries.
	want := map[string]float64{
		`kvgate_index_query_duration_seconds{api="dynamo"}`:   3,
		`kvgate_index_query_duration_seconds{api="mooncake"}`: 2,
	}
	for _, x := range []struct {
		model, tenant          string
		ranks, blocks, entries float64
	}{
		{"m", "default", 6, 7, 18},
		{"m", "acme", 1, 1, 1},
		{"deepseek-v3", "default", 2, 3, 4},
		{"org/m:v1", "default", 2, 4, 4},
	} {
		labels := fmt.Sprintf(`{model=%q,tenant=%q}`, x.model, x.tenant)
		want["kvgate_index_worker_ranks"+labels] = x.ranks
		want["kvgate_index_blocks"+labels] = x.blocks
		want["kvgate_index_entries"+labels] = x.entries
	}
	if got := samples(t, r.reg); !reflect.DeepEqual(got, want) {
		t.Errorf("metrics:\n got %v\nwant %v", got, want)
	}
}

// fuzzRoutes are the routes FuzzAPI POSTs to.
var fuzzRoutes = []string{"/query", "/query_by_hash", "/conductor/query", "/conductor/query_by_hash", "/register_peer", "/deregister_peer"}

// FuzzAPI POSTs arbitrary bodies to the routes (chosen by route) over the
// fixture: never a panic or a 5xx, always a JSON object, a query answer
// with gpu <= cpu <= disk, and the index unchanged. Peers change only by
// one URL on a successful register or deregister.
func FuzzAPI(f *testing.F) {
	set := indexer.NewSet(indexer.Options{EventThreads: 1})
	f.Cleanup(set.Close)
	fixture(f, set)
	before, err := indexer.MarshalDump(set.Dump())
	if err != nil {
		f.Fatal(err)
	}
	const peer = "http://peer.example:1"
	f.Fuzz(func(t *testing.T, route byte, body []byte) {
		path := fuzzRoutes[int(route)%len(fuzzRoutes)]
		peers, _ := NewPeers([]string{peer})
		srv := admin.New(admin.Options{MaxBody: 1 << 12})
		srv.Handle(IndexRoutes(set, peers, nil)...)
		w := httptest.NewRecorder()
		srv.ServeHTTP(w, httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body)))

		if w.Code >= 500 || w.Header().Get("Content-Type") != "application/json" {
			t.Fatalf("POST %s %q: %d %q %s", path, body, w.Code, w.Header().Get("Content-Type"), w.Body)
		}
		var resp struct {
			Instances map[string]dynamoInstance   `json:"instances"`
			Data      map[string]mooncakeInstance `json:"data"`
		}
		if err := json.Unmarshal(w.Body.Bytes(), &resp); err != nil || w.Body.Bytes()[0] != '{' {
			t.Fatalf("POST %s %q: answer is not a JSON object (%v): %s", path, body, err, w.Body)
		}
		all := slices.Collect(maps.Values(resp.Instances))
		for _, mc := range resp.Data {
			all = append(all, dynamoInstance(mc))
		}
		for _, in := range all {
			top := 0
			for _, n := range in.DP {
				top = max(top, n)
			}
			if len(in.DP) == 0 || in.GPU != top || in.GPU > in.CPU || in.CPU > in.Disk || in.LongestMatched != in.Disk {
				t.Fatalf("POST %s %q: instance %+v", path, body, in)
			}
		}
		if after, _ := indexer.MarshalDump(set.Dump()); !bytes.Equal(before, after) {
			t.Fatalf("POST %s %q changed the index", path, body)
		}
		now := peers.List()
		switch ok := w.Code < 300; {
		case ok && path == "/register_peer":
			if !slices.Contains(now, peer) || len(now) > 2 {
				t.Fatalf("register %q: peers %v", body, now)
			}
		case ok && path == "/deregister_peer":
			if len(now) != 0 {
				t.Fatalf("deregister %q: peers %v", body, now)
			}
		case !slices.Equal(now, []string{peer}):
			t.Fatalf("POST %s %q (%d): peers %v", path, body, w.Code, now)
		}
	})
}
