"""Attention: who each token reads from, per layer and head.

scores = Q K^T / sqrt(d_head) with the future masked to -inf, pattern = softmax(scores). Masked cells are
drawn blank: they are not small numbers, they do not exist for that query.
"""
from __future__ import annotations

import html

import numpy as np
import plotly.graph_objects as go
import streamlit as st

from app import explorer, plots
from app.context import ViewContext, plain
from explorer_model.analysis import views_data as V


def head_matrix(ctx: ViewContext, layer: int, head: int, kind: str) -> np.ndarray:
    """[q_pos, k_pos] probabilities or scaled scores; the masked future is NaN in both (drawn blank)."""
    m = (ctx.rec.pattern(layer) if kind == "pattern" else ctx.rec.scores(layer))[0, head].double().numpy()
    future = np.triu(np.ones(m.shape, dtype=bool), 1)
    return np.where(future, np.nan, m)


def overview(rec) -> tuple[np.ndarray, np.ndarray]:
    """Per layer and head: mean entropy of the query rows (nats) and mean attention to position 0.

    Query 0 can only read itself, so it is left out of both means when there is more than one token.
    """
    return V.attention_overview(rec)


def head_label(ctx: ViewContext, h: int) -> str:
    return ctx.t(f"head {h} (KV {h // ctx.cfg.n_rep})", f"头 {h}（KV {h // ctx.cfg.n_rep}）")


# --------------------------------------------------------------------------- sections
def draw_explanation(ctx: ViewContext) -> None:
    cfg = ctx.cfg
    st.markdown(ctx.t(
        "Each token asks a question (its query **q**), every earlier token offers a label (its key **k**) and "
        "a message (its value **v**). The match q·k, scaled by √d_head, becomes a share of attention after "
        "softmax; the token's output is the shares' mix of values. A token may only read itself and the past: "
        "future cells are masked before softmax, which is why the upper triangle is empty.",
        "每个 token 提出一个问题（查询 **q**），前面的每个 token 给出一个标签（键 **k**）和一条信息（值 **v**）。"
        "q·k 除以 √d_head 后经 softmax 变成注意力份额；该 token 的输出就是按份额混合的值向量。"
        "token 只能读取自己和过去：未来位置在 softmax 之前被屏蔽，所以右上三角是空的。"))
    st.latex(r"\mathrm{scores}=\frac{QK^\top}{\sqrt{d_{head}}}+M,\quad M_{ij}=\begin{cases}0 & j\le i\\ -\infty & j>i"
             r"\end{cases},\qquad \mathrm{pattern}=\mathrm{softmax}(\mathrm{scores}),\quad z=\mathrm{pattern}\,V")
    st.caption(ctx.t(
        f"This model: {cfg.n_heads} query heads share {cfg.n_kv_heads} key/value heads (grouped-query attention): "
        f"heads {cfg.n_rep} at a time read the same K and V. d_head = {cfg.head_dim}.",
        f"本模型：{cfg.n_heads} 个查询头共享 {cfg.n_kv_heads} 个键/值头（分组查询注意力 GQA）："
        f"每 {cfg.n_rep} 个头读取同一组 K 和 V。d_head = {cfg.head_dim}。"))


def draw_head(ctx: ViewContext, kind: str) -> None:
    m = head_matrix(ctx, ctx.layer, ctx.head, kind)
    name = ctx.t("probability", "概率") if kind == "pattern" else ctx.t("scaled score", "缩放分数")
    fig = plots.heatmap(
        m, ctx.labels, ctx.labels, colorscale="Blues" if kind == "pattern" else "RdBu_r",
        zmin=0 if kind == "pattern" else None, zmax=1 if kind == "pattern" else None,
        zmid=None if kind == "pattern" else 0.0,
        title=ctx.t(f"Layer {ctx.layer}, {head_label(ctx, ctx.head)}: {name}",
                    f"第 {ctx.layer} 层，{head_label(ctx, ctx.head)}：{name}"),
        x_title=ctx.t("key (read from)", "键（被读取）"), y_title=ctx.t("query (reader)", "查询（读取者）"),
        value_name=name)
    plots.show(fig, ctx, key="attn_head", filename=f"attention_L{ctx.layer}_H{ctx.head}_{kind}",
               height=max(420, 22 * len(ctx.ids) + 160))
    plots.csv_button(ctx, "Download this matrix (CSV)", "下载该矩阵（CSV）",
                     lambda: plots.matrix_csv(m, ctx.labels, ctx.labels, "query\\key"),
                     f"attention_L{ctx.layer}_H{ctx.head}_{kind}.csv", key="attn_csv_head")


