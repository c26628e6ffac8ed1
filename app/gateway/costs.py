"""Part of the gateway (app/gateway/__init__.py re-exports it): what a run will cost before it starts, the refusal of one
that cannot fit or would hold the forward lock too long, and the timed recording with a per-layer progress callback.

Every run a visitor can trigger (a prompt's recording, compare mode's B, a what-if with its list of changes, the
logit lens, a head sweep, a generation, a download) passes `admit` with its estimate before it waits for the lock:
the bytes it keeps against the memory this server can give it, the seconds it holds the lock against
settings.max_run_seconds(). Seconds come from FLOPs and the speed of this server's timed recordings."""
from __future__ import annotations

import time as _time
from contextlib import nullcontext as _nullcontext

import torch

from app.gateway import state as gw
from app.gateway.state import PromptTooBig, RunRefused  # noqa: F401  (the refusals are the gateway's, raised here)
from app.gateway.settings import max_run_seconds, shared
from explorer_model.recording import Recording, extend as extend_recording, record
from explorer_model import memory as _memory

BIG_LAYERS, BIG_WIDTH = 8, 2048  # a model this deep and this wide always shows a progress bar while recording
_RATE: dict[str, float] = {}  # FLOP/s of recordings timed on this server, per weights' dtype


# A what-if item's hook costs about this per layer it touches for 64 tokens, growing with the prompt (measured on
# SmolLM2 here: 0.5 ms for no-mask, 2.4 ms for a head ablation, per item and layer)
ITEM_LAYER_SECONDS = 2.5e-3


def pass_seconds(source: str, n_tokens: int, flops: float | None = None) -> float:
    """Seconds of `flops` (default: a recording's forward over n_tokens) at this server's measured speed."""
    loaded = gw._model(source)
    flops = _memory.forward_flops(loaded.cfg, n_tokens) if flops is None else flops
    return flops / _RATE.get(loaded.dtype_name, _memory.DEFAULT_FLOPS)


def intervention_seconds(source: str, ivs, n_tokens: int) -> float:
    """What a list of what-if changes adds to a pass: each item's hooks, on one layer or on all of them."""
    layers = gw._model(source).cfg.n_layers
    touched = sum(layers if getattr(iv, "layer", 0) is None else 1 for iv in ivs)
    return touched * ITEM_LAYER_SECONDS * max(1.0, n_tokens / 64)


def admit(source: str, seconds: float, keeps: int = 0, runtime_tokens: int = 0) -> None:
    """Raise RunRefused when a run would hold the forward lock longer than this server allows, or keep more bytes
    than it can give (runtime_tokens: the pass's working memory, counted as for a recording of that length)."""
    bound = max_run_seconds()
    if bound is not None and seconds > bound:
        raise RunRefused("run.too_long", seconds=f"{seconds:.0f}", bound=f"{bound:.0f}")
    if keeps:
        cfg, dtype = gw._model(source).cfg, gw._model(source).dtype
        runtime = _memory.runtime_bytes(cfg, max(1, runtime_tokens), dtype) - _memory.OVERHEAD
        budget = _recording_budget(runtime)
        if budget is not None and keeps > budget:
            raise RunRefused("run.too_big", size=_memory.size_text(keeps), budget=_memory.size_text(max(budget, 0)))


def prompt_cost(source: str, ids) -> dict:
    """What recording `ids` will cost, before it runs: "tokens", "recording" (bytes the recording keeps),
    "runtime" (working bytes of the pass), "budget" (bytes this server can give a new recording, None if
    unknown), "seconds" (estimate from the FLOPs and the speed of this server's last recordings), "time_class"
    (memory.time_class), "cached" (already recorded: costs nothing now), "refused", "progress" (worth a bar)."""
    loaded, ids = gw._model(source), tuple(int(i) for i in ids)
    cfg, n = loaded.cfg, len(ids)
    rec_bytes = _memory.recording_bytes(cfg, n, torch.float32, model_dtype=loaded.dtype)  # every hook, float32
    run_bytes = _memory.runtime_bytes(cfg, n, loaded.dtype) - _memory.OVERHEAD  # the process already exists
    seconds = _memory.forward_flops(cfg, n) / _RATE.get(loaded.dtype_name, _memory.DEFAULT_FLOPS)
    budget = _recording_budget(run_bytes)
    cached = gw.result_cache().peek(("recording", gw._ident(source), ids)) is not None
    big = cfg.n_layers >= BIG_LAYERS and cfg.d_model >= BIG_WIDTH
    bound = max_run_seconds()
    return {"tokens": n, "recording": rec_bytes, "runtime": run_bytes, "budget": budget, "seconds": seconds,
            "time_class": _memory.time_class(seconds), "cached": cached, "layers": cfg.n_layers, "bound": bound,
            "refused": not cached and budget is not None and rec_bytes > budget,
            "too_long": not cached and bound is not None and seconds > bound,
            "progress": not cached and (big or seconds >= 1.0)}


def _recording_budget(runtime: int) -> int | None:
    """Bytes a new recording may take: the memory free now less the pass's working memory; on a shared server
    also at most the cache's byte budget (--cache-mb), the bound the teacher set for everything kept."""
    room = _memory.available_bytes()
    budget = None if room is None else room - runtime
    if shared():
        budget = gw.result_cache().budget if budget is None else min(budget, gw.result_cache().budget)
    return budget


def _record_measured(source: str, ids: tuple, progress, prefix=None) -> Recording:
    """record() of every hook, refused beforehand if it cannot fit, timed to keep prompt_cost's speed current.
    prefix: (a cached recording, n) whose first n positions are those of ids: only the rest runs (extend)."""
    cost = prompt_cost(source, ids)
    if cost["refused"]:
        raise PromptTooBig("big.refused", tokens=cost["tokens"], size=_memory.size_text(cost["recording"]),
                           budget=_memory.size_text(max(cost["budget"], 0)))
    if cost["too_long"] and prefix is None:  # a step after a cached prefix runs only its new positions
        raise RunRefused("run.too_long", seconds=f"{cost['seconds']:.0f}", bound=f"{cost['bound']:.0f}")
    loaded = gw._model(source)
    start = _time.perf_counter()
    with _memory.layer_progress(loaded.model, progress) if progress else _nullcontext():
        if prefix is not None:
            return extend_recording(loaded.model, prefix[0], list(ids[prefix[1]:]), keep=prefix[1])
        rec = record(loaded.model, list(ids))
    flops, seconds = _memory.forward_flops(loaded.cfg, len(ids)), _time.perf_counter() - start
    if flops >= 1e10:  # shorter passes measure the hooks' overhead more than the arithmetic
        _RATE[loaded.dtype_name] = flops / seconds
    return rec


def _admit_unless_cached(key: tuple, source: str, seconds: float, keeps: int = 0, tokens: int = 0) -> None:
    """The gateway's one check before a run (`admit` above); a cached result costs nothing."""
    if gw.result_cache().peek(key) is None:
        admit(source, seconds, keeps, tokens)
