#!/usr/bin/env python3
"""PyTorch reference for arclight's losses and optimizer (lib/model/logprob.c, loss.c, optim.c).

Importable: the model's reference script calls these functions to get the loss of a full model
and its gradients. Every function takes float32 tensors of per-token values of one packed chunk
(T tokens) and `cu_seqlens` (nseq + 1 offsets, 0 ... T); masks are 0/1 float tensors.

    logp, ent = logprobs_and_entropy(logits, targets, temperature=1.0)
    loss, stats = policy_loss("ppo", logp, old_logp, adv, mask, cu_seqlens,
                              eps_low=0.2, eps_high=0.28, dual_clip=3.0, agg="token-mean")
    loss, stats = ppo_loss(logp, old_logp, adv, mask, cu_seqlens, 0.2, 0.2, 0.0, "token-mean")
    loss, stats = sft_loss(logp, mask, cu_seqlens, agg="token-mean")

The definitions (and the tie rule: a ratio exactly on a clip bound is not clipped) are the ones
written in lib/model/loss.h. Comparisons use torch.where on explicit conditions, never
torch.max/min, whose gradient at ties is split in half.

Script mode writes the binary dump that tests/t0650_loss_vs_pytorch.c checks:

    /usr/bin/python3 tests/model/ref_losses.py [--out tests/model/ref_losses.bin] [--seed 1]

Dump format (little-endian): magic u32 0x53534C41 ("ALSS"), version u32 (1), record count u32,
then records: name_len u32, name (UTF-8), dtype u32 (0 = f32, 1 = i32), ndim u32, dims u32 *
ndim, data.
"""
import argparse
import math
import struct
import sys

import torch

LOG_RATIO_CLAMP = 20.0
KINDS = ["ppo", "gspo", "cispo", "sft"]
AGGS = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"]
KLS = ["k1", "k2", "k3"]


def f32(x):
    """x rounded to float32, as a 0-d tensor (the C side keeps its hyperparameters in float)."""
    return torch.tensor(x, dtype=torch.float32)


def logprobs_and_entropy(logits, targets, temperature=1.0):
    """Per-token log-softmax probability of the target and entropy, of softmax(logits / tau).

    Targets < 0 mean "no target": logp 0 there. Both outputs keep the graph to logits."""
    z = logits.float() / f32(temperature)
    logsm = torch.log_softmax(z, dim=-1)
    safe = targets.long().clamp(min=0)
    logp = logsm.gather(-1, safe.unsqueeze(-1)).squeeze(-1)
    logp = torch.where(targets >= 0, logp, torch.zeros_like(logp))
    p = logsm.exp()
    entropy = -(p * logsm).sum(-1)
    return logp, entropy


def seq_ids(cu_seqlens, T):
    """Sequence index of every token."""
    ids = torch.empty(T, dtype=torch.long)
    for i in range(len(cu_seqlens) - 1):
        ids[int(cu_seqlens[i]):int(cu_seqlens[i + 1])] = i
    return ids


def local_norm(mask, cu_seqlens, agg):
    """The chunk's aggregation normalizer: masked tokens, or sequences with a masked token."""
    if agg == "token-mean":
        return float(mask.double().sum())
    n = 0
    for i in range(len(cu_seqlens) - 1):
        if float(mask[int(cu_seqlens[i]):int(cu_seqlens[i + 1])].sum()) > 0:
            n += 1
    return float(n)


def aggregate(per_tok, mask, cu_seqlens, agg, norm=None):
    """Aggregates per-token losses over the masked tokens (loss.h). norm: the whole batch's
    normalizer when this chunk is part of a bigger step; None = this chunk alone."""
    if agg not in AGGS:
        raise ValueError("unknown aggregation %r (expected one of %s)" % (agg, ", ".join(AGGS)))
    if norm is None:
        norm = local_norm(mask, cu_seqlens, agg)
    if norm <= 0:
        return (per_tok * 0).sum()
    if agg == "token-mean":
        return (per_tok * mask).sum() / norm
    total = per_tok.new_zeros(())
    for i in range(len(cu_seqlens) - 1):
        b, e = int(cu_seqlens[i]), int(cu_seqlens[i + 1])
        m = mask[b:e]
        msum = float(m.sum())
        if msum <= 0:
            continue
        s = (per_tok[b:e] * m).sum()
        total = total + (s / msum if agg == "seq-mean-token-mean" else s)
    return total / norm


