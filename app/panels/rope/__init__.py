"""RoPE view: this model's frequencies, the angle of every pair at every position, Q/K pairs before and
after rotation, a live check that q·k depends only on n − m, the long-range decay curve and the clock hands.

Q and K come from the recording (hook_q/hook_k before, hook_rot_q/hook_rot_k after); the shift check
rotates the recorded vectors again with the model's own `apply_rope`; nothing runs the model.
"""
from __future__ import annotations

from functools import partial
import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from app import choice_state, gateway, plots
from app.plots import axis_ids, grid_layout
from app.context import ViewContext, plain
from app.panels.rope import absolute as rope_absolute
from app.sections import section
from explorer_model import view_choices as VC
from explorer_model.analysis import views_data as V

TWO_PI = 2 * math.pi
SHIFTS = (0, 1, 3, 10, 100, 1000, 4000)
N_CLOCKS = 6
MAX_PAIRS = 8  # pairs drawn as arrows at once


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


def model_shift_table(rec, layer: int, head: int, m: int, n: int) -> pd.DataFrame:
    """shift_table with the θ the recording's model uses."""
    return shift_table(rec, theta_data(rec.cfg)[1], layer, head, m, n)


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


SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def power_of_ten(k: int) -> str:
    return "1" if k == 0 else "10" + str(k).translate(SUPERSCRIPT)


def theta_figure(plain: np.ndarray, used: np.ndarray, t, scaled: bool) -> go.Figure:
    i = np.arange(len(used))
    hover = t("rope.theta_hover") + "<extra>%{fullData.name}</extra>"
    fig = go.Figure()
    if scaled:
        fig.add_trace(go.Scatter(x=i, y=plain, mode="lines+markers", name=t("rope.unscaled"), meta="theta_unscaled",
                                 customdata=TWO_PI / plain, hovertemplate=hover, line=dict(dash="dot", color="grey")))
    fig.add_trace(go.Scatter(x=i, y=used, mode="lines+markers", name=t("rope.used"),
                             meta="theta_model", customdata=TWO_PI / used, hovertemplate=hover,
                             line=dict(color="#4c78a8")))
    # log axis: labels only at powers of ten (no crowded 2, 5 minor labels), written 10⁻⁴ in characters of the tick
    # font's own size (Plotly's "power" format sets exponents in a smaller font)
    both = np.log10(np.concatenate([used, plain]))
    decades = range(int(np.floor(both.min())), int(np.ceil(both.max())) + 1)
    fig.update_yaxes(type="log", title_text="θ_i (rad / token)", tickvals=[10.0 ** k for k in decades],
                     ticktext=[power_of_ten(k) for k in decades], minor=dict(showgrid=False))
    fig.update_layout(title=t("rope.theta_title"), xaxis_title=t("rope.pair_i"),
                      height=340, margin=dict(l=10, r=10, t=40, b=10))
    return _meta(fig, "rope_theta")


def angle_figure(ang: np.ndarray, labels, t) -> go.Figure:
    fig = go.Figure(go.Heatmap(
        z=np.mod(ang, TWO_PI), x=[str(i) for i in range(ang.shape[1])], y=list(labels), customdata=ang,
        colorscale="Twilight", zmin=0, zmax=TWO_PI, colorbar=dict(title="mod 2π"),
        hovertemplate=t("rope.angle_hover") + "<extra></extra>"))
    fig.update_yaxes(autorange="reversed", type="category", title_text=t("rope.position_m"))
    fig.update_xaxes(type="category", title_text=t("rope.pair_i"))
    fig.update_layout(title=t("rope.angle_title"),
                      height=min(900, max(320, 14 * ang.shape[0] + 120)), margin=dict(l=10, r=10, t=40, b=10))
    return _meta(fig, "rope_angles")


def _arrow(x: float, y: float, colour: str, **kw) -> dict:
    """A segment from the origin with an arrowhead at (x, y)."""
    return dict(type="scatter", x=[0.0, float(x)], y=[0.0, float(y)], mode="lines+markers",
                marker=dict(symbol=["circle", "arrow"], angleref="previous", size=[3, 13], color=colour), **kw)


