"""The gateway: the only place the app touches a model.

Panels get data (a Recording, `ModelFacts`, numpy arrays) and ask for explicit work through the functions
below; none of them holds an `nn.Module`. Three rules keep a classroom server predictable:
  - one forward lock: every pass through a model of this process (recordings, what-if runs, the logit lens,
    the head sweep, the twins) runs under `_FORWARD`, one at a time, so peak memory is model + cache + one pass;
  - one cache (`ResultCache`, `--cache-mb` / LLAMA_EXPLORER_CACHE_MB): every computed result, of every kind,
    counted by the bytes it really holds;
  - one lab worker process: Pre/Post-Norm experiments run there one at a time, with one torch thread set in
    that process, never in this one; a waiting visitor sees their place in the queue.
The lab worker's queue is in app/lab_jobs.py, the lessons' targets in app/lessons.py: parts of this gateway,
re-exported here (panels import this module only). `FORWARDS["count"]` counts the model runs the gateway starts (a what-if with a source prompt counts two; a head
sweep, a lens and a lab experiment one each), for the tests.
"""
from __future__ import annotations

import gc
import io
import logging
import threading

import numpy as np
import streamlit as st
import torch

from app.facts import ModelFacts, facts_of
from app.lanes import LANE, ForwardLock, quick_thread_switches
from app.result_cache import ResultCache
from app.settings import (DEFAULT_MAX_TOKENS, DEFAULT_SOURCE, cache_budget_bytes, lab_enabled,  # noqa: F401
                          offered_models, prompt_char_limit, resolve_source, shared, shipped_models, source_version,
                          token_cap, warm_up_enabled, public_port)
from explorer_model.analysis import interventions as I
from explorer_model.analysis import measures as M
from explorer_model.lab import normlab as lab
from explorer_model.tokenizer import PromptError, check_prompt
from explorer_model.lab.corpus import HELDOUT_LINE
from explorer_model.loaders import LoadedModel, LoadError, load
from explorer_model.recording import Recording, record
from explorer_model.recording import extend as extend_recording
from explorer_model.runtime import release_freed_memory

FORWARDS = {"count": 0}
log = logging.getLogger("llama_explorer.gateway")
_WARM_LOCK = threading.Lock()
# re-entrant (a what-if's KL reads the clean recording, recorded under the same lock); a page run gives up the
# drawing lane while it waits for it and runs (app/lanes.py)
_FORWARD = ForwardLock(LANE)
quick_thread_switches()


def page_run():
    """Held around a whole page run by app/main.py: one page draws at a time, forward passes run beside it."""
    return LANE.held()


def pages_ahead() -> int:
    """Other visitors' page runs drawing or waiting to draw (what a page about to wait has before it)."""
    return LANE.pages()


def forwards_ahead() -> int:
    """Forward passes running or waiting, other than this page's."""
    return _FORWARD.wanted()
WHATIF_NAMES = ["blocks.*.hook_resid_post", "blocks.*.attn.hook_rot_q", "blocks.*.attn.hook_rot_k"]
KL_MAX_POS = 32  # the lens KL costs layers × positions × vocab × d_model per run: the last 32 positions


# --------------------------------------------------------------------------- models
@st.cache_resource(max_entries=3, show_spinner=False)
def _load(source: str, version: tuple | None) -> LoadedModel:
    loaded = load(source)
    # What exists now (libraries, the model, the server) lives as long as the process: out of the collector's sight,
    # a full collection walks only what page runs create (0.19 s -> 0 for ~275,000 objects here).
    gc.freeze()
    return loaded


_READY: set = set()  # (path, version) of the models this process has loaded


def _model(source: str) -> LoadedModel:
    path = resolve_source(source)
    key = (path, source_version(path))
    if key in _READY:
        return _load(*key)
    with LANE.released():  # a load takes seconds: other visitors' pages draw meanwhile (app/lanes.py)
        loaded = _load(*key)
    _READY.add(key)
    return loaded


