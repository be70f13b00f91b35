package httpapi

import (
	"bytes"
	"cmp"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/kvgate/kvgate/indexer"
	"github.com/kvgate/kvgate/internal/admin"
	"github.com/kvgate/kvgate/scheduler"
	"github.com/kvgate/kvgate/scheduler/catalog"
)

// This file serves the slot tracker's lifecycle and load routes (seed 002)
// and the selection service's worker, selection, reservation and overlap
// routes (seed 003) over the catalog, the loads and the scheduler
// (docs/http-api.md). A reservation is a booking in the loads under
// its reservation id, as a slot tracker request is under its request id.

// ServiceRoutes returns the slot tracker and selection service routes over
// the workers of cat, the scheduler sched, whose loads hold the bookings,
// and the indexes of set, for one port serving both: GET /loads answers in
// the slot tracker's shape.
func ServiceRoutes(cat *catalog.Catalog, sched *scheduler.Scheduler, set *indexer.Set) []admin.Route {
	s := &service{cat: cat, sched: sched, set: set}
	return append(s.slotTrackerRoutes(), s.selectionRoutes()...)
}

// SlotTrackerRoutes returns the slot tracker's routes alone (over the same
// as ServiceRoutes), for a port serving only that service.
func SlotTrackerRoutes(cat *catalog.Catalog, sched *scheduler.Scheduler, set *indexer.Set) []admin.Route {
	return (&service{cat: cat, sched: sched, set: set}).slotTrackerRoutes()
}

// SelectionServiceRoutes returns the selection service's routes alone
// (over the same as ServiceRoutes), for a port serving only that service:
// its GET /loads answers in the selection service's shape.
func SelectionServiceRoutes(cat *catalog.Catalog, sched *scheduler.Scheduler, set *indexer.Set) []admin.Route {
	s := &service{cat: cat, sched: sched, set: set}
	return append(s.selectionRoutes(),
		admin.Route{Pattern: "GET /loads", Handler: s.handleSelectionLoads},
		admin.Route{Pattern: "POST /potential_loads", Handler: serve(admin.Decode, s.potentialLoads)})
}

func (s *service) slotTrackerRoutes() []admin.Route {
	return []admin.Route{
		{Pattern: "POST /add", Handler: serve(admin.Decode, s.add), Mutates: true},
		{Pattern: "POST /prefill_complete", Handler: serve(admin.Decode, s.prefillComplete), Mutates: true},
		{Pattern: "POST /free", Handler: serve(admin.Decode, s.free), Mutates: true},
		{Pattern: "GET /loads", Handler: s.handleLoads},
		{Pattern: "POST /potential_loads", Handler: serve(admin.Decode, s.potentialLoads)},
	}
}

// selectionRoutes are the selection service's routes but the two it shares
// with the slot tracker, GET /loads and POST /potential_loads.
func (s *service) selectionRoutes() []admin.Route {
	return []admin.Route{
		{Pattern: "POST /workers", Handler: serve(admin.Decode, s.putWorker), Mutates: true},
		{Pattern: "PATCH /workers/{worker_id}", Handler: serve(decodeOptional, s.patchWorker), Mutates: true},
		{Pattern: "DELETE /workers/{worker_id}", Handler: serve(decodeOptional, s.deleteWorker), Mutates: true},
		{Pattern: "POST /select", Handler: serve(admin.Decode, s.choose(false))},
		{Pattern: "POST /select_and_reserve", Handler: serve(admin.Decode, s.choose(true)), Mutates: true},
		{Pattern: "POST /reservations", Handler: serve(admin.Decode, s.reserve), Mutates: true},
		{Pattern: "POST /reservations/{id}/prefill_complete", Handler: serve(decodeOptional, s.reservationPrefillComplete), Mutates: true},
		{Pattern: "POST /reservations/{id}/output_block", Handler: serve(decodeOptional, s.reservationOutputBlock), Mutates: true},
		{Pattern: "DELETE /reservations/{id}", Handler: serve(decodeOptional, s.reservationFree), Mutates: true},
		{Pattern: "POST /overlap_scores", Handler: serve(admin.Decode, s.overlapScores)},
	}
}

// service serves the slot tracker and selection service routes.
type service struct {
	cat   *catalog.Catalog
	sched *scheduler.Scheduler
	set   *indexer.Set
}

func (s *service) loads() *scheduler.Loads { return s.sched.Loads() }

// known reports whether the loads know key.
func (s *service) known(key indexer.Key) bool {
	_, ok := s.loads().BlockSize(key)
	return ok
}

// serve decodes a request's body into a new T and answers with what f
// returns: a status and a value to encode, or an error.
func serve[T any](decode func(*http.Request, any) error, f func(*http.Request, *T) (int, any, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req T
		if err := decode(r, &req); err != nil {
			admin.WriteError(w, err)
			return
		}
		status, v, err := f(r, &req)
		if err != nil {
			var ae *admin.Error
			if !errors.As(err, &ae) {
				err = httpError(err)
			}
			admin.WriteError(w, err)
			return
		}
		admin.WriteJSON(w, status, v)
	}
}

var okBody = map[string]string{"status": "ok"}

// done answers okBody with status, unless err.
func done(status int, err error) (int, any, error) { return status, okBody, err }

