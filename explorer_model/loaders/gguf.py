"""GGUF (llama.cpp) checkpoints: metadata, dequantization, and a float32 cache of the result.

GGUF lists a tensor's dims innermost first, so `t.shape` is [in, out]; the data itself is stored row by row,
i.e. already [out, in] like torch. Quantized tensors come as uint8 rows of blocks and are dequantized to
float32 once. llama.cpp's converter has already permuted Q/K into the adjacent-pair RoPE layout we use.

Dequantizing and parsing the vocabulary take seconds, so the first load writes the canonical float32 weights,
the config and the tokenizer fields into one safetensors file in the user cache; later loads mmap it.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import warnings
import zlib
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from ..cache_folder import cache_root, one_at_a_time, remove_stale_temporaries
from ..config import ConfigError, ModelConfig, RopeScaling
from ..memory import DTYPES, size_text
from .common import (LoadError, build_model, check_sizes, check_tokenizer_fits, describe, load_tokenizer, model_name,
                     one_line, plan_dtype, save_streaming)

CACHE_VERSION = "3"  # bump whenever what is cached or how it is computed changes
CACHE_SPARE = 256 * 2**20  # bytes a weight cache leaves free on its disk, for everything else

_TOP = {"token_embd.weight": "embed.weight", "output_norm.weight": "ln_final.weight", "output.weight": "unembed.weight"}
_BLOCK = {
    "attn_norm": "ln1", "attn_q": "attn.q_proj", "attn_k": "attn.k_proj", "attn_v": "attn.v_proj",
    "attn_output": "attn.o_proj", "ffn_norm": "ln2", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_BLK = re.compile(r"blk\.(\d+)\.(\w+)\.weight")
def canonical_name(name: str) -> str:
    if name in _TOP:
        return _TOP[name]
    m = _BLK.fullmatch(name)
    if m and m.group(2) in _BLOCK:
        return f"blocks.{int(m.group(1))}.{_BLOCK[m.group(2)]}.weight"
    return name  # unknown: load_weights names it as unexpected


# --------------------------------------------------------------------------- reading
def _reader_class():
    import gguf

    class Reader(gguf.GGUFReader):
        # GGUFReader slices an np.memmap once per string; memmap's per-view bookkeeping makes reading a 49k-token
        # vocabulary take ~2.5 s. Slicing a plain ndarray view of the same mapping gives identical arrays 3x faster.
        def _get(self, offset, dtype, count=1, override_order=None):
            plain = self.__dict__.get("_plain")
            if plain is None:
                plain = self.__dict__["_plain"] = self.data.view(np.ndarray)
            dtype, count = np.dtype(dtype), int(count)
            arr = plain[offset:offset + dtype.itemsize * count].view(dtype)[:count]
            order = self.byte_order if override_order is None else override_order
            return arr if order == "I" else arr.view(arr.dtype.newbyteorder(order))

    return Reader


def open_reader(path: Path):
    try:
        with np.errstate(over="ignore"):  # a wrapping tensor offset is reported by check_tensor_table, not numpy
            return _reader_class()(path)
    except Exception as e:  # bad magic, truncated header or data, unknown value type, empty file ...
        with open(path, "rb") as f:
            magic = f.read(4) == b"GGUF"
        what = "truncated or corrupt GGUF file" if magic else "not a GGUF file"
        raise LoadError(f"{path}: {what} ({one_line(e)})") from None


def read_metadata(reader) -> dict:
    from ..tokenizer import read_gguf_tokenizer_fields

    meta = {}
    for name, field in reader.fields.items():
        if name.startswith("tokenizer."):
            continue
        try:
            meta[name] = field.contents()
        except Exception:  # a field we cannot decode is one we do not use
            pass
    meta.update(read_gguf_tokenizer_fields(reader))
    return meta


def _blocks(raw: np.ndarray, type_size: int) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(raw).view(np.uint8).reshape(-1, type_size).copy())


def _f16(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.float16).float()


# The three simple block formats, in torch (4x faster than gguf's numpy). Same arithmetic as gguf.quants,
# so the results are bit-identical; tests check that.
def _q8_0(b):  # 34 bytes: f16 scale d, 32 x int8 q;  x = d * q
    return b[:, 2:].view(torch.int8).float() * _f16(b[:, :2])


def _q4_0(b):  # 18 bytes: f16 d, 16 bytes of nibbles (low nibbles are x0..15, high x16..31);  x = d * (q - 8)
    qs = b[:, 2:]
    return _f16(b[:, :2]) * (torch.cat([qs & 0x0F, qs >> 4], dim=1).to(torch.int8) - 8).float()


def _q4_1(b):  # 20 bytes: f16 d, f16 min m, 16 bytes of nibbles;  x = d * q + m
    qs = b[:, 4:]
    return _f16(b[:, :2]) * torch.cat([qs & 0x0F, qs >> 4], dim=1).float() + _f16(b[:, 2:4])


def dequantize(t) -> torch.Tensor:
    """One GGUF tensor as float32 in torch order [out, in] (a fresh copy, not a view of the file)."""
    import gguf

    shape = tuple(int(d) for d in reversed(t.shape.tolist()))
    qt = gguf.GGMLQuantizationType
    fast = {qt.Q8_0: _q8_0, qt.Q4_0: _q4_0, qt.Q4_1: _q4_1}
    if t.tensor_type in fast:
        out = fast[t.tensor_type](_blocks(t.data, gguf.GGML_QUANT_SIZES[t.tensor_type][1]))
    elif t.tensor_type in (qt.F32, qt.F16, qt.F64):
        out = torch.from_numpy(np.asarray(t.data).astype(np.float32))
    else:
        try:
            out = torch.from_numpy(np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32))
        except NotImplementedError:
            raise LoadError(f"tensor {t.name} has type {t.tensor_type.name}, which gguf cannot dequantize") from None
    return out.reshape(shape)


def check_tensor_table(reader, path: Path) -> None:
    """Refuse a tensor table llama.cpp would refuse, before any tensor is read (gguf.cpp, gguf_init_from_file):
    1-4 dims, each > 0; rows a whole number of blocks; aligned offsets; every tensor inside the file, none
    overlapping, and the data packed with no gap (a wrong declared type or shape shows as a gap or overlap).
    gguf's reader adds offsets in uint64 and slices whatever it lands on, so this works on the raw numbers."""
    import gguf

    size, start, align = len(reader.data), int(reader.data_offset), int(reader.alignment)
    spans = []
    for t in reader.tensors:
        _, _, n_dims, dims, _, offset = t.field.parts
        n_dims, dims, offset = int(n_dims[0]), [int(d) for d in dims], int(offset[0])
        where = f"{path}: tensor {t.name}"
        if not 1 <= n_dims <= 4 or len(dims) != n_dims:
            raise LoadError(f"{where} has {n_dims} dimensions (GGUF allows 1 to 4)")
        if min(dims) <= 0 or max(dims) >= 2**62 or np.prod([float(d) for d in dims]) >= 2**62:
            raise LoadError(f"{where} has an impossible shape {dims}")
        block, type_size = gguf.GGML_QUANT_SIZES[t.tensor_type]
        if dims[0] % block:
            raise LoadError(f"{where}: rows of {dims[0]} values are not whole {t.tensor_type.name} blocks of {block}")
        n_bytes = int(np.prod(dims, dtype=object)) // block * type_size
        if offset % align:
            raise LoadError(f"{where}: offset {offset} is not a multiple of the alignment {align}")
        if start + offset + n_bytes > size:
            raise LoadError(f"{where}: its {n_bytes} bytes at offset {offset} run past the end of the file "
                            f"({size - start} bytes of tensor data)")
        spans.append((offset, offset + n_bytes, t.name))
    spans.sort()
    expected, before = 0, None
    for begin, end, name in spans:  # a wrong type or shape makes its own tensor too long, or too short
        if begin < expected:
            raise LoadError(f"{path}: tensors {before} and {name} overlap ({before}'s declared type and shape end at "
                            f"{expected}, {name} starts at {begin}); one of their declared types or shapes is wrong")
        if begin > expected + (-expected % align):
            where = f"between tensors {before} and {name}" if before else f"before tensor {name}"
            raise LoadError(f"{path}: {begin - expected} unused bytes {where}; a declared type or shape does not "
                            "match the data layout")
        expected, before = end, name


