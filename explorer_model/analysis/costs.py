"""What attention and its KV cache cost, from a configuration alone (any ModelConfig: this model, LLaMA-1 7B, …).

Counted for one sequence of T tokens (batch 1), a multiply-add = 2 FLOPs, the plain (non-fused) computation:
    attention scores per layer:   H · T² values  (QKᵀ, then the pattern, both H × T × T)
    score memory per layer:       H · T² · bytes_per_value
    attention FLOPs, all layers:  L · (2·H·T²·d_k  [QKᵀ]  +  2·H·T²·d_k  [pattern·V])        ∝ T²
    matmul FLOPs, all layers:     2·T · L · (d·H·d_k + 2·d·KV·d_k + H·d_k·d + n_ffn·d·d_ff)  ∝ T
                                  (Q, K, V, O, FFN; + 2·T·d·vocab for the output); n_ffn = 3 SwiGLU, 2 ReLU
    KV cache per token:           2 (K and V) · L · KV · d_k · bytes_per_value
Multi-head attention (MHA) has KV = H; grouped-query attention (GQA) shares each K/V head among n_rep = H/KV
query heads, so its cache is n_rep times smaller. A causal implementation needs only the T(T+1)/2 visible scores,
but the plain one computes and stores the full T × T (future cells set to −∞); that is what is counted here.
"""
from __future__ import annotations

import numpy as np

from ..config import ModelConfig

BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "int8": 1}  # bytes per stored value, for bytes_per_value


def kv_cache_bytes_per_token(cfg: ModelConfig, bytes_per_value: float = 2) -> int:
    """2 · n_layers · n_kv_heads · head_dim · bytes_per_value: one token's keys and values in every layer."""
    return int(2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * bytes_per_value)


def as_mha(cfg: ModelConfig) -> ModelConfig:
    """The same model with one K/V head per query head (multi-head attention), for the GQA comparison."""
    return cfg.with_(n_kv_heads=cfg.n_heads)


def attention_costs(cfg: ModelConfig, lengths, bytes_per_value: float = 2) -> dict:
    """Costs over prompt lengths T (an iterable of ints); every value is an array over `lengths`.

    Returns {'T', 'score_values_per_layer' (H·T²), 'score_bytes_per_layer', 'score_bytes_all_layers' (if every
    layer's scores were kept, as a recording of them does), 'attention_flops' (T² terms, all layers),
    'matmul_flops' (T terms, all layers and the output layer), 'attention_share' (attention / (attention + matmul)),
    'kv_cache_bytes' (T tokens, all layers)}.
    """
    t = np.asarray(list(lengths), dtype=np.float64)
    if t.size == 0 or np.any(t < 1):
        raise ValueError("prompt lengths must be positive")
    h, kv, dk, d, n_layers = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_model, cfg.n_layers
    scores = h * t**2
    attn = n_layers * 2 * (2 * h * t**2 * dk)
    n_ffn = 3 if cfg.ffn_type == "swiglu" else 2
    per_token = n_layers * (d * h * dk + 2 * d * kv * dk + h * dk * d + n_ffn * d * cfg.d_ff) + d * cfg.vocab_size
    matmul = 2 * t * per_token
    return {"T": t.astype(np.int64), "score_values_per_layer": scores,
            "score_bytes_per_layer": scores * bytes_per_value,
            "score_bytes_all_layers": n_layers * scores * bytes_per_value,
            "attention_flops": attn, "matmul_flops": matmul, "attention_share": attn / (attn + matmul),
            "kv_cache_bytes": t * kv_cache_bytes_per_token(cfg, bytes_per_value)}


def crossover_length(cfg: ModelConfig) -> float:
    """The T at which the T² attention FLOPs equal the T-linear matmul FLOPs (per the formulas above)."""
    h, dk, n_layers = cfg.n_heads, cfg.head_dim, cfg.n_layers
    per_token = attention_costs(cfg, [1])["matmul_flops"][0] / 2
    return float(per_token / (n_layers * 2 * h * dk))


def kv_cache_table(configs: dict, n_tokens: int = 4096, bytes_per_value: float = 2) -> list[dict]:
    """One row per named config: {'name', 'n_heads', 'n_kv_heads', 'kind' ('MHA'/'GQA'/'MQA'), 'bytes_per_token',
    'mha_bytes_per_token' (the same model with KV = H), 'saving' (MHA bytes / these bytes = n_rep),
    'bytes' (n_tokens tokens)}."""
    rows = []
    for name, cfg in configs.items():
        per = kv_cache_bytes_per_token(cfg, bytes_per_value)
        mha = kv_cache_bytes_per_token(as_mha(cfg), bytes_per_value)
        kind = "MHA" if cfg.n_kv_heads == cfg.n_heads else "MQA" if cfg.n_kv_heads == 1 else "GQA"
        rows.append({"name": name, "n_heads": cfg.n_heads, "n_kv_heads": cfg.n_kv_heads, "kind": kind,
                     "bytes_per_token": per, "mha_bytes_per_token": mha, "saving": mha / per,
                     "bytes": per * n_tokens})
    return rows
