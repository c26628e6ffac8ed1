"""Part of the gateway (app/gateway/__init__.py re-exports it): a recording's .npz download, built on disk.

Every array (derived attention patterns materialized) is written one at a time into a temporary file
(the members of explorer_model.export.save_npz), so building a download holds one array beside the recording, not the whole
file in memory. Its size is known before anything is built (every hook's shape is a + b·n + c·n² elements, as
memory.recording_bytes fits): a download over `export_cap_bytes()` is refused in one line, and downloads being
built at once share that cap (Streamlit keeps the file it sends in memory, so the cap counts against the
server's memory budget). The page hands Streamlit the open file: it reads it once, and the file's name is gone
from the disk before that (nothing left behind whatever happens).
"""
from __future__ import annotations

import functools
import os
import tempfile
import threading

from app.gateway import state as gw
from app.gateway.state import RunRefused
from app.gateway.settings import cache_budget_bytes
from explorer_model import memory as _memory
from explorer_model.export import about, write_members

_BUILDING = {"bytes": 0}
_BUILDING_LOCK = threading.Lock()


def export_cap_bytes() -> int:
    """LLAMA_EXPLORER_EXPORT_MB, by default half the cache budget (--cache-mb) and at most 1 GB."""
    value = os.environ.get("LLAMA_EXPLORER_EXPORT_MB", "")
    try:
        mb = float(value) if value else min(1024.0, cache_budget_bytes() / 2**21)
    except ValueError:
        mb = min(1024.0, cache_budget_bytes() / 2**21)
    return int(max(mb, 0.0) * 2**20)


@functools.lru_cache(maxsize=16)
def _fit(cfg) -> tuple[int, int, int]:
    """(a, b, c): bytes of the .npz's arrays = a + b·n + c·n², every array float32 (token ids int64)."""
    def size(n: int) -> int:
        shapes = _memory.hook_shapes(cfg, n)
        return sum(_numel(s) * 4 for s in shapes.values()) + n * 8
    s1, s2, s3 = size(1), size(2), size(3)
    c = (s3 - 2 * s2 + s1) // 2
    b = s2 - s1 - 3 * c
    return s1 - b - c, b, c


def npz_bytes(source: str, n_tokens: int) -> int:
    """What the .npz of an n_tokens recording of `source` weighs (uncompressed)."""
    a, b, c = _fit(gw._model(source).cfg)
    return a + b * n_tokens + c * n_tokens * n_tokens


def check_export(source: str, n_tokens: int) -> None:
    """RunRefused ("export.too_big") when this download would be over the cap: said in the page, before a click."""
    size, cap = npz_bytes(source, n_tokens), export_cap_bytes()
    if size > cap:
        raise RunRefused("export.too_big", size=_memory.size_text(size), cap=_memory.size_text(cap))


def npz_file(source: str, n_tokens: int, get_recording, changes=(), source_ids=()):
    """An open binary file holding the .npz of get_recording(), which names its model, its prompt, `changes` and
    the prompt a patch copied from (`source_ids`) (explorer_model.export.about; not the server's paths), already
    unlinked. RunRefused when it is over the cap, or when downloads being built now would go over it together.
    Written by export.write_members, not save_npz: its atomic rename sets a signal handler, which only the main
    thread may do, and Streamlit builds a download in a worker thread (the folder is private and removed: no
    rename is needed)."""
    check_export(source, n_tokens)
    size, cap = npz_bytes(source, n_tokens), export_cap_bytes()
    with _BUILDING_LOCK:
        if _BUILDING["bytes"] + size > cap:
            raise RunRefused("export.too_big", size=_memory.size_text(_BUILDING["bytes"] + size),
                             cap=_memory.size_text(cap))
        _BUILDING["bytes"] += size
    try:
        rec = get_recording()
        folder = tempfile.mkdtemp(prefix="llama-explorer-npz-")  # private (0700) to this server's user
        path = os.path.join(folder, "recording.npz")
        try:
            loaded, ids = gw._model(source), rec.token_ids[0].tolist()

            def typed(ids: list[int]) -> str:  # the text typed, not the BOS the page puts first
                return loaded.tokenizer.decode(ids[1:] if ids[:1] == [loaded.tokenizer.bos_id] else ids)
            write_members(rec, path, about(rec, loaded.model.cfg.name, typed(ids), changes,
                                           patch_source=typed(list(source_ids)) if source_ids else None))
            del rec
            handle = open(path, "rb")
        finally:
            for leftover in (path, folder):
                try:
                    os.unlink(leftover) if leftover == path else os.rmdir(leftover)
                except OSError:
                    pass
        return handle
    finally:
        with _BUILDING_LOCK:
            _BUILDING["bytes"] -= size


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n
