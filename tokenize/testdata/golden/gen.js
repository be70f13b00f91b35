#!/usr/bin/env node
// Generates the golden token ids that tokenize's tests compare against, using the
// reference implementation: the npm package `tokenizers` 0.23.2 (Hugging Face's Rust
// core with Node bindings).
//
// Rerun (from anywhere; needs Node >= 18 and every family's tokenizer files):
//
//   mkdir -p /tmp/tokref && (cd /tmp/tokref && npm install tokenizers@0.23.2)
//   NODE_PATH=/tmp/tokref/node_modules node tokenize/testdata/golden/gen.js
//
// Optional first argument: the directory holding <family>/tokenizer.json (default
// $KVGATE_TOKENIZERS, the tests' fixture directory described in CONTRIBUTING.md).
//
// It writes, next to this script:
//   texts.json               the input texts (shared by every golden file)
//   fixtures/model_*.json    small BPE models cut from the real files (see below)
//   fixtures/pipelines.json  synthetic tokenizers: normalizer/pre_tokenizer/
//                            post_processor/added_tokens + which model to use
//   unicode_classes.json     the code points the reference treats as letters, numbers
//                            (regex) and numeric (Digits), as [first, last] ranges,
//                            every character its Lowercase normalizer changes, and the
//                            characters its NF* normalizers do not know (norm_unknown)
//   <name>.json              for every real tokenizer and every fixture:
//                            {"name", "wrap": {"prefix", "suffix"}, "cases": [...]}
//                            where a case is {"i": text index, "ids": ids with
//                            add_special_tokens=false} plus "special": the ids with
//                            add_special_tokens=true when they are not
//                            wrap.prefix + ids + wrap.suffix.
// Fixtures are assembled into a tokenizer.json exactly as the Go test does:
//   {"version": "1.0", "truncation": null, "padding": null, "added_tokens": ...,
//    "normalizer": ..., "pre_tokenizer": ..., "post_processor": ...,
//    "decoder": null, "model": <fixtures/model_NAME.json>}
'use strict';

const fs = require('fs');
const path = require('path');
const { Tokenizer } = require('tokenizers');

const outDir = __dirname;
const sharedDir = path.resolve(process.argv[2] || process.env.KVGATE_TOKENIZERS ||
  path.join(__dirname, '../../../../shared/tokenizers'));
const REAL = ['llama3', 'qwen2.5', 'qwen3', 'llama2', 'phi3', 'phi2'];

// ---------------------------------------------------------------------------- texts

function longText() {
  // A few KB of mixed content, deterministic.
  const parts = [
    'Large language models tokenize text into sub-word units. ',
    "It's important that the router's ids match the engine's: one differing token breaks every later block. ",
    'def encode(self, text: str) -> list[int]:\n    """Encode text."""\n    return [self.vocab[t] for t in text.split()]\n\n',
    'func main() {\n\tfmt.Println("hello, 世界")\n\tfor i := 0; i < 10; i++ {\n\t\tx += i * 2\n\t}\n}\n',
    '日本語の文章も含まれます。中文也是。한국어도 있습니다. ',
    'Числа: 1234567, 3.14159, 2,718; даты 2024-12-31. ',
    'مرحبا! هذه جملة عربية مع أرقام ١٢٣. ',
    'Emoji 😀🎉👍🏽 and symbols ∑∫√∞ ≠ ≤ ≥ → ← ™ © ®. ',
    '  Indented   text\twith\ttabs  and   multiple    spaces.  \n\n\n',
    'WINDOWS LINE\r\nENDINGS\r\n\r\nHERE. ',
    "YOU'RE RIGHT, WE'LL SEE; SHE'S HERE AND THEY'VE GONE. I'D SAY I'M SURE. ",
    '<html><body class="main">&nbsp;<p>Paragraph</p></body></html>\n',
    '{"json": [1, 2.5, null, true], "nested": {"k": "v"}}\n',
    'naïve café — résumé… “quoted” ‘single’ «guillemets» ',
  ];
  let s = '';
  for (let i = 0; s.length < 4000; i++) s += parts[(i * 7) % parts.length];
  return s;
}

