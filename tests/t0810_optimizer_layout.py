#!/usr/bin/env python3
"""Reads a checkpoint's optimizer.safetensors the way docs/TRAINING.md says to, and checks
the moments against torch.optim.AdamW run on the same steps (tests/t0810_optimizer_layout.c
writes the checkpoint and the steps' chunk, then runs this script).

    /usr/bin/python3 tests/t0810_optimizer_layout.py CHECKPOINT_DIR MODEL_DIR CHUNK_JSON

What the documentation says, and so what this reader does without looking at lib/model:
  - optimizer.safetensors is a safetensors file: 8 bytes of little-endian header length,
    the JSON header, the data. Its __metadata__ has "format": "arclight-adamw" and "step":
    the optimizer updates done (a string). Two F32 tensors of shape [num_params]:
    "exp_avg" (AdamW's first moment) and "exp_avg_sq" (its second), raw (no bias
    correction).
  - Element i of a moment belongs to element i of the flat parameter vector, which holds
    the tensors of model.safetensors (same directory) as blocks, each row-major, in this
    order: model.embed_tokens.weight; then for each per-layer tensor kind in the order
    input_layernorm.weight, self_attn.q_proj.weight, q_proj.bias, k_proj.weight,
    k_proj.bias, v_proj.weight, v_proj.bias, o_proj.weight, o_proj.bias,
    self_attn.q_norm.weight, self_attn.k_norm.weight, post_attention_layernorm.weight,
    mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight, that kind's tensor
    of layers 0, 1, ..., L-1 one after the other (kinds that model.safetensors lacks take
    no room); then model.norm.weight; then lm_head.weight when model.safetensors has it
    (tied embeddings: the embedding's moments serve both).
  - trainer_state.json gives the optimizer's settings (lr, beta1, beta2, eps,
    weight_decay, grad_clip) and "num_params".
Exit status 0 when every tensor matches, 1 otherwise (with the reason).
"""
import json
import os
import struct
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "model"))
import ref_model as RM  # noqa: E402

LAYER_KINDS = [
    "input_layernorm.weight",
    "self_attn.q_proj.weight", "self_attn.q_proj.bias",
    "self_attn.k_proj.weight", "self_attn.k_proj.bias",
    "self_attn.v_proj.weight", "self_attn.v_proj.bias",
    "self_attn.o_proj.weight", "self_attn.o_proj.bias",
    "self_attn.q_norm.weight", "self_attn.k_norm.weight",
    "post_attention_layernorm.weight",
    "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
]


