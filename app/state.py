"""The narrow model <-> UI interface: cached model loading, cached recordings, prompt handling.

Models are cached per source string and recordings per (source, token ids), so switching view, layer,
head or token reruns only the drawing code. Recordings live in one process-wide cache bounded in bytes,
and forward passes run one at a time, so a classroom of visitors cannot push memory past
model + cache budget + one recording in flight. `FORWARDS` counts forward passes for the tests.
"""
from __future__ import annotations

import io
import os
import threading
from collections import OrderedDict
from pathlib import Path

import numpy as np
import streamlit as st

from explorer_model.loaders import LoadedModel, LoadError, load
from explorer_model.paths import ASSETS
from explorer_model.recording import Recording, record
from explorer_model.runtime import release_freed_memory

DEFAULT_SOURCE = "smollm2"
DEFAULT_MAX_TOKENS = 256
FORWARDS = {"count": 0}


# --------------------------------------------------------------------------- server settings
def shared() -> bool:
    """Classroom mode (`llama-explorer serve --share`): visitors pick from a list, never type a path."""
    return os.environ.get("LLAMA_EXPLORER_SHARE") == "1"


def token_cap() -> int:
    return int(os.environ.get("LLAMA_EXPLORER_MAX_TOKENS", 512 if shared() else 2048))


def cache_budget_bytes() -> int:
    return int(float(os.environ.get("LLAMA_EXPLORER_CACHE_MB", 2048)) * 2**20)


def offered_models() -> list[str]:
    """Sources a visitor may choose in shared mode: the default, the shipped twins, the teacher's folder."""
    names = [DEFAULT_SOURCE] + shipped_models()
    folder = os.environ.get("LLAMA_EXPLORER_MODELS_DIR")
    if folder and Path(folder).is_dir():
        for p in sorted(Path(folder).iterdir()):
            if p.suffix.lower() == ".gguf" or (p.is_dir() and any((p / f).is_file() for f in
                                                                   ("config.json", "params.json", "explorer_config.json"))):
                names.append(str(p.resolve()))
    return names


def shipped_models() -> list[str]:
    """The teaching models in assets/ (a folder with explorer_config.json), by name."""
    return sorted(p.name for p in ASSETS.glob("*") if (p / "explorer_config.json").is_file()) if ASSETS.is_dir() else []


# --------------------------------------------------------------------------- models
def source_version(source: str) -> tuple | None:
    """What identifies the file(s) behind a path source now: a replaced or rewritten model is loaded again, a
    vanished one fails with the loader's message. Named sources (smollm2, tiny-pre…) have no version."""
    path = Path(source).expanduser()
    try:
        if path.is_file():
            st_ = path.stat()
            return (st_.st_size, st_.st_mtime_ns)
        if path.is_dir():
            return tuple(sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in path.iterdir() if p.is_file()))
    except OSError:
        return ("unreadable",)
    return None if not any(sep in source for sep in "/\\") else ("missing",)


@st.cache_resource(max_entries=3, show_spinner=False)
def _load(source: str, version: tuple | None) -> LoadedModel:
    return load(source)


def get_model(source: str) -> LoadedModel:
    return _load(source, source_version(source))


def try_load(source: str) -> tuple[LoadedModel | None, str | None]:
    """(model, None) or (None, one-line reason); never raises for bad input."""
    if shared() and source not in offered_models():
        return None, "this server only offers the models in its list"
    try:
        return get_model(source), None
    except LoadError as e:
        return None, str(e)
    except (MemoryError, OSError, ValueError, RuntimeError) as e:
        return None, f"{type(e).__name__}: {e}"


# --------------------------------------------------------------------------- recordings
class RecordingCache:
    """LRU of recordings bounded by their stored bytes; one forward pass at a time."""

    def __init__(self, budget_bytes: int):
        self.budget = budget_bytes
        self._items: OrderedDict[tuple, Recording] = OrderedDict()
        self._bytes: dict[tuple, int] = {}
        self._lock = threading.Lock()  # guards the dict
        self._forward = threading.Lock()  # serialises forward passes: peak memory stays predictable

    def get(self, source: str, ids: tuple[int, ...]) -> Recording:
        key = (source, ids)
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        with self._forward:
            with self._lock:  # another visitor may have recorded it while we waited
                if key in self._items:
                    return self._items[key]
            rec = record(get_model(source).model, list(ids))
            FORWARDS["count"] += 1
        with self._lock:
            self._items[key], self._bytes[key] = rec, rec.stored_bytes()
            evicted = []
            while len(self._items) > 1 and sum(self._bytes.values()) > self.budget:
                old, gone = self._items.popitem(last=False)
                self._bytes.pop(old)
                evicted.append(gone)
        if evicted:
            del evicted, gone  # (a visitor still drawing it keeps its own reference until done)
            release_freed_memory()
        return rec

    def stored_bytes(self) -> int:
        with self._lock:
            return sum(self._bytes.values())


@st.cache_resource(show_spinner=False)
def recording_cache() -> RecordingCache:
    return RecordingCache(cache_budget_bytes())


def get_recording(source: str, ids: tuple[int, ...]) -> Recording:
    return recording_cache().get(source, tuple(ids))


class RecordingRef:
    """Stands in for a drawn page's Recording. Format functions of widgets and download callables close over
    the ViewContext and live as long as the visitor's session; through this they keep only (source, ids),
    so the byte-bounded cache stays the only owner of recordings. Reading fetches it again (recomputed if
    it was evicted)."""

    def __init__(self, source: str, ids: tuple[int, ...]):
        self._key = (source, tuple(ids))

    def __getattr__(self, name):
        if name == "_key":  # not set yet (e.g. a copy being made): no recursion
            raise AttributeError(name)
        return getattr(get_recording(*self._key), name)

    def __getitem__(self, name):
        return get_recording(*self._key)[name]

    def __contains__(self, name) -> bool:
        return name in get_recording(*self._key)

    def __iter__(self):
        return iter(get_recording(*self._key))

    def __len__(self) -> int:
        return len(get_recording(*self._key))


def encode_prompt(loaded: LoadedModel, text: str, max_tokens: int) -> tuple[list[int], int]:
    """Token ids cut to max_tokens (and the server's cap and the model's context), and the length before."""
    tok = loaded.tokenizer
    ids = tok.encode(text, add_bos=getattr(tok, "add_bos", False))
    limit = max(1, min(max_tokens, token_cap(), loaded.model.cfg.max_seq_len))
    return ids[:limit], len(ids)


@st.cache_data(max_entries=4, show_spinner=False)
def recording_npz(source: str, ids: tuple[int, ...]) -> bytes:
    buf = io.BytesIO()
    np.savez_compressed(buf, **get_recording(source, ids).to_numpy())
    return buf.getvalue()
