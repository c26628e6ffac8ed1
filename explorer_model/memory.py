"""What a model costs before it exists: weights per dtype, runtime for a prompt length, what a recording keeps.

Everything here reads only a ModelConfig. Parameter counts and tensor shapes come from the real LlamaModel
built on PyTorch's "meta" device (shapes without storage, so LLaMA-65B costs nothing), which keeps one
implementation of what the model contains: the loaded model's `param_counts()` and these figures agree by
construction. The hooks' shapes, once worked out, are kept in the cache folder for the next process.

    estimate(cfg, torch.bfloat16, n_tokens=512)   weights + runtime, in bytes
    recording_bytes(cfg, 4096, torch.float16)     what `record(...)` of every hook keeps for 4096 tokens
    forward_flops(cfg, 4096), time_class(seconds) how long a forward will take, roughly
    available_bytes()                             MemAvailable, or the cgroup limit if lower
"""
from __future__ import annotations

import functools
import os
import re
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

import torch

from . import shape_store
from .config import ModelConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPE_CHOICES = ("auto", *DTYPES)
DTYPE_ENV = "LLAMA_EXPLORER_DTYPE"  # the app's dtype (llama-explorer serve --dtype sets it)
AVAILABLE_ENV = "LLAMA_EXPLORER_MEMORY_AVAILABLE"  # override of the memory available, e.g. "8GB" (tests, demos)
DEFAULT_TOKENS = 512  # the prompt length a load must leave room for
OVERHEAD = 400 << 20  # Python, torch and the tokenizer, measured at ~350 MB RSS before any weights
COMFORT = 0.5  # auto keeps float32 if weights + runtime take at most this share of the machine's memory


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def parse_dtype(name: str | torch.dtype | None) -> torch.dtype | None:
    """torch dtype for "float32" / "bfloat16" / "float16" (also bf16, fp16, fp32); None for "auto"."""
    if isinstance(name, torch.dtype):
        if name not in DTYPES.values():
            raise ValueError(f"unsupported dtype {name}; choose one of {', '.join(DTYPE_CHOICES)}")
        return name
    key = (name or "auto").strip().lower()
    key = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32"}.get(key, key)
    if key == "auto":
        return None
    if key not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; choose one of {', '.join(DTYPE_CHOICES)}")
    return DTYPES[key]


def itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


# --------------------------------------------------------------------------- the model without weights
@functools.lru_cache(maxsize=16)
def meta_model(cfg: ModelConfig):
    """The LlamaModel of a config on the meta device: every parameter's shape, no storage."""
    from .model import LlamaModel

    with torch.device("meta"):
        return LlamaModel(cfg).eval().requires_grad_(False)


def param_counts(cfg: ModelConfig) -> dict[str, int]:
    """Parameters per component (embedding, attention, ffn, norms, output, total); tied counted once.

    Counted on models of one and two layers (blocks are identical), so a config that claims 10^9 layers is
    estimated at once instead of building 10^9 modules."""
    return dict(_param_counts(cfg))


@functools.lru_cache(maxsize=32)
def _param_counts(cfg: ModelConfig) -> tuple[tuple[str, int], ...]:
    """(a page run asks at each recording's cost estimate: two meta models built once per configuration)"""
    one, two = (meta_model(cfg.with_(n_layers=n)).param_counts() for n in (1, 2))
    return tuple((k, one[k] + (cfg.n_layers - 1) * (two[k] - one[k])) for k in one)