function mediumText() {
  return "Mixed: It's 2024; we'LL test 12345 numbers, ÉCOLE e\u0301cole ﬁne,\t\ttabs  \n\n" +
    'and CJK 日本語, Arabic مرحبا, emoji 👍🏽! <s> inside, <mask> here, [W] word [W]x, ' +
    'hello world and HELLO   WORLD.  End.\r\n';
}

const TEXTS = [
  '',
  'Hello, world!',
  'The quick brown fox jumps over the lazy dog.',
  "I'm sure you'll see it's what they've done; we'd go, he'd've said.",
  "DON'T SHOUT, SHE'S HERE, WE'LL GO, THEY'RE OUT, I'M IN, WE'VE WON, IT'D BE, He'Ll, iT's, 'Re 'rE 'VE",
  "it'ſ a long s, 'ſ alone, ’s curly ’t quote, ''s double, 's at start",
  'def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n',
  'package main\n\nimport "fmt"\n\nfunc main() {\n\tfmt.Println("hi")\n}\n',
  'a  b   c    d\t\te\n\n\nf \n g\r\n h\r\r\n i  \n  j',
  'line1\r\nline2\r\n\r\nline3\n',
  '   leading and trailing   ',
  ' ',
  '\n',
  '\t',
  '    ',
  ' \n ',
  'x\n\n\n\n',
  'x  \n  \t y',
  '1234567890 3.14159 1,000,000 0.5 -42 +7 1e10 007',
  '١٢٣٤٥ ۱۲۳ ߁߂ 𝟘𝟙𝟚 ½ ¾ Ⅻ ⅳ ① ² 2024-01-01T12:34:56Z',
  'I ❤️ 🦀 and 👨‍👩‍👧‍👦 🇺🇸! 😀😃😄 👍🏽',
  '日本語のテキスト、中文文本。한국어 텍스트',
  'مرحبا بالعالم! هذا نص عربي.',
  'नमस्ते दुनिया, สวัสดีครับ, שלום עולם',
  'Привет, мир! Σίσυφος ΟΔΥΣΣΕΥΣ İstanbul ıi ǅ ß ẞ',
  'e\u0301 vs é, A\u030a vs Å, ﬁ ligature, ｆｕｌｌｗｉｄｔｈ, ㍿ Ⅸ, q\u0307\u0323 \u1e0b\u0323',
  'a\u00a0b\u2003c\u3000d\u2028e\u0085f\u200bg\u180eh\u202fi\u205fj \u00a0 k\u2029l',
  'tab\tand\u000bvertical\u000cform feed',
  '\u0000\u0001\u0007\u001b[31mred\u001b[0m\u007f\u0080\u009f\ufeff\ufffd\ufffe\u001c\u001f',
  '<|begin_of_text|>Hello<|end_of_text|>',
  '<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>',
  '<s>Hi</s> <s> text<s>text </s>',
  '<unk> and <unk><unk>',
  '<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n',
  '<|im_start|><|im_end|><|im_start|>',
  '<<|im_start|>> <|im_start <|im_start|',
  '<think>\nreasoning here\n</think>\n\nThe answer.',
  '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>',
  '<|user|>\nQuestion?<|end|>\n<|assistant|>\nAnswer.<|end|>',
  '<|end|>  x',
  '<|system|>   \n\tsystem prompt<|end|>\n',
  '<|endoftext|>text<|endoftext|> <|endoftext|>',
  'def f():\n        return 1\n\t\t\tx = 2  \t  \n',
  'a' + ' '.repeat(40) + 'b' + '\t'.repeat(12) + 'c',
  '    four\n        eight\n                sixteen',
  'Visit https://example.com/path?q=1&r=2#frag or `code` **bold** _it_ [link](http://x.y)',
  '{"key": [1, 2, 3], "nested": {"a": null, "b": "\\u00e9"}}',
  '∑_{i=1}^{n} x_i² ≤ ∞ ± √2 → ⇒ ∀x∃y',
  'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa',
  '!!!!!!!!!!!!!!!!!!....................??????',
  '00000000000000000000000000000000',
  'Supercalifragilisticexpialidocious'.repeat(12),
  'naïve café résumé coöperate Zürich Ærøskøbing',
  '▁hello ▁ world ▁▁',
  'ĠHello Ċ ĉ',
  '<mask> a <mask>b c<mask> [W] x[W] [W]y hello world HELLO WORLD',
  'İSTANBUL hello   world',
  'x',
  // Letters and digits new in Unicode 15.1-17.0 (CJK Ext. I, Ol Onal, Garay, Kirat Rai,
  // Tangut components): Go 1.26's tables are Unicode 15.0.
  'a\u{2EBF0}\u{2EBF1}b \u{1E5D0}\u{1E5D1}\u{1E5F1}\u{1E5F2} \u{10D40}\u{10D41}\u{10D42}\u{10D43} \u{16D40}x \u{16FF4}7 \u{A7CB}\u{1C89}',
  // Characters the reference's normalization tables predate (Unicode 9-13 era): they
  // keep their form under NF* there.
  'Reiwa \u32ff, \u{1FBF0}\u{1FBF1} \u{1E030}\uA7F2 \u{11935}\u{11930}e\u0301 a\u0301\u1DF6\u0316 \u0D3B\u0301 \uFB01',
  mediumText(),
  longText(),
];

