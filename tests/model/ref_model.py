#!/usr/bin/env python3
"""PyTorch reference for arclight's model (lib/model/model.c), checked by
tests/t0600_model_vs_pytorch.c.

For each reference config (Qwen2: q/k/v biases, tied embeddings; Qwen3: q/k norms, head_dim
!= hidden/heads, untied LM head) this script

  1. draws random weights (seeded) and writes them with its own safetensors writer to
     tests/model/ref-<name>/model.safetensors, with a config.json next to them;
  2. builds the same decoder in plain torch modules with Hugging Face's parameter names and
     Hugging Face's Qwen2/Qwen3 math (rotate_half RoPE, RMSNorm in f32, GQA by repeat_kv,
     SiLU-gated MLP, scale 1/sqrt(head_dim));
  3. runs one packed micro-batch of three sequences (attention block-diagonal and causal,
     positions restarting at 0) and records logits, per-token logprobs and entropies of the
     next tokens, the PPO loss of tests/model/ref_losses.py (clip-higher, entropy bonus) and
     the gradient of every parameter;
  4. runs 10 AdamW updates (warmup + cosine, clipping at norm 1, weight decay) on the SFT loss
     of the same batch and records the loss before each update and after the last.

Usage (Debian's torch, not the python3 first on PATH):

    /usr/bin/python3 tests/model/ref_model.py --regenerate
    /usr/bin/python3 tests/model/ref_model.py --forward MODEL_DIR --out LOGITS.bin
        (loads an arclight-written model strictly by HF names; t0600 compares the logits)

Dump format (little-endian), the record layout of ref_losses.py under its own magic:
magic u32 0x444D4C41 ("ALMD"), version u32 (1), record count u32, then records: name_len u32,
name (UTF-8), dtype u32 (0 = f32, 1 = i32), ndim u32, dims u32 * ndim, data.
"""
import argparse
import json
import math
import os
import struct
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import ref_losses  # noqa: E402  (the loss engineer's reference losses and optimizer)

MAGIC = 0x444D4C41
VERSION = 1

CONFIGS = {
    "qwen2": {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
        "vocab_size": 256, "hidden_size": 64, "intermediate_size": 96,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "hidden_act": "silu", "max_position_embeddings": 512, "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0, "rope_scaling": None, "tie_word_embeddings": True,
        "use_sliding_window": False, "bos_token_id": 1, "eos_token_id": 2,
        "torch_dtype": "float32",
    },
    "qwen3": {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        "vocab_size": 256, "hidden_size": 64, "intermediate_size": 96,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 24, "hidden_act": "silu", "max_position_embeddings": 512,
        "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "rope_scaling": None,
        "tie_word_embeddings": False, "attention_bias": False, "bos_token_id": 1,
        "eos_token_id": 2, "torch_dtype": "float32",
    },
}

SEQLENS = [13, 7, 12]   # T = 32 packed tokens
PROMPT = [4, 2, 5]      # leading tokens of each sequence outside the loss mask


# ---------------------------------------------------------------------------------------------
# safetensors, written and read by hand (no safetensors package here)

def save_safetensors(path, tensors):
    header, off, blobs = {"__metadata__": {"format": "pt"}}, 0, []
    for name, t in tensors.items():
        b = t.detach().to(torch.float32).contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def load_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, en = e["data_offsets"]
        raw = bytearray(data[8 + n + b:8 + n + en])
        if e["dtype"] == "F32":
            t = torch.frombuffer(raw, dtype=torch.float32)
        elif e["dtype"] == "BF16":
            t = torch.frombuffer(raw, dtype=torch.bfloat16).float()
        else:
            raise ValueError("%s: dtype %s" % (name, e["dtype"]))
        out[name] = t.reshape(e["shape"]).clone()
    return out


# ---------------------------------------------------------------------------------------------
# The decoder, Hugging Face's Qwen2/Qwen3 math in plain modules

