"""The gateway: the only place the app touches a model.

Panels get data (a Recording, `ModelFacts`, numpy arrays) and ask for explicit work through the functions
below; none of them holds an `nn.Module`. Three rules keep a classroom server predictable:
  - one forward lock: every pass through a model of this process (recordings, what-if runs, the logit lens,
    the head sweep, the twins) runs under `_FORWARD`, one at a time, so peak memory is model + cache + one pass;
  - one cache (`ResultCache`, `--cache-mb` / LLAMA_EXPLORER_CACHE_MB): every computed result, of every kind,
    counted by the bytes it really holds;
  - one lab worker process: Pre/Post-Norm experiments run there one at a time, with one torch thread set in
    that process, never in this one; a waiting visitor sees their place in the queue.
`FORWARDS["count"]` counts the model runs the gateway starts (a what-if with a source prompt counts two; a head
sweep, a lens and a lab experiment one each), for the tests.
"""
from __future__ import annotations

import io
import multiprocessing
import sys
import threading
import types
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict

import numpy as np
import streamlit as st
import torch

from app.facts import ModelFacts, facts_of
from app.result_cache import ResultCache
from app.settings import (DEFAULT_MAX_TOKENS, DEFAULT_SOURCE, cache_budget_bytes, lab_enabled,  # noqa: F401
                          offered_models, prompt_char_limit, resolve_source, shared, shipped_models, source_version,
                          token_cap)
from explorer_model.analysis import interventions as I
from explorer_model.analysis import measures as M
from explorer_model.lab import normlab as lab
from explorer_model.lab import worker
from explorer_model.tokenizer import PromptError, check_prompt
from explorer_model.lab.corpus import HELDOUT_LINE
from explorer_model.loaders import LoadedModel, LoadError, load
from explorer_model.recording import Recording, record
from explorer_model.runtime import release_freed_memory

FORWARDS = {"count": 0}
_FORWARD = threading.RLock()  # re-entrant: a what-if's KL reads the clean recording, recorded under the same lock
WHATIF_NAMES = ["blocks.*.hook_resid_post", "blocks.*.attn.hook_rot_q", "blocks.*.attn.hook_rot_k"]
KL_MAX_POS = 32  # the lens KL costs layers × positions × vocab × d_model per run: the last 32 positions


# --------------------------------------------------------------------------- models
@st.cache_resource(max_entries=3, show_spinner=False)
def _load(source: str, version: tuple | None) -> LoadedModel:
    return load(source)


def _model(source: str) -> LoadedModel:
    path = resolve_source(source)
    return _load(path, source_version(path))


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


def recording(source: str, ids) -> Recording:
    """The full recording of a prompt (cached)."""
    ids = tuple(int(i) for i in ids)

    def run() -> Recording:
        rec = record(_model(source).model, list(ids))
        _forward()
        return rec
    return result_cache().get(("recording", _ident(source), ids), run, _FORWARD)


def extend(source: str, ids, new_id: int) -> Recording:
    """Step generation: the recording of the prompt with one more token."""
    return recording(source, list(ids) + [int(new_id)])


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
        lp = M.lens_logprobs(_model(source).model, rec.stack("hook_resid_post")[:, 0, start:])  # [layer, pos, vocab]
        top, arg = lp.max(-1)
        _forward()
        return arg.numpy(), top.exp().numpy()
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


def head_sweep(source: str, ids, n_layers: int, mean: bool, progress=None) -> dict:
    """Change of p(top token) at the last position when each head of the first n_layers is ablated."""
    ids = tuple(ids)

    def run() -> dict:
        res = M.head_sweep(_model(source).model, recording(source, ids), range(n_layers), mean, progress)
        _forward()
        return {**res, "delta": res["delta"].numpy() if torch.is_tensor(res["delta"]) else res["delta"]}
    return result_cache().get(("sweep", _ident(source), ids, int(n_layers), bool(mean)), run, _FORWARD)


def cached_head_sweep(source: str, ids, n_layers: int, mean: bool) -> dict | None:
    return result_cache().peek(("sweep", _ident(source), tuple(ids), int(n_layers), bool(mean)))


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


# --------------------------------------------------------------------------- the lab worker
class LabJob:
    """One experiment in the lab worker: place in the queue, latest progress, result."""

    def __init__(self, key: tuple, future=None, result=None):
        self.key, self.future, self._result = key, future, result
        self.fraction, self.message, self.partial = 0.0, "", None

    def done(self) -> bool:
        return self.future is None or self.future.done()

    def position(self) -> int:
        """0 = running (or done), n = n experiments before this one."""
        with _LAB_LOCK:
            waiting = [j for j in _LAB_JOBS if not j.done()]
        return waiting.index(self) if self in waiting else 0

    def result(self, timeout: float | None = None) -> dict:
        if self.future is not None and self._result is None:
            self._result = self.future.result(timeout)
            _keep(self.key, self._result)
        return self._result

    def wait(self, on_update=None, every: float = 0.25) -> dict:
        """Block until done, calling on_update(job) every `every` seconds (for a queue message or live curves)."""
        while not self.done():
            if on_update:
                on_update(self)
            try:
                self.future.result(timeout=every)
            except TimeoutError:
                pass
        return self.result()