// ----------------------------------------------------------------------- fixtures

function loadReal(name) {
  return JSON.parse(fs.readFileSync(path.join(sharedDir, name, 'tokenizer.json'), 'utf8'));
}

function mergeParts(m) {
  if (Array.isArray(m)) return m;
  const i = m.indexOf(' ');
  return [m.slice(0, i), m.slice(i + 1)];
}

// model_sp: SentencePiece-style char BPE with byte fallback, cut from llama2.
function modelSP(l2) {
  const K = 450;
  const merges = l2.model.merges.slice(0, K).map(mergeParts);
  const want = new Set(['<unk>', '<s>', '</s>']);
  for (let b = 0; b < 256; b++) want.add('<0x' + b.toString(16).toUpperCase().padStart(2, '0') + '>');
  for (const [a, b] of merges) { want.add(a); want.add(b); want.add(a + b); }
  for (const tok of Object.keys(l2.model.vocab)) {
    const cs = [...tok];
    if (cs.length === 1 && tok.codePointAt(0) < 0x250) want.add(tok);
  }
  const toks = [...want].filter((t) => t in l2.model.vocab).sort((a, b) => l2.model.vocab[a] - l2.model.vocab[b]);
  const vocab = {};
  toks.forEach((t, i) => { vocab[t] = i; });
  return {
    type: 'BPE', dropout: null, unk_token: '<unk>', continuing_subword_prefix: null,
    end_of_word_suffix: null, fuse_unk: true, byte_fallback: true, ignore_merges: false,
    vocab, merges: merges.map(([a, b]) => a + ' ' + b),
  };
}

// model_bl: GPT-2 byte-level BPE, cut from phi2.
function modelBL(p2) {
  const K = 450;
  const merges = p2.model.merges.slice(0, K).map(mergeParts);
  const want = new Set(['<|endoftext|>']);
  for (const [tok, id] of Object.entries(p2.model.vocab)) if (id < 256) want.add(tok);
  for (const [a, b] of merges) { want.add(a); want.add(b); want.add(a + b); }
  const toks = [...want].sort((a, b) => p2.model.vocab[a] - p2.model.vocab[b]);
  const vocab = {};
  toks.forEach((t, i) => { vocab[t] = i; });
  return {
    type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null,
    end_of_word_suffix: null, fuse_unk: false, byte_fallback: false,
    vocab, merges: merges.map(([a, b]) => [a, b]),
  };
}

// model_ws: char BPE with continuing_subword_prefix "##" and end_of_word_suffix "</w>".
function modelWS() {
  const vocab = {};
  const add = (t) => { if (!(t in vocab)) vocab[t] = Object.keys(vocab).length; };
  add('<unk>');
  add('[CLS]');
  add('[SEP]');
  for (const c of 'abcdefghijklmnopqrstuvwxyz0123456789') {
    add(c); add('##' + c); add(c + '</w>'); add('##' + c + '</w>');
  }
  const merges = [
    ['t', '##h'], ['th', '##e</w>'], ['##i', '##n'], ['##in', '##g</w>'], ['a', '##n'],
    ['an', '##d</w>'], ['##e', '##r'], ['##er', '##s</w>'], ['h', '##e'], ['he', '##l'],
    ['hel', '##l'], ['hell', '##o</w>'], ['w', '##o'], ['wo', '##r'], ['wor', '##l'],
    ['worl', '##d</w>'], ['##e', '##s'], ['##es', '##t</w>'], ['i', '##s</w>'], ['##o', '##n'],
  ];
  for (const [a, b] of merges) add(a + b.slice(2));
  return {
    type: 'BPE', dropout: null, unk_token: '<unk>', continuing_subword_prefix: '##',
    end_of_word_suffix: '</w>', fuse_unk: false, byte_fallback: false,
    vocab, merges: merges.map(([a, b]) => a + ' ' + b),
  };
}

