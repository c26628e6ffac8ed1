"""Meta's original release format: params.json + consolidated.NN.pth (one per model-parallel rank).

Meta's Q/K rows are already in the adjacent-pair RoPE layout we use. params.json lacks the vocabulary size
(often -1) and the FFN width, so both are read from the weights.
"""
from __future__ import annotations

from pathlib import Path

import torch

from ..config import ConfigError, ModelConfig
from .common import (LoadError, read_json_object, build_model, check_sizes, describe, load_tokenizer, one_line,
                     plan_dtype, rename_blocks, stored_dtype, tensor_type)
from .hf import load_torch_file

_TOP = {"tok_embeddings.weight": "embed.weight", "norm.weight": "ln_final.weight", "output.weight": "unembed.weight"}
_BLOCK = {
    "attention_norm.weight": "ln1.weight",
    "attention.wq.weight": "attn.q_proj.weight",
    "attention.wk.weight": "attn.k_proj.weight",
    "attention.wv.weight": "attn.v_proj.weight",
    "attention.wo.weight": "attn.o_proj.weight",
    "ffn_norm.weight": "ln2.weight",
    "feed_forward.w1.weight": "mlp.gate_proj.weight",
    "feed_forward.w3.weight": "mlp.up_proj.weight",
    "feed_forward.w2.weight": "mlp.down_proj.weight",
}
# Llama-1/2 checkpoints carry RoPE's frequencies as a buffer; they are recomputed from the config.
_SKIP = ("rope.freqs",)

# How each model-parallel rank split a matrix (fairscale): column-parallel layers split their output rows,
# row-parallel ones their input columns, and ParallelEmbedding splits the embedding dimension. Norms are copies.
_SPLIT_DIM = {"wq": 0, "wk": 0, "wv": 0, "w1": 0, "w3": 0, "output": 0, "wo": 1, "w2": 1, "tok_embeddings": 1}


def _split_dim(key: str) -> int | None:
    return _SPLIT_DIM.get(key.split(".")[-2] if key.count(".") else key)


def merged_shapes(shards: list[dict[str, torch.Tensor]], folder: Path) -> dict[str, torch.Tensor]:
    """The merged state's tensors on the meta device (shapes and dtypes, no data): what the sizes are checked on
    and the dtype planned from before anything is concatenated."""
    keys = set(shards[0])
    if any(set(s) != keys for s in shards[1:]):
        raise LoadError(f"{folder}: the consolidated.*.pth shards do not hold the same tensors")
    out = {}
    for k, first in shards[0].items():
        dim, shape = _split_dim(k), list(first.shape)
        if dim is not None and len(shards) > 1:
            parts = [list(s[k].shape) for s in shards]
            if dim >= len(shape) or any(len(p) != len(shape) or p[:dim] + p[dim + 1:] != shape[:dim] + shape[dim + 1:]
                                        for p in parts):
                raise LoadError(f"{folder}: shards of {k} do not fit together ({[tuple(p) for p in parts]})")
            shape[dim] = sum(p[dim] for p in parts)
        out[k] = torch.empty(shape, dtype=first.dtype, device="meta")
    return out


def merge_shards(shards: list[dict[str, torch.Tensor]], folder: Path, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """One state from the model-parallel shards, every split tensor concatenated straight into `dtype` (the
    dtype the model runs in), piece by piece into place: the load holds the model once, never a merged copy
    beside a converted one. One shard is returned as it is (used in place when mapped)."""
    shapes = merged_shapes(shards, folder)
    if len(shards) == 1:
        return shards[0]
    merged = {}
    for k, like in shapes.items():
        dim = _split_dim(k)
        if dim is None:
            merged[k] = shards[0][k]
            continue
        merged[k], start = torch.empty(like.shape, dtype=dtype), 0
        for s in shards:  # copied and converted piece by piece into place: no temporary pieces
            merged[k].narrow(dim, start, s[k].shape[dim]).copy_(s[k])
            start += s[k].shape[dim]
    return merged


def meta_config(folder: Path, params: dict, state: dict, bos_id=None, eos_id=None, n_shards: int = 1) -> ModelConfig:
    """The config from params.json and the weights' shapes (of one of `n_shards` shards, or of the merged state)."""
    params_path = folder / "params.json"
    for key, meta_key in (("embed.weight", "tok_embeddings.weight"), ("blocks.0.mlp.gate_proj.weight",
                                                                      "layers.0.feed_forward.w1.weight")):
        if key not in state or state[key].ndim != 2:
            raise LoadError(f"{folder}: the weights lack a 2-D {meta_key}")
    try:
        cfg = ModelConfig.from_meta_params(  # the FFN's rows are split across shards, the vocabulary is not
            params, vocab_size=state["embed.weight"].shape[0],
            d_ff=state["blocks.0.mlp.gate_proj.weight"].shape[0] * n_shards,
            tie_embeddings="unembed.weight" not in state, bos_id=bos_id, eos_id=eos_id)
        return cfg.with_(name=folder.resolve().name)  # params.json has no name; Meta names the folder
    except ConfigError as e:
        raise LoadError(f"{params_path}: {one_line(e)}") from None
    except (TypeError, ValueError, ArithmeticError) as e:
        raise LoadError(f"{params_path}: invalid value ({one_line(e)})") from None


def peek_config(folder: Path) -> ModelConfig:
    """The config without loading the weights: shapes of the memory-mapped first shard."""
    folder = Path(folder)
    files = sorted(folder.glob("consolidated.*.pth"))
    if not files:
        raise LoadError(f"{folder}: no consolidated.*.pth weights next to params.json")
    state = rename_blocks(load_torch_file(files[0]), "layers.", _BLOCK, _TOP, skip=_SKIP)
    return meta_config(folder, read_json_object(folder / "params.json"), state, n_shards=len(files))


def load_meta(folder: Path, dtype=None):
    """(model, tokenizer, description) of a Meta checkpoint folder; `dtype` as in loaders.load."""
    from ..tokenizer import Tokenizer

    folder = Path(folder)
    params_path = folder / "params.json"
    params = read_json_object(params_path)
    files = sorted(folder.glob("consolidated.*.pth"))
    if not files:
        raise LoadError(f"{folder}: no consolidated.*.pth weights next to params.json")
    if not (folder / "tokenizer.model").is_file():
        raise LoadError(f"{folder}: no tokenizer.model (SentencePiece) next to params.json")
    tokenizer = load_tokenizer(Tokenizer.from_sentencepiece, folder, folder / "tokenizer.model")

    shards = [load_torch_file(f) for f in files]  # each memory-mapped (torch.load mmap=True)
    shapes = rename_blocks(merged_shapes(shards, folder), "layers.", _BLOCK, _TOP, skip=_SKIP)
    cfg = meta_config(folder, params, shapes, tokenizer.bos_id, tokenizer.eos_id)
    check_sizes(cfg, shapes, folder)  # before plan_dtype's estimate builds the config's model on the meta device
    # One shard is used in place; several are concatenated into memory in the chosen dtype (a copy that cannot
    # be avoided: each matrix is split across the files).
    stored = stored_dtype(shapes)
    dtype = plan_dtype(cfg, dtype, stored, folder, mapped=len(files) == 1)
    state = rename_blocks(merge_shards(shards, folder, dtype), "layers.", _BLOCK, _TOP, skip=_SKIP)
    del shards
    model = build_model(cfg, state, folder, dtype)
    shards = f"{len(files)} shards" if len(files) > 1 else "1 shard"
    return model, tokenizer, describe(cfg, model, "Meta", f"{tensor_type(stored)}, {shards}".lstrip(", "))
