#!/usr/bin/env node
// Reference side of bench/tokenize: encodes the same documents with the npm package
// `tokenizers` (Hugging Face's Rust core) and reports timings; main.go runs it.
//
//   node ref.js TOKENIZER_JSON DOCS_JSON IDS_OUT PASSES
//
// DOCS_JSON is a JSON array of strings. IDS_OUT receives, for every document, a
// little-endian uint32 count followed by the ids (add_special_tokens=false). Prints one
// JSON line: {"load_ms", "seq_ms": [per pass], "batch_ms": [per pass], "tokens"}.
// seq: one awaited encode() per document. batch: one encodeBatch() over all documents
// (single-threaded when RAYON_NUM_THREADS=1, which main.go sets).
'use strict';
const fs = require('fs');
const { Tokenizer } = require('tokenizers');

async function main() {
  const [file, docsFile, idsOut, passesArg] = process.argv.slice(2);
  const passes = Number(passesArg || 3);
  const docs = JSON.parse(fs.readFileSync(docsFile, 'utf8'));
  let t0 = process.hrtime.bigint();
  const tok = Tokenizer.fromFile(file);
  const loadMs = Number(process.hrtime.bigint() - t0) / 1e6;
  const opts = { addSpecialTokens: false };
  // Warm-up pass (fills the BPE cache, as kvgate's side does), keeping the ids.
  const all = [];
  let tokens = 0;
  for (const d of docs) {
    const ids = (await tok.encode(d, null, opts)).getIds();
    all.push(ids);
    tokens += ids.length;
  }
  const seq = [];
  for (let p = 0; p < passes; p++) {
    t0 = process.hrtime.bigint();
    for (const d of docs) (await tok.encode(d, null, opts)).getIds();
    seq.push(Number(process.hrtime.bigint() - t0) / 1e6);
  }
  const batch = [];
  for (let p = 0; p < passes; p++) {
    t0 = process.hrtime.bigint();
    const encs = await tok.encodeBatch(docs, opts);
    for (const e of encs) e.getIds();
    batch.push(Number(process.hrtime.bigint() - t0) / 1e6);
  }
  let size = 0;
  for (const ids of all) size += 4 + 4 * ids.length;
  const buf = Buffer.alloc(size);
  let off = 0;
  for (const ids of all) {
    buf.writeUInt32LE(ids.length, off); off += 4;
    for (const id of ids) { buf.writeUInt32LE(id, off); off += 4; }
  }
  fs.writeFileSync(idsOut, buf);
  process.stdout.write(JSON.stringify({ load_ms: loadMs, seq_ms: seq, batch_ms: batch, tokens }) + '\n');
}

main().catch((e) => { console.error(e && e.stack || e); process.exit(1); });
