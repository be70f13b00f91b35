// Package scheduler decides where a request goes: it owns the active load
// booked on each worker rank (load.go: bookings, the slot tracker's and the
// selection service's reservations, expiry, the lifecycle replica sync
// shares), the cost-based selection over the worker catalog's schedulable
// ranks and the index's overlaps (select.go), and the correction of the
// cost by the load engines report (engine.go). The protocols are in
// docs/scheduling.md and docs/http-api.md.
//
// Its neighbours are sub-packages: scheduler/catalog (the workers, which
// the loads follow: Loads.Follow), scheduler/scrape (the engines' vLLM
// /metrics) and scheduler/replica (replica sync of the loads between
// kvgate replicas). It must not touch the index's internals, the event
// listeners or HTTP (internal/httpapi serves its routes).
package scheduler

import (
	"github.com/kvgate/kvgate/scheduler/catalog"
)

// Errors of the scheduler: the catalog's. The HTTP layer maps them to
// status codes.
var (
	ErrInvalid     = catalog.ErrInvalid     // 400
	ErrNotFound    = catalog.ErrNotFound    // 404
	ErrConflict    = catalog.ErrConflict    // 409
	ErrUnavailable = catalog.ErrUnavailable // 503
)

// Workers is what selection needs of the worker catalog
// (*catalog.Catalog): the schedulable workers and where their requests go.
type Workers interface {
	View() *catalog.View
	Endpoint(wk catalog.WorkerKey) string
}
