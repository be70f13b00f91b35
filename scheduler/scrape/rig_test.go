package scrape

import (
	"cmp"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/indexer"
	"github.com/kvgate/kvgate/internal/stacktest"
	"github.com/kvgate/kvgate/scheduler"
	"github.com/kvgate/kvgate/scheduler/catalog"
)

// This file holds the test rig: a catalog on real listeners with loads
// following it, as main wires them, the scraper under test, and what
// GET /workers would show of its scrapes.

const testBS = 4 // tokens per block of the rig's index

var quiet = slog.New(slog.DiscardHandler)

// rig is a catalog of key's workers, whose KV blocks are applied straight
// to the index, the loads following it and, once newScraper made one, the
// scraper whose scrapes its views and decisions read.
type rig struct {
	t     testing.TB
	set   *indexer.Set
	cat   *catalog.Catalog
	loads *scheduler.Loads
	reg   *prometheus.Registry
	now   func() time.Time // the loads' clock
	key   indexer.Key
	bs    int
	sc    *Scraper
}

// newRig returns a rig of block size bs on clock now (nil: time.Now).
func newRig(t testing.TB, bs int, now func() time.Time) *rig {
	t.Helper()
	if now == nil {
		now = time.Now
	}
	r := &rig{t: t, reg: prometheus.NewRegistry(), now: now, key: indexer.Key{Model: "m", Tenant: indexer.DefaultTenant}, bs: bs}
	st := stacktest.New(t, stacktest.Options{Registry: r.reg})
	r.set, r.cat = st.Set, st.Catalog
	r.loads = scheduler.NewLoads(scheduler.LoadOptions{Now: now})
	r.cat.Watch(r.loads.Follow)
	return r
}

// putWorker registers worker id of the rig's key with request endpoint ep
// and ranks start .. start+size-1, without event publishers.
func (s *rig) putWorker(id uint64, ep string, start, size uint32) {
	s.t.Helper()
	must(s.t, s.cat.PutWorker(catalog.WorkerSpec{WorkerKey: catalog.WorkerKey{Key: s.key, ID: id}, BlockSize: s.bs, Endpoint: ep,
		DPStart: start, DPSize: size, Source: catalog.SourceAPI}))
}

// store stores blocks lo .. hi-1 of prompt (local hashes) on tier for r,
// chained to block lo-1. A block's engine id is its position + 1.
func (s *rig) store(r indexer.WorkerRank, tier indexer.Tier, prompt []uint64, lo, hi int) {
	s.t.Helper()
	ev := indexer.Event{Kind: indexer.Stored, Worker: r, Tier: tier}
	for i := lo; i < hi; i++ {
		ev.Blocks = append(ev.Blocks, indexer.Block{ID: uint64(i + 1), Local: prompt[i]})
	}
	if lo > 0 {
		ev.Parent, ev.HasParent = uint64(lo), true
	}
	ix, err := s.set.Index(s.key, s.bs)
	if err == nil {
		_, err = ix.Apply(ev)
	}
	must(s.t, err)
}

// scheduler returns a scheduler over the rig, whose metrics correction
// reads the rig's scraper unless opts names other reports.
func (s *rig) scheduler(seed uint64, opts scheduler.CostOptions) *scheduler.Scheduler {
	if opts.Engines == nil && s.sc != nil {
		opts.Engines = s.sc
	}
	return scheduler.NewScheduler(s.cat, s.set, s.loads, opts, seed, nil)
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func ptrTo[T any](v T) *T { return &v }

func rk(worker uint64, rank uint32) indexer.WorkerRank {
	return indexer.WorkerRank{Worker: worker, Rank: rank}
}

func cmpRank(a, b indexer.WorkerRank) int {
	return cmp.Or(cmp.Compare(a.Worker, b.Worker), cmp.Compare(a.Rank, b.Rank))
}

// promptOf returns n local block hashes of prompt p.
func promptOf(p, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = uint64(p+1)<<40 | uint64(i)*0x9e3779b97f4a7c15>>24 | 1
	}
	return out
}

// costPrompt is a prompt of 10 blocks of 4 tokens (isl 40).
var costPrompt = promptOf(0, 10)

// closedPort returns a tcp endpoint on a loopback port nobody listens on.
func closedPort(t testing.TB) string { return stacktest.ClosedPort(t) }

// fakeClock is a clock the tests move by hand.
type fakeClock = stacktest.Clock

func newFakeClock() *fakeClock { return stacktest.NewClock() }

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

// engineMetrics returns what the rig's scraper found of worker id (its
// engine_metrics in GET /workers).
func (s *rig) engineMetrics(id uint64) *engineView {
	s.t.Helper()
	for _, w := range s.cat.Workers(s.key.Model, s.key.Tenant) {
		if w.ID == id {
			if s.sc == nil {
				return nil // no scraper yet: never scraped
			}
			return viewOf(s.sc.Worker(w.WorkerKey))
		}
	}
	s.t.Fatalf("worker %d not in the catalog", id)
	return nil
}

// listed reports whether worker id is in the catalog.
func (s *rig) listed(id uint64) bool {
	return slices.ContainsFunc(s.cat.Workers(s.key.Model, s.key.Tenant), func(w catalog.WorkerState) bool { return w.ID == id })
}

// checkScrapes checks that what every worker shows of its scrapes is
// consistent: values of its own ranks only, and fresh only without an
// error.
func (s *rig) checkScrapes() {
	s.t.Helper()
	for _, w := range s.cat.Workers("", "") {
		em := viewOf(s.sc.Worker(w.WorkerKey))
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
