"""A decode step compiled from C (native_step.c), for generation where no hook observes the pass.

Why: a float32 SmolLM2 step streams 538 MB of weights through one-row products. torch's one-row linear reads
~17-27 GB/s on one core of this machine, while a sum reads ~37-40 GB/s; a product that keeps sixteen rows in
flight reads about as fast as the sum (bench/bench_decode.py measures both paths), and one C call per token also
removes the ~20 Python-level operations per layer of the lean step. A short prompt (up to PROMPT_MAX tokens) runs
through the same code, four weight rows meeting four tokens at a time: faster than torch's products at that size,
and the prompt's keys and values come from the kernels the steps use. The price: sums run in another order, so
logits differ from the hooked forward's in the last bits (tests/test_native_step.py bounds the difference and
checks that greedy tokens are the same on SmolLM2 and tiny models). Where exact bits matter (a recording, an
intervention, a lesson) the hooked forward runs; this path serves `generate` only.

The library is built and cached by native_build.py. No compiler, a failed build or LLAMA_EXPLORER_NATIVE=0:
`native_applies` says False and decode.py's lean torch step runs, with the same tokens. ctypes releases the GIL for
the call, so a server's other threads run on.
"""
from __future__ import annotations

import ctypes

import torch

from .decode import _layers, lean_applies
from .native_build import enabled, library
from ..model import KVCache, LlamaModel, RMSNorm

_PER_LAYER = 16  # pointers per layer, in native_step.c's order
PROMPT_MAX = 64  # tokens of a prompt run here rather than through the model's forward (faster up to 64 at least)


class _Plan:
    """The pointers native_step.c reads for one model, gathered once (while decode.py's layer list holds)."""

    def __init__(self, model: LlamaModel, layers: list):
        cfg = model.cfg
        self.layers = layers
        self.dims = (ctypes.c_int * 7)(cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim,
                                       layers[0].d_ff, cfg.vocab_size)
        self.eps = model.ln_final.eps
        norms = [model.ln_final] + [n for b in model.blocks for n in (b.ln1, b.ln2)]
        self.ends = (model.embed.weight, model.unembed.weight, model.ln_final.weight)  # held: the pointers stay valid
        tensors = list(self.ends)
        pointers = []
        for layer in layers:
            weights = [w for _, w, _ in layer.params]  # q k v o gate up down
            biases = [b for _, _, b in layer.params]
            tensors += [layer.ln1.weight, layer.ln2.weight, *weights, *(b for b in biases if b is not None)]
            pointers += [layer.ln1.weight, layer.ln2.weight, *weights, *biases]
        self.usable = (all(isinstance(n, RMSNorm) and n.eps == self.eps for n in norms)
                       and all(t.dtype == torch.float32 and t.is_contiguous() and t.device.type == "cpu"
                               for t in tensors))
        self.pointers = (ctypes.c_void_p * len(pointers))(*(None if t is None else t.data_ptr() for t in pointers))
        self.embed, self.unembed, self.ln_final = (t.data_ptr() for t in self.ends)
        self.kv_shape = (1, 1, cfg.n_kv_heads, cfg.head_dim)


def _plan(model: LlamaModel) -> _Plan:
    layers = _layers(model)  # the same list object while the blocks keep their parameters
    plan = getattr(model, "_native_plan", None)
    ends = (model.embed.weight, model.unembed.weight, model.ln_final.weight)
    if plan is None or plan.layers is not layers or any(a is not b for a, b in zip(plan.ends, ends)):
        plan = model._native_plan = _Plan(model, layers)
    return plan


def native_applies(model: LlamaModel, cache: KVCache, n_tokens: int = 1) -> bool:
    """Whether `native_forward` can run these tokens: a decode step where the lean step could, or a short prompt
    (up to PROMPT_MAX tokens) on an empty cache, with RMSNorm, float32 contiguous CPU weights and the compiled
    library at hand."""
    if not (enabled() and 1 <= n_tokens and (n_tokens == 1 or (n_tokens <= PROMPT_MAX and cache.length == 0))):
        return False
    return lean_applies(model, cache, 1) and library() is not None and _plan(model).usable


def serves(model: LlamaModel) -> bool:
    """Whether `generate`'s steps take the compiled step for this model as it is now."""
    after_a_prompt = KVCache(model.cfg.n_layers)
    after_a_prompt.lengths = [1] * model.cfg.n_layers  # only the model's kind is asked about
    return native_applies(model, after_a_prompt)


def native_forward(model: LlamaModel, tokens: list[int], cache: KVCache) -> torch.Tensor:
    """Logits [vocab] of the last of `tokens`, which follow the cache's positions; their keys and values are
    appended to the cache. As the model's forward computes them up to the order of sums. The caller checks
    `native_applies` first."""
    plan, pos, m = _plan(model), cache.length, len(tokens)
    if not all(0 <= t < model.cfg.vocab_size for t in tokens):
        raise IndexError(f"a token id is outside the vocabulary (0..{model.cfg.vocab_size - 1})")
    if pos + m > model.cfg.max_seq_len:
        raise ValueError(f"{pos + m} positions exceed the model's {model.cfg.max_seq_len}")
    template = torch.empty(plan.kv_shape)
    for layer in range(model.cfg.n_layers):
        cache.reserve(layer, pos + m, template, template)
    cos, sin = model.rope_table(pos, pos + m)  # [m, d_head / 2], contiguous rows of the model's table
    k_caches = (ctypes.c_void_p * len(cache.k))(*(t.data_ptr() for t in cache.k))
    v_caches = (ctypes.c_void_p * len(cache.v))(*(t.data_ptr() for t in cache.v))
    ids = (ctypes.c_int * m)(*tokens)
    logits = torch.empty(model.cfg.vocab_size)
    status = library().llama_forward(plan.dims, plan.eps, plan.pointers, plan.embed, plan.ln_final, plan.unembed,
                                     cos.data_ptr(), sin.data_ptr(), k_caches, v_caches, ids, m, pos,
                                     logits.data_ptr())
    if status != 0:
        raise MemoryError("no memory for the compiled forward's scratch buffers")
    cache.lengths = [pos + m] * len(cache.lengths)
    return logits


def native_step(model: LlamaModel, token: int, cache: KVCache) -> torch.Tensor:
    """One decode step: logits [vocab] of `token` at position cache.length (see native_forward)."""
    return native_forward(model, [token], cache)
