"""Rotary position embedding, in one layout: adjacent pairs.

Inside this project a head vector q = (q0, q1, q2, q3, ...) is rotated as the pairs (q0, q1), (q2, q3), ...:
pair i at position m turns by the angle m * theta_i with theta_i = base^(-2i / head_dim). This is how Meta's
reference code, GGUF files and the tutorials describe RoPE, so the pictures of pairs match what students read.
HF checkpoints rotate (q_i, q_{i + head_dim/2}) instead; their Q/K projection rows are permuted at load time
with `hf_to_adjacent` so that both layouts give the same attention scores.
"""
from __future__ import annotations

import math

import torch

from .config import ModelConfig, RopeScaling


def inverse_frequencies(head_dim: int, theta: float, scaling: RopeScaling | None = None) -> torch.Tensor:
    """theta_i for each pair i, shape [head_dim // 2], float32 as HF and llama.cpp compute it."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    inv_freq = 1.0 / (theta**exponents)
    if scaling is None:
        return inv_freq
    if scaling.kind == "linear":
        return inv_freq / scaling.factor
    if scaling.kind == "factors":
        factors = torch.tensor(scaling.factors, dtype=torch.float32)
        if factors.numel() != inv_freq.numel():
            raise ValueError(f"rope_freqs has {factors.numel()} entries, expected {inv_freq.numel()}")
        return inv_freq / factors
    if scaling.kind == "llama3":
        return _llama3_scale(inv_freq, scaling)
    raise ValueError(f"unknown rope scaling {scaling.kind!r}")


def _llama3_scale(inv_freq: torch.Tensor, s: RopeScaling) -> torch.Tensor:
    # Long wavelengths are stretched by `factor`, short ones kept, the band between blended smoothly.
    low_freq_wavelen = s.original_max_position / s.low_freq_factor
    high_freq_wavelen = s.original_max_position / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (s.original_max_position / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    blended = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return torch.where(medium, blended, scaled)


def model_inverse_frequencies(cfg: ModelConfig) -> torch.Tensor:
    return inverse_frequencies(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)


def angles(inv_freq: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """m * theta_i, shape [len(positions), head_dim // 2]."""
    return positions.to(torch.float32)[:, None] * inv_freq[None, :]


def cos_sin(inv_freq: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    a = angles(inv_freq, positions)  # [pos, d_head/2]
    return a.cos(), a.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate adjacent pairs of x [batch, pos, head, d_head] by per-position angles cos/sin [pos, d_head/2]."""
    x_even, x_odd = x[..., 0::2], x[..., 1::2]  # [batch, pos, head, d_head/2]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    out = torch.stack((x_even * c - x_odd * s, x_even * s + x_odd * c), dim=-1)
    return out.flatten(-2).to(x.dtype)  # computed in float32 (cos/sin are), stored in x's dtype


# --------------------------------------------------------------------------- layout conversions
def hf_to_adjacent(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Reorder the rows of an HF q_proj/k_proj weight [n_heads * d_head, d_in] from half-split to adjacent pairs.

    Within each head HF's row i pairs with row i + d_head/2; afterwards they sit at rows 2i and 2i+1.
    This is llama.cpp's `LlamaModel.permute`. For k_proj pass the KV head count.
    """
    rows = w.shape[0]
    d_head = rows // n_heads
    return w.reshape(n_heads, 2, d_head // 2, *w.shape[1:]).transpose(1, 2).reshape(rows, *w.shape[1:])


def adjacent_to_hf(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Inverse of `hf_to_adjacent` (Meta's convert_llama_weights_to_hf permutation)."""
    rows = w.shape[0]
    d_head = rows // n_heads
    return w.reshape(n_heads, d_head // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(rows, *w.shape[1:])
