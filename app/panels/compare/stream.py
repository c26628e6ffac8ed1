"""Compare mode's hooks for the RMSNorm, residual, What-if and norm-lab views: the residual stream's size per layer
of both sides on a relative-depth axis (Pre-Norm grows, Post-Norm is held by its norms), the norms' divisors,
the next-token distributions side by side with their distance, and the minimal-pairs change map."""
from __future__ import annotations

import numpy as np
import streamlit as st

from app import plots
from app.context import display_piece, plain
from app.panels.compare import figs as F
from app.panels.generation import candidate_label
from app.panels.compare.common import CURVE_KEYS, Pair, curves, stacked_row, divisor_difference, divisors, most_changed, side_rows
from explorer_model.analysis import compare as C


STREAM_KEYS = {"stream_rms": ("compare.stream_rms_title", "compare.stream_rms_axis"),
               "stream_norm": ("compare.stream_norm_title", "compare.stream_norm_axis")}


def _csv(pair: Pair, view: str, header, rows, suffix: str = "") -> None:
    plots.csv_button(pair.a, pair.t("compare.csv"), lambda: plots.to_csv(["side", *header], rows),
                     f"compare_{view}{suffix}.csv", key=f"compare_csv_{view}{suffix}")


def pair_curves(pair: Pair) -> tuple[C.LayerCurves, C.LayerCurves]:
    return pair.cached_one(0, "curves", curves), pair.cached_one(1, "curves", curves)


def draw_curve_panels(pair: Pair, fields, fig_id: str) -> None:
    """A and B's per-layer curves (LayerCurves fields), one panel each, on relative depth."""
    ca, cb = pair_curves(pair)
    panels = [(pair.t(CURVE_KEYS[f]), [("A", pair.legend("A"), ca.depth, getattr(ca, f)),
                                        ("B", pair.legend("B"), cb.depth, getattr(cb, f))])
              for f in fields]
    plots.show(lambda: F.curves_grid(fig_id, panels, x_title=pair.t("compare.depth"), cols=len(fields), height=330),
               pair.a, key=fig_id)


# --------------------------------------------------------------------------- the residual stream per layer
def prepost_values(ca: C.LayerCurves, cb: C.LayerCurves) -> dict | None:
    """The numbers of the Pre vs Post sentence, when one side is Pre-Norm and the other Post-Norm."""
    sides = {c.norm_placement: (name, c) for name, c in (("A", ca), ("B", cb))}
    if set(sides) != {"pre", "post"}:
        return None
    (pre, cp), (post, cq) = sides["pre"], sides["post"]
    after = cq.stream_rms[1:]  # after every block (k = 0 is the embeddings, which no norm has touched)
    return {"pre": pre, "pre_first": float(cp.stream_rms[0]), "pre_last": float(cp.stream_rms[-1]), "post": post,
            "post_min": float(after.min()), "post_max": float(after.max())}


def draw_stream(pair: Pair, field: str, fig_id: str) -> None:
    """Residual RMS (field "stream_rms") or norm ("stream_norm") after k blocks, A and B on k / n_layers; the
    Pre vs Post sentence under it when the pair is one of each."""
    ca, cb = pair_curves(pair)
    t = pair.t
    placed = ca.norm_placement != cb.norm_placement  # each side named by where its norm sits only when they differ
    series = [(side, t("compare.stream_side", side=pair.legend(side), kind=c.norm_placement.capitalize()) if placed
               else pair.legend(side),
               c.stream_depth, getattr(c, field)) for side, c in (("A", ca), ("B", cb))]
    title, x_title, y_title = t(STREAM_KEYS[field][0]), t("compare.stream_depth"), t(STREAM_KEYS[field][1])
    plots.show(lambda: F.curves_figure(fig_id, series, title=title, x_title=x_title, y_title=y_title, log_y=True),
               pair.a, key=fig_id)
    values = prepost_values(ca, cb)
    if values is not None:
        st.info(t("compare.prepost", **values))
    rows = side_rows("A", [[float(d), float(v)] for d, v in zip(ca.stream_depth, getattr(ca, field))])
    rows += side_rows("B", [[float(d), float(v)] for d, v in zip(cb.stream_depth, getattr(cb, field))])
    _csv(pair, fig_id.removeprefix("compare_"), ["blocks_passed_fraction", field], rows, "")


# --------------------------------------------------------------------------- RMSNorm
def draw_norm(pair: Pair) -> None:
    a, b, t = pair.a, pair.b, pair.t
    draw_stream(pair, "stream_rms", "compare_norm_stream")
    da, db = divisors(a.rec), divisors(b.rec)
    ya, yb = [f"L{l}" for l in range(da.shape[0])], [f"L{l}" for l in range(db.shape[0])]
    diff = None
    if pair.positions and pair.same_layers:
        d = pair.cached("diff:ln1", divisor_difference, pair.pairs)
        diff = (t("compare.diff_title"), d, pair.diff_labels(), ya)
    panels = [("A", t("compare.divisors_title", side="A"), da, a.labels, ya),
              ("B", t("compare.divisors_title", side="B"), db, b.labels, yb)]
    row = stacked_row(a, len(ya))  # outside the build: a built figure is kept by what its function closes over
    plots.show(lambda: F.pair_heatmaps("compare_norm", panels, diff, stacked_row=row), a, key="compare_norm")
    draw_curve_panels(pair, ("ln1_scale", "ln2_scale"), "compare_norm_curves")
    rows = []
    for side, ctx, m in (("A", a, da), ("B", b, db)):
        rows += side_rows(side, [[l, i, float(m[l, i])] for l in range(m.shape[0]) for i in range(m.shape[1])])
    _csv(pair, "norm", ["layer", "position", "ln1_divisor"], rows)


