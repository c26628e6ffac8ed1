"""Helpers for driving app/main.py with streamlit.testing.v1.AppTest and reading its figures."""
from __future__ import annotations

import base64
import functools
import json
import re
from pathlib import Path

import numpy as np
from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parents[1] / "app" / "main.py")


def _scan_installed_components_once() -> None:
    """A server scans the installed packages' metadata for Streamlit components once, when it starts; an AppTest
    scans them again for every page it opens (~0.1 s of CPU each time, hundreds of times in the suite). The
    installed packages do not change while the tests run, so the scan's answer is kept for the process."""
    from streamlit.components.v2 import manifest_scanner

    scan = manifest_scanner.scan_component_manifests
    if not hasattr(scan, "cache_info"):
        manifest_scanner.scan_component_manifests = functools.cache(scan)


def _compile_the_page_once() -> None:
    """A server compiles app/main.py once, into its ScriptCache; AppTest makes a new ScriptCache for every run, so
    each run parsed the page, rewrote it (Streamlit's "magic") and compiled it again. The page does not change
    while the tests run: one cache serves every run of the process."""
    from streamlit.runtime.scriptrunner.script_cache import ScriptCache
    from streamlit.testing.v1 import app_test, local_script_runner

    if getattr(app_test.ScriptCache, "shared", None) is None:
        shared = ScriptCache()

        def one_cache() -> ScriptCache:
            return shared
        one_cache.shared = shared
        app_test.ScriptCache = local_script_runner.ScriptCache = one_cache


def _no_usage_stats() -> None:
    """`llama-explorer serve` runs the page with --browser.gatherUsageStats false; AppTest reads the option's
    default (true), and Streamlit then inspects every command's arguments for its usage statistics (~200 commands
    in a page run)."""
    from streamlit import config

    config.set_option("browser.gatherUsageStats", False)


_scan_installed_components_once()
_compile_the_page_once()
_no_usage_stats()


def run_app(timeout: float = 120, **query) -> AppTest:
    """Open the app as a copied link would: query parameters such as view, prompt, lang, layer, head, token."""
    at = AppTest.from_file(APP, default_timeout=timeout)
    for k, v in query.items():
        at.query_params[k] = str(v)
    return at.run()


def figures(at: AppTest) -> list[dict]:
    """Every Plotly figure on the page, as Plotly JSON dicts, in page order."""
    return [json.loads(el.proto.spec) for el in at.get("plotly_chart")]


def decode(v):
    """Plotly encodes numpy arrays as {'dtype', 'bdata', 'shape'}; turn that (or nested lists) into an array."""
    if isinstance(v, dict) and "bdata" in v:
        a = np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"]))
        shape = v.get("shape")
        if shape:
            a = a.reshape([int(s) for s in str(shape).split(",")])
        return a.astype(np.float64)
    return np.array([[np.nan if x is None else x for x in row] if isinstance(row, list) else
                     (np.nan if row is None else row) for row in v], dtype=np.float64)


def all_text(at: AppTest) -> str:
    """Concatenated markdown/caption/title/info/warning/error text, for language and message checks."""
    parts = []
    for kind in ("markdown", "caption", "title", "header", "subheader", "info", "warning", "error", "latex", "text"):
        parts += [str(e.value) for e in at.get(kind)]
    return "\n".join(parts)


def by_id(at, fig_id: str) -> dict:
    """The one figure whose layout.meta.id is fig_id."""
    found = [f for f in figures(at) if (f["layout"].get("meta") or {}).get("id") == fig_id]
    assert len(found) == 1, f"figure {fig_id} not found"
    return found[0]


def trace(fig: dict, meta) -> dict:
    found = [t for t in fig["data"] if t.get("meta") == meta]
    assert len(found) == 1, f"trace {meta} not found"
    return found[0]


def forwards() -> int:
    from app import gateway

    return gateway.FORWARDS["count"]


WIDE = "\u3000-\u9fff\uff00-\uffef"  # Chinese characters and punctuation: no space between them


def title(fig: dict) -> str:
    """A figure's title as one line: the line breaks that wrap it to its column's width taken out again (a space
    between two words, nothing next to a Chinese character)."""
    t = fig["layout"].get("title", {})
    text = t.get("text", "") if isinstance(t, dict) else str(t)
    return re.sub(f"(?<=[{WIDE}])<br>|<br>(?=[{WIDE}])", "", text).replace("<br>", " ")


def fig_with(at: AppTest, title_part: str) -> dict:
    """The figure whose title contains title_part."""
    for f in figures(at):
        if title_part in title(f):
            return f
    raise AssertionError(f"no figure titled …{title_part}…")


def record_prompt(loaded, text: str | None = None, ids=None) -> tuple[list[int], object]:
    """(ids, full recording) of a prompt on a loaded model, encoded as the app does (BOS if the model wants one)."""
    from explorer_model.recording import record

    tok = loaded.tokenizer
    ids = tok.encode(text, add_bos=tok.add_bos) if ids is None else ids
    return ids, record(loaded.model, ids)


def select(at: AppTest, **selection) -> AppTest:
    """Move the sidebar's shared selection (layer=, token=, head=), one slider and one rerun at a time, in order."""
    for key, value in selection.items():
        at.sidebar.slider(key=key).set_value(value).run()
    return at


def deferred_downloads(at) -> dict:
    """Run `at` and return {file name: the data callable of its download button} (Streamlit calls these on click,
    outside the script run)."""
    return _downloads(at, "add_deferred")


def offered_files(at) -> dict:
    """Run `at` and return {file name: bytes} of the download buttons that hand over their bytes with the page."""
    return _downloads(at, "add")


def _downloads(at, method: str) -> dict:
    """{file name: what the page handed MediaFileManager.<method>} over one run of `at`."""
    from unittest import mock

    from streamlit.runtime.media_file_manager import MediaFileManager

    seen = {}
    real = getattr(MediaFileManager, method)

    def keep(self, data, mimetype, coordinates, file_name=None, **kw):
        seen[file_name] = data
        return real(self, data, mimetype, coordinates, file_name, **kw)
    with mock.patch.object(MediaFileManager, method, keep):
        at.run()
    return seen


def edit_box(at: AppTest, name: str):
    """The lecture editor's text box `name` (title_en, caption_zh, …) for the step on screen (its key names the step)."""
    boxes = [w for w in [*at.text_input, *at.text_area] if str(w.key).startswith(f"lecture_edit_{name}_")]
    assert len(boxes) == 1, [w.key for w in boxes]
    return boxes[0]
