"""SwiGLU view: a gate keeps, weakens, closes or partly keeps. For the selected token and layer,
every FFN neuron is put into one of four kinds by its recorded gate value g = SiLU(W_gate·n) (hook_act), with
the thresholds of explorer_model.analysis.ffn (GATE_BOUNDS on |g|), and the neurons with the most at stake
(largest |up|) shown as examples of each kind."""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import streamlit as st

from app import gateway, plots
from app.context import ViewContext, plain
from explorer_model.analysis import ffn as F

COLOURS = {"close": "#9d9d9d", "weaken": "#72b7b2", "partly keep": "#f58518", "keep": "#e45756"}


def kind_name(t, kind: str) -> str:
    return {"close": t("swiglu.kind_close"), "weaken": t("swiglu.kind_weaken"),
            "partly keep": t("swiglu.kind_partly"), "keep": t("swiglu.kind_keep")}[kind]


def gates_figure(gk: F.GateKinds, t) -> go.Figure:
    """Every neuron as a point (gate g, candidate u), coloured by kind; the bands are the thresholds on |g|."""
    fig = go.Figure()
    for i, kind in enumerate(gk.kinds):
        idx = np.flatnonzero(gk.kind == i)
        fig.add_trace(go.Scattergl(
            x=gk.gate[idx], y=gk.up[idx], mode="markers", meta=kind, customdata=idx,
            name=f"{kind_name(t, kind)} ({idx.size})", marker=dict(size=5, color=COLOURS[kind], opacity=0.7),
            hovertemplate=t("swiglu.gate_hover") + "<extra>%{fullData.name}</extra>"))
    for b in gk.bounds:
        for x in (-b, b):
            if x > -0.3:  # SiLU never goes below −0.279: no band there
                fig.add_vline(x=x, line_dash="dot", line_color="#bbbbbb")
    fig.update_layout(title=t("swiglu.gates_title", layer=gk.layer), xaxis_title=t("swiglu.gate_g"),
                      yaxis_title=t("swiglu.up_u"), height=420, margin=dict(l=10, r=10, t=50, b=10),
                      legend=dict(orientation="h", y=-0.2), meta={"id": "swiglu_gate_kinds"})
    return fig


def examples_table(gk: F.GateKinds, t) -> dict:
    rows = [(kind_name(t, k), e) for k in gk.kinds for e in gk.examples[k]]
    return {t("swiglu.kind"): [k for k, _ in rows], t("swiglu.neuron"): [e["neuron"] for _, e in rows],
            "g": [e["gate"] for _, e in rows], "u": [e["up"] for _, e in rows],
            "g·u": [e["product"] for _, e in rows]}


def draw(ctx: ViewContext) -> None:
    t = ctx.t
    gk = gateway.derived("swiglu_gate_kinds", ctx.source, ctx.ids, F.gate_kinds, ctx.layer, ctx.token, 3)
    st.subheader(t("swiglu.gates_heading", token=plain(ctx.labels[ctx.token]), layer=ctx.layer))
    lo, mid, hi = gk.bounds
    c1, c2 = st.columns([3, 2])
    with c1:
        plots.show(lambda: gates_figure(gk, t), ctx, key="swiglu_gates_fig", filename=f"gate_kinds_L{ctx.layer}_tok{ctx.token}",
                   share=0.6)
    with c2:
        st.markdown(t("swiglu.gates_rule", lo=lo, mid=mid, hi=hi))
        counts = " · ".join(f"{kind_name(t, k)} **{gk.counts[k]}**" for k in gk.kinds)
        st.markdown(counts)
        plots.table(ctx, examples_table(gk, t), key="swiglu_gate_examples")
    st.caption(t("swiglu.gates_caption", n=gk.gate.size, amplified=gk.amplified, flipped=gk.flipped))
