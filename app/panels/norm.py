"""RMSNorm view: the divisor of every token before every norm, one token's vector through the norm,
the learned gains γ, and the same vector through LayerNorm for comparison.

All numbers come from the recording (hook_scale, hook_normalized, the residual stream) and γ from the
weights; nothing here runs the model.
"""
from __future__ import annotations

from functools import partial

import numpy as np
import plotly.graph_objects as go
import streamlit as st

from app import choice_state, plots, token_window
from app.context import ARCH_NAMES, ViewContext, plain
from app.plots import axis_ids, grid_layout
from app.sections import section
from explorer_model import view_choices as VC

N_OUTLIERS = 5
NORMS = VC.values("norm_which")


# --------------------------------------------------------------------------- data
def divisor_matrix(rec, which: str) -> np.ndarray:
    """[layer, token] divisors sqrt(mean x² + ε) of norm `which` ("ln1" | "ln2")."""
    return rec.stack(f"{which}.hook_scale")[:, 0, :, 0].float().numpy()


def final_divisors(rec) -> np.ndarray | None:
    """The final norm's divisor per token; None for post-norm models, which have no final norm."""
    if "ln_final.hook_scale" not in rec:
        return None
    return rec["ln_final.hook_scale"][0, :, 0].float().numpy()


def norm_input(rec, cfg, layer: int, which: str) -> np.ndarray:
    """What the norm receives. Pre-norm: the residual stream itself; post-norm: the residual plus the sublayer output."""
    b = f"blocks.{layer}"
    if cfg.norm_placement == "pre":
        x = rec[f"{b}.hook_resid_pre" if which == "ln1" else f"{b}.hook_resid_mid"]
    elif which == "ln1":
        x = rec[f"{b}.hook_resid_pre"] + rec[f"{b}.hook_attn_out"]
    else:
        x = rec[f"{b}.hook_resid_mid"] + rec[f"{b}.hook_mlp_out"]
    return x[0].float().numpy()


def norm_vectors(rec, cfg, gamma: np.ndarray, layer: int, token: int, which: str) -> dict[str, np.ndarray | float]:
    """x before the norm, x / scale, and (x / scale) · γ for one token, plus γ (of that norm) and the recorded divisor."""
    x = norm_input(rec, cfg, layer, which)[token]
    normalized = rec[f"blocks.{layer}.{which}.hook_normalized"][0, token].float().numpy()
    scale = float(rec[f"blocks.{layer}.{which}.hook_scale"][0, token, 0])
    return {"x": x, "normalized": normalized, "out": normalized * gamma, "gamma": gamma, "scale": scale}


def rms(v: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.asarray(v, dtype=np.float64) ** 2)))


def outlier_dims(x: np.ndarray, k: int = N_OUTLIERS) -> np.ndarray:
    return np.argsort(-np.abs(x))[:k]


def layernorm_compare(x: np.ndarray, eps: float) -> dict[str, np.ndarray | float]:
    """Plain LayerNorm (x − μ)/sqrt(σ² + ε) and plain RMSNorm x/sqrt(mean x² + ε), both without γ/β."""
    x = np.asarray(x, dtype=np.float64)
    mu, var = float(x.mean()), float(x.var())
    ln = (x - mu) / np.sqrt(var + eps)
    rn = x / np.sqrt(np.mean(x**2) + eps)
    return {"mean": mu, "std": float(np.sqrt(var)), "rms": rms(x), "ln": ln, "rms_norm": rn, "diff": ln - rn}


# --------------------------------------------------------------------------- figures
def _meta(fig: go.Figure, fig_id: str) -> go.Figure:
    fig.update_layout(meta={"id": fig_id})  # lets tests find a figure without relying on page order
    return fig