_LAB_LOCK = threading.Lock()
_LAB_JOBS: list[LabJob] = []
_LAB: dict = {}


def _lab_pool() -> tuple[ProcessPoolExecutor, object]:
    """The one worker process (started on first use; started again if it died)."""
    with _LAB_LOCK:
        if "pool" not in _LAB or getattr(_LAB["pool"], "_broken", False):
            ctx = multiprocessing.get_context("spawn")
            queue = ctx.Queue()
            pool = ProcessPoolExecutor(max_workers=1, mp_context=ctx, initializer=worker.init_worker, initargs=(queue,))
            # Streamlit runs the app script as __main__, and a spawned child imports __main__ again: it would run
            # the whole page in the worker. Start the worker with a bare __main__ instead.
            main = sys.modules["__main__"]
            sys.modules["__main__"] = types.ModuleType("__main__")
            try:
                pool.submit(worker.worker_threads).result()
            finally:
                sys.modules["__main__"] = main
            _LAB.update(pool=pool, queue=queue, next=_LAB.get("next", 0))
            threading.Thread(target=_read_progress, args=(queue,), daemon=True, name="lab-progress").start()
        return _LAB["pool"], _LAB["queue"]


def _read_progress(queue) -> None:
    while True:
        try:
            job_id, fraction, message, partial = queue.get()
        except (EOFError, OSError):
            return
        with _LAB_LOCK:
            job = next((j for j in _LAB_JOBS if getattr(j, "id", None) == job_id), None)
        if job is not None:
            job.fraction, job.message, job.partial = fraction, message, partial


class LabDisabled(RuntimeError):
    """The server was started with --no-lab: experiments not computed yet are not run."""


def _submit(key: tuple, fn, *args, cache: bool = True) -> LabJob:
    hit = result_cache().peek(key) if cache else None
    if hit is not None:
        return LabJob(key, result=hit)
    if not lab_enabled():
        raise LabDisabled("the lab's experiments are switched off on this server")
    pool, _ = _lab_pool()
    with _LAB_LOCK:
        _LAB_JOBS[:] = [j for j in _LAB_JOBS if not j.done()]
        same = next((j for j in _LAB_JOBS if j.key == key), None)  # somebody asked for it already: wait for theirs
        if same is not None:
            return same
        job = LabJob(key)
        job.id = _LAB["next"] = _LAB["next"] + 1
        job.future = pool.submit(fn, job.id, *args)
        _LAB_JOBS.append(job)

    _forward()  # one model run (in the worker) per experiment started
    job.future.add_done_callback(lambda fut: fut.exception() is None and _keep(key, fut.result()))
    return job


def _keep(key: tuple, r: dict) -> None:
    """Cache a finished experiment (a race cut off by its time limit is not the experiment's result)."""
    if r.get("completed", True) and result_cache().peek(key) is None:
        result_cache().put(key, r)


def lab_init_gradients(options: lab.LabOptions, depth: int) -> LabJob:
    """Gradients at initialization for these options (cached per options and depth, computed once per server)."""
    return _submit(("lab_init", tuple(asdict(options).items()), int(depth)), worker.run_init_gradients,
                   asdict(options), int(depth))


def lab_race(config: lab.RaceConfig, time_limit: float | None) -> LabJob:
    """The training race (deterministic per config: a completed race is cached)."""
    return _submit(("lab_race", tuple(asdict(config).items())), worker.run_race, asdict(config), time_limit)


def lab_worker_threads() -> int:
    """torch's thread count inside the lab worker (1); the server's own count is never changed."""
    pool, _ = _lab_pool()
    return pool.submit(worker.worker_threads).result()


def lab_queue_length() -> int:
    with _LAB_LOCK:
        return sum(not j.done() for j in _LAB_JOBS)


__all__ = ["FORWARDS", "ModelFacts", "LabJob", "RecordingRef", "try_load", "facts", "encode_prompt",
           "embedding_rows", "check_interventions", "recording", "extend", "recording_npz", "derived",
           "logit_lens", "whatif_run", "whatif_kl", "head_sweep", "cached_head_sweep", "twin_recordings",
           "lab_init_gradients", "lab_race", "lab_worker_threads", "lab_queue_length", "stored_bytes",
           "result_cache", "offered_models", "shared", "token_cap", "LabDisabled", "PromptError", "lab_enabled",
           "prompt_char_limit", "DEFAULT_SOURCE", "DEFAULT_MAX_TOKENS",
           "KL_MAX_POS", "WHATIF_NAMES", "patch_lesson"]


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


