"""Multi-head attention made visible, with this model's shapes: V per KV head, each head's output z, the heads
concatenated, and W_O bringing them back to the residual stream's width.

    z_h = pattern_h · V_{h // n_rep}      [T, d_head]
    concat = [z_0 | … | z_{H−1}]           [T, H·d_head]
    attn_out = concat · W_Oᵀ               [T, d_model]  = Σ_h z_h · W_O[:, h·d_head:(h+1)·d_head]ᵀ

V, z and attn_out are the recording's own tensors (hook_v, hook_z, hook_attn_out); W_O comes from the gateway
(layer_weights), and the caption says how closely concat · W_Oᵀ reproduces the recorded output.
"""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import streamlit as st

from app import gateway, plots
from app.context import ViewContext
from app.panels.attention.cells import head_label, thinned
from explorer_model.analysis import attention_math as A

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")


def _panel(z, labels, xa, ya, name, meta, blocks: int = 0, width: int = 0) -> tuple[go.Heatmap, list[dict]]:
    """One [tokens, features] heatmap of the flow with its own symmetric colour range, and lines between the
    `blocks` heads it is made of (each `width` columns wide). The range is the 99th percentile of |value|: a few
    outlier dimensions (common in attention outputs) would otherwise wash every other cell out to white."""
    lim = float(np.percentile(np.abs(z), 99)) or float(np.abs(z).max()) or 1.0
    trace = go.Heatmap(z=z, y=labels, x=np.arange(z.shape[1]), xaxis=xa, yaxis=ya, colorscale="RdBu_r",
                       zmin=-lim, zmax=lim, showscale=False, meta=meta,
                       hovertemplate=f"%{{y}}<br>{name}[%{{x}}] = %{{z:.4f}}<extra></extra>")
    lines = [dict(type="line", xref=xa, yref=f"{ya} domain", x0=b * width - 0.5, x1=b * width - 0.5, y0=0, y1=1,
                  line=dict(color="#222", width=1)) for b in range(1, blocks)]
    return trace, lines


