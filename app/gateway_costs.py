"""Part of the gateway (app/explorer.py re-exports it): what a prompt's recording will cost before it runs, the
refusal of one that cannot fit, and the timed recording with a per-layer progress callback."""
from __future__ import annotations

import time as _time
from contextlib import nullcontext as _nullcontext

import torch

from app import explorer as gw
from explorer_model.recording import Recording
from explorer_model import memory as _memory

BIG_LAYERS, BIG_WIDTH = 8, 2048  # a model this deep and this wide always shows a progress bar while recording
_RATE: dict[str, float] = {}  # FLOP/s of recordings timed on this server, per weights' dtype


class PromptTooBig(ValueError):
    """A recording that would not fit in this server's memory: refused before running."""


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
    return {"tokens": n, "recording": rec_bytes, "runtime": run_bytes, "budget": budget, "seconds": seconds,
            "time_class": _memory.time_class(seconds), "cached": cached, "layers": cfg.n_layers,
            "refused": not cached and budget is not None and rec_bytes > budget,
            "progress": not cached and (big or seconds >= 1.0)}


def _recording_budget(runtime: int) -> int | None:
    """Bytes a new recording may take: the memory free now less the pass's working memory; on a shared server
    also at most the cache's byte budget (--cache-mb), the bound the teacher set for everything kept."""
    room = _memory.available_bytes()
    budget = None if room is None else room - runtime
    if gw.shared():
        budget = gw.result_cache().budget if budget is None else min(budget, gw.result_cache().budget)
    return budget


def _record_measured(source: str, ids: tuple, progress, prefix=None) -> Recording:
    """record() of every hook, refused beforehand if it cannot fit, timed to keep prompt_cost's speed current.
    prefix: (a cached recording, n) whose first n positions are those of ids: only the rest runs (extend)."""
    cost = prompt_cost(source, ids)
    if cost["refused"]:
        raise PromptTooBig(f"recording {cost['tokens']} tokens needs about {_memory.gb(cost['recording'])}, "
                           f"more than the {_memory.gb(max(cost['budget'], 0))} this server can give it")
    loaded = gw._model(source)
    start = _time.perf_counter()
    with _memory.layer_progress(loaded.model, progress) if progress else _nullcontext():
        if prefix is not None:
            return gw.extend_recording(loaded.model, prefix[0], list(ids[prefix[1]:]), keep=prefix[1])
        rec = gw.record(loaded.model, list(ids))
    flops, seconds = _memory.forward_flops(loaded.cfg, len(ids)), _time.perf_counter() - start
    if flops >= 1e10:  # shorter passes measure the hooks' overhead more than the arithmetic
        _RATE[loaded.dtype_name] = flops / seconds
    return rec



