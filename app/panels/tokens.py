"""Tokens and shapes: text -> ids -> embedding rows, whether the model starts with <bos>, then (app/panels/shapes.py)
every tensor's shape, parameters and memory for this model or a real LLaMA, and (app/panels/costs.py) what
attention and the KV cache cost as the prompt grows.

Everything comes from the recording and the model's facts (the embedding rows and the BOS comparison from the
gateway); nothing here runs the model itself.
"""
from __future__ import annotations

import html
from functools import partial

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from app import choice_state, gateway, plots
from app.context import ViewContext, plain
from app.sections import section
from app.panels import costs, shapes
from explorer_model import view_choices as VC
from explorer_model.analysis import lesson

CHIP_COLOURS = ("#fde68a", "#bfdbfe", "#bbf7d0", "#fecaca", "#ddd6fe", "#fed7aa", "#a5f3fc", "#f5d0fe")
DIM_CHOICES = (16, 32, 64, 128, 256)


# --------------------------------------------------------------------------- pure data
def token_rows(tokenizer, ids: list[int], pieces: list[str]) -> list[dict]:
    rows = []
    for pos, (i, piece) in enumerate(zip(ids, pieces)):
        raw = tokenizer.token_bytes(i)
        try:
            raw.decode("utf-8")
            whole = True
        except UnicodeDecodeError:
            whole = False
        rows.append({"position": pos, "piece": piece, "id": int(i), "bytes": raw.hex(" "),
                     "special": bool(tokenizer.is_special(i)), "whole_utf8": whole})
    return rows


def split_characters(tokenizer, ids: list[int], rows: list[dict]) -> list[tuple[int, int, str]]:
    """Groups of neighbouring tokens that are not valid UTF-8 alone but are together: (first, last, text)."""
    groups, start, buf = [], None, b""
    for r in rows:
        if start is None and r["whole_utf8"]:
            continue
        start = r["position"] if start is None else start
        buf += tokenizer.token_bytes(ids[r["position"]])
        try:
            text = buf.decode("utf-8")
        except UnicodeDecodeError:
            continue
        groups.append((start, r["position"], text))
        start, buf = None, b""
    if start is not None:  # cut off by the token limit in the middle of a character
        groups.append((start, len(rows) - 1, buf.decode("utf-8", errors="replace")))
    return groups


def chips_html(rows: list[dict], selected: int, bos_id: int | None = None) -> str:
    """Coloured chips, one per token; every piece of text is escaped (prompts are user input). A BOS token is
    drawn dark so the token the model did not get from the text stands out."""
    out = []
    for r in rows:
        bos = bos_id is not None and r["id"] == bos_id
        colour = "#1f2937" if bos else "#e5e7eb" if r["special"] else CHIP_COLOURS[r["position"] % len(CHIP_COLOURS)]
        ink = "#f9fafb" if bos else "#111827"
        border = "2px solid #dc2626" if r["position"] == selected else (
            "2px dashed #7c3aed" if not r["whole_utf8"] else "1px solid #9ca3af")
        tip = html.escape(f"{r['position']}: id {r['id']}, bytes {r['bytes']}", quote=True)
        out.append(
            f'<span title="{tip}" style="display:inline-block;margin:2px;padding:2px 6px;border-radius:6px;'
            f'background:{colour};color:{ink};border:{border};font-family:monospace;white-space:pre">'
            f'{html.escape(r["piece"])}<sub style="color:#9ca3af;margin-left:3px">{r["id"]}</sub></span>')
    return '<div style="line-height:2.1">' + "".join(out) + "</div>"


