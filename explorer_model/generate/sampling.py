"""Next-token choice: temperature, top-k, top-p, and generation with a KV cache.

`filter_steps` returns the distribution after each step, so the app can show what every knob removes.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import torch

from .decode import lean_applies, lean_step
from .native_step import native_applies, native_forward
from ..memory import layer_progress
from ..model import KVCache, LlamaModel


@dataclass(frozen=True)
class SamplingSteps:
    raw: torch.Tensor  # [vocab] softmax(logits), temperature 1
    tempered: torch.Tensor  # [vocab] softmax(logits / T)
    top_k: torch.Tensor  # [vocab] after keeping the k most likely, renormalized
    top_p: torch.Tensor  # [vocab] after keeping the smallest set with mass >= p, renormalized

    @property
    def final(self) -> torch.Tensor:
        return self.top_p


def filter_steps(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> SamplingSteps:
    """logits [vocab]. temperature 0 means greedy (all mass on the arg-max); top_k 0 and top_p 1 disable."""
    logits = logits.float()
    raw = torch.softmax(logits, -1)
    if temperature <= 0:
        tempered = torch.zeros_like(raw)
        tempered[logits.argmax()] = 1.0
    else:
        tempered = torch.softmax(logits / temperature, -1)
    kept = tempered
    if 0 < top_k < kept.numel():
        threshold = torch.topk(kept, top_k).values[-1]
        kept = torch.where(kept >= threshold, kept, torch.zeros_like(kept))
        kept = kept / kept.sum()
    after_k = kept
    if top_p < 1.0:
        probs, order = torch.sort(kept, descending=True)
        mass_before = torch.cumsum(probs, 0) - probs
        keep_sorted = mass_before < top_p  # the token that crosses p is kept, so at least one survives
        keep = torch.zeros_like(kept, dtype=torch.bool)
        keep[order[keep_sorted]] = True
        kept = torch.where(keep, kept, torch.zeros_like(kept))
        kept = kept / kept.sum()
    return SamplingSteps(raw, tempered, after_k, kept)


def choose(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
           generator: torch.Generator | None = None) -> int:
    if temperature <= 0:
        return int(logits.argmax())  # filter_steps would put all mass there: skip its softmax (a decode step's cost)
    probs = filter_steps(logits, temperature, top_k, top_p).final
    return int(torch.multinomial(probs, 1, generator=generator))


@torch.no_grad()
def generate(model: LlamaModel, prompt_ids: list[int], max_new_tokens: int = 32, temperature: float = 0.0,
             top_k: int = 0, top_p: float = 1.0, seed: int | None = None, stop_ids: set[int] | None = None,
             progress: Callable[[int, int], None] | None = None,
             on_token: Callable[[int], None] | None = None) -> list[int]:
    """New token ids after prompt_ids. The prompt runs once; each new token runs alone against the cache.
    on_token(id) is called with each new token as soon as it is chosen (the command line prints the text as it grows).

    progress(layers_done, n_layers) is called per layer during the prompt's pass, then once per new token with
    (n_layers, n_layers): steps take the compiled step (native_step.py) or the lean one (decode.py), neither of
    which has a per-layer hook to report from.
    """
    if not prompt_ids:
        raise ValueError("the prompt has no tokens")
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    cache = KVCache(model.cfg.n_layers)
    n_layers = model.cfg.n_layers
    with layer_progress(model, progress) if progress else contextlib.nullcontext():  # hooks: the model's forward
        if native_applies(model, cache, len(prompt_ids)):
            logits = native_forward(model, list(prompt_ids), cache)  # a short prompt: compiled, as the steps
        else:
            logits = model(torch.tensor([prompt_ids]), cache)[0, -1]
    out: list[int] = []
    for _ in range(max_new_tokens):
        if cache.length >= model.cfg.max_seq_len:
            break
        token = choose(logits, temperature, top_k, top_p, generator)
        out.append(token)
        if on_token:
            on_token(token)
        if progress:
            progress(n_layers, n_layers)
        if (stop_ids and token in stop_ids) or len(out) == max_new_tokens:
            break  # the last token's logits would not be used
        if native_applies(model, cache):
            logits = native_forward(model, [token], cache)  # compiled: the same tokens, sums in another order
        elif lean_applies(model, cache, 1):
            logits = lean_step(model, token, cache)  # the same bits as the hooked forward, in less time
        else:
            logits = model(torch.tensor([[token]]), cache)[0, -1]
    return out
