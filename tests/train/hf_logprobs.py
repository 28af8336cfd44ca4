"""Loads a checkpoint directory the way vLLM and SGLang do (Hugging Face transformers'
AutoConfig, AutoTokenizer and AutoModelForCausalLM.from_pretrained) and prints, as one JSON
line, what the C test compares with `arclight serve` on the same weights:
  {"transformers": version, "torch": version, "architecture": ..., "dtype": ...,
   "text_ids": the tokenizer's ids of --text, "logprobs": log p(token t | tokens < t) for
   every token after the prompt (--prompt ids, then --gen ids)}
Exit status 2 with the reason on stderr when the directory does not load.

usage: hf_logprobs.py DIR --prompt 1,2,3 --gen 4,5 --text "hello world"
"""
import argparse
import json
import sys

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer


def ids(s):
    return [int(x) for x in s.split(",") if x]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--prompt", type=ids, required=True)
    ap.add_argument("--gen", type=ids, required=True)
    ap.add_argument("--text", default="hello world")
    a = ap.parse_args()
    try:
        cfg = AutoConfig.from_pretrained(a.dir)
        tok = AutoTokenizer.from_pretrained(a.dir)
        model = AutoModelForCausalLM.from_pretrained(a.dir, dtype=torch.float32)
    except Exception as e:  # the reason is the test's message
        print(f"{a.dir} does not load in transformers: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    model.eval()
    seq = a.prompt + a.gen
    with torch.no_grad():
        logits = model(torch.tensor([seq])).logits[0].double()
    lp = torch.log_softmax(logits, dim=-1)
    out = [lp[len(a.prompt) - 1 + g, seq[len(a.prompt) + g]].item() for g in range(len(a.gen))]
    print(json.dumps({
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "architecture": type(model).__name__,
        "model_type": cfg.model_type,
        "dtype": str(next(model.parameters()).dtype),
        "text_ids": tok.encode(a.text, add_special_tokens=False),
        "logprobs": out,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
