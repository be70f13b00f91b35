//go:build hftokenizers

// The hftokenizers build tag adds HFTokenizer, which runs Hugging Face's Rust
// `tokenizers` itself through cgo (github.com/daulet/tokenizers). It is for cross-checks
// and for models whose tokenizer.json the pure-Go Tokenizer refuses. Building with it
// needs cgo and the library's static archive, libtokenizers.a, on the linker path (see
// github.com/daulet/tokenizers: `make build` or a release tarball, then e.g.
// CGO_LDFLAGS=-L/path/to/lib).

package tokenize

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	hf "github.com/daulet/tokenizers"
)

// HFTokenizer encodes with Hugging Face's Rust tokenizers. Encode is safe for concurrent
// use; Close must not race with it.
type HFTokenizer struct {
	tk *hf.Tokenizer
}

// LoadHF reads dir/tokenizer.json (or dir/tokenizer.json.gz when tokenizer.json
// does not exist) into the Rust tokenizer.
func LoadHF(dir string) (*HFTokenizer, error) {
	data, path, err := ReadTokenizerJSON(dir)
	if err != nil {
		return nil, err
	}
	tk, err := hf.FromBytes(data)
	if err != nil {
		return nil, fmt.Errorf("%s: tokenizers: %w", path, err)
	}
	return &HFTokenizer{tk: tk}, nil
}

// errNUL: the binding passes text as a C string, which ends at the first NUL byte.
var errNUL = errors.New("tokenize: text contains a NUL byte, which the cgo binding cannot pass")

// Encode returns the token ids of text, like Tokenizer.Encode.
func (h *HFTokenizer) Encode(text string, addSpecialTokens bool) ([]uint32, error) {
	if !utf8.ValidString(text) {
		return nil, errInvalidUTF8
	}
	if strings.IndexByte(text, 0) >= 0 {
		return nil, errNUL
	}
	enc := h.tk.EncodeWithOptions(text, addSpecialTokens)
	if enc.IDs == nil {
		return []uint32{}, nil
	}
	return enc.IDs, nil
}

// VocabSize returns the Rust tokenizer's vocabulary size (with added tokens).
func (h *HFTokenizer) VocabSize() int { return int(h.tk.VocabSize()) }

// Close frees the Rust tokenizer.
func (h *HFTokenizer) Close() error { return h.tk.Close() }
