#!/usr/bin/env python3
"""PyTorch 1.13 side of bench_train_step: the same Qwen2-style model (tests/model/ref_model.py's
modules), the same packed batch and SFT loss, AdamW with clipping; prints the median step time.

    OMP_NUM_THREADS=2 /usr/bin/python3 bench/bench_train_step.py CONFIG.json [--seqlens 256,256]
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "model"))
import ref_model  # noqa: E402


class PerSeqAttention(ref_model.Attention):
    """Attention computed per packed sequence (as a varlen kernel would), not over a T x T mask."""

    def forward(self, x, cos, sin, allowed):
        T = x.shape[0]
        q = self.q_proj(x).view(T, self.NH, self.HD)
        k = self.k_proj(x).view(T, self.NKV, self.HD)
        v = self.v_proj(x).view(T, self.NKV, self.HD)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
        q = q * cos + ref_model.rotate_half(q) * sin
        k = k * cos + ref_model.rotate_half(k) * sin
        rep = self.NH // self.NKV
        k = k.repeat_interleave(rep, dim=0)
        v = v.repeat_interleave(rep, dim=0)
        outs = []
        for b, e in allowed:  # here: the sequence boundaries
            n = e - b
            s = (q[:, b:e] @ k[:, b:e].transpose(-1, -2)) / math.sqrt(self.HD)
            causal = torch.ones(n, n, dtype=torch.bool).tril()
            s = s.masked_fill(~causal, float("-inf"))
            outs.append(torch.softmax(s, dim=-1) @ v[:, b:e])
        out = torch.cat(outs, dim=1).transpose(0, 1).reshape(T, self.NH * self.HD)
        return self.o_proj(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("--seqlens", default="256,256")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    with open(a.config) as f:
        c = json.load(f)
    ref_model.Attention = PerSeqAttention  # Layer builds this class
    torch.manual_seed(1)
    model = ref_model.CausalLM(c)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith(".bias"):
                p.zero_()
            else:
                p.normal_(0, 0.02)
    lens = [int(x) for x in a.seqlens.split(",")]
    T, V = sum(lens), c["vocab_size"]
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    tokens = torch.randint(0, V, (T,))
    positions = torch.cat([torch.arange(n) for n in lens])
    targets = torch.full((T,), -1, dtype=torch.long)
    for i in range(len(lens)):
        targets[cu[i]:cu[i + 1] - 1] = tokens[cu[i] + 1:cu[i + 1]]
    mask = (targets >= 0).float()
    bounds = [(cu[i], cu[i + 1]) for i in range(len(lens))]
    hd = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    nparams = sum(p.numel() for p in model.parameters())

    def forward():
        cos, sin = ref_model.rope_cos_sin(positions, hd, c["rope_theta"])
        x = model.model.embed_tokens(tokens)
        for layer in model.model.layers:
            x = layer(x, cos, sin, bounds)
        x = model.model.norm(x)
        w = model.model.embed_tokens.weight if model.tied else model.lm_head.weight
        return x @ w.t()

    times = []
    for it in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        logits = forward()
        logp = torch.log_softmax(logits, -1).gather(-1, targets.clamp(min=0)[:, None]).squeeze(-1)
        loss = -(logp * mask).sum() / mask.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if it >= a.warmup:
            times.append(time.perf_counter() - t0)
    ms = 1e3 * statistics.median(times)
    print("pytorch %s: %d params, T=%d (%d sequences), loss %.4f, step %.1f ms, %d threads"
          % (torch.__version__, nparams, T, len(lens), float(loss), ms, torch.get_num_threads()))
    print("PYTORCH_STEP_MS %.3f" % ms)


if __name__ == "__main__":
    main()
