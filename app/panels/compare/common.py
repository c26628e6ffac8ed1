"""Compare mode's data for the views: the pair of sides (A, B) each view's compare hook receives, and the few
numbers those hooks draw that explorer_model.analysis.compare does not already give.

A side is a ViewContext (its own facts, recording, ids, labels and its own layer / head / token, mapped from
A's selection) plus the what-if interventions it was recorded with (B only). What the two have in common is
decided once, by `compare.comparable` and, for two prompts, `compare.align_minimal_pair`; the hooks only read it.
Expensive per-pair data goes through the gateway's result cache (`Pair.cached`), so switching view, layer,
head or token draws from cache and runs nothing.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app import gateway
from app.context import ViewContext
from app.figure_text import legend_line, telling_apart
from app.token_window import TOUCH_CELL
from explorer_model.analysis import compare as C


def stacked_row(ctx: ViewContext, n_rows: int) -> int | None:
    """px of one heatmap of A, B and B − A when they stand one under another (a phone, whose columns Streamlit
    stacks too), or None where they stand side by side: rows about a fingertip high, none taller than the column is
    wide."""
    if not ctx.screen.stacked:
        return None
    return int(min(ctx.screen.main - 60, max(160, TOUCH_CELL * n_rows)))


LEGEND_CHARS = 32  # of a side's name in a legend: a long prompt or path is cut, with an ellipsis


def changes_line(specs: str) -> str:
    """A list of changes as a legend can hold it: as written when it fits, else each kind once with its count
    ("norm-identity ×12"): cut in the middle, twelve norms switched off read "norm-identity:blocks.0.ln1,norm…"."""
    if len(specs) <= LEGEND_CHARS:
        return specs
    kinds: dict[str, int] = {}
    for item in specs.split(","):
        kind = item.strip().split(":")[0].split("=")[0]
        kinds[kind] = kinds.get(kind, 0) + 1
    return ", ".join(f"{kind} ×{n}" if n > 1 else kind for kind, n in kinds.items())


@dataclass
class Pair:
    a: ViewContext
    b: ViewContext
    specs_b: str  # B's interventions ("" when B is a plain recording)
    level: C.Comparability
    align: C.Alignment | None  # minimal-pair alignment of two different prompts (None: the same prompt)
    lesson: str  # compare.LESSON_KEYS
    same_vocab: bool  # the two tokenizers spell every id alike
    by_hand: bool = False  # `align` holds pairs the visitor picked (compared even where the lengths agree)

    def t(self, key: str, **values) -> str:
        return self.a.t(key, **values)

    def legend(self, side: str) -> str:
        """"A" or "B" as a figure's legend names it: the letter and what makes that side itself (its model, its
        change, or its prompt's first words), so a figure read or saved on its own still says which line is which."""
        ctx = self.a if side == "A" else self.b
        if self.a.source != self.b.source:
            what = Path(ctx.source).name or ctx.source
        elif self.specs_b:
            what = changes_line(self.specs_b) if side == "B" else self.t("whatif.unchanged")
        else:  # the prompt's text, without its special tokens (a BOS), from where it differs from the other's
            def text(c: ViewContext) -> str:
                return "“" + c.facts.decode([i for i in c.ids if not c.facts.is_special(i)]).strip() + "”"
            other = self.b if side == "A" else self.a
            return f"{side} · " + telling_apart(text(ctx), text(other), LEGEND_CHARS)
        return f"{side} · " + legend_line(what, LEGEND_CHARS)

    @property
    def sides(self) -> tuple:
        return ((self.a.source, tuple(self.a.ids), ""), (self.b.source, tuple(self.b.ids), self.specs_b))

    def cached(self, name: str, fn, *args):
        """fn(rec_a, rec_b, *args), kept in the gateway's cache for this pair."""
        return gateway.pair_derived(name, self.sides, fn, *args)

    def cached_one(self, side: int, name: str, fn, *args):
        """fn(rec of side 0 (A) or 1 (B), *args), kept in the gateway's cache."""
        return gateway.pair_derived(name, (self.sides[side],), fn, *args)

    @property
    def pairs(self):
        """What hook_difference & co. take: None (position i with i) or the alignment."""
        return self.align if self.by_hand else None if self.level.tensors else self.align

    @property
    def positions(self) -> bool:
        """Per-position differences can be drawn: one model shape, and the same length or an alignment with pairs."""
        if self.level.tensors and not self.by_hand:
            return True
        return self.level.positions and self.align is not None and bool(self.align.pairs)

    @property
    def same_layers(self) -> bool:
        return self.a.cfg.n_layers == self.b.cfg.n_layers

    def index(self) -> tuple[np.ndarray, np.ndarray]:
        """Positions of A and of B compared with each other."""
        if self.pairs is None:
            return np.arange(len(self.a.ids)), np.arange(len(self.b.ids))
        return self.align.index()

    def diff_labels(self) -> list[str]:
        """One label per compared position: A's, or 'i:a→b' where B holds another token there."""
        ia, ib = self.index()
        out = []
        for i, j in zip(ia.tolist(), ib.tolist()):
            pa, pb = self.a.pieces[i], self.b.pieces[j]
            out.append(f"{i}:{pa}" if (pa == pb and i == j) else f"{i}:{pa}→{j}:{pb}" if i != j else f"{i}:{pa}→{pb}")
        return out

    def changed(self) -> set[int]:
        """Indices (into index()) of compared positions holding another token in B."""
        ia, ib = self.index()
        return {k for k, (i, j) in enumerate(zip(ia.tolist(), ib.tolist())) if self.a.ids[i] != self.b.ids[j]}


