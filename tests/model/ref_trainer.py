#!/usr/bin/env python3
"""PyTorch reference for arclight's training step (lib/model/trainer.c), checked by
tests/t0653_trainer_vs_pytorch.c.

It loads the model engineer's reference Qwen2 model (tests/model/ref-qwen2, built with
tests/model/ref_model.py's torch modules), and runs 3 training steps of 4 chunks each the way
trainer.h describes them, written here independently of the C code:

  - per-token arrays are aligned with the tokens and shifted onto the logits rows that
    predict them (row t predicts token t+1);
  - old logprobs once per step before any update, reference logprobs from a frozen copy of
    the initial weights;
  - chunks split in order into mini-batches, each one AdamW update whose loss is aggregated
    over the mini-batch (ref_losses.policy_loss with the mini-batch's normalizer);
  - 2 PPO epochs; clipping by global norm; torch.optim.AdamW with two parameter groups
    (no weight decay on 1-D tensors) and the warmup + cosine schedule of optim.h.

Loss: PPO with clip-higher, dual clip, truncated IS against rollout logprobs, k3 KL, an
entropy bonus, seq-mean-token-mean. The dump (ref_losses.py's format, magic "ALSS") holds the
chunks, the configuration, the loss and statistics of every step, and the final weights of a
few tensors.

    /usr/bin/python3 tests/model/ref_trainer.py [--out tests/model/ref_trainer.bin]

The dump depends on tests/model/ref-qwen2's weights: regenerate it whenever ref_model.py
rewrites them.
"""
import argparse
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import ref_losses as RL  # noqa: E402
import ref_model as RM  # noqa: E402

MODEL_DIR = os.path.join(HERE, "ref-qwen2")
CFG = dict(kind="ppo", agg="seq-mean-token-mean", eps_low=0.2, eps_high=0.28, dual_clip=3.0,
           tis_cap=2.0, kl="k3", kl_beta=0.05, entropy_coef=0.01, epochs=2, mini_batches=2,
           temperature=1.0, lr=3e-4, beta1=0.9, beta2=0.95, eps=1e-8, wd=0.1, clip=1.0,
           warmup=2, total=12, min_ratio=0.1)
STEPS, CHUNKS = 3, 4
CHECKED_TENSORS = ["model.norm.weight", "model.layers.1.self_attn.q_proj.bias",
                   "model.layers.0.mlp.down_proj.weight", "model.embed_tokens.weight"]


def load_model():
    import json
    with open(os.path.join(MODEL_DIR, "config.json")) as f:
        c = json.load(f)
    m = RM.CausalLM(c)
    m.load_state_dict(RM.load_safetensors(os.path.join(MODEL_DIR, "model.safetensors")))
    return m, c


def make_chunk(g, V, nseq):
    """A packed chunk with token-aligned mask / advantages / rollout logprobs."""
    lens = [int(x) for x in torch.randint(6, 14, (nseq,), generator=g)]
    T = sum(lens)
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32)
    tokens = torch.randint(0, V, (T,), generator=g, dtype=torch.int32)
    mask = torch.zeros(T)
    adv = torch.zeros(T)
    for i, n in enumerate(lens):
        b = int(cu[i])
        p = int(torch.randint(1, n - 2, (1,), generator=g))
        mask[b + p:b + n] = 1.0
        adv[b:b + n] = float(torch.randn(1, generator=g))
    return dict(T=T, cu=cu, tokens=tokens, mask=mask, adv=adv)


def shifted(ch):
    """Targets and per-row arrays: row t predicts token t+1 of the same sequence."""
    T, cu = ch["T"], ch["cu"]
    targets = torch.full((T,), -1, dtype=torch.int32)
    positions = torch.zeros(T, dtype=torch.int32)
    mask = torch.zeros(T)
    adv = torch.zeros(T)
    roll = torch.zeros(T)
    for i in range(len(cu) - 1):
        b, e = int(cu[i]), int(cu[i + 1])
        positions[b:e] = torch.arange(e - b, dtype=torch.int32)
        targets[b:e - 1] = ch["tokens"][b + 1:e]
        mask[b:e - 1] = ch["mask"][b + 1:e]
        adv[b:e - 1] = ch["adv"][b + 1:e]
        roll[b:e - 1] = ch["rollout"][b + 1:e]
    return dict(targets=targets, positions=positions, mask=mask, adv=adv, rollout=roll)


def logprobs(model, ch, sh, temperature):
    logits = model(ch["tokens"], sh["positions"], ch["cu"])
    return RL.logprobs_and_entropy(logits, sh["targets"], temperature)


