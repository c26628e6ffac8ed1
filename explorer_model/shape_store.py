"""The hooks' shapes of a model configuration, kept in the cache folder from one process to the next.

memory.py works them out with forwards on PyTorch's meta device; a process's first operation there imports
torch._dynamo (~1 s of CPU), which every server paid for its first prompt's cost estimate. A template is stored as
JSON, [[hook name, [size or null for the prompt's length, ...]], ...], in $LLAMA_EXPLORER_CACHE/shapes/, in a file
named by the configuration and by the source of the modules that make the forward: an edit of either finds no file,
and the forwards run again.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path

import torch

from .cache_folder import cache_root
from .config import ModelConfig

FORWARD_SOURCES = ("model.py", "hooks.py", "rope.py", "kernels.py", "config.py")


def template_file(cfg: ModelConfig) -> Path:
    which = hashlib.sha256(json.dumps(cfg.to_dict(), sort_keys=True).encode()).hexdigest()[:16]
    code = hashlib.sha256(torch.__version__.encode())
    for name in FORWARD_SOURCES:
        code.update(Path(__file__).with_name(name).read_bytes())
    return cache_root() / "shapes" / f"hooks-{which}-{code.hexdigest()[:16]}.json"


def load(cfg: ModelConfig, hook_names: list[str]):
    """The stored template, if it names exactly `hook_names` in order and every size is a positive integer or
    null; anything else is ignored (and replaced once the forwards have run)."""
    try:
        rows = json.loads(template_file(cfg).read_text())
        template = tuple((str(name), tuple(sizes)) for name, sizes in rows)
    except (OSError, ValueError, TypeError):
        return None
    fits = [name for name, _ in template] == hook_names and all(
        size is None or type(size) is int and size > 0 for _, sizes in template for size in sizes)
    return template if fits else None


def save(cfg: ModelConfig, template) -> None:
    """Written to a temporary name and renamed; the files of older code for the same config are removed. A folder
    that cannot be written only costs the forwards next time."""
    file = template_file(cfg)
    tmp = file.with_name(f".{file.name}.{os.getpid()}.tmp")
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(template))
        os.replace(tmp, file)
        for stale in file.parent.glob(file.name.rsplit("-", 1)[0] + "-*.json"):
            if stale != file:
                stale.unlink(missing_ok=True)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