function modelSPNoFallback(sp, fuse) {
  const vocab = {};
  let n = 0;
  for (const t of Object.keys(sp.vocab).sort((a, b) => sp.vocab[a] - sp.vocab[b])) {
    if (/^<0x[0-9A-F]{2}>$/.test(t)) continue;
    vocab[t] = n++;
  }
  return Object.assign({}, sp, { vocab, fuse_unk: fuse, byte_fallback: false });
}

const AT = (content, o = {}) => Object.assign({
  id: 0, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: false,
}, o);

const SP_ADDED = [
  AT('<unk>', { id: 0, special: true }), AT('<s>', { id: 1, special: true }), AT('</s>', { id: 2, special: true }),
];

const tmpl = (single, specials) => ({
  type: 'TemplateProcessing',
  single: single.map((p) => (p.startsWith('$')
    ? { Sequence: { id: p.slice(1) || 'A', type_id: 0 } }
    : { SpecialToken: { id: p, type_id: 0 } })),
  pair: [],
  special_tokens: Object.fromEntries(Object.entries(specials).map(([k, ids]) => [k, { id: k, ids, tokens: ids.map(() => k) }])),
});

const byteLevel = (aps, re) => ({ type: 'ByteLevel', add_prefix_space: aps, trim_offsets: true, use_regex: re });
const splitRe = (re, behavior, invert = false) => ({ type: 'Split', pattern: { Regex: re }, behavior, invert });
const seq = (...p) => ({ type: 'Sequence', pretokenizers: p });
const nseq = (...n) => ({ type: 'Sequence', normalizers: n });

const DEEPSEEK_RE = "\\p{N}{1,3}|[一-龥\u3040-ゟ゠-ヿ]+|[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+";
const LLAMA_LIKE_RE = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,2}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const GPT2_LIKE_RE = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+ ";

