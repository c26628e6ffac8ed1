"""Writing a recording to an .npz file without holding it twice, and files that appear only when complete.

`np.savez(path, **rec.to_numpy())` first rebuilds every layer's attention scores and pattern, which are
[head, pos, pos] each: 4-5 GB at 1024 tokens, ~145 GB at 8192. Here each array is materialized, written
into the zip and dropped before the next, so the peak is one array. What the file will weigh is known
before the model runs (`plan`), so a recording that cannot fit in memory or on the disk is refused up front.

Every file goes to a temporary name in the target folder and is renamed into place only when complete:
a failed write (disk full, file-size limit, Ctrl+C) leaves the previous file as it was and no partial one.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import stat
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .export_path import ExportError, check_target
from .memory import available_bytes as available_memory  # MemAvailable, or the cgroup limit if lower
from .memory import hook_shapes, size_text
from .recording import as_numpy, recorded_names


@contextlib.contextmanager
def atomic_file(path: Path):
    """Yield a temporary path beside `path`; on success it replaces `path` in one rename, on any failure it is
    removed and `path` is untouched. Temporaries of earlier writers that died (SIGKILL) are removed first; the
    rename never replaces a symbolic link or anything but a regular file."""
    from .cache_folder import remove_stale_temporaries

    remove_stale_temporaries(path.parent, path.name)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    # Over a file-size limit (ulimit -f) the kernel sends SIGXFSZ, which kills the process; ignored, the
    # write fails with EFBIG instead and is reported like a full disk.
    old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN) if hasattr(signal, "SIGXFSZ") else None
    try:
        yield tmp
        if path.is_symlink() or (path.exists() and not stat.S_ISREG(path.lstat().st_mode)):
            raise ExportError(f"{path} is no longer a regular file; nothing was replaced")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    finally:
        if old is not None:
            with contextlib.suppress(ValueError):  # not the main thread: nothing was changed
                signal.signal(signal.SIGXFSZ, old)


@dataclass(frozen=True)
class Plan:
    file_bytes: int  # the .npz, uncompressed
    peak_bytes: int  # held at once: what the recorder keeps plus the largest array being written
    largest: str  # the name of the largest array


def plan(model, ids: list[int], names, dtype: torch.dtype) -> Plan:
    """Bytes of the .npz for `ids` without running the model: every name the recording will hold at its shape for
    this prompt (memory.hook_shapes: the forward's shapes, kept in the cache folder) in the file's dtype (bfloat16
    is written as float32), and the token ids as int64."""
    shapes = hook_shapes(model.cfg, len(ids))
    itemsize = torch.empty(0, dtype=torch.float32 if dtype == torch.bfloat16 else dtype).element_size()
    full = {name: math.prod(shapes[name]) * itemsize for name in recorded_names(model, names)}
    full["token_ids"] = len(ids) * 8
    kept = sum(v for k, v in full.items() if "hook_pattern" not in k and "hook_attn_scores" not in k)
    largest = max(full, key=full.get)
    return Plan(sum(full.values()), kept + full[largest], largest)


def check_fits(p: Plan, path: Path, memory: int | None = None, disk: int | None = None) -> None:
    """Refuse a recording that would not fit on the target's disk or in memory, before the model runs."""
    disk = shutil.disk_usage(path.parent).free if disk is None else disk
    memory = available_memory() if memory is None else memory
    hint = "record fewer hooks with --names (e.g. 'blocks.*.hook_resid_post') or use a shorter prompt"
    if p.file_bytes > disk:
        raise ExportError(f"{path} would take {size_text(p.file_bytes)} but only {size_text(disk)} is free on that "
                          f"disk; {hint}")
    if memory is not None and p.peak_bytes > memory:
        raise ExportError(f"recording to {path} needs about {size_text(p.peak_bytes)} of memory (largest array "
                          f"{p.largest}) but only {size_text(memory)} is available; {hint}")


ABOUT = "about"  # the member that says what a file holds: JSON text, json.loads(np.load(file)["about"].item())


def about(rec, model: str, text: str | None, changes=(), source: str | None = None,
          patch_source: str | None = None) -> dict:
    """What the file of recording `rec` says about itself (its member ABOUT), so that a file saved among others
    still names its model, its prompt and what was changed in the run: `text` None when the run was given token
    ids, `changes` the interventions as they are written (ablate:blocks.3.attn.head5, no-mask, ...) with the prompt
    a patch copied from (`patch_source`), the dtype of its arrays, and `source` (the model's path) when the file
    stays on the machine that has the model (the app's downloads leave the server's paths out)."""
    dtype = torch.float32 if rec.dtype == torch.bfloat16 else rec.dtype  # as as_numpy writes it
    return {"model": model, "text": text, "changes": [str(c) for c in changes],
            "dtype": str(dtype).removeprefix("torch."), **({"patch_source": patch_source} if patch_source else {}),
            **({"source": source} if source is not None else {})}


def write_members(rec, file, described: dict | None = None) -> None:
    """Every recorded name, token_ids and logits (the same members as np.savez(path, **rec.to_numpy())), one array
    at a time, into the new zip `file`, and `described` (what `about` gives) as the member ABOUT."""
    with zipfile.ZipFile(file, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name in [*rec.names, "token_ids"]:
            arr = rec.token_ids.numpy() if name == "token_ids" else as_numpy(rec[name])
            with zf.open(f"{name}.npy", "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.ascontiguousarray(arr), allow_pickle=False)
            del arr  # a rebuilt attention pattern is freed before the next one is made
        if described is not None:  # a 0-d unicode array: read back without allow_pickle
            with zf.open(f"{ABOUT}.npy", "w") as f:
                np.lib.format.write_array(f, np.array(json.dumps(described, ensure_ascii=False)), allow_pickle=False)


def save_npz(rec, out: str | os.PathLike, described: dict | None = None) -> Path:
    """write_members into `out`, atomically. Returns the exact file written."""
    path = check_target(out)
    with atomic_file(path) as tmp:
        write_members(rec, tmp, described)
    return path
