"""The block: a drawn diagram of one Transformer block and of the whole model, with this prompt's shapes,
buttons that lead to each part's own view, and the numbers flowing through the selected layer.

The diagrams are Plotly shapes and annotations (no image files), so they export as PNG like every chart.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from app import plots
from app.context import ViewContext, plain
from explorer_model.analysis import views_data as V

BOX_W, BOX_H, ADD_R, STEP = 0.62, 0.42, 0.24, 1.55
COLOURS = {"io": "#e5e7eb", "norm": "#fde68a", "attention": "#bfdbfe", "rope": "#ddd6fe", "ffn": "#bbf7d0",
           "add": "#fecaca", "embed": "#fed7aa", "block": "#e0e7ff", "out": "#a5f3fc"}
# (diagram part, view it leads to, English, 中文)
NODE_VIEWS = [("tokens", "tokens", "Embedding", "嵌入"), ("norm", "norm", "RMSNorm", "RMSNorm"),
              ("attention", "attention", "Attention", "注意力"), ("rope", "rope", "RoPE", "RoPE"),
              ("ffn", "swiglu", "SwiGLU", "SwiGLU"), ("add", "residual", "Residual add", "残差相加")]


def _shape(*dims) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"


def _en(en: str, zh: str) -> str:
    return en


# --------------------------------------------------------------------------- diagram layout (pure)
def block_nodes(cfg, T: int, placement: str, t=_en) -> tuple[list[dict], list[tuple[int, int]]]:
    """Main-line nodes left to right, and residual skips (split after node i, rejoin at add node j)."""
    D = cfg.d_model
    norm = "RMSNorm" if cfg.norm_type == "rms" else "LayerNorm"
    ffn = "SwiGLU" if cfg.ffn_type == "swiglu" else t("ReLU FFN", "ReLU 前馈")
    gqa = f"GQA {cfg.n_heads}/{cfg.n_kv_heads}" if cfg.n_rep > 1 else t(f"{cfg.n_heads} heads", f"{cfg.n_heads} 个头")

    def box(kind, label, shape):
        return {"kind": kind, "label": label, "shape": shape}

    x_in = box("io", t("x (residual)", "x（残差流）"), _shape(1, T, D))
    attn = box("attention", t(f"Attention<br>causal, {gqa}", f"注意力<br>因果，{gqa}"), _shape(1, T, D))
    mlp = box("ffn", ffn, _shape(1, T, D))
    y_out = box("io", "y", _shape(1, T, D))
    if placement == "post":
        nodes = [x_in, attn, box("add", "+", "h′ " + _shape(1, T, D)), box("norm", f"{norm} (ln1)", _shape(1, T, D)),
                 mlp, box("add", "+", _shape(1, T, D)), box("norm", f"{norm} (ln2)", _shape(1, T, D)), y_out]
        skips = [(0, 2), (3, 5)]
    else:
        nodes = [x_in, box("norm", f"{norm} (ln1)", _shape(1, T, D)), attn, box("add", "+", "h " + _shape(1, T, D)),
                 box("norm", f"{norm} (ln2)", _shape(1, T, D)), mlp, box("add", "+", _shape(1, T, D)), y_out]
        skips = [(0, 3), (3, 6)]
    return nodes, skips


def _draw_chain(shapes: list[dict], notes: list[dict], nodes: list[dict], y: float = 0.0) -> list[float]:
    """Appends plain dicts; the figure is built once at the end (add_annotation re-validates them all)."""
    xs = [i * STEP for i in range(len(nodes))]
    for x, n in zip(xs, nodes):
        if n["kind"] == "add":
            shapes.append(dict(type="circle", x0=x - ADD_R, x1=x + ADD_R, y0=y - ADD_R, y1=y + ADD_R,
                               fillcolor=COLOURS["add"], line=dict(color="#374151", width=1.5)))
            notes.append(dict(x=x, y=y, text="<b>+</b>", showarrow=False, font=dict(size=18, color="#111827")))
            notes.append(dict(x=x, y=y - ADD_R - 0.12, text=n["shape"], showarrow=False, yanchor="top",
                              font=dict(size=11, color="#374151")))
        else:
            shapes.append(dict(type="rect", x0=x - BOX_W, x1=x + BOX_W, y0=y - BOX_H, y1=y + BOX_H,
                               fillcolor=COLOURS[n["kind"]], line=dict(color="#374151", width=1.5)))
            notes.append(dict(x=x, y=y, text=f"<b>{n['label']}</b><br>{n['shape']}", showarrow=False,
                              font=dict(size=12, color="#111827")))
    for i in range(len(nodes) - 1):
        right = xs[i] + (ADD_R if nodes[i]["kind"] == "add" else BOX_W)
        left = xs[i + 1] - (ADD_R if nodes[i + 1]["kind"] == "add" else BOX_W)
        notes.append(dict(x=left, y=y, ax=right, ay=y, xref="x", yref="y", axref="x", ayref="y", text="",
                          showarrow=True, arrowhead=2, arrowsize=1.2, arrowwidth=1.6, arrowcolor="#374151"))
    return xs


def _finish(shapes, notes, xs: list[float], y_range: tuple[float, float], title: str, height: int) -> go.Figure:
    return go.Figure(layout=dict(
        shapes=shapes, annotations=notes, title=title, height=height, margin=dict(l=10, r=10, t=50, b=10),
        xaxis=dict(visible=False, range=[xs[0] - BOX_W - 0.2, xs[-1] + BOX_W + 0.2]),
        yaxis=dict(visible=False, range=list(y_range)), showlegend=False, plot_bgcolor="white",
        paper_bgcolor="white", dragmode=False))


def block_figure(cfg, T: int, placement: str = "pre", t=_en) -> go.Figure:
    """One block; placement "pre" (LLaMA: x + F(Norm(x))) or "post" (original Transformer: Norm(x + F(x)))."""
    nodes, skips = block_nodes(cfg, T, placement, t)
    shapes, notes = [], []
    xs = _draw_chain(shapes, notes, nodes)
    top = BOX_H + 0.55
    for a, b in skips:  # the residual: a bypass from the split point straight into the add
        split = (xs[a] + BOX_W + xs[a + 1] - BOX_W) / 2
        shapes.append(dict(type="path", path=f"M {split},0 L {split},{top} L {xs[b]},{top} L {xs[b]},{ADD_R + 0.02}",
                           line=dict(color="#dc2626", width=2)))
        notes.append(dict(x=xs[b], y=ADD_R, ax=xs[b], ay=ADD_R + 0.3, xref="x", yref="y", axref="x", ayref="y",
                          text="", showarrow=True, arrowhead=2, arrowwidth=2, arrowcolor="#dc2626"))
        notes.append(dict(x=(split + xs[b]) / 2, y=top, text=t("residual (skip)", "残差（跳跃连接）"),
                          showarrow=False, yanchor="bottom", font=dict(size=11, color="#dc2626")))
    # RoPE and the FFN's inner shapes hang under their boxes
    ia = next(i for i, n in enumerate(nodes) if n["kind"] == "attention")
    iff = next(i for i, n in enumerate(nodes) if n["kind"] == "ffn")
    low = -BOX_H - 1.0
    qk = (f"Q {_shape(1, cfg.n_heads, T, cfg.head_dim)}<br>K, V {_shape(1, cfg.n_kv_heads, T, cfg.head_dim)}"
          f"<br>{t('scores', '分数')} {_shape(1, cfg.n_heads, T, T)}")
    inner = (f"W_gate·n, W_up·n: {_shape(1, T, cfg.d_ff)}<br>SiLU(gate) ⊙ up → W_down" if cfg.ffn_type == "swiglu"
             else f"ReLU(W_up·n): {_shape(1, T, cfg.d_ff)}<br>→ W_down")
    for i, kind, text in ((ia, "rope", f"<b>{t('RoPE on Q, K', 'RoPE 作用于 Q、K')}</b><br>{qk}"),
                          (iff, "ffn", inner)):
        shapes.append(dict(type="line", x0=xs[i], x1=xs[i], y0=-BOX_H, y1=low + 0.42,
                           line=dict(color="#6b7280", dash="dot")))
        notes.append(dict(x=xs[i], y=low, text=text, showarrow=False, bgcolor=COLOURS[kind], bordercolor="#6b7280",
                          borderwidth=1, borderpad=4, font=dict(size=11, color="#111827")))
    title = (t("One Pre-Norm block (LLaMA)", "一个 Pre-Norm 模块（LLaMA）") if placement != "post"
             else t("One Post-Norm block (original Transformer)", "一个 Post-Norm 模块（原始 Transformer）"))
    return _finish(shapes, notes, xs, (low - 0.75, top + 0.45), f"{title} — T = {T}, D = {cfg.d_model}", 400)


def model_figure(cfg, T: int, t=_en) -> go.Figure:
    """token ids -> embedding -> block × N -> (final norm) -> output linear -> logits."""
    D, norm = cfg.d_model, "RMSNorm" if cfg.norm_type == "rms" else "LayerNorm"
    nodes = [{"kind": "io", "label": t("token ids", "token id"), "shape": _shape(1, T)},
             {"kind": "embed", "label": t("Embedding E[t]", "嵌入 E[t]"), "shape": _shape(1, T, D)},
             {"kind": "block", "label": t(f"Block × {cfg.n_layers}", f"模块 × {cfg.n_layers}"), "shape": _shape(1, T, D)}]
    if cfg.norm_placement == "pre":
        nodes.append({"kind": "norm", "label": t(f"final {norm}", f"最终 {norm}"), "shape": _shape(1, T, D)})
    tied = t("<br>(tied: Eᵀ)", "<br>（共享 Eᵀ）") if cfg.tie_embeddings else ""
    nodes += [{"kind": "out", "label": t("Output linear", "输出线性层") + tied, "shape": f"{D} → {cfg.vocab_size}"},
              {"kind": "io", "label": "logits", "shape": _shape(1, T, cfg.vocab_size)}]
    shapes, notes = [], []
    xs = _draw_chain(shapes, notes, nodes)
    return _finish(shapes, notes, xs, (-0.75, 0.75), t(f"The whole model — {cfg.n_layers} identical blocks",
                                             f"整个模型 —— {cfg.n_layers} 个相同的模块"), 190)


def figure_texts(fig: go.Figure) -> list[str]:
    return [a.text for a in fig.layout.annotations if a.text]


# --------------------------------------------------------------------------- numbers through one layer (pure)
def flow_rows(rec, layer: int, token: int, t=_en) -> list[dict]:
    """Norms and RMS divisors inside one block, for the selected token and averaged over all tokens."""
    def vec_norm(name):
        return rec[f"blocks.{layer}.{name}"][0].float().norm(dim=-1).numpy()  # [T]

    def scale(name):
        return rec[f"blocks.{layer}.{name}.hook_scale"][0, :, 0].float().numpy()

    x, a, h = vec_norm("hook_resid_pre"), vec_norm("hook_attn_out"), vec_norm("hook_resid_mid")
    m, y = vec_norm("hook_mlp_out"), vec_norm("hook_resid_post")
    items = [("‖x‖ (block input)", "‖x‖（模块输入）", x),
             ("ln1 RMS divisor", "ln1 的 RMS 除数", scale("ln1")),
             ("‖attention output‖", "‖注意力输出‖", a),
             ("‖attention output‖ / ‖x‖", "‖注意力输出‖ / ‖x‖", a / x),
             ("‖h‖ (after 1st add)", "‖h‖（第一次相加后）", h),
             ("ln2 RMS divisor", "ln2 的 RMS 除数", scale("ln2")),
             ("‖FFN output‖", "‖前馈输出‖", m),
             ("‖FFN output‖ / ‖h‖", "‖前馈输出‖ / ‖h‖", m / h),
             ("‖y‖ (block output)", "‖y‖（模块输出）", y)]
    return [{"quantity": t(en, zh), "token": float(v[token]), "mean": float(np.mean(v))} for en, zh, v in items]


def layer_norms_data(rec, token: int) -> dict[str, np.ndarray]:
    """Per-layer norms at one token: residual stream, attention output, FFN output."""
    return {k: V.stack_norms(rec, k, token) for k in ("hook_resid_pre", "hook_attn_out", "hook_mlp_out")}


def layer_norms_figure(data: dict[str, np.ndarray], layer: int, label: str, t=_en) -> go.Figure:
    names = {"hook_resid_pre": t("‖x‖ residual in", "‖x‖ 残差输入"), "hook_attn_out": t("‖attention out‖", "‖注意力输出‖"),
             "hook_mlp_out": t("‖FFN out‖", "‖前馈输出‖")}
    fig = go.Figure()
    for k, v in data.items():
        fig.add_scatter(x=list(range(len(v))), y=v, mode="lines+markers", name=names[k],
                        hovertemplate=f"{names[k]}<br>{t('layer', '层')} %{{x}}: %{{y:.3f}}<extra></extra>")
    fig.add_vline(x=layer, line=dict(color="#dc2626", dash="dash"))
    fig.update_layout(title=t(f"What each block adds, token {label}", f"每个模块加了多少，token {label}"),
                      xaxis_title=t("layer", "层"), yaxis_title=t("L2 norm (log)", "L2 范数（对数）"), yaxis_type="log",
                      height=330, margin=dict(l=10, r=10, t=40, b=10), legend=dict(orientation="h", y=-0.25))
    return fig


# --------------------------------------------------------------------------- sections
def _go(view: str) -> None:
    st.session_state["view"] = view


def draw_intro(ctx: ViewContext) -> None:
    t = ctx.t
    st.markdown(t("Every layer of the model is the same block, repeated. It reads the residual stream x, lets the "
                  "tokens exchange information (attention), then transforms each token on its own (the FFN). "
                  "Each part only *adds* its result to the stream, so the input can always pass straight through.",
                  "模型的每一层都是同一种模块的重复。它读取残差流 x，先让 token 之间交换信息（注意力），"
                  "再对每个 token 单独做变换（前馈网络）。每个部分只是把结果*加*回残差流，所以输入总能直接通过。"))
    if ctx.cfg.norm_placement == "post":
        st.latex(r"h = \mathrm{Norm}\big(x + \mathrm{Attn}(x)\big),\qquad "
                 r"y = \mathrm{Norm}\big(h + \mathrm{FFN}(h)\big)")
    else:
        st.latex(r"h = x + \mathrm{Attn}\big(\mathrm{RMSNorm}(x)\big)")
        st.latex(r"y = h + W_{down}\big(\mathrm{SiLU}(W_{gate}\,n) \odot W_{up}\,n\big),\qquad n = \mathrm{RMSNorm}(h)")


def draw_diagrams(ctx: ViewContext) -> None:
    t, cfg, T = ctx.t, ctx.cfg, len(ctx.ids)
    plots.show(block_figure(cfg, T, cfg.norm_placement, t), ctx, key="block_diagram", filename="block")
    st.caption(t("Click a part to open its view:", "点击一个部分，打开它的视图："))
    cols = st.columns(len(NODE_VIEWS))
    for col, (_, view, en, zh) in zip(cols, NODE_VIEWS):
        col.button(t(en, zh) + " →", key=f"block_go_{view}", on_click=_go, args=(view,), width="stretch")
    plots.show(model_figure(cfg, T, t), ctx, key="block_model_diagram", filename="model")


def draw_flow(ctx: ViewContext) -> None:
    t, L = ctx.t, ctx.layer
    st.subheader(t(f"The numbers through block {L}", f"第 {L} 层模块中的数值"))
    st.markdown(t(f"For token {plain(ctx.labels[ctx.token])} and averaged over all {len(ctx.ids)} tokens. The RMS divisor "
                  "is what RMSNorm divides by, √(mean x² + ε) = ‖x‖/√D roughly; the ratios show how much the "
                  "attention and the FFN change the stream they are added to.",
                  f"token {plain(ctx.labels[ctx.token])} 的值，以及全部 {len(ctx.ids)} 个 token 的平均值。RMS 除数是 RMSNorm "
                  "所除的数 √(mean x² + ε)，约等于 ‖x‖/√D；比值说明注意力和前馈网络对所加入的残差流改变了多少。"))
    rows = flow_rows(ctx.rec, L, ctx.token, t)
    df = pd.DataFrame([{t("quantity", "量"): r["quantity"], t(f"token {ctx.token}", f"token {ctx.token}"): r["token"],
                        t("mean over tokens", "全部 token 平均"): r["mean"]} for r in rows])
    left, right = st.columns([2, 3])
    with left:
        st.dataframe(df, hide_index=True, key="block_flow")
        plots.csv_button(ctx, "These numbers (CSV)", "这些数值（CSV）", lambda: df.to_csv(index=False),
                         f"block_{L}_numbers.csv", "block_csv_flow")
    with right:
        data = layer_norms_data(ctx.rec, ctx.token)
        plots.show(layer_norms_figure(data, L, ctx.labels[ctx.token], t), ctx, key="block_layer_norms",
                   filename="block_norms_by_layer")


def draw(ctx: ViewContext) -> None:
    draw_intro(ctx)
    draw_diagrams(ctx)
    draw_flow(ctx)
