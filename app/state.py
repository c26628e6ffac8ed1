"""The narrow model <-> UI interface: cached model loading, cached recordings, prompt handling.

Models are cached per source string and recordings per (source, token ids), so switching view, layer,
head or token reruns only the drawing code. `FORWARDS` counts forward passes for the tests.
"""
from __future__ import annotations

import io

import numpy as np
import streamlit as st

from explorer_model.loaders import LoadedModel, LoadError, load
from explorer_model.recording import Recording, record

DEFAULT_SOURCE = "smollm2"
DEFAULT_MAX_TOKENS = 256
FORWARDS = {"count": 0}


@st.cache_resource(max_entries=3, show_spinner=False)
def get_model(source: str) -> LoadedModel:
    return load(source)


@st.cache_resource(max_entries=24, show_spinner=False)
def get_recording(source: str, ids: tuple[int, ...]) -> Recording:
    FORWARDS["count"] += 1
    return record(get_model(source).model, list(ids))


def try_load(source: str) -> tuple[LoadedModel | None, str | None]:
    """(model, None) or (None, one-line reason); never raises for bad input."""
    try:
        return get_model(source), None
    except LoadError as e:
        return None, str(e)
    except (MemoryError, OSError, ValueError) as e:
        return None, f"{type(e).__name__}: {e}"


def encode_prompt(loaded: LoadedModel, text: str, max_tokens: int) -> tuple[list[int], int]:
    """Token ids cut to max_tokens, and the length before cutting."""
    tok = loaded.tokenizer
    ids = tok.encode(text, add_bos=getattr(tok, "add_bos", False))
    limit = max(1, min(max_tokens, loaded.model.cfg.max_seq_len))
    return ids[:limit], len(ids)


@st.cache_data(max_entries=4, show_spinner=False)
def recording_npz(source: str, ids: tuple[int, ...]) -> bytes:
    buf = io.BytesIO()
    np.savez_compressed(buf, **get_recording(source, ids).to_numpy())
    return buf.getvalue()
