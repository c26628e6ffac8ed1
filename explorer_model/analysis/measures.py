"""What the what-if view measures: loss on the prompt, logit-lens KL between runs, the heads sweep.

These read recordings and logits; the changes themselves are in explorer_model/interventions.py.
"""
from __future__ import annotations

from typing import Iterable

import torch
import torch.nn.functional as F

from ..model import LlamaModel
from ..rope import cos_sin


def token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy (nats) of `targets` [...] under `logits` [..., vocab]: the language-model loss.

    The one loss of the project: training, the lab, the twins' held-out lines and the prompt loss all call it.
    Pair logits at position t with the token at t + 1 (`prompt_loss` does that for a prompt)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def prompt_loss(logits: torch.Tensor, ids) -> float:
    """Mean next-token cross-entropy of the model on the prompt itself (nats); NaN for one token."""
    ids = torch.as_tensor(ids, dtype=torch.long).reshape(-1)
    if ids.numel() < 2:
        return float("nan")
    return float(token_loss(logits.reshape(-1, logits.shape[-1])[:-1], ids[1:]))


def next_token_logprobs(logits: torch.Tensor, ids) -> torch.Tensor:
    """log p(ids[t+1] | position t) for t = 0 … T-2."""
    ids = torch.as_tensor(ids, dtype=torch.long).reshape(-1)
    lp = torch.log_softmax(logits.reshape(-1, logits.shape[-1]).float(), -1)
    return lp[torch.arange(ids.numel() - 1), ids[1:]]


@torch.no_grad()
def lens_logits(model: LlamaModel, resid: torch.Tensor) -> torch.Tensor:
    """Logit lens: unembed(final norm(resid)) for resid [..., d_model] -> [..., vocab]."""
    x = resid.float()
    if model.ln_final is not None:
        x = model.ln_final(x)
    return model.unembed(x)


def lens_logprobs(model: LlamaModel, resid: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(lens_logits(model, resid), -1)


def lens_top(model: LlamaModel, resid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The lens's top token id and its probability, [...] each. Through log_softmax: on this CPU its fused kernel
    beside the max costs about a third of what torch.logsumexp does over 480 rows of SmolLM2's 49152 logits."""
    top, arg = lens_logprobs(model, resid).max(-1)
    return arg, top.exp()


@torch.no_grad()
def lens_kl(model: LlamaModel, clean, changed, start: int = 0, chunk: int = 1024) -> torch.Tensor:
    """KL(clean || changed) of the logit lens on each layer's resid_post, mean over positions start…: [layer].

    All layers' positions go through the output matrix together (in chunks of rows): one big matmul is
    several times faster on a CPU than thirty small ones. Only the rows a change reached are unembedded: a row
    equal in both runs has one distribution, whose KL with itself is 0 (exactly, whatever the kernels), and a
    change at layer L or position p leaves every row before it equal (the causal mask): the layers before a
    head ablation, the positions before a patched token.
    """
    n_layers = model.cfg.n_layers
    a = torch.cat([clean[f"blocks.{l}.hook_resid_post"][0, start:] for l in range(n_layers)])
    b = torch.cat([changed[f"blocks.{l}.hook_resid_post"][0, start:] for l in range(n_layers)])
    kl = torch.zeros(a.shape[0])
    rows = (a != b).any(-1).nonzero().flatten()  # (a NaN differs from itself: its row is computed, and stays NaN)
    a, b = a[rows], b[rows]
    if rows.numel():
        kl[rows] = torch.cat([_kl_rows(model, a[i:i + chunk], b[i:i + chunk]) for i in range(0, a.shape[0], chunk)])
    return kl.view(n_layers, -1).mean(1)


def _kl_rows(model, a, b):
    return kl_divergence(lens_logprobs(model, a), lens_logprobs(model, b))


def kl_divergence(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """KL(p || q) in nats over the last axis, from log-probabilities: the one KL of the project (the lens KL,
    the patch lesson, the comparison of two models' next-token distributions)."""
    return (logp.exp() * (logp - logq)).sum(-1)


@torch.no_grad()
def head_sweep(model: LlamaModel, rec, layers: Iterable[int] | None = None, mean: bool = False,
               progress=None, max_rows: int = 16384) -> dict:
    """Change of p(clean top-1 at the last position) when each head is ablated in turn.

    Returns {'target', 'p_clean', 'layers', 'delta' [len(layers), n_heads]}. rec is the unchanged recording
    of the prompt: the sweep of layer L starts from its recorded resid_pre, so layers before L are not run
    again. One pass carries a growing batch: at block L, n_heads copies of the prompt join it, copy h with
    head h of L ablated; from there on every copy goes through the same blocks (fused attention, big
    matmuls), and only the last position is unembedded. Layers are split into groups so that the batch
    stays below max_rows token rows. progress(done, total) is called after every block.
    """
    cfg = model.cfg
    layers = sorted(set(range(cfg.n_layers) if layers is None else (int(l) for l in layers)))
    last = rec.logits[0, -1].float()
    target = int(last.argmax())
    p_clean = float(torch.softmax(last, -1)[target])
    n_pos, n_heads = rec.n_pos, cfg.n_heads
    per_group = max(1, max_rows // (n_pos * n_heads))
    groups = [layers[i:i + per_group] for i in range(0, len(layers), per_group)]
    total, done = sum(cfg.n_layers - g[0] for g in groups), 0
    cos, sin = cos_sin(model.inv_freq, torch.arange(n_pos))
    probs = []
    for group in groups:
        x = None
        for layer in range(group[0], cfg.n_layers):
            hooks = []
            if layer in group:
                new = rec[f"blocks.{layer}.hook_resid_pre"].expand(n_heads, -1, -1)
                x = new if x is None else torch.cat([x, new])
                hooks = [(f"blocks.{layer}.attn.hook_z", _ablate_rows(x.shape[0] - n_heads, n_heads, mean))]
            with model.hooks(hooks):
                x = model.blocks[layer](x, cos, sin)
            done += 1
            if progress is not None:
                progress(done, total)
        probs.append(lens_logprobs(model, x[:, -1])[:, target].exp())
    delta = torch.cat(probs).view(len(layers), n_heads) - p_clean
    return {"target": target, "p_clean": p_clean, "delta": delta, "layers": layers}


def _ablate_rows(first: int, n_heads: int, mean: bool):
    """Batch row first + h gets head h ablated."""
    rows, heads = torch.arange(first, first + n_heads), torch.arange(n_heads)

    def fn(z, hp):  # z [batch, pos, head, d_head]
        z = z.clone()
        z[rows, :, heads] = z[rows, :, heads].mean(1, keepdim=True) if mean else 0.0  # [n_heads, pos, d_head]
        return z
    return fn


def shuffle_keep_last(n: int, seed: int = 0) -> list[int]:
    """A permutation of range(n) that keeps the last position and moves the others (when n > 2)."""
    if n <= 2:
        return list(range(n))
    g = torch.Generator().manual_seed(seed)
    while True:
        perm = torch.randperm(n - 1, generator=g).tolist()
        if perm != list(range(n - 1)):
            return perm + [n - 1]
