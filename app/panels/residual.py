"""Residual stream and prediction view: norms, what each sub-layer adds, a logit lens, and next-token choice.

Drawing reads only the recording; the logit lens is asked of the gateway (cached). The buttons that append a token change the prompt, and
the app records the new prompt once (cached) on the next run.
"""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import streamlit as st

from app import explorer, plots
from app.context import ViewContext, display_piece, plain
from explorer_model.analysis import views_data as V

LENS_MAX_POS = 40  # the logit lens costs layers × positions × d_model × vocab; show the last 40 positions
N_DIST = 15
STEP_NAMES = [("raw", "原始"), ("temperature", "温度"), ("top-k", "top-k"), ("top-p", "top-p")]


# ----------------------------------------------------------------------------- pure data / figures
def norms_data(rec) -> np.ndarray:
    """‖x‖₂ of the residual stream: rows = resid_pre of every layer, then the last block's resid_post."""
    return V.residual_norms(rec)


def norm_colour_cap(norms: np.ndarray) -> float | None:
    """Colour-scale top that ignores the token with the largest norm, or None if that changes nothing."""
    if norms.shape[1] < 2:
        return None
    rest = np.delete(norms, norms.max(0).argmax(), axis=1).max()
    return float(rest) if rest < 0.5 * norms.max() else None


def contributions_data(rec) -> tuple[np.ndarray, np.ndarray]:
    """‖attn_out‖ and ‖mlp_out‖ per layer and token: two [layer, pos] arrays."""
    return V.stack_norms(rec, "hook_attn_out"), V.stack_norms(rec, "hook_mlp_out")


def contributions_figure(attn, mlp, token: int, piece: str, t) -> go.Figure:
    x = list(range(attn.shape[0]))
    fig = go.Figure([
        go.Bar(x=x, y=attn.mean(1), name=t("residual.attention_mean_over_tokens"), marker_color="#1f77b4"),
        go.Bar(x=x, y=mlp.mean(1), name=t("residual.ffn_mean_over_tokens"), marker_color="#ff7f0e"),
        go.Scatter(x=x, y=attn[:, token], mode="lines+markers", name=t("residual.attention_token", piece=piece),
                   line=dict(color="#0b3d91")),
        go.Scatter(x=x, y=mlp[:, token], mode="lines+markers", name=t("residual.ffn_token", piece=piece),
                   line=dict(color="#a64500")),
    ])
    fig.update_layout(barmode="group", title=t("residual.how_much_each_sub_layer"),
                      xaxis_title=t("residual.layer"), yaxis_title=t("residual.log_scale"),
                      yaxis_type="log", margin=dict(l=10, r=10, t=50, b=10),
                      legend=dict(orientation="h", y=-0.2))
    return fig


def logit_lens_figure(top_ids, top_probs, piece, labels, t) -> go.Figure:
    text = [[display_piece(piece(int(i))) for i in row] for row in top_ids]
    fig = plots.heatmap(top_probs, labels, [f"L{l}" for l in range(top_probs.shape[0])], zmin=0, zmax=1,
                        colorscale="Blues", title=t("residual.logit_lens_what_each_layer"),
                        x_title=t("residual.position_predicting_the_token_after"),
                        y_title=t("residual.after_layer"), value_name=t("residual.probability"))
    fig.update_traces(text=text, texttemplate="%{text}", textfont=dict(size=10),
                      hovertemplate="%{y} · %{x}<br>%{text}: %{z:.3f}<extra></extra>")
    return fig


def steps_data(logits, temperature: float, top_k: int, top_p: float, n: int = N_DIST, seed: int = 0,
               n_ctx: int = 0) -> dict:
    """The n most likely tokens' probabilities after each filtering step, how many tokens survive each, and the
    token one reproducible draw picks (same prompt length n_ctx and seed, same draw)."""
    return V.sampling_steps(logits, temperature, top_k, top_p, n, seed, n_ctx)


def steps_figure(data: dict, piece, t) -> go.Figure:
    x = [f"{r}:{display_piece(piece(int(i)))}" for r, i in enumerate(data["ids"])]
    colours = ["#aaaaaa", "#1f77b4", "#2ca02c", "#d62728"]
    fig = go.Figure([go.Bar(x=x, y=data["probs"][s], customdata=data["ids"], marker_color=colours[s],
                            name=f"{t(*STEP_NAMES[s])} ({data['survivors'][s]})",
                            hovertemplate="%{x} (id %{customdata})<br>p = %{y:.4f}<extra></extra>")
                     for s in range(4)])
    fig.update_layout(barmode="group", title=t("residual.next_token_probabilities_after_each"),
                      xaxis_title=t("residual.token_rank_text"), yaxis_title=t("residual.probability"),
                      margin=dict(l=10, r=10, t=50, b=10), legend=dict(orientation="h", y=-0.3))
    fig.update_xaxes(type="category")
    return fig


