package httpapi

import (
	"net/http"
	"slices"
	"testing"

	"github.com/kvgate/kvgate/internal/admin"
	"github.com/kvgate/kvgate/scheduler"
)

// allRoutes is the combined listener's table, as main builds it, with the
// test routes on.
func allRoutes(t *testing.T) []admin.Route {
	r := newRig(t, rigOptions{inProcess: true})
	peers, err := NewPeers(nil)
	if err != nil {
		t.Fatal(err)
	}
	sched := scheduler.NewScheduler(r.cat, r.set, r.loads, scheduler.CostOptions{}, 1, r.reg)
	nop := func(http.ResponseWriter, *http.Request) {}
	routes := []admin.Route{{Pattern: "GET /health", Handler: nop}, {Pattern: "GET /metrics", Handler: nop}}
	for _, rs := range [][]admin.Route{IndexRoutes(r.set, peers, nil), WorkerRoutes(r.cat, nil), ListenerTestRoutes(r.cat),
		ServiceRoutes(r.cat, sched, r.set), ReplicaSyncOffRoutes()} {
		routes = append(routes, rs...)
	}
	return routes
}

func patternsOf(routes []admin.Route) []string {
	var out []string
	for _, rt := range routes {
		out = append(out, rt.Pattern)
	}
	return out
}

func TestServiceRoutes(t *testing.T) {
	all := allRoutes(t)
	homed := map[string]bool{}
	for _, s := range Services() {
		got := patternsOf(s.Routes(all))
		for _, p := range s.patterns() {
			if !slices.Contains(got, p) {
				t.Errorf("%s: %s is not in the combined table", s, p)
			}
			homed[p] = true
		}
		for _, p := range []string{"GET /health", "GET /ready", "GET /metrics"} {
			if !slices.Contains(got, p) {
				t.Errorf("%s: lacks %s", s, p)
			}
		}
		// The admin server panics on a duplicate pattern.
		admin.New(admin.Options{}).Handle(s.Routes(all)...)
	}
	for _, p := range patternsOf(all) {
		if !homed[p] && !slices.Contains([]string{"GET /health", "GET /ready", "GET /metrics"}, p) {
			t.Errorf("%s belongs to no service's listener", p)
		}
	}
	for s, foreign := range map[Service][]string{
		IndexerService:     {"POST /add", "GET /loads", "POST /select", "POST /workers"},
		SlotTrackerService: {"POST /query", "GET /dump", "POST /select", "POST /workers"},
		SelectionService:   {"POST /query", "POST /add", "POST /register"},
	} {
		got := patternsOf(s.Routes(all))
		for _, p := range foreign {
			if slices.Contains(got, p) {
				t.Errorf("%s serves %s", s, p)
			}
		}
	}
}
