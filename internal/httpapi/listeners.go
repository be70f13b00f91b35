package httpapi

import (
	"slices"

	"github.com/kvgate/kvgate/internal/admin"
)

// This file says which routes each Dynamo or Mooncake service serves when
// kvgate gives it a listener of its own (--indexer-addr,
// --slot-tracker-addr, --selection-addr; docs/http-api.md, "Listeners").

// Service names an API surface that can have a listener of its own.
type Service string

// The services that can have a listener of their own.
const (
	// IndexerService is Dynamo's standalone indexer, with Mooncake's
	// conductor routes (/conductor/*) alongside.
	IndexerService Service = "indexer"
	// SlotTrackerService is Dynamo's slot tracker.
	SlotTrackerService Service = "slot-tracker"
	// SelectionService is Dynamo's selection service.
	SelectionService Service = "selection"
)

// Services lists the services in the order their listeners start.
func Services() []Service {
	return []Service{IndexerService, SlotTrackerService, SelectionService}
}

// patterns are the service's routes, by net/http pattern.
func (s Service) patterns() []string {
	switch s {
	case IndexerService:
		return []string{
			"POST /query", "POST /query_by_hash", "POST /conductor/query", "POST /conductor/query_by_hash",
			"GET /dump", "POST /register_peer", "POST /deregister_peer", "GET /peers",
			"POST /register", "POST /unregister", "GET /workers",
			"POST /test/pause_listener", "POST /test/resume_listener",
		}
	case SlotTrackerService:
		return []string{
			"POST /register", "POST /unregister", "GET /workers",
			"POST /add", "POST /prefill_complete", "POST /free", "GET /loads", "POST /potential_loads",
		}
	case SelectionService:
		return []string{
			"POST /workers", "PATCH /workers/{worker_id}", "DELETE /workers/{worker_id}",
			"POST /select", "POST /select_and_reserve", "POST /reservations",
			"POST /reservations/{id}/prefill_complete", "POST /reservations/{id}/output_block", "DELETE /reservations/{id}",
			"POST /overlap_scores", "GET /loads", "POST /potential_loads",
			"POST /replica_sync/register_peer", "POST /replica_sync/deregister_peer", "GET /replica_sync/peers",
		}
	}
	return nil
}

// Routes picks s's routes out of all, the combined admin listener's table:
// the process's own routes and the service's, each pattern once (the
// first in all). A caller gives a service its own version of a route the
// combined listener answers for another (the selection service's GET
// /loads) by putting it first. A route all lacks (test routes that are
// off) is left out.
func (s Service) Routes(all []admin.Route) []admin.Route {
	// Every listener serves liveness, readiness and the process's metrics.
	want := append([]string{"GET /health", "GET /ready", "GET /metrics"}, s.patterns()...)
	var out []admin.Route
	seen := make(map[string]bool)
	for _, rt := range all {
		if slices.Contains(want, rt.Pattern) && !seen[rt.Pattern] {
			seen[rt.Pattern] = true
			out = append(out, rt)
		}
	}
	return out
}
