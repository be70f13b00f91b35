package scheduler

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"
)

// engineView is a worker's scrape as GET /workers shows it (see
// internal/httpapi), for the checks: a value not reported is nil.
type engineView struct {
	URL         string
	ScrapedAt   *time.Time // nil: never scraped successfully
	AttemptedAt time.Time
	LastError   string
	Fresh       bool
	Ranks       map[string]rankView // by dp rank
}

type rankView struct{ Waiting, Running, KVCacheUsage, KVBlocks *float64 }

// viewOf returns s as GET /workers shows it; nil for nil.
func viewOf(s *WorkerScrape) *engineView {
	if s == nil {
		return nil
	}
	v := &engineView{URL: s.URL, AttemptedAt: s.AttemptedAt, LastError: s.LastError, Fresh: s.Fresh, Ranks: map[string]rankView{}}
	if !s.ScrapedAt.IsZero() {
		v.ScrapedAt = &s.ScrapedAt
	}
	known := func(f float64) *float64 {
		if math.IsNaN(f) {
			return nil
		}
		return &f
	}
	for rank, l := range s.Ranks {
		v.Ranks[fmt.Sprint(rank)] = rankView{known(l.Waiting), known(l.Running), known(l.KVUsage), known(l.KVBlocks)}
	}
	return v
}

// engineMetrics returns what the scrapes of worker id found (its
// engine_metrics in GET /workers).
func (s *selRig) engineMetrics(id uint64) *engineView {
	s.t.Helper()
	for _, w := range s.cat.Workers(s.key.Model, s.key.Tenant) {
		if w.ID == id {
			return viewOf(w.Scrape)
		}
	}
	s.t.Fatalf("worker %d not in the catalog", id)
	return nil
}

// listed reports whether worker id is in the catalog.
func (s *selRig) listed(id uint64) bool {
	return slices.ContainsFunc(s.cat.Workers(s.key.Model, s.key.Tenant), func(w WorkerState) bool { return w.ID == id })
}

// checkScrapes checks that what every worker shows of its scrapes is
// consistent: values of its own ranks only, and fresh only without an
// error.
func (s *selRig) checkScrapes() {
	s.t.Helper()
	for _, w := range s.cat.Workers("", "") {
		em := viewOf(w.Scrape)
		if em == nil {
			continue
		}
		for rs := range em.Ranks {
			if rank, err := strconv.ParseUint(rs, 10, 32); err != nil || !slices.Contains(w.Ranks, uint32(rank)) {
				s.t.Errorf("%s: engine_metrics of rank %q not in dp_ranks %v", w.WorkerKey, rs, w.Ranks)
			}
		}
		if em.Fresh && (em.LastError != "" || em.ScrapedAt == nil) {
			s.t.Errorf("%s: engine_metrics fresh with error %q, scraped at %v", w.WorkerKey, em.LastError, em.ScrapedAt)
		}
	}
}
