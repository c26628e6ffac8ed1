"""ModelFacts: what a view may know about a model, as plain data (no nn.Module, no weights but the norms' γ)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

from explorer_model.config import ModelConfig


@dataclass(frozen=True)
class ModelFacts:
    source: str  # the name the visitor picked (a path when typed locally)
    cfg: ModelConfig
    description: str  # one line: name, size, shape, format
    format: str  # "gguf" | "hf" | "meta" | "native"
    gammas: Mapping[str, np.ndarray]  # "blocks.{L}.ln1" / "blocks.{L}.ln2" / "ln_final" -> γ (float32, read-only)
    param_counts: Mapping[str, int]  # embedding, attention, ffn, norms, output (a tied output counted once)
    tied: bool  # the output matrix is the embedding matrix
    bos_id: int | None
    eos_id: int | None
    add_bos: bool  # the app puts BOS in front of a prompt
    piece: Callable[[int], str]  # display text of a token id
    token_bytes: Callable[[int], bytes]  # the bytes a token id stands for
    is_special: Callable[[int], bool]
    decode: Callable[[list[int]], str]
    dtype: str = "float32"  # the weights' dtype as loaded (float32, bfloat16, …)

    def kv_cache_bytes_per_token(self, bytes_per_value: int = 4) -> int:
        """K and V of every layer and KV head for one token."""
        return 2 * self.cfg.n_layers * self.cfg.n_kv_heads * self.cfg.head_dim * bytes_per_value


def facts_of(source: str, loaded) -> ModelFacts:
    """Built by the gateway once per loaded model (`loaded` is an explorer_model.loaders.LoadedModel)."""
    model, tok = loaded.model, loaded.tokenizer

    def gamma(norm) -> np.ndarray:
        g = norm.weight.detach().float().numpy().copy()
        g.setflags(write=False)
        return g
    gammas = {f"blocks.{l}.{w}": gamma(getattr(b, w)) for l, b in enumerate(model.blocks) for w in ("ln1", "ln2")}
    if model.ln_final is not None:
        gammas["ln_final"] = gamma(model.ln_final)
    return ModelFacts(source=source, cfg=model.cfg, description=loaded.description, format=loaded.format,
                      gammas=gammas, param_counts=dict(model.param_counts()),
                      tied=model.unembed.weight is model.embed.weight,
                      bos_id=tok.bos_id, eos_id=tok.eos_id, add_bos=bool(getattr(tok, "add_bos", False)),
                      piece=tok.piece, token_bytes=tok.token_bytes, is_special=tok.is_special, decode=tok.decode,
                      dtype=str(getattr(loaded, "dtype", "float32")).removeprefix("torch."))
