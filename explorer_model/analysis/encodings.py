"""The original Transformer's absolute position encoding, beside RoPE.

Sinusoidal encoding (Vaswani et al. 2017), for position pos and dimension pair i (0 ≤ 2i < d_model):
    PE[pos, 2i]   = sin(pos / base^(2i / d_model))
    PE[pos, 2i+1] = cos(pos / base^(2i / d_model)),        base = 10000
It is ADDED to the token embedding once, before the first block: x'_pos = E[token] + PE[pos]. Since sin² + cos² = 1
for each pair, ‖PE[pos]‖ = √(d_model / 2) at every position. Everything downstream reads x + PE, so the values
carry position too: V = W_v·(x + PE) = W_v·x + W_v·PE (`absolute_in_v`).

RoPE instead rotates Q and K inside every attention layer (a norm-preserving turn by pos·θ_i per pair) and never
touches V: z = pattern · V with V = W_v·n exactly as recorded (`rope_footprint`).
"""
from __future__ import annotations

import numpy as np

from ._arrays import arr


def sinusoidal_encoding(n_pos: int, d_model: int, base: float = 10000.0) -> np.ndarray:
    """PE [n_pos, d_model] as above (float64). An odd d_model keeps the sine of its last pair only."""
    if n_pos < 0 or d_model < 1:
        raise ValueError(f"need n_pos ≥ 0 and d_model ≥ 1, got {n_pos}, {d_model}")
    pos = np.arange(n_pos, dtype=np.float64)[:, None]
    two_i = np.arange(0, d_model, 2, dtype=np.float64)  # 2i for each pair
    angle = pos / base ** (two_i / d_model)  # [n_pos, ceil(d/2)]
    pe = np.zeros((n_pos, d_model))
    pe[:, 0::2] = np.sin(angle)
    pe[:, 1::2] = np.cos(angle[:, : d_model // 2])
    return pe


def encoding_vs_embedding(rec, batch: int = 0, base: float = 10000.0) -> dict:
    """What adding PE would do to this prompt's embeddings (hook_embed).

    Returns {'pe' [T, d], 'embed_norm' [T] ‖E[token_pos]‖, 'pe_norm' [T] ‖PE[pos]‖ (= √(d/2)),
    'ratio' [T] ‖PE‖/‖E‖, 'cosine' [T] cos(E, E+PE) (how far the sum turns away from the token alone),
    'similarity' [T, T] cosine between PE rows (nearby positions look alike, far ones less)}.
    """
    e = arr(rec["hook_embed"], batch)
    n_pos, d = e.shape
    pe = sinusoidal_encoding(n_pos, d, base)
    e_norm, pe_norm = np.linalg.norm(e, axis=-1), np.linalg.norm(pe, axis=-1)
    s = e + pe
    cosine = (e * s).sum(-1) / np.maximum(e_norm * np.linalg.norm(s, axis=-1), 1e-300)
    unit = pe / pe_norm[:, None]
    return {"pe": pe, "embed_norm": e_norm, "pe_norm": pe_norm, "ratio": pe_norm / np.maximum(e_norm, 1e-300),
            "cosine": cosine, "similarity": unit @ unit.T}


def absolute_in_v(x: np.ndarray, pe: np.ndarray, w_v: np.ndarray) -> dict:
    """V with and without the added encoding, for inputs x [T, d_model] and W_v [n_kv·d_k, d_model] (nn.Linear).

    Returns {'v_plain' = x·W_vᵀ, 'v_abs' = (x + PE)·W_vᵀ, 'v_position' = PE·W_vᵀ (the part of V that is only
    position, = v_abs − v_plain by linearity), 'relative_change' [T] ‖v_abs − v_plain‖ / ‖v_plain‖}.
    """
    x, pe, w_v = (np.asarray(a, dtype=np.float64) for a in (x, pe, w_v))
    if x.shape != pe.shape:
        raise ValueError(f"x {x.shape} and PE {pe.shape} must have the same shape")
    if w_v.shape[1] != x.shape[1]:
        raise ValueError(f"W_v reads {w_v.shape[1]} dimensions, x has {x.shape[1]}")
    v_plain, v_abs = x @ w_v.T, (x + pe) @ w_v.T
    rel = np.linalg.norm(v_abs - v_plain, axis=-1) / np.maximum(np.linalg.norm(v_plain, axis=-1), 1e-300)
    return {"v_plain": v_plain, "v_abs": v_abs, "v_position": pe @ w_v.T, "relative_change": rel}


def rope_footprint(rec, layer: int, batch: int = 0) -> dict:
    """Where RoPE acts in a recorded layer: on Q and K, not on V.

    Returns {'q_change' [T], 'k_change' [T]: ‖rot − unrotated‖/‖unrotated‖ per position, mean over heads
    (0 at position 0, which turns by 0), 'q_norm_ratio', 'k_norm_ratio' [T]: ‖rot‖/‖unrotated‖ (= 1, a
    rotation), 'v_z_error': max |pattern·V_{h//n_rep} − z| with V = hook_v as recorded, unrotated (≈ 0: V
    enters z untouched)}.
    """
    cfg = rec.cfg
    out = {}
    for name in ("q", "k"):
        a = arr(rec[f"blocks.{layer}.attn.hook_{name}"], batch)  # [T, heads, d_k]
        b = arr(rec[f"blocks.{layer}.attn.hook_rot_{name}"], batch)
        na = np.maximum(np.linalg.norm(a, axis=-1), 1e-300)
        out[f"{name}_change"] = (np.linalg.norm(b - a, axis=-1) / na).mean(-1)
        out[f"{name}_norm_ratio"] = (np.linalg.norm(b, axis=-1) / na).mean(-1)
    v = arr(rec[f"blocks.{layer}.attn.hook_v"], batch)  # [T, KV, d_k]
    p = arr(rec.pattern(layer), batch)  # [H, T, T]
    z = arr(rec[f"blocks.{layer}.attn.hook_z"], batch)  # [T, H, d_k]
    v_rep = np.repeat(v, cfg.n_rep, axis=1)  # [T, H, d_k]
    z_from_v = np.einsum("hqk,khd->qhd", p, v_rep)
    out["v_z_error"] = float(np.abs(z_from_v - z).max())
    return out