def base_ids(facts, ids: list[int]) -> list[int]:
    """The ids the prompt text itself produced (without a BOS the app put in front)."""
    if facts.add_bos and ids and ids[0] == facts.bos_id:
        return ids[1:]
    return list(ids)


# ----------------------------------------------------------------------------- drawing
def draw(ctx: ViewContext) -> None:
    draw_intro(ctx)
    draw_norms(ctx)
    draw_contributions(ctx)
    draw_lens(ctx)
    draw_prediction(ctx)


def draw_intro(ctx: ViewContext) -> None:
    t = ctx.t
    st.markdown(t("residual.think_of_the_residual_stream"))
    st.latex(r"h_l = x_l + \mathrm{Attn}(\mathrm{RMSNorm}(x_l)),\quad x_{l+1} = h_l + \mathrm{FFN}(\mathrm{RMSNorm}(h_l))")
    st.latex(r"\text{logits} = W_\text{out}\,\mathrm{RMSNorm}(x_L),\qquad p = \mathrm{softmax}(\text{logits}/T)")


def draw_norms(ctx: ViewContext) -> None:
    t, n_layers = ctx.t, ctx.cfg.n_layers
    st.subheader(t("residual.size_of_the_residual_stream"))
    norms = norms_data(ctx.rec)
    rows = [f"L{l} in" for l in range(n_layers)] + [f"L{n_layers - 1} out"]
    log = st.toggle(t("residual.colour_by_log_one_huge"),
                    key="residual_log")
    cap = norm_colour_cap(norms)
    fig = plots.heatmap(np.log10(norms) if log else norms, ctx.labels, rows, colorscale="Viridis",
                        zmin=None if log or cap is None else 0.0, zmax=None if log or cap is None else cap,
                        title=t("residual.x_per_layer_and_token"), x_title=t("residual.token"),
                        y_title=t("residual.residual_stream_entering_layer"),
                        value_name="log10 ‖x‖₂" if log else "‖x‖₂", fmt=".3f" if log else ".2f")
    plots.show(fig, ctx, key="residual_norms", height=min(900, 200 + 18 * len(rows)))
    capped = "" if log or cap is None else t("residual.colours_stop_at_so_the", cap=cap)
    st.caption(t("residual.each_block_only_adds_to") + capped)
    plots.csv_button(ctx, "Residual norms (CSV)", "残差范数（CSV）", lambda: plots.matrix_csv(norms, rows, ctx.labels, "layer"),
                     "residual_norms.csv", key="residual_csv_norms")


def draw_contributions(ctx: ViewContext) -> None:
    attn, mlp = contributions_data(ctx.rec)
    fig = contributions_figure(attn, mlp, ctx.token, ctx.pieces[ctx.token], ctx.t)
    plots.show(fig, ctx, key="residual_contrib", height=420)


def draw_lens(ctx: ViewContext) -> None:
    t, T = ctx.t, len(ctx.ids)
    st.subheader(t("residual.logit_lens"))
    start = max(0, T - LENS_MAX_POS)
    with st.spinner(t("residual.applying_the_output_layer_to")):
        top_ids, top_probs = explorer.logit_lens(ctx.source, ctx.ids, start)
    fig = logit_lens_figure(top_ids, top_probs, ctx.facts.piece, ctx.labels[start:], t)
    plots.show(fig, ctx, key="residual_lens", height=min(1000, 160 + 22 * top_ids.shape[0]))
    st.caption(t("We pretend each layer were the last: its output goes through the final RMSNorm and the output matrix. "
                 "Cell text = the most likely next token, colour = its probability. The bottom row is the model's real "
                 "prediction." + (f" Only the last {LENS_MAX_POS} positions are shown." if start else ""),
                 "假装每一层都是最后一层：把它的输出送进最终的 RMSNorm 和输出矩阵。格子里的文字是最可能的下一个 token，"
                 "颜色是它的概率。最下面一行就是模型真正的预测。" + (f"只显示最后 {LENS_MAX_POS} 个位置。" if start else "")))

    def csv() -> str:
        piece = ctx.facts.piece
        rows = ([l, start + p, ctx.pieces[start + p], int(top_ids[l, p]), piece(int(top_ids[l, p])), float(top_probs[l, p])]
                for l in range(top_ids.shape[0]) for p in range(top_ids.shape[1]))
        return plots.to_csv(["layer", "position", "token", "top_id", "top_token", "probability"], rows)
    plots.csv_button(ctx, "Logit lens (CSV)", "Logit lens（CSV）", csv, "logit_lens.csv", key="residual_csv_lens")


