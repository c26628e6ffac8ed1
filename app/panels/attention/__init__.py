"""Attention: who each token reads from, per layer and head.

scores = Q K^T / sqrt(d_head) with the future masked to -inf, pattern = softmax(scores). Masked cells are
drawn blank: they are not small numbers, they do not exist for that query. Long prompts are shown through a
window of tokens around the selected one. The sections below the main figure live in their own modules:
attention_links (which heads link two tokens), attention_heads (V, z, concatenation, W_O) and attention_scale
(why divide by √d_k).
"""
from __future__ import annotations

import html

import numpy as np
import plotly.graph_objects as go
import streamlit as st

from app import choice_state, gateway, plots, token_window
from app.context import ViewContext, plain
from app.panels.attention import heads as attention_heads
from app.panels.attention import links as attention_links
from app.panels.attention import scale as attention_scale
from app.layer_range import layer_range, per_layer
from app.sections import section
from app.panels.attention.cells import (WINDOW_DEFAULT, click_overlay, clickable, csv_cells, head_label,
                                        layer_matrices, thinned)
from explorer_model import view_choices as VC
from explorer_model.analysis.attention_math import attention_entropy
from explorer_model.analysis.lesson import sink_share

KINDS, WINDOW_CHOICES = VC.values("attn_kind"), VC.values("attn_window")
HEAD_SHARE = 0.6  # the main heatmap's column: three fifths of the page, the controls beside it


def overview(rec, layer: int) -> tuple[np.ndarray, np.ndarray]:
    """Per head of one layer: mean entropy of the query rows (nats) and mean attention to position 0, both
    without query 0 (it can only read itself). One layer at a time: a deep model's grid fills under a bar."""
    return attention_entropy(rec.pattern(layer)[0].double().numpy()), sink_share(rec, layers=[layer])[0]


# --------------------------------------------------------------------------- sections
def draw_explanation(ctx: ViewContext) -> None:
    cfg = ctx.cfg
    with plots.explainer(ctx, ctx.t("attention.explain.title")):
        st.markdown(ctx.t("attention.explain.body"))
        st.latex(r"\mathrm{scores}=\frac{QK^\top}{\sqrt{d_{head}}}+M,\quad "
                 r"M_{ij}=\begin{cases}0 & j\le i\\ -\infty & j>i\end{cases}")
        st.latex(r"\mathrm{pattern}=\mathrm{softmax}(\mathrm{scores}),\qquad z=\mathrm{pattern}\,V")
        st.caption(ctx.t("attention.explain.gqa", n_heads=cfg.n_heads, n_kv=cfg.n_kv_heads, n_rep=cfg.n_rep,
                         d_head=cfg.head_dim))


def window_sink_share(pattern: np.ndarray, lo: int, hi: int) -> float:
    """Mean attention the queries lo…hi-1 of one head's [q_pos, k_pos] pattern put on key 0."""
    return float(np.mean(pattern[lo:hi, 0]))


def gap_lines(shown: list[int]) -> list[dict]:
    """White bars across a heatmap over the positions `shown` wherever positions are left out between two
    neighbours, so a kept-apart token is not read as the next one."""
    last = len(shown) - 0.5
    return [line for i in range(len(shown) - 1) if shown[i + 1] - shown[i] > 1
            for line in (dict(type="line", x0=i + 0.5, x1=i + 0.5, y0=-0.5, y1=last),
                         dict(type="line", x0=-0.5, x1=last, y0=i + 0.5, y1=i + 0.5))]


