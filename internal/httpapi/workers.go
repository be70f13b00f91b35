package httpapi

// This file serves the worker catalog's routes (/register, /unregister,
// /workers, /ready, and the listener test hooks apart: ListenerTestRoutes) and maps the scheduler's
// errors to HTTP statuses (httpError).

import (
	"errors"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/kvgate/kvgate/indexer"
	"github.com/kvgate/kvgate/internal/admin"
	"github.com/kvgate/kvgate/scheduler/catalog"
	"github.com/kvgate/kvgate/scheduler/scrape"
)

// WorkerRoutes returns the routes of the worker catalog cat; GET /workers
// shows what scraper found of each worker's engine (nil when scraping is
// off).
func WorkerRoutes(cat *catalog.Catalog, scraper *scrape.Scraper) []admin.Route {
	c := catalogAPI{cat, scraper}
	return []admin.Route{
		{Pattern: "POST /register", Handler: c.handleRegister, Mutates: true},
		{Pattern: "POST /unregister", Handler: c.handleUnregister, Mutates: true},
		{Pattern: "GET /workers", Handler: c.handleWorkers},
		{Pattern: "GET /ready", Handler: c.handleReady},
	}
}

// ListenerTestRoutes returns Dynamo's test routes over cat (POST
// /test/pause_listener, /test/resume_listener): they stop and restart a
// worker's listeners, so a server mounts them only when asked to
// (--enable-test-routes); unmounted, they are 404.
func ListenerTestRoutes(cat *catalog.Catalog) []admin.Route {
	c := catalogAPI{cat: cat}
	return []admin.Route{
		{Pattern: "POST /test/pause_listener", Handler: c.handleListener(true), Mutates: true},
		{Pattern: "POST /test/resume_listener", Handler: c.handleListener(false), Mutates: true},
	}
}

// catalogAPI serves the catalog's routes.
type catalogAPI struct {
	cat     *catalog.Catalog
	scraper *scrape.Scraper // nil when scraping is off
}

// httpError maps the scheduler's errors to API errors, their prefix left
// out of the message.
func httpError(err error) error {
	status := http.StatusInternalServerError
	switch {
	case errors.Is(err, catalog.ErrInvalid):
		status = http.StatusBadRequest
	case errors.Is(err, catalog.ErrNotFound):
		status = http.StatusNotFound
	case errors.Is(err, catalog.ErrConflict):
		status = http.StatusConflict
	case errors.Is(err, catalog.ErrUnavailable):
		status = http.StatusServiceUnavailable
	}
	msg := err.Error()
	for _, prefix := range []error{catalog.ErrInvalid, catalog.ErrNotFound, catalog.ErrConflict, catalog.ErrUnavailable} {
		msg = strings.TrimPrefix(msg, prefix.Error()+": ")
	}
	return admin.Errorf(status, "%s", msg)
}

// workerIdentity is the id and scope every catalog body carries; the
// indexer calls the id instance_id, the slot tracker worker_id.
type workerIdentity struct {
	InstanceID *uint64 `json:"instance_id"`
	WorkerID   *uint64 `json:"worker_id"`
	ModelName  *string `json:"model_name"`
	TenantID   *string `json:"tenant_id"`
	DPRank     *uint32 `json:"dp_rank"`
}

func (b workerIdentity) id() (uint64, error) {
	switch {
	case b.InstanceID != nil && b.WorkerID != nil && *b.InstanceID != *b.WorkerID:
		return 0, admin.Errorf(http.StatusBadRequest, "instance_id %d and worker_id %d differ; they name the same worker", *b.InstanceID, *b.WorkerID)
	case b.InstanceID != nil:
		return *b.InstanceID, nil
	case b.WorkerID != nil:
		return *b.WorkerID, nil
	}
	return 0, admin.Errorf(http.StatusBadRequest, "instance_id (or worker_id) is required")
}