def convert_config(reader, meta: dict, path: Path) -> tuple[ModelConfig, dict]:
    """The canonical config of an open GGUF file and its tensors by name (rope_freqs folded into the config)."""
    check_tensor_table(reader, path)
    tensors = {t.name: t for t in reader.tensors}
    if "token_embd.weight" not in tensors:
        raise LoadError(f"{path}: no token_embd.weight tensor")
    vocab = int(tensors["token_embd.weight"].shape[1])
    try:
        cfg = ModelConfig.from_gguf_metadata(meta, vocab_size=vocab, tie_embeddings="output.weight" not in tensors)
        cfg = cfg.with_(name=model_name(path))
    except ConfigError as e:
        raise LoadError(f"{path}: {one_line(e)}") from None
    except (TypeError, ValueError, ArithmeticError) as e:  # e.g. a head count of 0 or a string where a number goes
        raise LoadError(f"{path}: invalid llama.* metadata ({one_line(e)})") from None

    if "rope_freqs.weight" in tensors:  # llama3-style scaling: per-frequency divisors of the inverse frequency
        factors = dequantize(tensors.pop("rope_freqs.weight")).flatten()
        if cfg.rope_scaling is not None:  # llama.cpp applies both a linear factor and the divisors
            factors = factors * cfg.rope_scaling.factor
        if factors.numel() != cfg.head_dim // 2:
            raise LoadError(f"{path}: rope_freqs has {factors.numel()} entries, expected {cfg.head_dim // 2}")
        try:
            cfg = cfg.with_(rope_scaling=RopeScaling("factors", factors=tuple(factors.tolist())))
        except ConfigError as e:
            raise LoadError(f"{path}: {one_line(e)}") from None
    return cfg, tensors


