"""Hugging Face folders: config.json + safetensors (single or sharded) or pytorch_model.bin.

HF rotates the half-split pairs (q_i, q_{i + d_head/2}); our RoPE rotates adjacent pairs, so the rows of
q_proj and k_proj are permuted here (the same permutation llama.cpp's converter applies).
"""
from __future__ import annotations

import json
import pickle
from collections.abc import Callable
from pathlib import Path

import torch

from ..config import ConfigError, ModelConfig
from ..rope import hf_to_adjacent
from .common import (LoadError, read_json_object, build_model, check_sizes, describe, load_tokenizer, one_line,
                     plan_dtype, rename_blocks, tensor_type)

_TOP = {"model.embed_tokens.weight": "embed.weight", "model.norm.weight": "ln_final.weight",
        "lm_head.weight": "unembed.weight"}
_BLOCK = {
    "input_layernorm.weight": "ln1.weight",
    "self_attn.q_proj.weight": "attn.q_proj.weight",
    "self_attn.k_proj.weight": "attn.k_proj.weight",
    "self_attn.v_proj.weight": "attn.v_proj.weight",
    "self_attn.o_proj.weight": "attn.o_proj.weight",
    "post_attention_layernorm.weight": "ln2.weight",
    "mlp.gate_proj.weight": "mlp.gate_proj.weight",
    "mlp.up_proj.weight": "mlp.up_proj.weight",
    "mlp.down_proj.weight": "mlp.down_proj.weight",
}
# LlamaConfig(attention_bias=True / mlp_bias=True) checkpoints add biases next to the same weights.
_BLOCK.update({k.replace(".weight", ".bias"): v.replace(".weight", ".bias") for k, v in list(_BLOCK.items())
               if "proj" in k})
# Older checkpoints saved RoPE's inverse frequencies as buffers; they are recomputed from the config.
_SKIP = ("rotary_emb.inv_freq",)


def read_config(folder: Path) -> ModelConfig:
    path = folder / "config.json"
    raw = read_json_object(path)
    try:
        return ModelConfig.from_hf_config(raw)
    except ConfigError as e:
        raise LoadError(f"{path}: {one_line(e)}") from None
    except (TypeError, ValueError, ArithmeticError) as e:  # a field of the wrong type, e.g. "hidden_size": "big"
        raise LoadError(f"{path}: invalid value ({one_line(e)})") from None