def bos_variants(ids: list[int], bos_id: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(the prompt without a leading BOS, the same prompt with the model's BOS in front)."""
    bare = tuple(ids[1:] if ids and ids[0] == bos_id else ids)
    return bare, (bos_id, *bare)


def sink_by_layer(rec, key: int = 0) -> np.ndarray:
    """Per layer: attention to position `key`, averaged over heads and over the queries after it."""
    return lesson.sink_share(rec, key).mean(axis=1)


# --------------------------------------------------------------------------- figures
def embedding_bar_figure(row: np.ndarray, label: str, n_dims: int, t) -> go.Figure:
    fig = go.Figure(go.Bar(x=list(range(n_dims)), y=row[:n_dims], marker_color="#2563eb",
                           hovertemplate="%{x}: %{y:.5f}<extra></extra>"))
    fig.update_layout(title=t("tokens.embed.bar_title", label=label, n=n_dims),
                      xaxis_title=t("tokens.axis.dimension"), yaxis_title=t("tokens.axis.value"), height=320,
                      margin=dict(l=10, r=10, t=40, b=10))
    return fig


def bos_figure(bare: np.ndarray, with_bos: np.ndarray, first_label: str, bos_label: str, t) -> go.Figure:
    layers = list(range(len(bare)))
    fig = go.Figure([go.Scatter(x=layers, y=bare, mode="lines+markers", name=t("tokens.bos.trace_bare",
                                                                                 label=first_label)),
                     go.Scatter(x=layers, y=with_bos, mode="lines+markers", name=t("tokens.bos.trace_bos",
                                                                                    label=bos_label))])
    fig.update_layout(title=t("tokens.bos.fig_title"), xaxis_title=t("tokens.axis.layer"),
                      yaxis_title=t("tokens.bos.fig_y"), yaxis_range=[0, 1], height=330,
                      margin=dict(l=10, r=10, t=40, b=10), legend=dict(orientation="h", y=-0.25))
    return fig


# --------------------------------------------------------------------------- sections
def draw_tokens(ctx: ViewContext) -> None:
    t = ctx.t
    st.markdown(t("tokens.pieces.intro", last=ctx.cfg.vocab_size - 1))
    rows = token_rows(ctx.facts, ctx.ids, ctx.pieces)
    st.markdown(chips_html(rows, ctx.token, ctx.facts.bos_id), unsafe_allow_html=True)
    draw_bos(ctx)
    runs = split_characters(ctx.facts, ctx.ids, rows)
    if runs:
        parts = "; ".join(f"{a}–{b} → “{plain(text)}”" if a != b else f"{a} → “{plain(text)}”" for a, b, text in runs)
        st.info(t("tokens.pieces.split", parts=parts))
    frame = partial(token_frame, rows, t)  # built once per prompt and language (plots.table keeps it)
    plots.table(ctx, frame, key="tokens_table", height=min(36 * (len(rows) + 1) + 4, 400))
    plots.csv_button(ctx, t("tokens.csv.tokens"), t("tokens.csv.tokens"), lambda: frame().to_csv(index=False),
                     "tokens.csv", "tokens_csv_table")


def token_frame(rows: list[dict], t) -> pd.DataFrame:
    return pd.DataFrame([{t("tokens.col.position"): r["position"], t("tokens.col.piece"): r["piece"], "id": r["id"],
                          t("tokens.col.bytes"): r["bytes"], t("tokens.col.n_bytes"): len(r["bytes"].split()),
                          t("tokens.col.special"): r["special"], t("tokens.col.whole"): r["whole_utf8"]}
                         for r in rows])


def draw_bos(ctx: ViewContext) -> None:
    """Does this model start with <bos> by itself, is one in front now, and what changes when it is."""
    t, facts = ctx.t, ctx.facts
    if facts.bos_id is None:
        st.caption(t("tokens.bos.none"))
        return
    piece = plain(facts.piece(facts.bos_id))
    first = bool(ctx.ids) and ctx.ids[0] == facts.bos_id
    adds = t("tokens.bos.adds", piece=piece, id=facts.bos_id) if facts.add_bos else \
        t("tokens.bos.not_added", piece=piece, id=facts.bos_id)
    if first and not ctx.extras.get("bos_added", True):
        st.info(adds + " " + t("tokens.bos.typed", piece=piece))
    elif first:
        st.success(adds + " " + t("tokens.bos.first", piece=piece, id=facts.bos_id, n=len(ctx.ids) - 1))
    else:
        st.info(adds + " " + t("tokens.bos.absent_presenter" if ctx.presenter else "tokens.bos.absent"))
    bare, with_bos = bos_variants(ctx.ids, facts.bos_id)
    if len(bare) < 2:
        return
    if not choice_state.start("tokens_bos_compare"):
        st.button(t("tokens.bos.compare"), key="tokens_bos_go",
                  on_click=lambda: st.session_state.update(tokens_bos_compare=True))
        return
    # Two recordings (one of them is the page's own, cached): attention to the first position with and without BOS
    rec_bare = ctx.rec if tuple(ctx.ids) == bare else gateway.recording(ctx.source, bare)
    rec_bos = ctx.rec if tuple(ctx.ids) == with_bos else gateway.recording(ctx.source, with_bos)
    # labels for the figure come from the page's token labels (plain() is for markdown only)
    first_label = ctx.pieces[1] if first else ctx.pieces[0]
    bos_label = ctx.pieces[0] if first else facts.piece(facts.bos_id)
    a, b = sink_by_layer(rec_bare), sink_by_layer(rec_bos)
    plots.show(lambda: bos_figure(a, b, first_label, bos_label, t), ctx, key="tokens_bos_fig", filename="bos_sink")
    st.caption(t("tokens.bos.caption", label=plain(first_label), piece=piece, bare=float(a.mean()), bos=float(b.mean())))


def draw_embedding(ctx: ViewContext) -> None:
    t = ctx.t
    st.subheader(t("tokens.embed.title"))
    emb = ctx.rec["hook_embed"][0].float().numpy()  # [T, D]
    tid = ctx.ids[ctx.token]
    weight_row = gateway.embedding_rows(ctx.source, [tid])[0]
    choices = [d for d in DIM_CHOICES if d < ctx.cfg.d_model] + [ctx.cfg.d_model]
    choice_state.start("tokens_embed_dims", min(VC.CHOICES["tokens_embed_dims"].default, ctx.cfg.d_model),
                       offered=choices)
    n_dims = st.select_slider(t("tokens.embed.dims"), choices, key="tokens_embed_dims")
    left, right = st.columns(2)
    with left:
        plots.show(partial(embedding_bar_figure, emb[ctx.token], ctx.labels[ctx.token], n_dims, t), ctx,
                   key="tokens_embed_bar", filename="embedding_row", share=0.5)
    with right:
        labels = ctx.labels  # the figure is named by the labels, not by the whole context's selection
        fig = lambda: plots.heatmap(  # noqa: E731  (built only when not cached: plots.show)
            emb[:, :n_dims], [str(d) for d in range(n_dims)], labels, colorscale="RdBu",
            zmid=0.0, title=t("tokens.embed.heat_title", n=n_dims),
            x_title=t("tokens.axis.dimension"), y_title="token", value_name=t("tokens.axis.value"))
        plots.show(fig, ctx, key="tokens_embed_heat", filename="embedding_rows", share=0.5)
    with plots.explainer(ctx, t("tokens.embed.more")):
        st.markdown(t("tokens.embed.explain"))
        st.latex(r"x_i = E[t_i] \in \mathbb{R}^{D},\quad E \in \mathbb{R}^{V\times D},\ "
                 rf"V={ctx.cfg.vocab_size},\ D={ctx.cfg.d_model}")
        st.caption(t("tokens.embed.check", pos=ctx.token, id=tid, diff=float(np.abs(emb[ctx.token] - weight_row).max())))


def draw(ctx: ViewContext) -> None:
    t = ctx.t
    st.subheader(t("tokens.title"))
    with section("tokens", "pieces"):
        draw_tokens(ctx)
        with plots.explainer(ctx, t("tokens.pipeline.more")):
            st.markdown(t("tokens.pipeline.explain"))
            st.latex(t("tokens.pipeline.latex", N=ctx.cfg.n_layers))
    with section("tokens", "embedding"):
        draw_embedding(ctx)
    shapes.draw(ctx)
    with section("tokens", "costs"):
        costs.draw(ctx)
