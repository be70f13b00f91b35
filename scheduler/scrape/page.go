package scrape

import (
	"bytes"
	"cmp"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvgate/kvgate/scheduler"
)

// This file parses a vLLM /metrics page (the Prometheus text format) and
// resolves its series to a worker's DP ranks.

// series is one series of a page.
type series struct {
	model, engine string
	hasEngine     bool
	value         float64
}

// page is what a /metrics page says of load: the series of each metric
// read, with valid values.
type page struct {
	waiting, running, usage, blocks []series
	invalid                         int // series dropped for their value
}

// Bounds of sane values: a page saying more is wrong, and its values would
// swamp every cost.
const (
	maxRequests = 1e9
	maxBlocks   = 1e12
)

// parsePage parses a page in the Prometheus text format. A page with
// neither waiting requests nor KV cache usage is an error.
func parsePage(data []byte) (*page, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("not a Prometheus text page: %w", err)
	}
	p := new(page)
	valid := func(hi float64) func(float64) bool {
		return func(v float64) bool { return v >= 0 && v <= hi } // false for NaN
	}
	p.waiting = p.samples(mfs[metricWaiting], valid(maxRequests))
	p.running = p.samples(mfs[metricRunning], valid(maxRequests))
	usage := mfs[metricUsage]
	if usage == nil {
		usage = mfs[metricUsageOld]
	}
	p.usage = p.samples(usage, valid(1))
	if mf := mfs[metricCacheConfig]; mf != nil {
		for _, m := range mf.GetMetric() {
			s := labelled(m)
			for _, l := range m.GetLabel() {
				if l.GetName() == "num_gpu_blocks" {
					// "None" until the engine sized its cache: unknown.
					if v, err := strconv.ParseFloat(l.GetValue(), 64); err == nil && v > 0 && v <= maxBlocks {
						s.value = v
						p.blocks = append(p.blocks, s)
					}
				}
			}
		}
	}
	if len(p.waiting) == 0 && len(p.usage) == 0 {
		return nil, fmt.Errorf("no valid %s or %s series", metricWaiting, metricUsage)
	}
	return p, nil
}

// labelled returns m's model_name and engine labels.
func labelled(m *dto.Metric) series {
	var s series
	for _, l := range m.GetLabel() {
		switch l.GetName() {
		case "model_name":
			s.model = l.GetValue()
		case "engine":
			s.engine, s.hasEngine = l.GetValue(), true
		}
	}
	return s
}

// samples returns the series of mf whose value is valid, counting the
// others in p.invalid.
func (p *page) samples(mf *dto.MetricFamily, valid func(float64) bool) []series {
	var out []series
	for _, m := range mf.GetMetric() {
		s := labelled(m)
		switch {
		case m.Gauge != nil:
			s.value = m.GetGauge().GetValue()
		case m.Untyped != nil:
			s.value = m.GetUntyped().GetValue()
		case m.Counter != nil:
			s.value = m.GetCounter().GetValue()
		default:
			s.value = math.NaN()
		}
		if !valid(s.value) {
			p.invalid++
			continue
		}
		out = append(out, s)
	}
	return out
}

// engines returns the engine labels of the page's series, sorted.
func (p *page) engines() []string {
	set := map[string]bool{}
	for _, ss := range [][]series{p.waiting, p.running, p.usage, p.blocks} {
		for _, s := range ss {
			if s.hasEngine {
				set[s.engine] = true
			}
		}
	}
	return slices.Sorted(maps.Keys(set))
}

// resolve returns the loads the page gives the ranks (sorted) of a worker
// of model, by rank, and how many series it dropped because their engine
// is none of the ranks. Series of model are used when there are any, else
// every series. Several series of a rank add up (counts) or give their
// maximum (usage, size); a series without engine label counts for every
// rank without one of its own. A rank without any value is left out.
func (p *page) resolve(model string, ranks []uint32) (map[uint32]scheduler.EngineLoad, int) {
	pick := func(ss []series) []series {
		if slices.ContainsFunc(ss, func(s series) bool { return s.model == model }) {
			return slices.DeleteFunc(slices.Clone(ss), func(s series) bool { return s.model != model })
		}
		return ss
	}
	sets := [4][]series{pick(p.waiting), pick(p.running), pick(p.usage), pick(p.blocks)}
	// Map the engines to ranks: by number, or by position when none is a
	// rank but there are as many as ranks.
	type engine struct {
		label string
		n     uint32
	}
	var engines []engine
	seen := map[string]bool{}
	direct, numeric := false, true
	for _, ss := range sets {
		for _, s := range ss {
			if !s.hasEngine || seen[s.engine] {
				continue
			}
			seen[s.engine] = true
			n, err := strconv.ParseUint(s.engine, 10, 32)
			if err != nil {
				numeric = false
				continue
			}
			engines = append(engines, engine{s.engine, uint32(n)})
			if _, found := slices.BinarySearch(ranks, uint32(n)); found {
				direct = true
			}
		}
	}
	byEngine := map[string]uint32{} // the mapped engines' ranks
	if !direct && numeric && len(engines) == len(ranks) {
		slices.SortFunc(engines, func(a, b engine) int { return cmp.Compare(a.n, b.n) })
		for i, e := range engines {
			byEngine[e.label] = ranks[i]
		}
	} else {
		for _, e := range engines {
			if _, found := slices.BinarySearch(ranks, e.n); found {
				byEngine[e.label] = e.n
			}
		}
	}
	out := make(map[uint32]scheduler.EngineLoad)
	dropped := 0
	for i, ss := range sets {
		perRank := map[uint32]float64{}
		worker, hasWorker := 0.0, false
		add := func(acc *float64, v float64) {
			if i < 2 {
				*acc += v
			} else {
				*acc = max(*acc, v)
			}
		}
		for _, s := range ss {
			switch {
			case !s.hasEngine:
				if !hasWorker {
					worker, hasWorker = s.value, true
				} else {
					add(&worker, s.value)
				}
			default:
				rank, ok := byEngine[s.engine]
				if !ok {
					dropped++
					continue
				}
				acc, had := perRank[rank]
				if !had {
					acc = s.value
				} else {
					add(&acc, s.value)
				}
				perRank[rank] = acc
			}
		}
		for _, rank := range ranks {
			v, ok := perRank[rank]
			if !ok {
				if !hasWorker {
					continue
				}
				v = worker
			}
			l, seen := out[rank]
			if !seen {
				l = unknownLoad()
			}
			switch i {
			case 0:
				l.Waiting = v
			case 1:
				l.Running = v
			case 2:
				l.KVUsage = v
			case 3:
				l.KVBlocks = v
			}
			out[rank] = l
		}
	}
	// A size alone says nothing of load.
	maps.DeleteFunc(out, func(_ uint32, l scheduler.EngineLoad) bool {
		return math.IsNaN(l.Waiting) && math.IsNaN(l.Running) && math.IsNaN(l.KVUsage)
	})
	return out, dropped
}