def map_layer(layer: int, n_from: int, n_to: int) -> int:
    """The layer of a model with n_to layers at the relative depth of `layer` of n_from layers."""
    if n_from == n_to:
        return layer
    return int(round(layer / max(n_from - 1, 1) * (n_to - 1)))


def partner(align: C.Alignment | None, token: int, n_a: int, n_b: int) -> int:
    """B's position compared with A's `token`: its aligned partner, the last for the last, else the same index."""
    if token == n_a - 1:
        return n_b - 1
    if align is not None:
        for i, j in align.pairs:
            if i == token:
                return j
    return min(token, n_b - 1)


CURVE_KEYS = {"ln1_scale": "compare.curve.ln1_scale", "ln2_scale": "compare.curve.ln2_scale",
              "attn_entropy": "compare.curve.attn_entropy", "sink_share": "compare.curve.sink_share",
              "gate_sparsity": "compare.curve.gate_sparsity", "stream_rms": "compare.curve.stream_rms"}


# --------------------------------------------------------------------------- per-view numbers
def pattern(rec, layer: int, head: int) -> np.ndarray:
    return rec.pattern(layer)[0, head].float().numpy()


def scores(rec, layer: int, head: int) -> np.ndarray:
    return rec.scores(layer)[0, head].float().numpy()


def divisors(rec, which: str = "ln1") -> np.ndarray:
    """[layer, token] divisors of norm `which` (hook_scale)."""
    return rec.stack(f"{which}.hook_scale")[:, 0, :, 0].float().numpy()


def divisor_difference(a, b, pairs, which: str = "ln1") -> np.ndarray:
    """[layer, compared position] B − A of the norm's divisor, one hook_difference per layer."""
    return np.stack([C.hook_difference(a, b, f"blocks.{l}.{which}.hook_scale", pairs)[:, 0]
                     for l in range(a.cfg.n_layers)])


def gate_closed(rec, layer: int, threshold: float = 0.01) -> np.ndarray:
    """Per token, the fraction of the FFN's gates |act| below threshold (the same rule as layer_curves)."""
    return (rec[f"blocks.{layer}.mlp.hook_act"][0].abs() < threshold).float().mean(-1).numpy()


def ffn_change(a, b, layer: int, pairs) -> np.ndarray:
    """Per compared position, ‖Δ hook_post‖ / ‖hook_post of A‖ of one FFN layer (pairs: None or an Alignment)."""
    d = C.hook_difference(a, b, f"blocks.{layer}.mlp.hook_post", pairs).astype(np.float64)
    ia = np.arange(a.n_pos) if pairs is None else pairs.index()[0]
    ref = a[f"blocks.{layer}.mlp.hook_post"][0].double().numpy()[ia]
    return np.linalg.norm(d, axis=-1) / np.maximum(np.linalg.norm(ref, axis=-1), 1e-30)


def curves(rec, attention: bool = True) -> C.LayerCurves:
    return C.layer_curves(rec, attention=attention)


# ‖Δ‖/‖x‖ below this is no change: it reads 0.00 in the caption (the tokens before the first swapped one are read
# identically by a causal model, up to float rounding)
UNCHANGED = 0.005


def most_changed(ratio: np.ndarray, k: int = 3) -> list[int]:
    """Columns (compared positions) of the change map with the largest change at any depth, largest first; only
    positions that changed at all."""
    peak = np.where(np.isnan(ratio), 0.0, ratio).max(axis=0)  # a column of no values (NaN) changed nothing
    return [int(i) for i in np.argsort(-peak, kind="stable")[:k] if peak[i] >= UNCHANGED]


def side_rows(side: str, rows) -> list:
    """CSV rows of one side: its name (A or B) first."""
    return [[side, *r] for r in rows]
