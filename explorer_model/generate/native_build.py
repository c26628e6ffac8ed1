"""The compiled decode step's library (native_step.c), built once per machine and cached.

The C file is compiled with the system's C compiler (`cc`, or $CC) into the private folder `native-step` of the
explorer's cache, named by the hash of the source, compiler, flags and CPU (two CPUs sharing a cache each get their
own build), with the library's SHA-256 recorded beside it; a library is loaded only when it matches its record
(docs/robustness.md). Without torch: finding, checking and building the library needs none.
"""
from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import platform
import shlex
import stat
import subprocess
import tempfile
import threading
import time
from pathlib import Path

_SOURCE = Path(__file__).with_name("native_step.c")
_FLAGS = ["-O3", "-march=native", "-std=gnu11", "-shared", "-fPIC"]
_BUILDING = threading.Lock()
_library: ctypes.CDLL | None = None
_failure: str | None = None  # why the library is missing, once a build was tried


def _cpu_key() -> str:
    """What -march=native compiled for: the CPU's architecture, model and flags (a shared cache may serve
    several machines, and a library built for another CPU's instructions would die with SIGILL)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        found = [l for l in lines if l.startswith(("flags", "model name", "Features", "CPU part", "CPU implementer"))]
        return platform.machine() + "|" + "|".join(dict.fromkeys(found))
    except OSError:
        return platform.machine() + "|" + platform.processor()


def library() -> ctypes.CDLL | None:
    """The compiled step, built on first use; None (with `failure()` saying why) when it cannot be had."""
    global _library, _failure
    if _library is not None or _failure is not None:
        return _library
    with _BUILDING:
        if _library is None and _failure is None:
            try:
                _library = _obtain()
            except (OSError, subprocess.SubprocessError, AttributeError, ValueError) as e:
                _failure = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return _library


def failure() -> str | None:
    return _failure


def _compiler() -> list[str]:
    return shlex.split(os.environ.get("CC", "cc")) or ["cc"]


def _key() -> str:
    """Names one build: the source, the compiler, the flags and this CPU."""
    text = " ".join([*_compiler(), *_FLAGS, _cpu_key()])
    return hashlib.sha256(_SOURCE.read_bytes() + text.encode()).hexdigest()[:16]


def build_folder() -> Path:
    from ..cache_folder import cache_root  # the explorer's one cache folder

    return cache_root() / "native-step"


def _digest(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _private(folder: Path) -> bool:
    """Whether only this user can put a library in `folder`: owned by us, writable by nobody else. A library
    anyone else can place or swap there runs its code as us when loaded."""
    try:
        st = folder.lstat()
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _obtain() -> ctypes.CDLL:
    """The cached build when its recorded SHA-256 matches, else a new build: in the cache folder when it is
    private and writable, else in a private temporary folder that is removed once the library is loaded."""
    folder, key = build_folder(), _key()
    with contextlib.suppress(OSError):
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    if _private(folder):
        from ..cache_folder import one_at_a_time

        sweep_temporaries(folder)
        target = folder / f"native_step-{key}.so"
        cached, opened = _verified(target, forget=False)  # (a library whose record is not yet written: kept)
        if cached is not None:
            return cached
        if not opened:  # a path once opened stays bound to that library in this process: build elsewhere
            # Builds take turns (the processes of one server starting together): the later ones find the first
            # one's library, and none removes a library that another is between writing and recording.
            with one_at_a_time(folder, lock=".building.lock"):
                cached, opened = _verified(target)
                if cached is not None:
                    return cached
                if not opened:
                    try:
                        _build(target)
                        return _load(target)
                    except OSError:  # read-only or full cache folder: build privately below
                        pass
                    except AttributeError:  # a build without the entry point is no use to the next run either
                        _forget(target)
                        raise
    with tempfile.TemporaryDirectory(prefix="llama-explorer-native-") as tmp:  # created 0700
        target = Path(tmp) / f"native_step-{key}.so"
        _build(target)
        return _load(target)  # the mapping outlives the file


def _sidecar(target: Path) -> Path:
    return target.with_suffix(".sha256")


def _forget(target: Path) -> None:
    for path in (target, _sidecar(target)):
        with contextlib.suppress(OSError):
            path.unlink()


def _verified(target: Path, forget: bool = True) -> tuple[ctypes.CDLL | None, bool]:
    """The cached library, loaded only when its content is the one recorded at build time, and whether it was
    opened. A file without a record, cut short or changed is never opened (a truncated one maps past its end and
    dies with SIGBUS, a planted one runs its constructor) and is removed when `forget` (by the build lock's
    holder), and so is one without `llama_forward`."""
    if not target.exists():
        return None, False
    try:
        good = _sidecar(target).read_text().strip() == _digest(target)
    except (OSError, ValueError):
        good = False
    if not good:
        if forget:
            _forget(target)
        return None, False
    try:
        return _load(target), True
    except (OSError, AttributeError):
        _forget(target)
        return None, True


def _build(target: Path) -> None:
    """Compile native_step.c into `target` and record its SHA-256 beside it, both through temporary names of
    this process (`.native_step-<key>.<pid>.tmp`, swept by the next run when this one is killed). A compiler
    that does not know -march=native (clang on arm64 wants -mcpu=native) gets -mcpu=native, then neither."""
    compiler = _compiler()
    tmp = target.with_name(f".{target.stem}.{os.getpid()}.tmp")
    errors = []
    try:
        for arch in (["-march=native"], ["-mcpu=native"], []):
            flags = [f for f in _FLAGS if f != "-march=native"] + arch
            done = subprocess.run([*compiler, *flags, "-o", str(tmp), str(_SOURCE), "-lm"], capture_output=True,
                                  text=True, timeout=120)
            if done.returncode == 0 and tmp.exists():
                break
            errors.append((done.stderr or done.stdout).strip()[:300])
        else:
            raise OSError(f"{compiler[0]} failed: {errors[0]}")
        digest = _digest(tmp)
        record = target.with_name(f".{target.stem}.sha256.{os.getpid()}.tmp")
        try:
            record.write_text(digest + "\n")
            os.replace(tmp, target)
            os.replace(record, _sidecar(target))
        finally:
            with contextlib.suppress(OSError):
                record.unlink()
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def sweep_temporaries(folder: Path) -> None:
    """Temporaries of compiles that were killed: this module's of a dead process, and the unnamed ones
    (`.native_step-XXXXXXXX.so`) older than any compile takes, here and in the cache folder above."""
    from ..cache_folder import remove_stale_temporaries

    remove_stale_temporaries(folder)
    for place in (folder, folder.parent):  # unnamed temporaries may lie in the cache folder itself
        with contextlib.suppress(OSError):
            for old in place.glob(".native_step-*.so"):
                with contextlib.suppress(OSError):
                    if time.time() - old.stat().st_mtime > 600:
                        old.unlink()


def _load(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    pointer = ctypes.c_void_p
    lib.llama_forward.argtypes = [pointer, ctypes.c_float, pointer, pointer, pointer, pointer, pointer, pointer,
                                  pointer, pointer, pointer, ctypes.c_int, ctypes.c_int, pointer]
    lib.llama_forward.restype = ctypes.c_int
    return lib


def enabled() -> bool:
    return os.environ.get("LLAMA_EXPLORER_NATIVE", "1") != "0"
