package tokenize

import (
	"runtime/debug"
	"testing"

	"github.com/kvgate/kvgate/internal/fixture"
)

// skipUnderRace skips an allocation count under the race detector, which
// makes sync.Pool drop items on purpose.
func skipUnderRace(t *testing.T) {
	t.Helper()
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "-race" && s.Value == "true" {
				t.Skip("allocation counts are meaningless under the race detector")
			}
		}
	}
}

// TestAppendEncodeAllocs checks that a warm AppendEncode into a large enough dst
// allocates nothing.
func TestAppendEncodeAllocs(t *testing.T) {
	skipUnderRace(t)
	if testing.Short() {
		t.Skip("allocation counts need a quiet run")
	}
	texts := goldenTexts(t)
	text := texts[len(texts)-1] // the long mixed text
	names := []string{"llama3", "qwen2.5", "llama2", "phi3", "phi2"}
	fixture.Families(t, names...)
	for _, name := range names {
		tk := loadReal(t, name)
		dst, err := tk.AppendEncode(nil, text, true)
		if err != nil {
			t.Fatal(err)
		}
		allocs := testing.AllocsPerRun(20, func() {
			dst, _ = tk.AppendEncode(dst[:0], text, true)
		})
		if allocs > 0 {
			t.Errorf("%s: AppendEncode allocates %.1f times per call", name, allocs)
		}
	}
}

// TestSegmentCacheHitAllocs checks that a multi-turn chat whose segments are all
// cached encodes without allocating (only a miss stores, and allocates, an entry).
func TestSegmentCacheHitAllocs(t *testing.T) {
	skipUnderRace(t)
	if testing.Short() {
		t.Skip("allocation counts need a quiet run")
	}
	for _, s := range cacheSubjects(t) {
		if s.chat == nil {
			continue
		}
		tk := s.ref.WithSegmentCache(SegmentCacheOptions{MaxBytes: DefaultSegmentCacheBytes})
		text, err := s.chat.Render(chatRequest(t, requestK(conversation(3, 6, 800, 1200), 6)))
		if err != nil {
			t.Fatal(err)
		}
		dst, err := tk.AppendEncode(nil, text, false)
		if err != nil {
			t.Fatal(err)
		}
		allocs := testing.AllocsPerRun(20, func() {
			dst, _ = tk.AppendEncode(dst[:0], text, false)
		})
		if allocs > 0 {
			t.Errorf("%s: a fully cached AppendEncode allocates %.1f times per call", s.name, allocs)
		}
		if st := tk.SegmentCacheStats(); st.Hits == 0 {
			t.Errorf("%s: no hits: %+v", s.name, st)
		}
	}
}