def arrows_figure(p: dict, pairs: list[int], t) -> go.Figure:
    rows = (("q", "q", "rot_q"), ("k", "k", "rot_k"))
    # Short titles: with up to 8 columns at 768 px wide a title has ~80 px; lengths are in the hover.
    titles = [f"{kind.upper()} · {i}" for kind, _, _ in rows for i in pairs]
    layout = grid_layout(2, len(pairs), titles, hspace=0.04, vspace=0.2, equal=True)
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
                name = t("rope.before_rotation") if stage == "before" else t("rope.after_rotation")
                traces.append(_arrow(
                    *p[key][i], colour, xaxis=xa, yaxis=ya, showlegend=r == 1 and c == 1, name=name,
                    legendgroup=stage, meta={"kind": kind, "stage": stage, "pair": i},
                    line=dict(color=colour, dash=dash, width=2),
                    hovertemplate=f"{kind.upper()} · {i}, {name}: (%{{x:.4g}}, %{{y:.4g}})<br>"
                                  + t("rope.length_hover", length=float(np.linalg.norm(p[key][i])))
                                  + "<extra></extra>"))
            for ax in (xa, ya):
                layout[("xaxis" if ax[0] == "x" else "yaxis") + ax[1:]].update(
                    range=[-lim, lim], showticklabels=False, zeroline=True)
    layout.update(height=460, margin=dict(l=10, r=10, t=90, b=10), title=t("rope.arrows_title"),
                  legend=dict(orientation="h", y=1.18, x=1, xanchor="right"))
    for an in layout["annotations"]:
        an["font"] = dict(size=12)
    return _meta(go.Figure(data=traces, layout=layout), "rope_arrows")


def decay_figure(delta, y, env, t, mark: tuple[int, float] | None) -> go.Figure:
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=delta, y=y, mode="lines", name="q·k(Δ)", meta="score", line=dict(width=1, color="#9ecae9")))
    fig.add_trace(go.Scatter(x=delta, y=env, mode="lines", name=t("rope.envelope"),
                             meta="envelope", line=dict(width=3, color="#e45756")))
    if mark is not None:
        fig.add_trace(go.Scatter(x=[mark[0]], y=[mark[1]], mode="markers", name=t("rope.recorded_pair"),
                                 marker=dict(size=11, color="black", symbol="x")))
    fig.update_layout(title=t("rope.decay_title"), xaxis_title=t("rope.delta_axis"),
                      yaxis_title="q·k", height=360, margin=dict(l=10, r=10, t=40, b=10),
                      legend=dict(orientation="h", y=1.12, x=1, xanchor="right"))
    return _meta(fig, "rope_decay")


def clock_figure(theta: np.ndarray, pairs: list[int], m: int, t) -> go.Figure:
    # two short lines per title: six clocks side by side leave ~110 px each at 768 px wide
    titles = [t("rope.clock_sub", i=i, turns=f"{m * theta[i] / TWO_PI:.2g}") for i in pairs]
    layout = grid_layout(1, len(pairs), titles, hspace=0.04, equal=True)
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
    for an in layout["annotations"]:
        an["font"] = dict(size=12)
    layout.update(title=t("rope.clock_title", m=m), height=280, margin=dict(l=10, r=10, t=100, b=10))
    return _meta(go.Figure(data=traces, layout=layout), "rope_clock")


# --------------------------------------------------------------------------- sections
def sentences(ctx: ViewContext, *parts: str) -> str:
    """Messages shown as one paragraph: Chinese runs on without spaces, English takes one between."""
    return ("" if ctx.lang == "zh" else " ").join(p for p in parts if p)


def draw_intro(ctx: ViewContext) -> None:
    cfg = ctx.cfg
    with plots.explainer(ctx, ctx.t("rope.explain")):
        st.markdown(ctx.t("rope.intro"))
        st.latex(r"\theta_i=\mathrm{base}^{-2i/d_{\mathrm{head}}},\qquad"
                 r"\begin{bmatrix}x'_{2i}\\x'_{2i+1}\end{bmatrix}=\begin{bmatrix}\cos m\theta_i&-\sin m\theta_i\\"
                 r"\sin m\theta_i&\cos m\theta_i\end{bmatrix}\begin{bmatrix}x_{2i}\\x_{2i+1}\end{bmatrix}")
        st.latex(r"\langle R_m q,\;R_n k\rangle=\langle q,\;R_{n-m}k\rangle"
                 r"=\sum_i |q_i||k_i|\cos\big((m-n)\theta_i+\varphi_i\big)")
        st.markdown(ctx.t("rope.relative"))
        scaling = cfg.rope_scaling
        sc = ctx.t("rope.no_scaling") if scaling is None else f"{scaling.kind} (factor {scaling.factor:g})"
        st.markdown(ctx.t("rope.this_model", base=f"{cfg.rope_theta:g}", d_head=cfg.head_dim, pairs=cfg.head_dim // 2,
                          scaling=sc, context=cfg.max_seq_len, format=ctx.facts.format))


