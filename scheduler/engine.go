package scheduler

import (
	"math"
	"time"

	"github.com/kvgate/kvgate/indexer"
)

// This file is the cost's correction by the load engines report
// (CostOptions.MetricsWeight): what a decision reads of it (EngineReports,
// which scheduler/scrape's Scraper keeps from the engines' vLLM /metrics
// pages) and the correction itself (costing.engineExtra).

// EngineLoad is the load one DP rank's engine reported. A value it did not
// report is NaN.
type EngineLoad struct {
	Waiting float64 // vllm:num_requests_waiting
	Running float64 // vllm:num_requests_running
	// KVUsage is vllm:kv_cache_usage_perc: the fraction (0..1) of the KV
	// cache's blocks in use.
	KVUsage float64
	// KVBlocks is the KV cache's size in blocks: vllm:cache_config_info's
	// num_gpu_blocks label.
	KVBlocks float64
}

// EngineReport is an engine's load as a decision reads it: it counts until
// Until.
type EngineReport struct {
	EngineLoad
	Until time.Time
}

// EngineReports are where decisions read the loads engines report, for
// CostOptions.MetricsWeight (scheduler/scrape's Scraper keeps them).
type EngineReports interface {
	// ReadReports calls f once with the reports of key's ranks (nil when
	// none), which stay unchanged during the call and must not be kept
	// after it.
	ReadReports(key indexer.Key, f func(map[indexer.WorkerRank]EngineReport))
}

// engineExtra returns the metrics correction of rl's cost (see
// CostOptions.MetricsWeight): the load rl's engine reported, in the
// cost's units, beyond the load tracked locally, times the weight; 0
// when rl was not scraped, or its scrape failed or is stale. It is
// never negative, nor NaN, and does not depend on the prompt's blocks
// held by rl, so that a cost bound without it (costing.cold, a bounded
// candidate) stays a bound with it.
func (k *costing) engineExtra(rl *rankLoad) float64 {
	e, ok := k.eng[rl.wr]
	if !ok || !k.now.Before(e.Until) {
		return 0
	}
	b := k.reqBlocks
	reported := 0.0
	if e.Waiting > 0 { // false for NaN
		reported += (k.w + 1) * e.Waiting * b
	}
	switch {
	case e.KVUsage >= 0 && e.KVBlocks > 0:
		reported += e.KVUsage * e.KVBlocks
	case e.Running > 0:
		reported += e.Running * b
	}
	tracked := k.w*float64(rl.prefill)/float64(k.bs) + float64(rl.blocks()) + rl.output
	if !(reported > tracked) {
		return 0
	}
	return min(k.mw*(reported-tracked), math.MaxFloat64) // finite
}
