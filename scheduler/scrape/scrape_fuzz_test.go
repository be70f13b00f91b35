package scrape

import (
	"math"
	"os"
	"testing"
)

// FuzzParsePage feeds engine /metrics pages (outside input) to the parser
// and the rank mapping: no panic, and every value that reaches the cost is
// finite and within its bounds.
func FuzzParsePage(f *testing.F) {
	sample, err := os.ReadFile("testdata/vllm_metrics_dp2.txt")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(sample, uint8(2))
	for _, s := range []string{
		"vllm:num_requests_waiting 3\n",
		"vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 1\nvllm:num_requests_waiting{engine=\"1\",model_name=\"m\"} 2\n",
		"vllm:kv_cache_usage_perc NaN\n", "vllm:kv_cache_usage_perc 1.5\n", "vllm:gpu_cache_usage_perc 0.25\n",
		"vllm:cache_config_info{num_gpu_blocks=\"None\"} 1\nvllm:num_requests_waiting -1\n", "# TYPE x gauge\nx{ 1\n", "",
	} {
		f.Add([]byte(s), uint8(1))
	}
	f.Fuzz(func(t *testing.T, data []byte, nranks uint8) {
		p, err := parsePage(data)
		if err != nil {
			return
		}
		ranks := make([]uint32, int(nranks%8)+1)
		for i := range ranks {
			ranks[i] = uint32(i)
		}
		loads, _ := p.resolve("m", ranks)
		for rank, l := range loads {
			for name, v := range map[string]float64{"waiting": l.Waiting, "running": l.Running, "kv_usage": l.KVUsage, "kv_blocks": l.KVBlocks} {
				if math.IsNaN(v) {
					continue // not reported
				}
				if math.IsInf(v, 0) || v < 0 || name == "kv_usage" && v > 1 {
					t.Fatalf("rank %d: %s = %v from %q", rank, name, v, data)
				}
			}
		}
	})
}
