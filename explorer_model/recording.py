"""Recording: run the model once and keep every selected hooked tensor, detached, on the CPU.

    with recorder(model, names=["blocks.*.attn.*"]) as rec:
        model(tokens)
    rec["blocks.3.attn.hook_pattern"]          # [batch, head, q_pos, k_pos]

or simply `rec = record(model, tokens)`.

Attention scores and patterns are [head, pos, pos] per layer: at 1024 tokens they would be two thirds of
a full recording. By default ("derived") the recorder keeps the rotated Q and K they are made of
(float32, a few MB per layer) and rebuilds scores and pattern on access with the model's written-out equation
(`causal_scores`, `attention_pattern`), which the model itself runs whenever its weights are observed; a pass that
observes none takes the fused kernel, whose z equals pattern @ V to within float32 rounding (tested). The rotated Q and K of such
a layer are served from that float32 pair (converted on access in a float16 recording, never kept twice).
`attention="stored"` hooks them directly instead, which forces the explicit attention path.

A float32 recording of a float32 model does not keep the hooks that are one elementwise step from others it keeps
(`rebuilt_from`): SwiGLU's SiLU(gate) and SiLU(gate)·up, and RMSNorm's x / scale. They are rebuilt on access with
the model's own arithmetic, and only after the recorder has checked that the rebuild equals the hooked tensor bit
for bit (an intervention that edits one of them keeps it stored). That is 31 % of a SmolLM2 recording, so a
classroom server's cache holds half as many recordings again.

`extend(model, rec, token_ids, keep)` keeps a prefix of a recording and runs only the new positions with the KV
cache; it equals recording the whole prompt to within float32 rounding (products of other row counts may take
other kernels: kernels.py).
"""
from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Iterable

import numpy as np
import torch

from .config import ModelConfig
import torch.nn.functional as F

from .interventions import intervene
from .model import KVCache, LlamaModel, attention_pattern, causal_scores
from .tokenizer import PromptError, check_ids

_DERIVED = re.compile(r"blocks\.(\d+)\.attn\.hook_(attn_scores|pattern)$")
_ROTATED = re.compile(r"blocks\.(\d+)\.attn\.hook_rot_(q|k)$")
_MLP_ACT = re.compile(r"blocks\.(\d+)\.mlp\.hook_(act|post)$")
_NORMALIZED = re.compile(r"blocks\.(\d+)\.ln([12])\.hook_normalized$")


def rebuilt_from(cfg: ModelConfig, name: str) -> tuple[str, ...] | None:
    """The hooks `name` is one elementwise step from, in the model's forward order of arithmetic, or None.

    Elementwise only (SiLU, a product, a sum, a division) on tensors of the very shapes the forward pass had, so
    a rebuild in the recording's process runs the same kernel on the same values as the pass did; the recorder
    also checks each rebuild bit for bit before trusting it. LayerNorm's normalized tensor needs a mean over the
    row, so it is always stored.
    """
    m = _MLP_ACT.match(name)
    if m and cfg.ffn_type == "swiglu":
        mlp = f"blocks.{m.group(1)}.mlp."
        return (mlp + "hook_pre",) if m.group(2) == "act" else (mlp + "hook_pre", mlp + "hook_pre_linear")
    m = _NORMALIZED.match(name)
    if m and cfg.norm_type == "rms":
        block, first = f"blocks.{m.group(1)}.", m.group(2) == "1"
        x = block + ("hook_resid_pre" if first else "hook_resid_mid")
        # Pre-Norm normalizes the sublayer's input; Post-Norm the sum x + sublayer(x) (Block.forward).
        added = () if cfg.norm_placement == "pre" else (block + ("hook_attn_out" if first else "hook_mlp_out"),)
        return (x, *added, f"{block}ln{m.group(2)}.hook_scale")
    return None


def rebuild(name: str, sources: list[torch.Tensor]) -> torch.Tensor:
    """`name`'s tensor from its rebuilt_from sources, with MLP.forward's and RMSNorm.forward's arithmetic."""
    if name.endswith(("mlp.hook_act", "mlp.hook_post")):
        act = F.silu(sources[0])
        return act if name.endswith("hook_act") else act * sources[1]
    *summands, scale = sources
    x = summands[0] if len(summands) == 1 else summands[0] + summands[1]
    return x / scale


