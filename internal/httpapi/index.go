package httpapi

import (
	"cmp"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/indexer"
	"github.com/kvgate/kvgate/internal/admin"
)

// This file serves the index's overlap queries: Dynamo's standalone
// indexer and Mooncake's conductor (docs/http-api.md).

// indexAPI serves the index routes over a Set.
type indexAPI struct {
	set   *indexer.Set
	peers *Peers
	match *prometheus.HistogramVec
}

// IndexRoutes returns the routes of the index over set and peers: Dynamo's
// and Mooncake's overlap queries, the dump and the peer list. reg, if not
// nil, receives the query latency histogram and the index size gauges.
func IndexRoutes(set *indexer.Set, peers *Peers, reg prometheus.Registerer) []admin.Route {
	a := &indexAPI{
		set:   set,
		peers: peers,
		match: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvgate_index_query_duration_seconds",
			Help:    "Time to answer an overlap query (hashing and matching), by API shape.",
			Buckets: prometheus.ExponentialBuckets(1e-6, 3, 14), // 1µs .. ~1.6s
		}, []string{"api"}),
	}
	if reg != nil {
		reg.MustRegister(a.match, sizeCollector{set})
	}
	return []admin.Route{
		{Pattern: "POST /query", Handler: a.query(false, false)},
		{Pattern: "POST /query_by_hash", Handler: a.query(true, false)},
		{Pattern: "POST /conductor/query", Handler: a.query(false, true)},
		{Pattern: "POST /conductor/query_by_hash", Handler: a.query(true, true)},
		{Pattern: "GET /dump", Handler: a.dump},
		{Pattern: "POST /register_peer", Handler: a.registerPeer, Mutates: true},
		{Pattern: "POST /deregister_peer", Handler: a.deregisterPeer, Mutates: true},
		{Pattern: "GET /peers", Handler: a.listPeers},
	}
}

// queryRequest is the union of Dynamo's and Mooncake's query bodies.
type queryRequest struct {
	TokenIDs    *[]uint32       `json:"token_ids"`
	BlockHashes *[]indexer.Hash `json:"block_hashes"` // Dynamo
	BlockHash   *[]indexer.Hash `json:"block_hash"`   // Mooncake
	ModelName   *string         `json:"model_name"`   // Dynamo
	Model       *string         `json:"model"`        // Mooncake
	TenantID    *string         `json:"tenant_id"`
	LoRAName    *string         `json:"lora_name"`
	LoRAID      *int64          `json:"lora_id"` // Mooncake, legacy: -1 is none
	CacheSalt   *string         `json:"cache_salt"`
}

// overlapQuery is a decoded overlap query.
type overlapQuery struct {
	Key      indexer.Key
	Mooncake bool // answer in Mooncake's shape
	ByHash   bool
	Tokens   []uint32
	Local    []uint64 // local block hashes, when ByHash
	LoRA     string
	Salt     string // cache_salt of Tokens
}

func parseQuery(req queryRequest, byHash, conductor bool) (overlapQuery, error) {
	q := overlapQuery{ByHash: byHash, Mooncake: conductor}
	switch {
	case req.ModelName != nil && *req.ModelName != "":
		q.Key.Model = *req.ModelName
	case req.Model != nil && *req.Model != "":
		q.Key.Model, q.Mooncake = *req.Model, true
	default:
		field := "model_name"
		if conductor {
			field = "model"
		}
		return q, admin.Errorf(http.StatusBadRequest, "%s is required", field)
	}
	q.Key.Tenant = indexer.DefaultTenant
	if req.TenantID != nil && *req.TenantID != "" {
		q.Key.Tenant = *req.TenantID
	}
	if req.LoRAName != nil {
		q.LoRA = *req.LoRAName
	}
	if req.LoRAID != nil && *req.LoRAID > 0 { // -1 (Mooncake) and 0 mean none
		if q.LoRA != "" {
			return q, admin.Errorf(http.StatusBadRequest, "give lora_name or lora_id, not both")
		}
		// Blocks are keyed by adapter name (as in Dynamo); an id cannot be
		// mapped to one.
		return q, admin.Errorf(http.StatusBadRequest, "lora_id %d is not supported: adapters are identified by lora_name", *req.LoRAID)
	}
	if byHash {
		if req.CacheSalt != nil {
			// As Dynamo: hashes given must already include the salt.
			return q, admin.Errorf(http.StatusBadRequest, "cache_salt is not accepted with block hashes; they must already include the cache salt")
		}
		hashes := req.BlockHashes
		if hashes == nil {
			hashes = req.BlockHash
		}
		if hashes == nil {
			field := "block_hashes"
			if q.Mooncake {
				field = "block_hash"
			}
			return q, admin.Errorf(http.StatusBadRequest, "%s is required", field)
		}
		q.Local = make([]uint64, len(*hashes))
		for i, h := range *hashes {
			q.Local[i] = uint64(h)
		}
		return q, nil
	}
	if req.TokenIDs == nil {
		return q, admin.Errorf(http.StatusBadRequest, "token_ids is required")
	}
	q.Tokens = *req.TokenIDs
	if req.CacheSalt != nil {
		q.Salt = *req.CacheSalt
	}
	return q, nil
}