// decodeOptional is admin.Decode for a body that may be empty.
func decodeOptional(r *http.Request, v any) error {
	if r.Body == nil {
		return nil
	}
	data, err := io.ReadAll(r.Body)
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		return admin.Errorf(http.StatusRequestEntityTooLarge, "request body exceeds %d bytes", tooBig.Limit)
	case err != nil:
		return admin.Errorf(http.StatusBadRequest, "read request body: %v", err)
	case len(bytes.TrimSpace(data)) == 0:
		return nil
	}
	return admin.DecodeBytes(data, v)
}

func badRequest(format string, args ...any) error {
	return admin.Errorf(http.StatusBadRequest, format, args...)
}

// defaultModel is the model of a selection service request without one.
const defaultModel = "default"

// scope names a request's (model, tenant).
type scope struct {
	ModelName *string `json:"model_name"`
	TenantID  *string `json:"tenant_id"`
}

// key returns the scope's key, with the query's model_name and tenant_id
// when the body leaves them out (both: they must agree). The tenant
// defaults to "default"; so does the model when def, else it is required.
func (sc scope) key(q url.Values, def bool) (indexer.Key, error) {
	pick := func(field string, body *string, dflt string) (string, error) {
		v := ""
		if body != nil {
			v = *body
		}
		if qv := q.Get(field); qv != "" {
			if v != "" && v != qv {
				return "", badRequest("%s is %q in the query and %q in the body", field, qv, v)
			}
			v = qv
		}
		return cmp.Or(v, dflt), nil
	}
	dflt := ""
	if def {
		dflt = defaultModel
	}
	model, err := pick("model_name", sc.ModelName, dflt)
	if err != nil {
		return indexer.Key{}, err
	}
	if model == "" {
		return indexer.Key{}, badRequest("model_name is required")
	}
	tenant, err := pick("tenant_id", sc.TenantID, indexer.DefaultTenant)
	return indexer.Key{Model: model, Tenant: tenant}, err
}

// given returns field's value in the body or, else, the query ("" when
// neither names it).
func (sc scope) given(field string, q url.Values) string {
	body := sc.ModelName
	if field == "tenant_id" {
		body = sc.TenantID
	}
	if body != nil && *body != "" {
		return *body
	}
	return q.Get(field)
}

func u64s(hs []indexer.Hash) []uint64 {
	out := make([]uint64, len(hs))
	for i, h := range hs {
		out[i] = uint64(h)
	}
	return out
}

