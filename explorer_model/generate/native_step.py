"""A decode step compiled from C (native_step.c), for generation where no hook observes the pass.

Why: a float32 SmolLM2 step streams 538 MB of weights through one-row products. torch's one-row linear reads
~17-27 GB/s on one core of this machine, while a sum reads ~37-40 GB/s; a product that keeps sixteen rows in
flight reads about as fast as the sum (bench/bench_decode.py measures both paths), and one C call per token also
removes the ~20 Python-level operations per layer of the lean step. A short prompt (up to PROMPT_MAX tokens) runs
through the same code, four weight rows meeting four tokens at a time: faster than torch's products at that size,
and the prompt's keys and values come from the kernels the steps use. The price: sums run in another order, so
logits differ from the hooked forward's in the last bits (tests/test_native_step.py bounds the difference and
checks that greedy tokens are the same on SmolLM2 and tiny models). Where exact bits matter (a recording, an
intervention, a lesson) the hooked forward runs; this path serves `generate` only.

The C file is compiled once per machine with the system's C compiler (`cc`, or $CC) into the private folder
`native-step` of the explorer's cache, named by the hash of the source, compiler, flags and CPU (two CPUs sharing a
cache each get their own build), with the library's SHA-256 recorded beside it; a library is loaded only when it
matches its record (docs/robustness.md). No compiler, a failed build or LLAMA_EXPLORER_NATIVE=0: `native_applies`
says False and decode.py's lean torch step runs, with the same tokens. ctypes releases the GIL for the call, so a server's other threads run on.
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

import torch

from .decode import _layers, lean_applies
from ..model import KVCache, LlamaModel, RMSNorm

_SOURCE = Path(__file__).with_name("native_step.c")
_FLAGS = ["-O3", "-march=native", "-std=gnu11", "-shared", "-fPIC"]
_PER_LAYER = 16  # pointers per layer, in native_step.c's order
PROMPT_MAX = 64  # tokens of a prompt run here rather than through the model's forward (faster up to 64 at least)
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
    from ..loaders.gguf import cache_root  # the explorer's one cache folder

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
        sweep_temporaries(folder)
        target = folder / f"native_step-{key}.so"
        cached, opened = _verified(target)
        if cached is not None:
            return cached
        if not opened:  # a path once opened stays bound to that library in this process: build elsewhere
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


def _verified(target: Path) -> tuple[ctypes.CDLL | None, bool]:
    """The cached library, loaded only when its content is the one recorded at build time, and whether it was
    opened. A file without a record, cut short or changed is removed without being opened (a truncated one maps
    past its end and dies with SIGBUS, a planted one runs its constructor), and so is one without `llama_forward`."""
    if not target.exists():
        return None, False
    try:
        good = _sidecar(target).read_text().strip() == _digest(target)
    except (OSError, ValueError):
        good = False
    if not good:
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
    from ..loaders.gguf import remove_stale_temporaries

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


class _Plan:
    """The pointers native_step.c reads for one model, gathered once (while decode.py's layer list holds)."""

    def __init__(self, model: LlamaModel, layers: list):
        cfg = model.cfg
        self.layers = layers
        self.dims = (ctypes.c_int * 7)(cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim,
                                       layers[0].d_ff, cfg.vocab_size)
        self.eps = model.ln_final.eps
        norms = [model.ln_final] + [n for b in model.blocks for n in (b.ln1, b.ln2)]
        self.ends = (model.embed.weight, model.unembed.weight, model.ln_final.weight)  # held: the pointers stay valid
        tensors = list(self.ends)
        pointers = []
        for layer in layers:
            weights = [w for _, w, _ in layer.params]  # q k v o gate up down
            biases = [b for _, _, b in layer.params]
            tensors += [layer.ln1.weight, layer.ln2.weight, *weights, *(b for b in biases if b is not None)]
            pointers += [layer.ln1.weight, layer.ln2.weight, *weights, *biases]
        self.usable = (all(isinstance(n, RMSNorm) and n.eps == self.eps for n in norms)
                       and all(t.dtype == torch.float32 and t.is_contiguous() and t.device.type == "cpu"
                               for t in tensors))
        self.pointers = (ctypes.c_void_p * len(pointers))(*(None if t is None else t.data_ptr() for t in pointers))
        self.embed, self.unembed, self.ln_final = (t.data_ptr() for t in self.ends)
        self.kv_shape = (1, 1, cfg.n_kv_heads, cfg.head_dim)


def _plan(model: LlamaModel) -> _Plan:
    layers = _layers(model)  # the same list object while the blocks keep their parameters
    plan = getattr(model, "_native_plan", None)
    ends = (model.embed.weight, model.unembed.weight, model.ln_final.weight)
    if plan is None or plan.layers is not layers or any(a is not b for a, b in zip(plan.ends, ends)):
        plan = model._native_plan = _Plan(model, layers)
    return plan


def native_applies(model: LlamaModel, cache: KVCache, n_tokens: int = 1) -> bool:
    """Whether `native_forward` can run these tokens: a decode step where the lean step could, or a short prompt
    (up to PROMPT_MAX tokens) on an empty cache, with RMSNorm, float32 contiguous CPU weights and the compiled
    library at hand."""
    if not (enabled() and 1 <= n_tokens and (n_tokens == 1 or (n_tokens <= PROMPT_MAX and cache.length == 0))):
        return False
    return lean_applies(model, cache, 1) and library() is not None and _plan(model).usable


def serves(model: LlamaModel) -> bool:
    """Whether `generate`'s steps take the compiled step for this model as it is now."""
    after_a_prompt = KVCache(model.cfg.n_layers)
    after_a_prompt.lengths = [1] * model.cfg.n_layers  # only the model's kind is asked about
    return native_applies(model, after_a_prompt)


def native_forward(model: LlamaModel, tokens: list[int], cache: KVCache) -> torch.Tensor:
    """Logits [vocab] of the last of `tokens`, which follow the cache's positions; their keys and values are
    appended to the cache. As the model's forward computes them up to the order of sums. The caller checks
    `native_applies` first."""
    plan, pos, m = _plan(model), cache.length, len(tokens)
    if not all(0 <= t < model.cfg.vocab_size for t in tokens):
        raise IndexError(f"a token id is outside the vocabulary (0..{model.cfg.vocab_size - 1})")
    if pos + m > model.cfg.max_seq_len:
        raise ValueError(f"{pos + m} positions exceed the model's {model.cfg.max_seq_len}")
    template = torch.empty(plan.kv_shape)
    for layer in range(model.cfg.n_layers):
        cache.reserve(layer, pos + m, template, template)
    cos, sin = model.rope_table(pos, pos + m)  # [m, d_head / 2], contiguous rows of the model's table
    k_caches = (ctypes.c_void_p * len(cache.k))(*(t.data_ptr() for t in cache.k))
    v_caches = (ctypes.c_void_p * len(cache.v))(*(t.data_ptr() for t in cache.v))
    ids = (ctypes.c_int * m)(*tokens)
    logits = torch.empty(model.cfg.vocab_size)
    status = library().llama_forward(plan.dims, plan.eps, plan.pointers, plan.embed, plan.ln_final, plan.unembed,
                                     cos.data_ptr(), sin.data_ptr(), k_caches, v_caches, ids, m, pos,
                                     logits.data_ptr())
    if status != 0:
        raise MemoryError("no memory for the compiled forward's scratch buffers")
    cache.lengths = [pos + m] * len(cache.lengths)
    return logits


def native_step(model: LlamaModel, token: int, cache: KVCache) -> torch.Tensor:
    """One decode step: logits [vocab] of `token` at position cache.length (see native_forward)."""
    return native_forward(model, [token], cache)