func (b workerIdentity) model() (string, error) {
	if b.ModelName == nil || *b.ModelName == "" {
		return "", admin.Errorf(http.StatusBadRequest, "model_name is required")
	}
	return *b.ModelName, nil
}

// registerRequest is the union of the indexer's and the slot tracker's
// /register bodies.
type registerRequest struct {
	workerIdentity
	BlockSize      *int    `json:"block_size"`
	Endpoint       *string `json:"endpoint"`
	ReplayEndpoint *string `json:"replay_endpoint"`
	DPStart        *uint32 `json:"dp_start"`
	DPSize         *uint32 `json:"dp_size"`
}

func (c catalogAPI) handleRegister(w http.ResponseWriter, r *http.Request) {
	var req registerRequest
	if err := admin.Decode(r, &req); err != nil {
		admin.WriteError(w, err)
		return
	}
	if err := c.register(req); err != nil {
		admin.WriteError(w, err)
		return
	}
	admin.OK(w, http.StatusCreated)
}

func (c catalogAPI) register(req registerRequest) error {
	id, err := req.id()
	if err != nil {
		return err
	}
	model, err := req.model()
	if err != nil {
		return err
	}
	if req.BlockSize == nil {
		return admin.Errorf(http.StatusBadRequest, "block_size is required")
	}
	wk := catalog.WorkerKey{Key: indexer.Key{Model: model}, ID: id}
	if req.TenantID != nil {
		wk.Tenant = *req.TenantID
	}
	hasEndpoint := req.Endpoint != nil && *req.Endpoint != ""
	hasRange := req.DPStart != nil || req.DPSize != nil
	switch {
	case hasEndpoint && hasRange:
		return admin.Errorf(http.StatusBadRequest, "give endpoint (with dp_rank) or dp_start/dp_size, not both")
	case hasEndpoint:
		reg := catalog.RankRegistration{WorkerKey: wk, BlockSize: *req.BlockSize, Publisher: catalog.Publisher{Endpoint: *req.Endpoint}, Source: catalog.SourceAPI}
		if req.DPRank != nil {
			reg.Rank = *req.DPRank
		}
		if req.ReplayEndpoint != nil {
			reg.Replay = *req.ReplayEndpoint
		}
		err = c.cat.RegisterRank(reg)
	case hasRange:
		if req.DPRank != nil || req.ReplayEndpoint != nil {
			return admin.Errorf(http.StatusBadRequest, "dp_rank and replay_endpoint go with endpoint, not with dp_start/dp_size")
		}
		if req.DPSize == nil {
			return admin.Errorf(http.StatusBadRequest, "dp_size is required with dp_start")
		}
		reg := catalog.RangeRegistration{WorkerKey: wk, BlockSize: *req.BlockSize, DPSize: *req.DPSize, Source: catalog.SourceAPI}
		if req.DPStart != nil {
			reg.DPStart = *req.DPStart
		}
		err = c.cat.RegisterRange(reg)
	default:
		return admin.Errorf(http.StatusBadRequest, "endpoint is required (the worker's ZMQ KV event endpoint), or dp_start/dp_size to register a DP range")
	}
	if err != nil {
		return httpError(err)
	}
	return nil
}

// decodeIdentity decodes a body that names a worker by id.
func decodeIdentity(r *http.Request) (workerIdentity, uint64, error) {
	var req workerIdentity
	if err := admin.Decode(r, &req); err != nil {
		return req, 0, err
	}
	id, err := req.id()
	return req, id, err
}

func (c catalogAPI) handleUnregister(w http.ResponseWriter, r *http.Request) {
	req, id, err := decodeIdentity(r)
	if err != nil {
		admin.WriteError(w, err)
		return
	}
	model, err := req.model()
	if err != nil {
		admin.WriteError(w, err)
		return
	}
	if _, err := c.cat.Unregister(model, req.TenantID, id, req.DPRank); err != nil {
		admin.WriteError(w, httpError(err))
		return
	}
	admin.OK(w, http.StatusOK)
}

