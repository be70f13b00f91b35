//go:build hftokenizers

package tokenize

import (
	"slices"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/fixture"
)

// TestHFTokenizerMatches cross-checks the pure-Go Tokenizer against the Rust library
// (cgo) on the golden texts of every real tokenizer.
func TestHFTokenizerMatches(t *testing.T) {
	texts := goldenTexts(t)
	for _, name := range realFamilies {
		t.Run(name, func(t *testing.T) {
			tk := loadReal(t, name)
			hft, err := LoadHF(fixture.Family(t, name))
			if err != nil {
				t.Fatal(err)
			}
			defer hft.Close()
			for _, text := range texts {
				if strings.IndexByte(text, 0) >= 0 {
					continue // the binding cannot pass NUL bytes
				}
				for _, add := range []bool{false, true} {
					want, err := hft.Encode(text, add)
					if err != nil {
						t.Fatal(err)
					}
					got, err := tk.Encode(text, add)
					if err != nil {
						t.Fatal(err)
					}
					if !slices.Equal(got, want) {
						t.Errorf("Encode(%q, %v)\n got %v\nwant %v", short(text), add, got, want)
					}
				}
			}
		})
	}
}