class RMSNorm(torch.nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        dt = x.dtype
        x = x.to(torch.float32)
        var = x.pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(var + self.eps)
        return self.weight * x.to(dt)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rope_cos_sin(positions, head_dim, theta):
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


class Attention(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        C, NH, NKV = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
        HD = c.get("head_dim") or C // NH
        qkv_bias = c["model_type"] == "qwen2" or c.get("attention_bias", False)
        o_bias = c["model_type"] != "qwen2" and c.get("attention_bias", False)
        self.NH, self.NKV, self.HD = NH, NKV, HD
        self.q_proj = torch.nn.Linear(C, NH * HD, bias=qkv_bias)
        self.k_proj = torch.nn.Linear(C, NKV * HD, bias=qkv_bias)
        self.v_proj = torch.nn.Linear(C, NKV * HD, bias=qkv_bias)
        self.o_proj = torch.nn.Linear(NH * HD, C, bias=o_bias)
        self.qk_norm = c["model_type"] == "qwen3"
        if self.qk_norm:
            self.q_norm = RMSNorm(HD, c["rms_norm_eps"])
            self.k_norm = RMSNorm(HD, c["rms_norm_eps"])

    def forward(self, x, cos, sin, allowed):
        T = x.shape[0]
        q = self.q_proj(x).view(T, self.NH, self.HD)
        k = self.k_proj(x).view(T, self.NKV, self.HD)
        v = self.v_proj(x).view(T, self.NKV, self.HD)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)  # (heads, T, HD)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.NH // self.NKV
        k = k[:, None].expand(self.NKV, rep, T, self.HD).reshape(self.NH, T, self.HD)
        v = v[:, None].expand(self.NKV, rep, T, self.HD).reshape(self.NH, T, self.HD)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(self.HD)
        s = s.masked_fill(~allowed, float("-inf"))
        p = torch.softmax(s.float(), dim=-1)
        out = (p @ v).transpose(0, 1).reshape(T, self.NH * self.HD)
        return self.o_proj(out)


class MLP(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        C, I = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = torch.nn.Linear(C, I, bias=False)
        self.up_proj = torch.nn.Linear(C, I, bias=False)
        self.down_proj = torch.nn.Linear(I, C, bias=False)

    def forward(self, x):
        return self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.self_attn = Attention(c)
        self.mlp = MLP(c)
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])

    def forward(self, x, cos, sin, allowed):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, allowed)
        return x + self.mlp(self.post_attention_layernorm(x))


class Inner(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = torch.nn.ModuleList([Layer(c) for _ in range(c["num_hidden_layers"])])
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])


class CausalLM(torch.nn.Module):
    """Qwen2ForCausalLM / Qwen3ForCausalLM on one packed micro-batch (no batch dimension)."""

    def __init__(self, c):
        super().__init__()
        self.c = c
        self.model = Inner(c)
        self.tied = c["tie_word_embeddings"]
        if not self.tied:
            self.lm_head = torch.nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)

    def forward(self, tokens, positions, cu_seqlens):
        T = tokens.shape[0]
        seq = torch.empty(T, dtype=torch.long)
        for i in range(len(cu_seqlens) - 1):
            seq[int(cu_seqlens[i]):int(cu_seqlens[i + 1])] = i
        idx = torch.arange(T)
        allowed = (seq[:, None] == seq[None, :]) & (idx[None, :] <= idx[:, None])
        hd = self.c.get("head_dim") or self.c["hidden_size"] // self.c["num_attention_heads"]
        cos, sin = rope_cos_sin(positions, hd, self.c["rope_theta"])
        x = self.model.embed_tokens(tokens.long())
        for layer in self.model.layers:
            x = layer(x, cos, sin, allowed)
        x = self.model.norm(x)
        w = self.model.embed_tokens.weight if self.tied else self.lm_head.weight
        return x @ w.t()

    def hf_state(self):
        """Hugging Face's state dict: no lm_head.weight when tied."""
        return {k: v for k, v in self.state_dict().items()}


# ---------------------------------------------------------------------------------------------

