// Package jinja is kvgate's interpreter of the Jinja dialect Hugging Face chat templates
// are written in: jinja2 3.1 as transformers configures it for apply_chat_template (an
// ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, the loopcontrols
// extension, the {% generation %} tag of its AssistantTracker, and the raise_exception
// and strftime_now globals and tojson filter it adds), over values with Python's
// semantics (None, bool, int of any size, float, str, list, tuple, ordered dict,
// jinja2's Undefined) and CPython's str methods, operators and formatting.
//
// It owns parsing a template ([Parse]), rendering it with variables ([Template.Render])
// and the values it renders with ([Value], [DecodeJSON] with the semantics of Python's
// json.loads). It must not touch chat semantics (messages, tools, special tokens, the
// request handling of vLLM and transformers: package tokenize) or tokenization. It has
// no global mutable state (only tables built at init); a [Template] is immutable and
// safe for concurrent use.
//
// Outputs and error messages are Python's byte for byte, checked against jinja2 by
// testdata/jinja_golden.json (written by tokenize/testdata/templates/gen.py, which
// also checks whole chat templates through package tokenize). builtins.go lists what is
// left out. Unlike Python, a render is bounded: macro recursion to 200 levels, loop
// iterations and macro calls to 5,000,000, and the output to 64 MiB; and it does not
// panic: an exception the template raises is an [*Error], and a fault of the
// interpreter is recovered as an error.
//
// Why kvgate has its own interpreter (github.com/nikolalohinski/gonja/v2 v2.9.1 was
// evaluated first):
//
//   - Speed: gonja rendered the qwen2.5 template in 45 µs and the qwen3 template in
//     218 µs per 4-message render on this machine before any compatibility layer
//     (reflection-based values, per-render context and renderer copies), against a
//     budget of 50 µs including request decoding.
//   - Fidelity: gonja conflates None and undefined in its core value type ({{ none }}
//     prints "", "a" ~ none gives "a", "none is defined" is false, "1 is false" is true),
//     decodes JSON numbers as float64 (1 prints 1.0), orders Go maps, makes str.replace
//     require count, prints tuples as lists and escapes HTML in tojson. The None/undefined
//     conflation is in Value itself and cannot be fixed from filters, tests or globals.
package jinja