def draw_query_text(ctx: ViewContext) -> None:
    """The selected query token's attention row as highlighted text."""
    row = ctx.rec.pattern(ctx.layer)[0, ctx.head, ctx.token].double().numpy()
    top = row.max() if row.size else 1.0
    spans = []
    for i, piece in enumerate(ctx.pieces):
        if i > ctx.token:
            style = "color:#999;border:1px dashed #ccc"  # the future: masked, not read at all
            tip = ctx.t("future: masked", "未来：被屏蔽")
        else:
            alpha = 0.08 + 0.92 * row[i] / top if top > 0 else 0
            style = f"background:rgba(220,80,30,{alpha:.3f})"
            tip = f"{row[i]:.4f}"
        if i == ctx.token:
            style += ";outline:2px solid #1f4e9c"
        spans.append(f'<span title="{html.escape(tip)}" style="{style};padding:2px 3px;margin:1px;'
                     f'border-radius:4px;display:inline-block;font-family:monospace">{html.escape(piece)}</span>')
    piece = plain(ctx.pieces[ctx.token])  # prompt text: escaped, never markdown
    st.markdown(ctx.t(f"**What token {ctx.token} “{piece}” reads** (darker = more attention; hover for the value):",
                      f"**第 {ctx.token} 个 token “{piece}” 读取了什么**（颜色越深注意力越多；悬停查看数值）："))
    st.markdown("".join(spans), unsafe_allow_html=True)
    order = np.argsort(-row[: ctx.token + 1])[:3]
    st.caption(ctx.t("Top keys: ", "注意力最多的键：") +
                ", ".join(f"{ctx.labels[i]} ({row[i]:.3f})" for i in order))


def draw_head_grid(ctx: ViewContext, kind: str) -> None:
    cfg = ctx.cfg
    # Columns are KV groups, so heads that share K and V stand in one column.
    n_cols, n_rows = cfg.n_kv_heads, cfg.n_rep
    if n_cols > 8:  # many KV heads (no GQA): fall back to a compact square grid
        n_cols = int(np.ceil(np.sqrt(cfg.n_heads)))
        n_rows = int(np.ceil(cfg.n_heads / n_cols))
    order = [h for g in range(cfg.n_kv_heads) for h in range(g * cfg.n_rep, (g + 1) * cfg.n_rep)]
    slots = {}
    for h in order:
        g, r = divmod(h, cfg.n_rep)
        slots[h] = (r, g) if n_cols == cfg.n_kv_heads else divmod(h, n_cols)
    titles = [""] * (n_rows * n_cols)
    for h, (r, c) in slots.items():
        titles[r * n_cols + c] = head_label(ctx, h)
    layout = plots.grid_layout(n_rows, n_cols, titles, hspace=0.03, vspace=0.06)
    traces = []
    for h, (r, c) in slots.items():
        xa, ya = plots.axis_ids(r + 1, c + 1, n_cols)
        traces.append(go.Heatmap(z=head_matrix(ctx, ctx.layer, h, kind), x=ctx.labels, y=ctx.labels,
                                 coloraxis="coloraxis", hoverongaps=False, xaxis=xa, yaxis=ya,
                                 hovertemplate="q %{y}<br>k %{x}<br>%{z:.4f}<extra>" + f"head {h}</extra>"))
        layout["yaxis" + ya[1:]].update(autorange="reversed", showticklabels=False, type="category")
        layout["xaxis" + xa[1:]].update(showticklabels=False, type="category")
    fig = go.Figure(traces, layout)
    fig.update_layout(coloraxis=dict(colorscale="Blues" if kind == "pattern" else "RdBu_r",
                                     cmin=0 if kind == "pattern" else None, cmax=1 if kind == "pattern" else None),
                      title=ctx.t(f"Every head of layer {ctx.layer} (columns = shared KV head)",
                                  f"第 {ctx.layer} 层的所有头（每列共享同一个 KV 头）"),
                      margin=dict(l=10, r=10, t=70, b=10))
    plots.show(fig, ctx, key="attn_grid", filename=f"attention_L{ctx.layer}_all_heads", height=260 * n_rows + 80)