def load_torch_file(path: Path) -> dict[str, torch.Tensor]:
    """torch.load that refuses pickled code: weights_only allows tensors and plain containers only."""
    try:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as e:
            if "mmap" not in str(e):
                raise
            state = torch.load(path, map_location="cpu", weights_only=True)  # legacy non-zip format
    except pickle.UnpicklingError:
        raise LoadError(f"refusing to load {path}: it contains Python objects other than tensors") from None
    except Exception as e:
        if "PytorchStreamReader" in str(e):  # torch's reader of the file's zip archive: its text is its internals
            raise LoadError(f"{path}: truncated or corrupt (its zip archive cannot be read)") from None
        raise LoadError(f"{path}: not a readable PyTorch checkpoint ({one_line(e)})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise LoadError(f"{path}: expected a dict of tensors")
    return state


def _load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    try:
        return load_file(path)
    except Exception as e:
        raise LoadError(f"{path}: not a readable safetensors file ({one_line(e)})") from None


def check_safetensors(path: Path) -> None:
    """LoadError when a safetensors file is not one or holds fewer bytes than its header describes (a copy cut
    short), read from its header alone: a server checks its model before it starts, without loading it."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if not 2 <= n <= min(size - 8, 100 * 2**20):  # the format's own bound on a header: 100 MB
                raise ValueError(f"a header of {n} bytes in a file of {size}")
            header = json.loads(f.read(n))
        end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError) as e:
        raise LoadError(f"{path}: not a readable safetensors file ({one_line(e)})") from None
    if 8 + n + end > size:
        raise LoadError(f"{path}: truncated: its header describes {8 + n + end} bytes, the file holds {size}")


def _shard_files(folder: Path, index_name: str) -> list[Path]:
    index = folder / index_name
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        return [folder / f for f in sorted(set(weight_map.values()))]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise LoadError(f"{index}: not a valid shard index ({one_line(e)})") from None


def weight_files(folder: Path) -> tuple[list[Path], Callable]:
    """The folder's weight files, whichever of HF's file layouts it uses, and the reader of that layout; LoadError
    when it has none, or an index lists a shard that is not there."""
    if (folder / "model.safetensors.index.json").is_file():
        files, read = _shard_files(folder, "model.safetensors.index.json"), _load_safetensors
    elif (folder / "model.safetensors").is_file():
        files, read = [folder / "model.safetensors"], _load_safetensors
    elif (folder / "pytorch_model.bin.index.json").is_file():
        files, read = _shard_files(folder, "pytorch_model.bin.index.json"), load_torch_file
    elif (folder / "pytorch_model.bin").is_file():
        files, read = [folder / "pytorch_model.bin"], load_torch_file
    else:
        raise LoadError(f"{folder}: no weights (model.safetensors or pytorch_model.bin)")
    for f in files:
        if not f.is_file():
            raise LoadError(f"{f}: shard listed in the index is missing")
    return files, read


def read_weights(folder: Path) -> tuple[dict[str, torch.Tensor], str]:
    """All tensors of the folder, whichever of HF's file layouts it uses, and the layout's name."""
    files, read = weight_files(folder)
    state = {}
    for f in files:
        state.update(read(f))
    return state, files[0].suffix.lstrip(".")


def to_canonical(state: dict[str, torch.Tensor], cfg: ModelConfig, folder: Path) -> dict[str, torch.Tensor]:
    out = rename_blocks(state, "model.layers.", _BLOCK, _TOP, skip=_SKIP)
    check_sizes(cfg, out, folder)  # before the per-layer loop below, which a layer count of 10^9 would hang
    if cfg.tie_embeddings:
        out.pop("unembed.weight", None)  # some tied checkpoints store the shared matrix twice
    elif "unembed.weight" not in out:
        raise LoadError(f"{folder}: config.json says tie_word_embeddings is false but lm_head.weight is missing")
    seen = set()
    for i in range(cfg.n_layers):
        for name, heads in (("q_proj", cfg.n_heads), ("k_proj", cfg.n_kv_heads)):
            for kind in ("weight", "bias"):  # a bias is permuted with the rows it is added to
                key = f"blocks.{i}.attn.{name}.{kind}"
                w = out.get(key)
                # A wrongly shaped tensor is left as it is, for load_weights to report the shape mismatch.
                if w is not None and w.ndim == (2 if kind == "weight" else 1) and w.shape[0] == heads * cfg.head_dim:
                    perm = hf_to_adjacent(w, heads)
                    # Written back in place: in a private file mapping only these pages become private copies,
                    # so a memory-mapped checkpoint is not duplicated. A tensor sharing memory with one already
                    # permuted (possible in .bin files) gets its own copy instead of a second permutation.
                    alias = w.data_ptr() in seen or not w.is_contiguous()
                    seen.add(w.data_ptr())
                    out[key] = perm if alias else w.copy_(perm)
    return out


def load_hf(folder: Path, dtype=None):
    """(model, tokenizer, description) of a HF model folder; `dtype` as in loaders.load."""
    from ..tokenizer import Tokenizer

    folder = Path(folder)
    cfg = read_config(folder)
    if cfg.name in ("llama", "mistral"):  # no _name_or_path: the folder's name says more
        cfg = cfg.with_(name=folder.resolve().name)
    state, kind = read_weights(folder)  # memory-mapped (safetensors, zip-format .bin)
    stored = next((v.dtype for v in state.values() if v.is_floating_point()), None)
    # Sizes first (to_canonical checks them again, right before it permutes in place): plan_dtype's estimate builds
    # the config's model on the meta device, which 10^9 declared layers would hang.
    check_sizes(cfg, rename_blocks(state, "model.layers.", _BLOCK, _TOP, skip=_SKIP), folder)
    dtype = plan_dtype(cfg, dtype, stored, folder, mapped=True)
    model = build_model(cfg, to_canonical(state, cfg, folder), folder, dtype)
    tokenizer = load_tokenizer(Tokenizer.from_path, folder, folder)
    return model, tokenizer, describe(cfg, model, "HF", f"{kind} {tensor_type(stored)}".strip())
