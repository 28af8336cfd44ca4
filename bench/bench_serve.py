#!/usr/bin/python3
"""Decode throughput of `arclight serve` against PyTorch 1.13 CPU generation with a KV cache,
on the same weights, in the same run.

For each model (the tiny test model and a ~100M-parameter Qwen2), `arclight model init` writes
random weights; `arclight serve` serves them and 1 or 16 concurrent /v1/completions requests
(8-token prompt, greedy, ignore_eos, N new tokens) are timed end to end (HTTP included).
The reference is a plain PyTorch Qwen2 decoder (this file) loading the same safetensors and
generating the same N tokens greedily for a batch of 1 or 16 with a preallocated KV cache;
both sides use the same number of threads. Each measurement is the best of --repeat runs
(the machine is shared: the best run is the one least disturbed). Prints tokens/s of each
and the ratio.

    OMP_NUM_THREADS=2 /usr/bin/python3 bench/bench_serve.py --bin build/arclight
"""
import argparse
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def load_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    hdr = json.loads(data[8:8 + n])
    out = {}
    for name, t in hdr.items():
        if name == "__metadata__":
            continue
        assert t["dtype"] == "F32", t["dtype"]
        b, e = t["data_offsets"]
        arr = np.frombuffer(data, dtype=np.float32, count=(e - b) // 4, offset=8 + n + b)
        out[name] = torch.from_numpy(arr.copy()).view(*t["shape"])
    return out


class TorchQwen2:
    """Qwen2 decoder for generation: [B, T] tokens in, KV cache (L, B, NKV, max, HD)."""

    def __init__(self, cfg, w):
        self.c = cfg
        self.w = w
        self.C, self.NH, self.NKV = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
        self.HD = cfg.get("head_dim", self.C // self.NH)
        self.L, self.eps = cfg["num_hidden_layers"], cfg["rms_norm_eps"]
        self.inv_freq = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, self.HD, 2, dtype=torch.float32) / self.HD))
        self.lm_head = w.get("lm_head.weight", w["model.embed_tokens.weight"])

    def rms(self, x, wt):
        return wt * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))

    def rope(self, x, pos):  # x (B, H, T, HD)
        f = pos[:, None].float() * self.inv_freq[None, :]
        emb = torch.cat([f, f], dim=-1)
        cos, sin = emb.cos(), emb.sin()
        x1, x2 = x[..., : self.HD // 2], x[..., self.HD // 2:]
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin

    def forward(self, tok, p0, kc, vc):
        B, T = tok.shape
        w, HD, NH, NKV = self.w, self.HD, self.NH, self.NKV
        x = w["model.embed_tokens.weight"][tok]
        pos = torch.arange(p0, p0 + T)
        for l in range(self.L):
            pre = f"model.layers.{l}."
            h = self.rms(x, w[pre + "input_layernorm.weight"])
            q = torch.nn.functional.linear(h, w[pre + "self_attn.q_proj.weight"], w[pre + "self_attn.q_proj.bias"])
            k = torch.nn.functional.linear(h, w[pre + "self_attn.k_proj.weight"], w[pre + "self_attn.k_proj.bias"])
            v = torch.nn.functional.linear(h, w[pre + "self_attn.v_proj.weight"], w[pre + "self_attn.v_proj.bias"])
            q = self.rope(q.view(B, T, NH, HD).transpose(1, 2), pos)
            k = self.rope(k.view(B, T, NKV, HD).transpose(1, 2), pos)
            kc[l, :, :, p0:p0 + T] = k
            vc[l, :, :, p0:p0 + T] = v.view(B, T, NKV, HD).transpose(1, 2)
            K = kc[l, :, :, : p0 + T].repeat_interleave(NH // NKV, dim=1)
            V = vc[l, :, :, : p0 + T].repeat_interleave(NH // NKV, dim=1)
            s = q @ K.transpose(-1, -2) / math.sqrt(HD)
            if T > 1:
                mask = torch.ones(T, p0 + T, dtype=torch.bool).tril(diagonal=p0)
                s = s.masked_fill(~mask, float("-inf"))
            a = (torch.softmax(s, dim=-1) @ V).transpose(1, 2).reshape(B, T, NH * HD)
            x = x + torch.nn.functional.linear(a, w[pre + "self_attn.o_proj.weight"])
            h = self.rms(x, w[pre + "post_attention_layernorm.weight"])
            g = torch.nn.functional.linear(h, w[pre + "mlp.gate_proj.weight"])
            u = torch.nn.functional.linear(h, w[pre + "mlp.up_proj.weight"])
            x = x + torch.nn.functional.linear(torch.nn.functional.silu(g) * u, w[pre + "mlp.down_proj.weight"])
        x = self.rms(x[:, -1], w["model.norm.weight"])
        return x @ self.lm_head.t()

    @torch.no_grad()
    def generate(self, prompt, B, n):
        kc = torch.zeros(self.L, B, self.NKV, len(prompt) + n, self.HD)
        vc = torch.zeros_like(kc)
        tok = torch.tensor([prompt] * B)
        logits = self.forward(tok, 0, kc, vc)
        out = [logits.argmax(-1)]
        p = len(prompt)
        for _ in range(n - 1):
            logits = self.forward(out[-1][:, None], p, kc, vc)
            p += 1
            out.append(logits.argmax(-1))
        return torch.stack(out, 1)


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def serve_tps(url, prompt, conc, n):
    res = [None] * conc

    def one(i):
        res[i] = post(url + "/v1/completions", {"prompt": prompt, "max_tokens": n, "temperature": 0,
                                                "ignore_eos": True, "return_token_ids": True})

    ths = [threading.Thread(target=one, args=(i,)) for i in range(conc)]
    t0 = time.perf_counter()
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    dt = time.perf_counter() - t0
    got = sum(len(r["choices"][0]["token_ids"]) for r in res)
    assert got == conc * n, got
    return got / dt, res[0]["choices"][0]["token_ids"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "arclight"))
    ap.add_argument("--models", default="tiny,100m")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--tokens-100m", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    threads = int(os.environ.get("OMP_NUM_THREADS", "2"))
    torch.set_num_threads(threads)
    cfgs = {"tiny": os.path.join(ROOT, "tests", "model", "tiny-qwen2.json"),
            "100m": os.path.join(HERE, "bench_serve_100m.json")}
    tmp = tempfile.mkdtemp(prefix="bench-serve-")
    prompt = [11, 22, 33, 44, 55, 66, 77, 88]
    print(f"decode tokens/s, {threads} threads, 8-token prompt, greedy, best of {a.repeat}; arclight over "
          f"HTTP vs PyTorch {torch.__version__} in-process")
    try:
        for name in a.models.split(","):
            d = os.path.join(tmp, name)
            subprocess.run([a.bin, "model", "init", "--config", cfgs[name], "--seed", "1", "--out", d],
                           check=True, stdout=subprocess.DEVNULL)
            with open(os.path.join(d, "config.json")) as f:
                cfg = json.load(f)
            w = load_safetensors(os.path.join(d, "model.safetensors"))
            nparams = sum(t.numel() for t in w.values())
            ref = TorchQwen2(cfg, w)
            n = a.tokens if name == "tiny" else a.tokens_100m
            env = dict(os.environ, OMP_NUM_THREADS=str(threads))
            srv = subprocess.Popen([a.bin, "serve", "--model", d, "--tokenizer", os.path.join(ROOT, "tests", "tokenizer", "tiny"),
                                    "--listen", "127.0.0.1:0", "--max-num-seqs", "64", "--max-kv-mib", "16384",
                                    "--log-level", "warn"], stdout=subprocess.PIPE, env=env)
            url = "http://" + srv.stdout.readline().decode().strip()
            try:
                serve_tps(url, prompt, 1, 4)  # warm up
                ref.generate(prompt, 1, 4)
                for conc in (1, 16):
                    tps, ttps = 0.0, 0.0
                    for _ in range(a.repeat):
                        t, ids = serve_tps(url, prompt, conc, n)
                        tps = max(tps, t)
                        t0 = time.perf_counter()
                        out = ref.generate(prompt, conc, n)
                        ttps = max(ttps, conc * n / (time.perf_counter() - t0))
                    same = sum(int(x == y) for x, y in zip(ids, out[0].tolist()))
                    print(f"  {name:5s} ({nparams / 1e6:6.1f}M params) {conc:2d} sequences x {n} tokens: "
                          f"arclight {tps:8.1f} tok/s, pytorch {ttps:8.1f} tok/s, ratio {tps / ttps:5.2f}x "
                          f"(greedy tokens equal: {same}/{n})")
                    sys.stdout.flush()
            finally:
                srv.terminate()
                srv.wait()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