def train_step(model, ref_model, opt, sched, chunks):
    c = CFG
    shs = [shifted(ch) for ch in chunks]
    mb = min(c["mini_batches"], len(chunks))
    updates = c["epochs"] * mb
    with torch.no_grad():
        olds = [logprobs(model, ch, sh, c["temperature"])[0] if updates > 1 else None
                for ch, sh in zip(chunks, shs)]
        refs = [logprobs(ref_model, ch, sh, c["temperature"])[0] for ch, sh in zip(chunks, shs)]
    sums = dict(tokens=0.0, sum_pg=0.0, sum_kl=0.0, sum_entropy=0.0, sum_ratio=0.0,
                sum_clipped=0.0, sum_dual_clipped=0.0, sum_tis=0.0)
    ratio_max = 0.0
    losses, norms = [], []
    params = [p for p in model.parameters()]
    for _ in range(c["epochs"]):
        for g in range(mb):
            idx = range(g * len(chunks) // mb, (g + 1) * len(chunks) // mb)
            norm = sum(RL.local_norm(shs[i]["mask"], chunks[i]["cu"], c["agg"]) for i in idx)
            opt.zero_grad()
            total = 0.0
            for i in idx:
                lp, ent = logprobs(model, chunks[i], shs[i], c["temperature"])
                old = olds[i] if olds[i] is not None else lp.detach()
                loss, st = RL.policy_loss(c["kind"], lp, old, shs[i]["adv"], shs[i]["mask"],
                                          chunks[i]["cu"], c["eps_low"], c["eps_high"],
                                          c["dual_clip"], c["agg"], rollout_logp=shs[i]["rollout"],
                                          tis_cap=c["tis_cap"], ref_logp=refs[i], kl=c["kl"],
                                          kl_beta=c["kl_beta"], entropy=ent,
                                          entropy_coef=c["entropy_coef"], norm=norm)
                loss.backward()
                total += float(loss)
                for k in sums:
                    sums[k] += st[k]
                ratio_max = max(ratio_max, st["ratio_max"])
            norms.append(RL.clip_grad_norm(params, c["clip"]))
            opt.step()
            sched.step()
            losses.append(total)
    n = sums["tokens"]
    return dict(loss=sum(losses) / len(losses), grad_norm=sum(norms) / len(norms),
                grad_norm_max=max(norms), pg_loss=sums["sum_pg"] / n, kl=sums["sum_kl"] / n,
                entropy=sums["sum_entropy"] / n, clip_frac=sums["sum_clipped"] / n,
                dual_clip_frac=sums["sum_dual_clipped"] / n, ratio_mean=sums["sum_ratio"] / n,
                ratio_max=ratio_max, tis_mean=sums["sum_tis"] / n, tokens=n / c["epochs"],
                updates=len(losses))


STAT_NAMES = ["loss", "grad_norm", "grad_norm_max", "pg_loss", "kl", "entropy", "clip_frac",
              "dual_clip_frac", "ratio_mean", "ratio_max", "tis_mean", "tokens", "updates"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(HERE, "ref_trainer.bin"))
    ap.add_argument("--seed", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(1)
    model, mc = load_model()
    ref_model, _ = load_model()
    for p in ref_model.parameters():
        p.requires_grad_(False)
    V = mc["vocab_size"]
    c = CFG
    f = lambda x: float(RL.f32(x))  # noqa: E731  (the C side keeps hyperparameters in float)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": f(c["wd"])},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=f(c["lr"]), betas=(f(c["beta1"]), f(c["beta2"])), eps=f(c["eps"]))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: RL.lr_lambda(s, c["warmup"], c["total"], "cosine", f(c["min_ratio"])))

    g = torch.Generator().manual_seed(a.seed)
    d = RL.Dump()
    d.add("config", torch.tensor([RL.KINDS.index(c["kind"]), RL.AGGS.index(c["agg"]), c["eps_low"],
                                  c["eps_high"], c["dual_clip"], c["tis_cap"],
                                  RL.KLS.index(c["kl"]), c["kl_beta"], c["entropy_coef"],
                                  c["epochs"], c["mini_batches"], c["temperature"], c["lr"],
                                  c["beta1"], c["beta2"], c["eps"], c["wd"], c["clip"],
                                  c["warmup"], c["total"], c["min_ratio"]], dtype=torch.float32))
    d.add("shape", torch.tensor([STEPS, CHUNKS]))
    for s in range(STEPS):
        chunks = [make_chunk(g, V, 3) for _ in range(CHUNKS)]
        for ch in chunks:  # rollout logprobs near the current policy's
            with torch.no_grad():
                sh = shifted(dict(ch, rollout=torch.zeros(ch["T"])))
                lp, _ = logprobs(model, ch, sh, c["temperature"])
            roll = torch.zeros(ch["T"])
            for i in range(len(ch["cu"]) - 1):
                b, e = int(ch["cu"][i]), int(ch["cu"][i + 1])
                roll[b + 1:e] = lp[b:e - 1]
            ch["rollout"] = roll + 0.2 * torch.randn(ch["T"], generator=g)
        for k, ch in enumerate(chunks):
            for name in ("tokens", "cu", "mask", "adv", "rollout"):
                d.add("step/%d/chunk/%d/%s" % (s, k, name), ch[name])
        st = train_step(model, ref_model, opt, sched, chunks)
        d.add("step/%d/stats" % s, torch.tensor([st[k] for k in STAT_NAMES], dtype=torch.float32))
        print("step %d: loss %.6f grad norm %.4f clip %.3f kl %.5f" %
              (s, st["loss"], st["grad_norm"], st["clip_frac"], st["kl"]))
    state = dict(model.named_parameters())
    for name in CHECKED_TENSORS:
        d.add("final/" + name, state[name].detach())
    d.write(a.out)
    print("wrote %s (%d records)" % (a.out, len(d.records)))


if __name__ == "__main__":
    sys.exit(main())