class Dump:
    def __init__(self):
        self.records = []

    def add(self, name, t):
        t = torch.as_tensor(t).detach()
        if t.dtype in (torch.int32, torch.int64, torch.bool):
            t, code = t.to(torch.int32), 1
        else:
            t, code = t.to(torch.float32), 0
        self.records.append((name, code, list(t.shape), t.contiguous().numpy().tobytes()))

    def write(self, path):
        with open(path, "wb") as f:
            f.write(struct.pack("<III", MAGIC, VERSION, len(self.records)))
            for name, code, shape, data in self.records:
                nb = name.encode()
                f.write(struct.pack("<I", len(nb)) + nb)
                f.write(struct.pack("<II", code, len(shape)))
                f.write(struct.pack("<%dI" % len(shape), *shape))
                f.write(data)


def random_weights(model, seed):
    """Weights big enough that every path matters: attention is far from uniform, norm
    weights and biases are not at their initial 1 and 0."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
            else:
                fan_in = p.shape[1]
                p.copy_(torch.randn(p.shape, generator=g) * (1.5 / math.sqrt(fan_in)))


def make_batch(V, seed):
    g = torch.Generator().manual_seed(seed)
    T = sum(SEQLENS)
    cu = torch.tensor([0] + list(torch.tensor(SEQLENS).cumsum(0)), dtype=torch.int32)
    tokens = torch.randint(0, V, (T,), generator=g, dtype=torch.int32)
    positions = torch.cat([torch.arange(n, dtype=torch.int32) for n in SEQLENS])
    targets = torch.full((T,), -1, dtype=torch.int32)
    mask = torch.zeros(T)
    for i, n in enumerate(SEQLENS):
        b = int(cu[i])
        targets[b:b + n - 1] = tokens[b + 1:b + n]
        mask[b + PROMPT[i]:b + n - 1] = 1.0
    return tokens, positions, cu, targets, mask


EPS_LOW, EPS_HIGH, ENT_COEF = 0.2, 0.28, 0.01
ADAMW = dict(lr=3e-3, beta1=0.9, beta2=0.95, eps=1e-8, wd=0.1, clip=1.0, warmup=2, total=10,
             min_ratio=0.1, steps=10)


def build(name, outdir, seed):
    c = CONFIGS[name]
    torch.manual_seed(seed)
    model = CausalLM(c)
    random_weights(model, seed)
    mdir = os.path.join(outdir, "ref-" + name)
    os.makedirs(mdir, exist_ok=True)
    with open(os.path.join(mdir, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
        f.write("\n")
    save_safetensors(os.path.join(mdir, "model.safetensors"), model.hf_state())
    # Reload what was written, so the reference runs on exactly the stored weights.
    model.load_state_dict(load_safetensors(os.path.join(mdir, "model.safetensors")), strict=True)

    tokens, positions, cu, targets, mask = make_batch(c["vocab_size"], seed + 1)
    T = tokens.shape[0]
    d = Dump()
    hd = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    d.add("config", torch.tensor([c["vocab_size"], c["hidden_size"], c["intermediate_size"],
                                  c["num_hidden_layers"], c["num_attention_heads"],
                                  c["num_key_value_heads"], hd, int(c["tie_word_embeddings"]),
                                  int(c["model_type"] == "qwen3")], dtype=torch.int32))
    for k, v in (("tokens", tokens), ("positions", positions), ("cu_seqlens", cu),
                 ("targets", targets), ("mask", mask)):
        d.add("in/" + k, v)

    # Forward, logprobs, PPO loss with an entropy bonus, backward.
    logits = model(tokens, positions, cu)
    logits.retain_grad()
    logp, ent = ref_losses.logprobs_and_entropy(logits, targets)
    g = torch.Generator().manual_seed(seed + 2)
    while True:  # old logprobs whose ratios stay clear of the clip bounds
        old = logp.detach() + 0.3 * torch.randn(T, generator=g)
        r = torch.exp(logp.detach() - old)[mask > 0]
        if min(float((r - (1 - EPS_LOW)).abs().min()), float((r - (1 + EPS_HIGH)).abs().min())) > 1e-3:
            break
    adv = torch.randn(T, generator=g)
    loss, stats = ref_losses.ppo_loss(logp, old, adv, mask, cu, eps_low=EPS_LOW, eps_high=EPS_HIGH,
                                      entropy=ent, entropy_coef=ENT_COEF)
    loss.backward()
    d.add("in/old_logp", old)
    d.add("in/adv", adv)
    d.add("ppo/hparams", torch.tensor([EPS_LOW, EPS_HIGH, ENT_COEF]))
    d.add("out/logits", logits.detach())
    d.add("out/logp", logp.detach())
    d.add("out/entropy", ent.detach())
    d.add("out/loss", loss.detach().reshape(1))
    d.add("out/dlogits", logits.grad)
    names = []
    for pname, p in model.named_parameters():
        d.add("grad/" + pname, p.grad)
        names.append(pname)
    d.add("grad/count", torch.tensor([len(names)]))

    # 10 AdamW updates on the SFT loss (token-mean NLL of the masked targets).
    h = ADAMW
    f32 = lambda x: float(ref_losses.f32(x))  # noqa: E731  (the C side keeps them in float)
    opt, sched = ref_losses.make_optimizer(list(model.parameters()), f32(h["lr"]),
                                           (f32(h["beta1"]), f32(h["beta2"])), f32(h["eps"]),
                                           f32(h["wd"]), h["warmup"], h["total"], "cosine",
                                           f32(h["min_ratio"]))
    losses, norms = [], []
    for step in range(h["steps"] + 1):
        opt.zero_grad()
        lg = model(tokens, positions, cu)
        lp, _ = ref_losses.logprobs_and_entropy(lg, targets)
        l, _ = ref_losses.sft_loss(lp, mask, cu)
        losses.append(float(l))
        if step == h["steps"]:
            break
        l.backward()
        norms.append(ref_losses.clip_grad_norm(list(model.parameters()), h["clip"]))
        opt.step()
        sched.step()
    d.add("adamw/hparams", torch.tensor([h["lr"], h["beta1"], h["beta2"], h["eps"], h["wd"],
                                         h["clip"], h["warmup"], h["total"], h["min_ratio"],
                                         h["steps"]]))
    d.add("adamw/losses", torch.tensor(losses))
    d.add("adamw/grad_norms", torch.tensor(norms))
    d.write(os.path.join(outdir, "ref-%s.bin" % name))
    print("ref-%s: T=%d loss %.6f, sft losses %.5f -> %.5f, %d parameter tensors" %
          (name, T, float(loss), losses[0], losses[-1], len(names)))


def forward_dir(mdir, out):
    """Loads a model directory written by arclight (config.json + model.safetensors, any
    dtype) the way transformers would, strictly by Hugging Face names, and dumps the logits of
    a fixed packed batch: the check that arclight's checkpoints load unchanged elsewhere."""
    with open(os.path.join(mdir, "config.json")) as f:
        c = json.load(f)
    model = CausalLM(c)
    state = load_safetensors(os.path.join(mdir, "model.safetensors"))
    model.load_state_dict(state, strict=True)
    V = c["vocab_size"]
    tokens = torch.tensor([(t * 37 + 3) % V for t in range(20)], dtype=torch.int32)
    positions = torch.tensor(list(range(12)) + list(range(8)), dtype=torch.int32)
    cu = torch.tensor([0, 12, 20], dtype=torch.int32)
    with torch.no_grad():
        logits = model(tokens, positions, cu)
    d = Dump()
    d.add("in/tokens", tokens)
    d.add("in/positions", positions)
    d.add("in/cu_seqlens", cu)
    d.add("out/logits", logits)
    d.write(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--regenerate", action="store_true",
                    help="rewrite tests/model/ref-*/ and tests/model/ref-*.bin")
    ap.add_argument("--out", default=HERE, help="directory to write into (default: tests/model)")
    ap.add_argument("--seed", type=int, default=6)
    ap.add_argument("--forward", metavar="DIR",
                    help="load an arclight model directory and write its logits of a fixed "
                         "batch to --out (a file)")
    a = ap.parse_args()
    if a.forward:
        torch.set_num_threads(1)
        forward_dir(a.forward, a.out)
        return
    if not a.regenerate and a.out == HERE:
        ap.error("pass --regenerate to rewrite the committed reference (or --out DIR)")
    torch.set_num_threads(1)
    for i, name in enumerate(sorted(CONFIGS)):
        build(name, a.out, a.seed + 100 * i)


if __name__ == "__main__":
    main()
