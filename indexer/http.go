package indexer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/internal/admin"
)

// This file serves the index over HTTP: Dynamo's standalone indexer query
// and dump routes, Mooncake's conductor queries, and the peer list with
// startup recovery from a peer's dump (docs/http-api.md).

// API serves the index routes over a Set.
type API struct {
	set   *Set
	peers *Peers
	match *prometheus.HistogramVec
}

// NewAPI returns the index routes over set and peers. reg, if not nil,
// receives the query latency histogram and the index size gauges.
func NewAPI(set *Set, peers *Peers, reg prometheus.Registerer) *API {
	a := &API{
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
	return a
}

// Routes returns the index routes.
func (a *API) Routes() []admin.Route {
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
	TokenIDs    *[]uint32 `json:"token_ids"`
	BlockHashes *[]Hash   `json:"block_hashes"` // Dynamo
	BlockHash   *[]Hash   `json:"block_hash"`   // Mooncake
	ModelName   *string   `json:"model_name"`   // Dynamo
	Model       *string   `json:"model"`        // Mooncake
	TenantID    *string   `json:"tenant_id"`
	LoRAName    *string   `json:"lora_name"`
	LoRAID      *int64    `json:"lora_id"` // Mooncake, legacy: -1 is none
}

// Query is a decoded overlap query.
type Query struct {
	Key      Key
	Mooncake bool // answer in Mooncake's shape
	ByHash   bool
	Tokens   []uint32
	Local    []uint64 // local block hashes, when ByHash
	LoRA     string
}

func parseQuery(req queryRequest, byHash, conductor bool) (Query, error) {
	q := Query{ByHash: byHash, Mooncake: conductor}
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
	q.Key.Tenant = DefaultTenant
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
	return q, nil
}

func (a *API) query(byHash, conductor bool) http.HandlerFunc {
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
		res, err := a.Answer(q)
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

// QueryResult is the answer to a Query: per worker rank overlaps (in
// blocks) and, for those ranks, their block counts, with the index's block
// size.
type QueryResult struct {
	BlockSize int
	Overlaps  []Overlap
	Blocks    map[WorkerRank]int
}

// Answer matches q against its index. An unknown (model, tenant) is a 404
// *admin.Error.
func (a *API) Answer(q Query) (QueryResult, error) {
	ix := a.set.Lookup(q.Key)
	if ix == nil {
		return QueryResult{}, admin.Errorf(http.StatusNotFound, "no index for model_name %q tenant_id %q", q.Key.Model, q.Key.Tenant)
	}
	res := QueryResult{BlockSize: ix.BlockSize()}
	if q.ByHash {
		res.Overlaps = ix.Match(SequenceHashes(make([]uint64, 0, len(q.Local)), q.Local), nil)
	} else {
		res.Overlaps = ix.MatchTokens(q.Tokens, q.LoRA, nil)
	}
	slices.SortFunc(res.Overlaps, func(a, b Overlap) int { return cmpWorkerRank(a.Worker, b.Worker) })
	res.Blocks = make(map[WorkerRank]int, len(res.Overlaps))
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
func (r QueryResult) instances() map[string]dynamoInstance {
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

func (r QueryResult) dynamo() dynamoResponse {
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

func (r QueryResult) mooncake() mooncakeResponse {
	resp := mooncakeResponse{Data: make(map[string]mooncakeInstance)}
	for id, in := range r.instances() {
		resp.Data[id] = mooncakeInstance(in)
	}
	return resp
}

func (a *API) dump(w http.ResponseWriter, _ *http.Request) {
	b, err := MarshalDump(a.set.Dump())
	if err != nil {
		admin.WriteError(w, fmt.Errorf("dump: %w", err))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}

type peerRequest struct {
	URL *string `json:"url"`
}

func decodePeer(r *http.Request) (string, error) {
	var req peerRequest
	if err := admin.Decode(r, &req); err != nil {
		return "", err
	}
	if req.URL == nil {
		return "", admin.Errorf(http.StatusBadRequest, "url is required")
	}
	u, err := NormalizePeerURL(*req.URL)
	if err != nil {
		return "", admin.Errorf(http.StatusBadRequest, "%v", err)
	}
	return u, nil
}

func (a *API) registerPeer(w http.ResponseWriter, r *http.Request) {
	u, err := decodePeer(r)
	if err != nil {
		admin.WriteError(w, err)
		return
	}
	a.peers.Add(u)
	admin.OK(w, http.StatusCreated)
}

func (a *API) deregisterPeer(w http.ResponseWriter, r *http.Request) {
	u, err := decodePeer(r)
	if err != nil {
		admin.WriteError(w, err)
		return
	}
	if !a.peers.Remove(u) {
		admin.WriteError(w, admin.Errorf(http.StatusNotFound, "peer %s is not registered", u))
		return
	}
	admin.OK(w, http.StatusOK)
}

func (a *API) listPeers(w http.ResponseWriter, _ *http.Request) {
	admin.WriteJSON(w, http.StatusOK, a.peers.List())
}

// Peers is the list of peer indexers (kvgate or Dynamo) to recover the
// index from at startup. Peers do not synchronize state after that.
type Peers struct {
	mu   sync.Mutex
	urls []string // sorted, unique
}

// NewPeers returns a peer list holding urls, each normalized with
// NormalizePeerURL.
func NewPeers(urls []string) (*Peers, error) {
	p := &Peers{}
	for _, s := range urls {
		u, err := NormalizePeerURL(s)
		if err != nil {
			return nil, err
		}
		p.Add(u)
	}
	return p, nil
}

// NormalizePeerURL checks that s is an http(s) base URL with a host name
// and no query, fragment or user info, and returns it with the scheme and
// host in lower case and without a trailing slash.
func NormalizePeerURL(s string) (string, error) {
	s = strings.TrimSpace(s)
	u, err := url.Parse(s)
	if err != nil || u.Hostname() == "" || u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || u.User != nil || u.Opaque != "" {
		return "", fmt.Errorf("peer url %q is not an http(s)://host:port base URL", truncate(s, 100))
	}
	u.Scheme, u.Host = strings.ToLower(u.Scheme), strings.ToLower(u.Host)
	if u.Scheme != "http" && u.Scheme != "https" {
		return "", fmt.Errorf("peer url %q is not an http(s)://host:port base URL", truncate(s, 100))
	}
	return strings.TrimRight(u.String(), "/"), nil
}

// Add adds a normalized URL; adding one already present does nothing.
func (p *Peers) Add(u string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if i, found := slices.BinarySearch(p.urls, u); !found {
		p.urls = slices.Insert(p.urls, i, u)
	}
}

// Remove removes a normalized URL and reports whether it was present.
func (p *Peers) Remove(u string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	i, found := slices.BinarySearch(p.urls, u)
	if found {
		p.urls = slices.Delete(p.urls, i, i+1)
	}
	return found
}

// List returns the peers, sorted.
func (p *Peers) List() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string{}, p.urls...)
}

// Recovery is the outcome of Recover.
type Recovery struct {
	Peer    string // the peer whose dump was loaded; "" if none answered
	Indexes int    // indexes in the dump
	Events  int    // events loaded
	Skipped int    // events that could not be placed
	// Conflicts names indexes left out because this process already has
	// them with another block size.
	Conflicts []string
}

// maxDumpBytes bounds a peer's dump.
const maxDumpBytes = 4 << 30

// Recover fetches GET /dump from the first of peers that answers with a
// valid dump, trying them in order with timeout each, and loads it into
// set. No peer answering is not an error: the index then starts empty.
// Call it before releasing a held Set, so that live events queued meanwhile
// apply on top of the dump.
func Recover(ctx context.Context, set *Set, peers []string, client *http.Client, timeout time.Duration, log *slog.Logger) Recovery {
	if client == nil {
		client = http.DefaultClient
	}
	if log == nil {
		log = slog.Default()
	}
	for _, peer := range peers {
		dumps, err := fetchDump(ctx, client, peer, timeout)
		if err != nil {
			log.Warn("peer recovery: peer unusable", "peer", peer, "err", err)
			if ctx.Err() != nil {
				break
			}
			continue
		}
		rec := Recovery{Peer: peer, Indexes: len(dumps)}
		for _, d := range dumps {
			if ix := set.Lookup(d.Key); ix != nil && ix.BlockSize() != d.BlockSize {
				log.Warn("peer recovery: index skipped, block size differs", "peer", peer, "index", d.Key.String(),
					"peer_block_size", d.BlockSize, "block_size", ix.BlockSize())
				rec.Conflicts = append(rec.Conflicts, d.Key.String())
				continue
			}
			n, err := set.Load([]IndexDump{d})
			rec.Skipped += n
			rec.Events += len(d.Events) - n
			if err != nil {
				log.Warn("peer recovery: index partly loaded", "peer", peer, "index", d.Key.String(), "err", err)
			}
		}
		log.Info("peer recovery: loaded dump", "peer", peer, "indexes", rec.Indexes, "events", rec.Events, "skipped", rec.Skipped)
		return rec
	}
	if len(peers) > 0 {
		log.Warn("peer recovery: no peer answered; starting with an empty index", "peers", len(peers))
	}
	return Recovery{}
}

func fetchDump(ctx context.Context, client *http.Client, peer string, timeout time.Duration) ([]IndexDump, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, peer+"/dump", nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /dump: status %s", resp.Status)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxDumpBytes+1))
	if err != nil {
		return nil, fmt.Errorf("GET /dump: %w", err)
	}
	if len(data) > maxDumpBytes {
		return nil, errors.New("GET /dump: dump larger than 4 GiB")
	}
	return UnmarshalDump(data)
}

// sizeCollector reports the size of every index at scrape time.
type sizeCollector struct{ set *Set }

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
