#!/usr/bin/env python3
"""The PyTorch side of tests/gpu/run.sh's benchmark, on the same machine in the same run.

  torch_ref.py train  --mode eager|compile [--layers N] [--tokens T] [--seqs S] [--steps N]
      fwd + bwd + AdamW of transformers' Qwen2 (the Qwen2.5-0.5B shape bench_gpu trains),
      bf16 weights, SDPA attention, on a (S, T/S) batch: the same tokens and FLOPs as
      bench_gpu's packed micro-batch of S sequences.
  torch_ref.py decode --model DIR --batch B [--prompt P] [--new N]
      transformers' generate (greedy, KV cache) on the weights bench_gpu saved in DIR.

Prints one "result ..." line like bench_gpu (same FLOP count, same peak).
"""
import argparse
import time

import torch

PEAK_BF16 = 989e12


def qwen_config(layers):
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                       num_hidden_layers=layers, num_attention_heads=14, num_key_value_heads=2,
                       max_position_embeddings=32768, rope_theta=1e6, rms_norm_eps=1e-6,
                       tie_word_embeddings=True, attn_implementation="sdpa")


def matrix_params(layers):
    C, I, Q, KV, V = 896, 4864, 14 * 64, 2 * 64, 151936
    return layers * (C * Q + 2 * C * KV + Q * C + 3 * C * I) + V * C


def train(a):
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(1)
    cfg = qwen_config(a.layers)
    model = Qwen2ForCausalLM(cfg).to(device="cuda", dtype=torch.bfloat16)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.01)
    S, L = a.seqs, a.tokens // a.seqs
    ids = torch.randint(0, cfg.vocab_size, (S, L), device="cuda")
    fwd = torch.compile(model) if a.mode == "compile" else model

    def step():
        out = fwd(input_ids=ids, labels=ids)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return out.loss

    t_compile = time.time()
    for _ in range(3 if a.mode == "compile" else 2):
        step()
    torch.cuda.synchronize()
    t_compile = time.time() - t_compile
    t0 = time.time()
    for _ in range(a.steps):
        loss = step()
    torch.cuda.synchronize()
    dt = (time.time() - t0) / a.steps
    attn = 3.0 * a.layers * 4.0 * 64 * 14 * (L + 1) / 2.0
    flops = (6.0 * matrix_params(a.layers) + attn) * a.tokens
    print(f"result bench=train device=torch-{a.mode} tokens={a.tokens} seqs={S} step_s={dt:.4f} "
          f"tokens_per_s={a.tokens / dt:.0f} tflops={flops / dt / 1e12:.1f} "
          f"mfu={flops / dt / PEAK_BF16:.4f} warmup_s={t_compile:.1f} loss={loss.item():.5f}",
          flush=True)


def decode(a):
    from transformers import Qwen2ForCausalLM

    try:
        model = Qwen2ForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16)
    except TypeError:
        model = Qwen2ForCausalLM.from_pretrained(a.model, torch_dtype=torch.bfloat16)
    model = model.to("cuda").eval()
    V = model.config.vocab_size
    ids = torch.tensor([[(t * 131 + i * 7919) % V for t in range(a.prompt)] for i in range(a.batch)],
                       device="cuda")
    mask = torch.ones_like(ids)
    with torch.no_grad():
        model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=4, min_new_tokens=4,
                       do_sample=False, pad_token_id=0)
        torch.cuda.synchronize()
        t0 = time.time()
        model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=a.new,
                       min_new_tokens=a.new, do_sample=False, pad_token_id=0)
        torch.cuda.synchronize()
        dt_all = time.time() - t0
        # prefill alone, to leave it out as bench_gpu does
        t0 = time.time()
        model(input_ids=ids, attention_mask=mask)
        torch.cuda.synchronize()
        dt_pre = time.time() - t0
    dt = max(dt_all - dt_pre, 1e-9)
    print(f"result bench=decode device=transformers-generate batch={a.batch} prompt={a.prompt} "
          f"new={a.new} tokens_per_s={a.batch * a.new / dt:.1f} step_ms={dt / a.new * 1e3:.3f}",
          flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["train", "decode"])
    ap.add_argument("--mode", default="eager", choices=["eager", "compile"])
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--seqs", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--model")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=128)
    a = ap.parse_args()
    train(a) if a.what == "train" else decode(a)


if __name__ == "__main__":
    main()