# --------------------------------------------------------------------------- lessons (presets)
def lesson_target(source: str, preset_key: str, ids) -> dict:
    """Where preset `preset_key`'s point is visible in the recording of `ids`, found on this model (cached):
    {"view", "layer", "head", "token", "values": placeholders of its catalog sentence}. Raises ValueError when the
    prompt does not hold what the lesson looks for (e.g. the words were edited away)."""
    from app.presets import BY_KEY
    from explorer_model.analysis import lesson as LS

    preset, ids = BY_KEY[preset_key], tuple(int(i) for i in ids)

    def find() -> dict:
        rec, tok = recording(source, ids), _model(source).tokenizer
        n, last = len(ids), len(ids) - 1
        out = {"view": preset.view, "layer": 0, "head": 0, "token": last, "values": {}}
        if preset.kind == "link":
            hit = LS.word_link_target(rec, [tok.token_bytes(i) for i in ids], *preset.args)
            out.update(layer=hit["layer"], head=hit["head"], token=hit["q"], key=hit["k"],
                       values={"layer": hit["layer"], "head": hit["head"], "weight": hit["weight"]})
        elif preset.kind == "sink":
            hit = LS.strongest(LS.sink_share(rec, 0))
            out.update(layer=hit["layer"], head=hit["head"], key=0,
                       values={"layer": hit["layer"], "head": hit["head"], "share": hit["weight"]})
        elif preset.kind == "induction":
            period = max((p for p in range(2, n // 2 + 1) if ids[n - 2 * p:n - p] == ids[n - p:]), default=0)
            if not period:
                raise ValueError("the prompt does not end in a repeated sequence")
            hit = LS.strongest(LS.induction_scores(rec, period))
            out.update(layer=hit["layer"], head=hit["head"], key=last - period + 1,
                       values={"layer": hit["layer"], "head": hit["head"], "score": hit["weight"], "period": period})
        elif preset.kind == "lens":  # the layer from which the final answer stays among the lens's top LENS_TOP
            with _FORWARD, torch.no_grad():
                lp = M.lens_logprobs(_model(source).model, rec.stack("hook_resid_post")[:, 0, last])  # [layer, vocab]
                _forward()
            final = int(lp[-1].argmax())
            ranks = (lp > lp[:, final:final + 1]).sum(-1).numpy()  # 0 = the top token after that layer
            layer = next(l for l in range(len(ranks)) if (ranks[l:] < LENS_TOP).all())
            out.update(layer=layer, values={"layer": layer, "n_layers": len(ranks), "top_id": final,
                                            "top": LENS_TOP, "rank0": int(ranks[0]) + 1})
        elif preset.kind == "split":
            text = b"".join(tok.token_bytes(i) for i in ids).decode("utf-8", errors="replace")
            split = [p for p, i in enumerate(ids) if not tok.is_special(i) and _is_fragment(tok.token_bytes(i))]
            out.update(token=split[0] if split else last,
                       values={"chars": len(text), "tokens": n, "split": len(split)})
        elif preset.kind == "special":
            special = [p for p, i in enumerate(ids) if tok.is_special(i)]
            out.update(token=special[0] if special else last, values={"special": len(special), "tokens": n})
        return out
    return result_cache().get(("lesson", _ident(source), preset_key, ids), find)


LENS_TOP = 10  # the fact lesson: "enters the top 10"


def _is_fragment(data: bytes) -> bool:
    """The token's bytes are not whole UTF-8 characters (part of a character split over tokens)."""
    try:
        data.decode("utf-8")
        return False
    except UnicodeDecodeError:
        return True


__all__ += ["lesson_target"]


# ----------------------------------------------------------------------------- what-if patch lesson (branch rwl)
def patch_lesson(source: str, ids, source_ids) -> dict:
    """Per layer, how far patching the last position's resid_post from `source_ids` moves the last prediction
    (explorer_model.analysis.patch_lesson), cached: the what-if preset's lesson target, found on the model."""
    from explorer_model.analysis.patch_lesson import patch_layer_sweep
    ids, source_ids = tuple(int(i) for i in ids), tuple(int(i) for i in source_ids)

    def run() -> dict:
        r = patch_layer_sweep(_model(source).model, ids, source_ids)
        _forward(len(r["kl"]) + 2)
        return r
    return result_cache().get(("patch_lesson", _ident(source), ids, source_ids), run, _FORWARD)
