"""RoPE view, second part: the original Transformer's sinusoidal position vectors, added to the embedding, beside
RoPE, which turns only Q and K. Data from explorer_model/analysis/encodings.py on this prompt's
recording; W_v (to show what an added position vector does to V) comes from the gateway."""
from __future__ import annotations

from functools import partial

import numpy as np
import plotly.graph_objects as go
import streamlit as st

from app import gateway, plots, sections
from app.context import ViewContext
from app.plots import axis_ids, grid_layout
from explorer_model.analysis import encodings as E

MAX_DIMS = 128  # the heatmap shows the first (fastest) dimensions; the slow ones barely change over a prompt


def _meta(fig: go.Figure, fig_id: str) -> go.Figure:
    fig.update_layout(meta={"id": fig_id})  # lets tests find a figure without relying on page order
    return fig


def absolute_data(rec, w_v: np.ndarray) -> dict:
    """The sinusoidal encoding of this prompt next to its embeddings, and the part of a first-layer V it would add."""
    enc = E.encoding_vs_embedding(rec)
    x = rec["hook_embed"][0].double().numpy()
    return {**enc, **E.absolute_in_v(x, enc["pe"], w_v)}


def absolute_for(rec, source: str) -> dict:
    """absolute_data with the first layer's W_v of the model that made the recording."""
    return absolute_data(rec, gateway.layer_weights(source, 0)["W_v"])


def pe_figure(pe: np.ndarray, labels, t) -> go.Figure:
    d = min(pe.shape[1], MAX_DIMS)
    fig = plots.heatmap(pe[:, :d], [str(i) for i in range(d)], labels, colorscale="RdBu_r", zmid=0.0, zmin=-1, zmax=1,
                        title=t("rope.pe_title", d=d, d_model=pe.shape[1]), x_title=t("rope.dimension"),
                        y_title=t("rope.position"), value_name="PE", fmt=".4f")
    fig.update_layout(height=min(700, max(300, 14 * pe.shape[0] + 140)))
    return _meta(fig, "rope_pe")


def compare_figure(data: dict, foot: dict, labels, layer: int, t) -> go.Figure:
    """Left: how big PE is next to each token's embedding and how much of V it would make; right: what RoPE changes."""
    titles = [t("rope.cmp_left"), t("rope.cmp_right", layer=layer)]
    layout = grid_layout(1, 2, titles, hspace=0.1)
    x = list(labels)
    bar = lambda y, name, meta, colour, ax: dict(  # noqa: E731
        type="bar", x=x, y=y, name=name, meta=meta, marker_color=colour, xaxis=ax[0], yaxis=ax[1],
        hovertemplate="%{x}: %{y:.4g}<extra>" + name + "</extra>")
    left, right = axis_ids(1, 1, 2), axis_ids(1, 2, 2)
    traces = [
        bar(data["embed_norm"], t("rope.embed_norm"), "embed_norm", "#9d9d9d", left),
        bar(data["pe_norm"], t("rope.pe_norm"), "pe_norm", "#f58518", left),
        bar(np.linalg.norm(data["v_position"], axis=-1), t("rope.v_position"), "v_position", "#e45756", left),
        bar(foot["q_change"], t("rope.q_change"), "q_change", "#4c78a8", right),
        bar(foot["k_change"], t("rope.k_change"), "k_change", "#72b7b2", right),
        bar(np.zeros(len(x)), t("rope.v_change"), "v_change", "#54a24b", right),
    ]
    for ax in (left, right):
        layout["xaxis" + ax[0][1:]].update(type="category", tickangle=-45)
    layout["yaxis"].update(title=t("rope.length"))
    layout["yaxis2"].update(title=t("rope.relative_change"))
    layout.update(barmode="group", height=420, margin=dict(l=10, r=10, t=60, b=10),
                  title=t("rope.cmp_title"), legend=dict(orientation="h", y=-0.35))
    return _meta(go.Figure(data=traces, layout=layout), "rope_vs_absolute")


def _to_whatif() -> None:
    """Open the What-if view with RoPE removed, at its results; its text box is filled from "whatif" when it is
    drawn anew."""
    st.session_state["whatif"] = "no-rope"
    st.session_state.pop("whatif_specs", None)
    st.session_state["view"] = "whatif"
    sections.request("whatif", "results")


def draw(ctx: ViewContext) -> None:
    t = ctx.t
    st.subheader(t("rope.abs_heading"))
    data = gateway.derived("rope_absolute", ctx.source, ctx.ids, absolute_for, ctx.source)  # once per recording
    foot = gateway.derived("rope_footprint", ctx.source, ctx.ids, E.rope_footprint, ctx.layer)
    with plots.explainer(ctx, t("rope.abs_explain")):
        st.markdown(t("rope.abs_intro"))
        st.latex(r"PE_{pos,2i}=\sin\frac{pos}{10000^{2i/d}},\quad PE_{pos,2i+1}=\cos\frac{pos}{10000^{2i/d}},\quad"
                 r" x'_{pos}=E[\text{token}]+PE_{pos}")
        st.latex(r"V=W_v\,(x+PE)=W_v\,x+W_v\,PE\qquad\text{vs. RoPE:}\quad q'=R_m q,\;k'=R_n k,\;V=W_v\,x")
    plots.show(partial(pe_figure, data["pe"], ctx.labels, t), ctx, key="rope_pe_fig", filename="sinusoidal_encoding")
    plots.show(partial(compare_figure, data, foot, ctx.labels, ctx.layer, t), ctx, key="rope_vs_abs_fig",
               filename="rope_vs_absolute")
    st.caption(t("rope.abs_caption", pe_norm=float(data["pe_norm"][0]), d=data["pe"].shape[1],
                 e_lo=float(data["embed_norm"].min()), e_hi=float(data["embed_norm"].max()),
                 ratio=float(np.median(data["ratio"])), cos=float(np.median(data["cosine"])),
                 v_rel=float(np.median(data["relative_change"])), layer=ctx.layer,
                 q_max=float(foot["q_change"].max()), k_max=float(foot["k_change"].max()),
                 z_err=foot["v_z_error"]))
    st.button(t("rope.to_whatif"), key="rope_to_whatif", on_click=_to_whatif)