def weight_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Canonical checkpoint key -> shape (a tied model has no separate unembed.weight)."""
    return dict(_weight_shapes(cfg))


@functools.lru_cache(maxsize=32)
def _weight_shapes(cfg: ModelConfig) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """(the shapes table asks at every page run of its view: read off the meta model once per configuration)"""
    return tuple(meta_model(cfg).expected_shapes().items())


@functools.lru_cache(maxsize=32)
def _hook_shapes(cfg: ModelConfig, n_tokens: int) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """Blocks are alike (one config for all), so a one-block model's forward gives every block's shapes: block
    0's, and the hooks before and after the blocks. Ops on the meta device run Python kernels: SmolLM2's 30
    blocks took ~0.15 s a forward. Checked against the whole model's hook names; a mismatch runs it whole."""
    if cfg.n_layers > 1:
        one = _meta_forward_shapes(cfg.with_(n_layers=1), n_tokens)
        block = [(n.split(".", 2)[2], shape) for n, shape in one if n.startswith("blocks.0.")]
        shapes: list = []
        for name, shape in one:
            if not name.startswith("blocks."):
                shapes.append((name, shape))
            elif name.split(".", 2)[2] == block[0][0]:  # where block 0 begins: every block, in order
                shapes += [(f"blocks.{layer}.{rest}", s) for layer in range(cfg.n_layers) for rest, s in block]
        if [name for name, _ in shapes] == meta_model(cfg).hook_names():
            return tuple(shapes)
    return _meta_forward_shapes(cfg, n_tokens)


def _meta_forward_shapes(cfg: ModelConfig, n_tokens: int) -> tuple[tuple[str, tuple[int, ...]], ...]:
    model, shapes = meta_model(cfg), {}

    def keep(x, hp):
        shapes[hp.name] = tuple(x.shape)

    # Every hook attached: the attention takes its explicit path, so scores and patterns exist too.
    with torch.device("meta"), torch.no_grad(), model.hooks([(n, keep) for n in model.hook_names()]):
        model._inv_freq = None  # computed on the meta device inside this context
        model(torch.zeros(1, n_tokens, dtype=torch.long))
    return tuple((n, shapes[n]) for n in model.hook_names())


def hook_shapes(cfg: ModelConfig, n_tokens: int) -> dict[str, tuple[int, ...]]:
    """Every hook point's shape for one prompt of n_tokens, in forward order, from forwards on the meta device.

    Each size in a hook's shape is a fixed number or the prompt's length (every hook is [batch, n, …] or
    [batch, heads, n, n]), so the forwards at n = 1, 2, 3, which the size formulas below run anyway, give every
    length: a page asking the shapes of each new prompt does not wait ~0.15 s (SmolLM2) for a forward of its own.
    A size that is neither would not move in step over 1, 2, 3; then each length is run. The shapes at 1, 2, 3
    are kept in the cache folder (_shape_template)."""
    n = int(n_tokens)
    template = _shape_template(cfg)  # made of the shapes at 1, 2 and 3: those lengths too
    if template is None:
        return dict(_hook_shapes(cfg, n))
    return {name: tuple(n if size is None else size for size in sizes) for name, sizes in template}


@functools.lru_cache(maxsize=32)
def _shape_template(cfg: ModelConfig) -> tuple[tuple[str, tuple[int | None, ...]], ...] | None:
    """Each hook's shape with None where the prompt's length goes, or None if a size is neither fixed nor n;
    kept in the cache folder for the next process (shape_store.py)."""
    stored = shape_store.load(cfg, meta_model(cfg).hook_names())
    if stored is not None:
        return stored
    template = _forward_template(cfg)
    if template is not None:
        shape_store.save(cfg, template)
    return template


def _forward_template(cfg: ModelConfig):
    template = []
    for (name, one), (_, two), (_, three) in zip(*(_hook_shapes(cfg, n) for n in (1, 2, 3))):
        if not len(one) == len(two) == len(three):
            return None
        sizes = []
        for sizes_at in zip(one, two, three):
            if sizes_at == (1, 2, 3):
                sizes.append(None)
            elif len(set(sizes_at)) == 1:
                sizes.append(sizes_at[0])
            else:
                return None
        template.append((name, tuple(sizes)))
    return tuple(template)


# --------------------------------------------------------------------------- bytes
def kv_cache_bytes_per_token(cfg: ModelConfig, bytes_per_value: int | torch.dtype = 4) -> int:
    """Keys and values of every layer for one position (what generation keeps per token)."""
    size = itemsize(bytes_per_value) if isinstance(bytes_per_value, torch.dtype) else int(bytes_per_value)
    return 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * size


def weight_bytes(cfg: ModelConfig, dtype: torch.dtype) -> int:
    return param_counts(cfg)["total"] * itemsize(dtype)