def _append(after: str, entry: dict) -> None:
    st.session_state.setdefault("pred_history", []).append(entry)
    st.session_state["prompt"] = after


def _undo() -> None:
    hist = st.session_state.get("pred_history") or []
    if hist:
        st.session_state["prompt"] = hist.pop()["before"]


def draw_prediction(ctx: ViewContext) -> None:
    t, tok = ctx.t, ctx.facts
    st.subheader(t("residual.choosing_the_next_token"))
    st.markdown(t("residual.temperature_divides_the_logits_before"))
    c1, c2, c3, c4 = st.columns(4)
    temp = c1.slider(t("residual.temperature"), 0.0, 2.0, 1.0, 0.05, key="pred_temperature")
    top_k = int(c2.number_input(t("residual.top_k_0_off"), 0, ctx.cfg.vocab_size, 50, key="pred_top_k"))
    top_p = c3.slider("Top-p", 0.01, 1.0, 0.9, 0.01, key="pred_top_p")
    seed = int(c4.number_input(t("residual.sampling_seed"), 0, 2**31 - 1, 0, key="pred_seed"))

    hist = st.session_state.get("pred_history") or []
    if hist and hist[-1]["after"] != st.session_state.get("prompt"):
        hist.clear()  # the prompt was edited by hand: the history no longer leads to it
    rec, ids = ctx.rec, list(ctx.ids)
    if hist and hist[-1]["ids"] != ids:
        # decode(encode) did not round-trip: keep predicting from the explicit ids of the appended tokens
        ids = hist[-1]["ids"]
        rec = explorer.recording(ctx.source, ids)
        st.warning(t("residual.the_extended_text_splits_into"))

    data = steps_data(rec.logits[0, -1], temp, top_k, top_p, seed=seed, n_ctx=len(ids))
    plots.show(steps_figure(data, tok.piece, t), ctx, key="residual_steps", height=440)
    st.caption(t("residual.tokens_left_raw_temperature_top", data_survivors_0=data['survivors'][0], data_survivors_1=data['survivors'][1], data_survivors_2=data['survivors'][2], data_survivors_3=data['survivors'][3]))

    def csv() -> str:
        rows = ([r, int(i), tok.piece(int(i)), *data["probs"][:, r].tolist()] for r, i in enumerate(data["ids"]))
        table = plots.to_csv(["rank", "id", "token", "raw", "tempered", "top_k", "top_p"], rows)
        return table + plots.to_csv(["survivors", "", "", *data["survivors"]], [])
    plots.csv_button(ctx, "Distribution steps (CSV)", "分布各步骤（CSV）", csv, "next_token_steps.csv",
                     key="residual_csv_steps")

    raw, final = data["probs"][0], data["final"]
    greedy, sampled = data["greedy"], data["sampled"]
    base = base_ids(tok, ids)
    before = st.session_state.get("prompt", "")

    def entry(new: int, how: str) -> tuple[str, dict]:
        after = tok.decode(base + [new])
        new_ids = ids + [new]
        return after, {"before": before, "after": after, "ids": new_ids, "id": new, "piece": tok.piece(new),
                       "how": how, "p_raw": float(data["raw"][new]),
                       "p_final": float(final[new])}

    b1, b2, b3 = st.columns(3)
    top = plain(display_piece(tok.piece(greedy)))  # a button label is markdown
    b1.button(t("residual.take_the_top_token", top=top, raw_0=raw[0]),
              key="pred_greedy", on_click=_append, args=entry(greedy, "greedy"))
    b2.button(t("residual.sample_one"), key="pred_sample", on_click=_append, args=entry(sampled, "sampled"))
    b3.button(t("residual.undo"), key="pred_undo", on_click=_undo, disabled=not hist)
    if hist:
        st.dataframe({t("residual.step"): list(range(1, len(hist) + 1)),
                      t("residual.token"): [display_piece(h["piece"]) for h in hist],
                      t("residual.how"): [t("residual.top") if h["how"] == "greedy" else t("residual.sampled") for h in hist],
                      t("residual.p_raw"): [h["p_raw"] for h in hist],
                      t("residual.p_after_filters"): [h["p_final"] for h in hist]}, hide_index=True)