def draw_head(ctx: ViewContext, mats: np.ndarray, kind: str, lo: int, hi: int, pinned: int | None = None) -> None:
    m = mats[ctx.head]
    keep = tuple(token_window.shown(lo, hi, pinned))
    sub, labels = m[np.ix_(keep, keep)], [ctx.labels[i] for i in keep]
    name = ctx.t("attention.value.pattern" if kind == "pattern" else "attention.value.scores")
    q_title, k_title = ctx.t("attention.axis.query"), ctx.t("attention.axis.key")
    pair = attention_links.pair()

    def figure() -> go.Figure:
        fig = plots.heatmap(
            sub, labels, labels, colorscale="Blues" if kind == "pattern" else "RdBu_r",
            zmin=0 if kind == "pattern" else None, zmax=1 if kind == "pattern" else None,
            zmid=None if kind == "pattern" else 0.0,
            title=ctx.t("attention.head.title", layer=ctx.layer, head=head_label(ctx, ctx.head), value=name),
            x_title=k_title, y_title=q_title, value_name=name)
        # Clicking a visible (not masked) cell picks the query/key pair of "Which heads link these two tokens?".
        qs, ks = np.tril_indices(len(keep))  # the positions are in order: the causal triangle stays a triangle
        text = [f"{q_title}: {labels[q]}<br>{k_title}: {labels[k]}<br>{name}: {sub[q, k]:.4f}"
                for q, k in zip(qs, ks)]
        fig.add_trace(click_overlay(qs, ks, labels, labels, text,
                                    selected=None if pair is None or not {*pair} <= {*keep}
                                    else (keep.index(pair[0]), keep.index(pair[1]))))
        fig.data[0].hoverinfo = "skip"  # the overlay's markers carry the hover text
        for line in gap_lines(list(keep)):
            fig.add_shape(line, line=dict(color="white", width=4), layer="above")
        fig.update_layout(meta=dict(id="attn_head", lo=lo, hi=hi, shown=list(keep)))
        return clickable(fig)
    plots.show(figure, ctx, key="attn_head", filename=f"attention_L{ctx.layer}_H{ctx.head}_{kind}",
               share=HEAD_SHARE, on_select=attention_links.pick_pair_callback("attn_head", keep),
               selection_mode="points")
    token_window.controls(ctx, "attn_head", len(ctx.ids), lo, hi, pinned)
    if keep[0] > 0 and kind == "pattern":  # the window leaves out position 0, often the strongest column (the sink)
        st.caption(ctx.t("attention.window.sink", first=lo, last=hi - 1, piece=plain(ctx.pieces[0]),
                         share=f"{window_sink_share(m, lo, hi):.0%}"))
    label = ctx.t("attention.csv.head")
    plots.csv_button(ctx, label, label,
                     lambda: plots.matrix_csv(csv_cells(m), ctx.labels, ctx.labels, "query\\key"),
                     f"attention_L{ctx.layer}_H{ctx.head}_{kind}.csv", key="attn_csv_head")


def draw_query_text(ctx: ViewContext, pattern: np.ndarray) -> None:
    """The selected query token's attention row as highlighted text (pattern: [head, q, k], future NaN)."""
    row = np.nan_to_num(pattern[ctx.head, ctx.token])
    top = row.max() if row.size else 1.0
    masked = ctx.t("attention.query.masked")
    spans = []
    for i, piece in enumerate(ctx.pieces):
        if i > ctx.token:
            style = "color:#999;border:1px dashed #ccc"  # the future: masked, not read at all
            tip = masked
        else:
            alpha = 0.08 + 0.92 * row[i] / top if top > 0 else 0
            style = f"background:rgba(220,80,30,{alpha:.3f})"
            tip = f"{row[i]:.4f}"
        if i == ctx.token:
            style += ";outline:2px solid #1f4e9c"
        spans.append(f'<span title="{html.escape(tip)}" style="{style};padding:2px 3px;margin:1px;'
                     f'border-radius:4px;display:inline-block;font-family:monospace">{html.escape(piece)}</span>')
    st.markdown(ctx.t("attention.query.reads", token=ctx.token, piece=plain(ctx.pieces[ctx.token])))
    st.markdown("".join(spans), unsafe_allow_html=True)
    order = np.argsort(-row[: ctx.token + 1])[:3]
    st.caption(ctx.t("attention.query.top", keys=", ".join(f"{plain(ctx.labels[i])} ({row[i]:.3f})" for i in order)))