func (a *indexAPI) query(byHash, conductor bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req queryRequest
		if err := admin.Decode(r, &req); err != nil {
			admin.WriteError(w, err)
			return
		}
		q, err := parseQuery(req, byHash, conductor)
		if err != nil {
			admin.WriteError(w, err)
			return
		}
		start := time.Now()
		res, err := a.answer(q)
		if err != nil {
			admin.WriteError(w, err)
			return
		}
		api := "dynamo"
		if q.Mooncake {
			api = "mooncake"
		}
		a.match.WithLabelValues(api).Observe(time.Since(start).Seconds())
		if q.Mooncake {
			admin.WriteJSON(w, http.StatusOK, res.mooncake())
			return
		}
		admin.WriteJSON(w, http.StatusOK, res.dynamo())
	}
}

// queryResult is the answer to a Query: per worker rank overlaps (in
// blocks) and, for those ranks, their block counts, with the index's block
// size.
type queryResult struct {
	BlockSize int
	Overlaps  []indexer.Overlap
	Blocks    map[indexer.WorkerRank]int
}

// answer matches q against its index. An unknown (model, tenant) is a 404
// *admin.Error in Dynamo's shape, and no match in Mooncake's: the conductor
// answers 200 with no engines for a model nothing has registered.
func (a *indexAPI) answer(q overlapQuery) (queryResult, error) {
	ix := a.set.Lookup(q.Key)
	if ix == nil {
		if q.Mooncake {
			return queryResult{}, nil
		}
		return queryResult{}, admin.Errorf(http.StatusNotFound, "no index for model_name %q tenant_id %q", q.Key.Model, q.Key.Tenant)
	}
	res := queryResult{BlockSize: ix.BlockSize()}
	if q.ByHash {
		res.Overlaps = ix.Match(indexer.SequenceHashes(make([]uint64, 0, len(q.Local)), q.Local), nil)
	} else {
		local := indexer.LocalHashes(make([]uint64, 0, len(q.Tokens)/max(res.BlockSize, 1)), q.Tokens, res.BlockSize, indexer.BlockSeed(q.LoRA, q.Salt), nil)
		res.Overlaps = ix.Match(indexer.SequenceHashes(local[:0:0], local), nil)
	}
	slices.SortFunc(res.Overlaps, func(a, b indexer.Overlap) int {
		return cmp.Or(cmp.Compare(a.Worker.Worker, b.Worker.Worker), cmp.Compare(a.Worker.Rank, b.Worker.Rank))
	})
	res.Blocks = make(map[indexer.WorkerRank]int, len(res.Overlaps))
	for _, o := range res.Overlaps {
		res.Blocks[o.Worker] = int(o.Blocks)
	}
	return res, nil
}

// dynamoInstance is one entry of "instances" in Dynamo's response.
type dynamoInstance struct {
	LongestMatched int            `json:"longest_matched"`
	GPU            int            `json:"gpu"`
	DP             map[string]int `json:"dp"`
	CPU            int            `json:"cpu"`
	Disk           int            `json:"disk"`
}

type dynamoResponse struct {
	Scores      map[string]map[string]int `json:"scores"`
	Frequencies []int                     `json:"frequencies"`
	TreeSizes   map[string]map[string]int `json:"tree_sizes"`
	Instances   map[string]dynamoInstance `json:"instances"`
}