def clipped_surrogate(r, adv, lo, hi, dual_clip):
    """max(-A r, -A clip(r, lo, hi)), capped at -A c for A < 0 when dual_clip c > 1.
    Returns (loss, clipped mask, dual-clipped mask)."""
    unclipped = -adv * r
    hit = ((adv > 0) & (r > hi)) | ((adv < 0) & (r < lo))
    bound = torch.where(adv > 0, hi.expand_as(adv), lo.expand_as(adv))
    loss = torch.where(hit, -adv * bound, unclipped)
    dual = torch.zeros_like(hit)
    if dual_clip > 0:
        cap = -adv * f32(dual_clip)
        dual = (adv < 0) & (loss > cap)
        loss = torch.where(dual, cap, loss)
    return loss, hit, dual


def kl_estimate(logp, ref_logp, kind):
    """Per-token estimate of KL(policy || reference), d = logp - ref_logp."""
    d = logp - ref_logp
    if kind == "k1":
        return d
    if kind == "k2":
        return 0.5 * d * d
    if kind == "k3":
        dc = d.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        return torch.exp(-dc) + dc - 1.0
    raise ValueError("unknown KL estimator %r (expected k1, k2 or k3)" % (kind,))


def policy_loss(kind, logp, old_logp, adv, mask, cu_seqlens, eps_low=0.2, eps_high=0.2,
                dual_clip=0.0, agg="token-mean", rollout_logp=None, tis_cap=0.0,
                ref_logp=None, kl="k3", kl_beta=0.0, entropy=None, entropy_coef=0.0,
                norm=None):
    """The loss of loss.h for one chunk (a 0-d tensor with the graph to logp / entropy) and a
    dict of statistics (sums over masked tokens, as al_loss_stats)."""
    if kind not in KINDS:
        raise ValueError("unknown policy loss %r (expected one of %s)" % (kind, ", ".join(KINDS)))
    mask = mask.float()
    T = logp.shape[0]
    if old_logp is None:
        old_logp = logp.detach()
    lo = f32(1.0) - f32(eps_low)
    hi = f32(1.0) + f32(eps_high)
    clipped = torch.zeros(T, dtype=torch.bool)
    dual = torch.zeros(T, dtype=torch.bool)
    if kind == "ppo":
        x = (logp - old_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        ratio = torch.exp(x)
        pg, clipped, dual = clipped_surrogate(ratio, adv, lo, hi, dual_clip)
    elif kind == "gspo":
        ids = seq_ids(cu_seqlens, T)
        nseq = len(cu_seqlens) - 1
        d = ((logp - old_logp) * mask).detach().double()
        seq_sum = torch.zeros(nseq, dtype=torch.float64).index_add_(0, ids, d)
        seq_cnt = torch.zeros(nseq, dtype=torch.float64).index_add_(0, ids, mask.double())
        seq_log = torch.where(seq_cnt > 0, seq_sum / seq_cnt.clamp(min=1), torch.zeros_like(seq_sum))
        seq_log = seq_log.float().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        seq_ratio = torch.exp(seq_log)[ids]
        # GSPO-token: value s_i, gradient s_i per token.
        ratio = seq_ratio * torch.exp(logp - logp.detach())
        pg, clipped, dual = clipped_surrogate(ratio, adv, lo, hi, dual_clip)
    elif kind == "cispo":
        x = (logp - old_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        ratio = torch.exp(x).detach()
        w = torch.where(ratio < lo, lo, torch.where(ratio > hi, hi, ratio))
        clipped = (ratio < lo) | (ratio > hi)
        pg = -w * adv * logp
    else:  # sft
        ratio = torch.ones_like(logp)
        pg = -logp
    tis = torch.ones_like(logp)
    if kind != "sft" and tis_cap > 0 and rollout_logp is not None:
        x = (old_logp - rollout_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        e = torch.exp(x)
        tis = torch.where(e > f32(tis_cap), f32(tis_cap), e).detach()
    tok = tis * pg
    klv = torch.zeros_like(logp)
    if ref_logp is not None:
        klv = kl_estimate(logp, ref_logp, kl)
    if kl_beta > 0:
        if ref_logp is None:
            raise ValueError("kl_beta > 0 needs ref_logp")
        tok = tok + f32(kl_beta) * klv
    if entropy_coef != 0:
        if entropy is None:
            raise ValueError("entropy_coef != 0 needs the entropy")
        tok = tok - f32(entropy_coef) * entropy
    loss = aggregate(tok, mask, cu_seqlens, agg, norm)
    m = mask.double()
    ent = entropy.detach().double() if entropy is not None else torch.zeros(T, dtype=torch.float64)
    rd = ratio.detach().double()
    stats = {
        "tokens": float(m.sum()),
        "sum_pg": float((m * pg.detach().double()).sum()),
        "sum_kl": float((m * klv.detach().double()).sum()),
        "sum_entropy": float((m * ent).sum()),
        "sum_ratio": float((m * rd).sum()),
        "sum_clipped": float((m * clipped.double()).sum()),
        "sum_dual_clipped": float((m * dual.double()).sum()),
        "sum_tis": float((m * tis.double()).sum()),
        "ratio_max": float(rd[mask > 0].max()) if float(m.sum()) > 0 else 1.0,
    }
    return loss, stats


def ppo_loss(logp, old_logp, adv, mask, cu_seqlens, eps_low=0.2, eps_high=0.2, dual_clip=0.0,
             agg="token-mean", **kw):
    return policy_loss("ppo", logp, old_logp, adv, mask, cu_seqlens, eps_low, eps_high,
                       dual_clip, agg, **kw)


def gspo_loss(logp, old_logp, adv, mask, cu_seqlens, eps_low=3e-4, eps_high=4e-4,
              agg="seq-mean-token-mean", **kw):
    return policy_loss("gspo", logp, old_logp, adv, mask, cu_seqlens, eps_low, eps_high, 0.0,
                       agg, **kw)


def cispo_loss(logp, old_logp, adv, mask, cu_seqlens, eps_low=1.0, eps_high=0.28,
               agg="token-mean", **kw):
    return policy_loss("cispo", logp, old_logp, adv, mask, cu_seqlens, eps_low, eps_high, 0.0,
                       agg, **kw)


def sft_loss(logp, mask, cu_seqlens, agg="token-mean", **kw):
    return policy_loss("sft", logp, None, None, mask, cu_seqlens, agg=agg, **kw)


# --------------------------------------------------------------------------------------------
# Optimizer: torch.optim.AdamW with the schedule of optim.h and torch's clip_grad_norm_.


def lr_lambda(step, warmup_steps, total_steps, schedule="cosine", min_lr_ratio=0.0):
    """Multiplier of the peak lr for update number `step` (0-based), as al_lr_at."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    span = total_steps - warmup_steps
    p = (step - warmup_steps) / span if span > 0 else 1.0
    p = min(p, 1.0)
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * p))


def make_optimizer(params, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, warmup_steps=0,
                   total_steps=0, schedule="constant", min_lr_ratio=0.0):
    """torch AdamW plus a LambdaLR that gives update s the rate of al_lr_at(s); call
    optimizer.step() then scheduler.step() once per update."""
    opt = torch.optim.AdamW(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: lr_lambda(s, warmup_steps, total_steps, schedule, min_lr_ratio))
    return opt, sched


def clip_grad_norm(params, max_norm):
    """torch's clip_grad_norm_; returns the norm before clipping as a float."""
    return float(torch.nn.utils.clip_grad_norm_(params, max_norm))


# --------------------------------------------------------------------------------------------
# The dump.

MAGIC = 0x53534C41
VERSION = 1


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


# Variants checked by the C test: (name, kind, options). Each runs with every aggregation.
VARIANTS = [
    ("ppo", "ppo", dict(eps_low=0.2, eps_high=0.2)),
    ("ppo_higher_dual", "ppo", dict(eps_low=0.2, eps_high=0.28, dual_clip=1.4)),
    ("ppo_tis_k3_ent", "ppo", dict(eps_low=0.2, eps_high=0.28, tis_cap=1.5, kl="k3", kl_beta=0.1,
                                   entropy_coef=0.01)),
    ("ppo_k1", "ppo", dict(eps_low=0.1, eps_high=0.3, kl="k1", kl_beta=0.05)),
    ("gspo", "gspo", dict(eps_low=0.05, eps_high=0.08)),
    ("gspo_k2_tis", "gspo", dict(eps_low=0.05, eps_high=0.08, kl="k2", kl_beta=0.2, tis_cap=2.0)),
    ("cispo", "cispo", dict(eps_low=1.0, eps_high=0.28)),
    ("cispo_tis_ent", "cispo", dict(eps_low=0.2, eps_high=0.2, tis_cap=1.2, entropy_coef=-0.02)),
    ("sft", "sft", dict()),
]


def make_inputs(seed):
    g = torch.Generator().manual_seed(seed)
    T, V = 64, 48
    seqlens = [14, 22, 8, 20]  # the third sequence has no response token
    cu = torch.tensor([0] + list(torch.tensor(seqlens).cumsum(0)), dtype=torch.int32)
    logits = torch.randn(T, V, generator=g) * 2.0
    targets = torch.randint(0, V, (T,), generator=g, dtype=torch.int32)
    mask = torch.zeros(T)
    prompt = [3, 5, 8, 4]
    for i, L in enumerate(seqlens):
        b = int(cu[i])
        if i != 2:
            mask[b + prompt[i]:b + L - 1] = 1.0
        targets[b + L - 1] = -1  # no next token after a sequence's end
    logits[5, :] += 40.0  # a row with large logits (stability)
    with torch.no_grad():
        lp, _ = logprobs_and_entropy(logits, targets)
    old = lp + 0.3 * torch.randn(T, generator=g)
    rollout = old + 0.2 * torch.randn(T, generator=g)
    ref = lp + 0.2 * torch.randn(T, generator=g)
    adv = torch.randn(T, generator=g)
    return dict(T=T, V=V, cu=cu, logits=logits, targets=targets, mask=mask, old=old,
                rollout=rollout, ref=ref, adv=adv)


def near_bound(kind, opts, inp, logp):
    """True when a ratio lies within 1e-4 of a clip bound: float rounding could then flip the
    branch between C and PyTorch, so such data is re-drawn."""
    lo, hi = 1 - opts.get("eps_low", 0.2), 1 + opts.get("eps_high", 0.2)
    if kind == "sft":
        return False
    if kind == "gspo":
        ids = seq_ids(inp["cu"], inp["T"])
        d = (logp - inp["old"]) * inp["mask"]
        s = torch.zeros(len(inp["cu"]) - 1).index_add_(0, ids, d)
        c = torch.zeros(len(inp["cu"]) - 1).index_add_(0, ids, inp["mask"])
        r = torch.exp(s / c.clamp(min=1))[ids]
    else:
        r = torch.exp(logp - inp["old"])
    r = r[inp["mask"] > 0]
    bounds = [lo, hi] + ([opts["dual_clip"]] if opts.get("dual_clip", 0) > 0 else [])
    return any(float((r - b).abs().min()) < 1e-4 for b in bounds)


def build_dump(seed):
    while True:
        inp = make_inputs(seed)
        with torch.no_grad():
            lp, _ = logprobs_and_entropy(inp["logits"], inp["targets"])
        if not any(near_bound(k, o, inp, lp) for _, k, o in VARIANTS):
            break
        seed += 1000
    d = Dump()
    d.add("seed", torch.tensor([seed]))
    for k in ("cu", "logits", "targets", "mask", "old", "rollout", "ref", "adv"):
        d.add("in/" + k, inp[k])

    # logprobs and entropy, and their backward at temperature 1 and 0.7
    for tau, tag in ((1.0, "t1"), (0.7, "t07")):
        logits = inp["logits"].clone().requires_grad_(True)
        lp, ent = logprobs_and_entropy(logits, inp["targets"], tau)
        g = torch.Generator().manual_seed(seed + 7)
        dlp = torch.randn(inp["T"], generator=g)
        dent = torch.randn(inp["T"], generator=g)
        (lp * dlp + ent * dent).sum().backward()
        d.add("logprob/%s/tau" % tag, torch.tensor([tau]))
        d.add("logprob/%s/logp" % tag, lp)
        d.add("logprob/%s/entropy" % tag, ent)
        d.add("logprob/%s/dlogp" % tag, dlp)
        d.add("logprob/%s/dentropy" % tag, dent)
        d.add("logprob/%s/dlogits" % tag, logits.grad)

    names = []
    for name, kind, opts in VARIANTS:
        for agg in AGGS:
            vname = "%s/%s" % (name, agg)
            names.append(vname)
            logits = inp["logits"].clone().requires_grad_(True)
            lp, ent = logprobs_and_entropy(logits, inp["targets"])
            lp.retain_grad()
            ent.retain_grad()
            loss, st = policy_loss(kind, lp, inp["old"], inp["adv"], inp["mask"], inp["cu"],
                                   agg=agg, rollout_logp=inp["rollout"], ref_logp=inp["ref"],
                                   entropy=ent, **opts)
            loss.backward()
            cfg = [KINDS.index(kind), AGGS.index(agg), opts.get("eps_low", 0.2),
                   opts.get("eps_high", 0.2), opts.get("dual_clip", 0.0), opts.get("tis_cap", 0.0),
                   KLS.index(opts.get("kl", "k3")), opts.get("kl_beta", 0.0),
                   opts.get("entropy_coef", 0.0)]
            d.add("loss/%s/config" % vname, torch.tensor(cfg, dtype=torch.float32))
            d.add("loss/%s/loss" % vname, loss.reshape(1))
            d.add("loss/%s/dlogp" % vname, lp.grad)
            d.add("loss/%s/dentropy" % vname,
                  ent.grad if ent.grad is not None else torch.zeros(inp["T"]))
            d.add("loss/%s/dlogits" % vname, logits.grad)
            d.add("loss/%s/stats" % vname,
                  torch.tensor([st["tokens"], st["sum_pg"], st["sum_kl"], st["sum_entropy"],
                                st["sum_ratio"], st["sum_clipped"], st["sum_dual_clipped"],
                                st["sum_tis"], st["ratio_max"]], dtype=torch.float32))
    d.add("loss/count", torch.tensor([len(names)]))
    for i, vname in enumerate(names):
        d.add("loss/name/%d" % i, torch.tensor(list(vname.encode()), dtype=torch.int32))

    # AdamW: 10 updates of a 64-vector with given gradients, warmup 3 then cosine over 10,
    # clipping at norm 1.0 (the gradients' norms straddle it).
    g = torch.Generator().manual_seed(seed + 11)
    n, steps = 64, 10
    p0 = torch.randn(n, generator=g)
    grads = torch.randn(steps, n, generator=g) * torch.linspace(0.02, 0.3, steps).unsqueeze(1)
    hp = dict(lr=float(f32(3e-2)), beta1=float(f32(0.9)), beta2=float(f32(0.95)),
              eps=float(f32(1e-8)), wd=float(f32(0.1)), clip=1.0, warmup=3, total=10,
              min_ratio=float(f32(0.1)))
    param = torch.nn.Parameter(p0.clone())
    opt, sched = make_optimizer([param], hp["lr"], (hp["beta1"], hp["beta2"]), hp["eps"],
                                hp["wd"], hp["warmup"], hp["total"], "cosine", hp["min_ratio"])
    after, norms, lrs = [], [], []
    for s in range(steps):
        param.grad = grads[s].clone()
        norms.append(clip_grad_norm([param], hp["clip"]))
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
        after.append(param.detach().clone())
    d.add("adamw/hparams", torch.tensor([hp["lr"], hp["beta1"], hp["beta2"], hp["eps"], hp["wd"],
                                         hp["clip"], hp["warmup"], hp["total"], hp["min_ratio"]],
                                        dtype=torch.float32))
    d.add("adamw/p0", p0)
    d.add("adamw/grads", grads)
    d.add("adamw/norms", torch.tensor(norms))
    d.add("adamw/lrs", torch.tensor(lrs))
    d.add("adamw/params", torch.stack(after))
    return d


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/model/ref_losses.bin")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(1)
    d = build_dump(a.seed)
    d.write(a.out)
    print("wrote %s (%d records)" % (a.out, len(d.records)))


if __name__ == "__main__":
    sys.exit(main())