def draw_head_grid(ctx: ViewContext, mats: np.ndarray, kind: str, keep: tuple[int, ...]) -> None:
    cfg = ctx.cfg
    # Columns are KV groups, so heads that share K and V stand in one column.
    n_cols, n_rows = cfg.n_kv_heads, cfg.n_rep
    if n_cols > 8:  # many KV heads (no GQA): fall back to a compact square grid
        n_cols = int(np.ceil(np.sqrt(cfg.n_heads)))
        n_rows = int(np.ceil(cfg.n_heads / n_cols))
    slots = {h: divmod(h, cfg.n_rep)[::-1] if n_cols == cfg.n_kv_heads else divmod(h, n_cols)
             for h in range(cfg.n_heads)}
    titles = [""] * (n_rows * n_cols)
    for h, (r, c) in slots.items():
        titles[r * n_cols + c] = head_label(ctx, h)

    def figure() -> go.Figure:
        layout = plots.grid_layout(n_rows, n_cols, titles, hspace=0.06, vspace=0.08)
        labels = [ctx.labels[i] for i in keep]
        ticks = thinned(labels)
        q_title, k_title = ctx.t("attention.axis.query"), ctx.t("attention.axis.key")
        traces = []
        for h, (r, c) in slots.items():
            xa, ya = plots.axis_ids(r + 1, c + 1, n_cols)
            traces.append(go.Heatmap(z=mats[h][np.ix_(keep, keep)], x=labels, y=labels,
                                     coloraxis="coloraxis", hoverongaps=False, xaxis=xa, yaxis=ya, meta=h,
                                     hovertemplate=f"{q_title}: %{{y}}<br>{k_title}: %{{x}}<br>%{{z:.4f}}"
                                                   f"<extra>{head_label(ctx, h)}</extra>"))
            # Token labels on the outer axes only, every k-th one: at 49 tokens a small multiple has room for ~16.
            layout["yaxis" + ya[1:]].update(autorange="reversed", type="category", tickmode="array", tickvals=ticks,
                                            showticklabels=c == 0)
            layout["xaxis" + xa[1:]].update(type="category", tickmode="array", tickvals=ticks,
                                            showticklabels=r == n_rows - 1, tickangle=-90)
        fig = go.Figure(traces, layout)
        fig.update_layout(coloraxis=dict(colorscale="Blues" if kind == "pattern" else "RdBu_r",
                                         cmin=0 if kind == "pattern" else None, cmax=1 if kind == "pattern" else None),
                          title=ctx.t("attention.grid.title", layer=ctx.layer), meta=dict(id="attn_grid"),
                          margin=dict(l=90, r=10, t=70, b=90))  # room for the outer axes' token labels
        return fig
    side = min(300, max(120, (ctx.screen.main - 200) / n_cols))  # px of one small multiple: about square
    plots.show(figure, ctx, key="attn_grid", filename=f"attention_L{ctx.layer}_all_heads",
               height=int(side * n_rows + 160))


