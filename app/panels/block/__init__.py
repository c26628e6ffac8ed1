"""The block: a drawn diagram of one Transformer block beside its pseudo-code (app/panels/block/code.py), each line
leading to the view that shows its tensor; the whole model; the four changes LLaMA made to the original
Transformer; and the numbers flowing through the selected layer.

The diagrams are Plotly shapes and annotations (no image files), so they export as PNG like every chart. Boxes are
sized to their text, at a font chosen so the whole chain fits a 700 px wide figure (a 768 px screen).
"""
from __future__ import annotations

from functools import partial
import math
import unicodedata

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from app import plots
from app.context import ViewContext, plain
from app.figure_text import Sizes
from app.panels.block import code as blockcode
from app.sections import section
from explorer_model.analysis import views_data as V

MIN_WIDTH_PX = 700  # the narrowest figure the labels must fit (768 px screen minus the page's padding)
PAD_PX, GAP_PX, ADD_R_PX, FONT_MAX, FONT_MIN = 6, 24, 15, 12, 8
BOX_H = 0.42  # the model chain: box half-height in y units (of 1.5 over its 130 px plot)
BLOCK_PLOT_PX = 320  # the narrowest plot area of the block drawing (its column at a 768 px screen is ~330 px)
V_CX, V_HALF_W, V_SKIP_X, V_GAP_PX, LINE = 140, 128, 290, 20, 1.3  # block drawing: centre, box, skip line, gaps
EM_LATIN, EM_WIDE = 0.62, 1.0  # rendered width of a character, in font sizes (bold sans-serif, CJK)
COLOURS = {"io": "#e5e7eb", "norm": "#fde68a", "attention": "#bfdbfe", "rope": "#ddd6fe", "ffn": "#bbf7d0",
           "add": "#fecaca", "embed": "#fed7aa", "block": "#e0e7ff", "out": "#a5f3fc"}


def _shape(*dims) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"


def text_em(text: str) -> float:
    """Width of the widest line of an annotation text (lines split at <br>, tags dropped), in font sizes."""
    lines = text.replace("<b>", "").replace("</b>", "").split("<br>")
    return max(sum(EM_WIDE if unicodedata.east_asian_width(c) in "WF" else EM_LATIN for c in line) for line in lines)


# --------------------------------------------------------------------------- diagram layout (pure)
def block_nodes(cfg, T: int, placement: str, t) -> tuple[list[dict], list[tuple[int, int]]]:
    """Main-line nodes left to right, and residual skips (split after node i, rejoin at add node j)."""
    D = cfg.d_model
    norm = "RMSNorm" if cfg.norm_type == "rms" else "LayerNorm"
    ffn = "SwiGLU" if cfg.ffn_type == "swiglu" else t("block.diagram.relu_ffn")
    heads = f"GQA {cfg.n_heads}/{cfg.n_kv_heads}" if cfg.n_rep > 1 else t("block.diagram.heads", n=cfg.n_heads)

    def box(kind, label, shape):
        return {"kind": kind, "label": label, "shape": shape}

    x_in = box("io", t("block.diagram.x"), _shape(1, T, D))
    attn = box("attention", t("block.diagram.attention") + "<br>" + t("block.diagram.causal", heads=heads), _shape(1, T, D))
    mlp = box("ffn", ffn, _shape(1, T, D))
    if placement == "post":  # the output y is the last norm's
        nodes = [x_in, attn, box("add", "+", "h′ " + _shape(1, T, D)), box("norm", f"{norm} (ln1)", "h " + _shape(1, T, D)),
                 mlp, box("add", "+", _shape(1, T, D)), box("norm", f"{norm} (ln2)", "y " + _shape(1, T, D))]
        skips = [(0, 2), (3, 5)]
    else:  # the output y is the last add's
        nodes = [x_in, box("norm", f"{norm} (ln1)", _shape(1, T, D)), attn, box("add", "+", "h " + _shape(1, T, D)),
                 box("norm", f"{norm} (ln2)", _shape(1, T, D)), mlp, box("add", "+", "y " + _shape(1, T, D))]
        skips = [(0, 3), (3, 6)]
    return nodes, skips


