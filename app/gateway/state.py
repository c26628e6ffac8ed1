"""Part of the gateway (app/gateway/__init__.py re-exports it): what every other part stands on. The models this process
has loaded (one load per file version), the one forward lock, the one result cache, the prompt's token ids, the
parsed what-if changes and the counter of model runs; a run refused before it starts (RunRefused).

Nothing here runs a model: the runs are in gateway_runs.py, what they cost in gateway_costs.py.
"""
from __future__ import annotations

import gc
import logging
import weakref

import numpy as np
import torch

from app.facts import ModelFacts, facts_of
from app.gateway.lanes import LANE, ForwardLock
from app.gateway.result_cache import ResultCache
from app.gateway.room_memo import room_memo
from app.gateway.settings import (cache_budget_bytes, offered_models, prompt_char_limit, resolve_source, shared,
                          source_version, token_cap, without_paths)
from explorer_model import interventions as I
from explorer_model.loaders import LoadedModel, LoadError, load
from explorer_model.runtime import release_freed_memory
from explorer_model.tokenizer import check_prompt

FORWARDS = {"count": 0}
log = logging.getLogger("llama_explorer.gateway")
# re-entrant (a what-if's KL reads the clean recording, recorded under the same lock); a page run gives up the
# drawing lane while it waits for it and runs (app/gateway/lanes.py)
_FORWARD = ForwardLock(LANE)


def page_run():
    """Held around a whole page run by app/main.py: one page draws at a time, forward passes run beside it."""
    return LANE.held()


def aside():
    """Around view work that runs no model and draws little (many cached computations in a row): other pages
    draw meanwhile, and this one takes its turn back once, at the front of the line (app/gateway/lanes.py)."""
    return LANE.released()


def pages_ahead() -> int:
    """Other visitors' page runs drawing or waiting to draw (what a page about to wait has before it)."""
    return LANE.pages()


def forwards_ahead() -> int:
    """Forward passes running or waiting, other than this page's."""
    return _FORWARD.wanted()
WHATIF_NAMES = ["blocks.*.hook_resid_post", "blocks.*.attn.hook_rot_q", "blocks.*.attn.hook_rot_k"]
KL_MAX_POS = 32  # the lens KL costs layers × positions × vocab × d_model per run: the last 32 positions
# A forward pass this small (the lab twins: 0.2 GFLOP for a short prompt, a few ms) runs without the forward lock:
# waiting behind other visitors' passes of a real model would cost it a thousand times its own time, and beside
# one it takes little (hooks fire only in the thread that attached them: concurrent recordings stay apart).
SMALL_FORWARD_FLOPS = 1e9


# --------------------------------------------------------------------------- models
@room_memo(max_entries=3)
def _load(source: str, version: tuple | None) -> LoadedModel:
    loaded = load(source)
    # What exists now (libraries, the model, the server) lives as long as the process: out of the collector's sight,
    # a full collection walks only what page runs create (0.19 s -> 0 for ~275,000 objects here).
    gc.freeze()
    return loaded


_READY: set = set()  # (path, version) of the models this process has loaded


def model_ready(source: str) -> bool:
    """Whether this process holds the model already (asking for it costs nothing); False for a bad source too."""
    try:
        path = resolve_source(source)
        return (path, source_version(path)) in _READY
    except (LoadError, OSError, ValueError, RuntimeError):  # RuntimeError: "~nosuchuser/…" has no home to expand
        return False


def _model(source: str) -> LoadedModel:
    path = resolve_source(source)
    key = (path, source_version(path))
    if key in _READY:
        return _load(*key)
    with LANE.released():  # a load takes seconds: other visitors' pages draw meanwhile (app/gateway/lanes.py)
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
        return None, visitor_message(e, source)
    except (MemoryError, OSError, ValueError, RuntimeError) as e:
        return None, visitor_message(f"{type(e).__name__}: {e}", source)


def visitor_message(error, source: str = "") -> str:
    """An error's line as a visitor may read it: on a shared server without any server path (settings)."""
    return without_paths(str(error), source) if shared() else str(error)


def facts(source: str) -> ModelFacts:
    """What views may know about the model, built once per loaded model (a reloaded file gets new facts)."""
    loaded = _model(source)
    return _facts(_ident(source), loaded)


@room_memo(max_entries=3)
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
    """Parsed interventions (repeats collapsed), or ValueError with one line when a spec does not parse or does not
    fit the model; RunRefused for more distinct changes than the model has heads (layers × heads: a change per head
    is the most a what-if can mean)."""
    cfg = _model(source).cfg
    limit = max(cfg.n_layers * cfg.n_heads, 2 * cfg.n_layers)
    try:
        ivs = I.parse_list(specs, limit=limit)
    except I.TooMany as e:
        raise RunRefused("run.too_many", n=e.count, limit=limit) from None
    for iv in ivs:
        iv.check(_model(source).model)
    return ivs


# --------------------------------------------------------------------------- the cache
@room_memo()
def result_cache() -> ResultCache:
    cache = ResultCache(cache_budget_bytes(), on_evict=release_freed_memory, strict=shared())
    _report_to_streamlit_metrics(cache)
    return cache


class CacheMetrics:
    """The result cache as Streamlit's /_stcore/metrics reports caches: one `cache_memory_bytes` line per kind of
    result, with the bytes it really holds. Streamlit sees only its own st.cache_* caches, and this one is kept by
    the process (room_memo) so that a visitor's "clear cache" message cannot empty it. The registered provider
    holds the cache weakly: Streamlit keeps providers for the runtime's life, and a cache built anew (its memo
    cleared) must take its recordings with it."""

    def __init__(self, cache: ResultCache):
        self._cache = weakref.ref(cache)

    @property
    def stats_families(self):
        from streamlit.runtime.stats import CACHE_MEMORY_FAMILY

        return [CACHE_MEMORY_FAMILY]

    def get_stats(self, family_names=None):
        from streamlit.runtime.stats import CACHE_MEMORY_FAMILY, CacheStat

        cache = self._cache()
        kinds = cache.kinds() if cache is not None else {}
        stats = [CacheStat("llama_explorer_results", str(kind), int(size)) for kind, size in sorted(kinds.items())]
        return {CACHE_MEMORY_FAMILY: stats}


def _report_to_streamlit_metrics(cache: ResultCache) -> None:
    from streamlit import runtime

    if runtime.exists():  # a server (not a test or a script): its metrics endpoint reports the cache
        runtime.get_instance().stats_mgr.register_provider(CacheMetrics(cache))


def stored_bytes() -> int:
    return result_cache().stored_bytes()


def _forward(n: int = 1) -> None:
    FORWARDS["count"] += n


class RunRefused(ValueError):
    """A run refused before it starts. `key` and `values` give the one line in any language (i18n.error_text);
    str() is the English line."""

    def __init__(self, key: str, **values):
        from app.i18n import t
        self.key, self.values = key, values
        super().__init__(t(key, "en", **values))


class PromptTooBig(RunRefused):
    """A recording that would not fit in this server's memory: refused before running."""
