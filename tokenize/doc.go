// Package tokenize turns request text into the token ids the inference engine will see,
// so that kvgate's block hashes match the engine's KV-cache blocks.
//
// It owns:
//
//   - tokenizer.json encoding: a pure-Go reimplementation of the Hugging Face `tokenizers`
//     encode path (added tokens, normalizer, pre-tokenizer, BPE model, post-processor) for
//     the components real models use. [Tokenizer] must produce exactly the ids that
//     `tokenizers` produces; anything it cannot reproduce exactly is refused at load time
//     with an [UnsupportedError] naming the component, never approximated.
//   - chat templates: rendering chat messages to a prompt string the way vLLM does
//     (Jinja templates with the transformers environment).
//   - the model registry: which tokenizer and template serve which model name.
//   - fallbacks: what to do when a model's tokenizer is unsupported or missing (callers
//     route without prefix-cache affinity rather than with wrong ids).
//
// It must not touch routing, the KV-block index, or HTTP serving: it is a pure function
// library from (model files, request text) to token ids, with no network access and no
// global mutable state. A [Tokenizer] is immutable after [Parse] except for its internal
// word cache and scratch-buffer pool, and is safe for concurrent use.
//
// Deliberate differences from `tokenizers`: the truncation and padding sections of
// tokenizer.json are ignored (transformers, and therefore vLLM, disables them per call),
// and text that is not valid UTF-8 is an error (Rust strings cannot hold it).
package tokenize