def draw_overview(ctx: ViewContext) -> None:
    entropy, sink = explorer.derived("attention_overview", ctx.source, ctx.ids, overview)
    heads = [head_label(ctx, h) for h in range(ctx.cfg.n_heads)]
    layers = [ctx.t(f"layer {l}", f"第 {l} 层") for l in range(ctx.cfg.n_layers)]
    c1, c2 = st.columns(2)
    with c1:
        fig = plots.heatmap(entropy, heads, layers, colorscale="Viridis", value_name=ctx.t("entropy (nats)", "熵（nats）"),
                            title=ctx.t("Attention entropy: low = focused, high = spread out",
                                        "注意力熵：低 = 集中，高 = 分散"),
                            x_title=ctx.t("head", "头"), y_title=ctx.t("layer", "层"))
        plots.show(fig, ctx, key="attn_entropy", filename="attention_entropy", height=620)
    with c2:
        fig = plots.heatmap(sink, heads, layers, colorscale="Reds", zmin=0, zmax=1,
                            value_name=ctx.t("share on token 0", "分给第 0 个 token 的份额"),
                            title=ctx.t("Attention to the first token (the “sink”)", "对第一个 token 的注意力（“汇聚点”）"),
                            x_title=ctx.t("head", "头"), y_title=ctx.t("layer", "层"))
        plots.show(fig, ctx, key="attn_sink", filename="attention_sink", height=620)
    st.caption(ctx.t(
        "Many heads park most of their attention on the first token when they have nothing useful to read: "
        "softmax must give its mass somewhere. Query 0 is left out of both averages (it can only read itself).",
        "许多头在没有有用信息可读时，会把大部分注意力放在第一个 token 上：softmax 的总和必须是 1。"
        "两个平均值都不包含第 0 个查询（它只能读取自己）。"))
    rows = [(l, h, h // ctx.cfg.n_rep, entropy[l, h], sink[l, h])
            for l in range(ctx.cfg.n_layers) for h in range(ctx.cfg.n_heads)]
    plots.csv_button(ctx, "Download entropy and sink per head (CSV)", "下载每个头的熵与汇聚份额（CSV）",
                     lambda: plots.to_csv(["layer", "head", "kv_head", "entropy_nats", "attention_to_first"], rows),
                     "attention_overview.csv", key="attn_csv_overview")


def draw(ctx: ViewContext) -> None:
    draw_explanation(ctx)
    kind = st.radio(ctx.t("Show", "显示"), ["pattern", "scores"], horizontal=True, key="attn_kind",
                    format_func=lambda k: ctx.t("probabilities (after softmax)", "概率（softmax 之后）") if k == "pattern"
                    else ctx.t("scaled scores QKᵀ/√d (masked)", "缩放分数 QKᵀ/√d（已屏蔽）"))
    left, right = st.columns([3, 2])
    with left:
        draw_head(ctx, kind)
    with right:
        draw_query_text(ctx)
    draw_head_grid(ctx, kind)
    draw_overview(ctx)