def convert(reader, meta: dict, path: Path, choose=None) -> tuple[ModelConfig, dict[str, torch.Tensor], str]:
    """Canonical config and state dict of an open GGUF file, plus a note on its tensor types.

    `choose(cfg, stored)` picks the dtype (float32 by default) once the config is known and before any tensor is
    dequantized; each tensor is then dequantized and converted on its own, so only one float32 tensor exists at
    a time."""
    cfg, tensors = convert_config(reader, meta, path)
    qt = __import__("gguf").GGMLQuantizationType
    stored = {qt.F16: torch.float16, getattr(qt, "BF16", None): torch.bfloat16}.get(tensors["token_embd.weight"].tensor_type)
    # Sizes checked on the tensor table (shapes only, [out, in] as torch has them) before `choose`, whose memory
    # estimate builds the config's model on the meta device: 10^9 declared layers would hang there.
    check_sizes(cfg, {canonical_name(n): torch.empty(tuple(int(d) for d in reversed(t.shape)), device="meta")
                      for n, t in tensors.items()}, path)
    dtype = choose(cfg, stored) if choose else torch.float32
    state = {}
    for name, t in tensors.items():
        try:
            state[canonical_name(name)] = dequantize(t).to(dtype)
        except LoadError as e:
            raise LoadError(f"{path}: {e}") from None
        except Exception as e:
            raise LoadError(f"{path}: cannot read tensor {name} ({one_line(e)})") from None
    kinds = Counter(t.tensor_type.name for t in tensors.values())
    return cfg, state, "/".join(k for k, _ in kinds.most_common())


# --------------------------------------------------------------------------- cache
# What this process has already read in full and checked, by the file's identity: device, inode, size, and the
# modification and status-change times. A file whose identity is unchanged has not been written since (every
# write moves its ctime, which no tool sets back, and a replacement is another inode), so a model loaded again in
# the same process (a server reloading one its memory budget evicted, a test suite) is not hashed or checksummed
# a second time. Size and mtime alone would not do: rsync -t and tar keep both across a replacement.
_CHECKED: dict[tuple, str] = {}