def chain_figure(nodes: list[dict], title: str, height: int, width_px: int = MIN_WIDTH_PX,
                 min_font: int = FONT_MIN) -> go.Figure:
    """Boxes left to right joined by arrows (the whole model), full width. x units are pixels of a `width_px` wide
    figure; each box is as wide as its text at the largest font (≤ FONT_MAX, at least min_font) at which the chain
    fits that width. A chain that does not fit at min_font (a phone) runs top to bottom instead."""
    ems = [max(text_em(n["label"]), text_em(n["shape"])) for n in nodes]
    room = width_px - 20 - 2 * PAD_PX * len(nodes) - GAP_PX * (len(nodes) - 1)
    if room / sum(ems) < min_font:
        return _chain_down(nodes, title, ems, width_px, min_font)
    font = int(max(min_font, min(max(FONT_MAX, min_font), room / sum(ems))))
    half = [font * e / 2 + PAD_PX for e in ems]
    xs = [10 + sum(2 * h + GAP_PX for h in half[:i]) + half[i] for i in range(len(nodes))]
    shapes = [dict(type="rect", x0=x - w, x1=x + w, y0=-BOX_H, y1=BOX_H, fillcolor=COLOURS[n["kind"]],
                   line=dict(color="#374151", width=1.5)) for x, w, n in zip(xs, half, nodes)]
    notes = [dict(x=x, y=0, text=f"<b>{n['label']}</b><br>{n['shape']}", showarrow=False,
                  font=dict(size=font, color="#111827")) for x, n in zip(xs, nodes)]
    notes += [dict(x=xs[i + 1] - half[i + 1], y=0, ax=xs[i] + half[i], ay=0, xref="x", yref="y", axref="x", ayref="y",
                   text="", showarrow=True, arrowhead=2, arrowsize=1.2, arrowwidth=1.6, arrowcolor="#374151")
              for i in range(len(nodes) - 1)]
    return go.Figure(layout=dict(
        shapes=shapes, annotations=notes, title=title, height=height, margin=dict(l=10, r=10, t=50, b=10),
        xaxis=dict(visible=False, range=[0, max(width_px - 20, xs[-1] + half[-1] + 10)], fixedrange=True),
        yaxis=dict(visible=False, range=[-0.75, 0.75], fixedrange=True), showlegend=False, plot_bgcolor="white",
        paper_bgcolor="white", dragmode=False))


def _chain_down(nodes: list[dict], title: str, ems: list[float], width_px: int, font: int) -> go.Figure:
    """The chain top to bottom, boxes centred and as wide as the widest text; units are pixels both ways."""
    half_w = max(ems) * font / 2 + PAD_PX
    box_h = 2 * font * LINE + 2 * PAD_PX
    cx, ys = width_px / 2 - 10, [-(i * (box_h + V_GAP_PX) + box_h / 2) for i in range(len(nodes))]
    shapes = [dict(type="rect", x0=cx - half_w, x1=cx + half_w, y0=y - box_h / 2, y1=y + box_h / 2,
                   fillcolor=COLOURS[n["kind"]], line=dict(color="#374151", width=1.5)) for y, n in zip(ys, nodes)]
    notes = [dict(x=cx, y=y, text=f"<b>{n['label']}</b><br>{n['shape']}", showarrow=False,
                  font=dict(size=font, color="#111827")) for y, n in zip(ys, nodes)]
    notes += [dict(x=cx, y=ys[i + 1] + box_h / 2, ax=cx, ay=ys[i] - box_h / 2, xref="x", yref="y", axref="x",
                   ayref="y", text="", showarrow=True, arrowhead=2, arrowsize=1.2, arrowwidth=1.6, arrowcolor="#374151")
              for i in range(len(nodes) - 1)]
    bottom = ys[-1] - box_h / 2 - 4
    return go.Figure(layout=dict(
        shapes=shapes, annotations=notes, title=title, height=math.ceil(-bottom + 8) + 60,
        margin=dict(l=10, r=10, t=50, b=10),
        xaxis=dict(visible=False, range=[0, width_px - 20], fixedrange=True),
        yaxis=dict(visible=False, range=[bottom, 4], fixedrange=True), showlegend=False, plot_bgcolor="white",
        paper_bgcolor="white", dragmode=False))


