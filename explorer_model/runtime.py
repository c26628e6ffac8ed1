"""Process-wide settings for running the explorer (the app, the CLI, the benchmarks).

A recording keeps hundreds of MB of activations alive; with glibc's defaults every new recording faults
fresh pages in from the kernel (about 100k page faults for 256 tokens of SmolLM2), because freed memory is
trimmed back to the OS. Keeping freed heap memory for reuse makes the next recording nearly as cheap as a
plain forward. The cost: the process's resident size stays at its peak. Library users opt in by calling
`keep_freed_memory()`; nothing happens on import.
"""
from __future__ import annotations

import ctypes
import sys
from contextlib import contextmanager
from typing import Iterator

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_done = False


def keep_freed_memory() -> bool:
    """Ask glibc to keep freed memory (no trimming; blocks below 32 MB from the reusable heap)."""
    global _done
    if _done:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False  # not glibc (e.g. musl): keep the defaults
    ok = libc.mallopt(_M_MMAP_THRESHOLD, 32 << 20) == 1  # 32 MB is glibc's ceiling for this setting
    ok &= libc.mallopt(_M_TRIM_THRESHOLD, 2**31 - 1) == 1  # an int: larger values wrap to "trim always"
    _done = bool(ok)
    return _done


def release_freed_memory() -> None:
    """Give freed heap memory back to the OS now (glibc malloc_trim), in every thread's arena.

    For a server that has just dropped something big (an evicted recording): kept freed memory is only reused
    by the thread whose arena holds it, so with many visitors' threads it would pile up past any budget.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


@contextmanager
def threads(n: int = 1) -> Iterator[None]:
    """The project's one setter of torch's thread count. One thread is fastest for models this small, and
    keeps sums in a fixed order (determinism). Process-wide: for offline scripts, the lab's worker process,
    the CLI and tests only, never in a server thread (it would slow every other visitor's forward pass)."""
    before = _torch().get_num_threads()
    _torch().set_num_threads(n)
    try:
        yield
    finally:
        _torch().set_num_threads(before)


def _torch():
    import torch  # runtime.py is imported before torch on purpose (see keep_freed_memory)

    return torch
