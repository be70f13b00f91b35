package scheduler

import "math"

// MaxTokens is the largest token count a request may carry (its prompt,
// prefill or cached tokens): 2^32, far above any model's context. Loads
// refuses a booking above it (ErrInvalid) and the HTTP routes answer 400.
// With every request within it, a rank's sum of active prefill needs 2^31
// active requests to overflow; sums saturate at math.MaxInt64 regardless,
// so that a loaded rank never looks idle.
const MaxTokens = 1 << 32

// addTokens returns a+b for non-negative a and b, saturating at
// math.MaxInt64 instead of wrapping.
func addTokens(a, b int64) int64 {
	if b > 0 && a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// subTokens returns a-b for non-negative a and b, floored at 0: after a
// saturated sum the parts taken out may add up to more than it holds.
func subTokens(a, b int64) int64 {
	return max(0, a-b)
}
