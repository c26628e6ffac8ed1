"""The norm lab's three variants of one small decoder, built from `LlamaModel`:
    pre       x + F(Norm(x))                         (LLaMA)
    post      Norm(x + F(x))                         (the 2017 Transformer)
    deepnorm  Norm(α·x + F(x)), α = (2N)^(1/4), and the FFN, V and output projections initialised
              β times smaller, β = (8N)^(-1/4)        (Wang et al. 2022, decoder-only constants)
DeepNorm is not a model flag: it is a Post-Norm model whose residual is scaled through hook points
(hook_attn_out / hook_mlp_out return F(x) + (α − 1)·x, so the norm reads α·x + F(x)).
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch

from ..config import ModelConfig
from ..model import LlamaModel

VARIANTS = ("pre", "post", "deepnorm")
DEPTHS = (2, 4, 6, 8, 12, 16, 24, 32, 48)  # depths one can pick for the per-layer profile


@contextmanager
def threads(n: int = 1) -> Iterator[None]:
    """The project's one setter of torch's thread count. One thread is fastest for models this small, and
    keeps sums in a fixed order (determinism). Process-wide: for offline scripts, the lab's worker process,
    the CLI and tests only, never in a server thread (it would slow every other visitor's forward pass)."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# --------------------------------------------------------------------------- building the variants
@dataclass(frozen=True)
class LabOptions:
    ffn: str = "relu"  # "relu" | "swiglu"
    init: str = "xavier"  # "xavier" (Glorot, the 2017 Transformer) | "llama" (N(0, 0.02))
    norm: str = "layer"  # "layer" | "rms"
    d_model: int = 64
    heads: int = 4
    vocab: int = 512
    seq: int = 32
    batch: int = 4
    zipf: float = 1.3  # token frequencies ∝ 1 / rank^zipf
    seeds: int = 5  # gradient norms are averaged over this many initializations ...
    seed0: int = 0  # ... seed0, seed0 + 1, …
    probe_lr: float = 1e-3  # size of the one Adam step of the amplification probe


def lab_config(placement: str, depth: int, opts: LabOptions, vocab: int | None = None,
               max_seq_len: int = 256) -> ModelConfig:
    d = opts.d_model
    d_ff = 4 * d if opts.ffn == "relu" else 16 * math.ceil(8 * d / 3 / 16)  # same parameter count, about
    return ModelConfig(
        vocab_size=vocab or opts.vocab, d_model=d, n_layers=depth, n_heads=opts.heads, n_kv_heads=opts.heads,
        head_dim=d // opts.heads, d_ff=d_ff, norm_eps=1e-5, rope_theta=10000.0, max_seq_len=max_seq_len,
        tie_embeddings=False, norm_placement=placement, norm_type=opts.norm, ffn_type=opts.ffn,
        name=f"lab-{placement}",
    )


def deepnorm_alpha(n_layers: int) -> float:
    return (2 * n_layers) ** 0.25


def deepnorm_beta(n_layers: int) -> float:
    return (8 * n_layers) ** -0.25


_BETA_SCALED = ("attn.v_proj.weight", "attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
                "mlp.down_proj.weight")


def init_weights(model: LlamaModel, init: str, seed: int, gain: float = 1.0,
                 scaled: tuple[str, ...] = _BETA_SCALED) -> None:
    """The one weight init of the lab and of the trained twins. Xavier: Glorot-uniform matrices and
    unit-variance embeddings (the 2017 Transformer's embedding times sqrt(d)). LLaMA: N(0, 0.02) everywhere.
    Matrices whose names end with `scaled` get `gain` times that std: DeepNorm's β on V, O and the FFN (for
    Xavier as a Glorot gain, as in the paper), GPT-2's 1/sqrt(2·layers) on the residual outputs (train.py).
    Drawn parameter by parameter in name order from one generator, so a model without ln_final (which draws
    nothing anyway) gets exactly the same numbers as its Pre-Norm twin. Norm gains stay 1, biases 0."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.fill_(0.0 if name.endswith(".bias") else 1.0)
                continue
            gain_p = gain if name.endswith(scaled) else 1.0
            if name.startswith("embed."):
                std = 1.0 if init == "xavier" else 0.02
            elif init == "xavier":
                fan_out, fan_in = p.shape
                std = gain_p * math.sqrt(2.0 / (fan_in + fan_out))
                # uniform on ±sqrt(3)·std has that std
                p.copy_((torch.rand(p.shape, generator=gen) * 2 - 1) * math.sqrt(3) * std)
                continue
            else:
                std = 0.02 * gain_p
            p.copy_(torch.randn(p.shape, generator=gen) * std)


@contextmanager
def deepnorm_residual(model: LlamaModel, alpha: float) -> Iterator[LlamaModel]:
    """Turn a Post-Norm model into DeepNorm for the duration: Norm(x + F(x)) becomes Norm(α·x + F(x)).

    Each block's input x (hook_resid_pre) and middle h (hook_resid_mid) are remembered; the sublayer
    outputs are replaced by F + (α − 1)·input, so the sum the norm reads is α·input + F. Gradients flow
    through the added term like through the residual itself.
    """
    if model.cfg.norm_placement != "post":
        raise ValueError("DeepNorm scales a Post-Norm residual")
    seen: dict[str, torch.Tensor] = {}

    def remember(x, hp):
        seen[hp.name] = x

    def scaled(source: str):
        def fn(out, hp):
            block = hp.name.rsplit(".", 1)[0]
            return out + (alpha - 1.0) * seen[f"{block}.{source}"]
        return fn

    hooks = []
    for i in range(model.cfg.n_layers):
        b = f"blocks.{i}"
        hooks += [(f"{b}.hook_resid_pre", remember), (f"{b}.hook_resid_mid", remember),
                  (f"{b}.hook_attn_out", scaled("hook_resid_pre")), (f"{b}.hook_mlp_out", scaled("hook_resid_mid"))]
    with model.hooks(hooks):
        yield model


@contextmanager
def variant_model(variant: str, depth: int, opts: LabOptions, seed: int, vocab: int | None = None,
                  max_seq_len: int = 256) -> Iterator[LlamaModel]:
    """A freshly initialized model of one variant, in training mode, with DeepNorm's hooks if asked."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    placement = "pre" if variant == "pre" else "post"
    with torch.random.fork_rng(devices=[]):  # construction draws numbers init_weights overwrites; keep the global RNG as it was
        model = LlamaModel(lab_config(placement, depth, opts, vocab, max_seq_len))
    init_weights(model, opts.init, seed, gain=deepnorm_beta(depth) if variant == "deepnorm" else 1.0)
    model.train()
    if variant == "deepnorm":
        with deepnorm_residual(model, deepnorm_alpha(depth)):
            yield model
    else:
        yield model
