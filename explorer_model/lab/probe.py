"""Gradients at initialization (Xiong et al. 2020, Fig. 3; Liu et al. 2020's amplification): for fresh models of
each variant, the gradient norm of every layer's FFN output weight, the residual RMS per layer, and how far the
output moves after one Adam step. Training data are random tokens with Zipf-law frequencies (like words in text),
so the probe needs neither the corpus nor a tokenizer and takes a few seconds."""
from __future__ import annotations

import time
from dataclasses import asdict
from typing import Callable

import torch

from ..analysis.measures import token_loss
from ..model import LlamaModel
from .variants import VARIANTS, LabOptions, variant_model

SWEEP_DEPTHS = (2, 4, 8, 12, 24, 48)  # the "against depth" curves (doubling, to fit the time budget)


# --------------------------------------------------------------------------- gradients at initialization
def zipf_tokens(vocab: int, batch: int, seq: int, exponent: float, seed: int) -> torch.Tensor:
    """[batch, seq + 1] token ids, independent draws with P(rank r) ∝ 1 / r^exponent."""
    gen = torch.Generator().manual_seed(10_000 + seed)
    p = torch.arange(1, vocab + 1, dtype=torch.float64).pow(-exponent)
    return torch.multinomial(p / p.sum(), batch * (seq + 1), replacement=True, generator=gen).view(batch, seq + 1)


def lm_loss(model: LlamaModel, tokens: torch.Tensor) -> torch.Tensor:
    """Next-token loss of every row of tokens [batch, seq + 1] (inputs :-1, targets 1:)."""
    return token_loss(model(tokens[:, :-1]), tokens[:, 1:])


def probe(variant: str, depth: int, opts: LabOptions, seed: int) -> dict:
    """One fresh model: loss, per-layer ‖∇W_down‖, per-layer residual RMS, and the RMS change of the
    logits after one Adam step on the blocks' weights (embeddings and unembedding held fixed)."""
    tokens = zipf_tokens(opts.vocab, opts.batch, opts.seq, opts.zipf, seed)
    with variant_model(variant, depth, opts, seed) as model:
        resid: list[torch.Tensor] = []
        keep = [(f"blocks.{i}.hook_resid_post", lambda x, hp: resid.append(x.detach())) for i in range(depth)]
        with model.hooks(keep):
            logits = model(tokens[:, :-1])
        loss = token_loss(logits, tokens[:, 1:])
        loss.backward()
        grads = [blk.mlp.down_proj.weight.grad.norm().item() for blk in model.blocks]
        # Adam's first step moves every weight by lr·g/(|g| + eps): a step of fixed size per weight.
        opt = torch.optim.Adam(model.blocks.parameters(), lr=opts.probe_lr)
        opt.step()
        with torch.no_grad():
            after = model(tokens[:, :-1])
        change = (after - logits.detach()).pow(2).mean().sqrt().item()
    return {"loss": loss.item(), "grad_down": grads,
            "resid_rms": [r.pow(2).mean().sqrt().item() for r in resid], "output_change": change}


def init_gradients(opts: LabOptions = LabOptions(), depth: int = 12, depths=SWEEP_DEPTHS, variants=VARIANTS,
                   sweep_seeds: int = 2, progress: Callable[[float, str], None] | None = None,
                   probe_fn: Callable[[str, int, LabOptions, int], dict] | None = None) -> dict:
    """The probe for every variant: at `depth` averaged over opts.seeds initializations (seed0, seed0+1, …),
    and at every depth of `depths` averaged over the first `sweep_seeds` of them (reused where they overlap).

    Returns {"options", "depth", "depths", "seeds",
             "profile": {variant: {"grad_down": per layer, "grad_down_seeds": [per seed: per layer],
                                   "resid_rms": per layer, "ratio_seeds": per seed}},
             "sweep": {variant: {"last_grad", "first_grad", "output_change", "loss": per depth}}, "seconds"}.
    Gradient norms are averaged over seeds layer by layer (the expected norm that the papers describe).
    `probe_fn` replaces `probe` (the lab's worker passes one that keeps its results); `progress(fraction, message)`
    runs between probes.
    """
    probe_fn = probe_fn or probe
    t0 = time.perf_counter()
    seeds = [opts.seed0 + k for k in range(opts.seeds)]
    sweep_s = seeds[:max(1, min(sweep_seeds, len(seeds)))]
    depths = sorted(set(depths))
    jobs = [(v, depth, s) for v in variants for s in seeds]
    jobs += [(v, d, s) for d in depths for v in variants for s in sweep_s if (d, s) not in {(depth, x) for x in seeds}]
    total = sum(d for _, d, _ in jobs)  # cost is about proportional to layers
    done, runs = 0, {}
    for v, d, s in jobs:
        runs[v, d, s] = probe_fn(v, d, opts, s)
        done += d
        if progress:
            progress(done / total, f"{v} · {d} layers · seed {s}")
    profile, sweep = {}, {}
    for v in variants:
        prof = [runs[v, depth, s] for s in seeds]
        profile[v] = {"grad_down": _mean_lists([r["grad_down"] for r in prof]),
                      "grad_down_seeds": [r["grad_down"] for r in prof],
                      "ratio_seeds": [last_first_ratio(r["grad_down"]) for r in prof],
                      "resid_rms": _mean_lists([r["resid_rms"] for r in prof])}
        per = {d: [runs[v, d, s] for s in sweep_s] for d in depths}
        sweep[v] = {"last_grad": [_mean([r["grad_down"][-1] for r in per[d]]) for d in depths],
                    "first_grad": [_mean([r["grad_down"][0] for r in per[d]]) for d in depths],
                    "output_change": [_mean([r["output_change"] for r in per[d]]) for d in depths],
                    "loss": [_mean([r["loss"] for r in per[d]]) for d in depths]}
    return {"options": asdict(opts), "depth": depth, "depths": depths, "seeds": seeds, "sweep_seeds": sweep_s,
            "profile": profile, "sweep": sweep, "seconds": round(time.perf_counter() - t0, 2)}


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _mean_lists(rows: list[list[float]]) -> list[float]:
    return [sum(col) / len(col) for col in zip(*rows)]


def last_first_ratio(grads: list[float]) -> float:
    """‖∇W_down‖ of the last layer over the first: > 1 means gradients grow toward the output."""
    return grads[-1] / grads[0]


def profile_ratio(result: dict, variant: str) -> float:
    return last_first_ratio(result["profile"][variant]["grad_down"])
