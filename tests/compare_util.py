"""Shared by the compare-mode tests: A and B recorded here, as the app encodes them, and the numbers the figures
must show, written out independently of explorer_model.analysis.compare."""
from __future__ import annotations

import math

import numpy as np
import pytest

from explorer_model.loaders import load
from explorer_model.recording import record

LINE = "Shall I compare thee to a summer's day?"
TWINS = dict(model="tiny-pre", prompt=LINE, cmp="model", cmp_model="tiny-post", layer=2, head=3)
BANK_A, BANK_B = "The bank of the river", "The bank approved the loan"


def recorded(source: str, text: str, interventions=None):
    """(ids, full recording) of a prompt as the app encodes it (BOS where the tokenizer wants one)."""
    m = load(source)
    ids = m.tokenizer.encode(text, add_bos=m.tokenizer.add_bos)
    return ids, record(m.model, ids, interventions=interventions)


@pytest.fixture(scope="module")
def twins():
    return recorded("tiny-pre", LINE), recorded("tiny-post", LINE)


def ids_of(fig) -> set:
    return {(f["layout"].get("meta") or {}).get("id") for f in fig}


def js_rows(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Jensen–Shannon divergence (nats) of each row pair, written out: ½ KL(p‖m) + ½ KL(q‖m), m = (p + q) / 2."""
    m = (p + q) / 2

    def kl(x):
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(x > 0, x * np.log(x / m), 0.0).sum(-1)
    return 0.5 * kl(p) + 0.5 * kl(q)


def stream_rms(rec) -> np.ndarray:
    """Residual RMS after k = 0 … L blocks, mean over tokens, from the recorded resid_pre / last resid_post."""
    L, d = rec.cfg.n_layers, rec.cfg.d_model
    xs = [rec[f"blocks.{l}.hook_resid_pre"][0] for l in range(L)] + [rec[f"blocks.{L - 1}.hook_resid_post"][0]]
    return np.array([float((x.double().pow(2).sum(-1).sqrt() / math.sqrt(d)).mean()) for x in xs])


# --------------------------------------------------------------------------- every view
