"""Lesson targets found on the model, not typed in: which heads link two tokens, the induction head, the sink.

All read attention weights pattern[layer][head, q, k] = softmax(q·k/√d_k + mask) from a recording.

    link(q, k)[layer, head]   = pattern[layer][head, q, k]                 (`head_link_map`)
    induction[layer, head]    = mean_i pattern[layer][head, i, i − P + 1]   over the second copy of a sequence of
                                period P: the token after the previous occurrence of the current token
    sink[layer, head]         = mean_{q ≥ 1} pattern[layer][head, q, 0]    (query 0 can only read itself)
"""
from __future__ import annotations

import re

import numpy as np

from ..model import attention_pattern, causal_scores
from ._arrays import ids_of


def _row(rec, layer: int, q: int, batch: int) -> np.ndarray:
    """pattern[layer][:, q, :q+1] as [head, q+1]: one query row from the recorded rotated Q/K by the model's own
    functions (cheap for long prompts), unless the pattern itself was stored: a what-if run that changes attention
    (no mask) stores it, and a rebuild from Q/K would put the causal mask back."""
    qn, kn = f"blocks.{layer}.attn.hook_rot_q", f"blocks.{layer}.attn.hook_rot_k"
    stored = f"blocks.{layer}.attn.hook_pattern" in rec._store
    if qn in rec and kn in rec and not stored:
        rq = rec[qn][batch:batch + 1, q:q + 1].float()
        rk = rec[kn][batch:batch + 1, :q + 1].float()
        p = attention_pattern(causal_scores(rq, rk, q_offset=q))[0, :, 0]
    else:
        p = rec.pattern(layer)[batch, :, q, :q + 1]
    return p.double().numpy()


def _check_pair(rec, q: int, k: int) -> None:
    n = rec.n_pos
    if not (0 <= q < n and 0 <= k < n):
        raise ValueError(f"positions must be within the prompt (0…{n - 1}), got query {q}, key {k}")
    if k > q:
        raise ValueError(f"key {k} is after query {q}: the causal mask gives it weight 0 in every head")


def head_link_map(rec, q: int, k: int, batch: int = 0, layers=None) -> np.ndarray:
    """[layer, head] attention weight from query position q to key position k (k ≤ q), every layer or the given."""
    _check_pair(rec, q, k)
    return np.stack([_row(rec, layer, q, batch)[:, k]
                     for layer in (range(rec.cfg.n_layers) if layers is None else layers)])


def strongest(m: np.ndarray) -> dict:
    """The largest cell of a [layer, head] map: {'layer', 'head', 'weight'}."""
    layer, head = np.unravel_index(int(np.argmax(m)), m.shape)
    return {"layer": int(layer), "head": int(head), "weight": float(m[layer, head])}


def _edge(c: str, look: str) -> str:
    """A word boundary only at ASCII letters/digits: CJK has no spaces, so 学习 must match inside 深度学习很."""
    return f"(?{look}[A-Za-z0-9])" if c.isascii() and c.isalnum() else ""


def word_positions(pieces, word: str) -> list[list[int]]:
    """Token positions of each occurrence of `word` in a prompt, given each token's decoded piece.

    pieces are str (decoded text per token) or bytes (per-token UTF-8 bytes, which also locate a character split
    over several tokens). A word made of several tokens yields all of them; an occurrence counts only where it is
    not inside a longer ASCII word ("it" is not found in "with"). Leading spaces / SentencePiece "▁" are text
    like any other, so pieces need no cleaning.
    """
    word = word.strip()
    if not word:
        raise ValueError("the word is empty")
    regex = _edge(word[0], "<!") + re.escape(word) + _edge(word[-1], "!")
    if pieces and isinstance(pieces[0], (bytes, bytearray)):
        pieces = [bytes(p).replace("\u2581".encode(), b" ") for p in pieces]
        text, regex = b"".join(pieces), regex.encode("utf-8")
    else:
        pieces = [p.replace("\u2581", " ") for p in pieces]
        text = "".join(pieces)
    ends = np.cumsum([len(p) for p in pieces])  # piece j covers [starts[j], ends[j]) of text
    starts = ends - np.array([len(p) for p in pieces], dtype=ends.dtype)
    out = []
    for m in re.finditer(regex, text, flags=re.IGNORECASE):
        covered = np.flatnonzero((starts < m.end()) & (ends > m.start()))
        out.append([int(j) for j in covered])
    return out


def link_target(rec, q: int, k: int, batch: int = 0) -> dict:
    """The head where query position q attends most to key position k: strongest(...) plus {'q', 'k', 'map'}."""
    m = head_link_map(rec, q, k, batch)
    return {**strongest(m), "q": q, "k": k, "map": m}


def word_link_target(rec, pieces, query_word: str, key_word: str, batch: int = 0) -> dict:
    """link_target for two words (e.g. "it" → "animal"), located with word_positions.

    Uses the first token of the last occurrence of query_word and the first token of the last occurrence of
    key_word before it.
    """
    qs, ks = word_positions(pieces, query_word), word_positions(pieces, key_word)
    if not qs or not ks:
        missing = query_word if not qs else key_word
        raise ValueError(f"{missing!r} is not a word of this prompt")
    q = qs[-1][0]
    before = [occ[0] for occ in ks if occ[0] < q]
    if not before:
        raise ValueError(f"{key_word!r} does not come before {query_word!r}")
    return link_target(rec, q, before[-1], batch)


def induction_scores(rec, period: int, batch: int = 0) -> np.ndarray:
    """[layer, head] mean attention from each position i of the second copy (the last `period` tokens) to
    i − period + 1, the token that followed the current token's previous occurrence."""
    n = rec.n_pos
    if period < 1 or 2 * period > n:
        raise ValueError(f"a prompt of {n} tokens holds no two copies of period {period}")
    ids = ids_of(rec, batch)
    if not np.array_equal(ids[n - 2 * period:n - period], ids[n - period:]):
        raise ValueError(f"the last {2 * period} tokens are not one sequence repeated")
    qs = np.arange(n - period, n)
    out = np.zeros((rec.cfg.n_layers, rec.cfg.n_heads))
    for layer in range(rec.cfg.n_layers):
        p = rec.pattern(layer)[batch]  # [head, q, k]
        out[layer] = p[:, qs, qs - period + 1].double().mean(-1).numpy()
    return out


def sink_share(rec, key: int = 0, batch: int = 0, layers=None) -> np.ndarray:
    """[layer, head] mean attention to position `key` over the queries after it (the first-token sink for 0),
    for every layer or the given ones."""
    n = rec.n_pos
    if not 0 <= key < n - 1:
        raise ValueError(f"need a key position with later queries (0…{n - 2}), got {key}")
    return np.stack([rec.pattern(layer)[batch, :, key + 1:, key].double().mean(-1).numpy()
                     for layer in (range(rec.cfg.n_layers) if layers is None else layers)])