def draw_flow(ctx: ViewContext, parts: A.MultiHead, lo: int, hi: int) -> None:
    cols = 2 if ctx.screen.stacked else 4  # a phone: two panels a row, each wide enough for its title
    plots.show(lambda: flow_figure(ctx, parts, lo, hi, cols), ctx, key="attn_mh_flow",
               filename=f"attention_L{ctx.layer}_multihead", height=520 * (4 // cols))


def flow_figure(ctx: ViewContext, parts: A.MultiHead, lo: int, hi: int, cols: int = 4) -> go.Figure:
    """V, one head's z, the heads' concatenation and attn_out over the window, `cols` panels a row (the panel
    passes the number, so the cached figure is named by it)."""
    cfg, n = ctx.cfg, hi - lo
    g = ctx.head // cfg.n_rep
    labels = ctx.labels[lo:hi]
    v = parts.v[lo:hi].reshape(n, -1)
    titles = [ctx.t("attention.mh.v_title", kv=cfg.n_kv_heads, n=n, d=cfg.head_dim),
              ctx.t("attention.mh.z_title", head=ctx.head, g=g, n=n, d=cfg.head_dim),
              ctx.t("attention.mh.concat_title", heads=cfg.n_heads, n=n, d=cfg.head_dim),
              ctx.t("attention.mh.out_title", n=n, d=cfg.d_model)]
    rows = 4 // cols
    layout = plots.grid_layout(rows, cols, titles, hspace=0.05, vspace=0.12)
    traces, shapes = [], []
    for i, (z, meta, blocks) in enumerate(((v, "V", cfg.n_kv_heads), (parts.z[lo:hi, ctx.head], "z", 0),
                                           (parts.concat[lo:hi], "concat", cfg.n_heads),
                                           (parts.attn_out[lo:hi], "attn_out", 0))):
        xa, ya = plots.axis_ids(i // cols + 1, i % cols + 1, cols)
        tr, lines = _panel(z, labels, xa, ya, meta, meta, blocks, cfg.head_dim)
        traces.append(tr)
        shapes += lines
        layout["yaxis" + ya[1:]].update(autorange="reversed", type="category", showticklabels=i % cols == 0,
                                        tickmode="array", tickvals=thinned(labels))
        layout["xaxis" + xa[1:]].update(title=ctx.t("attention.mh.feature"))
    fig = go.Figure(traces, layout)
    fig.update_layout(shapes=shapes, meta=dict(id="attn_mh_flow", lo=lo, hi=hi),
                      title=ctx.t("attention.mh.flow_title", layer=ctx.layer), margin=dict(l=10, r=10, t=80, b=10))
    return fig


def contribution_norms(parts: A.MultiHead, w_o: np.ndarray, token: int) -> tuple[np.ndarray, float]:
    """‖z_h · W_O,hᵀ‖ of each head at `token`, and ‖attn_out‖ there."""
    norms = np.linalg.norm(A.head_contributions(parts.z[token:token + 1], w_o)[:, 0], axis=-1)  # [H]
    return norms, float(np.linalg.norm(parts.attn_out[token]))


def reconstruction(parts: A.MultiHead, w_o: np.ndarray, b_o, lo: int, hi: int) -> tuple[float, float]:
    """How far concat · W_Oᵀ (+ b_O) is from the recorded attn_out over the window, and attn_out's own size."""
    err = float(np.abs(A.project_heads(parts.concat[lo:hi], w_o, b_o) - parts.attn_out[lo:hi]).max())
    return err, float(np.abs(parts.attn_out[lo:hi]).max())


def draw_contributions(ctx: ViewContext, parts: A.MultiHead, w_o: np.ndarray) -> np.ndarray:
    """Bars: ‖z_h · W_O,hᵀ‖ for the selected token, each head's vector added to the residual stream. Kept by the
    gateway under (layer, token), which name `parts` and `w_o`."""
    norms, total = gateway.derived("attention_mh_norms", ctx.source, ctx.ids,
                                   lambda _rec, _layer, token: contribution_norms(parts, w_o, token),
                                   ctx.layer, ctx.token)
    plots.show(lambda: contributions_figure(ctx, norms, total), ctx, key="attn_mh_norms",
               filename=f"attention_L{ctx.layer}_head_norms", height=380)
    return norms


def contributions_figure(ctx: ViewContext, norms: np.ndarray, total: float) -> go.Figure:
    cfg = ctx.cfg
    heads = [head_label(ctx, h) for h in range(cfg.n_heads)]
    colours = [PALETTE[(h // cfg.n_rep) % len(PALETTE)] for h in range(cfg.n_heads)]
    fig = go.Figure(go.Bar(x=heads, y=norms, marker=dict(color=colours, line=dict(
        color=["#000" if h == ctx.head else "rgba(0,0,0,0)" for h in range(cfg.n_heads)], width=3)),
        meta="norms", hovertemplate="%{x}: %{y:.4f}<extra></extra>"))
    fig.add_hline(y=total, line_dash="dash", annotation_text=ctx.t("attention.mh.total", norm=total))
    fig.update_layout(title=ctx.t("attention.mh.contrib_title", token=ctx.labels[ctx.token]),
                      meta=dict(id="attn_mh_norms"), yaxis_title=ctx.t("attention.mh.norm_axis"),
                      xaxis_type="category", margin=dict(l=10, r=10, t=60, b=10))
    return fig


def draw(ctx: ViewContext, lo: int, hi: int) -> None:
    cfg = ctx.cfg
    st.subheader(ctx.t("attention.mh.title", layer=ctx.layer))
    parts = gateway.derived("attention_multihead", ctx.source, ctx.ids, A.multihead_parts, ctx.layer)
    weights = gateway.layer_weights(ctx.source, ctx.layer)
    w_o, b_o = weights["W_O"], weights.get("b_O")
    n = len(ctx.ids)
    st.markdown(ctx.t("attention.mh.shapes", n=n, kv=cfg.n_kv_heads, d=cfg.head_dim, heads=cfg.n_heads,
                      hd=cfg.n_heads * cfg.head_dim, dm=cfg.d_model))
    draw_flow(ctx, parts, lo, hi)
    err, scale = gateway.derived("attention_mh_check", ctx.source, ctx.ids,  # (layer, window) name parts and W_O
                                 lambda _rec, _layer, lo_, hi_: reconstruction(parts, w_o, b_o, lo_, hi_),
                                 ctx.layer, lo, hi)
    st.caption(ctx.t("attention.mh.check", err=err, scale=scale))
    draw_contributions(ctx, parts, w_o)
    with plots.explainer(ctx, ctx.t("attention.mh.explain_title")):
        st.markdown(ctx.t("attention.mh.explain", n_rep=cfg.n_rep, d=cfg.head_dim, heads=cfg.n_heads))
        st.latex(r"z_h=\mathrm{softmax}\!\Big(\frac{q_h K_{\lfloor h/n_{rep}\rfloor}^\top}{\sqrt{d_{head}}}+M\Big)"
                 r"V_{\lfloor h/n_{rep}\rfloor},\qquad \mathrm{attn\_out}=[z_0|\dots|z_{H-1}]\,W_O^\top"
                 r"=\sum_h z_h\,W_{O,h}^\top")