def read_safetensors_header(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    return header, raw[8 + n:]


def flat_layout(model_header):
    """[(name, shape)] in the order of the flat parameter vector, from model.safetensors."""
    names = {k: v["shape"] for k, v in model_header.items() if k != "__metadata__"}
    layers = 0
    while any(f"model.layers.{layers}.{k}" in names for k in LAYER_KINDS):
        layers += 1
    order = [("model.embed_tokens.weight", names["model.embed_tokens.weight"])]
    for kind in LAYER_KINDS:
        for layer in range(layers):
            name = f"model.layers.{layer}.{kind}"
            if name in names:
                order.append((name, names[name]))
    order.append(("model.norm.weight", names["model.norm.weight"]))
    if "lm_head.weight" in names:
        order.append(("lm_head.weight", names["lm_head.weight"]))
    listed = {n for n, _ in order}
    extra = set(names) - listed
    if extra:
        raise SystemExit(f"model.safetensors has tensors the documented layout lacks: {sorted(extra)}")
    return order


def read_moments(ckpt):
    header, data = read_safetensors_header(os.path.join(ckpt, "optimizer.safetensors"))
    meta = header.get("__metadata__", {})
    if meta.get("format") != "arclight-adamw":
        raise SystemExit(f"optimizer.safetensors: format {meta.get('format')!r}, want arclight-adamw")
    out = {}
    for name in ("exp_avg", "exp_avg_sq"):
        t = header[name]
        if t["dtype"] != "F32" or len(t["shape"]) != 1:
            raise SystemExit(f"{name}: dtype {t['dtype']} shape {t['shape']}, want F32 [num_params]")
        b, e = t["data_offsets"]
        out[name] = np.frombuffer(data[b:e], dtype="<f4")
        if out[name].size != t["shape"][0]:
            raise SystemExit(f"{name}: {out[name].size} values for shape {t['shape']}")
    return out, int(meta["step"])


def torch_moments(model_dir, chunk, state, steps):
    """torch.optim.AdamW on the same steps: SFT token-mean loss on the chunk, 1-D tensors
    without weight decay, the configured gradient clipping, constant learning rate."""
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    model = RM.CausalLM(cfg)
    model.load_state_dict(RM.load_safetensors(os.path.join(model_dir, "model.safetensors")))
    o = state["optimizer"]
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": o["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=o["lr"], betas=(o["beta1"], o["beta2"]), eps=o["eps"])
    tokens = torch.tensor(chunk["tokens"], dtype=torch.long)
    cu = chunk["cu_seqlens"]
    mask = torch.tensor(chunk["mask"], dtype=torch.float32)
    positions = torch.cat([torch.arange(cu[i + 1] - cu[i]) for i in range(len(cu) - 1)])
    for _ in range(steps):
        opt.zero_grad()
        logp = torch.log_softmax(model(tokens, positions, cu), dim=-1)
        total, n = 0.0, 0.0
        for i in range(len(cu) - 1):
            b, e = cu[i], cu[i + 1]
            # row t predicts token t + 1; the mask is the predicted token's
            lp = logp[b:e - 1].gather(1, tokens[b + 1:e, None])[:, 0]
            total = total - (lp * mask[b + 1:e]).sum()
            n += float(mask[b + 1:e].sum())
        (total / n).backward()
        if o["grad_clip"] > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), o["grad_clip"])
        opt.step()
    named = {}
    for name, p in model.named_parameters():
        st = opt.state[p]
        named[name] = (st["exp_avg"].detach().numpy(), st["exp_avg_sq"].detach().numpy())
    return named


def main():
    ckpt, model_dir, chunk_path = sys.argv[1:4]
    with open(os.path.join(ckpt, "trainer_state.json")) as f:
        state = json.load(f)
    with open(chunk_path) as f:
        chunk = json.load(f)
    moments, step = read_moments(ckpt)
    model_header, _ = read_safetensors_header(os.path.join(ckpt, "model.safetensors"))
    layout = flat_layout(model_header)
    total = sum(int(np.prod(s)) for _, s in layout)
    bad = []
    if total != moments["exp_avg"].size or total != state["num_params"]:
        raise SystemExit(f"layout covers {total} values; exp_avg has {moments['exp_avg'].size}, "
                         f"num_params is {state['num_params']}")
    if step != state["optimizer_step"] or step != chunk["steps"]:
        bad.append(f"metadata step {step}, optimizer_step {state['optimizer_step']}, "
                   f"steps run {chunk['steps']}")
    want = torch_moments(model_dir, chunk, state, chunk["steps"])
    off, worst = 0, 0.0
    for name, shape in layout:
        n = int(np.prod(shape))
        for k, key in enumerate(("exp_avg", "exp_avg_sq")):
            got = moments[key][off:off + n].reshape(shape)
            ref = want[name][k].reshape(shape)
            scale = float(np.abs(ref).max())
            err = float(np.abs(got - ref).max()) / (scale if scale > 0 else 1.0)
            worst = max(worst, err)
            if not (scale > 0) or err > 2e-3:
                bad.append(f"{name} {key}: max |error| / max |torch| = {err:.3g} (scale {scale:.3g})")
        off += n
    print(f"{len(layout)} tensors, {total} parameters, step {step}: worst relative error "
          f"{worst:.3g}")
    for b in bad:
        print("mismatch:", b)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