function pipelines() {
  const P = [];
  const add = (name, model, o) => P.push(Object.assign({
    name, model, normalizer: null, pre_tokenizer: null, post_processor: null, added_tokens: SP_ADDED,
  }, o));
  const spAdded = SP_ADDED.concat([
    AT('<mask>', { id: 999, special: true, lstrip: true, rstrip: true }),
    AT('[W]', { single_word: true }),
    AT('hello world', { normalized: true }),
  ]);
  add('sp_metaspace_always', 'sp', {
    pre_tokenizer: { type: 'Metaspace', replacement: '▁', prepend_scheme: 'always', split: true },
    post_processor: tmpl(['<s>', '$A', '</s>'], { '<s>': [1], '</s>': [2] }),
    added_tokens: spAdded,
  });
  add('sp_metaspace_first_nosplit', 'sp', {
    pre_tokenizer: { type: 'Metaspace', replacement: '▁', prepend_scheme: 'first', split: false },
    post_processor: tmpl(['<s>', '$A'], { '<s>': [1] }),
    added_tokens: SP_ADDED.concat([AT('<|x|>', { rstrip: true }), AT('<mask>', { lstrip: true, special: true })]),
  });
  add('sp_metaspace_first_seq', 'sp', {
    normalizer: nseq({ type: 'NFKC' }, { type: 'Prepend', prepend: '«' }, { type: 'Replace', pattern: { String: 'ab' }, content: 'X' }),
    pre_tokenizer: seq(splitRe('\\d+|[,;]', 'Isolated'), { type: 'Metaspace', replacement: '▁', prepend_scheme: 'first', split: true }),
    added_tokens: spAdded,
  });
  add('sp_metaspace_first_digits', 'sp', {
    pre_tokenizer: seq({ type: 'Digits', individual_digits: true }, { type: 'Metaspace', replacement: '▁', prepend_scheme: 'first', split: true }),
    added_tokens: spAdded,
  });
  add('sp_metaspace_never', 'sp', {
    normalizer: { type: 'Lowercase' },
    pre_tokenizer: { type: 'Metaspace', replacement: '▁', prepend_scheme: 'never', split: true },
    added_tokens: spAdded,
  });
  add('sp_metaspace_legacy', 'sp', {
    normalizer: nseq({ type: 'Strip', strip_left: true, strip_right: true }, { type: 'Lowercase' }),
    pre_tokenizer: { type: 'Metaspace', replacement: '▁', add_prefix_space: true, str_rep: '▁' },
    added_tokens: spAdded,
  });
  add('sp_prepend_replace_roberta', 'sp', {
    normalizer: nseq({ type: 'NFKC' }, { type: 'Prepend', prepend: '▁' }, { type: 'Replace', pattern: { String: ' ' }, content: '▁' },
      { type: 'Replace', pattern: { Regex: '▁{2,}' }, content: '▁' }),
    post_processor: { type: 'RobertaProcessing', sep: ['</s>', 2], cls: ['<s>', 1], trim_offsets: true, add_prefix_space: true },
    added_tokens: spAdded,
  });
  add('sp_fuse_unk', 'sp_nofb_fuse', {
    pre_tokenizer: { type: 'Metaspace', replacement: '▁', prepend_scheme: 'always', split: true },
  });
  add('sp_unk_nofuse_bert', 'sp_nofb', {
    pre_tokenizer: { type: 'Metaspace', replacement: '▁', prepend_scheme: 'always', split: false },
    post_processor: { type: 'BertProcessing', sep: ['</s>', 2], cls: ['<s>', 1] },
  });
  add('ws_prefix_suffix', 'ws', {
    normalizer: { type: 'Lowercase' },
    pre_tokenizer: seq(splitRe('\\s+', 'Removed'), { type: 'Digits', individual_digits: false }),
    added_tokens: [AT('<unk>', { id: 0, special: true }), AT('[CLS]', { id: 1, special: true }), AT('[SEP]', { id: 2, special: true })],
    post_processor: tmpl(['[CLS]', '$A', '[SEP]'], { '[CLS]': [1], '[SEP]': [2] }),
  });
  const blAdded = [
    AT('<|endoftext|>', { id: 0, special: true }),
    AT('<mask>', { lstrip: true }),
    AT('[W]', { single_word: true, rstrip: true }),
    AT('hello world', { normalized: true, lstrip: true, rstrip: true }),
    AT('  ', { normalized: true }),
  ];
  add('bl_bytelevel_prefix_regex', 'bl', {
    pre_tokenizer: byteLevel(true, true),
    post_processor: { type: 'Sequence', processors: [byteLevel(true, true), tmpl(['$A', '<|endoftext|>'], { '<|endoftext|>': [0] })] },
    added_tokens: blAdded,
  });
  add('bl_bytelevel_prefix_noregex', 'bl', {
    pre_tokenizer: seq(splitRe('\\s+', 'MergedWithNext'), byteLevel(true, false)),
    post_processor: tmpl(['<|endoftext|>', '$A', '<|endoftext|>'], { '<|endoftext|>': [0, 0] }),
    added_tokens: blAdded,
  });
  add('bl_digits_individual', 'bl', {
    pre_tokenizer: seq({ type: 'Digits', individual_digits: true }, byteLevel(false, true)),
    added_tokens: blAdded,
  });
  add('bl_digits_contiguous', 'bl', {
    pre_tokenizer: seq({ type: 'Digits', individual_digits: false }, { type: 'Split', pattern: { String: ' ' }, behavior: 'MergedWithNext', invert: false }, byteLevel(false, false)),
    added_tokens: blAdded,
  });
  for (const [beh, inv] of [['Removed', false], ['MergedWithPrevious', false], ['MergedWithNext', false], ['Contiguous', false],
    ['Isolated', true], ['Removed', true], ['MergedWithNext', true], ['MergedWithPrevious', true], ['Contiguous', true]]) {
    add('bl_split_' + beh.toLowerCase() + (inv ? '_invert' : ''), 'bl', {
      pre_tokenizer: seq(splitRe('[,.;:!?]+|\\s', beh, inv), byteLevel(false, false)),
      added_tokens: blAdded,
    });
  }
  add('bl_split_string_removed', 'bl', {
    pre_tokenizer: seq({ type: 'Split', pattern: { String: ', ' }, behavior: 'Removed', invert: false }, byteLevel(false, true)),
    added_tokens: blAdded,
  });
  add('bl_split_empty_matches', 'bl', {
    pre_tokenizer: seq(splitRe('x*', 'MergedWithPrevious'), splitRe('(?=[A-Z])', 'MergedWithNext'), byteLevel(false, false)),
    added_tokens: blAdded,
  });
  add('bl_nfkc_replace_regex', 'bl', {
    normalizer: nseq({ type: 'NFKC' }, { type: 'Replace', pattern: { Regex: '\\s+' }, content: ' ' }, { type: 'Lowercase' },
      { type: 'Strip', strip_left: true, strip_right: true }),
    pre_tokenizer: byteLevel(true, true),
    // No "  " token here: Strip would normalize it to an empty pattern, on which
    // tokenizers panics for non-ASCII text (kvgate refuses such a file).
    added_tokens: blAdded.filter((t) => t.content !== '  ').concat([AT('İSTANBUL', { normalized: true }), AT('HELLO', { normalized: false })]),
  });
  add('bl_nfd_nfkd', 'bl', {
    normalizer: nseq({ type: 'NFD' }, { type: 'NFKD' }),
    pre_tokenizer: byteLevel(false, true),
    added_tokens: blAdded,
  });
  add('bl_regexp2_deepseek', 'bl', {
    normalizer: { type: 'NFC' },
    pre_tokenizer: seq(splitRe(DEEPSEEK_RE, 'Isolated'), byteLevel(false, false)),
    added_tokens: blAdded,
  });
  add('bl_regexp2_llama_like', 'bl', {
    pre_tokenizer: seq(splitRe(LLAMA_LIKE_RE, 'Isolated'), byteLevel(false, false)),
    added_tokens: blAdded,
  });
  add('bl_regexp2_gpt2_like', 'bl', {
    pre_tokenizer: seq(splitRe(GPT2_LIKE_RE, 'Isolated'), byteLevel(false, false)),
    added_tokens: blAdded,
  });
  add('bl_ignore_merges', 'bl_ignore', {
    pre_tokenizer: seq(splitRe("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+", 'Isolated'), byteLevel(false, false)),
    post_processor: tmpl(['<|endoftext|>', '$A'], { '<|endoftext|>': [0] }),
    added_tokens: blAdded,
  });
  add('bl_template_two_sequences', 'bl', {
    maxTexts: 12, // every case lists its ids twice
    pre_tokenizer: byteLevel(false, true),
    post_processor: tmpl(['$A', '<|endoftext|>', '$A'], { '<|endoftext|>': [0] }),
    added_tokens: blAdded,
  });
  add('bl_bytelevel_not_last', 'bl', {
    pre_tokenizer: seq(byteLevel(false, true), splitRe('Ġ', 'MergedWithNext')),
    added_tokens: blAdded,
  });
  return P;
}

