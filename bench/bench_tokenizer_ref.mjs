// Reference side of bench_tokenizer: Hugging Face's tokenizers encoding the same corpus in
// the same chunks, one chunk at a time on one thread: IMPL "rust" is the Rust library
// through its official Node bindings (npm `tokenizers`), "js" the pure-JS port
// (@huggingface/tokenizers). Both pinned in tests/node/package.json.
//   node bench/bench_tokenizer_ref.mjs rust|js TOKENIZER_DIR CORPUS_FILE SECONDS
// Prints one line: "<MB/s warm> <tokens per pass> <checksum of the ids>".
import { createRequire } from "node:module";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(path.join(here, "..", "tests", "node", "package.json"));
const [impl, dir, corpusFile, secondsArg] = process.argv.slice(2);
const seconds = Number(secondsArg || "1");
let encode, encodeAll = null;
if (impl === "rust") {
  // One encodeBatch call per pass (run with RAYON_NUM_THREADS=1, TOKENIZERS_PARALLELISM=false)
  // so that the per-call cost of the async binding does not count against it.
  const tok = require("tokenizers").Tokenizer.fromFile(path.join(dir, "tokenizer.json"));
  encodeAll = async (list) => (await tok.encodeBatch(list, { addSpecialTokens: false })).map((e) => e.getIds());
} else {
  const { Tokenizer } = require("@huggingface/tokenizers");
  const tok = new Tokenizer(
    JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"))),
    JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"))),
  );
  encode = async (text) => tok.encode(text, { add_special_tokens: false }).ids;
}
const corpus = fs.readFileSync(corpusFile);
// The same chunks as the C side: cut after the last newline at or before 4096 bytes.
const chunks = [];
for (let at = 0; at < corpus.length; ) {
  let end = Math.min(at + 4096, corpus.length);
  if (end < corpus.length) {
    const nl = corpus.lastIndexOf(10, end - 1);
    if (nl >= at) end = nl + 1;
  }
  chunks.push(corpus.subarray(at, end).toString("utf8"));
  at = end;
}
async function pass() {
  let tokens = 0, sum = 0;
  const all = encodeAll ? await encodeAll(chunks) : null;
  for (let k = 0; k < chunks.length; k++) {
    const ids = all ? all[k] : await encode(chunks[k]);
    for (let i = 0; i < ids.length; i++) sum = (sum * 31 + ids[i]) >>> 0;
    tokens += ids.length;
  }
  return [tokens, sum];
}
const [tokens, sum] = await pass(); // warm-up: fills the word cache, as on the C side
let passes = 0;
const t0 = process.hrtime.bigint();
let el = 0;
do {
  await pass();
  passes++;
  el = Number(process.hrtime.bigint() - t0) / 1e9;
} while (el < seconds);
console.log(`${(corpus.length * passes) / el / 1e6} ${tokens} ${sum}`);