def draw_theta(ctx: ViewContext, plain: np.ndarray, used: np.ndarray) -> None:
    scaled = ctx.cfg.rope_scaling is not None
    plots.show(partial(theta_figure, plain, used, ctx.t, scaled), ctx, key="rope_theta_fig", filename="rope_theta")
    st.caption(sentences(ctx, ctx.t("rope.theta_caption", fast=used[0], fast_turn=TWO_PI / used[0], last=len(used) - 1,
                                    slow=used[-1], slow_turn=TWO_PI / used[-1]),
                         ctx.t("rope.theta_scaled") if scaled else ""))


def draw_angles(ctx: ViewContext, ang: np.ndarray) -> None:
    plots.show(partial(angle_figure, ang, ctx.labels, ctx.t), ctx, key="rope_angle_fig", filename="rope_angles")


def draw_arrows(ctx: ViewContext) -> None:
    n_pairs = ctx.cfg.head_dim // 2
    st.subheader(ctx.t("rope.arrows_heading", layer=ctx.layer, head=ctx.head, kv=ctx.rec.kv_head(ctx.head),
                       token=plain(ctx.labels[ctx.token])))
    if len(choice_state.start("rope_pairs", default_pairs(n_pairs), hi=n_pairs - 1)) > MAX_PAIRS:
        st.session_state["rope_pairs"] = st.session_state["rope_pairs"][:MAX_PAIRS]
    pairs = st.multiselect(ctx.t("rope.pairs_pick"), list(range(n_pairs)), key="rope_pairs", max_selections=MAX_PAIRS)
    if not pairs:
        st.info(ctx.t("rope.pick_one"))
        return
    p = qk_pairs(ctx.rec, ctx.layer, ctx.head, ctx.token)
    plots.show(partial(arrows_figure, p, sorted(pairs), ctx.t), ctx, key="rope_arrows_fig", filename="rope_pairs")
    ratio = np.linalg.norm(p["rot_q"], axis=1) / np.maximum(np.linalg.norm(p["q"], axis=1), 1e-30)
    st.caption(ctx.t("rope.arrows_caption", n=n_pairs, lo=f"{ratio.min():.6f}", hi=f"{ratio.max():.6f}"))


def draw_shift(ctx: ViewContext) -> pd.DataFrame:
    st.subheader(ctx.t("rope.shift_heading"))
    T, m = len(ctx.ids), ctx.token
    choice_state.start("rope_key_token", hi=T - 1)
    n = int(st.number_input(ctx.t("rope.key_token"), min_value=0, max_value=T - 1, step=1, key="rope_key_token"))
    df = gateway.derived("rope_shift", ctx.source, ctx.ids, model_shift_table, ctx.layer, ctx.head, m, n)
    plots.table(ctx, df, key="rope_shift_table",  # display labels only: the CSV keeps the frame's own names
                labels={"shift s": ctx.t("rope.col_shift"), "query pos m+s": ctx.t("rope.col_query"),
                        "key pos n+s": ctx.t("rope.col_key"), "q·k": "q·k", "score q·k/√d": ctx.t("rope.col_score"),
                        "diff vs s=0": ctx.t("rope.col_diff")},
                formats={"q·k": "%.6f", "score q·k/√d": "%.6f", "diff vs s=0": "%.1e"})
    spread = float(df["diff vs s=0"].abs().max())
    msg = ctx.t("rope.shift_text", m=m, head=ctx.head, n=n, spread=f"{spread:.2e}")
    if n <= m:
        recorded = float(ctx.rec.scores(ctx.layer)[0, ctx.head, m, n])
        ours = float(df["score q·k/√d"].iloc[0])
        msg = sentences(ctx, msg, ctx.t("rope.shift_recorded", recorded=f"{recorded:.6g}", ours=f"{ours:.6g}",
                                        sqrt_d=f"{math.sqrt(ctx.cfg.head_dim):.4g}", diff=f"{abs(recorded - ours):.1e}"))
        st.markdown(msg)
    else:
        st.markdown(msg)
        st.warning(ctx.t("rope.key_after_query"))
    return df


