"""The explorer's own folders: explorer_config.json + model.safetensors + tokenizer.model.

This is what `llama-explorer train-tiny` writes. The config is ModelConfig.to_dict(), so it can carry
what no other format can (norm placement, norm type, FFN type); the weights are the canonical state
dict (float16 or float32; the model computes in float32).

Named sources "tiny-pre" and "tiny-post" are the twins shipped in the repository's assets/ folder.
"""
from __future__ import annotations

from pathlib import Path


from ..config import ConfigError, ModelConfig
from .errors import LoadError, one_line, read_json_object

CONFIG_NAME = "explorer_config.json"
WEIGHTS_NAME = "model.safetensors"
TOKENIZER_NAME = "tokenizer.model"
from ..paths import ASSETS
NAMED = {"tiny-pre": "tiny-pre", "tiny-post": "tiny-post"}


def named_path(source: str) -> Path | None:
    """The shipped folder for a named source like "tiny-pre", or None if the name is not one of ours."""
    name = NAMED.get(source.strip().lower())
    if name is None:
        return None
    if not is_native(ASSETS / name):  # e.g. a non-editable install, which does not carry assets/
        raise LoadError(f"the shipped model {source!r} is missing from {ASSETS / name}; run from the source tree "
                        f"(pip install -e .) or rebuild it with `llama-explorer train-tiny --norm {name[5:]}`")
    return ASSETS / name


def is_native(path: Path) -> bool:
    return path.is_dir() and (path / CONFIG_NAME).is_file()


def read_config(folder: Path) -> ModelConfig:
    path = folder / CONFIG_NAME
    raw = read_json_object(path)
    try:
        return ModelConfig.from_dict(raw)
    except ConfigError as e:
        raise LoadError(f"{path}: {one_line(e)}") from None
    except TypeError as e:  # a missing or unknown field: dataclass construction names it
        raise LoadError(f"{path}: not an explorer config ({one_line(e)})") from None
    except (ValueError, ArithmeticError) as e:  # a field of the wrong type, e.g. "d_model": "big"
        raise LoadError(f"{path}: invalid value ({one_line(e)})") from None


def weights_file(folder: Path) -> Path:
    """The folder's weights file; LoadError when it has none (its config and tokenizer alone)."""
    weights = Path(folder) / WEIGHTS_NAME
    if not weights.is_file():
        raise LoadError(f"{folder}: no {WEIGHTS_NAME} next to {CONFIG_NAME}")
    return weights


def load_native(folder: Path, dtype=None):
    from safetensors.torch import load_file

    from ..tokenizer import Tokenizer
    from .common import build_model, check_sizes, describe, load_tokenizer, plan_dtype, stored_dtype

    folder = Path(folder)
    cfg = read_config(folder)
    weights = weights_file(folder)
    try:
        state = load_file(weights)
    except Exception as e:
        raise LoadError(f"{weights}: not a readable safetensors file ({one_line(e)})") from None
    check_sizes(cfg, state, weights)  # before plan_dtype's estimate builds the config's model on the meta device
    dtype = plan_dtype(cfg, dtype, stored_dtype(state), weights, mapped=True)  # load_file maps the file
    model = build_model(cfg, state, weights, dtype)
    tok_path = folder / TOKENIZER_NAME
    if not tok_path.is_file():
        raise LoadError(f"{folder}: no {TOKENIZER_NAME} next to {CONFIG_NAME}")
    tokenizer = load_tokenizer(Tokenizer.from_sentencepiece, tok_path, tok_path)
    if tokenizer.vocab_size != cfg.vocab_size:
        raise LoadError(f"{tok_path}: {tokenizer.vocab_size} tokens, but the model has a vocabulary of {cfg.vocab_size}")
    norm = f"{cfg.norm_placement}-norm {cfg.norm_type}, {cfg.ffn_type}"
    return model, tokenizer, describe(cfg, model, "native", norm)