def try_load(source: str) -> tuple[ModelFacts | None, str | None]:
    """(facts, None) or (None, one-line reason); never raises for bad input. Shared servers load only their list."""
    if shared() and source not in offered_models():
        return None, "this server only offers the models in its list"
    try:
        return facts(source), None
    except LoadError as e:
        return None, str(e)
    except (MemoryError, OSError, ValueError, RuntimeError) as e:
        return None, f"{type(e).__name__}: {e}"


def facts(source: str) -> ModelFacts:
    """What views may know about the model, built once per loaded model (a reloaded file gets new facts)."""
    loaded = _model(source)
    return _facts(_ident(source), loaded)


@st.cache_resource(max_entries=3, show_spinner=False)
def _facts(ident, _loaded: LoadedModel) -> ModelFacts:
    return facts_of(ident if isinstance(ident, str) else ident[0], _loaded)


def _ident(source: str):
    """What cached results of a model are keyed by: its name, and for a file the version of the file, so a model
    rewritten while serving gets new results (and facts) instead of the old file's."""
    version = source_version(resolve_source(source))
    return source if version is None else (source, version)


def encode_prompt(source: str, text: str, max_tokens: int) -> tuple[list[int], int]:
    """Token ids cut to max_tokens (and the server's cap and the model's context), and the length before."""
    return _encode(_model(source), text, max_tokens)


def _encode(loaded, text: str, max_tokens: int) -> tuple[list[int], int]:
    """Raises PromptError (one line) for a prompt over settings.prompt_char_limit() or not valid text."""
    ids = loaded.tokenizer.encode(check_prompt(text, prompt_char_limit()),
                                  add_bos=getattr(loaded.tokenizer, "add_bos", False))
    limit = max(1, min(max_tokens, token_cap(), loaded.model.cfg.max_seq_len))
    return ids[:limit], len(ids)


def embedding_rows(source: str, ids) -> np.ndarray:
    """Rows E[id] of the embedding matrix, [len(ids), d_model] float32 (a copy: no view into the weights)."""
    w = _model(source).model.embed.weight
    return w[torch.as_tensor(list(ids), dtype=torch.long)].detach().float().numpy().copy()


def check_interventions(source: str, specs: str) -> list:
    """Parsed interventions, or ValueError with one line when a spec does not parse or does not fit the model."""
    ivs = I.parse_list(specs)
    for iv in ivs:
        iv.check(_model(source).model)
    return ivs


# --------------------------------------------------------------------------- the cache
@st.cache_resource(show_spinner=False)
def result_cache() -> ResultCache:
    return ResultCache(cache_budget_bytes(), on_evict=release_freed_memory)


def stored_bytes() -> int:
    return result_cache().stored_bytes()


def _forward(n: int = 1) -> None:
    FORWARDS["count"] += n


def recording(source: str, ids, progress=None) -> Recording:
    """The full recording of a prompt (cached); progress(layers_done, n_layers) is called as each block finishes.
    Refused (PromptTooBig) when it cannot fit in this server's memory (prompt_cost, at the end of this file)."""
    ids = tuple(int(i) for i in ids)

    def run() -> Recording:
        rec = _record_measured(source, ids, progress)
        _forward()
        return rec
    return result_cache().get(("recording", _ident(source), ids), run, _FORWARD)


def extend(source: str, ids, new_id: int) -> Recording:
    """Step generation: the recording of the prompt with one more token. When the prompt's recording is cached,
    only the new position runs (one KV-cache step, bit-identical to recording the longer prompt: recording.py);
    otherwise the longer prompt is recorded whole."""
    ids = tuple(int(i) for i in ids)
    longer = ids + (int(new_id),)

    def run() -> Recording:
        prefix = result_cache().peek(("recording", _ident(source), ids))
        model = _model(source).model
        rec = record(model, list(longer)) if prefix is None else extend_recording(model, prefix, int(new_id))
        _forward()
        return rec
    return result_cache().get(("recording", _ident(source), longer), run, _FORWARD)


def recording_npz(source: str, ids) -> bytes:
    ids = tuple(ids)

    def pack() -> bytes:
        buf = io.BytesIO()
        np.savez_compressed(buf, **recording(source, ids).to_numpy())
        return buf.getvalue()
    return result_cache().get(("npz", _ident(source), ids), pack)


