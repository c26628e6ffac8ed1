"""Server settings read from the environment (set by `llama-explorer serve`), and which models a visitor may pick.

A shared (classroom) server lists models by name only: the default, the shipped teaching models, and the
entries of the teacher's folder (LLAMA_EXPLORER_MODELS_DIR). Visitors never see a server path, and an entry
that is a symlink leading out of the folder is not offered.
"""
from __future__ import annotations

import functools
import os
import re
from pathlib import Path

from explorer_model.paths import ASSETS

DEFAULT_SOURCE = "smollm2"
DEFAULT_MAX_TOKENS = 256


def shared() -> bool:
    """Classroom mode (`llama-explorer serve --share`): visitors pick from a list, never type a path."""
    return os.environ.get("LLAMA_EXPLORER_SHARE") == "1"


def token_cap() -> int:
    return int(os.environ.get("LLAMA_EXPLORER_MAX_TOKENS", 512 if shared() else 2048))


def prompt_char_limit() -> int:
    """Characters a visitor's prompt may have, checked before tokenizing: tokenizing costs memory per character,
    and more than ~32 characters per token of the cap could never be used anyway."""
    from explorer_model.tokenizer import MAX_PROMPT_CHARS

    return min(MAX_PROMPT_CHARS, 32 * token_cap())


def lab_enabled() -> bool:
    """`serve --no-lab` turns the norm lab's heavy experiments (training races, gradient probes) off; results
    already computed (and the shipped curves) are still shown."""
    return os.environ.get("LLAMA_EXPLORER_LAB", "1") != "0"


def max_run_seconds() -> float | None:
    """The longest a visitor's run may hold the forward lock (estimated before it starts), or None for no bound:
    LLAMA_EXPLORER_MAX_RUN_SECONDS (0: none), by default 20 s on a shared server, none on a local one."""
    value = os.environ.get("LLAMA_EXPLORER_MAX_RUN_SECONDS", "")
    try:
        seconds = float(value) if value else (20.0 if shared() else 0.0)
    except ValueError:
        seconds = 20.0 if shared() else 0.0
    return seconds if seconds > 0 and seconds == seconds else None


def cache_budget_bytes() -> int:
    return int(float(os.environ.get("LLAMA_EXPLORER_CACHE_MB", 2048)) * 2**20)


@functools.lru_cache(maxsize=1)
def shipped_models() -> tuple[str, ...]:
    """The teaching models in assets/ (a folder with explorer_config.json), by name; read once per process (the
    shipped folder does not change under a running server, and a page run asks several times)."""
    if not ASSETS.is_dir():
        return ()
    return tuple(sorted(p.name for p in ASSETS.glob("*") if (p / "explorer_config.json").is_file()))


def folder_models(folder: str | None = None) -> dict[str, Path]:
    """{name: path} of the models in the teacher's folder (`folder`, or the server's --models-dir)."""
    from explorer_model.loaders import folder_models as listed

    return listed(folder or os.environ.get("LLAMA_EXPLORER_MODELS_DIR"))


def served() -> tuple[str, str] | None:
    """(its name in the model list, the loader's source) of the model `serve SOURCE` opens for every new page, when
    that is not the default: a file or folder by its own name (a visitor of a shared server never sees its path)."""
    from explorer_model.loaders import SERVED_ENV, list_name

    source = os.environ.get(SERVED_ENV, "")
    return None if source in ("", DEFAULT_SOURCE) else (list_name(source), source)


def default_source() -> str:
    """The model a new page opens: the one `serve SOURCE` names, else SmolLM2."""
    return served()[0] if served() else DEFAULT_SOURCE


def offered_models(folder: str | None = None) -> list[str]:
    """Names a visitor may choose: the server's own model (`serve SOURCE`), the default, the shipped twins, the
    teacher's folder (names only; `folder`, or the server's --models-dir)."""
    names = [DEFAULT_SOURCE, *shipped_models()]
    own = served()
    if own and own[0] not in names:
        names.insert(0, own[0])
    return names + [n for n in folder_models(folder) if n not in names]


def resolve_source(source: str) -> str:
    """The loader's source for a name from the list (the served model's or a folder entry's path); anything else
    unchanged."""
    if source in (DEFAULT_SOURCE, *shipped_models()):
        return source
    own = served()
    if own and source == own[0]:
        return own[1]
    path = folder_models().get(source)
    return str(path) if path is not None else source


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


def warm_up_enabled() -> bool:
    """Set by `serve` (explorer_model.cli.serve.server_env): the gateway prepares visitor-independent work at start."""
    return os.environ.get("LLAMA_EXPLORER_WARM_UP") == "1"


def public_port() -> int | None:
    """The port visitors open when this process serves behind `serve --processes` (the balancer's), else None."""
    value = os.environ.get("LLAMA_EXPLORER_PUBLIC_PORT", "")
    return int(value) if value.isdigit() else None


_ABSOLUTE_PATH = re.compile(r"(?<![\w.~:/])(?:~|[A-Za-z]:)?[/\\](?:[^\s/\\:'\"]+[/\\])*([^\s/\\:'\",;]*)")


def without_paths(text: str, source: str) -> str:
    """A message for a visitor of a shared server: the model's server path named as the visitor typed it, any other
    absolute path cut to its last part (an error from a loader or the system names files in full)."""
    text = str(text)
    path = resolve_source(source)
    for form in {path, str(Path(path).expanduser().resolve())} - {source}:
        if form and form not in (".", "/"):
            text = text.replace(form, source)
    return _ABSOLUTE_PATH.sub(lambda m: m.group(1) or "…", text)