def runtime_bytes(cfg: ModelConfig, n_tokens: int, dtype: torch.dtype) -> int:
    """Working memory of one forward over n_tokens: the KV cache plus the largest transients alive at once
    (float32 scores and pattern of one layer, three FFN-wide tensors, float32 logits, a few residuals),
    plus the interpreter and libraries."""
    n, size = int(n_tokens), itemsize(dtype)
    attention = 2 * cfg.n_heads * n * n * 4
    ffn = 3 * n * cfg.d_ff * size
    resid = 4 * n * cfg.d_model * 4
    logits = n * cfg.vocab_size * 4
    return kv_cache_bytes_per_token(cfg, dtype) * n + attention + ffn + resid + logits + OVERHEAD


@dataclass(frozen=True)
class Estimate:
    dtype: torch.dtype
    n_tokens: int
    weights: int
    runtime: int

    @property
    def total(self) -> int:
        return self.weights + self.runtime

    def __str__(self) -> str:
        return (f"{dtype_name(self.dtype)}: {size_text(self.total)} (weights {size_text(self.weights)} + "
                f"{size_text(self.runtime)} to run {self.n_tokens} tokens)")


def estimate(cfg: ModelConfig, dtype: torch.dtype, n_tokens: int = DEFAULT_TOKENS) -> Estimate:
    return Estimate(dtype, int(n_tokens), weight_bytes(cfg, dtype), runtime_bytes(cfg, n_tokens, dtype))


def estimates(cfg: ModelConfig, n_tokens: int = DEFAULT_TOKENS) -> dict[str, Estimate]:
    """One Estimate per supported dtype, keyed by its name."""
    return {name: estimate(cfg, dt, n_tokens) for name, dt in DTYPES.items()}


def recording_bytes(cfg: ModelConfig, n_tokens: int, dtype: torch.dtype = torch.float32,
                    names=None, attention: str = "derived", model_dtype: torch.dtype = torch.float32) -> int:
    """Bytes a recording of the selected hooks (all by default) keeps for one prompt of n_tokens.

    Mirrors recording.py: tensors are stored in `dtype`, logits always; with derived attention the scores and
    pattern are not stored but rebuilt from float32 rotated Q and K, which also serve those hooks themselves
    (no `dtype` copy beside them). A block's input is the very tensor the previous hook
    (embedding or previous block's output) already stored, converted once whatever `dtype` is. A float32
    recording of a float32 model (`model_dtype`) rebuilds SwiGLU's and RMSNorm's elementwise hooks on access.
    """
    n = int(n_tokens)
    names = None if names is None else tuple([names] if isinstance(names, str) else names)
    rebuilt = dtype == model_dtype == torch.float32  # elementwise hooks rebuilt on access (recording.rebuilt_from)
    # A server's visitors ask at once when it starts: the first computes the fit, the others wait for its result
    # instead of each running the same meta forwards.
    with _FIT_LOCK:
        fit = _quadratic(cfg, dtype, names, attention, rebuilt)
    return fit[0] * n + fit[1] * n * n if fit else _recording_bytes(cfg, n, dtype, names, attention, rebuilt)


_FIT_LOCK = threading.Lock()


@functools.lru_cache(maxsize=64)
def _quadratic(cfg: ModelConfig, dtype: torch.dtype, names, attention: str, rebuilt: bool) -> tuple[int, int] | None:
    """(a, b) with recording_bytes = a·n + b·n²: every hook is [batch, n, …] or [batch, heads, n, n], so three
    meta forwards at n = 1, 2, 3 give every length (a meta forward at 2048 tokens takes ~2 s, which a page
    asking the cost of each new prompt cannot wait for). None if n = 3 does not fit, then lengths are run."""
    one, two, three = (_recording_bytes(cfg, n, dtype, names, attention, rebuilt) for n in (1, 2, 3))
    b = (two - 2 * one) // 2
    a = one - b
    return (a, b) if 3 * a + 9 * b == three else None