def block_figure(cfg, T: int, placement: str, t, min_font: int = FONT_MIN) -> go.Figure:
    """One block drawn top to bottom, to stand beside its pseudo-code in a column at least BLOCK_PLOT_PX wide;
    placement "pre" (LLaMA: x + F(Norm(x))) or "post" (original Transformer: Norm(x + F(x))). Units are pixels in
    both directions (the figure's height is the drawing's), so text and boxes are sized together; text is at
    least min_font px, the boxes widening for it."""
    nodes, skips = block_nodes(cfg, T, placement, t)
    qk = (f"Q {_shape(1, cfg.n_heads, T, cfg.head_dim)}<br>K, V {_shape(1, cfg.n_kv_heads, T, cfg.head_dim)}"
          f"<br>{t('block.diagram.scores')} {_shape(1, cfg.n_heads, T, T)}")
    inner = (f"W_gate·n, W_up·n: {_shape(1, T, cfg.d_ff)}<br>SiLU(gate) ⊙ up → W_down" if cfg.ffn_type == "swiglu"
             else f"ReLU(W_up·n): {_shape(1, T, cfg.d_ff)}<br>→ W_down")
    texts = []
    for n in nodes:
        detail = (f"<br><i>{t('block.diagram.rope')}</i><br>{qk}" if n["kind"] == "attention" else
                  f"<br>{inner}" if n["kind"] == "ffn" else "")
        texts.append("" if n["kind"] == "add" else f"<b>{n['label']}</b><br>{n['shape']}{detail}")
    widest = max(text_em(x) for x in texts if x)
    font = int(max(min_font, min(FONT_MAX, (2 * V_HALF_W - 2 * PAD_PX) / widest)))
    half_w = max(V_HALF_W, widest * font / 2 + PAD_PX)
    cx = V_CX + half_w - V_HALF_W
    skip_x = cx + V_SKIP_X - V_CX + half_w - V_HALF_W
    shapes, notes, ys, y = [], [], [], 0.0
    for n, text in zip(nodes, texts):
        h = 2 * ADD_R_PX if n["kind"] == "add" else (text.count("<br>") + 1) * font * LINE + 2 * PAD_PX
        ys.append((y - h / 2, h / 2))
        y -= h + V_GAP_PX
    for n, text, (cy, hh) in zip(nodes, texts, ys):
        if n["kind"] == "add":
            shapes.append(dict(type="circle", x0=cx - ADD_R_PX, x1=cx + ADD_R_PX, y0=cy - hh, y1=cy + hh,
                               fillcolor=COLOURS["add"], line=dict(color="#374151", width=1.5)))
            notes.append(dict(x=cx, y=cy, text="<b>+</b>", showarrow=False, font=dict(size=font + 3, color="#111827")))
            notes.append(dict(x=cx - ADD_R_PX - 6, y=cy, text=n["shape"], showarrow=False, xanchor="right",
                              font=dict(size=font, color="#374151")))
        else:
            shapes.append(dict(type="rect", x0=cx - half_w, x1=cx + half_w, y0=cy - hh, y1=cy + hh,
                               fillcolor=COLOURS[n["kind"]], line=dict(color="#374151", width=1.5)))
            notes.append(dict(x=cx, y=cy, text=text, showarrow=False, font=dict(size=font, color="#111827")))
    for (c0, h0), (c1, h1) in zip(ys, ys[1:]):
        notes.append(dict(x=cx, y=c1 + h1, ax=cx, ay=c0 - h0, xref="x", yref="y", axref="x", ayref="y", text="",
                          showarrow=True, arrowhead=2, arrowsize=1.2, arrowwidth=1.6, arrowcolor="#374151"))
    for a, b in skips:  # the residual: a bypass from the split point straight into the add
        split = ys[a][0] - ys[a][1] - V_GAP_PX / 2
        end = ys[b][0]
        shapes.append(dict(type="path", path=f"M {cx},{split} L {skip_x},{split} L {skip_x},{end}",
                           line=dict(color="#dc2626", width=2)))
        notes.append(dict(x=cx + ADD_R_PX, y=end, ax=skip_x, ay=end, xref="x", yref="y", axref="x", ayref="y",
                          text="", showarrow=True, arrowhead=2, arrowwidth=2, arrowcolor="#dc2626"))
        notes.append(dict(x=skip_x + 4, y=(split + end) / 2, text=t("block.diagram.residual"), textangle=-90,
                          showarrow=False, xanchor="left", font=dict(size=font, color="#dc2626")))
    title = t("block.diagram.title_post") if placement == "post" else t("block.diagram.title_pre")
    bottom = ys[-1][0] - ys[-1][1] - 4
    return go.Figure(layout=dict(
        shapes=shapes, annotations=notes, title=dict(text=f"{title}<br>T = {T}, D = {cfg.d_model}"),
        height=math.ceil(-bottom + 8) + 70, margin=dict(l=10, r=10, t=60, b=10),
        xaxis=dict(visible=False, range=[0, max(BLOCK_PLOT_PX, skip_x + 30)], fixedrange=True),
        yaxis=dict(visible=False, range=[bottom, 8], fixedrange=True), showlegend=False, plot_bgcolor="white",
        paper_bgcolor="white", dragmode=False))


