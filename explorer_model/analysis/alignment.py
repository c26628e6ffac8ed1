"""Token alignment for compare mode: which position of prompt A is compared with which position of prompt B.

Minimal pairs (`align_minimal_pair`: common prefix and suffix, and a swapped middle of one length) or pairs the
user picks (`alignment_from_pairs`). compare.py re-exports these names.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..refusal import Refusal


class CompareError(ValueError):
    """A comparison that the two recordings do not allow; the message is one line for people."""


class AlignmentError(Refusal, CompareError):
    """Pairs of positions a person typed that make no alignment."""
    PREFIX, MESSAGES = "alignment", {
        "not_a_pair": "{part!r} is not a pair i-j",
        "not_positions": "an alignment pair must be two positions (i, j), got {pair!r}",
        "outside": "pair ({i}, {j}) is outside the prompts (A has {n_a} tokens, B has {n_b})",
        "empty": "an alignment needs at least one pair of positions",
        "twice": "a position is aligned twice; each token may have one partner",
    }


@dataclass(frozen=True)
class Alignment:
    """Position pairs (i in A, j in B) compared with each other, and which positions hold another token."""
    n_a: int
    n_b: int
    pairs: tuple[tuple[int, int], ...]  # sorted by i
    prefix: int = 0  # common prefix length (minimal pairs); 0 for a user alignment
    suffix: int = 0  # common suffix length, not overlapping the prefix
    substituted: tuple[tuple[int, int], ...] = ()  # pairs in `pairs` whose tokens differ (same slot, new token)

    @property
    def changed_a(self) -> tuple[int, ...]:
        """Positions of A without a partner holding the same token."""
        same = {i for i, _ in self.pairs} - {i for i, _ in self.substituted}
        return tuple(i for i in range(self.n_a) if i not in same)

    @property
    def changed_b(self) -> tuple[int, ...]:
        same = {j for _, j in self.pairs} - {j for _, j in self.substituted}
        return tuple(j for j in range(self.n_b) if j not in same)

    def index(self) -> tuple[np.ndarray, np.ndarray]:
        ia = np.array([i for i, _ in self.pairs], dtype=np.int64)
        return ia, np.array([j for _, j in self.pairs], dtype=np.int64)


def _ids(ids) -> list[int]:
    return [int(i) for i in np.asarray(ids).reshape(-1)]


def align_minimal_pair(ids_a, ids_b, substitutions: bool = True) -> Alignment:
    """Align the common prefix and the common suffix of two id lists (a [1, pos] tensor is fine too).

    When the middles have one length (a word swapped for another of as many tokens) and `substitutions`,
    they are paired slot by slot too, so the minimal-pairs map shows the swapped tokens themselves."""
    a, b = _ids(ids_a), _ids(ids_b)
    n = min(len(a), len(b))
    prefix = 0
    while prefix < n and a[prefix] == b[prefix]:
        prefix += 1
    suffix = 0  # never reaches into the prefix: "a b" vs "a b b" aligns "a b" and leaves one b changed
    while suffix < n - prefix and a[-1 - suffix] == b[-1 - suffix]:
        suffix += 1
    middle = len(a) - suffix - prefix
    swapped = [(i, i) for i in range(prefix, prefix + middle)] if substitutions and len(a) == len(b) else []
    pairs = [(i, i) for i in range(prefix)] + swapped
    pairs += [(len(a) - suffix + k, len(b) - suffix + k) for k in range(suffix)]
    return Alignment(len(a), len(b), tuple(pairs), prefix, suffix, tuple(swapped))


def alignment_from_pairs(pairs, n_a: int, n_b: int, ids_a=None, ids_b=None) -> Alignment:
    """A user-picked alignment: each position of A and of B in at most one pair, all in range. With the two
    id lists, pairs of different tokens are marked substituted."""
    clean = []
    for p in pairs:
        try:
            i, j = (int(x) for x in p)
        except (TypeError, ValueError):
            raise AlignmentError("not_positions", pair=p) from None
        if not (0 <= i < n_a and 0 <= j < n_b):
            raise AlignmentError("outside", i=i, j=j, n_a=n_a, n_b=n_b)
        clean.append((i, j))
    if not clean:
        raise AlignmentError("empty")
    if len({i for i, _ in clean}) < len(clean) or len({j for _, j in clean}) < len(clean):
        raise AlignmentError("twice")
    ids = None if ids_a is None or ids_b is None else (_ids(ids_a), _ids(ids_b))
    if ids is not None and (len(ids[0]), len(ids[1])) != (n_a, n_b):
        raise CompareError(f"the id lists have {len(ids[0])} and {len(ids[1])} tokens, not {n_a} and {n_b}")
    swapped = () if ids is None else tuple((i, j) for i, j in sorted(clean) if ids[0][i] != ids[1][j])
    return Alignment(n_a, n_b, tuple(sorted(clean)), substituted=swapped)
