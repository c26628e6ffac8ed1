"""RMSNorm view: the divisor of every token before every norm, one token's vector through the norm,
the learned gains γ, and the same vector through LayerNorm for comparison.

All numbers come from the recording (hook_scale, hook_normalized, the residual stream) and γ from the
weights; nothing here runs the model.
"""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import streamlit as st

from app import plots
from app.context import ViewContext, plain
from app.plots import axis_ids, grid_layout

N_OUTLIERS = 5
NORMS = ("ln1", "ln2")


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


def divisor_figure(z: np.ndarray, labels, t, which_name: str) -> go.Figure:
    fig = plots.heatmap(z, x=labels, y=[f"L{i}" for i in range(z.shape[0])],
                        title=t(f"RMS divisor before {which_name}, every layer × token",
                                f"{which_name}之前的 RMS 除数：每层 × 每个 token"),
                        x_title=t("token", "token"), y_title=t("layer", "层"),
                        value_name=t("divisor", "除数"), fmt=".5g")
    if z.shape[1] > 1:  # position 0 is usually a huge "sink"; cap the colours so the other tokens stay readable
        fig.update_traces(zmin=float(z.min()), zmax=float(z[:, 1:].max()),
                          colorbar=dict(title=t("capped at max of tokens ≥ 1", "上限为 token ≥ 1 的最大值"), title_side="right"))
    fig.update_layout(height=max(320, 16 * z.shape[0] + 120))
    return _meta(fig, "norm_divisors")


def final_figure(d: np.ndarray, labels, t) -> go.Figure:
    fig = go.Figure(go.Bar(x=list(labels), y=d, marker_color="#4c78a8",
                           hovertemplate="%{x}<br>" + t("divisor", "除数") + ": %{y:.5g}<extra></extra>"))
    fig.update_layout(title=t("Final norm: RMS divisor per token", "最终归一化：每个 token 的 RMS 除数"),
                      xaxis_title=t("token", "token"), yaxis_title=t("divisor", "除数"), height=300,
                      margin=dict(l=10, r=10, t=40, b=10))
    fig.update_xaxes(type="category")
    return _meta(fig, "norm_final")


def vectors_figure(v: dict, t) -> go.Figure:
    rows = [("x", t("before the norm: x", "归一化之前：x")),
            ("normalized", t("divided by its RMS: x / rms", "除以 RMS 之后：x / rms")),
            ("out", t("after γ: γ ⊙ x / rms", "乘以 γ 之后：γ ⊙ x / rms"))]
    layout = grid_layout(3, 1, [f"{name}   (RMS {rms(v[k]):.4g})" for k, name in rows], vspace=0.08, share_x=True)
    dims = np.arange(len(v["x"]))
    top = outlier_dims(v["x"])
    traces = []
    for r, (k, name) in enumerate(rows, start=1):
        xa, ya = axis_ids(r, 1, 1)
        traces.append(dict(type="bar", x=dims, y=v[k], name=name, marker_color="#4c78a8", showlegend=False, meta=k,
                           xaxis=xa, yaxis=ya, hovertemplate=t("dim", "维") + " %{x}: %{y:.5g}<extra></extra>"))
        traces.append(dict(type="scatter", x=top, y=v[k][top], mode="markers+text", text=[str(d) for d in top],
                           textposition=["top center" if y >= 0 else "bottom center" for y in v[k][top]],
                           cliponaxis=False, marker=dict(color="#e45756", size=9), xaxis=xa, yaxis=ya,
                           name=t("largest |x|", "|x| 最大的维度"), showlegend=r == 1, meta=f"{k}_outliers",
                           hovertemplate=t("outlier dim", "离群维") + " %{x}: %{y:.5g}<extra></extra>"))
    layout["xaxis3"]["title"] = t("dimension of d_model", "d_model 的维度")
    layout.update(height=620, bargap=0, margin=dict(l=10, r=10, t=60, b=10),
                  title=t("One token through the norm", "一个 token 经过归一化"),
                  legend=dict(orientation="h", y=1.08, x=1, xanchor="right"))
    return _meta(go.Figure(data=traces, layout=layout), "norm_vectors")


