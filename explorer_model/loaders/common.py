"""What every loader shares: the error type, turning a canonical state dict into a checked model, and writing one
as safetensors without a second copy."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import torch

from ..config import ModelConfig
from ..memory import count_text, dtype_name
from ..model import LlamaModel
from .errors import LoadError, one_line, read_json_object  # noqa: F401  (the loaders import them from here)


def check_sizes(cfg: ModelConfig, state: dict[str, torch.Tensor], source: os.PathLike | str) -> None:
    """Every size the config states, checked against the tensors actually present, before the skeleton is
    built: a layer count of 10^9 would otherwise take minutes creating modules that no weight fills."""
    layers = {int(k.split(".")[1]) for k in state if k.startswith("blocks.") and k.split(".")[1].isdigit()}
    if cfg.n_layers != len(layers) or (layers and max(layers) != cfg.n_layers - 1):
        held = f"{len(layers)} (blocks {min(layers)}..{max(layers)})" if layers else "none"
        raise LoadError(f"{source}: the config says {cfg.n_layers} layers but the weights hold {held}")
    expect = {"embed.weight": (cfg.vocab_size, cfg.d_model),
              "blocks.0.attn.q_proj.weight": (cfg.n_heads * cfg.head_dim, cfg.d_model),
              "blocks.0.attn.k_proj.weight": (cfg.n_kv_heads * cfg.head_dim, cfg.d_model),
              "blocks.0.mlp.up_proj.weight": (cfg.d_ff, cfg.d_model)}
    for key, shape in expect.items():
        t = state.get(key)
        if t is None:
            raise LoadError(f"{source}: the weights lack {key}")
        if tuple(t.shape) != shape:
            raise LoadError(f"{source}: shape mismatch for {key}: the weights hold {list(t.shape)}, "
                            f"the config implies {list(shape)}")


def check_tokenizer_fits(cfg: ModelConfig, tokenizer, source: os.PathLike | str) -> None:
    """A token id past the embedding's last row would be an IndexError in the middle of a forward pass."""
    n = getattr(tokenizer, "vocab_size", 0)
    if n > cfg.vocab_size:
        raise LoadError(f"{source}: the tokenizer has {n} tokens but the model's embedding only {cfg.vocab_size} "
                        "rows; tokenizer and weights do not belong together")


def plan_dtype(cfg: ModelConfig, requested, stored: torch.dtype | None, source: os.PathLike | str,
               *, mapped: bool) -> torch.dtype:
    """The dtype to run in (see memory.choose_dtype), refusing with a LoadError when the model cannot fit.

    Called before any weight is converted or copied. `mapped`: the weights are memory-mapped from files and
    are used in place if `stored` is the chosen dtype; then they need not fit in memory (paged from disk)."""
    from ..memory import choose_dtype, refusal

    try:
        dtype = choose_dtype(requested, cfg, stored)
    except ValueError as e:  # an unknown dtype name
        raise LoadError(one_line(e)) from None
    why = refusal(cfg, dtype, mapped=mapped and stored == dtype)
    if why:
        raise LoadError(f"{source}: {why}")
    return dtype


def stored_dtype(state: dict[str, torch.Tensor]) -> torch.dtype | None:
    """The checkpoint's dtype, as its embedding has it."""
    t = state.get("embed.weight")
    return t.dtype if isinstance(t, torch.Tensor) else None


def build_model(cfg: ModelConfig, state: dict[str, torch.Tensor], source: os.PathLike | str,
                dtype: torch.dtype = torch.float32) -> LlamaModel:
    check_sizes(cfg, state, source)
    try:
        return LlamaModel.from_weights(cfg, state, dtype)
    except ValueError as e:  # key or shape mismatch between the weights and what the config describes
        raise LoadError(f"{source}: {one_line(e)}") from None


def load_tokenizer(loader, where: os.PathLike | str, *args, **kwargs):
    """Call a Tokenizer constructor, turning its TokenizerError into a LoadError."""
    from ..tokenizer import TokenizerError

    try:
        return loader(*args, **kwargs)
    except TokenizerError as e:  # its message names the tokenizer file already
        msg = one_line(e)
        raise LoadError(msg if str(where) in msg else f"{where}: {msg}") from None


def rename_blocks(state: dict[str, torch.Tensor], prefix: str, block_names: dict[str, str],
                  top_names: dict[str, str], skip=()) -> dict[str, torch.Tensor]:
    """Rename checkpoint keys to canonical ones.

    `prefix` is the per-layer key prefix ("model.layers." for HF); the part after "N." is looked up in
    `block_names`. Keys nobody knows keep their name, so load_weights reports them as unexpected
    instead of them vanishing silently.
    """
    out = {}
    for k, v in state.items():
        if any(s in k for s in skip):
            continue
        if k in top_names:
            out[top_names[k]] = v
            continue
        if k.startswith(prefix):
            layer, _, rest = k[len(prefix):].partition(".")
            if layer.isdigit() and rest in block_names:
                out[f"blocks.{int(layer)}.{block_names[rest]}"] = v
                continue
        out[k] = v
    return out


# how a model file's name ends after the model's own name: its weights' type (Q4_1, Q4_K_M, IQ2_XS, F16, BF16, ...)
_WEIGHTS_TAG = re.compile(r"[.\-_](?:I?Q\d\w*|B?F(?:16|32)|FP(?:16|32))$", re.IGNORECASE)


def model_name(path: os.PathLike | str) -> str:
    """A one-file model's name as its file names it, without the weights' type: SmolLM2-135M-Instruct.Q4_1.gguf is
    SmolLM2-135M-Instruct. A GGUF's own general.name is often generated from a training folder ("Smollm2 135M 8k
    Lc100K Mix1 Ep2") and the same bytes may lie under several names, so the name is the file's, not its cache's."""
    stem = Path(path).name.removesuffix(".gguf").removesuffix(".GGUF")
    return _WEIGHTS_TAG.sub("", stem) or stem


_ST_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}


def tensor_type(dtype: torch.dtype | None) -> str:
    """A checkpoint's tensor type as safetensors and GGUF name theirs (BF16, F16, F32): what the file holds, which
    the loaded model's dtype need not be."""
    return "" if dtype is None else _ST_DTYPES.get(dtype, dtype_name(dtype))


def describe(cfg: ModelConfig, model: LlamaModel, fmt: str, extra: str = "") -> str:
    size = count_text(model.param_counts()["total"])
    heads = f"{cfg.n_heads} heads" + (f" ({cfg.n_kv_heads} KV)" if cfg.n_kv_heads != cfg.n_heads else "")
    tied = ", tied embeddings" if cfg.tie_embeddings else ""
    origin = f"{fmt} {extra}" if extra else fmt
    return (f"{cfg.name}: {size} parameters, {cfg.n_layers} layers, d_model {cfg.d_model}, {heads}, "
            f"vocab {cfg.vocab_size}{tied}; {origin}")


def save_streaming(state: dict[str, torch.Tensor], path: Path, metadata: dict[str, str]) -> None:
    """Write a safetensors file tensor by tensor from the tensors' own memory.

    safetensors' save_file first turns every tensor into a bytes object, a second copy of all the weights
    (13 GB for a 7B model in bf16); this writes the same format (8-byte header length, JSON header padded to
    8 bytes, raw little-endian data in header order) with no copy."""
    header, offset = {"__metadata__": metadata}, 0
    for k, v in state.items():
        n = v.numel() * v.element_size()
        header[k] = {"dtype": _ST_DTYPES[v.dtype], "shape": list(v.shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for v in state.values():
            f.write(memoryview(v.contiguous().view(torch.uint8).reshape(-1).numpy()))