// tokens checks an optional token count: 0..scheduler.MaxTokens.
func tokens(field string, v *int64) (int64, error) {
	if v == nil {
		return 0, nil
	}
	if *v < 0 || *v > scheduler.MaxTokens {
		return 0, badRequest("%s must be between 0 and %d, not %d", field, int64(scheduler.MaxTokens), *v)
	}
	return *v, nil
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// prompt is a selection service request's prompt: the hash form
// (block_hashes, sequence_hashes) or token_ids, which kvgate hashes.
type prompt struct {
	BlockHashes    *[]indexer.Hash `json:"block_hashes"`
	SequenceHashes *[]indexer.Hash `json:"sequence_hashes"`
	TokenIDs       *[]uint32       `json:"token_ids"`
	LoRAName       *string         `json:"lora_name"`  // adapter of token_ids; block_hashes carry theirs
	CacheSalt      *string         `json:"cache_salt"` // of token_ids; block_hashes must include it
}

// hashTokens turns a prompt given as token_ids into the hash form: its
// block_hashes are the local hashes of the tokens with key's block size
// and the seed of lora_name and cache_salt, and *isl (isl_tokens) is the number of tokens, or
// must be when given. A prompt in the hash form is left as it is.
func (s *service) hashTokens(key indexer.Key, p *prompt, isl **int64) error {
	if p.TokenIDs == nil {
		if p.CacheSalt != nil {
			return badRequest("cache_salt is not accepted with block_hashes; they must already include the cache salt")
		}
		return nil
	}
	if p.BlockHashes != nil || p.SequenceHashes != nil {
		return badRequest("give token_ids or block_hashes and sequence_hashes, not both")
	}
	bs, ok := s.loads().BlockSize(key)
	if ix := s.set.Lookup(key); ix != nil {
		bs, ok = ix.BlockSize(), true
	}
	if !ok {
		return fmt.Errorf("%w: no worker registered for model_name %q tenant_id %q", scheduler.ErrNotFound, key.Model, key.Tenant)
	}
	toks := *p.TokenIDs
	local := indexer.LocalHashes(make([]uint64, 0, len(toks)/bs), toks, bs, indexer.BlockSeed(deref(p.LoRAName), deref(p.CacheSalt)), nil)
	hs := make([]indexer.Hash, len(local))
	for i, h := range local {
		hs[i] = indexer.Hash(h)
	}
	p.BlockHashes, p.TokenIDs = &hs, nil
	n := int64(len(toks))
	switch {
	case *isl == nil:
		*isl = &n
	case **isl != n:
		return badRequest("isl_tokens is %d but token_ids has %d tokens", **isl, n)
	}
	return nil
}

// --- Slot tracker lifecycle (seed 002) ---

type lifecycleRequest struct {
	scope
	RequestID *string `json:"request_id"`
}

func (req lifecycleRequest) target() (indexer.Key, string, error) {
	key, err := req.key(nil, false)
	if err != nil {
		return key, "", err
	}
	if req.RequestID == nil || *req.RequestID == "" {
		return key, "", badRequest("request_id is required")
	}
	return key, *req.RequestID, nil
}

type addRequest struct {
	lifecycleRequest
	WorkerID       *uint64         `json:"worker_id"`
	DPRank         *uint32         `json:"dp_rank"`
	SequenceHashes *[]indexer.Hash `json:"sequence_hashes"`
	NewISLTokens   *int64          `json:"new_isl_tokens"`
}

func (s *service) add(_ *http.Request, req *addRequest) (int, any, error) {
	key, id, err := req.target()
	if err != nil {
		return 0, nil, err
	}
	if req.WorkerID == nil {
		return 0, nil, badRequest("worker_id is required")
	}
	if req.SequenceHashes == nil {
		return 0, nil, badRequest("sequence_hashes is required (it may be empty)")
	}
	prefill, err := tokens("new_isl_tokens", req.NewISLTokens)
	if err != nil {
		return 0, nil, err
	}
	return done(http.StatusCreated, s.loads().Add(key, scheduler.Booking{
		ID: id, Worker: indexer.WorkerRank{Worker: *req.WorkerID, Rank: deref(req.DPRank)},
		Hashes: u64s(*req.SequenceHashes), PrefillTokens: prefill,
	}))
}

func (s *service) prefillComplete(_ *http.Request, req *lifecycleRequest) (int, any, error) {
	key, id, err := req.target()
	if err != nil {
		return 0, nil, err
	}
	return done(http.StatusOK, s.loads().PrefillComplete(key, id))
}

func (s *service) free(_ *http.Request, req *lifecycleRequest) (int, any, error) {
	key, id, err := req.target()
	if err != nil {
		return 0, nil, err
	}
	_, err = s.loads().Free(key, id)
	return done(http.StatusOK, err)
}

// --- Loads ---

type loadView struct {
	ModelName           string  `json:"model_name"`
	TenantID            string  `json:"tenant_id"`
	WorkerID            uint64  `json:"worker_id"`
	DPRank              uint32  `json:"dp_rank"`
	ActivePrefillTokens int64   `json:"active_prefill_tokens"`
	ActiveDecodeBlocks  float64 `json:"active_decode_blocks"`
}

func (s *service) handleLoads(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	snap := s.loads().Snapshot(q.Get("model_name"), q.Get("tenant_id"))
	out := make([]loadView, len(snap))
	for i, l := range snap {
		out[i] = loadView{l.Key.Model, l.Key.Tenant, l.Worker.Worker, l.Worker.Rank, l.PrefillTokens, l.DecodeBlocks}
	}
	admin.WriteJSON(w, http.StatusOK, out)
}

// rankLoadView is one rank's load in the selection service's GET /loads:
// Dynamo's PotentialLoad with no prompt added.
type rankLoadView struct {
	WorkerID               uint64  `json:"worker_id"`
	DPRank                 uint32  `json:"dp_rank"`
	PotentialPrefillTokens int64   `json:"potential_prefill_tokens"`
	PotentialDecodeBlocks  float64 `json:"potential_decode_blocks"`
	ActiveRequests         int     `json:"active_requests"`
}

// modelLoadView is Dynamo's ModelLoadResponse: the loads of one (model,
// tenant), which Dynamo calls its routing group. kvgate queues nothing:
// pending_count and pending_isl_tokens are 0.
type modelLoadView struct {
	ModelName        string         `json:"model_name"`
	TenantID         string         `json:"tenant_id"`
	RoutingGroup     string         `json:"routing_group"`
	Loads            []rankLoadView `json:"loads"`
	PendingCount     int            `json:"pending_count"`
	PendingISLTokens int            `json:"pending_isl_tokens"`
}

// handleSelectionLoads answers GET /loads in the selection service's
// shape: one entry per (model, tenant), its ranks' loads inside.
func (s *service) handleSelectionLoads(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	out := []modelLoadView{}
	for _, l := range s.loads().Snapshot(q.Get("model_name"), q.Get("tenant_id")) {
		if n := len(out); n == 0 || out[n-1].ModelName != l.Key.Model || out[n-1].TenantID != l.Key.Tenant {
			out = append(out, modelLoadView{ModelName: l.Key.Model, TenantID: l.Key.Tenant, RoutingGroup: l.Key.Tenant})
		}
		e := &out[len(out)-1]
		e.Loads = append(e.Loads, rankLoadView{l.Worker.Worker, l.Worker.Rank, l.PrefillTokens, l.DecodeBlocks, l.Requests})
	}
	admin.WriteJSON(w, http.StatusOK, out)
}

type potentialRequest struct {
	scope
	prompt
	NewISLTokens *int64 `json:"new_isl_tokens"`
	ISLTokens    *int64 `json:"isl_tokens"`
}

type potentialView struct {
	WorkerID               uint64  `json:"worker_id"`
	DPRank                 uint32  `json:"dp_rank"`
	PotentialPrefillTokens int64   `json:"potential_prefill_tokens"`
	PotentialDecodeBlocks  float64 `json:"potential_decode_blocks"`
}

// potentialLoads projects every rank's load with the prompt added. Its new
// prefill is new_isl_tokens (the slot tracker's form) or, with isl_tokens
// instead (the selection service's), isl_tokens less the rank's cached
// prefix, credited as the scheduler credits it.
func (s *service) potentialLoads(_ *http.Request, req *potentialRequest) (int, any, error) {
	key, err := req.key(nil, true)
	if err != nil {
		return 0, nil, err
	}
	if err := s.hashTokens(key, &req.prompt, &req.ISLTokens); err != nil {
		return 0, nil, err
	}
	// As for /select, block_hashes (the selection service's form) give the
	// sequence hashes; sequence_hashes alone are the slot tracker's.
	var seq []uint64
	switch {
	case req.BlockHashes != nil:
		seq = indexer.SequenceHashes(nil, u64s(*req.BlockHashes))
		if req.SequenceHashes != nil && len(*req.SequenceHashes) != len(seq) {
			return 0, nil, badRequest("sequence_hashes has %d hashes and block_hashes %d; they must match", len(*req.SequenceHashes), len(seq))
		}
	case req.SequenceHashes != nil:
		seq = u64s(*req.SequenceHashes)
	default:
		return 0, nil, badRequest("sequence_hashes (or block_hashes, or token_ids) is required")
	}
	newISL, err := tokens("new_isl_tokens", req.NewISLTokens)
	if err != nil {
		return 0, nil, err
	}
	isl, err := tokens("isl_tokens", req.ISLTokens)
	if err != nil {
		return 0, nil, err
	}
	var credit *int64
	if req.NewISLTokens == nil && req.ISLTokens != nil {
		credit = &isl
	}
	pots, err := s.sched.Potentials(key, seq, newISL, credit)
	if err != nil {
		return 0, nil, err
	}
	out := make([]potentialView, len(pots))
	for i, p := range pots {
		out[i] = potentialView{p.Worker.Worker, p.Worker.Rank, p.PrefillTokens, p.DecodeBlocks}
	}
	return http.StatusOK, out, nil
}

// --- Workers (seed 003) ---

type workerRequest struct {
	workerIdentity
	Endpoint          *string            `json:"endpoint"`
	BlockSize         *int               `json:"block_size"`
	DPStart           *uint32            `json:"data_parallel_start_rank"`
	DPSize            *uint32            `json:"data_parallel_size"`
	KVEventsEndpoints *map[string]string `json:"kv_events_endpoints"`
	KVEventsEndpoint  *string            `json:"kv_events_endpoint"` // one rank's, for a worker with one
	ReplayEndpoint    *string            `json:"replay_endpoint"`
}

// events parses kv_events_endpoints: rank (decimal) to endpoint.
func events(m map[string]string) (map[uint32]string, error) {
	out := make(map[uint32]string, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		rank, err := strconv.ParseUint(k, 10, 32)
		if err != nil {
			return nil, badRequest("kv_events_endpoints: key %.40q is not a dp rank", k)
		}
		if _, dup := out[uint32(rank)]; dup {
			return nil, badRequest("kv_events_endpoints: dp rank %d is given twice", rank)
		}
		out[uint32(rank)] = m[k]
	}
	return out, nil
}

func (s *service) putWorker(_ *http.Request, req *workerRequest) (int, any, error) {
	id, err := req.id()
	if err != nil {
		return 0, nil, err
	}
	key, err := scope{req.ModelName, req.TenantID}.key(nil, true)
	if err != nil {
		return 0, nil, err
	}
	if req.BlockSize == nil {
		return 0, nil, badRequest("block_size is required")
	}
	spec := catalog.WorkerSpec{
		WorkerKey: catalog.WorkerKey{Key: key, ID: id}, BlockSize: *req.BlockSize, Endpoint: deref(req.Endpoint),
		DPStart: deref(req.DPStart), DPSize: 1, Replay: deref(req.ReplayEndpoint), Source: catalog.SourceAPI,
	}
	if req.DPSize != nil {
		spec.DPSize = *req.DPSize
	}
	if req.KVEventsEndpoints != nil && len(*req.KVEventsEndpoints) > 0 {
		if spec.Events, err = events(*req.KVEventsEndpoints); err != nil {
			return 0, nil, err
		}
	} else if req.KVEventsEndpoint != nil {
		if spec.DPSize != 1 {
			return 0, nil, badRequest("kv_events_endpoint names the publisher of a one-rank worker; give kv_events_endpoints by rank")
		}
		spec.Events = map[uint32]string{spec.DPStart: *req.KVEventsEndpoint}
	}
	if err := s.cat.PutWorker(spec); err != nil {
		return 0, nil, err
	}
	return http.StatusCreated, s.record(spec.WorkerKey), nil
}

// workerRecord answers POST and PATCH /workers: the selection service's
// lifecycle ("schedulable", or "incomplete" with the reasons) and the
// worker's names.
type workerRecord struct {
	Status                string   `json:"status"`
	WorkerID              uint64   `json:"worker_id"`
	ModelName             string   `json:"model_name"`
	TenantID              string   `json:"tenant_id"`
	Lifecycle             string   `json:"lifecycle"`
	NotSchedulableReasons []string `json:"not_schedulable_reasons"`
}

func (s *service) record(wk catalog.WorkerKey) workerRecord {
	if wk.Key.Tenant == "" {
		wk.Key.Tenant = indexer.DefaultTenant
	}
	lifecycle, reasons := lifecycleOf(s.cat.NotSchedulable(wk))
	return workerRecord{Status: "ok", WorkerID: wk.ID, ModelName: wk.Key.Model, TenantID: wk.Key.Tenant,
		Lifecycle: lifecycle, NotSchedulableReasons: reasons}
}

// lifecycleOf names a registration's lifecycle as the selection service
// does, from its not-schedulable reasons (never nil, for JSON's []).
func lifecycleOf(reasons []string) (string, []string) {
	if len(reasons) > 0 {
		return "incomplete", reasons
	}
	return "schedulable", []string{}
}

// pathWorker returns the worker named by the path and the scope. Worker ids
// are global in the selection service: without a model_name, the worker is
// the one registered under that id in any model (and the tenant_id given,
// if any); an id registered under several is a 409.
func (s *service) pathWorker(r *http.Request, sc scope) (catalog.WorkerKey, error) {
	id, err := strconv.ParseUint(r.PathValue("worker_id"), 10, 64)
	if err != nil {
		return catalog.WorkerKey{}, badRequest("worker_id %.40q in the path is not an unsigned integer", r.PathValue("worker_id"))
	}
	q := r.URL.Query()
	key, err := sc.key(q, true)
	if err != nil || sc.given("model_name", q) != "" {
		return catalog.WorkerKey{Key: key, ID: id}, err
	}
	found := s.cat.Lookup(id, sc.given("tenant_id", q))
	switch len(found) {
	case 0:
		return catalog.WorkerKey{}, fmt.Errorf("%w: worker %d is not registered", scheduler.ErrNotFound, id)
	case 1:
		return found[0], nil
	}
	keys := make([]indexer.Key, len(found))
	for i, wk := range found {
		keys[i] = wk.Key
	}
	return catalog.WorkerKey{}, ambiguous(fmt.Sprintf("worker %d", id), keys)
}

// ambiguous is the 409 of an id, named with no model_name, that more than
// one (model, tenant) knows.
func ambiguous(what string, keys []indexer.Key) error {
	names := make([]string, len(keys))
	for i, k := range keys {
		names[i] = fmt.Sprintf("%q/%q", k.Model, k.Tenant)
	}
	return fmt.Errorf("%w: %s is known under model_name/tenant_id %s; give model_name (and tenant_id)",
		scheduler.ErrConflict, what, strings.Join(names, ", "))
}

func (s *service) patchWorker(r *http.Request, req *workerRequest) (int, any, error) {
	wk, err := s.pathWorker(r, scope{req.ModelName, req.TenantID})
	if err != nil {
		return 0, nil, err
	}
	if body, err := req.id(); err == nil && body != wk.ID {
		return 0, nil, badRequest("worker_id %d in the body is not the path's %d", body, wk.ID)
	}
	p := catalog.WorkerPatch{WorkerKey: wk, BlockSize: req.BlockSize, Endpoint: req.Endpoint,
		DPStart: req.DPStart, DPSize: req.DPSize, Replay: req.ReplayEndpoint}
	if req.KVEventsEndpoints != nil {
		if p.Events, err = events(*req.KVEventsEndpoints); err != nil {
			return 0, nil, err
		}
	}
	if err := s.cat.PatchWorker(p); err != nil {
		return 0, nil, err
	}
	return http.StatusOK, s.record(wk), nil
}

func (s *service) deleteWorker(r *http.Request, req *scope) (int, any, error) {
	wk, err := s.pathWorker(r, *req)
	if err != nil {
		return 0, nil, err
	}
	_, err = s.cat.Unregister(wk.Key.Model, &wk.Key.Tenant, wk.ID, nil)
	return done(http.StatusOK, err)
}

// --- Selection (seed 003) ---

type selectRequest struct {
	scope
	SelectionID   *string `json:"selection_id"`
	ReservationID *string `json:"reservation_id"`
	prompt
	ISLTokens          *int64    `json:"isl_tokens"`
	OverlapScoreWeight *float64  `json:"overlap_score_weight"`
	RouterTemperature  *float64  `json:"router_temperature"`
	Temperature        *float64  `json:"temperature"`
	WorkerIDs          *[]uint64 `json:"worker_ids"`
	Candidates         *[]uint64 `json:"candidates"`
	AllowedWorkerIDs   *[]uint64 `json:"allowed_worker_ids"` // Dynamo's name
	Override           *struct {
		OverlapScoreWeight *float64 `json:"overlap_score_weight"`
		RouterTemperature  *float64 `json:"router_temperature"`
	} `json:"router_config_override"`
}

type tiers struct {
	LongestMatched int `json:"longest_matched"`
	GPU            int `json:"gpu"`
	CPU            int `json:"cpu"`
	Disk           int `json:"disk"`
}

// tiersOf returns an overlap in tokens.
func tiersOf(o indexer.Overlap, bs int) tiers {
	gpu, cpu, disk := o.Tokens(bs)
	return tiers{LongestMatched: max(gpu, cpu, disk), GPU: gpu, CPU: cpu, Disk: disk}
}

type selectResponse struct {
	SelectionID   string `json:"selection_id,omitempty"`
	ReservationID string `json:"reservation_id,omitempty"`
	ModelName     string `json:"model_name"`
	TenantID      string `json:"tenant_id"`
	WorkerID      uint64 `json:"worker_id"`
	DPRank        uint32 `json:"dp_rank"`
	Endpoint      string `json:"endpoint"`
	BlockSize     int    `json:"block_size"`
	Overlap       struct {
		tiers
		DP map[string]int `json:"dp"`
	} `json:"overlap"`
	EffectivePrefillTokens int64 `json:"effective_prefill_tokens"`
}

// choose answers /select and, with reserve, /select_and_reserve.
func (s *service) choose(reserve bool) func(*http.Request, *selectRequest) (int, any, error) {
	return func(_ *http.Request, req *selectRequest) (int, any, error) { return s.selection(req, reserve) }
}

func (s *service) selection(req *selectRequest, reserve bool) (int, any, error) {
	key, err := req.key(nil, true)
	if err != nil {
		return 0, nil, err
	}
	sr := scheduler.SelectRequest{Key: key, Reserve: reserve, ReservationID: deref(req.ReservationID)}
	if err := s.hashTokens(key, &req.prompt, &req.ISLTokens); err != nil {
		return 0, nil, unschedulable(err)
	}
	if req.BlockHashes == nil {
		return 0, nil, badRequest("block_hashes (or token_ids) is required")
	}
	sr.Local = u64s(*req.BlockHashes)
	// The overlap is looked up by block_hashes; the given sequence
	// hashes are those SequenceHashes derives from them for every client
	// hashing as Dynamo does (docs/hashing.md), so they are only
	// checked.
	if req.SequenceHashes != nil && len(*req.SequenceHashes) != len(sr.Local) {
		return 0, nil, badRequest("sequence_hashes has %d hashes and block_hashes %d; they must match", len(*req.SequenceHashes), len(sr.Local))
	}
	if sr.ISL, err = tokens("isl_tokens", req.ISLTokens); err != nil {
		return 0, nil, err
	}
	sr.OverlapWeight, sr.Temperature = req.OverlapScoreWeight, cmp.Or(req.RouterTemperature, req.Temperature)
	if o := req.Override; o != nil {
		sr.OverlapWeight, sr.Temperature = cmp.Or(sr.OverlapWeight, o.OverlapScoreWeight), cmp.Or(sr.Temperature, o.RouterTemperature)
	}
	if reserve && sr.ReservationID == "" {
		sr.ReservationID = rand.Text()
	}
	if sr.Workers, err = s.candidates(key, req); err != nil {
		return 0, nil, unschedulable(err)
	}
	d, err := s.sched.Select(sr)
	if err != nil {
		return 0, nil, unschedulable(err)
	}
	resp := selectResponse{
		SelectionID: deref(req.SelectionID), ReservationID: sr.ReservationID, ModelName: key.Model, TenantID: key.Tenant,
		WorkerID: d.Worker.Worker, DPRank: d.Worker.Rank, Endpoint: d.Endpoint, BlockSize: d.BlockSize,
		EffectivePrefillTokens: d.EffectivePrefillTokens,
	}
	resp.Overlap.tiers = tiersOf(d.Overlap, d.BlockSize)
	resp.Overlap.DP = make(map[string]int, len(d.DP))
	for rank, blocks := range d.DP {
		resp.Overlap.DP[strconv.FormatUint(uint64(rank), 10)] = blocks * d.BlockSize
	}
	return http.StatusOK, resp, nil
}

// unschedulable makes a selection's unknown model and tenant a 503, as
// Dynamo answers when no worker is schedulable: its clients retry on it.
func unschedulable(err error) error {
	if errors.Is(err, scheduler.ErrNotFound) {
		return admin.Errorf(http.StatusServiceUnavailable, "%s", strings.TrimPrefix(err.Error(), scheduler.ErrNotFound.Error()+": "))
	}
	return err
}

// candidates returns the worker ids a selection is restricted to (nil: any),
// keeping only the registered ones; none is ErrUnavailable (or ErrNotFound
// for an unknown model and tenant, as Select answers).
func (s *service) candidates(key indexer.Key, req *selectRequest) ([]uint64, error) {
	var ids *[]uint64
	for _, l := range []*[]uint64{req.WorkerIDs, req.Candidates, req.AllowedWorkerIDs} {
		if l != nil && ids != nil {
			return nil, badRequest("give one of worker_ids, candidates and allowed_worker_ids")
		}
		ids = cmp.Or(ids, l)
	}
	if ids == nil {
		return nil, nil
	}
	if len(*ids) == 0 {
		return nil, badRequest("worker_ids must not be empty; leave it out to consider every worker")
	}
	var known []uint64
	for _, w := range s.cat.Workers(key.Model, key.Tenant) {
		if slices.Contains(*ids, w.ID) {
			known = append(known, w.ID)
		}
	}
	switch {
	case len(known) > 0:
		return known, nil
	case s.set.Lookup(key) == nil || !s.known(key):
		return nil, fmt.Errorf("%w: no worker registered for model_name %q tenant_id %q", scheduler.ErrNotFound, key.Model, key.Tenant)
	}
	return nil, fmt.Errorf("%w: none of worker ids %v is registered for model_name %q tenant_id %q", scheduler.ErrUnavailable, *ids, key.Model, key.Tenant)
}

// --- Reservations (seed 003) ---

type reservationRequest struct {
	scope
	ReservationID *string `json:"reservation_id"`
	SelectionID   *string `json:"selection_id"` // Dynamo's later name of the booking id
	WorkerID      *uint64 `json:"worker_id"`
	DPRank        *uint32 `json:"dp_rank"`
	prompt
	ISLTokens              *int64 `json:"isl_tokens"`
	EffectivePrefillTokens *int64 `json:"effective_prefill_tokens"`
}

type reservationResponse struct {
	Status        string `json:"status"`
	ReservationID string `json:"reservation_id"`
	ModelName     string `json:"model_name"`
	TenantID      string `json:"tenant_id"`
	WorkerID      uint64 `json:"worker_id"`
	DPRank        uint32 `json:"dp_rank"`
	Endpoint      string `json:"endpoint"`
}

// reserve books a selection made earlier: prefill is the given
// effective_prefill_tokens, else isl_tokens (default: the prompt's blocks).
func (s *service) reserve(_ *http.Request, req *reservationRequest) (int, any, error) {
	key, err := req.key(nil, true)
	if err != nil {
		return 0, nil, err
	}
	id := cmp.Or(deref(req.ReservationID), deref(req.SelectionID))
	if id == "" {
		return 0, nil, badRequest("reservation_id is required")
	}
	if req.WorkerID == nil {
		return 0, nil, badRequest("worker_id is required")
	}
	if err := s.hashTokens(key, &req.prompt, &req.ISLTokens); err != nil {
		return 0, nil, err
	}
	var seq []uint64
	switch {
	case req.SequenceHashes != nil:
		seq = u64s(*req.SequenceHashes)
	case req.BlockHashes != nil:
		seq = indexer.SequenceHashes(nil, u64s(*req.BlockHashes))
	default:
		return 0, nil, badRequest("sequence_hashes (or block_hashes, or token_ids) is required")
	}
	isl, err := tokens("isl_tokens", req.ISLTokens)
	if err != nil {
		return 0, nil, err
	}
	if req.ISLTokens == nil {
		ix := s.set.Lookup(key)
		if ix == nil {
			return 0, nil, fmt.Errorf("%w: no worker registered for model_name %q tenant_id %q", scheduler.ErrNotFound, key.Model, key.Tenant)
		}
		isl = int64(len(seq) * ix.BlockSize())
	}
	prefill := isl
	if req.EffectivePrefillTokens != nil {
		if prefill, err = tokens("effective_prefill_tokens", req.EffectivePrefillTokens); err != nil {
			return 0, nil, err
		}
		if prefill > isl {
			return 0, nil, badRequest("effective_prefill_tokens %d exceeds isl_tokens %d", prefill, isl)
		}
	}
	wr := indexer.WorkerRank{Worker: *req.WorkerID, Rank: deref(req.DPRank)}
	if why := s.cat.NotSchedulable(catalog.WorkerKey{Key: key, ID: wr.Worker}); len(why) > 0 {
		return 0, nil, fmt.Errorf("%w: worker %d of model_name %q tenant_id %q is not schedulable: %s",
			scheduler.ErrNotFound, wr.Worker, key.Model, key.Tenant, strings.Join(why, "; "))
	}
	if err := s.loads().Add(key, scheduler.Booking{ID: id, Worker: wr, Hashes: seq, PrefillTokens: prefill}); err != nil {
		return 0, nil, err
	}
	return http.StatusCreated, reservationResponse{
		Status: "ok", ReservationID: id, ModelName: key.Model, TenantID: key.Tenant,
		WorkerID: wr.Worker, DPRank: wr.Rank, Endpoint: s.cat.Endpoint(catalog.WorkerKey{Key: key, ID: wr.Worker}),
	}, nil
}

// reservationBody is the optional body of a reservation's lifecycle
// routes: its scope (also taken from the query) and output_block's decay.
type reservationBody struct {
	scope
	DecayFraction *float64 `json:"decay_fraction"`
}

// reservation returns the reservation the path names and its key, and
// whether it is active. Reservation ids are global in the selection
// service: without a model_name, the key is the one (model, tenant) where
// the id is active (of the tenant_id given, if any); an id active under
// several is a 409.
func (s *service) reservation(r *http.Request, req *reservationBody) (indexer.Key, string, bool, error) {
	q := r.URL.Query()
	id := r.PathValue("id")
	key, err := req.key(q, true)
	if err != nil || req.given("model_name", q) != "" {
		return key, id, true, err
	}
	found := s.loads().Holding(id, req.given("tenant_id", q))
	switch len(found) {
	case 0:
		return key, id, false, nil
	case 1:
		return found[0], id, true, nil
	}
	return key, id, false, ambiguous(fmt.Sprintf("reservation %q", id), found)
}

func (s *service) reservationPrefillComplete(r *http.Request, req *reservationBody) (int, any, error) {
	key, id, active, err := s.reservation(r, req)
	if err == nil && !active {
		err = inactive(id)
	}
	if err != nil {
		return 0, nil, err
	}
	return done(http.StatusOK, s.loads().PrefillComplete(key, id))
}

func (s *service) reservationOutputBlock(r *http.Request, req *reservationBody) (int, any, error) {
	key, id, active, err := s.reservation(r, req)
	if err == nil && !active {
		err = inactive(id)
	}
	if err != nil {
		return 0, nil, err
	}
	return done(http.StatusOK, s.loads().OutputBlock(key, id, deref(req.DecayFraction)))
}

// reservationFree frees a reservation; one active nowhere is already free.
func (s *service) reservationFree(r *http.Request, req *reservationBody) (int, any, error) {
	key, id, active, err := s.reservation(r, req)
	if err != nil || !active {
		return done(http.StatusOK, err)
	}
	_, err = s.loads().Free(key, id)
	return done(http.StatusOK, err)
}

// inactive is the 404 of a reservation, named with no model_name, that no
// (model, tenant) has active.
func inactive(id string) error {
	return fmt.Errorf("%w: reservation %q is not active", scheduler.ErrNotFound, id)
}

// --- Overlap scores (seed 003) ---

type overlapRequest struct {
	scope
	prompt
}

// overlapRow is one rank's overlap in Dynamo's shape: blocks, cumulative
// per tier (device, then host, then disk), the extensions beyond the tier
// above and the blocks the scheduler credits.
type overlapRow struct {
	WorkerID            uint64  `json:"worker_id"`
	DPRank              uint32  `json:"dp_rank"`
	DeviceBlocks        int     `json:"device_blocks"`
	HostPinnedBlocks    int     `json:"host_pinned_blocks"`
	DiskBlocks          int     `json:"disk_blocks"`
	HostPinnedExtBlocks int     `json:"host_pinned_extension_blocks"`
	DiskExtBlocks       int     `json:"disk_extension_blocks"`
	SharedBeyondDevice  *uint32 `json:"shared_beyond_device_blocks"` // no shared cache: null
	RouterCreditBlocks  float64 `json:"router_credit_blocks"`
}

// sharedCache is Dynamo's shared cache summary; kvgate has none.
type sharedCache struct {
	Enabled        bool     `json:"enabled"`
	TotalHitBlocks int      `json:"total_hit_blocks"`
	Ranges         [][2]int `json:"ranges"`
	Error          *string  `json:"error"`
}

type overlapResponse struct {
	BlockSize   int          `json:"block_size"`
	NumBlocks   int          `json:"num_blocks"`
	Workers     []overlapRow `json:"workers"`
	SharedCache sharedCache  `json:"shared_cache"`
}

// overlapScores answers the prompt's blocks and, for every schedulable
// rank and every rank holding at least its first block, that rank's cached
// prefix per tier, in blocks.
func (s *service) overlapScores(_ *http.Request, req *overlapRequest) (int, any, error) {
	key, err := req.key(nil, true)
	if err != nil {
		return 0, nil, err
	}
	if req.BlockHashes == nil && req.TokenIDs == nil {
		return 0, nil, badRequest("block_hashes (or token_ids) is required")
	}
	ix := s.set.Lookup(key)
	if ix == nil {
		return 0, nil, fmt.Errorf("%w: no index for model_name %q tenant_id %q", scheduler.ErrNotFound, key.Model, key.Tenant)
	}
	var isl *int64
	if err := s.hashTokens(key, &req.prompt, &isl); err != nil {
		return 0, nil, err
	}
	byRank := make(map[indexer.WorkerRank]indexer.Overlap)
	for _, o := range ix.Match(indexer.SequenceHashes(nil, u64s(*req.BlockHashes)), nil) {
		byRank[o.Worker] = o
	}
	sched := s.cat.View().Schedulable(key)
	for _, w := range s.cat.Workers(key.Model, key.Tenant) {
		if !sched[w.ID] {
			continue
		}
		for _, rank := range w.Ranks {
			wr := indexer.WorkerRank{Worker: w.ID, Rank: rank}
			if _, ok := byRank[wr]; !ok {
				byRank[wr] = indexer.Overlap{Worker: wr}
			}
		}
	}
	resp := overlapResponse{BlockSize: ix.BlockSize(), NumBlocks: len(*req.BlockHashes),
		Workers: make([]overlapRow, 0, len(byRank)), SharedCache: sharedCache{Ranges: [][2]int{}}}
	for _, wr := range slices.SortedFunc(maps.Keys(byRank), func(a, b indexer.WorkerRank) int {
		return cmp.Or(cmp.Compare(a.Worker, b.Worker), cmp.Compare(a.Rank, b.Rank))
	}) {
		o := byRank[wr]
		resp.Workers = append(resp.Workers, overlapRow{
			WorkerID: wr.Worker, DPRank: wr.Rank,
			DeviceBlocks: int(o.Device), HostPinnedBlocks: int(o.Host), DiskBlocks: int(o.Disk),
			HostPinnedExtBlocks: int(o.Host - o.Device), DiskExtBlocks: int(o.Disk - o.Host),
			RouterCreditBlocks: s.sched.CreditBlocks(o),
		})
	}
	return http.StatusOK, resp, nil
}