def gamma_figure(gamma: np.ndarray, t, which_name: str) -> go.Figure:
    fig = go.Figure(go.Histogram(x=gamma, nbinsx=60, marker_color="#72b7b2",
                                 hovertemplate="γ %{x}<br>" + t("count", "个数") + ": %{y}<extra></extra>"))
    fig.update_layout(title=t(f"Learned gains γ of {which_name}", f"{which_name} 的可学习增益 γ"),
                      xaxis_title="γ", yaxis_title=t("number of dimensions", "维度个数"), height=320,
                      margin=dict(l=10, r=10, t=40, b=10))
    return _meta(fig, "norm_gamma")


def layernorm_figure(c: dict, t) -> go.Figure:
    dims = np.arange(len(c["ln"]))
    layout = grid_layout(2, 1, [t("both normalizations (no γ, no β)", "两种归一化（不含 γ 与 β）"),
                                t("LayerNorm − RMSNorm", "LayerNorm − RMSNorm")],
                         vspace=0.12, row_heights=[0.65, 0.35], share_x=True)
    traces = [
        dict(type="scatter", x=dims, y=c["rms_norm"], mode="lines", name="RMSNorm: x / rms", meta="rms_norm",
             line=dict(color="#4c78a8")),
        dict(type="scatter", x=dims, y=c["ln"], mode="lines", name="LayerNorm: (x − μ) / σ", meta="layernorm",
             line=dict(color="#f58518", dash="dot")),
        dict(type="scatter", x=dims, y=c["diff"], mode="lines", name=t("difference", "差值"), meta="diff",
             xaxis="x2", yaxis="y2", line=dict(color="#54a24b")),
    ]
    layout["xaxis2"]["title"] = t("dimension of d_model", "d_model 的维度")
    layout.update(height=460, margin=dict(l=10, r=10, t=60, b=10), hovermode="x unified",
                  title=t("The same vector through LayerNorm", "同一向量经过 LayerNorm"),
                  legend=dict(orientation="h", y=1.1, x=1, xanchor="right"))
    return _meta(go.Figure(data=traces, layout=layout), "norm_layernorm")


# --------------------------------------------------------------------------- sections
def norm_name(ctx: ViewContext, which: str) -> str:
    return {"ln1": ctx.t("ln1 (before attention)", "ln1（注意力之前）"),
            "ln2": ctx.t("ln2 (before the FFN)", "ln2（前馈网络之前）")}[which]


def draw_intro(ctx: ViewContext) -> None:
    cfg = ctx.cfg
    st.markdown(ctx.t(
        "Before attention and before the feed-forward network, every token's residual vector is rescaled "
        "so that its root-mean-square is about 1, then each dimension is multiplied by a learned gain γ. "
        "Unlike LayerNorm, RMSNorm does **not** subtract the mean and has **no bias** β: it only divides by "
        "the vector's size. That is cheaper and, in practice, works just as well.",
        "在注意力和前馈网络之前，每个 token 的残差向量都会先被缩放到均方根约为 1，再逐维乘以可学习的增益 γ。"
        "与 LayerNorm 不同，RMSNorm **不减去均值**，也**没有偏置** β：它只除以向量的“大小”。"
        "这样计算更省，效果在实践中却不相上下。"))
    st.latex(r"\mathrm{RMSNorm}(x)_i=\gamma_i\,\frac{x_i}{\sqrt{\frac{1}{d}\sum_{j=1}^{d}x_j^2+\varepsilon}}"
             r"\qquad\mathrm{LayerNorm}(x)_i=\gamma_i\,\frac{x_i-\mu}{\sqrt{\sigma^2+\varepsilon}}+\beta_i")
    st.markdown(ctx.t(
        f"This model: $d$ = {cfg.d_model}, $\\varepsilon$ = {cfg.norm_eps:.3g}, "
        f"norm type **{cfg.norm_type}**, placement **{cfg.norm_placement}**-norm.",
        f"本模型：$d$ = {cfg.d_model}，$\\varepsilon$ = {cfg.norm_eps:.3g}，"
        f"归一化类型 **{cfg.norm_type}**，位置 **{cfg.norm_placement}**-norm。"))
    if cfg.norm_type != "rms":
        st.info(ctx.t("This model uses LayerNorm, so the recorded divisor is the standard deviation σ, not the RMS.",
                      "该模型使用 LayerNorm，因此记录下的除数是标准差 σ，而不是 RMS。"))
    if cfg.norm_placement != "pre":
        st.info(ctx.t("Post-norm model: each norm reads the residual plus the sublayer's output, and there is no final norm.",
                      "Post-Norm 模型：每个归一化的输入是残差加上子层输出，并且没有最终归一化。"))