def derived(name: str, source: str, ids, fn, *args):
    """fn(recording, *args) cached under (name, source, ids, args): view data worth keeping (no model runs)."""
    ids = tuple(ids)
    return result_cache().get((f"view:{name}", _ident(source), ids, args), lambda: fn(recording(source, ids), *args))


class RecordingRef:
    """Stands in for a drawn page's Recording. Widgets' format functions and download callables close over
    the ViewContext for the whole session; through this they keep only (source, ids), so the cache stays the
    only owner of recordings. Reading fetches it again (recomputed if it was evicted)."""

    def __init__(self, source: str, ids):
        self._key = (source, tuple(ids))

    def __getattr__(self, name):
        if name == "_key":  # not set yet (e.g. a copy being made): no recursion
            raise AttributeError(name)
        return getattr(recording(*self._key), name)

    def __getitem__(self, name):
        return recording(*self._key)[name]

    def __contains__(self, name) -> bool:
        return name in recording(*self._key)

    def __iter__(self):
        return iter(recording(*self._key))

    def __len__(self) -> int:
        return len(recording(*self._key))


# --------------------------------------------------------------------------- analyses that run the model
def logit_lens(source: str, ids, start: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Top token id and its probability after each layer (final norm + unembedding) at positions start…."""
    ids = tuple(ids)

    def run():
        rec = recording(source, ids)
        # A generation step: the lens of the prompt one token shorter is cached and has the same start, so only the
        # new position runs; its [layers, 1] rows get the bits they get among all rows (>= 12 rows: stable.py).
        prefix = result_cache().peek(("lens", _ident(source), ids[:-1], int(start))) if len(ids) - 1 > start else None
        first = start if prefix is None else len(ids) - 1
        lp = M.lens_logprobs(_model(source).model, rec.stack("hook_resid_post")[:, 0, first:])  # [layer, pos, vocab]
        top, arg = lp.max(-1)
        _forward()
        if prefix is None:
            return arg.numpy(), top.exp().numpy()
        return np.concatenate([prefix[0], arg.numpy()], 1), np.concatenate([prefix[1], top.exp().numpy()], 1)
    return result_cache().get(("lens", _ident(source), ids, int(start)), run, _FORWARD)


def whatif_run(source: str, ids, specs: str, source_ids=()) -> dict:
    """The changed run, reduced to what the What-if view draws: last-position logits, p(own next token) per
    position, the loss, rotated Q/K per layer (for patterns) and resid_post at the last KL_MAX_POS positions.
    ValueError (one line) for an intervention that does not fit (e.g. a patch beyond the source prompt)."""
    ids, source_ids = tuple(ids), tuple(source_ids)

    def run() -> dict:
        rec = record(_model(source).model, list(ids), names=WHATIF_NAMES, interventions=I.parse_list(specs),
                     source_tokens=list(source_ids) or None)
        _forward(1 + bool(source_ids))
        start = max(0, len(ids) - KL_MAX_POS)
        return {"last": rec.logits[0, -1].clone(), "own": M.next_token_logprobs(rec.logits, ids).exp().numpy(),
                "loss": M.prompt_loss(rec.logits, ids),
                "rot": [(rec[f"blocks.{l}.attn.hook_rot_q"], rec[f"blocks.{l}.attn.hook_rot_k"])
                        for l in range(rec.cfg.n_layers)],
                "resid": {n: rec[n][:, start:].clone() for n in rec.names if n.endswith("hook_resid_post")}}
    return result_cache().get(("whatif", _ident(source), ids, specs, source_ids), run, _FORWARD)


def whatif_kl(source: str, ids, specs: str, source_ids=()) -> np.ndarray:
    """KL(unchanged ‖ changed) of the logit lens after each layer, mean over the last KL_MAX_POS positions."""
    ids, source_ids = tuple(ids), tuple(source_ids)

    def run() -> np.ndarray:
        clean, changed = recording(source, ids), whatif_run(source, ids, specs, source_ids)
        start = max(0, len(ids) - KL_MAX_POS)
        kl = M.lens_kl(_model(source).model, {n: clean[n][:, start:] for n in changed["resid"]}, changed["resid"])
        _forward()
        return kl.numpy()
    return result_cache().get(("whatif_kl", _ident(source), ids, specs, source_ids), run, _FORWARD)


def head_sweep(source: str, ids, n_layers: int, mean: bool, progress=None, first: int = 0) -> dict:
    """Change of p(top token) at the last position when each head of n_layers layers from `first` is ablated."""
    ids = tuple(ids)

    def run() -> dict:
        layers = range(int(first), int(first) + int(n_layers))
        res = M.head_sweep(_model(source).model, recording(source, ids), layers, mean, progress)
        _forward()
        return {**res, "delta": res["delta"].numpy() if torch.is_tensor(res["delta"]) else res["delta"]}
    return result_cache().get(("sweep", _ident(source), ids, int(n_layers), bool(mean), int(first)), run, _FORWARD)


def cached_head_sweep(source: str, ids, n_layers: int, mean: bool, first: int = 0) -> dict | None:
    return result_cache().peek(("sweep", _ident(source), tuple(ids), int(n_layers), bool(mean), int(first)))


def twin_recordings(prompt: str, max_tokens: int) -> tuple[dict | None, str | None]:
    """{"pre"/"post": {"facts", "ids", "rec", "line_rec"}} for the shipped twins on the prompt and on the held-out
    line, or (None, reason) when a twin is missing."""
    out = {}
    for v, source in zip(("pre", "post"), lab.TWINS):
        f, err = try_load(source)
        if f is None:
            return None, f"{source}: {err}"
        ids, _ = encode_prompt(source, prompt, max_tokens)
        line = _model(source).tokenizer.encode(HELDOUT_LINE, add_bos=True)
        out[v] = {"facts": f, "ids": ids, "rec": recording(source, ids), "line_rec": recording(source, line)}
    return out, None


_WARM = {"started": False}


def warm_up() -> None:
    """Once per process, in a background thread: the lab's twins loaded and their held-out line recorded, work no
    visitor's input changes, so the first visitor of the Norm lab does not wait for it (and nobody waits behind)."""
    with _WARM_LOCK:
        if _WARM["started"] or not warm_up_enabled():  # a server `serve` started, not AppTest (its counts stay its own)
            return
        _WARM["started"] = True

    def run() -> None:
        try:
            twin_recordings("", 1)
        except Exception:  # a missing or broken twin: the view says so when a visitor opens it
            log.info("warm-up of the lab twins failed", exc_info=True)
    threading.Thread(target=run, daemon=True, name="warm-up").start()


__all__ = ["FORWARDS", "ModelFacts", "LabJob", "RecordingRef", "try_load", "facts", "encode_prompt",
           "embedding_rows", "check_interventions", "recording", "extend", "recording_npz", "derived",
           "logit_lens", "whatif_run", "whatif_kl", "head_sweep", "cached_head_sweep", "twin_recordings",
           "lab_init_gradients", "lab_race", "lab_worker_threads", "lab_queue_length", "stored_bytes",
           "result_cache", "offered_models", "shared", "token_cap", "LabDisabled", "PromptError", "lab_enabled",
           "prompt_char_limit", "DEFAULT_SOURCE", "DEFAULT_MAX_TOKENS",
           "KL_MAX_POS", "WHATIF_NAMES", "patch_lesson", "page_run", "warm_up", "pages_ahead", "public_port",
           "forwards_ahead"]


# --------------------------------------------------------------------------- nrs: one layer's weight matrices
def layer_weights(source: str, layer: int) -> dict[str, np.ndarray]:
    """Copies of one block's FFN matrices, its W_v and W_O, float32 numpy in nn.Linear layout ("W_up" [d_ff, d],
    "W_down" [d, d_ff], "W_gate" [d_ff, d] only for a gated FFN, "W_v" [n_kv·d_k, d], "W_O" [d, n_heads·d_k],
    "b_O" [d] only when the output projection has a bias), cached: the SwiGLU view recomputes the FFN from a
    recorded input, the RoPE view shows what an added position vector does to V, the attention view projects
    the recorded concatenation of heads with W_O."""
    def take() -> dict[str, np.ndarray]:
        block = _model(source).model.blocks[int(layer)]
        mats = {"W_up": block.mlp.up_proj, "W_down": block.mlp.down_proj, "W_v": block.attn.v_proj,
                "W_O": block.attn.o_proj}
        if hasattr(block.mlp, "gate_proj"):
            mats["W_gate"] = block.mlp.gate_proj
        out = {k: m.weight.detach().float().numpy().copy() for k, m in mats.items()}
        if block.attn.o_proj.bias is not None:
            out["b_O"] = block.attn.o_proj.bias.detach().float().numpy().copy()
        return out
    return result_cache().get(("layer_weights", _ident(source), int(layer)), take)


__all__ += ["layer_weights"]


# --------------------------------------------------------------------------- parts of the gateway in their own files
# Imported last: they call back into this module (result_cache, _forward, _model) when they run.
from app.lab_jobs import (LabDisabled, LabJob, lab_init_gradients, lab_queue_length, lab_race,  # noqa: E402
                          lab_worker_threads)
from app.lessons import lesson_target, patch_lesson  # noqa: E402

__all__ += ["lesson_target"]


# --------------------------------------------------------------------------- big: prompt cost, per-layer progress
import time as _time  # noqa: E402
from contextlib import nullcontext as _nullcontext  # noqa: E402

from explorer_model import memory as _memory  # noqa: E402

BIG_LAYERS, BIG_WIDTH = 8, 2048  # a model this deep and this wide always shows a progress bar while recording
_RATE: dict[str, float] = {}  # FLOP/s of recordings timed on this server, per weights' dtype


class PromptTooBig(ValueError):
    """A recording that would not fit in this server's memory: refused before running."""


def prompt_cost(source: str, ids) -> dict:
    """What recording `ids` will cost, before it runs: "tokens", "recording" (bytes the recording keeps),
    "runtime" (working bytes of the pass), "budget" (bytes this server can give a new recording, None if
    unknown), "seconds" (estimate from the FLOPs and the speed of this server's last recordings), "time_class"
    (memory.time_class), "cached" (already recorded: costs nothing now), "refused", "progress" (worth a bar)."""
    loaded, ids = _model(source), tuple(int(i) for i in ids)
    cfg, n = loaded.cfg, len(ids)
    rec_bytes = _memory.recording_bytes(cfg, n, torch.float32)  # what recording() keeps: every hook, float32
    run_bytes = _memory.runtime_bytes(cfg, n, loaded.dtype) - _memory.OVERHEAD  # the process already exists
    seconds = _memory.forward_flops(cfg, n) / _RATE.get(loaded.dtype_name, _memory.DEFAULT_FLOPS)
    budget = _recording_budget(run_bytes)
    cached = result_cache().peek(("recording", _ident(source), ids)) is not None
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
    if shared():
        budget = result_cache().budget if budget is None else min(budget, result_cache().budget)
    return budget


def _record_measured(source: str, ids: tuple, progress) -> Recording:
    """record() of every hook, refused beforehand if it cannot fit, timed to keep prompt_cost's speed current."""
    cost = prompt_cost(source, ids)
    if cost["refused"]:
        raise PromptTooBig(f"recording {cost['tokens']} tokens needs about {_memory.gb(cost['recording'])}, "
                           f"more than the {_memory.gb(max(cost['budget'], 0))} this server can give it")
    loaded = _model(source)
    start = _time.perf_counter()
    with _memory.layer_progress(loaded.model, progress) if progress else _nullcontext():
        rec = record(loaded.model, list(ids))
    flops, seconds = _memory.forward_flops(loaded.cfg, len(ids)), _time.perf_counter() - start
    if flops >= 1e10:  # shorter passes measure the hooks' overhead more than the arithmetic
        _RATE[loaded.dtype_name] = flops / seconds
    return rec


__all__ += ["prompt_cost", "PromptTooBig", "BIG_LAYERS", "BIG_WIDTH"]


# --------------------------------------------------------------------------- compare mode (issue 13): recording B
# A side of a comparison is (source, ids, specs): specs "" is the plain recording, else the same prompt and model
# run with what-if interventions (their string form, as in the What-if view and the URL).
def changed_recording(source: str, ids, specs: str = "") -> Recording:
    """The full recording of a prompt run with interventions, cached like recording(); specs "" is recording().
    ValueError (one line) for a spec that does not parse or fit the model; a patch needs a second prompt and is
    left to the What-if view."""
    ids, specs = tuple(int(i) for i in ids), (specs or "").strip()
    if not specs:
        return recording(source, ids)
    ivs = check_interventions(source, specs)
    if any(isinstance(iv, I.Patch) for iv in ivs):
        raise ValueError("a patch needs a source prompt: use the What-if view for it")

    def run() -> Recording:
        rec = record(_model(source).model, list(ids), interventions=ivs)
        _forward()
        return rec
    return result_cache().get(("recording", _ident(source), ids, I.format_list(ivs)), run, _FORWARD)


def pair_derived(name: str, sides, fn, *args):
    """fn(recording of each side, *args) cached under (name, each side's identity, args): compare-mode data worth
    keeping between switches (per-layer curves, difference maps); no model runs. sides: (source, ids, specs)."""
    keys = tuple((_ident(s), tuple(int(i) for i in ids), (sp or "").strip()) for s, ids, sp in sides)
    return result_cache().get((f"pair:{name}", keys, args),
                              lambda: fn(*[changed_recording(*side) for side in sides], *args))


def changed_recording_npz(source: str, ids, specs: str = "") -> bytes:
    """B's recording as .npz (the sidebar's download in compare mode), cached like recording_npz."""
    ids, specs = tuple(int(i) for i in ids), (specs or "").strip()
    if not specs:
        return recording_npz(source, ids)

    def pack() -> bytes:
        buf = io.BytesIO()
        np.savez_compressed(buf, **changed_recording(source, ids, specs).to_numpy())
        return buf.getvalue()
    return result_cache().get(("npz", _ident(source), ids, specs), pack)


__all__ += ["changed_recording", "pair_derived", "changed_recording_npz"]


def compare_lesson(source: str, preset_key: str, ids) -> dict:
    """Where a comparison preset's point shows (app/presets.py, kind "compare"), found on A and the preset's B
    (cached): {"view", "layer", "head", "token", "values": placeholders of its catalog sentence}."""
    from app.presets import BY_KEY
    from explorer_model.analysis import compare as C
    preset, ids = BY_KEY[preset_key], tuple(int(i) for i in ids)
    args = dict(preset.args)

    def find() -> dict:
        a, src_b = recording(source, ids), args.get("cmp_model", source)
        ids_b = ids if args["cmp"] == "whatif" else tuple(
            encode_prompt(src_b, args.get("cmp_prompt", preset.prompt), DEFAULT_MAX_TOKENS)[0])
        b = changed_recording(src_b, ids_b, args.get("cmp_iv", ""))
        out = {"view": preset.view, "layer": 0, "head": 0, "token": len(ids) - 1, "values": {}}
        if args["cmp"] == "whatif":  # the head whose attention the change moves most
            js = C.attention_js(a, b)["js"].mean(-1)
            layer, head = (int(x) for x in np.unravel_index(int(np.argmax(js)), js.shape))
            out.update(layer=layer, head=head, values={"layer": layer, "head": head, "js": float(js[layer, head])})
        elif args["cmp"] == "prompt":  # the shared prefix reads alike; where the later words move the stream most
            align = C.align_minimal_pair(ids, ids_b)
            ratio = C.resid_change_map(a, b, align)["ratio"]
            k = int(np.argmax(ratio[-1]))
            out.update(token=int(align.pairs[k][0]), values={"prefix": align.prefix, "top": int(align.pairs[k][0]),
                                                             "ratio": float(ratio[-1, k])})
        else:  # Pre vs Post: the residual stream's RMS after every block
            ca, cb = C.layer_curves(a, attention=False), C.layer_curves(b, attention=False)
            out["values"] = {"pre_first": float(ca.stream_rms[0]), "pre_last": float(ca.stream_rms[-1]),
                             "post_min": float(cb.stream_rms[1:].min()), "post_max": float(cb.stream_rms[1:].max())}
        return out
    return result_cache().get(("compare_lesson", _ident(source), preset_key, ids), find)


__all__ += ["compare_lesson"]