def divisor_figure(z: np.ndarray, labels, t, which_name: str, lo: int = 0, hi: int | None = None) -> go.Figure:
    """[layer, token] divisors of the tokens lo…hi-1 (all by default), coloured on the whole prompt's scale."""
    hi = z.shape[1] if hi is None else hi
    fig = plots.heatmap(z[:, lo:hi], x=list(labels)[lo:hi], y=[f"L{i}" for i in range(z.shape[0])],
                        title=t("norm.divisor_title", norm=which_name),
                        x_title=t("norm.token"), y_title=t("norm.layer"), value_name=t("norm.divisor"), fmt=".5g")
    if z.shape[1] > 1:  # position 0 is usually a huge "sink"; cap the colours so the other tokens stay readable
        fig.update_traces(zmin=float(z.min()), zmax=float(z[:, 1:].max()),
                          colorbar=dict(title=t("norm.capped"), title_side="right"))
    return _meta(fig, "norm_divisors")


def final_figure(d: np.ndarray, labels, t) -> go.Figure:
    fig = go.Figure(go.Bar(x=list(labels), y=d, marker_color="#4c78a8",
                           hovertemplate="%{x}<br>" + t("norm.divisor") + ": %{y:.5g}<extra></extra>"))
    fig.update_layout(title=t("norm.final_title"), xaxis_title=t("norm.token"), yaxis_title=t("norm.divisor"),
                      height=300, margin=dict(l=10, r=10, t=40, b=10))
    fig.update_xaxes(type="category")
    return _meta(fig, "norm_final")


def vectors_figure(v: dict, t) -> go.Figure:
    rows = [("x", t("norm.before")), ("normalized", t("norm.divided")), ("out", t("norm.after_gamma"))]
    layout = grid_layout(3, 1, [f"{name}   (RMS {rms(v[k]):.4g})" for k, name in rows], vspace=0.08, share_x=True)
    dims = np.arange(len(v["x"]))
    top = outlier_dims(v["x"])
    traces = []
    for r, (k, name) in enumerate(rows, start=1):
        xa, ya = axis_ids(r, 1, 1)
        traces.append(dict(type="bar", x=dims, y=v[k], name=name, marker_color="#4c78a8", showlegend=False, meta=k,
                           xaxis=xa, yaxis=ya, hovertemplate=t("norm.dim") + " %{x}: %{y:.5g}<extra></extra>"))
        traces.append(dict(type="scatter", x=top, y=v[k][top], mode="markers+text", text=[str(d) for d in top],
                           textposition=["top center" if y >= 0 else "bottom center" for y in v[k][top]],
                           cliponaxis=False, marker=dict(color="#e45756", size=9), xaxis=xa, yaxis=ya,
                           name=t("norm.largest_x"), showlegend=r == 1, meta=f"{k}_outliers",
                           hovertemplate=t("norm.outlier_dim") + " %{x}: %{y:.5g}<extra></extra>"))
        # room above and below the bars for the largest ones' labels (they stood on the row's title)
        lo, hi = min(float(v[k].min()), 0.0), max(float(v[k].max()), 0.0)
        room = 0.2 * (hi - lo or 1.0)
        layout["yaxis" + ya[1:]]["range"] = [lo - room * (lo < 0), hi + room * (hi > 0)]
    layout["xaxis3"]["title"] = t("norm.dim_axis")
    layout.update(height=620, bargap=0, margin=dict(l=10, r=10, t=60, b=10), title=t("norm.vectors_title"),
                  legend=dict(orientation="h", y=1.08, x=1, xanchor="right"))
    return _meta(go.Figure(data=traces, layout=layout), "norm_vectors")


def gamma_figure(gamma: np.ndarray, t, which_name: str) -> go.Figure:
    fig = go.Figure(go.Histogram(x=gamma, nbinsx=60, marker_color="#72b7b2",
                                 hovertemplate="γ %{x}<br>" + t("norm.count") + ": %{y}<extra></extra>"))
    fig.update_layout(title=t("norm.gamma_title", norm=which_name), xaxis_title="γ", yaxis_title=t("norm.n_dims"),
                      height=320, margin=dict(l=10, r=10, t=40, b=10))
    return _meta(fig, "norm_gamma")


