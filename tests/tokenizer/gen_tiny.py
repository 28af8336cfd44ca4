#!/usr/bin/env python3
"""Writes tests/tokenizer/tiny/: a small GPT-2-style byte-level BPE tokenizer (512 ids)
for the tests and for tiny demo models (vocab_size 512).

  python3 tests/tokenizer/gen_tiny.py

ids 0..255 are the 256 single bytes (id = byte value), then 249 merges learned by plain
BPE on the sample text below (words split roughly as GPT-2's regex does), then 7 added
tokens: the ChatML and tool-call markers of Qwen2.5/Qwen3. The chat template is Qwen2.5's
(tests/tokenizer/qwen2_5_chat_template.jinja). Deterministic: the same output every run.
"""
import collections
import json
import os
import re
import unicodedata

HERE = os.path.dirname(os.path.abspath(__file__))
N_MERGES = 249
ADDED = [("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
         ("<tool_call>", False), ("</tool_call>", False), ("<think>", False), ("</think>", False)]

SAMPLE = """
The agent keeps calling an OpenAI-compatible endpoint. The proxy records every call as a
span, and the trainer turns the spans into policy updates with reinforcement learning.
You are a helpful assistant. The user asks a question and the assistant answers it; when
a tool is needed the assistant calls the tool with arguments in JSON and reads the result.
{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}
def main():\n    for i in range(10):\n        print(i * 2)\n    return 0
It's the model's turn; they're sure we'll see what you've done, and I'd say I'm ready.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 3.14159 2026-11-29 12:30:45.
Les élèves étudient à l'école; le café est très bon. Über die Brücke gehen wir schön.
日本語のテキストと中文文本，以及한국어 문장도 있습니다. Привет, как дела? Γειά σου κόσμε.
"""


def bytes_to_unicode():
    bs = list(range(ord('!'), ord('~') + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def words(text):
    # Close enough to GPT-2's pre-tokenizer for learning merges: the reference tokenizer,
    # not this function, decides the test's expected ids.
    out = []
    for m in re.finditer(r"'(?:s|t|re|ve|m|ll|d)| ?[^\W\d_]+| ?\d+| ?[^\s\w]+|\s+", text):
        out.append(m.group(0))
    return out


def main():
    b2u = bytes_to_unicode()
    vocab = {b2u[b]: b for b in range(256)}
    counts = collections.Counter(words(unicodedata.normalize("NFC", SAMPLE)))
    seqs = {w: [b2u[b] for b in w.encode("utf-8")] for w in counts}
    merges = []
    while len(merges) < N_MERGES:
        pairs = collections.Counter()
        for w, c in counts.items():
            s = seqs[w]
            for a, b in zip(s, s[1:]):
                pairs[(a, b)] += c
        if not pairs:
            break
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]
        merged = best[0] + best[1]
        merges.append(list(best))
        vocab.setdefault(merged, len(vocab))
        for w in seqs:
            s, out, i = seqs[w], [], 0
            while i < len(s):
                if i + 1 < len(s) and (s[i], s[i + 1]) == best:
                    out.append(merged)
                    i += 2
                else:
                    out.append(s[i])
                    i += 1
            seqs[w] = out
    assert len(vocab) == 256 + N_MERGES, len(vocab)
    added = []
    for content, special in ADDED:
        added.append({"id": len(vocab) + len(added), "content": content, "single_word": False,
                      "lstrip": False, "rstrip": False, "normalized": False, "special": special})
    tok = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": True},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                           "use_regex": False},
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": False, "vocab": vocab, "merges": merges},
    }
    with open(os.path.join(HERE, "qwen2_5_chat_template.jinja"), encoding="utf-8") as f:
        template = f.read()
    cfg = {
        "add_bos_token": False, "add_prefix_space": False, "bos_token": None,
        "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None,
        "clean_up_tokenization_spaces": False, "errors": "replace",
        "model_max_length": 4096, "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer", "chat_template": template,
    }
    out = os.path.join(HERE, "tiny")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False, indent=1)
        f.write("\n")
    with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