def model_figure(cfg, T: int, t, width_px: int = MIN_WIDTH_PX, min_font: int = FONT_MIN) -> go.Figure:
    """token ids -> embedding -> block × N -> (final norm) -> output linear -> logits."""
    D, norm = cfg.d_model, "RMSNorm" if cfg.norm_type == "rms" else "LayerNorm"
    nodes = [{"kind": "io", "label": t("block.model.ids"), "shape": _shape(1, T)},
             {"kind": "embed", "label": t("block.model.embed"), "shape": _shape(1, T, D)},
             {"kind": "block", "label": t("block.model.blocks", n=cfg.n_layers), "shape": _shape(1, T, D)}]
    if cfg.norm_placement == "pre":
        nodes.append({"kind": "norm", "label": t("block.model.final_norm", norm=norm), "shape": _shape(1, T, D)})
    tied = "<br>" + t("block.model.tied") if cfg.tie_embeddings else ""
    nodes += [{"kind": "out", "label": t("block.model.output") + tied, "shape": f"{D} → {cfg.vocab_size}"},
              {"kind": "io", "label": "logits", "shape": _shape(1, T, cfg.vocab_size)}]
    return chain_figure(nodes, t("block.model.title", n=cfg.n_layers), 190, width_px, min_font)


# --------------------------------------------------------------------------- numbers through one layer (pure)
def flow_rows(rec, layer: int, token: int, t) -> list[dict]:
    """Norms and RMS divisors inside one block, for the selected token and averaged over all tokens."""
    def vec_norm(name):
        return rec[f"blocks.{layer}.{name}"][0].float().norm(dim=-1).numpy()  # [T]

    def scale(name):
        return rec[f"blocks.{layer}.{name}.hook_scale"][0, :, 0].float().numpy()

    x, a, h = vec_norm("hook_resid_pre"), vec_norm("hook_attn_out"), vec_norm("hook_resid_mid")
    m, y = vec_norm("hook_mlp_out"), vec_norm("hook_resid_post")
    items = [("x", t("block.flow.x"), x), ("ln1", t("block.flow.ln1"), scale("ln1")), ("attn", t("block.flow.attn"), a),
             ("attn_ratio", t("block.flow.attn_ratio"), a / x), ("h", t("block.flow.h"), h),
             ("ln2", t("block.flow.ln2"), scale("ln2")), ("ffn", t("block.flow.ffn"), m),
             ("ffn_ratio", t("block.flow.ffn_ratio"), m / h), ("y", t("block.flow.y"), y)]
    return [{"key": key, "quantity": label, "token": float(v[token]), "mean": float(np.mean(v))}
            for key, label, v in items]


def layer_norms_data(rec, token: int) -> dict[str, np.ndarray]:
    """Per-layer norms at one token: residual stream, attention output, FFN output."""
    return {k: V.stack_norms(rec, k, token) for k in ("hook_resid_pre", "hook_attn_out", "hook_mlp_out")}