def layernorm_figure(c: dict, t) -> go.Figure:
    dims = np.arange(len(c["ln"]))
    layout = grid_layout(2, 1, [t("norm.both_plain"), "LayerNorm − RMSNorm"],
                         vspace=0.12, row_heights=[0.65, 0.35], share_x=True)
    traces = [
        dict(type="scatter", x=dims, y=c["rms_norm"], mode="lines", name="RMSNorm: x / rms", meta="rms_norm",
             line=dict(color="#4c78a8")),
        dict(type="scatter", x=dims, y=c["ln"], mode="lines", name="LayerNorm: (x − μ) / σ", meta="layernorm",
             line=dict(color="#f58518", dash="dot")),
        dict(type="scatter", x=dims, y=c["diff"], mode="lines", name=t("norm.difference"), meta="diff",
             xaxis="x2", yaxis="y2", line=dict(color="#54a24b")),
    ]
    layout["xaxis2"]["title"] = t("norm.dim_axis")
    layout.update(height=460, margin=dict(l=10, r=10, t=60, b=10), hovermode="x unified",
                  title=t("norm.layernorm_title"), legend=dict(orientation="h", y=-0.1))  # three names: under the plot
    return _meta(go.Figure(data=traces, layout=layout), "norm_layernorm")


# --------------------------------------------------------------------------- sections
def norm_name(ctx: ViewContext, which: str) -> str:
    return {"ln1": ctx.t("norm.ln1"), "ln2": ctx.t("norm.ln2")}[which]


def draw_intro(ctx: ViewContext) -> None:
    cfg = ctx.cfg
    with plots.explainer(ctx, ctx.t("norm.explain")):
        st.markdown(ctx.t("norm.intro"))
        st.latex(r"\mathrm{RMSNorm}(x)_i=\gamma_i\,\frac{x_i}{\sqrt{\frac{1}{d}\sum_{j=1}^{d}x_j^2+\varepsilon}}"
                 r"\qquad\mathrm{LayerNorm}(x)_i=\gamma_i\,\frac{x_i-\mu}{\sqrt{\sigma^2+\varepsilon}}+\beta_i")
        st.markdown(ctx.t("norm.this_model", d=cfg.d_model, eps=f"{cfg.norm_eps:.3g}", kind=ARCH_NAMES[cfg.norm_type],
                          placement=ARCH_NAMES[cfg.norm_placement]))
    if cfg.norm_type != "rms":
        st.info(ctx.t("norm.is_layernorm"))
    if cfg.norm_placement != "pre":
        st.info(ctx.t("norm.is_post"))


def draw_divisors(ctx: ViewContext, which: str) -> np.ndarray:
    z = divisor_matrix(ctx.rec, which)
    n = z.shape[1]
    lo, hi = token_window.span("norm_divisor_fig", n, token_window.fitting(ctx, [f"L{i}" for i in range(len(z))]),
                               ctx.token)
    plots.show(partial(divisor_figure, z, ctx.labels, ctx.t, norm_name(ctx, which), lo, hi), ctx,
               key="norm_divisor_fig", filename=f"rms_divisor_{which}")
    token_window.controls(ctx, "norm_divisor_fig", n, lo, hi)
    st.caption(ctx.t("norm.divisor_caption"))
    return z


def draw_final(ctx: ViewContext) -> None:
    d = final_divisors(ctx.rec)
    if d is None:
        st.info(ctx.t("norm.no_final"))
    else:
        plots.show(partial(final_figure, d, ctx.labels, ctx.t), ctx, key="norm_final_fig", filename="rms_divisor_final")