// mooncakeInstance is one engine of Mooncake's response.
type mooncakeInstance struct {
	LongestMatched int            `json:"longest_matched"`
	GPU            int            `json:"GPU"`
	DP             map[string]int `json:"DP"`
	CPU            int            `json:"CPU"`
	Disk           int            `json:"DISK"`
}

type mooncakeResponse struct {
	Data map[string]mooncakeInstance `json:"data"`
}

// instances folds the rank overlaps into per-instance tier reach, in tokens.
func (r queryResult) instances() map[string]dynamoInstance {
	out := make(map[string]dynamoInstance)
	for _, o := range r.Overlaps {
		id := strconv.FormatUint(o.Worker.Worker, 10)
		in, ok := out[id]
		if !ok {
			in.DP = make(map[string]int)
		}
		gpu, cpu, disk := o.Tokens(r.BlockSize)
		in.DP[strconv.FormatUint(uint64(o.Worker.Rank), 10)] = gpu
		in.GPU = max(in.GPU, gpu)
		in.CPU = max(in.CPU, cpu)
		in.Disk = max(in.Disk, disk)
		in.LongestMatched = max(in.GPU, in.CPU, in.Disk)
		out[id] = in
	}
	return out
}

func (r queryResult) dynamo() dynamoResponse {
	resp := dynamoResponse{
		Scores:      make(map[string]map[string]int),
		Frequencies: []int{},
		TreeSizes:   make(map[string]map[string]int),
		Instances:   r.instances(),
	}
	deepest := 0
	for _, o := range r.Overlaps {
		id, rank := strconv.FormatUint(o.Worker.Worker, 10), strconv.FormatUint(uint64(o.Worker.Rank), 10)
		if resp.TreeSizes[id] == nil {
			resp.TreeSizes[id] = make(map[string]int)
		}
		resp.TreeSizes[id][rank] = r.Blocks[o.Worker]
		deepest = max(deepest, int(o.Device))
		if o.Device == 0 {
			continue
		}
		if resp.Scores[id] == nil {
			resp.Scores[id] = make(map[string]int)
		}
		resp.Scores[id][rank], _, _ = o.Tokens(r.BlockSize)
	}
	// frequencies[i]: how many worker ranks hold block i on device, for
	// every depth some rank reaches.
	resp.Frequencies = make([]int, deepest)
	for _, o := range r.Overlaps {
		for i := range o.Device {
			resp.Frequencies[i]++
		}
	}
	return resp
}

func (r queryResult) mooncake() mooncakeResponse {
	resp := mooncakeResponse{Data: make(map[string]mooncakeInstance)}
	for id, in := range r.instances() {
		resp.Data[id] = mooncakeInstance(in)
	}
	return resp
}

// sizeCollector reports the size of every index at scrape time.
type sizeCollector struct{ set *indexer.Set }

var (
	sizeWorkers = prometheus.NewDesc("kvgate_index_worker_ranks", "Worker ranks holding blocks, per index.", []string{"model", "tenant"}, nil)
	sizeNodes   = prometheus.NewDesc("kvgate_index_blocks", "Blocks in the prefix tree (held, or named by an engine id), per index; a block held by workers of several index shards counts once in each.", []string{"model", "tenant"}, nil)
	sizeEntries = prometheus.NewDesc("kvgate_index_entries", "(block, worker rank) entries, per index.", []string{"model", "tenant"}, nil)
)

func (c sizeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- sizeWorkers
	ch <- sizeNodes
	ch <- sizeEntries
}

func (c sizeCollector) Collect(ch chan<- prometheus.Metric) {
	for _, k := range c.set.Keys() {
		ix := c.set.Lookup(k)
		if ix == nil {
			continue
		}
		st := ix.Stats()
		ch <- prometheus.MustNewConstMetric(sizeWorkers, prometheus.GaugeValue, float64(st.Workers), k.Model, k.Tenant)
		ch <- prometheus.MustNewConstMetric(sizeNodes, prometheus.GaugeValue, float64(st.Nodes), k.Model, k.Tenant)
		ch <- prometheus.MustNewConstMetric(sizeEntries, prometheus.GaugeValue, float64(st.Entries), k.Model, k.Tenant)
	}
}

// truncate shortens outside input quoted in an error message.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