// workerView is one entry of GET /workers: the union of the fields of the
// indexer's, the slot tracker's and the selection service's views.
type workerView struct {
	InstanceID            uint64            `json:"instance_id"`
	WorkerID              uint64            `json:"worker_id"`
	ModelName             string            `json:"model_name"`
	TenantID              string            `json:"tenant_id"`
	BlockSize             int               `json:"block_size"`
	DPStart               uint32            `json:"dp_start"`
	DPSize                uint32            `json:"dp_size"`
	DataParallelStartRank uint32            `json:"data_parallel_start_rank"`
	DataParallelSize      uint32            `json:"data_parallel_size"`
	DPRanks               []uint32          `json:"dp_ranks"`
	Endpoint              string            `json:"endpoint,omitempty"`
	Endpoints             map[string]string `json:"endpoints"`
	KVEventsEndpoints     map[string]string `json:"kv_events_endpoints"`
	ReplayEndpoint        string            `json:"replay_endpoint,omitempty"`
	// Source is Dynamo's: always "zmq" (its clients filter on it).
	// RegisteredBy is where kvgate learned of the worker (catalog.SourceAPI,
	// catalog.SourceConfig or discovery's "kubernetes").
	Source       string         `json:"source"`
	RegisteredBy string         `json:"registered_by"`
	Status       catalog.Status `json:"status"`
	// Lifecycle and NotSchedulableReasons are the selection service's:
	// "incomplete" with why, or "schedulable" (the registration is
	// complete; Status says whether its listeners are up).
	Lifecycle             string                  `json:"lifecycle"`
	NotSchedulableReasons []string                `json:"not_schedulable_reasons"`
	Listeners             map[string]listenerView `json:"listeners"`
	// EngineMetrics is what the scrapes of the worker's /metrics page
	// found (see scrape.Scraper); left out when it was never scraped.
	EngineMetrics *engineMetricsView `json:"engine_metrics,omitempty"`
}

type engineMetricsView struct {
	URL         string     `json:"url"`
	ScrapedAt   *time.Time `json:"scraped_at,omitempty"` // the last success
	AttemptedAt time.Time  `json:"attempted_at"`
	LastError   string     `json:"last_error,omitempty"` // of the last attempt
	// Fresh: the values count in the cost (the last scrape succeeded and
	// is not stale).
	Fresh bool                       `json:"fresh"`
	Ranks map[string]rankMetricsView `json:"ranks"` // of the last success, by dp rank
}

// rankMetricsView is a rank's values, each left out when not reported.
type rankMetricsView struct {
	Waiting      *float64 `json:"num_requests_waiting,omitempty"`
	Running      *float64 `json:"num_requests_running,omitempty"`
	KVCacheUsage *float64 `json:"kv_cache_usage_perc,omitempty"`
	KVBlocks     *float64 `json:"num_gpu_blocks,omitempty"`
}

func engineMetricsOf(s *scrape.WorkerScrape) *engineMetricsView {
	if s == nil {
		return nil
	}
	v := &engineMetricsView{URL: s.URL, AttemptedAt: s.AttemptedAt.UTC(), LastError: s.LastError, Fresh: s.Fresh, Ranks: map[string]rankMetricsView{}}
	if !s.ScrapedAt.IsZero() {
		at := s.ScrapedAt.UTC()
		v.ScrapedAt = &at
	}
	known := func(f float64) *float64 {
		if math.IsNaN(f) {
			return nil
		}
		return &f
	}
	for rank, l := range s.Ranks {
		v.Ranks[strconv.FormatUint(uint64(rank), 10)] = rankMetricsView{known(l.Waiting), known(l.Running), known(l.KVUsage), known(l.KVBlocks)}
	}
	return v
}

type listenerView struct {
	Endpoint       string         `json:"endpoint"`
	ReplayEndpoint string         `json:"replay_endpoint,omitempty"`
	Status         catalog.Status `json:"status"`
	LastError      string         `json:"last_error,omitempty"`
	LastSeq        *uint64        `json:"last_seq,omitempty"`
}