def draw_vectors(ctx: ViewContext, which: str) -> dict:
    v = norm_vectors(ctx.rec, ctx.cfg, ctx.facts.gammas[f"blocks.{ctx.layer}.{which}"], ctx.layer, ctx.token, which)
    st.subheader(ctx.t("norm.vectors_heading", token=plain(ctx.labels[ctx.token]), layer=ctx.layer,
                       norm=norm_name(ctx, which)))
    plots.show(partial(vectors_figure, v, ctx.t), ctx, key="norm_vectors_fig", filename=f"rmsnorm_{which}_L{ctx.layer}")
    top = outlier_dims(v["x"])
    share = float(np.sum(v["x"][top] ** 2) / max(np.sum(v["x"] ** 2), 1e-30))
    st.caption(ctx.t("norm.vectors_caption", scale=v["scale"], rms_x=rms(v["x"]), rms_n=rms(v["normalized"]),
                     rms_out=rms(v["out"]), k=len(top), d=len(v["x"]), share=share,
                     dims=", ".join(f"{d} ({v['x'][d]:.3g})" for d in top)))
    return v


def draw_gamma(ctx: ViewContext, v: dict, which: str) -> None:
    g = v["gamma"]
    plots.show(partial(gamma_figure, g, ctx.t, norm_name(ctx, which)), ctx, key="norm_gamma_fig",
               filename=f"gamma_{which}_L{ctx.layer}")
    st.caption(ctx.t("norm.gamma_caption", lo=g.min(), med=np.median(g), hi=g.max(), neg=int((g < 0).sum()),
                     d=len(g), at_dims=", ".join(f"{d}: {g[d]:.3g}" for d in outlier_dims(v["x"]))))


def draw_layernorm(ctx: ViewContext, v: dict) -> dict:
    c = layernorm_compare(v["x"], ctx.cfg.norm_eps)
    st.subheader(ctx.t("norm.vs_heading"))
    st.markdown(ctx.t("norm.vs_text", mean=c["mean"], std=c["std"], rms=c["rms"],
                      ratio=abs(c["mean"]) / max(c["std"], 1e-30), diff=np.abs(c["diff"]).max()))
    plots.show(partial(layernorm_figure, c, ctx.t), ctx, key="norm_layernorm_fig", filename=f"layernorm_vs_rmsnorm_L{ctx.layer}")
    return c


def draw_csv(ctx: ViewContext, which: str, z: np.ndarray, v: dict, c: dict) -> None:
    layers = [f"L{i}" for i in range(z.shape[0])]
    cols = st.columns(2)
    with cols[0]:
        label = ctx.t("norm.csv_divisors", norm=which)
        plots.csv_button(ctx, label, label, lambda: plots.matrix_csv(z, layers, ctx.labels, corner="layer"),
                         f"rms_divisor_{which}.csv", key="norm_csv_divisors")
    top = set(outlier_dims(v["x"]).tolist())
    rows = lambda: plots.to_csv(  # noqa: E731
        ["dim", "x", "x_over_rms", "gamma", "out", "layernorm_no_gamma", "outlier"],
        ([d, float(v["x"][d]), float(v["normalized"][d]), float(v["gamma"][d]), float(v["out"][d]),
          float(c["ln"][d]), int(d in top)] for d in range(len(v["x"]))))
    with cols[1]:
        label = ctx.t("norm.csv_vectors")
        plots.csv_button(ctx, label, label, rows, f"rmsnorm_{which}_L{ctx.layer}_tok{ctx.token}.csv",
                         key="norm_csv_vectors")


def draw(ctx: ViewContext) -> None:
    st.subheader(ctx.t("norm.title"))
    choice_state.start("norm_which")
    which = st.radio(ctx.t("norm.which"), NORMS, key="norm_which", horizontal=True,
                     format_func=lambda w: norm_name(ctx, w))
    with section("norm", "divisors"):
        z = draw_divisors(ctx, which)  # the main figure, first on the page
    draw_intro(ctx)
    with section("norm", "final"):
        draw_final(ctx)
    with section("norm", "vectors"):
        v = draw_vectors(ctx, which)
    with section("norm", "gamma"):
        draw_gamma(ctx, v, which)
    with section("norm", "layernorm"):
        c = draw_layernorm(ctx, v)
    draw_csv(ctx, which, z, v, c)