// ------------------------------------------------------------------------- output

function assemble(p, models) {
  return {
    version: '1.0', truncation: null, padding: null, added_tokens: p.added_tokens,
    normalizer: p.normalizer, pre_tokenizer: p.pre_tokenizer, post_processor: p.post_processor,
    decoder: null, model: models[p.model],
  };
}

function findWrap(withSp, without) {
  for (let i = 0; i + without.length <= withSp.length; i++) {
    let ok = true;
    for (let j = 0; j < without.length && ok; j++) ok = withSp[i + j] === without[j];
    if (ok) return { prefix: withSp.slice(0, i), suffix: withSp.slice(i + without.length) };
  }
  return { prefix: [], suffix: [] };
}

async function golden(name, tok, texts) {
  const plain = [];
  const special = [];
  for (const t of texts) {
    if (process.env.GEN_DEBUG) console.error(name, JSON.stringify(t).slice(0, 60));
    plain.push((await tok.encode(t, null, { addSpecialTokens: false })).getIds());
    special.push((await tok.encode(t, null, { addSpecialTokens: true })).getIds());
  }
  const wrap = findWrap(special[1], plain[1]);
  const cases = texts.map((t, i) => {
    const c = { i: TEXTS.indexOf(t), ids: plain[i] };
    const w = wrap.prefix.concat(plain[i], wrap.suffix);
    if (w.length !== special[i].length || w.some((x, j) => x !== special[i][j])) c.special = special[i];
    return c;
  });
  const out = { name, wrap, cases };
  // One case per line keeps the files diffable.
  const body = '{"name": ' + JSON.stringify(name) + ', "wrap": ' + JSON.stringify(wrap) + ', "cases": [\n' +
    cases.map((c) => JSON.stringify(c)).join(',\n') + '\n]}\n';
  fs.writeFileSync(path.join(outDir, name + '.json'), body);
  return out;
}

