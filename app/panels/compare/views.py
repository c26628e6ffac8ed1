"""Compare mode's hooks for the token, attention, RoPE, SwiGLU and block views: each draws A and B side by side,
B − A where `comparable` allows it (same model shape; same length, or aligned positions of a minimal pair), and
per-layer curves on relative depth where the shapes differ. app/compare.py calls HOOKS[view](pair)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from app import plots
from app.panels.compare import figs as F
from app.panels.compare import stream as S
from app.panels.attention.cells import WINDOW_DEFAULT, window
from app.panels.compare.common import CURVE_KEYS, Pair, curves, stacked_row, ffn_change, gate_closed, pattern, scores, side_rows
from explorer_model.analysis import compare as C
from explorer_model import interventions as I


def _csv(pair: Pair, view: str, header, rows) -> None:
    label = pair.t("compare.csv")
    plots.csv_button(pair.a, label, lambda: plots.to_csv(["side", *header], rows), f"compare_{view}.csv",
                     key=f"compare_csv_{view}")


# --------------------------------------------------------------------------- tokens
def token_tables(pair: Pair) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Each side's tokens; a position whose token has no equal partner on the other side is marked."""
    changed_a = set(pair.align.changed_a) if pair.align is not None else set()
    changed_b = set(pair.align.changed_b) if pair.align is not None else set()
    t = pair.t
    out = []
    for ctx, changed in ((pair.a, changed_a), (pair.b, changed_b)):
        out.append(pd.DataFrame({t("compare.col_position"): range(len(ctx.ids)), t("compare.col_piece"): ctx.pieces,
                                 t("compare.col_id"): [int(i) for i in ctx.ids],
                                 t("compare.col_changed"): ["●" if i in changed else "" for i in range(len(ctx.ids))]}))
    return out[0], out[1]


def draw_tokens(pair: Pair) -> None:
    ta, tb = token_tables(pair)
    left, right = st.columns(2)
    left.markdown(pair.t("compare.side_a", n=len(pair.a.ids)))
    with left:
        plots.table(pair.a, ta, key="compare_tokens_a")
    right.markdown(pair.t("compare.side_b", n=len(pair.b.ids)))
    with right:
        plots.table(pair.a, tb, key="compare_tokens_b")
    if pair.align is not None:
        st.caption(pair.t("compare.alignment", prefix=pair.align.prefix, suffix=pair.align.suffix,
                          pairs=len(pair.align.pairs), changed_a=len(pair.align.changed_a),
                          changed_b=len(pair.align.changed_b)))
    rows = [["A", i, p, int(x)] for i, (p, x) in enumerate(zip(pair.a.pieces, pair.a.ids))]
    rows += [["B", i, p, int(x)] for i, (p, x) in enumerate(zip(pair.b.pieces, pair.b.ids))]
    _csv(pair, "tokens", ["position", "piece", "id"], rows)


# --------------------------------------------------------------------------- attention and RoPE (scores)
def matrices(pair: Pair, kind: str) -> dict:
    """The selected head's pattern (kind "pattern") or scores ("scores") of A and B, blanked above the diagonal,
    and B − A on the compared positions where positions compare (hook_difference; aligned sub-matrix)."""
    get = pattern if kind == "pattern" else scores
    a, b = pair.a, pair.b
    za, zb = plots.blank_future(get(a.rec, a.layer, a.head)), plots.blank_future(get(b.rec, b.layer, b.head))
    out = {"a": za, "b": zb, "diff": None}
    if pair.positions and (a.layer, a.head) == (b.layer, b.head):
        name = f"blocks.{a.layer}.attn.hook_{'pattern' if kind == 'pattern' else 'attn_scores'}"
        d = pair.cached(f"diff:{name}", C.hook_difference, name, pair.pairs)[a.head]
        out["diff"] = plots.blank_future(d)
    return out


def _cut(z, labels, token: int):
    """The WINDOW_DEFAULT tokens either side of `token` (as the Attention view shows a long prompt)."""
    lo, hi = window(len(labels), token, WINDOW_DEFAULT)
    return z[lo:hi, lo:hi], list(labels)[lo:hi], (lo, hi)