// viewOf returns ws as GET /workers shows it, with em, what the scrapes of
// its page found (nil: never scraped).
func viewOf(ws catalog.WorkerState, em *scrape.WorkerScrape) workerView {
	v := workerView{
		InstanceID: ws.ID, WorkerID: ws.ID, ModelName: ws.Key.Model, TenantID: ws.Key.Tenant,
		BlockSize: ws.BlockSize, DPRanks: ws.Ranks, Endpoint: ws.Endpoint, Source: "zmq", RegisteredBy: ws.Source, Status: ws.Status,
		Endpoints: map[string]string{}, KVEventsEndpoints: map[string]string{}, Listeners: map[string]listenerView{},
		EngineMetrics: engineMetricsOf(em),
	}
	v.Lifecycle, v.NotSchedulableReasons = lifecycleOf(ws.NotSchedulable)
	if v.DPRanks == nil {
		v.DPRanks = []uint32{}
	}
	if n := len(ws.Ranks); n > 0 {
		v.DPStart, v.DPSize = ws.Ranks[0], ws.Ranks[n-1]-ws.Ranks[0]+1
	}
	v.DataParallelStartRank, v.DataParallelSize = v.DPStart, v.DPSize
	replays := map[string]bool{}
	for rank, p := range ws.Events {
		rs := strconv.FormatUint(uint64(rank), 10)
		v.Endpoints[rs], v.KVEventsEndpoints[rs] = p.Endpoint, p.Endpoint
		replays[p.Replay] = true
		lv := listenerView{Endpoint: p.Endpoint, ReplayEndpoint: p.Replay, Status: catalog.StatusPending}
		if l, ok := ws.Listeners[rank]; ok {
			lv.Status, lv.LastError = l.Status, l.LastError
			if l.HasSeq {
				lv.LastSeq = &l.Seq
			}
		}
		v.Listeners[rs] = lv
	}
	if len(replays) == 1 {
		for r := range replays {
			v.ReplayEndpoint = r
		}
	}
	return v
}

func (c catalogAPI) handleWorkers(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	ws := c.cat.Workers(q.Get("model_name"), q.Get("tenant_id"))
	out := make([]workerView, len(ws))
	for i, s := range ws {
		var em *scrape.WorkerScrape
		if c.scraper != nil {
			em = c.scraper.Worker(s.WorkerKey)
		}
		out[i] = viewOf(s, em)
	}
	admin.WriteJSON(w, http.StatusOK, out)
}

// readiness is Readiness as GET /ready answers it.
type readiness struct {
	Ready             bool   `json:"ready"`
	Reason            string `json:"reason,omitempty"`
	Workers           int    `json:"workers"`
	ActiveWorkers     int    `json:"active_workers"`
	Schedulable       int    `json:"schedulable_workers"`
	MinInitialWorkers int    `json:"min_initial_workers"`
}

func (c catalogAPI) handleReady(w http.ResponseWriter, _ *http.Request) {
	rd := readiness(c.cat.Ready())
	if !rd.Ready {
		admin.WriteJSON(w, http.StatusServiceUnavailable, struct {
			Error string `json:"error"`
			readiness
		}{rd.Reason, rd})
		return
	}
	admin.WriteJSON(w, http.StatusOK, struct {
		Status string `json:"status"`
		readiness
	}{"ready", rd})
}

func (c catalogAPI) handleListener(pause bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		req, id, err := decodeIdentity(r)
		if err != nil {
			admin.WriteError(w, err)
			return
		}
		n, err := c.cat.SetListeners(id, req.DPRank, pause)
		if err != nil {
			admin.WriteError(w, httpError(err))
			return
		}
		admin.WriteJSON(w, http.StatusOK, map[string]any{"status": "ok", "listeners": n})
	}
}
