"""Recorded tensors as float64 numpy arrays: the analysis modules return numpy so panels need no torch."""
from __future__ import annotations

import numpy as np


def arr(t, batch: int | None = None) -> np.ndarray:
    """A recorded tensor (or array) as float64 numpy, optionally one batch row: rec[name] -> [pos, ...]."""
    if hasattr(t, "detach"):
        t = t.detach().cpu().double().numpy()
    a = np.asarray(t, dtype=np.float64)
    return a if batch is None else a[batch]


def ids_of(rec, batch: int = 0) -> np.ndarray:
    """The token ids of one prompt of a recording, as int64 numpy."""
    if rec.token_ids is None:
        raise ValueError("the recording has no token ids")
    return np.asarray(rec.token_ids[batch].cpu().numpy(), dtype=np.int64)


def entropy(p: np.ndarray, axis: int = -1) -> np.ndarray:
    """Shannon entropy in nats, −Σ p·ln p over `axis`, with 0·ln 0 = 0 (masked attention cells)."""
    p = np.asarray(p, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        plogp = np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0)
    return -plogp.sum(axis)


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Softmax in float64; −inf entries become exact zeros."""
    x = np.asarray(x, dtype=np.float64)
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    return e / e.sum(axis=axis, keepdims=True)
