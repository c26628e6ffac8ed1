"""Numbers the app's views draw, computed from a Recording (or logits) and returned as numpy.

The panels in app/panels/ do not import torch; what they would otherwise compute on tensors themselves lives here,
as pure functions that tests can check against the recording independently.
"""
from __future__ import annotations

import numpy as np
import torch

from ..model import attention_pattern, causal_scores
from ..rope import apply_rope, inverse_frequencies, model_inverse_frequencies
from ..generate.sampling import filter_steps


# --------------------------------------------------------------------------- norms of recorded vectors
def stack_norms(rec, suffix: str, token: int | None = None) -> np.ndarray:
    """‖·‖₂ of a hook across layers: [layer, pos], or [layer] for one token (float32 sums)."""
    x = rec.stack(suffix)[:, 0].float()
    return (x if token is None else x[:, token]).norm(dim=-1).numpy()


def residual_norms(rec) -> np.ndarray:
    """‖x‖₂ of the residual stream: rows = resid_pre of every layer, then the last block's resid_post."""
    pre = rec.stack("hook_resid_pre")[:, 0]  # [layer, pos, d_model]
    last = rec[f"blocks.{rec.cfg.n_layers - 1}.hook_resid_post"][0][None]
    return torch.cat([pre, last]).norm(dim=-1).numpy()


def below_share(rec, suffix: str, threshold: float) -> np.ndarray:
    """Per layer: share of |values| of the hook below threshold, over all tokens and units."""
    return (rec.stack(suffix).abs() < threshold).float().mean(dim=(1, 2, 3)).numpy()


def cosine_per_layer(rec_a, rec_b, i: int, j: int, suffix: str) -> np.ndarray:
    """Per layer: cosine similarity of the suffix vector at token i of recording A and token j of B."""
    a = rec_a.stack(suffix)[:, 0, i].double()
    b = rec_b.stack(suffix)[:, 0, j].double()
    return torch.nn.functional.cosine_similarity(a, b, dim=-1).clamp(-1, 1).numpy()


# --------------------------------------------------------------------------- attention
def pattern_from_rotated(rot_q, rot_k, unmasked: bool) -> np.ndarray:
    """[head, q, k] attention rebuilt from rotated Q and K like the recorder does; `unmasked` pushes the mask
    past the last key, as the no-mask intervention does."""
    return attention_pattern(causal_scores(rot_q, rot_k, rot_q.shape[1] if unmasked else 0))[0].double().numpy()


# --------------------------------------------------------------------------- next-token distributions
def softmax(logits) -> np.ndarray:
    return torch.softmax(torch.as_tensor(logits).float(), -1).numpy()


def top_token(logits) -> tuple[int, float]:
    """(argmax id, its softmax probability)."""
    p = softmax(logits)
    return int(p.argmax()), float(p.max())


def max_abs_diff(a, b) -> float:
    return float((torch.as_tensor(a) - torch.as_tensor(b)).abs().max())


def distribution_data(clean_logits, changed_logits, n: int = 10) -> dict:
    """Last-position probabilities: the union of both runs' top n tokens, and the n tokens that moved most."""
    p, q = torch.softmax(clean_logits.float(), -1), torch.softmax(changed_logits.float(), -1)
    top = list(dict.fromkeys(torch.topk(p, n).indices.tolist() + torch.topk(q, n).indices.tolist()))
    top.sort(key=lambda i: -max(float(p[i]), float(q[i])))
    delta = q - p
    moved = torch.topk(delta.abs(), n).indices.tolist()
    return {"ids": np.array(top), "clean": p[top].numpy(), "changed": q[top].numpy(),
            "moved": np.array(moved), "delta": delta[moved].numpy()}


def sampling_steps(logits, temperature: float, top_k: int, top_p: float, n: int, seed: int, n_ctx: int) -> dict:
    """The n most likely tokens' probabilities after each filtering step (raw, temperature, top-k, top-p), how many
    tokens survive each, the full raw and final distributions, and one reproducible draw (same prompt length and
    seed, same token; temperature 0 takes the top token)."""
    logits = torch.as_tensor(logits)
    s = filter_steps(logits, temperature, top_k, top_p)
    steps = [s.raw, s.tempered, s.top_k, s.top_p]
    order = torch.argsort(logits, descending=True, stable=True)[:n]
    greedy = int(order[0])
    gen = torch.Generator().manual_seed(seed * 100003 + n_ctx)
    sampled = int(torch.multinomial(s.final, 1, generator=gen)) if temperature > 0 else greedy
    return {"ids": order.numpy(), "probs": np.stack([p[order].numpy() for p in steps]),
            "survivors": [int((p > 0).sum()) for p in steps], "final": s.final.numpy(),
            "raw": torch.softmax(logits.float(), -1).numpy(), "greedy": greedy, "sampled": sampled}


# --------------------------------------------------------------------------- RoPE
def theta_data(cfg) -> tuple[np.ndarray, np.ndarray]:
    """(θ_i without scaling, θ_i the model uses) per pair i."""
    plain = inverse_frequencies(cfg.head_dim, cfg.rope_theta, None).double().numpy()
    return plain, model_inverse_frequencies(cfg).double().numpy()


def rotate(x, theta: np.ndarray, position: int) -> np.ndarray:
    """x [d_head] turned to `position` with the model's apply_rope, in float64 so large shifts stay exact."""
    a = torch.tensor(float(position) * theta, dtype=torch.float64)[None]  # [1, pairs]
    return apply_rope(torch.as_tensor(x).double()[None, None, None], a.cos(), a.sin())[0, 0, 0].numpy()


def shifted_dots(rec, theta: np.ndarray, layer: int, head: int, m: int, n: int, shifts) -> list[float]:
    """q·k of the recorded un-rotated q (position m) and k (position n) after moving both by each shift s."""
    a = f"blocks.{layer}.attn"
    q = rec[f"{a}.hook_q"][0, m, head]
    k = rec[f"{a}.hook_k"][0, n, rec.kv_head(head)]
    return [float(rotate(q, theta, m + s) @ rotate(k, theta, n + s)) for s in shifts]