def draw_overview(ctx: ViewContext) -> None:
    if not plots.titled(ctx, ctx.t("attention.overview.title"), ctx.t("attention.overview.one_token")):
        return
    shown = layer_range(ctx, "big_overview_layers")
    cells = per_layer(ctx, "attention_overview", overview, shown)
    entropy, sink = np.stack([c[0] for c in cells]), np.stack([c[1] for c in cells])
    heads = [head_label(ctx, h) for h in range(ctx.cfg.n_heads)]
    layers = [ctx.t("attention.layer_label", layer=layer) for layer in shown]
    head_t, layer_t = ctx.t("attention.axis.head"), ctx.t("attention.axis.layer")
    t = ctx.t  # the figures are named by the language, not by the whole context (app/gateway/figures.py)
    c1, c2 = st.columns(2)
    with c1:
        plots.show(lambda: plots.heatmap(
            entropy, heads, layers, colorscale="Viridis", value_name=t("attention.entropy_nats"),
            title=t("attention.overview.entropy"), x_title=head_t, y_title=layer_t,
        ).update_layout(meta=dict(id="attn_entropy")), ctx, key="attn_entropy", filename="attention_entropy", share=0.5)
    with c2:
        plots.show(lambda: plots.heatmap(
            sink, heads, layers, colorscale="Reds", zmin=0, zmax=1, value_name=t("attention.overview.sink_value"),
            title=t("attention.overview.sink"), x_title=head_t, y_title=layer_t,
        ).update_layout(meta=dict(id="attn_sink")), ctx, key="attn_sink", filename="attention_sink", share=0.5)
    st.caption(ctx.t("attention.overview.caption"))
    rows = [(layer, h, h // ctx.cfg.n_rep, entropy[i, h], sink[i, h])
            for i, layer in enumerate(shown) for h in range(ctx.cfg.n_heads)]
    label = ctx.t("attention.csv.overview")
    plots.csv_button(ctx, label, label,
                     lambda: plots.to_csv(["layer", "head", "kv_head", "entropy_nats", "attention_to_first"], rows),
                     "attention_overview.csv", key="attn_csv_overview")


def head_window(ctx: ViewContext, half: int) -> tuple[int, int, int | None]:
    """The tokens of the main heatmap: `half` either side of the selected one, and on a touch screen no more than
    a finger can tap in its column (token_window); with them the key the selected token is paired with (the one it
    reads most, a lesson's key, or a clicked cell's): a row whose strongest key is out of view would look empty while
    the caption quotes its weight. ([lo, hi), the key kept apart or None.)"""
    size = 2 * int(half) + 1
    fit = token_window.fitting(ctx, ctx.labels, share=HEAD_SHARE)
    pair = attention_links.pair()
    if pair is not None and pair[0] == ctx.token:
        key = pair[1]
    else:  # the pair is about another query (chosen before this token was): the one this token reads most
        key = gateway.derived("attn_link_strongest", ctx.source, ctx.ids, attention_links.strongest_key, ctx.layer,
                              ctx.head, ctx.token)
    return token_window.span_keeping("attn_head", len(ctx.ids), min(size, fit or size), ctx.token, key)


def draw(ctx: ViewContext) -> None:
    st.subheader(ctx.t("attention.title"))
    attention_links.init_pair(ctx)  # before the main figure, which marks the pair and sets it on a click
    with section("attention", "head"):
        left, right = st.columns([3, 2])
        with right:  # the controls stand beside the figure, so the figure starts right under the title
            choice_state.start("attn_kind")
            choice_state.start("attn_window")
            kind = st.radio(ctx.t("attention.show"), KINDS, horizontal=True, key="attn_kind",
                            format_func=lambda k: ctx.t("attention.show.pattern" if k == "pattern"
                                                        else "attention.show.scores"))
            half = st.select_slider(ctx.t("attention.window.label", token=ctx.token), WINDOW_CHOICES,
                                    key="attn_window", help=ctx.t("attention.window.help"))
            fit = token_window.fitting(ctx, ctx.labels, share=HEAD_SHARE)
            if fit is not None and fit < min(2 * half + 1, len(ctx.ids)):  # a touch screen holds fewer than asked
                st.caption(ctx.t("attention.window.fits", n=fit))
            pattern = layer_matrices(ctx, ctx.layer, "pattern")
            draw_query_text(ctx, pattern)
        mats = pattern if kind == "pattern" else layer_matrices(ctx, ctx.layer, "scores")
        lo, hi, pinned = head_window(ctx, half)
        with left:
            draw_head(ctx, mats, kind, lo, hi, pinned)
    draw_explanation(ctx)
    with section("attention", "grid"):
        draw_head_grid(ctx, mats, kind, tuple(token_window.shown(lo, hi, pinned)))
    with section("attention", "link"):
        attention_links.draw(ctx)
    with section("attention", "heads"):
        attention_heads.draw(ctx, lo, hi)
    with section("attention", "scale"):
        attention_scale.draw(ctx)
    with section("attention", "overview"):
        draw_overview(ctx)
