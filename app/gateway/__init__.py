"""The gateway: the only place the app touches a model. Panels import this module only.

Panels get data (a Recording, `ModelFacts`, numpy arrays) and ask for explicit work through the functions
below; none of them holds an `nn.Module`. Three rules keep a classroom server predictable:
  - one forward lock: every pass through a model of this process (recordings, what-if runs, the logit lens,
    the head sweep, the twins) runs under `_FORWARD`, one at a time, so peak memory is model + cache + one pass;
  - one cache (`ResultCache`, `--cache-mb` / LLAMA_EXPLORER_CACHE_MB): every computed result, of every kind,
    counted by the bytes it really holds;
  - one lab worker process: Pre/Post-Norm experiments run there one at a time, with one torch thread set in
    that process, never in this one; a waiting visitor sees their place in the queue.

Its parts, each importing only the parts below it (this module imports them all and re-exports their API):
  gateway_state.py    loaded models, the forward lock, the result cache, token ids, parsed what-if changes
  gateway_costs.py    what a run will cost, the refusal of one that cannot fit, the timed recording
  gateway_exports.py  a recording's .npz download, built on disk within a byte cap
  gateway_runs.py     every model run a page asks for: recordings, continuations, lens, what-if, sweeps, twins
  gateway_compare.py  compare mode's side B and the pair data of two recordings
  gateway_figures.py  drawn figures and tables cached in the result cache
  lab_jobs.py         the lab worker's queue;  lessons.py  the presets' targets found on the model
`FORWARDS["count"]` counts the model runs the gateway starts (a what-if with a source prompt counts two; a head
sweep, a lens and a lab experiment one each), for the tests.
"""
from __future__ import annotations

import logging
import threading

from app.facts import ModelFacts
from app.gateway.compare import changed_recording, changed_recording_npz, compare_lesson, pair_derived
from app.gateway.costs import (BIG_LAYERS, BIG_WIDTH, admit, intervention_seconds, pass_seconds,  # noqa: F401
                               prompt_cost)
from app.gateway.exports import check_export, export_cap_bytes, npz_bytes, npz_file
from app.gateway.figures import figure, table
from app.gateway.runs import (RecordingRef, cached_head_sweep, continuation, derived, derived_cached, extend,  # noqa: F401
                              head_sweep, layer_weights, lens_cached, logit_lens, recording, recording_npz,
                              sweep_seconds, twin_recordings, whatif_kl, whatif_run)
from app.gateway.state import (_FORWARD, FORWARDS, KL_MAX_POS, WHATIF_NAMES,  # noqa: F401
                               PromptTooBig, RunRefused, _encode, _ident, _model, check_interventions,
                               aside, embedding_rows, encode_prompt, facts, forwards_ahead, model_ready, page_run,
                               pages_ahead, result_cache, stored_bytes, try_load, visitor_message)
from app.gateway.lab_jobs import (LabBusy, LabDisabled, LabJob, lab_init_gradients, lab_queue_length, lab_race,
                          lab_worker_threads)
from app.gateway.lessons import lesson_target, patch_lesson
from app.gateway.settings import (DEFAULT_MAX_TOKENS, DEFAULT_SOURCE, default_source, lab_enabled, max_run_seconds,  # noqa: F401
                          offered_models, prompt_char_limit, public_port, shared, token_cap)
from app.gateway.settings import warm_up_enabled as _warm_up_enabled
from explorer_model.analysis.attention_math import textbook_table
from explorer_model.tokenizer import PromptError

log = logging.getLogger("llama_explorer.gateway")
_WARM_LOCK = threading.Lock()
_WARM = {"started": False}


def warm_up() -> None:
    """Once per process, in a background thread: the lab's twins loaded and their held-out line recorded, and the
    attention view's random-vector table worked out for every model already loaded: work no visitor's input
    changes, so the first visitor of those views does not wait for it (and nobody waits behind)."""
    with _WARM_LOCK:
        if _WARM["started"] or not _warm_up_enabled():  # a server `serve` started, not AppTest (its counts stay its own)
            return
        _WARM["started"] = True

    def run() -> None:
        try:
            twin_recordings("", 1)
        except Exception:  # a missing or broken twin: the view says so when a visitor opens it
            log.info("warm-up of the lab twins failed", exc_info=True)
        for source in offered_models():  # the attention view's random-vector table, per head size
            if model_ready(source):
                textbook_table(facts(source).cfg.head_dim)
    threading.Thread(target=run, daemon=True, name="warm-up").start()


__all__ = ["FORWARDS", "ModelFacts", "LabJob", "RecordingRef", "try_load", "facts", "encode_prompt",
           "embedding_rows", "check_interventions", "recording", "extend", "continuation", "recording_npz", "derived",
           "derived_cached", "aside",
           "logit_lens", "lens_cached", "model_ready", "whatif_run", "whatif_kl", "head_sweep", "cached_head_sweep",
           "twin_recordings",
           "lab_init_gradients", "lab_race", "lab_worker_threads", "lab_queue_length", "stored_bytes",
           "result_cache", "offered_models", "shared", "token_cap", "LabDisabled", "PromptError", "lab_enabled",
           "prompt_char_limit", "DEFAULT_SOURCE", "default_source", "DEFAULT_MAX_TOKENS",
           "KL_MAX_POS", "WHATIF_NAMES", "patch_lesson", "page_run", "warm_up", "pages_ahead", "public_port",
           "forwards_ahead", "visitor_message"]
__all__ += ["layer_weights", "lesson_target", "LabBusy", "figure", "table"]
__all__ += ["prompt_cost", "PromptTooBig", "RunRefused", "admit", "sweep_seconds", "pass_seconds",
            "intervention_seconds", "npz_file", "max_run_seconds", "BIG_LAYERS", "BIG_WIDTH", "changed_recording",
            "pair_derived", "changed_recording_npz", "compare_lesson", "check_export", "export_cap_bytes",
            "npz_bytes"]