class Recording(Mapping):
    """Read-only mapping hook name -> tensor, plus the token ids, logits and a few per-layer helpers."""

    def __init__(self, cfg: ModelConfig, names: list[str], store: dict[str, torch.Tensor],
                 rotated: dict[int, tuple[torch.Tensor, torch.Tensor]], dtype: torch.dtype,
                 rebuilt: set[str] | None = None):
        self.cfg = cfg
        self.names = names  # selected hook names, in forward order
        self._store = store
        self._rebuilt = set() if rebuilt is None else rebuilt  # names rebuilt on access (rebuilt_from), not stored
        self._rotated = rotated  # layer -> (rot_q, rot_k) float32, for derived attention
        self.dtype = dtype
        self.token_ids: torch.Tensor | None = None  # [batch, pos]

    # Mapping interface
    def __getitem__(self, name: str) -> torch.Tensor:
        if name in self._store:
            return self._store[name]
        if name in self._rebuilt:
            return rebuild(name, [self[source] for source in rebuilt_from(self.cfg, name)])
        m = _DERIVED.match(name)
        if m and name in self.names:
            scores = causal_scores(*self._rotated[int(m.group(1))])
            return (scores if m.group(2) == "attn_scores" else attention_pattern(scores)).to(self.dtype)
        m = _ROTATED.match(name)
        if m and name in self.names and int(m.group(1)) in self._rotated:
            return self._rotated[int(m.group(1))][m.group(2) == "k"].to(self.dtype)
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
        """The same hook across layers: stack('ln1.hook_scale') -> [layer, batch, pos, 1] (every layer, or `layers`)."""
        layers = range(self.cfg.n_layers) if layers is None else layers
        held = [l for l in range(self.cfg.n_layers) if f"blocks.{l}.{suffix}" in self.names]
        missing = [l for l in layers if l not in held]
        if missing:
            raise KeyError(f"stack({suffix!r}) needs layer {missing[0]}, which this recording does not hold (it "
                           f"holds {suffix} of layers {held}: pass layers=[…] of those)")
        return torch.stack([self[f"blocks.{l}.{suffix}"] for l in layers])

    def pattern(self, layer: int) -> torch.Tensor:
        return self[f"blocks.{layer}.attn.hook_pattern"]  # [batch, head, q_pos, k_pos]

    def scores(self, layer: int) -> torch.Tensor:
        return self[f"blocks.{layer}.attn.hook_attn_scores"]  # [batch, head, q_pos, k_pos]

    def kv_head(self, head: int) -> int:
        return head // self.cfg.n_rep

    def stored_bytes(self) -> int:
        """Bytes of the distinct storages held: a tensor kept under two names (resid_post of layer L is
        resid_pre of L + 1) counts once."""
        tensors = list(self._store.values()) + [t for qk in self._rotated.values() for t in qk]
        storages = {}
        for t in tensors:
            s = t.untyped_storage()
            storages[s.data_ptr()] = max(storages.get(s.data_ptr(), 0), s.nbytes())
        return sum(storages.values())

    def to_numpy(self) -> dict[str, np.ndarray]:
        """Every recorded name (derived ones materialized), plus token_ids and logits."""
        out = {name: as_numpy(self[name]) for name in self.names}
        out["token_ids"] = self.token_ids.numpy()
        out["logits"] = as_numpy(self.logits)
        return out


def recorded_names(model: LlamaModel, names: Iterable[str] | None = None,
                   layers: Iterable[int] | None = None) -> list[str]:
    """The names a recording of `names` (globs, all if None) in `layers` holds, in forward order: the selected
    hooks, and the logits always (every view ends in a prediction)."""
    selected = model.select_hooks(names, layers)
    if "logits" not in selected:
        selected.append("logits")
    return selected


def rebuildable_names(cfg: ModelConfig, selected) -> dict[str, tuple[str, ...]]:
    """The selected names a float32 recording may rebuild instead of storing: those whose sources are selected."""
    chosen = set(selected)
    return {name: sources for name in selected
            if (sources := rebuilt_from(cfg, name)) and all(s in chosen for s in sources)}


