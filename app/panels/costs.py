"""Part of the Tokens & shapes view: what attention and the KV cache cost as the prompt grows, from the
configurations alone (explorer_model.analysis.costs): attention memory and FLOPs growing with T² for this model
and LLaMA-1 7B, and the KV cache of multi-head attention (LLaMA-1 7B) against grouped-query attention (this
model, Llama-2 70B).
"""
from __future__ import annotations

from functools import partial

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from app import plots
from app.context import ViewContext
from explorer_model import families
from explorer_model.analysis import costs

REFERENCE = "LLaMA-1 7B"  # the tutorial's model
KV_MODELS = ("LLaMA-1 7B", "Llama-2 70B")  # MHA and GQA at full size
SCORE_BYTES = 4  # scores and patterns are computed in float32 whatever the weights are
KV_BYTES = 2  # a 16-bit cache, as generation keeps it
CONTEXT = 4096  # the cache size quoted for a long context
COLOURS = ("#2563eb", "#dc2626", "#059669")


def lengths(T: int) -> list[int]:
    """Prompt lengths drawn: powers of two from 16 to 8192, and the current prompt's length."""
    return sorted({2 ** k for k in range(4, 14)} | {int(T)})


def cost_data(configs: dict, T: int) -> dict:
    return {name: costs.attention_costs(cfg, lengths(T), SCORE_BYTES) for name, cfg in configs.items()}


def cost_figure(data: dict, key: str, title: str, y_title: str, T: int, dashed: str | None = None) -> go.Figure:
    """One line per configuration of data[name][key] over T (log-log), the current T marked."""
    fig = go.Figure()
    for colour, (name, d) in zip(COLOURS, data.items()):
        fig.add_scatter(x=d["T"], y=d[key], mode="lines+markers", name=name, meta=name, line=dict(color=colour),
                        hovertemplate=f"{name}<br>T = %{{x}}: %{{y:.3s}}<extra></extra>")
        if dashed:
            fig.add_scatter(x=d["T"], y=d[dashed], mode="lines", name=f"{name} · {dashed}", meta=f"{name}:{dashed}",
                            line=dict(color=colour, dash="dash"), showlegend=False,
                            hovertemplate=f"{name}<br>T = %{{x}}: %{{y:.3s}}<extra></extra>")
    fig.add_vline(x=T, line=dict(color="#6b7280", dash="dot"))
    fig.update_layout(title=title, xaxis_title="T", yaxis_title=y_title, height=360, margin=dict(l=70, r=10, t=50, b=10),
                      legend=dict(orientation="h", y=-0.25))
    fig.update_xaxes(type="log", dtick=np.log10(2) * 2, tickformat="d", minor=dict(showgrid=False))
    fig.update_yaxes(type="log", dtick=1, exponentformat="SI", minor=dict(showgrid=False))
    return fig


def kv_figure(rows: list[dict], t) -> go.Figure:
    names = [r["name"] for r in rows]
    fig = go.Figure([go.Bar(x=names, y=[r["bytes_per_token"] / 1024 for r in rows], name=t("tokens.costs.kv_actual"),
                            meta="actual", marker_color="#059669", text=[r["kind"] for r in rows],
                            textposition="outside"),
                     go.Bar(x=names, y=[r["mha_bytes_per_token"] / 1024 for r in rows], name=t("tokens.costs.kv_mha"),
                            meta="mha", marker_color="#9ca3af")])
    fig.update_layout(title=t("tokens.costs.kv_fig_title", bytes=KV_BYTES), yaxis_title="KiB", barmode="group",
                      height=360, margin=dict(l=70, r=10, t=50, b=10), legend=dict(orientation="h", y=-0.2))
    fig.update_yaxes(type="log", dtick=1, minor=dict(showgrid=False))
    fig.update_xaxes(type="category")
    return fig


def kv_frame(rows: list[dict], T: int, t) -> pd.DataFrame:
    return pd.DataFrame([{t("tokens.costs.col_model"): r["name"], "H": r["n_heads"], "H_kv": r["n_kv_heads"],
                          t("tokens.costs.col_kind"): r["kind"], t("tokens.costs.col_per_token"): r["bytes_per_token"],
                          t("tokens.costs.col_mha"): r["mha_bytes_per_token"],
                          t("tokens.costs.col_saving"): f"{r['saving']:g}×",
                          t("tokens.costs.col_prompt", T=T): r["bytes_per_token"] * T,
                          t("tokens.costs.col_context", n=CONTEXT): f"{r['bytes'] / 2**30:.2f} GiB"} for r in rows])


def draw(ctx: ViewContext) -> None:
    t, T = ctx.t, len(ctx.ids)
    st.subheader(t("tokens.costs.title"))
    this = t("tokens.family.this")
    data = cost_data({this: ctx.cfg, REFERENCE: families.FAMILIES[REFERENCE]}, T)
    left, right = st.columns(2)
    with left:
        plots.show(lambda: cost_figure(data, "score_bytes_per_layer", t("tokens.costs.mem_title", bytes=SCORE_BYTES),
                               t("tokens.costs.mem_y"), T), ctx, key="tokens_costs_mem", filename="attention_memory",
                   share=0.5)
    with right:
        plots.show(lambda: cost_figure(data, "attention_flops", t("tokens.costs.flops_title"), "FLOPs", T,
                               dashed="matmul_flops"), ctx, key="tokens_costs_flops", filename="attention_flops",
                   share=0.5)
    cross = {name: costs.crossover_length(cfg) for name, cfg in ((this, ctx.cfg), (REFERENCE, families.FAMILIES[REFERENCE]))}
    st.caption(t("tokens.costs.caption", this=this, T=T, share=100 * float(data[this]["attention_share"][lengths(T).index(T)]),
                 cross_this=cross[this], ref=REFERENCE, cross_ref=cross[REFERENCE]))
    with plots.explainer(ctx, t("tokens.costs.more")):
        st.markdown(t("tokens.costs.explain"))
        st.latex(t("tokens.costs.latex", bytes=SCORE_BYTES))

    rows = costs.kv_cache_table({this: ctx.cfg, **{n: families.FAMILIES[n] for n in KV_MODELS}}, CONTEXT, KV_BYTES)
    left, right = st.columns([3, 2])
    with left:
        plots.show(lambda: kv_figure(rows, t), ctx, key="tokens_costs_kv", filename="kv_cache_per_token", share=0.6)
    frame = partial(kv_frame, rows, T, t)
    with right:
        st.markdown(t("tokens.costs.kv_explain"))
    # under the chart and its words, as wide as the page: in the column beside the chart (a laptop with the sidebar
    # open, a tablet) the formula ran past the column's edge, its end out of sight
    st.latex(t("tokens.costs.kv_latex", bytes=KV_BYTES))
    plots.table(ctx, frame, key="tokens_costs_kv_table")
    plots.csv_button(ctx, t("tokens.csv.kv"), t("tokens.csv.kv"), lambda: frame().to_csv(index=False),
                     "kv_cache.csv", "tokens_csv_kv")
