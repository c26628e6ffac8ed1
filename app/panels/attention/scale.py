"""Why the scores are divided by √d_k, measured on this model's recorded (rotated) Q and K.

If q and k had d_k independent unit-variance components, Var(q·k) = d_k: the raw dot products spread like √d_k and
softmax of such large numbers is nearly one-hot (its entropy collapses). The figure shows, per layer, the spread of
the raw q·k beside √d_k and after the division, and the mean attention entropy (nats) with and without the scale
(explorer_model.analysis.attention_math.scale_study); the table repeats the textbook argument on random vectors.
"""
from __future__ import annotations

from functools import partial

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from app import gateway, plots
from app.context import ViewContext
from explorer_model.analysis import attention_math as A

MAX_QUERIES = 64  # the last 64 query rows of a long prompt (with every key they see): cost ∝ 64·T per layer


def study(rec, max_queries: int) -> A.ScaleStudy:
    return A.scale_study(rec, max_queries=max_queries)


def random_frame(d_k: int, t) -> pd.DataFrame:
    r = A.textbook_table(d_k)
    return pd.DataFrame({t("attention.scale.col.d_k"): r["d_k"], t("attention.scale.col.std"): r["std"],
                         t("attention.scale.col.theory"): r["theory"], t("attention.scale.col.std_scaled"): r["std_scaled"],
                         t("attention.scale.col.ent_unscaled"): r["entropy_unscaled"],
                         t("attention.scale.col.ent_scaled"): r["entropy_scaled"]}).round(3)


def draw_study(ctx: ViewContext, s: A.ScaleStudy) -> None:
    plots.show(partial(study_figure, ctx.t, s), ctx, key="attn_scale", filename="attention_sqrt_dk", height=460)


def study_figure(t, s: A.ScaleStudy) -> go.Figure:
    layers = np.array(s.layers)
    layer_t = t("attention.axis.layer")
    layout = plots.grid_layout(1, 2, [t("attention.scale.spread_title", d_k=s.d_k),
                                      t("attention.scale.entropy_title")], hspace=0.1)
    raw, scaled = t("attention.scale.raw"), t("attention.scale.scaled")
    ent_s, ent_u = s.entropy_scaled.mean(-1), s.entropy_unscaled.mean(-1)
    traces = [
        go.Scatter(x=layers, y=s.raw_std, name=raw, meta="raw_std", mode="lines+markers"),
        go.Scatter(x=layers, y=s.scaled_std, name=scaled, meta="scaled_std", mode="lines+markers"),
        go.Scatter(x=layers, y=np.full(layers.size, np.sqrt(s.d_k)), meta="sqrt_dk", mode="lines",
                   name=t("attention.scale.sqrt_dk", d_k=s.d_k, root=float(np.sqrt(s.d_k))),
                   line=dict(dash="dash", color="#555")),
        go.Scatter(x=layers, y=ent_s, name=t("attention.scale.ent_scaled"), meta="entropy_scaled",
                   mode="lines+markers", xaxis="x2", yaxis="y2"),
        go.Scatter(x=layers, y=ent_u, name=t("attention.scale.ent_unscaled"), meta="entropy_unscaled",
                   mode="lines+markers", xaxis="x2", yaxis="y2"),
        go.Scatter(x=layers, y=np.full(layers.size, s.uniform_entropy), name=t("attention.scale.uniform"),
                   meta="uniform", mode="lines", line=dict(dash="dot", color="#555"), xaxis="x2", yaxis="y2"),
    ]
    for trace in traces:
        trace.hovertemplate = f"{layer_t} %{{x}}: %{{y:.3f}}<extra>{trace.name}</extra>"
    fig = go.Figure(traces, layout)
    fig.update_layout(xaxis=dict(title=layer_t), xaxis2=dict(title=layer_t),
                      yaxis=dict(title=t("attention.scale.std_axis"), rangemode="tozero"),
                      yaxis2=dict(title=t("attention.entropy_nats"), rangemode="tozero"),
                      meta=dict(id="attn_scale", queries=s.queries), legend=dict(orientation="h", y=-0.2),
                      margin=dict(l=10, r=10, t=60, b=10))
    return fig


def draw(ctx: ViewContext) -> None:
    if not plots.titled(ctx, ctx.t("attention.scale.title"), ctx.t("attention.scale.one_token")):
        return
    n = len(ctx.ids)
    s = gateway.derived("attention_scale", ctx.source, ctx.ids, study, MAX_QUERIES)
    draw_study(ctx, s)
    worst = int(np.argmin(s.entropy_unscaled.mean(-1)))
    st.caption(ctx.t("attention.scale.caption", layer=s.layers[worst],
                     scaled=float(s.entropy_scaled.mean(-1)[worst]), unscaled=float(s.entropy_unscaled.mean(-1)[worst]),
                     w_scaled=float(s.max_weight_scaled.mean(-1)[worst]),
                     w_unscaled=float(s.max_weight_unscaled.mean(-1)[worst])))
    if s.queries < n - 1:
        st.caption(ctx.t("attention.scale.window", queries=s.queries, n=n))
    with plots.explainer(ctx, ctx.t("attention.scale.explain_title")):
        st.markdown(ctx.t("attention.scale.explain"))
        st.latex(r"q\cdot k=\sum_{i=1}^{d_k} q_i k_i,\qquad q_i,k_i\sim\mathcal{N}(0,1)\ \Rightarrow\ "
                 r"\mathrm{Var}(q\cdot k)=d_k,\qquad \mathrm{std}\Big(\frac{q\cdot k}{\sqrt{d_k}}\Big)=1")
        r = A.textbook_table(ctx.cfg.head_dim)
        st.caption(ctx.t("attention.scale.table_caption", keys=A.RANDOM_KEYS, max_entropy=r["max_entropy"]))
        plots.table(ctx, partial(random_frame, ctx.cfg.head_dim, ctx.t), key="attn_scale_table")