@contextmanager
def recorder(model: LlamaModel, names: Iterable[str] | None = None, layers: Iterable[int] | None = None,
             dtype: torch.dtype = torch.float32, attention: str = "derived") -> Iterator[Recording]:
    """Attach caching hooks for the selected names (checked as record() checks them: checked_selection); they are
    removed on exit, even on error."""
    if attention not in ("derived", "stored"):
        raise ValueError("attention must be 'derived' or 'stored'")
    selected = recorded_names(model, *checked_selection(model, names, layers))
    store: dict[str, torch.Tensor] = {}
    rotated: dict[int, list] = {}
    last = [None, None]  # the previous hooked tensor and its kept copy
    # Only a float32 model's hooks: a 16-bit model's SiLU and sums run in 16 bits (memory.recording_bytes agrees).
    float32 = dtype == model.embed.weight.dtype == torch.float32
    rebuildable = rebuildable_names(model.cfg, selected) if float32 else {}
    rebuilt: set[str] = set()

    def keep(x: torch.Tensor, hp) -> None:
        sources = rebuildable.get(hp.name)
        if sources and x.dtype == torch.float32 and x.device.type == "cpu" and all(s in store for s in sources):
            if torch.equal(rebuild(hp.name, [store[s] for s in sources]), x):
                rebuilt.add(hp.name)  # served by rebuilding on access, bit for bit
                return
        # Consecutive hooks see the same tensor (hook_embed and blocks.0.hook_resid_pre; resid_post of L and
        # resid_pre of L + 1): keep one copy for both, also when converting to float16.
        if x is not last[0]:
            kept = x.detach()
            last[:] = x, kept.to("cpu", dtype) if kept.dtype != dtype or kept.device.type != "cpu" else kept
        store[hp.name] = last[1]

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
    for name in selected:
        m = _ROTATED.match(name)
        if not _DERIVED.match(name) or attention != "derived":
            if not (m and int(m.group(1)) in derived_layers):  # served from the float32 pair kept below
                fwd_hooks.append((name, keep))
    for layer in sorted(derived_layers):
        fwd_hooks.append((f"blocks.{layer}.attn.hook_rot_q", keep_rotated(0)))
        fwd_hooks.append((f"blocks.{layer}.attn.hook_rot_k", keep_rotated(1)))

    rec = Recording(model.cfg, selected, store, rotated, dtype, rebuilt)  # rebuilt: filled as the hooks run
    with model.hooks(fwd_hooks):
        yield rec
    last.clear()
    rec._rotated = {k: (v[0], v[1]) for k, v in rotated.items()}


def as_numpy(t: torch.Tensor) -> np.ndarray:
    """A recorded tensor as numpy: numpy has no bfloat16, so a bfloat16 tensor becomes float32 (every value exactly);
    every other dtype stays."""
    return (t.float() if t.dtype == torch.bfloat16 else t).numpy()


def checked_selection(model: LlamaModel, names, layers) -> tuple[list[str] | None, list[int] | None]:
    """record()'s selection as a person writes it, checked as the CLI checks --names: a single string is one
    pattern (iterated, "blocks.*" would be its characters, and "*" among them every hook); a name or pattern that
    matches no hook point, or a layer the model lacks, is refused (ValueError, one line) rather than recorded as
    nothing."""
    if isinstance(names, str):
        names = [names]
    if names is not None:
        names = list(names)
        if not names:
            raise ValueError("names is empty: nothing would be recorded (names=None records every hook point)")
        hooks = model.hook_dict
        for pattern in names:
            if pattern not in hooks and not any(fnmatch.fnmatchcase(h, pattern) for h in hooks):
                raise ValueError(f"names {pattern!r} matches no hook point of this model (docs/hooks.md)")
    if layers is not None:
        layers, n = [int(layer) for layer in layers], model.cfg.n_layers
        for layer in layers:
            if not 0 <= layer < n:
                raise ValueError(f"layer {layer} does not exist: the model has layers 0…{n - 1}")
    return names, layers


def record(model: LlamaModel, tokens: torch.Tensor | list[int], names: Iterable[str] | None = None,
           layers: Iterable[int] | None = None, dtype: torch.dtype = torch.float32,
           attention: str = "derived", interventions: Iterable | None = None, source_tokens=None) -> Recording:
    """One forward pass over tokens [batch, pos] (or a list of ids), recording the selected hooks.

    `interventions` (string forms or objects, see interventions.py) change this run; `source_tokens` is the
    source prompt of `patch:` interventions. Scores and patterns are then hooked, not rebuilt, if an
    intervention replaces them (no-mask), since the rebuild would put the causal mask back.
    """
    if isinstance(tokens, str):  # text, not ids: say what to do, not torch's "invalid data type 'str'"
        raise PromptError("record() takes token ids, not text: tokenizer.encode_prompt(text) gives them")
    tokens = torch.as_tensor(tokens, dtype=torch.long)
    if tokens.dim() == 1:
        tokens = tokens[None]
    for row in tokens:  # an empty prompt, an id past the embedding: one line, not torch's IndexError
        check_ids(row.tolist(), model.cfg.vocab_size, model.cfg.max_seq_len)
    if interventions is None:
        with torch.no_grad(), recorder(model, names, layers, dtype, attention) as rec:
            model(tokens)
    else:
        with torch.no_grad(), intervene(model, interventions, source_tokens) as active:
            with recorder(model, names, layers, dtype, "stored" if active.alters_attention else attention) as rec:
                model(tokens)
    rec.token_ids = tokens.cpu()
    return rec


