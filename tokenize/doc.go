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
//     (its request handling, the special tokens and the template registry of a model
//     directory); the Jinja templates themselves run on package jinja, the interpreter
//     of transformers' Jinja environment.
//   - the model registry: which tokenizer and template serve which model name.
//   - fallbacks: what to do when a model's tokenizer is unsupported or missing
//     (tokenize on a worker through vLLM's /tokenize, or an approximate path), rather
//     than route with wrong ids.
//
// It must not touch routing, the KV-block index, or HTTP serving: it maps (model files,
// request text) to token ids. It has no global mutable state (only read-only tables
// built at init); its only network use is the remote-tokenize fallback, as a client. A
// [Tokenizer] is immutable after [Parse] except for its caches (words, and segments
// when enabled) and scratch-buffer pool, and is safe for concurrent use.
//
// Segment cache: [Tokenizer.WithSegmentCache] (on by default in the [Registry], 64 MiB
// per loaded tokenizer) keeps the ids of the text between added tokens, so that the
// earlier turns of a multi-turn chat prompt, which repeat verbatim between special
// tokens such as <|im_start|> or <|eot_id|>, are not encoded again. It never changes
// the ids. Like `tokenizers` (AddedVocabulary::extract_and_normalize), Encode first
// cuts the raw text on the non-normalized added tokens, then normalizes, cuts on the
// normalized added tokens, pre-tokenizes and runs the model on each piece between
// them on its own: no normalizer (Strip, Prepend, NF*, Replace, ...), pre-tokenizer
// (ByteLevel's prefix space, Metaspace, Split, ...) or BPE step sees another piece,
// and the word cache maps a word to fixed ids. A piece's ids are therefore a function
// of its text and of one bit of context, whether it starts the input (Metaspace's
// prepend_scheme "first" prepends only there), and the cache key is that pair, so every
// tokenizer kvgate loads is cache-eligible. The cut itself (leftmost-longest matching,
// single_word, lstrip, rstrip) is recomputed on the whole text of every call, the
// post-processor runs on the whole result, a segment that fails to encode is never
// stored, and BPE dropout, the one random component, is refused at load. Entries are
// private copies, copied out on a hit; the cache is sharded, evicts with CLOCK and
// never accounts more than its byte budget.
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
