"""RoPE view: this model's frequencies, the angle of every pair at every position, Q/K pairs before and
after rotation, a live check that q·k depends only on n − m, the long-range decay curve and the clock hands.

Q and K come from the recording (hook_q/hook_k before, hook_rot_q/hook_rot_k after); the shift check
rotates the recorded vectors again with the model's own `apply_rope`; nothing runs the model.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from app import plots
from app.plots import axis_ids, grid_layout
from app.context import ViewContext, plain
from explorer_model.analysis import views_data as V

TWO_PI = 2 * math.pi
SHIFTS = (0, 1, 3, 10, 100, 1000, 4000)
N_CLOCKS = 6


# --------------------------------------------------------------------------- data
def theta_data(cfg) -> tuple[np.ndarray, np.ndarray]:
    """(θ_i without scaling, θ_i the model uses) per pair i."""
    return V.theta_data(cfg)


def angle_matrix(theta: np.ndarray, n_pos: int) -> np.ndarray:
    """m·θ_i for m = 0..n_pos-1: [position, pair], in radians, not wrapped."""
    return np.arange(n_pos, dtype=np.float64)[:, None] * theta[None, :]


def qk_pairs(rec, layer: int, head: int, token: int) -> dict[str, np.ndarray]:
    """Q of `head` and K of its KV head at `token`, as [pair, 2] arrays, before and after rotation."""
    a, kv = f"blocks.{layer}.attn", rec.kv_head(head)
    get = lambda name, h: rec[f"{a}.{name}"][0, token, h].float().numpy().reshape(-1, 2)  # noqa: E731
    return {"q": get("hook_q", head), "rot_q": get("hook_rot_q", head),
            "k": get("hook_k", kv), "rot_k": get("hook_rot_k", kv)}


def shift_table(rec, theta: np.ndarray, layer: int, head: int, m: int, n: int, shifts=SHIFTS) -> pd.DataFrame:
    """Score of the recorded un-rotated q (position m) and k (position n) after moving both by s."""
    d = rec.cfg.head_dim
    rows = []
    for s, dot in zip(shifts, V.shifted_dots(rec, theta, layer, head, m, n, shifts)):
        rows.append({"shift s": s, "query pos m+s": m + s, "key pos n+s": n + s, "q·k": dot,
                     "score q·k/√d": dot / math.sqrt(d)})
    df = pd.DataFrame(rows)
    df["diff vs s=0"] = df["score q·k/√d"] - df["score q·k/√d"].iloc[0]
    return df


def decay_curve(q: np.ndarray, k: np.ndarray, theta: np.ndarray, max_delta: int) -> tuple[np.ndarray, np.ndarray]:
    """q·k of rotated q and k as a function of Δ = m − n: Σ_i |q_i||k_i| cos(Δθ_i + φ_i), pairs as complex numbers."""
    qc = q[0::2] + 1j * q[1::2]
    kc = k[0::2] + 1j * k[1::2]
    delta = np.arange(max_delta + 1)
    return delta, np.real(np.exp(1j * delta[:, None] * theta[None, :]) @ (qc * np.conj(kc)))


def envelope(y: np.ndarray, half: int) -> np.ndarray:
    """Running max of |y| over ±half samples, then a running mean: a smooth upper outline of the curve."""
    a = np.pad(np.abs(y), half, mode="edge")
    w = np.lib.stride_tricks.sliding_window_view(a, 2 * half + 1)
    mx = np.pad(w.max(-1), half, mode="edge")
    return np.convolve(mx, np.ones(2 * half + 1) / (2 * half + 1), mode="valid")


def default_pairs(n_pairs: int) -> list[int]:
    return sorted({*range(min(3, n_pairs)), *range(max(n_pairs - 3, 0), n_pairs)})


# --------------------------------------------------------------------------- figures
def _meta(fig: go.Figure, fig_id: str) -> go.Figure:
    fig.update_layout(meta={"id": fig_id})  # lets tests find a figure without relying on page order
    return fig


def theta_figure(plain: np.ndarray, used: np.ndarray, t, scaled: bool) -> go.Figure:
    i = np.arange(len(used))
    hover = "i = %{x}<br>θ = %{y:.6g} rad/token<br>" + t("wavelength", "波长") + " 2π/θ = %{customdata:.6g} " + \
        t("tokens", "个 token") + "<extra>%{fullData.name}</extra>"
    fig = go.Figure()
    if scaled:
        fig.add_trace(go.Scatter(x=i, y=plain, mode="lines+markers", name=t("unscaled", "未缩放"), meta="theta_unscaled",
                                 customdata=TWO_PI / plain, hovertemplate=hover, line=dict(dash="dot", color="grey")))
    fig.add_trace(go.Scatter(x=i, y=used, mode="lines+markers", name=t("used by the model", "模型实际使用"),
                             meta="theta_model", customdata=TWO_PI / used, hovertemplate=hover,
                             line=dict(color="#4c78a8")))
    fig.update_yaxes(type="log", title_text="θ_i (rad / token)")
    fig.update_layout(title=t("Rotation speed θ_i of each pair", "每一对的旋转速度 θ_i"), xaxis_title=t("pair i", "第 i 对"),
                      height=340, margin=dict(l=10, r=10, t=40, b=10))
    return _meta(fig, "rope_theta")


def angle_figure(ang: np.ndarray, labels, t) -> go.Figure:
    fig = go.Figure(go.Heatmap(
        z=np.mod(ang, TWO_PI), x=[str(i) for i in range(ang.shape[1])], y=list(labels), customdata=ang,
        colorscale="Twilight", zmin=0, zmax=TWO_PI, colorbar=dict(title="mod 2π"),
        hovertemplate=t("position", "位置") + " %{y}<br>" + t("pair", "对") + " %{x}<br>m·θ = %{customdata:.6g} rad"
        "<br>mod 2π = %{z:.4f}<extra></extra>"))
    fig.update_yaxes(autorange="reversed", type="category", title_text=t("position m", "位置 m"))
    fig.update_xaxes(type="category", title_text=t("pair i", "第 i 对"))
    fig.update_layout(title=t("Angle m·θ_i of every pair at every position (cyclic colours)",
                              "每个位置上每一对的角度 m·θ_i（循环色标）"),
                      height=min(900, max(320, 14 * ang.shape[0] + 120)), margin=dict(l=10, r=10, t=40, b=10))
    return _meta(fig, "rope_angles")


def _arrow(x: float, y: float, colour: str, **kw) -> dict:
    """A segment from the origin with an arrowhead at (x, y)."""
    return dict(type="scatter", x=[0.0, float(x)], y=[0.0, float(y)], mode="lines+markers",
                marker=dict(symbol=["circle", "arrow"], angleref="previous", size=[3, 13], color=colour), **kw)


def arrows_figure(p: dict, pairs: list[int], t) -> go.Figure:
    rows = (("q", "q", "rot_q"), ("k", "k", "rot_k"))
    titles = [f"{kind.upper()} {t('pair', '对')} {i}: {t('length', '长度')} {np.linalg.norm(p[b][i]):.4g} → "
              f"{np.linalg.norm(p[a][i]):.4g}" for kind, b, a in rows for i in pairs]
    layout = grid_layout(2, len(pairs), titles, vspace=0.14, equal=True)
    circle = np.linspace(0, TWO_PI, 73)
    traces = []
    for r, (kind, before, after) in enumerate(rows, start=1):
        for c, i in enumerate(pairs, start=1):
            xa, ya = axis_ids(r, c, len(pairs))
            radius = float(np.linalg.norm(p[before][i]))
            lim = 1.15 * max(radius, np.linalg.norm(p[after][i]), 1e-6)
            # a circle through the un-rotated tip: the rotated tip must land on it
            traces.append(dict(type="scatter", x=radius * np.cos(circle), y=radius * np.sin(circle), mode="lines",
                               xaxis=xa, yaxis=ya, line=dict(color="#dddddd", width=1), hoverinfo="skip",
                               showlegend=False))
            for stage, key, colour, dash in (("before", before, "#9d9d9d", "dot"), ("after", after, "#e45756", "solid")):
                traces.append(_arrow(
                    *p[key][i], colour, xaxis=xa, yaxis=ya, showlegend=r == 1 and c == 1,
                    name=t("before rotation", "旋转前") if stage == "before" else t("after rotation", "旋转后"),
                    legendgroup=stage, meta={"kind": kind, "stage": stage, "pair": i},
                    line=dict(color=colour, dash=dash, width=2),
                    hovertemplate=f"{kind.upper()} {t('pair', '对')} {i} {stage}: (%{{x:.4g}}, %{{y:.4g}})<extra></extra>"))
            for ax in (xa, ya):
                layout[("xaxis" if ax[0] == "x" else "yaxis") + ax[1:]].update(
                    range=[-lim, lim], showticklabels=False, zeroline=True)
    layout.update(height=440, margin=dict(l=10, r=10, t=80, b=10),
                  title=t("Q (top) and K (bottom): each pair before and after rotation",
                          "Q（上）与 K（下）：每一对旋转前后"),
                  legend=dict(orientation="h", y=1.14, x=1, xanchor="right"))
    for an in layout["annotations"]:
        an["font"] = dict(size=11)
    return _meta(go.Figure(data=traces, layout=layout), "rope_arrows")


def decay_figure(delta, y, env, t, mark: tuple[int, float] | None) -> go.Figure:
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=delta, y=y, mode="lines", name="q·k(Δ)", meta="score", line=dict(width=1, color="#9ecae9")))
    fig.add_trace(go.Scatter(x=delta, y=env, mode="lines", name=t("envelope (smoothed max |q·k|)", "包络（平滑后的 |q·k| 最大值）"),
                             meta="envelope", line=dict(width=3, color="#e45756")))
    if mark is not None:
        fig.add_trace(go.Scatter(x=[mark[0]], y=[mark[1]], mode="markers", name=t("recorded pair", "记录中的这一对"),
                                 marker=dict(size=11, color="black", symbol="x")))
    fig.update_layout(title=t("Score of a fixed q, k as their distance grows", "固定的 q、k 随距离增大时的分数"),
                      xaxis_title=t("relative distance Δ = m − n (tokens)", "相对距离 Δ = m − n（token）"),
                      yaxis_title="q·k", height=360, margin=dict(l=10, r=10, t=40, b=10),
                      legend=dict(orientation="h", y=1.12, x=1, xanchor="right"))
    return _meta(fig, "rope_decay")


def clock_figure(theta: np.ndarray, pairs: list[int], m: int, t) -> go.Figure:
    titles = [f"{t('pair', '对')} {i}: {m * theta[i] / TWO_PI:.3g} {t('turns', '圈')}" for i in pairs]
    layout = grid_layout(1, len(pairs), titles, hspace=0.02, equal=True)
    circle = np.linspace(0, TWO_PI, 73)
    traces = []
    for c, i in enumerate(pairs, start=1):
        xa, ya = axis_ids(1, c, len(pairs))
        a = m * theta[i]
        traces.append(dict(type="scatter", x=np.cos(circle), y=np.sin(circle), mode="lines", xaxis=xa, yaxis=ya,
                           line=dict(color="#cccccc"), hoverinfo="skip", showlegend=False))
        traces.append(_arrow(math.cos(a), math.sin(a), "#4c78a8", xaxis=xa, yaxis=ya, showlegend=False,
                             meta={"pair": i, "angle": a}, line=dict(color="#4c78a8", width=3),
                             hovertemplate=f"m·θ = {a:.6g} rad<br>2π/θ = {TWO_PI / theta[i]:.6g}<extra></extra>"))
        layout["xaxis" + xa[1:]].update(range=[-1.2, 1.2], visible=False)
        layout["yaxis" + ya[1:]].update(range=[-1.2, 1.2], visible=False)
    layout.update(title=t(f"Clock hands at position m = {m}", f"位置 m = {m} 时的表针"), height=260,
                  margin=dict(l=10, r=10, t=80, b=10))
    return _meta(go.Figure(data=traces, layout=layout), "rope_clock")


# --------------------------------------------------------------------------- sections
def draw_intro(ctx: ViewContext) -> None:
    cfg = ctx.cfg
    st.markdown(ctx.t(
        "Attention has no built-in sense of order. RoPE adds it by **turning** query and key vectors: a head "
        "vector is cut into 2-D pairs, and pair $i$ of the token at position $m$ is rotated by the angle "
        "$m\\,\\theta_i$. Early pairs turn fast, late pairs slowly. Only Q and K are rotated, never V.",
        "注意力本身不知道先后顺序。RoPE 通过**旋转**查询和键向量把位置加进去：把一个头的向量切成若干二维对，"
        "位置 $m$ 上 token 的第 $i$ 对转过角度 $m\\,\\theta_i$。靠前的对转得快，靠后的对转得慢。只旋转 Q 和 K，从不旋转 V。"))
    st.latex(r"\theta_i=\mathrm{base}^{-2i/d_{\mathrm{head}}},\qquad"
             r"\begin{bmatrix}x'_{2i}\\x'_{2i+1}\end{bmatrix}=\begin{bmatrix}\cos m\theta_i&-\sin m\theta_i\\"
             r"\sin m\theta_i&\cos m\theta_i\end{bmatrix}\begin{bmatrix}x_{2i}\\x_{2i+1}\end{bmatrix}")
    st.latex(r"\langle R_m q,\;R_n k\rangle=\langle q,\;R_{n-m}k\rangle"
             r"=\sum_i |q_i||k_i|\cos\big((m-n)\theta_i+\varphi_i\big)")
    st.markdown(ctx.t(
        "Rotating both by their own position and taking the dot product leaves only the **difference** "
        "$n-m$: the score knows how far apart two tokens are, not where they are.",
        "两者各按自己的位置旋转后再做点积，只剩下位置**差** $n-m$：分数只知道两个 token 相距多远，而不知道它们在哪里。"))
    scaling = cfg.rope_scaling
    sc = ctx.t("none", "无") if scaling is None else f"{scaling.kind} (factor {scaling.factor:g})"
    st.markdown(ctx.t(
        f"This model: base = {cfg.rope_theta:g}, $d_{{head}}$ = {cfg.head_dim} → {cfg.head_dim // 2} pairs, "
        f"rope scaling: {sc}, context {cfg.max_seq_len} tokens. Pairs are **adjacent** dimensions $(2i, 2i+1)$; "
        f"checkpoints stored in HF's half-split layout $(i, i+d/2)$ are converted at load time "
        f"(this one: {ctx.facts.format}), which gives the same scores.",
        f"本模型：base = {cfg.rope_theta:g}，$d_{{head}}$ = {cfg.head_dim} → {cfg.head_dim // 2} 对，"
        f"RoPE 缩放：{sc}，上下文 {cfg.max_seq_len} 个 token。配对的是**相邻**维度 $(2i, 2i+1)$；"
        f"以 HF 的前后半分布局 $(i, i+d/2)$ 存储的权重在加载时会被转换（本模型格式：{ctx.facts.format}），注意力分数不变。"))


def draw_theta(ctx: ViewContext, plain: np.ndarray, used: np.ndarray) -> None:
    scaled = ctx.cfg.rope_scaling is not None
    plots.show(theta_figure(plain, used, ctx.t, scaled), ctx, key="rope_theta_fig", filename="rope_theta")
    st.caption(ctx.t(
        f"Fastest pair: θ_0 = {used[0]:.4g} rad/token (a full turn every {TWO_PI / used[0]:.3g} tokens); "
        f"slowest: θ_{len(used) - 1} = {used[-1]:.3g} (a turn every {TWO_PI / used[-1]:.4g} tokens)."
        + (" The dotted line is θ_i before the rope scaling." if scaled else ""),
        f"最快的一对：θ_0 = {used[0]:.4g} rad/token（每 {TWO_PI / used[0]:.3g} 个 token 转一圈）；"
        f"最慢的一对：θ_{len(used) - 1} = {used[-1]:.3g}（每 {TWO_PI / used[-1]:.4g} 个 token 转一圈）。"
        + ("虚线是 RoPE 缩放之前的 θ_i。" if scaled else "")))


def draw_angles(ctx: ViewContext, ang: np.ndarray) -> None:
    plots.show(angle_figure(ang, ctx.labels, ctx.t), ctx, key="rope_angle_fig", filename="rope_angles")


def draw_arrows(ctx: ViewContext) -> None:
    n_pairs = ctx.cfg.head_dim // 2
    st.subheader(ctx.t(f"Layer {ctx.layer}, head {ctx.head} (KV head {ctx.rec.kv_head(ctx.head)}), token {plain(ctx.labels[ctx.token])}",
                       f"第 {ctx.layer} 层，头 {ctx.head}（KV 头 {ctx.rec.kv_head(ctx.head)}），token {plain(ctx.labels[ctx.token])}"))
    st.session_state["rope_pairs"] = [i for i in st.session_state.get("rope_pairs", default_pairs(n_pairs)) if i < n_pairs]
    pairs = st.multiselect(ctx.t("Pairs to draw (0 = fastest)", "要画的对（0 = 最快）"), list(range(n_pairs)),
                           key="rope_pairs", max_selections=8)
    if not pairs:
        st.info(ctx.t("Pick at least one pair.", "请至少选择一对。"))
        return
    p = qk_pairs(ctx.rec, ctx.layer, ctx.head, ctx.token)
    plots.show(arrows_figure(p, sorted(pairs), ctx.t), ctx, key="rope_arrows_fig", filename="rope_pairs")
    ratio = np.linalg.norm(p["rot_q"], axis=1) / np.maximum(np.linalg.norm(p["q"], axis=1), 1e-30)
    st.caption(ctx.t(
        f"A rotation keeps lengths: over all {n_pairs} pairs of Q, |after| / |before| lies in "
        f"[{ratio.min():.6f}, {ratio.max():.6f}]. At position 0 nothing turns.",
        f"旋转不改变长度：Q 的全部 {n_pairs} 对中，|旋转后| / |旋转前| 落在 [{ratio.min():.6f}, {ratio.max():.6f}]。"
        f"位置 0 上什么都不转。"))


def draw_shift(ctx: ViewContext, theta: np.ndarray) -> pd.DataFrame:
    st.subheader(ctx.t("Live check: the score depends only on n − m", "现场验证：分数只取决于 n − m"))
    T, m = len(ctx.ids), ctx.token
    st.session_state["rope_key_token"] = min(int(st.session_state.get("rope_key_token", 0)), T - 1)
    n = int(st.number_input(ctx.t("Key token n (the query token m is the selected token)",
                                  "键 token n（查询 token m 为当前选中的 token）"),
                            min_value=0, max_value=T - 1, step=1, key="rope_key_token"))
    df = shift_table(ctx.rec, theta, ctx.layer, ctx.head, m, n)
    num = st.column_config.NumberColumn
    st.dataframe(df, hide_index=True, key="rope_shift_table", column_config={  # display labels only
        "shift s": num(ctx.t("shift s", "平移 s")),
        "query pos m+s": num(ctx.t("query position m+s", "查询位置 m+s")),
        "key pos n+s": num(ctx.t("key position n+s", "键位置 n+s")),
        "q·k": num("q·k", format="%.6f"),
        "score q·k/√d": num(ctx.t("score q·k/√d", "分数 q·k/√d"), format="%.6f"),
        "diff vs s=0": num(ctx.t("difference from s = 0", "与 s = 0 的差"), format="%.1e")})
    spread = float(df["diff vs s=0"].abs().max())
    msg = ctx.t(f"Recorded un-rotated q (position {m}, head {ctx.head}) and k (position {n}) rotated again with "
                f"`apply_rope` at positions (m+s, n+s): the largest difference between shifts is {spread:.2e}.",
                f"取记录中未旋转的 q（位置 {m}，头 {ctx.head}）与 k（位置 {n}），用 `apply_rope` 在位置 (m+s, n+s) 上"
                f"重新旋转：不同平移之间的最大差值为 {spread:.2e}。")
    if n <= m:
        recorded = float(ctx.rec.scores(ctx.layer)[0, ctx.head, m, n])
        ours = float(df["score q·k/√d"].iloc[0])
        msg += ctx.t(f" The model's recorded score at (m, n) is {recorded:.6g} (already divided by √d = "
                     f"{math.sqrt(ctx.cfg.head_dim):.4g}); ours at s = 0 is {ours:.6g}, difference {abs(recorded - ours):.1e}.",
                     f" 模型记录的 (m, n) 分数为 {recorded:.6g}（已除以 √d = {math.sqrt(ctx.cfg.head_dim):.4g}）；"
                     f"我们在 s = 0 时算得 {ours:.6g}，差 {abs(recorded - ours):.1e}。")
        st.markdown(msg)
    else:
        st.markdown(msg)
        st.warning(ctx.t("The key comes after the query, so the causal mask hides this score in the recording; "
                         "pick n ≤ m to compare with it.",
                         "键在查询之后，因果掩码使记录中没有这个分数；选择 n ≤ m 才能与记录比较。"))
    return df


def draw_decay(ctx: ViewContext, theta: np.ndarray) -> None:
    st.subheader(ctx.t("Long-range decay", "远程衰减"))
    src = st.radio(ctx.t("Vectors", "向量"), ("recorded", "ones"), key="rope_decay_src", horizontal=True,
                   format_func=lambda s: ctx.t("recorded q (query token) and k (key token)",
                                               "记录中的 q（查询 token）与 k（键 token）") if s == "recorded"
                   else ctx.t("q = k = all ones (textbook case)", "q = k = 全 1（教科书情形）"))
    T = len(ctx.ids)
    max_delta = max(512, 4 * T)
    m, n = ctx.token, int(st.session_state.get("rope_key_token", 0))
    if src == "recorded":
        a = f"blocks.{ctx.layer}.attn"
        q = ctx.rec[f"{a}.hook_q"][0, m, ctx.head].double().numpy()
        k = ctx.rec[f"{a}.hook_k"][0, n, ctx.rec.kv_head(ctx.head)].double().numpy()
    else:
        q = k = np.ones(ctx.cfg.head_dim)
    delta, y = decay_curve(q, k, theta, max_delta)
    env = envelope(y, max(4, max_delta // 64))
    mark = (m - n, float(y[m - n])) if src == "recorded" and 0 <= m - n <= max_delta else None
    plots.show(decay_figure(delta, y, env, ctx.t, mark), ctx, key="rope_decay_fig", filename="rope_decay")
    st.caption(ctx.t(
        "Each pair contributes a cosine that turns at its own speed; close together they add up, far apart they "
        "fall out of step and partly cancel, so the outline of |q·k| tends to shrink with distance "
        "(not a strict law: the curve wiggles). Unscaled q·k, no 1/√d.",
        "每一对贡献一个以自身速度旋转的余弦；距离近时它们同相相加，距离远时相位错开、部分抵消，所以 |q·k| 的轮廓"
        "大体随距离变小（并非严格规律，曲线会起伏）。这里是未缩放的 q·k，没有除以 √d。"))


def draw_clock(ctx: ViewContext, theta: np.ndarray) -> None:
    st.subheader(ctx.t("Clock hands", "时钟表针"))
    n_ctx = ctx.cfg.max_seq_len
    hi = max(n_ctx, 4096)
    if "rope_clock_pos" not in st.session_state:
        st.session_state["rope_clock_pos"] = ctx.token
    m = st.slider(ctx.t("Position m", "位置 m"), 0, hi, key="rope_clock_pos")
    pairs = sorted({int(round(x)) for x in np.linspace(0, len(theta) - 1, N_CLOCKS)})
    plots.show(clock_figure(theta, pairs, m, ctx.t), ctx, key="rope_clock_fig", filename=f"rope_clock_{m}")
    period = TWO_PI / theta.min()
    sweep = (n_ctx - 1) * theta.min()
    st.markdown(ctx.t(
        f"The fastest hand (pair 0) has made {m * theta.max() / TWO_PI:,.1f} turns at m = {m}; the slowest needs "
        f"{period:,.0f} tokens for one turn. Across the whole context of {n_ctx:,} tokens the slowest hand sweeps only "
        f"{sweep:.3g} rad ({sweep / TWO_PI:.1%} of a turn), "
        + ("so it alone already tells every position apart: the full set of angles never repeats within the context."
           if period > n_ctx else
           "so it wraps around within the context; positions stay distinct only through the other hands being out of step."),
        f"在 m = {m} 时，最快的表针（第 0 对）已转了 {m * theta.max() / TWO_PI:,.1f} 圈；最慢的表针转一圈需要 "
        f"{period:,.0f} 个 token。在整个 {n_ctx:,} 个 token 的上下文里，最慢的表针只扫过 {sweep:.3g} rad"
        f"（一圈的 {sweep / TWO_PI:.1%}），"
        + ("仅凭它就能区分每个位置：整组角度在上下文内从不重复。" if period > n_ctx else
           "所以它会在上下文内转回原处；各位置之所以仍可区分，是因为其他表针与它不同步。")))


def draw_csv(ctx: ViewContext, plain, used, ang, df) -> None:
    cols = st.columns(3)
    theta_csv = lambda: plots.to_csv(  # noqa: E731
        ["pair", "theta_unscaled", "theta_model", "wavelength_tokens"],
        ([i, float(plain[i]), float(used[i]), float(TWO_PI / used[i])] for i in range(len(used))))
    with cols[0]:
        plots.csv_button(ctx, "θ_i table (CSV)", "θ_i 表（CSV）", theta_csv, "rope_theta.csv", key="rope_csv_theta")
    with cols[1]:
        plots.csv_button(ctx, "Angles m·θ_i (positions × pairs, CSV)", "角度 m·θ_i（位置 × 对，CSV）",
                         lambda: plots.matrix_csv(ang, ctx.labels, [str(i) for i in range(ang.shape[1])], "position"),
                         "rope_angles.csv", key="rope_csv_angles")
    with cols[2]:
        plots.csv_button(ctx, "Shift-invariance table (CSV)", "平移不变性表（CSV）",
                         lambda: plots.to_csv(list(df.columns), df.itertuples(index=False)),
                         "rope_shift_invariance.csv", key="rope_csv_shift")


def draw(ctx: ViewContext) -> None:
    draw_intro(ctx)
    plain, used = theta_data(ctx.cfg)
    draw_theta(ctx, plain, used)
    ang = angle_matrix(used, len(ctx.ids))
    draw_angles(ctx, ang)
    draw_arrows(ctx)
    df = draw_shift(ctx, used)
    draw_decay(ctx, used)
    draw_clock(ctx, used)
    draw_csv(ctx, plain, used, ang, df)