// unicodeClasses records which code points the reference treats as \p{L} and \p{N}
// (Oniguruma, through Llama-3's Split regex) and as numeric (Rust's char::is_numeric,
// through the Digits pre-tokenizer), as ranges. Candidates are the code points Node's
// own Unicode tables (a newer Unicode version) call letters or numbers.
function unicodeClasses() {
  const pre = Tokenizer.fromFile(path.join(sharedDir, 'llama3', 'tokenizer.json')).getPreTokenizer();
  const digits = Tokenizer.fromString(JSON.stringify({
    version: '1.0', added_tokens: [], normalizer: null, post_processor: null, decoder: null,
    pre_tokenizer: { type: 'Digits', individual_digits: true }, model: { type: 'BPE', vocab: {}, merges: [] },
  })).getPreTokenizer();
  const sets = { L: [], N: [], numeric: [] };
  const add = (list, cp) => {
    const last = list[list.length - 1];
    if (last && last[1] === cp - 1) last[1] = cp; else list.push([cp, cp]);
  };
  for (let cp = 0; cp <= 0x10ffff; cp++) {
    if (cp >= 0xd800 && cp <= 0xdfff) continue;
    const c = String.fromCodePoint(cp);
    const isL = /\p{L}/u.test(c);
    const isN = /\p{N}/u.test(c);
    if (!isL && !isN) continue;
    // A letter joins its neighbours into one piece ([^\r\n\p{L}\p{N}]?\p{L}+); up to
    // three numbers make one piece (\p{N}{1,3}).
    if (isL && pre.preTokenizeString('a' + c + 'b').length === 1) add(sets.L, cp);
    if (isN && pre.preTokenizeString('1' + c + '1').length === 1) add(sets.N, cp);
    if (isN && digits.preTokenizeString('x' + c + 'y').length === 3) add(sets.numeric, cp);
  }
  // Lowercase: the normalizer maps each character on its own (Rust's
  // char::to_lowercase); record every character it changes.
  const lower = Tokenizer.fromString(JSON.stringify({
    version: '1.0', added_tokens: [], normalizer: { type: 'Lowercase' }, pre_tokenizer: null,
    post_processor: null, decoder: null, model: { type: 'BPE', vocab: {}, merges: [] },
  })).getNormalizer();
  sets.lower = [];
  const batch = [];
  const flush = () => {
    const out = lower.normalizeString(batch.map((cp) => String.fromCodePoint(cp)).join('\n')).split('\n');
    if (out.length !== batch.length) throw new Error('lowercase batch split');
    batch.forEach((cp, i) => { if (out[i] !== String.fromCodePoint(cp)) sets.lower.push([cp, out[i]]); });
    batch.length = 0;
  };
  for (let cp = 0; cp <= 0x10ffff; cp++) {
    if ((cp >= 0xd800 && cp <= 0xdfff) || cp === 10) continue;
    batch.push(cp);
    if (batch.length === 8192) flush();
  }
  flush();
  sets.norm_unknown = normUnknown();
  return sets;
}