def _recording_bytes(cfg: ModelConfig, n_tokens: int, dtype: torch.dtype, names, attention: str,
                     rebuilt: bool) -> int:
    from .recording import _DERIVED, rebuildable_names  # the recorder's own rules: what it rebuilds, not stores

    shapes = hook_shapes(cfg, n_tokens)
    selected = meta_model(cfg).select_hooks(None if names is None else list(names))
    if "logits" not in selected:
        selected.append("logits")
    skipped = rebuildable_names(cfg, selected) if rebuilt else {}
    size, total = itemsize(dtype), 0
    derived_layers = {n.split(".")[1] for n in selected if attention == "derived" and _DERIVED.match(n)}
    rotated = {f"blocks.{layer}.attn.hook_{which}" for layer in derived_layers for which in ("rot_q", "rot_k")}
    chosen = set(selected)
    for name in selected:
        m = re.fullmatch(r"blocks\.(\d+)\.hook_resid_pre", name)
        previous = m and ("hook_embed" if m.group(1) == "0" else f"blocks.{int(m.group(1)) - 1}.hook_resid_post")
        if cfg.ffn_type == "relu" and name.endswith("mlp.hook_post"):  # ReLU's output goes on unchanged
            previous = name.replace("hook_post", "hook_act")
        if _DERIVED.match(name) and attention == "derived" or name in rotated or name in skipped:
            continue  # rebuilt: from the float32 rotated Q and K counted below, or from its recorded inputs
        if previous not in chosen:  # else the same tensor (or its one converted copy), stored once
            total += _numel(shapes[name]) * size
    return total + sum(_numel(shapes[name]) * 4 for name in rotated)


def forward_flops(cfg: ModelConfig, n_tokens: int) -> int:
    """Floating-point operations (2 per multiply-add) of a recording's forward over n_tokens: every weight matrix
    once per row (the embedding is a lookup, norms are negligible), and QK^T and pattern·V over all n x n
    query-key pairs, as the written-out attention computes them (the fused kernel skips part of the masked half)."""
    counts, n = param_counts(cfg), int(n_tokens)
    matrices = counts["attention"] + counts["ffn"] + (counts["embedding"] if cfg.tie_embeddings else counts["output"])
    return 2 * n * matrices + 4 * n * n * cfg.n_heads * cfg.head_dim * cfg.n_layers


DEFAULT_FLOPS = 2e10  # until a recording was timed here: SmolLM2 record-all, 4096 tokens: 1.7e12 FLOPs in 61 s
TIME_CLASSES = ((1.0, "instant"), (10.0, "seconds"), (90.0, "minute"), (float("inf"), "minutes"))


def time_class(seconds: float) -> str:
    """"instant" (< 1 s), "seconds" (< 10 s), "minute" (< 90 s) or "minutes": all an estimate can promise."""
    return next(name for limit, name in TIME_CLASSES if seconds < limit)


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def count_text(n: int) -> str:
    """A parameter count as a model is named by it: 6.7B, 65.3B, 135M, and two digits at least below 10 million or
    thousand (1.5M, not 2M)."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f}{unit}" if unit == "B" or n / scale < 9.95 else f"{n / scale:.0f}{unit}"
    return str(n)


def size_text(n: int) -> str:
    """A size in binary units, as the machine's memory is counted and as the shapes table writes them: GiB from a
    tenth of one, MiB from one, KiB under (never "0 MiB" for a small file)."""
    if n >= 2**30 / 10:
        return f"{n / 2**30:.1f} GiB"
    return f"{n / 2**20:.0f} MiB" if n >= 2**20 else f"{-(-n // 2**10)} KiB"  # a few bytes are 1 KiB


# --------------------------------------------------------------------------- what the machine has
def _parse_bytes(text: str) -> int:
    m = re.fullmatch(r"\s*([\d.]+)\s*([kmgt]?)i?b?\s*", text.lower())
    if not m:
        raise ValueError(f"{AVAILABLE_ENV}={text!r} is not a size like 8GB or 512MB")
    return int(float(m.group(1)) * 1024 ** " kmgt".index(m.group(2) or " "))


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
        return None if text == "max" else int(text)
    except (OSError, ValueError):
        return None


def available_bytes() -> int | None:
    """Memory a new allocation can get: MemAvailable, lowered to the cgroup's room if a limit is set.

    $LLAMA_EXPLORER_MEMORY_AVAILABLE overrides it (e.g. "6GB"). None when nothing can be read (not Linux)."""
    if os.environ.get(AVAILABLE_ENV):
        return _parse_bytes(os.environ[AVAILABLE_ENV])
    found = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    found = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        limit, usage = _read_int(limit_file), _read_int(usage_file)
        if limit is not None and usage is not None and limit < 1 << 60:  # cgroup v1 says "no limit" as 2^63
            room = max(0, limit - usage)
            found = room if found is None else min(found, room)
            break
    return found


def total_bytes() -> int | None:
    """The machine's memory (MemTotal), or the cgroup limit if lower; the override above stands for both."""
    if os.environ.get(AVAILABLE_ENV):
        return _parse_bytes(os.environ[AVAILABLE_ENV])
    found = None
    try:
        with open("/proc/meminfo") as f:
            found = next(int(l.split()[1]) * 1024 for l in f if l.startswith("MemTotal:"))
    except (OSError, ValueError, StopIteration):
        pass
    for limit in (_read_int("/sys/fs/cgroup/memory.max"), _read_int("/sys/fs/cgroup/memory/memory.limit_in_bytes")):
        if limit is not None and limit < 1 << 60:
            found = limit if found is None else min(found, limit)
    return found


