"""Recording: run the model once and keep every selected hooked tensor, detached, on the CPU.

    with recorder(model, names=["blocks.*.attn.*"]) as rec:
        model(tokens)
    rec["blocks.3.attn.hook_pattern"]          # [batch, head, q_pos, k_pos]

or simply `rec = record(model, tokens)`.

Attention scores and patterns are [head, pos, pos] per layer: at 1024 tokens they would be two thirds of
a full recording. By default ("derived") the recorder keeps the rotated Q and K they are made of
(float32, a few MB per layer) and rebuilds scores and pattern on access with the very functions the
model uses (`causal_scores`, `attention_pattern`), so the values are the ones the model computes.
`attention="stored"` hooks them directly instead, which forces the explicit attention path.
"""
from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Iterable

import numpy as np
import torch

from .config import ModelConfig
from .model import LlamaModel, attention_pattern, causal_scores

_DERIVED = re.compile(r"blocks\.(\d+)\.attn\.hook_(attn_scores|pattern)$")


class Recording(Mapping):
    """Read-only mapping hook name -> tensor, plus the token ids, logits and a few per-layer helpers."""

    def __init__(self, cfg: ModelConfig, names: list[str], store: dict[str, torch.Tensor],
                 rotated: dict[int, tuple[torch.Tensor, torch.Tensor]], dtype: torch.dtype):
        self.cfg = cfg
        self.names = names  # selected hook names, in forward order
        self._store = store
        self._rotated = rotated  # layer -> (rot_q, rot_k) float32, for derived attention
        self.dtype = dtype
        self.token_ids: torch.Tensor | None = None  # [batch, pos]

    # Mapping interface
    def __getitem__(self, name: str) -> torch.Tensor:
        if name in self._store:
            return self._store[name]
        m = _DERIVED.match(name)
        if m and name in self.names:
            rot_q, rot_k = self._rotated[int(m.group(1))]
            scores = causal_scores(rot_q, rot_k)
            out = scores if m.group(2) == "attn_scores" else attention_pattern(scores)
            return out.to(self.dtype)
        raise KeyError(f"{name!r} was not recorded")

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)

    def __contains__(self, name) -> bool:
        return name in self.names

    # Helpers
    @property
    def logits(self) -> torch.Tensor:
        return self._store["logits"]  # [batch, pos, vocab]

    @property
    def n_pos(self) -> int:
        return int(self.token_ids.shape[1])

    def stack(self, suffix: str, layers: Iterable[int] | None = None) -> torch.Tensor:
        """The same hook across layers: stack('ln1.hook_scale') -> [layer, batch, pos, 1]."""
        layers = range(self.cfg.n_layers) if layers is None else layers
        return torch.stack([self[f"blocks.{l}.{suffix}"] for l in layers])

    def pattern(self, layer: int) -> torch.Tensor:
        return self[f"blocks.{layer}.attn.hook_pattern"]  # [batch, head, q_pos, k_pos]

    def scores(self, layer: int) -> torch.Tensor:
        return self[f"blocks.{layer}.attn.hook_attn_scores"]  # [batch, head, q_pos, k_pos]

    def kv_head(self, head: int) -> int:
        return head // self.cfg.n_rep

    def stored_bytes(self) -> int:
        tensors = list(self._store.values()) + [t for qk in self._rotated.values() for t in qk]
        return sum(t.numel() * t.element_size() for t in tensors)

    def to_numpy(self) -> dict[str, np.ndarray]:
        """Every recorded name (derived ones materialized), plus token_ids and logits."""
        out = {name: self[name].float().numpy() if self[name].dtype == torch.bfloat16 else self[name].numpy()
               for name in self.names}
        out["token_ids"] = self.token_ids.numpy()
        out["logits"] = self.logits.numpy()
        return out


@contextmanager
def recorder(model: LlamaModel, names: Iterable[str] | None = None, layers: Iterable[int] | None = None,
             dtype: torch.dtype = torch.float32, attention: str = "derived") -> Iterator[Recording]:
    """Attach caching hooks for the selected names; they are removed on exit, even on error."""
    if attention not in ("derived", "stored"):
        raise ValueError("attention must be 'derived' or 'stored'")
    selected = model.select_hooks(names, layers)
    if "logits" not in selected:
        selected.append("logits")  # always kept: every view ends in a prediction
    store: dict[str, torch.Tensor] = {}
    rotated: dict[int, list] = {}

    def keep(x: torch.Tensor, hp) -> None:
        x = x.detach()
        store[hp.name] = x.to("cpu", dtype) if x.dtype != dtype or x.device.type != "cpu" else x

    def keep_rotated(slot: int):
        def fn(x: torch.Tensor, hp) -> None:
            rotated.setdefault(int(hp.name.split(".")[1]), [None, None])[slot] = x.detach().float().cpu()
        return fn

    fwd_hooks = []
    derived_layers = set()
    for name in selected:
        m = _DERIVED.match(name)
        if m and attention == "derived":
            derived_layers.add(int(m.group(1)))
        else:
            fwd_hooks.append((name, keep))
    for layer in sorted(derived_layers):
        fwd_hooks.append((f"blocks.{layer}.attn.hook_rot_q", keep_rotated(0)))
        fwd_hooks.append((f"blocks.{layer}.attn.hook_rot_k", keep_rotated(1)))

    rec = Recording(model.cfg, selected, store, rotated, dtype)
    with model.hooks(fwd_hooks):
        yield rec
    # A derived layer whose rot_q was also selected shares one tensor; drop the stored duplicate dtype copy
    # only if dtypes match, so memory is not counted twice.
    for layer, (rq, rk) in rotated.items():
        for slot, key in ((0, "rot_q"), (1, "rot_k")):
            stored = store.get(f"blocks.{layer}.attn.hook_{key}")
            if stored is not None and stored.dtype == torch.float32:
                rotated[layer][slot] = stored
    rec._rotated = {k: (v[0], v[1]) for k, v in rotated.items()}


def record(model: LlamaModel, tokens: torch.Tensor | list[int], names: Iterable[str] | None = None,
           layers: Iterable[int] | None = None, dtype: torch.dtype = torch.float32,
           attention: str = "derived", interventions: Iterable | None = None, source_tokens=None) -> Recording:
    """One forward pass over tokens [batch, pos] (or a list of ids), recording the selected hooks.

    `interventions` (string forms or objects, see interventions.py) change this run; `source_tokens` is the
    source prompt of `patch:` interventions. Scores and patterns are then hooked, not rebuilt, if an
    intervention replaces them (no-mask), since the rebuild would put the causal mask back.
    """
    tokens = torch.as_tensor(tokens, dtype=torch.long)
    if tokens.dim() == 1:
        tokens = tokens[None]
    if interventions is None:
        with torch.no_grad(), recorder(model, names, layers, dtype, attention) as rec:
            model(tokens)
    else:
        from .analysis.interventions import intervene

        with torch.no_grad(), intervene(model, interventions, source_tokens) as active:
            with recorder(model, names, layers, dtype, "stored" if active.alters_attention else attention) as rec:
                model(tokens)
    rec.token_ids = tokens.cpu()
    return rec