def draw_divisors(ctx: ViewContext, which: str) -> np.ndarray:
    z = divisor_matrix(ctx.rec, which)
    plots.show(divisor_figure(z, ctx.labels, ctx.t, norm_name(ctx, which)), ctx, key="norm_divisor_fig",
               filename=f"rms_divisor_{which}")
    st.caption(ctx.t(
        "A large divisor means the residual vector is long. The first token often has a divisor many times "
        "larger than the rest (an “attention sink” carrying huge activations), so the colours stop at the "
        "largest value among the other tokens; hover for exact values.",
        "除数大说明残差向量长。第一个 token 的除数往往比其余 token 大很多倍（携带巨大激活的“注意力汇聚点”），"
        "因此颜色上限取其余 token 中的最大值；悬停可查看精确数值。"))
    d = final_divisors(ctx.rec)
    if d is None:
        st.info(ctx.t("This model has no final norm (post-norm).", "该模型没有最终归一化（Post-Norm）。"))
    else:
        plots.show(final_figure(d, ctx.labels, ctx.t), ctx, key="norm_final_fig", filename="rms_divisor_final")
    return z


def draw_vectors(ctx: ViewContext, which: str) -> dict:
    v = norm_vectors(ctx.rec, ctx.cfg, ctx.facts.gammas[f"blocks.{ctx.layer}.{which}"], ctx.layer, ctx.token, which)
    st.subheader(ctx.t(f"Token {plain(ctx.labels[ctx.token])} at layer {ctx.layer}, {norm_name(ctx, which)}",
                       f"第 {ctx.layer} 层的 token {plain(ctx.labels[ctx.token])}，{norm_name(ctx, which)}"))
    plots.show(vectors_figure(v, ctx.t), ctx, key="norm_vectors_fig", filename=f"rmsnorm_{which}_L{ctx.layer}")
    top = outlier_dims(v["x"])
    share = float(np.sum(v["x"][top] ** 2) / max(np.sum(v["x"] ** 2), 1e-30))
    dims = ", ".join(f"{d} ({v['x'][d]:.3g})" for d in top)
    st.caption(ctx.t(
        f"Recorded divisor {v['scale']:.5g}; RMS before {rms(v['x']):.4g}, after dividing {rms(v['normalized']):.4g}, "
        f"after γ {rms(v['out']):.4g}. Largest |x| in dims {dims}: these {len(top)} of {len(v['x'])} dimensions hold "
        f"{share:.0%} of x²; such massive-activation dimensions dominate the RMS, so they shrink every other dimension.",
        f"记录的除数 {v['scale']:.5g}；归一化前 RMS {rms(v['x']):.4g}，除以 RMS 后 {rms(v['normalized']):.4g}，"
        f"乘以 γ 后 {rms(v['out']):.4g}。|x| 最大的维度：{dims}——这 {len(top)} 个维度（共 {len(v['x'])} 个）"
        f"占了 x² 的 {share:.0%}；这类“巨大激活”维度主导了 RMS，于是其余维度都被压小。"))
    return v


