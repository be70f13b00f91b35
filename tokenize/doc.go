// Package tokenize turns request text into the token ids the inference engine will see,
// so that kvgate's block hashes match the engine's KV-cache blocks.
//
// It owns:
//
//   - tokenizer.json encoding: a pure-Go reimplementation of the Hugging Face
//     `tokenizers` encode path (added tokens, normalizer, pre-tokenizer, BPE model,
//     post-processor) for the components real models use. [Tokenizer] must produce
//     exactly the ids that `tokenizers` produces; a component it cannot reproduce
//     exactly is refused at load time with an [UnsupportedError] naming it, never
//     approximated.
//   - chat templates: rendering chat messages to a prompt string the way vLLM does
//     (Jinja templates with the transformers environment).
//   - the model registry: which tokenizer and template serve which model name.
//   - fallbacks: what to do when a model's tokenizer is unsupported or missing
//     (tokenize on a worker through vLLM's /tokenize, or an approximate path), rather
//     than route with wrong ids.
//
// It must not touch routing, the KV-block index, or HTTP serving: it maps (model files,
// request text) to token ids. It has no global mutable state (only read-only tables
// built at init); its only network use is the remote-tokenize fallback, as a client. A
// [Tokenizer] is immutable after [Parse] except for its word cache and scratch-buffer
// pool, and is safe for concurrent use.
//
// The reference is `tokenizers` 0.23.2; testdata/golden holds its ids for real and
// synthetic tokenizer files (regenerate with testdata/golden/gen.js). Where Go's
// Unicode 15.0 tables differ from the reference's, the reference wins: letters and
// numbers added in Unicode 15.1-16.0 (Oniguruma), numeric characters and lowercase
// mappings up to 17.0 (Rust), and the older tables of its NF* normalizers (newer
// characters keep their form) are all recorded from the reference and tested code point
// by code point. The known Split patterns (GPT-2, Llama-3, Qwen2) use hand-written
// scanners; any other Split/Replace regex runs on regexp2, whose \p{..} classes are Go's
// Unicode 15.0 and whose \w, \d and \b follow .NET rather than Oniguruma.
//
// Deliberate differences from `tokenizers`: the truncation and padding sections of
// tokenizer.json are ignored (transformers, and therefore vLLM, overrides them per
// call), and text that is not valid UTF-8 is an error (Rust strings cannot hold it).
package tokenize