def choose_dtype(requested, cfg: ModelConfig, stored: torch.dtype | None) -> torch.dtype:
    """The dtype to run in. "auto": float32 when it fits comfortably (small models stay bit-exact as always),
    else the checkpoint's own 16-bit type (bfloat16 for float32 or quantized checkpoints).

    "Comfortably" is judged against the machine's total memory, so the choice does not change with whatever
    else happens to be running; only a model whose float32 form does not fit in the memory available right
    now also falls back to 16 bits (rather than being refused)."""
    chosen = parse_dtype(requested if requested is not None else os.environ.get(DTYPE_ENV, "auto"))
    if chosen is not None:
        return chosen
    need, total, room = estimate(cfg, torch.float32).total, total_bytes(), available_bytes()
    if (total is None or need <= COMFORT * total) and (room is None or need <= room):
        return torch.float32
    return stored if stored in (torch.bfloat16, torch.float16) else torch.bfloat16


def refusal(cfg: ModelConfig, dtype: torch.dtype, mapped: bool, n_tokens: int = DEFAULT_TOKENS) -> str | None:
    """Why this config cannot run here in `dtype` (one line with the estimate and the memory available), or None.

    Weights memory-mapped from disk in place (`mapped`) need not fit: the kernel pages them in and out as the
    layers run, slowly but correctly. Only the runtime must then fit."""
    room = available_bytes()
    if room is None:
        return None
    est = estimate(cfg, dtype, n_tokens)
    need = est.runtime if mapped else est.total
    if need <= room:
        return None
    smaller = [estimate(cfg, dt, n_tokens) for dt in (torch.bfloat16, torch.float16) if itemsize(dt) < itemsize(dtype)]
    hint = (f"; {dtype_name(smaller[0].dtype)} would need {size_text(smaller[0].total)}"
            if smaller and not mapped else "")
    what = f"{size_text(est.runtime)} to run {n_tokens} tokens" if mapped else str(est)
    return f"{cfg.name} needs about {size_text(need)} of memory ({what}), but only {size_text(room)} is available{hint}"


# --------------------------------------------------------------------------- progress through the layers
@contextmanager
def layer_progress(model, callback: Callable[[int, int], None]) -> Iterator[None]:
    """Call callback(layers_done, n_layers) as each block finishes, in forward passes run by this thread."""
    n = model.cfg.n_layers
    hooks = [(f"blocks.{i}.hook_resid_post", lambda x, hp, i=i: callback(i + 1, n)) for i in range(n)]
    with model.hooks(hooks):
        yield


def text_progress(label: str = "layers", stream=None, width: int = 30) -> Callable[[int, int], None]:
    """A callback for layer_progress drawing `label [#####.....] 12/32` on stderr, ending the line at the end."""
    stream = stream or sys.stderr

    def show(done: int, total: int) -> None:
        fill = width * done // max(total, 1)
        stream.write(f"\r{label} [{'#' * fill}{'.' * (width - fill)}] {done}/{total}")
        if done >= total:
            stream.write("\n")
        stream.flush()

    return show