def draw_gamma(ctx: ViewContext, v: dict, which: str) -> None:
    g = v["gamma"]
    plots.show(gamma_figure(g, ctx.t, norm_name(ctx, which)), ctx, key="norm_gamma_fig",
               filename=f"gamma_{which}_L{ctx.layer}")
    top = outlier_dims(v["x"])
    st.caption(ctx.t(
        f"γ: min {g.min():.4g}, median {np.median(g):.4g}, max {g.max():.4g}; {int((g < 0).sum())} of {len(g)} "
        f"negative (they flip the sign of that dimension). γ at the outlier dims: "
        + ", ".join(f"{d}: {g[d]:.3g}" for d in top),
        f"γ：最小 {g.min():.4g}，中位数 {np.median(g):.4g}，最大 {g.max():.4g}；{len(g)} 个中有 {int((g < 0).sum())} 个"
        f"为负（会翻转该维的符号）。离群维上的 γ："
        + "，".join(f"{d}: {g[d]:.3g}" for d in top)))


def draw_layernorm(ctx: ViewContext, v: dict) -> dict:
    c = layernorm_compare(v["x"], ctx.cfg.norm_eps)
    st.subheader(ctx.t("RMSNorm versus LayerNorm on this vector", "在这个向量上比较 RMSNorm 与 LayerNorm"))
    st.markdown(ctx.t(
        f"Mean of x: μ = {c['mean']:.4g}; standard deviation σ = {c['std']:.4g}; RMS = {c['rms']:.4g} "
        f"(always RMS² = μ² + σ²). Both curves are plain normalizations **without** γ or β, so only the "
        f"centring differs. When μ is small next to σ they almost coincide; here |μ|/σ = {abs(c['mean']) / max(c['std'], 1e-30):.3g}, "
        f"largest |difference| {np.abs(c['diff']).max():.3g}.",
        f"x 的均值 μ = {c['mean']:.4g}；标准差 σ = {c['std']:.4g}；RMS = {c['rms']:.4g}（总有 RMS² = μ² + σ²）。"
        f"两条曲线都是**不含** γ 与 β 的纯归一化，唯一区别是是否减去均值。μ 相对 σ 很小时两者几乎重合；"
        f"这里 |μ|/σ = {abs(c['mean']) / max(c['std'], 1e-30):.3g}，差值的最大绝对值为 {np.abs(c['diff']).max():.3g}。"))
    plots.show(layernorm_figure(c, ctx.t), ctx, key="norm_layernorm_fig", filename=f"layernorm_vs_rmsnorm_L{ctx.layer}")
    return c


def draw_csv(ctx: ViewContext, which: str, z: np.ndarray, v: dict, c: dict) -> None:
    layers = [f"L{i}" for i in range(z.shape[0])]
    cols = st.columns(2)
    with cols[0]:
        plots.csv_button(ctx, f"Divisors {which} (layers × tokens, CSV)", f"{which} 除数（层 × token，CSV）",
                         lambda: plots.matrix_csv(z, layers, ctx.labels, corner="layer"),
                         f"rms_divisor_{which}.csv", key="norm_csv_divisors")
    top = set(outlier_dims(v["x"]).tolist())
    rows = lambda: plots.to_csv(  # noqa: E731
        ["dim", "x", "x_over_rms", "gamma", "out", "layernorm_no_gamma", "outlier"],
        ([d, float(v["x"][d]), float(v["normalized"][d]), float(v["gamma"][d]), float(v["out"][d]),
          float(c["ln"][d]), int(d in top)] for d in range(len(v["x"]))))
    with cols[1]:
        plots.csv_button(ctx, "This token's vectors (per dimension, CSV)", "该 token 的向量（逐维，CSV）", rows,
                         f"rmsnorm_{which}_L{ctx.layer}_tok{ctx.token}.csv", key="norm_csv_vectors")


def draw(ctx: ViewContext) -> None:
    draw_intro(ctx)
    which = st.radio(ctx.t("Which norm", "哪个归一化"), NORMS, key="norm_which", horizontal=True,
                     format_func=lambda w: norm_name(ctx, w))
    z = draw_divisors(ctx, which)
    v = draw_vectors(ctx, which)
    draw_gamma(ctx, v, which)
    c = draw_layernorm(ctx, v)
    draw_csv(ctx, which, z, v, c)
