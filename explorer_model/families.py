"""The real LLaMA family as configs, for the tutorial's shape table without any weights.

    FAMILIES["LLaMA-1 7B"]                    a ModelConfig
    tensor_shapes(cfg, n_tokens)              every hook point's shape for a prompt of n_tokens
    component_params(cfg)                     parameters per component (embedding, attention, ffn, norms, output)
    memory_table(cfg, n_tokens)               weights and runtime bytes per dtype
    kv_cache_bytes_per_token(cfg, dtype)      what each generated token adds

Shapes and counts come from the real model built on the meta device (memory.py), so they are the loaded
model's by construction. Configs are the published ones (LLaMA paper Table 2; the Llama-2 and Llama-3 model
cards and their config.json): LLaMA-1 uses RMSNorm eps 1e-6, later ones 1e-5; Llama-3 has a 128k vocabulary,
rope_theta 500000 and 8 KV heads (GQA), Llama-2 70B 8 KV heads.
"""
from __future__ import annotations

import torch

from . import memory
from .config import ModelConfig
from .memory import kv_cache_bytes_per_token, param_counts

__all__ = ["FAMILIES", "tensor_shapes", "weight_shapes", "component_params", "memory_table",
           "kv_cache_bytes_per_token", "param_counts"]


def _llama(name: str, d_model: int, n_layers: int, n_heads: int, d_ff: int, *, n_kv_heads: int | None = None,
           vocab: int = 32000, eps: float = 1e-6, theta: float = 10000.0, context: int = 2048) -> ModelConfig:
    return ModelConfig(vocab_size=vocab, d_model=d_model, n_layers=n_layers, n_heads=n_heads,
                       n_kv_heads=n_kv_heads or n_heads, head_dim=d_model // n_heads, d_ff=d_ff, norm_eps=eps,
                       rope_theta=theta, max_seq_len=context, tie_embeddings=False, bos_id=1, eos_id=2, name=name)


FAMILIES: dict[str, ModelConfig] = {
    "LLaMA-1 7B": _llama("LLaMA-1 7B", 4096, 32, 32, 11008),
    "LLaMA-1 13B": _llama("LLaMA-1 13B", 5120, 40, 40, 13824),
    "LLaMA-1 33B": _llama("LLaMA-1 33B", 6656, 60, 52, 17920),
    "LLaMA-1 65B": _llama("LLaMA-1 65B", 8192, 80, 64, 22016),
    "Llama-2 7B": _llama("Llama-2 7B", 4096, 32, 32, 11008, eps=1e-5, context=4096),
    "Llama-2 70B": _llama("Llama-2 70B", 8192, 80, 64, 28672, n_kv_heads=8, eps=1e-5, context=4096),
    "Llama-3 8B": ModelConfig(vocab_size=128256, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128,
                              d_ff=14336, norm_eps=1e-5, rope_theta=500000.0, max_seq_len=8192,
                              tie_embeddings=False, bos_id=128000, eos_id=128001, name="Llama-3 8B"),
}


def tensor_shapes(cfg: ModelConfig, n_tokens: int, layers: tuple[int, ...] | None = (0,)) -> dict[str, tuple]:
    """Hook name -> shape for a prompt of n_tokens (batch 1), in forward order.

    Blocks are alike, so by default only block 0's hooks are listed; layers=None lists every block."""
    shapes = memory.hook_shapes(cfg, n_tokens)
    if layers is None:
        return shapes
    keep = {str(l) for l in layers}
    return {k: v for k, v in shapes.items() if not k.startswith("blocks.") or k.split(".")[1] in keep}


def weight_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Checkpoint key -> shape, as a loader checks them."""
    return memory.weight_shapes(cfg)


def component_params(cfg: ModelConfig) -> dict[str, int]:
    """Parameters per component and their total (a tied output matrix counted once, under embedding)."""
    return param_counts(cfg)


def memory_table(cfg: ModelConfig, n_tokens: int = memory.DEFAULT_TOKENS) -> list[dict]:
    """One row per dtype: bytes of weights, of running n_tokens, their total, and KV cache per token."""
    rows = []
    for name, est in memory.estimates(cfg, n_tokens).items():
        rows.append({"dtype": name, "weights": est.weights, "runtime": est.runtime, "total": est.total,
                     "kv_per_token": kv_cache_bytes_per_token(cfg, memory.DTYPES[name])})
    return rows


def recording_bytes(cfg: ModelConfig, n_tokens: int, dtype: torch.dtype = torch.float32) -> int:
    """What recording every hook of a prompt of n_tokens keeps (attention rebuilt on access)."""
    return memory.recording_bytes(cfg, n_tokens, dtype)
