"""Attention arithmetic made visible: why scores are divided by √d_k, and multi-head attention piece by piece.

Why √d_k. If the d_k components of q and k are independent with mean 0 and variance 1, then
    q·k = Σ_i q_i k_i,   Var(q·k) = Σ_i Var(q_i k_i) = d_k,   so std(q·k) = √d_k,
and the scores grow with the head size. Softmax of large scores is nearly one-hot (saturated): one key gets
almost all the weight, the entropy −Σ p ln p collapses towards 0 and the gradients through the other keys vanish.
Dividing by √d_k brings the spread back to ≈ 1 whatever d_k is. `scale_study` measures this on a recording's
rotated Q and K; `random_dot_spread` shows the textbook argument on random vectors.

Multi-head attention. Query head h reads KV head h // n_rep (GQA; n_rep = n_heads / n_kv_heads):
    z_h = softmax(q_h K_{h//n_rep}ᵀ / √d_k + mask) · V_{h//n_rep}        [T, d_k]
    concat = [z_0 | z_1 | … | z_{H−1}]                                    [T, H·d_k]
    attn_out = concat · W_Oᵀ = Σ_h z_h · W_O[:, h·d_k:(h+1)·d_k]ᵀ          [T, d_model]
`multihead_parts` returns V, z and the concatenation from a recording; `project_heads` and `head_contributions`
apply a W_O given as an array (nn.Linear layout [d_model, H·d_k]).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import torch

from ..model import causal_scores
from ._arrays import arr, entropy, softmax


def attention_entropy(pattern: np.ndarray, skip_first: bool = True) -> np.ndarray:
    """Mean entropy (nats) of the query rows of pattern [..., q, k]: −Σ_k p ln p, averaged over queries.
    (For the attention view's per-head overview; scale_study computes the same for scaled and unscaled scores.)

    Query 0 can only read itself (entropy 0 by construction), so it is left out when skip_first and T > 1.
    """
    p = np.asarray(pattern, dtype=np.float64)
    if skip_first and p.shape[-2] > 1:
        p = p[..., 1:, :]
    return entropy(p).mean(-1)


@dataclass(frozen=True)
class ScaleStudy:
    d_k: int
    layers: list[int]
    raw_std: np.ndarray  # [layer] std of q·k over all heads and causal (q, k) pairs, q ≥ 1
    scaled_std: np.ndarray  # [layer] the same after dividing by √d_k (= raw_std / √d_k)
    entropy_scaled: np.ndarray  # [layer, head] mean attention entropy (nats) of softmax(q·k/√d_k + mask)
    entropy_unscaled: np.ndarray  # [layer, head] the same for softmax(q·k + mask): the saturated softmax
    max_weight_scaled: np.ndarray  # [layer, head] mean over queries of the largest attention weight
    max_weight_unscaled: np.ndarray  # [layer, head]
    uniform_entropy: float  # mean over queries of ln(q+1): the entropy of spreading evenly over visible keys
    queries: int  # number of query rows averaged (T−1: query 0 left out; fewer with max_queries)


def scale_study(rec, layers=None, batch: int = 0, max_queries: int | None = None) -> ScaleStudy:
    """Measure the √d_k argument on recorded rotated Q and K (hook_rot_q, hook_rot_k), per layer.

    Scores come from the model's own causal_scores (q·k/√d_k, future −inf); unscaled = those × √d_k.
    Query 0 is left out (it sees only itself), from the spread and the entropies. With max_queries, only the
    last max_queries query rows are used (with every key they see): the cost is then ∝ max_queries·T rather than
    T² per layer, for long prompts.
    """
    cfg = rec.cfg
    layers = list(range(cfg.n_layers) if layers is None else layers)
    d_k, n_pos = cfg.head_dim, rec.n_pos
    start = 1 if n_pos > 1 else 0
    if max_queries is not None:
        start = max(start, n_pos - int(max_queries))
    hidden = torch.ones(n_pos - start, n_pos, dtype=torch.bool).triu(start + 1)  # [query rows, keys] future cells
    n_vis = int((~hidden).sum()) * cfg.n_heads
    raw_std, ent_s, ent_u, max_s, max_u = [], [], [], [], []
    with torch.no_grad():
        for layer in layers:
            q = rec[f"blocks.{layer}.attn.hook_rot_q"][batch:batch + 1, start:].float()
            k = rec[f"blocks.{layer}.attn.hook_rot_k"][batch:batch + 1].float()
            scaled = causal_scores(q, k, q_offset=start)[0]  # [H, rows, T]
            finite = scaled.masked_fill(hidden, 0.0).double()
            mean = finite.sum() / n_vis
            raw_std.append(float((finite.pow(2).sum() / n_vis - mean**2).clamp(min=0).sqrt()) * math.sqrt(d_k))
            for s, ent, mx in ((scaled, ent_s, max_s), (scaled * math.sqrt(d_k), ent_u, max_u)):
                logp = torch.log_softmax(s, -1)
                p = logp.exp()
                h = -(p * logp.masked_fill(hidden, 0.0)).sum(-1)  # −Σ p ln p; masked cells have p = 0
                ent.append(h.double().mean(-1).numpy())
                mx.append(p.max(-1).values.double().mean(-1).numpy())
    raw_std = np.array(raw_std)
    return ScaleStudy(d_k=d_k, layers=layers, raw_std=raw_std, scaled_std=raw_std / np.sqrt(d_k),
                      entropy_scaled=np.array(ent_s), entropy_unscaled=np.array(ent_u),
                      max_weight_scaled=np.array(max_s), max_weight_unscaled=np.array(max_u),
                      uniform_entropy=float(np.log(np.arange(start, n_pos) + 1.0).mean()),
                      queries=n_pos - start)


def random_dot_spread(d_values=(4, 16, 64, 256, 1024), n_pairs: int = 4000, n_keys: int = 64,
                      seed: int = 0) -> dict:
    """The textbook argument on random vectors with i.i.d. N(0, 1) components, for each d_k in d_values.

    Returns {'d_k', 'std' (measured std of q·k), 'theory' (√d_k), 'std_scaled' (std of q·k/√d_k, ≈ 1),
    'entropy_unscaled', 'entropy_scaled' (mean softmax entropy over n_keys random keys, nats),
    'max_entropy' (ln n_keys)}, each an array over d_values.
    """
    rng = np.random.default_rng(seed)
    d_values = np.array(sorted(int(d) for d in d_values))
    std, ent_u, ent_s = [], [], []
    for d in d_values:
        q = rng.standard_normal((n_pairs, d))
        k = rng.standard_normal((n_pairs, d))
        std.append((q * k).sum(-1).std())
        qs = rng.standard_normal((200, d))
        ks = rng.standard_normal((n_keys, d))
        s = qs @ ks.T  # [200 queries, n_keys]
        ent_u.append(entropy(softmax(s)).mean())
        ent_s.append(entropy(softmax(s / np.sqrt(d))).mean())
    std = np.array(std)
    return {"d_k": d_values, "std": std, "theory": np.sqrt(d_values), "std_scaled": std / np.sqrt(d_values),
            "entropy_unscaled": np.array(ent_u), "entropy_scaled": np.array(ent_s),
            "max_entropy": float(np.log(n_keys))}


RANDOM_KEYS = 64  # keys per random query in the textbook table: its uniform entropy is ln 64


@functools.lru_cache(maxsize=8)
def textbook_table(d_k: int) -> dict:
    """random_dot_spread for the usual head sizes and this model's d_k, with RANDOM_KEYS keys: the same numbers
    every time (a fixed seed), worked out once per process (a few tenths of a second). Shared: read it only."""
    return random_dot_spread(tuple(sorted({4, 16, 64, 256, 1024, int(d_k)})), n_keys=RANDOM_KEYS)


# --------------------------------------------------------------------------- multi-head attention
@dataclass(frozen=True)
class MultiHead:
    layer: int
    v: np.ndarray  # [T, KV, d_k] values per KV head (never rotated)
    z: np.ndarray  # [T, H, d_k] each query head's output, pattern_h · V_{h//n_rep}
    concat: np.ndarray  # [T, H·d_k] the heads side by side, the input of W_O
    attn_out: np.ndarray  # [T, d_model] the recorded W_O·concat
    kv_head_of: np.ndarray  # [H] int, the KV head each query head reads
    shapes: dict  # name -> shape tuple, for display


def multihead_parts(rec, layer: int, batch: int = 0) -> MultiHead:
    """V per KV head, z per head, their concatenation and the recorded output of layer `layer`'s attention."""
    cfg = rec.cfg
    v = arr(rec[f"blocks.{layer}.attn.hook_v"], batch)
    z = arr(rec[f"blocks.{layer}.attn.hook_z"], batch)
    out = arr(rec[f"blocks.{layer}.hook_attn_out"], batch)
    concat = z.reshape(z.shape[0], -1)  # head-major: columns h·d_k … (h+1)·d_k − 1 are head h
    shapes = {"V": v.shape, "z": z.shape, "concat": concat.shape,
              "W_O": (cfg.d_model, cfg.n_heads * cfg.head_dim), "attn_out": out.shape}
    return MultiHead(layer=layer, v=v, z=z, concat=concat, attn_out=out,
                     kv_head_of=np.arange(cfg.n_heads) // cfg.n_rep, shapes=shapes)


def project_heads(concat: np.ndarray, w_o: np.ndarray, b_o: np.ndarray | None = None) -> np.ndarray:
    """attn_out = concat · W_Oᵀ (+ b_O): [T, H·d_k] with W_O [d_model, H·d_k] -> [T, d_model]."""
    w_o = np.asarray(w_o, dtype=np.float64)
    if w_o.shape[1] != concat.shape[-1]:
        raise ValueError(f"W_O has {w_o.shape[1]} input columns but the concatenation is {concat.shape[-1]} wide")
    out = np.asarray(concat, dtype=np.float64) @ w_o.T
    return out if b_o is None else out + np.asarray(b_o, dtype=np.float64)


def head_contributions(z: np.ndarray, w_o: np.ndarray) -> np.ndarray:
    """Each head's share of attn_out: z_h · W_O[:, h·d_k:(h+1)·d_k]ᵀ -> [H, T, d_model]; the sum over heads
    is project_heads(concat, W_O) without the bias."""
    n_pos, n_heads, d_k = z.shape
    w = np.asarray(w_o, dtype=np.float64).reshape(-1, n_heads, d_k)  # [d_model, H, d_k]
    return np.einsum("thd,mhd->htm", np.asarray(z, dtype=np.float64), w)
