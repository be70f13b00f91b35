package main

import (
	"math/rand/v2"
	"testing"

	"github.com/kvgate/kvgate/tokenize"
)

// TestText: the prompt text comes from the embedded prose (no file outside
// the package), is the same for the same seed, and is about as many tokens
// as asked of the shipped tokenizer (the prompts' sizes depend on it).
func TestText(t *testing.T) {
	words, err := proseWords()
	if err != nil {
		t.Fatal(err)
	}
	gen := func(seed uint64) string {
		b := &bench{words: words, rand: rand.New(rand.NewPCG(seed, 11))}
		return b.text(1000)
	}
	a, b, c := gen(1), gen(1), gen(2)
	if a != b || a == c {
		t.Errorf("seed 1 twice: equal %v; seeds 1 and 2: equal %v", a == b, a == c)
	}
	tk, err := tokenize.Load("../../data/tokenizers/qwen2.5")
	if err != nil {
		t.Fatal(err)
	}
	ids, err := tk.Encode(a, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("text(1000): %d words, %d tokens", len(words), len(ids))
	if len(ids) < 900 || len(ids) > 1100 {
		t.Errorf("text(1000) is %d tokens", len(ids))
	}
}
