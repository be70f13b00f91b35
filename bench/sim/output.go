package sim

import (
	"math"
)

// The simulated model's own output length: how many tokens it generates
// before it samples its end of sequence, for requests that set no
// max_tokens (with max_tokens, the simulator generates exactly that many
// tokens, as a load generator sending ignore_eos wants, so trace replays
// keep the trace's output lengths).
//
// The length is drawn from a lognormal distribution with shape sigma 1
// (outputSigma) and the given mean: its median is mean/sqrt(e), about
// 0.61 x mean, and 90% of the lengths lie between 0.12 and 3.1 x mean.
// With the default mean of 100 tokens the median answer is 61 tokens,
// about 0.35 s of decode steps at speedup 1 with the default timing (5.7
// ms a step on an idle engine), and one in ten is longer than 220 tokens.
// Real chat answers are longer (the Mooncake conversation trace's mean is
// 343 tokens): raise Config.MeanOutputTokens to match a workload.
//
// The draw is a hash of the fleet's seed, the adapter, the prompt's token
// ids and the request's seed, if any: the same request gets the same
// length on every worker, like a model decoding greedily.

// DefaultMeanOutputTokens is Config.MeanOutputTokens's default.
const DefaultMeanOutputTokens = 100

// outputSigma is the lognormal's shape: the standard deviation of the
// length's logarithm.
const outputSigma = 1.0

// outputKey hashes what a request's output length depends on.
func outputKey(seed uint64, lora string, prompt []uint32, reqSeed *int64) uint64 {
	h := mix(seed ^ 0x6f75747075746c65) // "outputle"
	for i := range len(lora) {
		h = mix(h ^ uint64(lora[i]))
	}
	h = mix(h ^ uint64(len(lora)))
	for _, id := range prompt {
		h = mix(h ^ uint64(id))
	}
	if reqSeed != nil {
		h = mix(h ^ 0x73656564 ^ uint64(*reqSeed)) // "seed"
	}
	return h
}

// naturalLength is the output length drawn for key: a lognormal with the
// given mean and shape outputSigma, rounded, at least 1.
func naturalLength(mean float64, key uint64) int {
	// A uniform in (0, 1), never 0 or 1, from the top 53 bits.
	u := (float64(mix(key)>>11) + 0.5) / (1 << 53)
	z := math.Sqrt2 * math.Erfinv(2*u-1) // standard normal quantile
	mu := math.Log(mean) - outputSigma*outputSigma/2
	v := math.Round(math.Exp(mu + outputSigma*z))
	if !(v >= 1) {
		return 1
	}
	if v > math.MaxInt32 {
		return math.MaxInt32
	}
	return int(v)
}