def draw_decay(ctx: ViewContext, theta: np.ndarray) -> None:
    st.subheader(ctx.t("rope.decay_heading"))
    choice_state.start("rope_decay_src")
    src = st.radio(ctx.t("rope.vectors"), VC.values("rope_decay_src"), key="rope_decay_src", horizontal=True,
                   format_func=lambda s: ctx.t("rope.src_recorded") if s == "recorded" else ctx.t("rope.src_ones"))
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
    plots.show(partial(decay_figure, delta, y, env, ctx.t, mark), ctx, key="rope_decay_fig", filename="rope_decay")
    st.caption(ctx.t("rope.decay_caption"))


def draw_clock(ctx: ViewContext, theta: np.ndarray) -> None:
    st.subheader(ctx.t("rope.clock_heading"))
    n_ctx = ctx.cfg.max_seq_len
    hi = max(n_ctx, 4096)
    choice_state.start("rope_clock_pos", ctx.token, hi=hi)
    m = st.slider(ctx.t("rope.position_slider"), 0, hi, key="rope_clock_pos")
    pairs = sorted({int(round(x)) for x in np.linspace(0, len(theta) - 1, N_CLOCKS)})
    plots.show(partial(clock_figure, theta, pairs, m, ctx.t), ctx, key="rope_clock_fig", filename=f"rope_clock_{m}")
    period = TWO_PI / theta.min()
    sweep = (n_ctx - 1) * theta.min()
    values = dict(m=m, fast_turns=f"{m * theta.max() / TWO_PI:,.1f}", period=f"{period:,.0f}", n_ctx=f"{n_ctx:,}",
                  sweep=f"{sweep:.3g}", share=f"{sweep / TWO_PI:.1%}")
    st.markdown(sentences(ctx, ctx.t("rope.clock_text", **values),
                          ctx.t("rope.clock_unique", step=f"{theta.min():.2g}") if period > n_ctx
                          else ctx.t("rope.clock_wraps")))


def draw_csv(ctx: ViewContext, plain, used, ang, df) -> None:
    cols = st.columns(3)
    theta_csv = lambda: plots.to_csv(  # noqa: E731
        ["pair", "theta_unscaled", "theta_model", "wavelength_tokens"],
        ([i, float(plain[i]), float(used[i]), float(TWO_PI / used[i])] for i in range(len(used))))
    buttons = ((ctx.t("rope.csv_theta"), theta_csv, "rope_theta.csv", "rope_csv_theta"),
               (ctx.t("rope.csv_angles"),
                lambda: plots.matrix_csv(ang, ctx.labels, [str(i) for i in range(ang.shape[1])], "position"),
                "rope_angles.csv", "rope_csv_angles"),
               (ctx.t("rope.csv_shift"), lambda: plots.to_csv(list(df.columns), df.itertuples(index=False)),
                "rope_shift_invariance.csv", "rope_csv_shift"))
    for col, (label, data, name, key) in zip(cols, buttons):
        with col:
            plots.csv_button(ctx, label, label, data, name, key=key)


def draw(ctx: ViewContext) -> None:
    st.subheader(ctx.t("rope.title"))
    plain, used = theta_data(ctx.cfg)
    ang = angle_matrix(used, len(ctx.ids))
    with section("rope", "angles"):
        draw_angles(ctx, ang)  # the main figure: every pair's angle at every position of this prompt
    draw_intro(ctx)
    with section("rope", "theta"):
        draw_theta(ctx, plain, used)
    with section("rope", "pairs"):
        draw_arrows(ctx)
    with section("rope", "shift"):
        df = draw_shift(ctx)
    with section("rope", "decay"):
        draw_decay(ctx, used)
    with section("rope", "clock"):
        draw_clock(ctx, used)
    with section("rope", "sinusoidal"):
        rope_absolute.draw(ctx)
    draw_csv(ctx, plain, used, ang, df)