def extend(model: LlamaModel, rec: Recording, token_ids: int | list[int], keep: int | None = None) -> Recording:
    """`rec`'s first `keep` positions (all by default) plus `token_ids`, which run against those positions' K/V
    taken from the recording: a generation step (one token), or a prompt changed from position `keep` on.

    Equal, hook by hook, to `record(model, rec.token_ids[:keep] + token_ids, rec.names)` to within float32
    rounding: the prefix's activations do not change in a causal model, but the new positions' products run
    with other row counts, which a BLAS may sum in another order (tests/test_extend.py states the tolerance).
    Needs a float32 recording of one prompt with derived attention that holds every layer's V and rotated K
    (a full recording does).
    """
    cfg = model.cfg
    new = [int(token_ids)] if isinstance(token_ids, int) else [int(t) for t in token_ids]
    if rec.dtype != torch.float32 or rec.token_ids is None or rec.token_ids.shape[0] != 1:
        raise ValueError("extend needs a float32 recording of one prompt")
    if any(_DERIVED.match(name) for name in rec._store):
        raise ValueError("extend needs derived attention: a recording that stores scores and weights (attention="
                         "'stored', or a run whose attention was changed, e.g. no-mask) cannot grow")
    keep = rec.n_pos if keep is None else int(keep)
    if not 1 <= keep <= rec.n_pos or not new:
        raise ValueError(f"extend keeps 1..{rec.n_pos} positions and adds at least one token (keep={keep}, "
                         f"{len(new)} new)")
    if keep + len(new) > cfg.max_seq_len:
        raise ValueError(f"the recording already has the model's maximum of {cfg.max_seq_len} positions")
    check_ids(new, cfg.vocab_size, None)  # PromptError for an id outside the vocabulary, as record() says it
    cache = KVCache(cfg.n_layers)
    for layer in range(cfg.n_layers):
        rot_k = rec._rotated[layer][1] if layer in rec._rotated else rec._store.get(f"blocks.{layer}.attn.hook_rot_k")
        v = rec._store.get(f"blocks.{layer}.attn.hook_v")
        if rot_k is None or v is None:
            raise ValueError(f"extend needs V and rotated K of every layer; layer {layer} has not both recorded")
        # the recording keeps float32 copies; a 16-bit model's K/V were its own dtype, so the cast back is exact
        cache.extend(layer, rot_k[:, :keep].to(model.dtype), v[:, :keep].to(model.dtype))
    with torch.no_grad(), recorder(model, rec.names, dtype=rec.dtype) as step:
        model(torch.tensor([new]), cache)

    joined: dict[int, torch.Tensor] = {}  # by the old tensor, so shared tensors stay shared

    def join(old: torch.Tensor, added: torch.Tensor) -> torch.Tensor:
        if id(old) not in joined:
            joined[id(old)] = torch.cat([old[:, :keep], added], 1)  # every recorded tensor is [batch, pos, ...]
        return joined[id(old)]

    store = {name: join(t, step[name]) for name, t in rec._store.items()}  # step[name]: stored or rebuilt
    for name in rec._rebuilt - step._rebuilt:  # rebuilt in the prefix only: the joined tensor is stored
        store[name] = torch.cat([rec[name][:, :keep], step._store[name]], 1)
    rotated = {layer: (join(rq, step._rotated[layer][0]), join(rk, step._rotated[layer][1]))
               for layer, (rq, rk) in rec._rotated.items()}
    out = Recording(cfg, list(rec.names), store, rotated, rec.dtype, rec._rebuilt & step._rebuilt)
    out.token_ids = torch.cat([rec.token_ids[:, :keep], torch.tensor([new])], 1)
    return out