# --------------------------------------------------------------------------- next token
def next_token(a, b, same_vocab: bool, piece_a, piece_b, pos_a: int, pos_b: int) -> dict:
    return C.compare_next_token(a, b, same_tokenizer=same_vocab, piece_a=piece_a, piece_b=piece_b,
                                pos_a=pos_a, pos_b=pos_b, k=10)


def candidate_labels(pair: Pair, texts) -> list[str]:
    """Each candidate's text as a person reads it (generation.candidate_label: a piece of a character shows the
    character it completes), through an id that spells it among A's (else B's) most likely tokens."""
    spelled = []
    for ctx in (pair.a, pair.b):
        top = ctx.rec.logits[0, ctx.token].topk(min(64, ctx.cfg.vocab_size)).indices.tolist()
        spelled.append((ctx, {ctx.facts.piece(int(i)): int(i) for i in reversed(top)}))  # the likeliest id wins
    out = []
    for text in texts:
        hit = next(((ctx, ids[text]) for ctx, ids in spelled if text in ids), None)
        label = display_piece(text) if hit is None else candidate_label(hit[0].facts, hit[0].ids[:hit[0].token + 1], hit[1])
        out.append(label if label not in out else f"{label} ({len(out)})")  # categories must stay distinct
    return out


def draw_next_token(pair: Pair) -> dict:
    a, b, t = pair.a, pair.b, pair.t
    res = pair.cached("next", next_token, pair.same_vocab, a.facts.piece, b.facts.piece, a.token, b.token)
    rows = res["top_k"]["rows"]
    labels = candidate_labels(pair, [r["text"] for r in rows])
    bars = [("A", pair.legend("A"), [r["p_a"] for r in rows]), ("B", pair.legend("B"), [r["p_b"] for r in rows])]
    title = t("compare.next_title", token_a=a.token, piece_a=a.pieces[a.token], token_b=b.token,
              piece_b=b.pieces[b.token])
    y_title = t("compare.probability")
    plots.show(lambda: F.bars_figure("compare_next", labels, bars, title=title, y_title=y_title, rows=True), a,
               key="compare_next")
    d = res["distances"]
    if d is not None:
        c = st.columns(4)
        c[0].metric(t("compare.js_metric"), f"{d['js']:.4f}")
        c[1].metric(t("compare.kl_ab"), f"{d['kl_ab']:.4f}")
        c[2].metric(t("compare.kl_ba"), f"{d['kl_ba']:.4f}")
        c[3].metric(t("compare.tv"), f"{d['tv']:.4f}")
    else:
        st.caption(t("compare.no_shared_vocab"))
    csv_rows = [[side, r["text"], r[f"p_{side.lower()}"], r[f"rank_{side.lower()}"] or ""] for r in rows for side in "AB"]
    _csv(pair, "next", ["text", "probability", "rank"], csv_rows)
    return res


# --------------------------------------------------------------------------- minimal pairs
def draw_change_map(pair: Pair) -> None:
    if not pair.positions:
        st.caption(pair.t("compare.no_positions"))
        return
    t = pair.t
    res = pair.cached("change_map", C.resid_change_map, pair.pairs)
    labels = pair.diff_labels()
    top = most_changed(res["ratio"])
    ratio, depth = res["ratio"], res["depth"]
    # two prompts lined up word by word (a minimal pair), or one prompt run twice (two models, a change in B)
    title = t("compare.map_title" if pair.align is not None else "compare.map_title_same")
    x_title, y_title = t("compare.position"), t("compare.blocks_passed")
    plots.show(lambda: F.change_map_figure("compare_change_map", ratio, depth, labels, top, title=title,
                                           x_title=x_title, y_title=y_title), pair.a, key="compare_change_map")
    peak = np.nanmax(res["ratio"], axis=0)
    st.caption(t("compare.map_caption", positions=", ".join(f"{plain(labels[i])} ({peak[i]:.2f})" for i in top))
               if top else t("compare.map_unchanged"))
    rows = [["B-A", k, labels[i], float(res["ratio"][k, i])] for k in range(res["ratio"].shape[0])
            for i in range(len(labels))]
    _csv(pair, "change_map", ["blocks_passed", "position", "ratio"], rows)


def draw_residual(pair: Pair) -> None:
    draw_stream(pair, "stream_norm", "compare_residual_stream")
    draw_change_map(pair)


def draw_predict(pair: Pair) -> None:
    draw_next_token(pair)


# --------------------------------------------------------------------------- What-if and the norm lab
def head_js(a, b, pairs) -> np.ndarray:
    """[layer, head] Jensen–Shannon divergence of the attention rows, mean over compared queries."""
    return C.attention_js(a, b, pairs)["js"].mean(-1)


def draw_whatif(pair: Pair) -> None:
    t = pair.t
    draw_next_token(pair)
    if pair.positions and pair.same_layers:
        js = pair.cached("head_js", head_js, pair.pairs)
        title, x_title, y_title = t("compare.heads_title"), t("compare.head"), t("compare.layer")
        plots.show(lambda: plots.heatmap(
            js, [str(h) for h in range(js.shape[1])], [f"L{l}" for l in range(js.shape[0])], title=title,
            colorscale="Reds", zmin=0, x_title=x_title, y_title=y_title, value_name="JS (nats)",
        ).update_layout(meta={"id": "compare_heads"}), pair.a, key="compare_heads")
        rows = [["B-A", l, h, float(js[l, h])] for l in range(js.shape[0]) for h in range(js.shape[1])]
        _csv(pair, "heads", ["layer", "head", "js_nats"], rows)


def draw_normlab(pair: Pair) -> None:
    draw_stream(pair, "stream_rms", "compare_normlab_stream")
    draw_curve_panels(pair, ("ln1_scale", "ln2_scale"), "compare_normlab_curves")