// normUnknown returns, as ranges, the characters the reference's normalizers (whose
// Unicode tables predate Node's) treat as unassigned although Node's tables give them a
// decomposition, a non-zero combining class or a part in a composition.
function normUnknown() {
  const mk = (type) => Tokenizer.fromString(JSON.stringify({
    version: '1.0', added_tokens: [], normalizer: { type }, pre_tokenizer: null, post_processor: null,
    decoder: null, model: { type: 'BPE', vocab: {}, merges: [] },
  })).getNormalizer();
  const forms = { NFC: mk('NFC'), NFKC: mk('NFKC'), NFD: mk('NFD'), NFKD: mk('NFKD') };
  const unknown = new Set();
  // Probes for the combining class: ccc(c) is 0 iff neither a ccc-230 mark before c nor
  // a ccc-1 mark after it gets reordered.
  const ccc0 = (nfd, c) => nfd('a\u0301' + c) === 'a\u0301' + c && nfd('a' + c + '\u0334') === 'a' + c + '\u0334';
  const refNFD = (t) => forms.NFD.normalizeString(t);
  const jsNFD = (t) => t.normalize('NFD');
  for (let cp = 0x80; cp <= 0x10ffff; cp++) {
    if (cp >= 0xd800 && cp <= 0xdfff) continue;
    const c = String.fromCodePoint(cp);
    for (const [name, n] of Object.entries(forms)) {
      const ref = n.normalizeString(c);
      if (ref !== c.normalize(name)) {
        if (ref !== c) throw new Error('U+' + cp.toString(16) + ': reference ' + name + ' is not the identity');
        unknown.add(cp);
      }
    }
    if (/\p{M}/u.test(c) && ccc0(refNFD, c) && !ccc0(jsNFD, c)) unknown.add(cp);
    // A composition the reference does not make: its starter (always a character new
    // since the reference's tables) keeps a newer normalizer from composing.
    const d = c.normalize('NFD');
    if (d !== c && forms.NFC.normalizeString(d) !== d.normalize('NFC')) {
      unknown.add(cp);
      unknown.add(d.codePointAt(0));
    }
  }
  const ranges = [];
  for (const cp of [...unknown].sort((a, b) => a - b)) {
    const last = ranges[ranges.length - 1];
    if (last && last[1] === cp - 1) last[1] = cp; else ranges.push([cp, cp]);
  }
  return ranges;
}

async function main() {
  fs.writeFileSync(path.join(outDir, 'texts.json'), JSON.stringify(TEXTS, null, 0).replace(/","/g, '",\n"') + '\n');
  let total = 0;
  for (const name of REAL) {
    const file = path.join(sharedDir, name, 'tokenizer.json');
    const tok = Tokenizer.fromFile(file);
    const g = await golden(name, tok, TEXTS);
    total += g.cases.length;
  }
  const l2 = loadReal('llama2');
  const p2 = loadReal('phi2');
  const sp = modelSP(l2);
  const bl = modelBL(p2);
  const models = {
    sp, bl, ws: modelWS(),
    sp_nofb: modelSPNoFallback(sp, false),
    sp_nofb_fuse: modelSPNoFallback(sp, true),
    bl_ignore: Object.assign({}, bl, { ignore_merges: true }),
  };
  fs.mkdirSync(path.join(outDir, 'fixtures'), { recursive: true });
  for (const [k, m] of Object.entries(models)) {
    fs.writeFileSync(path.join(outDir, 'fixtures', 'model_' + k + '.json'), JSON.stringify(m) + '\n');
  }
  const P = pipelines();
  fs.writeFileSync(path.join(outDir, 'fixtures', 'pipelines.json'), '[\n' + P.map((p) => JSON.stringify(p)).join(',\n') + '\n]\n');
  // Fixtures skip the long text (their tiny vocabularies make it many ids).
  const fixtureTexts = TEXTS.filter((t) => t.length < 1000);
  for (const p of P) {
    const tok = Tokenizer.fromString(JSON.stringify(assemble(p, models)));
    const g = await golden('fixture_' + p.name, tok, fixtureTexts.slice(0, p.maxTexts || fixtureTexts.length));
    total += g.cases.length;
  }
  const uc = unicodeClasses();
  fs.writeFileSync(path.join(outDir, 'unicode_classes.json'), '{\n' + Object.entries(uc).map(([k, v]) => JSON.stringify(k) + ': ' + JSON.stringify(v)).join(',\n') + '\n}\n');
  console.log(`wrote ${REAL.length} real and ${P.length} fixture golden files, ${total} cases, ${TEXTS.length} texts, unicode_classes.json`);
}

main().catch((e) => { console.error(e); process.exit(1); });