def layer_norms_figure(data: dict[str, np.ndarray], layer: int, label: str, t) -> go.Figure:
    names = {"hook_resid_pre": t("block.norms.resid"), "hook_attn_out": t("block.norms.attn"),
             "hook_mlp_out": t("block.norms.ffn")}
    fig = go.Figure()
    for k, v in data.items():
        fig.add_scatter(x=list(range(len(v))), y=v, mode="lines+markers", name=names[k],
                        hovertemplate=f"{names[k]}<br>%{{x}}: %{{y:.3f}}<extra></extra>")
    fig.add_vline(x=layer, line=dict(color="#dc2626", dash="dash"))
    fig.update_layout(title=t("block.norms.title", label=label), xaxis_title=t("block.norms.layer"),
                      yaxis_title=t("block.norms.y"), yaxis_type="log",
                      height=330, margin=dict(l=10, r=10, t=40, b=10), legend=dict(orientation="h", y=-0.25))
    fig.update_yaxes(minor=dict(showgrid=False))
    return fig


# --------------------------------------------------------------------------- sections
def draw_diagrams(ctx: ViewContext) -> None:
    """The block's diagram and, beside it (under it on a phone), its pseudo-code: two parts, so a lecture step about
    the code lands on it where the screen stacks them."""
    t, cfg, T = ctx.t, ctx.cfg, len(ctx.ids)
    font = Sizes.for_screen(ctx.presenter).text  # the smallest text a figure may have on this screen
    left, right = st.columns(2)
    with left, section("block", "diagram"):
        plots.show(lambda: block_figure(cfg, T, cfg.norm_placement, t, font), ctx, key="block_diagram",
                   filename="block", share=0.5)
    with right, section("block", "code"):
        blockcode.draw_code(ctx)


def draw_model(ctx: ViewContext) -> None:
    """Buttons from the diagram's parts to their views, the block's equations, and the whole model's diagram."""
    t, cfg, T = ctx.t, ctx.cfg, len(ctx.ids)
    font = Sizes.for_screen(ctx.presenter).text
    blockcode.draw_node_buttons(ctx)
    with plots.explainer(ctx, t("block.intro.more")):
        st.markdown(t("block.intro.text"))
        if cfg.norm_placement == "post":
            st.latex(r"h = \mathrm{Norm}\big(x + \mathrm{Attn}(x)\big),\qquad "
                     r"y = \mathrm{Norm}\big(h + \mathrm{FFN}(h)\big)")
        else:
            st.latex(r"h = x + \mathrm{Attn}\big(\mathrm{RMSNorm}(x)\big)")
            st.latex(r"y = h + W_{down}\big(\mathrm{SiLU}(W_{gate}\,n) \odot W_{up}\,n\big),\qquad n = \mathrm{RMSNorm}(h)")
    plots.show(partial(model_figure, cfg, T, t, ctx.screen.main, font), ctx, key="block_model_diagram", filename="model")


def flow_frame(ctx: ViewContext) -> pd.DataFrame:
    t = ctx.t
    return pd.DataFrame([{t("block.flow.col_quantity"): r["quantity"], t("block.flow.col_token", pos=ctx.token): r["token"],
                          t("block.flow.col_mean"): r["mean"]} for r in flow_rows(ctx.rec, ctx.layer, ctx.token, t)])


def draw_flow(ctx: ViewContext) -> None:
    t, L = ctx.t, ctx.layer
    st.subheader(t("block.flow.title", layer=L))
    frame = partial(flow_frame, ctx)  # the table and the figure: built once per selection (kept by plots)
    left, right = st.columns([2, 3])
    with left:
        plots.table(ctx, frame, key="block_flow")
        plots.csv_button(ctx, t("block.flow.csv"), t("block.flow.csv"), lambda: frame().to_csv(index=False),
                         f"block_{L}_numbers.csv", "block_csv_flow")
    with right:
        plots.show(lambda: layer_norms_figure(layer_norms_data(ctx.rec, ctx.token), L, ctx.labels[ctx.token], t),
                   ctx, key="block_layer_norms", filename="block_norms_by_layer", share=0.6)
    with plots.explainer(ctx, t("block.flow.more")):
        st.markdown(t("block.flow.explain", label=plain(ctx.labels[ctx.token]), n=len(ctx.ids)))


def draw(ctx: ViewContext) -> None:
    st.subheader(ctx.t("block.title"))
    draw_diagrams(ctx)
    with section("block", "model"):
        draw_model(ctx)
    with section("block", "changes"):
        blockcode.draw_changes(ctx)
    with section("block", "flow"):
        draw_flow(ctx)
