"""SwiGLU view: the FFN is position-wise. Another token of the prompt is replaced (the changed
prompt is recorded through the gateway); per position, the FFN input and output of the two runs are compared, and
the selected token's FFN output is recomputed from its recorded input alone with the layer's weights."""
from __future__ import annotations

from functools import partial

import numpy as np
import plotly.graph_objects as go
import streamlit as st

from app import choice_state, gateway, plots, sections
from app.context import ViewContext, display_piece, plain
from explorer_model.analysis import ffn as F

DEFAULT_WORD = " dog"


def replaced_ids(ids: list[int], pos: int, new_id: int) -> list[int]:
    return [new_id if i == pos else x for i, x in enumerate(ids)]


def recompute(ctx: ViewContext, rec, pos: int) -> dict:
    """FFN output at pos from the recorded input there (γ of ln2 ⊙ normalized) and the layer's weights."""
    w = gateway.layer_weights(ctx.source, ctx.layer)
    return F.ffn_at_position(rec, ctx.layer, pos, w["W_up"], w["W_down"], w.get("W_gate"),
                             ctx.facts.gammas.get(f"blocks.{ctx.layer}.ln2"))


def diff_figure(cmp: dict, labels, changed: int, selected: int, layer: int, t) -> go.Figure:
    x = list(labels)
    fig = go.Figure([
        go.Bar(x=x, y=cmp["input_diff"], name=t("swiglu.pw_input"), meta="input_diff", marker_color="#4c78a8"),
        go.Bar(x=x, y=cmp["output_diff"], name=t("swiglu.pw_output"), meta="output_diff", marker_color="#f58518"),
    ])
    fig.add_vline(x=changed, line_dash="dash", line_color="#e45756", annotation_text=t("swiglu.pw_replaced"),
                  annotation_position="top left" if changed > len(x) / 2 else "top right")
    if selected != changed:
        fig.add_vline(x=selected, line_dash="dot", line_color="#555555", annotation_text=t("swiglu.pw_selected"),
                      annotation_position="top left" if selected > len(x) / 2 else "top right")  # inward
    fig.update_layout(barmode="group", title=t("swiglu.pw_title", layer=layer), xaxis_title=t("swiglu.token"),
                      yaxis_title=t("swiglu.pw_axis"), height=380, margin=dict(l=10, r=10, t=50, b=10),
                      legend=dict(orientation="h", y=-0.3), meta={"id": "swiglu_positionwise"})
    fig.update_xaxes(type="category")
    return fig


def _choose(ctx: ViewContext) -> tuple[int, int | None, str]:
    """(position to change, replacement token id or None, what was typed)."""
    t, T = ctx.t, len(ctx.ids)
    # the middle of the prompt by default, whatever token is selected: a view, layer or token switch never needs a
    # new changed recording (the tokens before it keep their FFN input, so must keep their output)
    default = T // 2
    choice_state.start("swiglu_pw_pos", default, hi=T - 1)
    choice_state.start("swiglu_pw_word", DEFAULT_WORD)
    c1, c2 = st.columns(2)
    pos = int(c1.selectbox(t("swiglu.pw_pos"), range(T), key="swiglu_pw_pos",
                           format_func=lambda i: ctx.labels[i]))
    word = c2.text_input(t("swiglu.pw_word"), key="swiglu_pw_word")
    ids = [i for i in gateway.encode_prompt(ctx.source, word or "", 8)[0] if i != ctx.facts.bos_id]
    return pos, (ids[0] if ids else None), word or ""


def draw(ctx: ViewContext) -> None:
    t = ctx.t
    st.subheader(t("swiglu.pw_heading"))
    if len(ctx.ids) < 2:
        st.info(t("swiglu.pw_short"))
        return
    # a second recording (the prompt with a word replaced): run when asked for, or when a step or link is about it
    if not choice_state.start("swiglu_pw_go") and sections.current("swiglu") != "positionwise":
        st.button(t("swiglu.pw_go"), key="swiglu_pw_run",
                  on_click=lambda: st.session_state.update(swiglu_pw_go=True))
        return
    pos, new_id, word = _choose(ctx)
    if new_id is None:
        st.info(t("swiglu.pw_no_word"))
        return
    if new_id == ctx.ids[pos]:
        st.info(t("swiglu.pw_same_token"))
        return
    ids_b = replaced_ids(ctx.ids, pos, new_id)
    rec_b = gateway.recording(ctx.source, ids_b, base=ctx.ids)  # the positions before `pos` do not run again
    new_piece = display_piece(ctx.facts.piece(new_id))
    st.caption(t("swiglu.pw_used", pos=pos, old=plain(ctx.pieces[pos]), new=plain(new_piece), word=plain(word)))
    cmp = F.position_wise_comparison(ctx.rec, rec_b, ctx.layer)
    plots.show(partial(diff_figure, cmp, ctx.labels, pos, ctx.token, ctx.layer, t), ctx, key="swiglu_pw_fig",
               filename=f"ffn_position_wise_L{ctx.layer}")
    same = ~cmp["input_changed"]
    if same.any():
        st.markdown(t("swiglu.pw_result", n_same=int(same.sum()), n=len(ctx.ids), out_max=float(cmp["output_diff"][same].max()),
                      n_changed=int(cmp["input_changed"].sum()), pos=pos))
    else:  # the first token replaced: every later token sees it, so no position keeps its input
        st.markdown(t("swiglu.pw_all_changed", n=len(ctx.ids)))
    a, b = recompute(ctx, ctx.rec, ctx.token), recompute(ctx, rec_b, ctx.token)
    st.markdown(t("swiglu.pw_recompute", token=plain(ctx.labels[ctx.token]), layer=ctx.layer,
                  diff_a=f"{a['max_abs_diff']:.1e}", diff_b=f"{b['max_abs_diff']:.1e}",
                  scale=f"{float(np.abs(a['recorded']).max()):.3g}",
                  input_diff=f"{float(cmp['input_diff'][ctx.token]):.3g}",
                  output_diff=f"{float(cmp['output_diff'][ctx.token]):.3g}"))
    with plots.explainer(ctx, t("swiglu.pw_explain")):
        st.markdown(t("swiglu.pw_why"))