def _identity(path) -> tuple:
    st = os.stat(path)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def file_sha256(path: Path) -> str:
    """SHA-256 of the whole file (its header and tensor table alone would miss edited weights): 0.06-0.19 s for the
    98 MB default GGUF, ~14% of a first cache-hit load (bench/cache_key.py); a miss reads the file anyway."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def content_digest(path: Path) -> str:
    """file_sha256, once per process for a file that has not been written since (_CHECKED)."""
    key = ("sha256", *_identity(path))
    if key not in _CHECKED:
        _CHECKED[key] = file_sha256(path)
    return _CHECKED[key]


def cache_file(path: Path, cache_dir=None, digest: str | None = None, dtype: torch.dtype = torch.float32) -> Path:
    """<stem>-w<which content, which dtype>.safetensors: named by what the GGUF holds, not where it lies (the same
    file in two places has one cache; a file changed in place, a new one). Each dtype has its own cache."""
    tag = "" if dtype == torch.float32 else f"|{dtype}"
    version = hashlib.sha256(f"{CACHE_VERSION}|{digest or content_digest(path)}{tag}".encode()).hexdigest()[:16]
    return cache_root(cache_dir) / f"{path.resolve().stem}-w{version}.safetensors"  # (a link: its target's name)


# a cache named by path and content (<stem>-<8 hex>-<16 hex>) is never looked up: only disk, 4 bytes a parameter
_PATH_NAMED = re.compile(r".+-[0-9a-f]{8}-[0-9a-f]{16}\.safetensors")


def drop_replaced(file: Path, source: str) -> None:
    """After `file` was written for `source` (its header's path and dtype): remove the caches of what that path held
    before (same dtype, other content) and the path-named ones. Another path's cache stays: it may still be used."""
    from safetensors import safe_open

    for other in file.parent.glob("*.safetensors"):
        if other == file:
            continue
        if not _PATH_NAMED.fullmatch(other.name):
            try:
                with safe_open(other, "pt") as f:
                    if (f.metadata() or {}).get("source") != source:
                        continue
            except Exception:  # unreadable: the load that finds it rebuilds it
                continue
        with contextlib.suppress(OSError):  # (another user's file in a shared folder: left)
            other.unlink(missing_ok=True)


def cache_crc32(state: dict, info: dict) -> str:
    """Checksum of everything the cache holds: its header fields (config, tokenizer, note) and every
    tensor's bytes, in key order. A cache damaged or edited after it was written (one digit of norm_eps is
    enough to change the logits) is caught on read (0.13 s for SmolLM2's 540 MB) and rebuilt."""
    crc = 0
    for k in sorted(info):
        if k != "crc32":
            crc = zlib.crc32(f"{k}={info[k]}\0".encode(), crc)
    for k in sorted(state):
        t = state[k].contiguous()
        crc = zlib.crc32(k.encode(), crc)
        crc = zlib.crc32(memoryview(t.view(torch.uint8).reshape(-1).numpy()), crc)
    return f"{crc:08x}"


def _cache_header(file: Path) -> dict | None:
    """A cache file's header fields if it is of this CACHE_VERSION (raises if it cannot be read)."""
    from safetensors import safe_open

    with safe_open(file, "pt") as f:
        info = f.metadata() or {}
    return info if info.get("cache_version") == CACHE_VERSION else None


def read_cache(file: Path):
    """(cfg, state, tokenizer fields, note), or None when the file is absent or unusable."""
    from safetensors.torch import load_file

    if not file.is_file():
        return None
    try:
        info = _cache_header(file)
        if info is None:
            return None
        before = ("crc32", *_identity(file))
        state = load_file(file)
        checked = before in _CHECKED and _CHECKED[before] == info.get("crc32") and ("crc32", *_identity(file)) == before
        if not checked:
            if cache_crc32(state, info) != info.get("crc32"):
                return None
            _CHECKED[before] = info["crc32"]
        cfg = ModelConfig.from_dict(json.loads(info["config"]))
        return cfg, state, json.loads(info["tokenizer"]), info.get("note", "")
    except Exception:  # truncated, garbled or from another version: rebuild it
        return None


def cached_header(path: Path, cache_dir=None) -> dict | None:
    """The header of a cache of this GGUF (any dtype: config and tokenizer fields), or None; no weight is read or
    checksummed (a load does that), nor the GGUF's vocabulary parsed (~1 s for SmolLM2's)."""
    with open(path, "rb") as f:  # anything else is refused by the parse, before a hash of all its bytes
        if f.read(4) != b"GGUF":
            return None
    digest = content_digest(path)
    for dtype in DTYPES.values():
        try:
            if (info := _cache_header(cache_file(path, cache_dir, digest, dtype))) is not None:
                ModelConfig.from_dict(json.loads(info["config"]))  # readable, else the next dtype's
                return info
        except Exception:  # absent, truncated or garbled: the next dtype's, or the GGUF itself
            continue
    return None


def write_cache(file: Path, cfg: ModelConfig, state: dict, tok_fields: dict, note: str, source: str) -> None:
    """The cache, unless the disk would keep less than CACHE_SPARE free after it (then a warning: the next load
    converts again); written to a temporary name, then renamed."""
    tmp = file.with_name(f".{file.name}.{os.getpid()}.tmp")
    need = sum(t.numel() * t.element_size() for t in state.values())
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(file.parent).free
        if free - need < CACHE_SPARE:
            warnings.warn(f"not caching the weights in {file.parent}: they take {size_text(need)} and "
                          f"{size_text(free)} is free (a cache leaves {size_text(CACHE_SPARE)}); the next load "
                          "converts the file again", stacklevel=3)
            return
        info = {"cache_version": CACHE_VERSION, "config": json.dumps(cfg.to_dict()),
                "tokenizer": json.dumps(tok_fields), "note": note, "source": source}
        info["crc32"] = cache_crc32(state, info)
        save_streaming(state, tmp, info)
        os.replace(tmp, file)  # atomic: readers see the old file or the whole new one
        drop_replaced(file, source)
    except Exception as e:  # an unwritable cache only costs speed next time
        with contextlib.suppress(OSError):
            tmp.unlink()
        warnings.warn(f"could not write the weight cache {file}: {one_line(e)}", stacklevel=3)


# --------------------------------------------------------------------------- entry point
def _from_cache(file: Path, requested, dtype: torch.dtype, source: Path):
    """The model from a cache holding `dtype`, if it exists and is the dtype `requested` resolves to."""
    cached = read_cache(file)
    if cached is None:
        return None
    from ..tokenizer import Tokenizer

    cfg, state, tok_fields, note = cached
    cfg = cfg.with_(name=model_name(source))
    if plan_dtype(cfg, requested, dtype, source, mapped=True) != dtype:
        return None
    try:
        model = build_model(cfg, state, file, dtype)
        tokenizer = load_tokenizer(Tokenizer.from_gguf_fields, file, tok_fields, source=str(file))
    except LoadError:  # a cache that does not fit its own config is corrupt
        return None
    return model, tokenizer, describe(cfg, model, "GGUF", note)


def load_gguf(path: Path, cache_dir=None, use_cache: bool = True, dtype=None):
    """(model, tokenizer, description) of a GGUF file; `dtype` as in loaders.load."""
    from ..memory import DTYPES, parse_dtype

    path = Path(path)
    with open(path, "rb") as f:  # before hashing: a 3 GB file of anything else is refused at once
        if f.read(4) != b"GGUF":
            raise LoadError(f"{path}: not a GGUF file (it does not start with the GGUF magic)")
    try:
        wanted = parse_dtype(dtype if dtype is not None else os.environ.get("LLAMA_EXPLORER_DTYPE", "auto"))
    except ValueError as e:
        raise LoadError(one_line(e)) from None
    if not use_cache:
        return _convert(path, dtype, cache_dir, digest=None)
    digest = content_digest(path)
    remove_stale_temporaries(cache_root(cache_dir))

    def cached():  # "auto" accepts the first cache holding the dtype it resolves to (the config is in the cache)
        for dt in [wanted] if wanted is not None else DTYPES.values():
            hit = _from_cache(cache_file(path, cache_dir, digest, dt), dtype, dt, path)
            if hit:
                return hit
        return None
    if hit := cached():
        return hit
    with one_at_a_time(cache_root(cache_dir)):  # another process may have converted it while this one waited
        return cached() or _convert(path, dtype, cache_dir, digest)


def _convert(path: Path, dtype, cache_dir, digest: str | None):
    """Dequantize the GGUF into a model; with the file's digest, write its cache too."""
    from ..tokenizer import Tokenizer

    reader = open_reader(path)
    meta = read_metadata(reader)
    cfg, state, note = convert(reader, meta, path,
                               lambda cfg, stored: plan_dtype(cfg, dtype, stored, path, mapped=False))
    tok_fields = {k: v for k, v in meta.items() if k.startswith("tokenizer.")}
    used = state["embed.weight"].dtype
    cache = cache_file(path, cache_dir, digest, used) if digest else None
    model = build_model(cfg, state, path, used)
    tokenizer = load_tokenizer(Tokenizer.from_gguf_fields, path, tok_fields, source=str(path))
    check_tokenizer_fits(cfg, tokenizer, path)  # load() checks every format; here it must precede the cache
    # only once the file proved loadable, and only if it was not rewritten in place while we read it
    if cache and content_digest(path) == digest:
        write_cache(cache, cfg, state, tok_fields, note, f"{os.fsdecode(path.resolve())}|{used}")
    return model, tokenizer, describe(cfg, model, "GGUF", note)