def _matrix_figure(pair: Pair, kind: str, fig_id: str):
    m, a, b, t = matrices(pair, kind), pair.a, pair.b, pair.t
    (za, la, wa), (zb, lb, _) = _cut(m["a"], a.labels, a.token), _cut(m["b"], b.labels, b.token)
    panels = [("A", t("compare.head_title", side="A", layer=a.layer, head=a.head), za, la, la),
              ("B", t("compare.head_title", side="B", layer=b.layer, head=b.head), zb, lb, lb)]
    diff = None
    if m["diff"] is not None:
        ia = pair.index()[0]
        k = int(np.argmin(np.abs(ia - a.token)))  # the compared position nearest A's token
        zd, ld, _ = _cut(m["diff"], pair.diff_labels(), k)
        diff = (t("compare.diff_title"), zd, ld, ld)
    if wa[1] - wa[0] < len(a.ids):
        st.caption(t("compare.window", half=WINDOW_DEFAULT, n=len(a.ids)))
    row = stacked_row(pair.a, len(la))  # outside the build: a built figure is kept by what its function closes over
    plots.show(lambda: F.pair_heatmaps(fig_id, panels, diff, zmin=0.0 if kind == "pattern" else None,
                                       zmax=1.0 if kind == "pattern" else None,
                                       colorscale="Blues" if kind == "pattern" else "Viridis",
                                       stacked_row=row), pair.a, key=fig_id)
    return m


def row_js(pair: Pair) -> np.ndarray:
    """Jensen–Shannon divergence (nats) between A's and B's attention rows of the selected head."""
    js = pair.cached("js", C.attention_js, pair.pairs, (pair.a.layer,))
    return js["js"][0, pair.a.head]


def draw_attention(pair: Pair) -> None:
    a, t = pair.a, pair.t
    m = _matrix_figure(pair, "pattern", "compare_attention")
    rows = []
    for side, ctx, z in (("A", pair.a, m["a"]), ("B", pair.b, m["b"])):
        rows += side_rows(side, [[ctx.layer, ctx.head, q, k, z[q, k]] for q in range(z.shape[0])
                                 for k in range(q + 1)])
    if m["diff"] is not None:
        js = row_js(pair)
        # orange marks the positions holding another token: said only where there are some (not for the twins)
        gap = "" if a.lang == "zh" else " "  # between two sentences
        st.caption(gap.join([t("compare.js_caption")] + [t("compare.js_caption_changed")] * bool(pair.changed())))
        plots.show(lambda: F.bars_figure("compare_attention_js", pair.diff_labels(), [("js", t("compare.js_name"), js)],
                                 title=t("compare.js_title", layer=a.layer, head=a.head), y_title="nats",
                                 highlight=sorted(pair.changed())), a, key="compare_attention_js")
    S.draw_curve_panels(pair, ("attn_entropy", "sink_share"), "compare_attention_curves")  # every layer, any shapes
    _csv(pair, "attention", ["layer", "head", "query", "key", "weight"], rows)


# a Post-Norm side's first attention reads its embeddings unnormalised: below this RMS (a norm gives 1) its q·k are
# a tenth or less of a normalised input's, and its map looks flat; the page says why
RAW_EMBED_RMS = 0.3


def raw_first_layer(pair: Pair) -> list[tuple[str, float]]:
    """(side, its embeddings' RMS) of each Post-Norm side shown at layer 0 whose embeddings are small."""
    out = []
    for side, ctx, c in zip("AB", (pair.a, pair.b), S.pair_curves(pair)):
        if c.norm_placement == "post" and ctx.layer == 0 and c.stream_rms[0] < RAW_EMBED_RMS:
            out.append((side, float(c.stream_rms[0])))
    return out


