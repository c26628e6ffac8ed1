"""Which heads link these two tokens? A query token and a key token, and their attention weight in every head.

    link(q, k)[layer, head] = pattern[layer][head, q, k]            (explorer_model.analysis.lesson.head_link_map)

The pair is picked by clicking a cell of the main heatmap or with two number inputs; a click on the layers × heads
map (or the button under it) jumps the selection to that layer and head, with the query token selected, and the page
to that head's pattern. The selection's sliders are created before this view runs, so the jump is done in a widget
callback, which Streamlit runs before the next script run.
"""
from __future__ import annotations

import numpy as np
import streamlit as st

from app import choice_state, gateway, plots, sections
from app.context import ViewContext, plain
from app.layer_range import layer_range, per_layer
from app.panels.attention.cells import click_overlay, clickable, clicked_cell, csv_cells, head_label
from explorer_model.analysis import lesson

Q_KEY, K_KEY, FOR_KEY = "attn_link_q", "attn_link_k", "attn_link_for"


def init_pair(ctx: ViewContext) -> None:
    """The pair's default (query = the selected token, key = what the selected head reads most from it apart from
    the first token); a chosen pair (a click, the link's) is kept while the prompt stays, inside the prompt."""
    n, q = len(ctx.ids), ctx.token
    ss = st.session_state
    if ss.get(FOR_KEY) not in (None, tuple(ctx.ids)):  # another prompt: its own default pair
        ss.pop(Q_KEY, None)
        ss.pop(K_KEY, None)
    ss[FOR_KEY] = tuple(ctx.ids)
    choice_state.start(Q_KEY, q, hi=n - 1)
    # the default is needed at every run (a link leaves out a value equal to it): computed once per selection
    strongest = gateway.derived("attn_link_strongest", ctx.source, ctx.ids, strongest_key, ctx.layer, ctx.head, q)
    choice_state.start(K_KEY, strongest, hi=n - 1)


def strongest_key(rec, layer: int, head: int, q: int) -> int:
    """The key query q of this head reads most from, apart from the first token (0 for the first query)."""
    row = rec.pattern(layer)[0, head, q, : q + 1].double().numpy()
    return int(np.argmax(row[1:]) + 1) if q >= 1 else 0


def pair() -> tuple[int, int] | None:
    q, k = st.session_state.get(Q_KEY), st.session_state.get(K_KEY)
    return None if q is None or k is None else (int(q), int(k))


def pick_pair_callback(chart_key: str, shown):
    """on_select of the main heatmap: the clicked cell (row and column of the figure, which shows the positions
    `shown`) becomes the pair."""
    def pick() -> None:
        cell = clicked_cell(st.session_state.get(chart_key))
        if cell is not None and max(cell) < len(shown):
            st.session_state[Q_KEY], st.session_state[K_KEY] = shown[cell[0]], shown[cell[1]]
    return pick


def jump(layer: int, head: int, token: int) -> None:
    """Select a layer, head and token (run as a callback, before their sliders exist), and land on that head's
    pattern at the top of the view."""
    st.session_state.layer, st.session_state.head, st.session_state.token = int(layer), int(head), int(token)
    sections.request("attention", "head")


def _jump_from_map(chart_key: str, token: int, first_layer: int = 0):
    def go() -> None:
        cell = clicked_cell(st.session_state.get(chart_key))
        if cell is not None:
            jump(cell[0] + first_layer, cell[1], token)
    return go


def _link_row(rec, layer: int, q: int, k: int) -> np.ndarray:
    """One layer's row of the map (per_layer computes and caches the map a layer at a time)."""
    return lesson.head_link_map(rec, q, k, layers=[layer])[0]


def map_figure(ctx: ViewContext, m: np.ndarray, heads: list[str], layers: list[str], q: int, k: int,
               first_layer: int):
    """The layers × heads map of the pair's weight, every cell clickable (a click jumps to that layer and head)."""
    value = ctx.t("attention.value.pattern")
    fig = plots.heatmap(m, heads, layers, colorscale="Blues", zmin=0, zmax=1, value_name=value,
                        title=ctx.t("attention.link.map_title", q=ctx.labels[q], k=ctx.labels[k]),
                        x_title=ctx.t("attention.axis.head"), y_title=ctx.t("attention.axis.layer"))
    rows, cols = np.indices(m.shape).reshape(2, -1)
    text = [f"{layers[r]}, {heads[c]}<br>{value}: {m[r, c]:.4f}" for r, c in zip(rows, cols)]
    fig.add_trace(click_overlay(rows, cols, heads, layers, text, selected=(ctx.layer - first_layer, ctx.head)))
    fig.data[0].hoverinfo = "skip"
    fig.update_layout(meta=dict(id="attn_link", q=q, k=k))
    return clickable(fig)


def draw(ctx: ViewContext) -> None:
    if not plots.titled(ctx, ctx.t("attention.link.title"), ctx.t("attention.link.one_token")):
        return
    n = len(ctx.ids)
    c1, c2 = st.columns(2)
    q = int(c1.number_input(ctx.t("attention.link.query"), 0, n - 1, step=1, key=Q_KEY))
    k = int(c2.number_input(ctx.t("attention.link.key"), 0, n - 1, step=1, key=K_KEY))
    st.caption(ctx.t("attention.link.how"))
    if k > q:
        st.info(ctx.t("attention.link.future", q=plain(ctx.labels[q]), k=plain(ctx.labels[k])))
        return
    shown = layer_range(ctx, "big_link_layers")  # a deep model: the layers chosen, filled one at a time
    m = np.stack(per_layer(ctx, "attention_link", _link_row, shown, q, k))
    best = lesson.strongest(m)
    best["layer"] += shown.start
    heads = [head_label(ctx, h) for h in range(ctx.cfg.n_heads)]
    layers = [ctx.t("attention.layer_label", layer=layer) for layer in shown]
    first = shown.start
    plots.show(lambda: map_figure(ctx, m, heads, layers, q, k, first), ctx, key="attn_link_map",
               filename=f"attention_link_q{q}_k{k}", height=640,
               on_select=_jump_from_map("attn_link_map", q, first), selection_mode="points")
    st.caption(ctx.t("attention.link.strongest", layer=best["layer"], head=head_label(ctx, best["head"]),
                     weight=best["weight"], q=plain(ctx.labels[q]), k=plain(ctx.labels[k])))
    c1, c2 = st.columns([2, 3])
    c1.button(ctx.t("attention.link.go", layer=best["layer"], head=best["head"]), key="attn_link_go",
              on_click=jump, args=(best["layer"], best["head"], q))
    with c2:
        label = ctx.t("attention.csv.link")
        plots.csv_button(ctx, label, label, lambda: plots.matrix_csv(csv_cells(m), layers, heads, "layer\\head"),
                         f"attention_link_q{q}_k{k}.csv", key="attn_csv_link")