def draw_rope(pair: Pair) -> None:
    no_rope = any(iv.kind == "no-rope" for iv in I.parse_list(pair.specs_b)) if pair.specs_b else False
    gap = "" if pair.a.lang == "zh" else " "  # between two sentences
    st.caption(gap.join([pair.t("compare.rope_caption")] + [pair.t("compare.rope_caption_no_rope")] * no_rope +
                        [pair.t("compare.rope_raw_embeddings", side=side, rms=rms)
                         for side, rms in raw_first_layer(pair)]))
    m = _matrix_figure(pair, "scores", "compare_rope")
    rows = []
    for side, ctx, z in (("A", pair.a, m["a"]), ("B", pair.b, m["b"])):
        rows += side_rows(side, [[ctx.layer, ctx.head, q, k, z[q, k]] for q in range(z.shape[0])
                                 for k in range(q + 1)])
    _csv(pair, "rope", ["layer", "head", "query", "key", "score"], rows)


# --------------------------------------------------------------------------- SwiGLU
def draw_swiglu(pair: Pair) -> None:
    a, b, t = pair.a, pair.b, pair.t
    ca, cb = gate_closed(a.rec, a.layer), gate_closed(b.rec, b.layer)
    series = [("A", t("compare.side_name", side=pair.legend("A"), layer=a.layer), np.arange(len(ca)), ca),
              ("B", t("compare.side_name", side=pair.legend("B"), layer=b.layer), np.arange(len(cb)), cb)]
    title, x_title, y_title = t("compare.gates_title"), t("compare.position"), t("compare.closed_share")
    plots.show(lambda: F.curves_figure("compare_swiglu", series, title=title, x_title=x_title, y_title=y_title), a,
               key="compare_swiglu")
    if pair.positions and a.layer == b.layer:
        change = pair.cached(f"ffn:{a.layer}", ffn_change, a.layer, pair.pairs)
        plots.show(lambda: F.bars_figure("compare_swiglu_change", pair.diff_labels(), [("B-A", t("compare.ffn_change_name"), change)],
                                 title=t("compare.ffn_change_title", layer=a.layer), y_title="‖Δ‖ / ‖A‖",
                                 highlight=sorted(pair.changed())), a, key="compare_swiglu_change")
    S.draw_curve_panels(pair, ("gate_sparsity",), "compare_swiglu_curves")
    rows = side_rows("A", [[a.layer, i, v] for i, v in enumerate(ca)]) + side_rows("B", [[b.layer, i, v] for i, v in enumerate(cb)])
    _csv(pair, "swiglu", ["layer", "position", "closed_share"], rows)


# --------------------------------------------------------------------------- the block: every per-layer curve
CURVE_FIELDS = ("ln1_scale", "ln2_scale", "attn_entropy", "sink_share", "gate_sparsity", "stream_rms")


def draw_block(pair: Pair) -> None:
    t = pair.t
    ca, cb = pair.cached_one(0, "curves", curves), pair.cached_one(1, "curves", curves)
    panels = []
    for f in CURVE_FIELDS:
        xa, xb = (ca.stream_depth, cb.stream_depth) if f.startswith("stream") else (ca.depth, cb.depth)
        panels.append((t(CURVE_KEYS[f]), [("A", pair.legend("A"), xa, getattr(ca, f)),
                                          ("B", pair.legend("B"), xb, getattr(cb, f))]))
    st.caption(t("compare.block_caption"))
    cols = 2 if pair.a.screen.stacked else 3  # a phone: two to a row, each wide enough for its title
    plots.show(lambda: F.curves_grid("compare_block", panels, x_title=t("compare.depth"), cols=cols,
                                     height=260 * -(-len(panels) // cols)), pair.a, key="compare_block")
    rows = []
    for side, c in (("A", ca), ("B", cb)):
        for f in CURVE_FIELDS:
            x = c.stream_depth if f.startswith("stream") else c.depth
            rows += side_rows(side, [[f, float(d), float(v)] for d, v in zip(x, getattr(c, f))])
    _csv(pair, "block", ["curve", "depth", "value"], rows)


HOOKS = {"tokens": draw_tokens, "attention": draw_attention, "norm": S.draw_norm, "rope": draw_rope,
         "swiglu": draw_swiglu, "residual": S.draw_residual,
         "predict": S.draw_predict, "block": draw_block, "whatif": S.draw_whatif,
         "normlab": S.draw_normlab}
