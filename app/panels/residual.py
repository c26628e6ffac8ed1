"""Residual stream view: the stream's norms, what each sub-layer adds, and a logit lens (the per-position loss and the
generation loop are the Next token view, app/panels/predict.py).

Drawing reads only the recording; the logit lens is asked of the gateway (cached).
"""
from __future__ import annotations

from functools import partial

import numpy as np
import plotly.graph_objects as go
import streamlit as st

from app import choice_state, gateway, plots, token_window
from app.context import ViewContext
from app.panels import generation
from app.sections import section
from explorer_model import view_choices as VC
from explorer_model.analysis import views_data as V

# The logit lens costs 2 × layers × positions × d_model × vocab floating-point operations (SmolLM2: 1.7 GFLOP per
# position, ~25 ms of one core, about what recording six tokens costs), and a cell must stay wide enough
# for its text: the last LENS_POS positions by default (where a prompt's answer forms; a class's server on one core
# pays ~0.2 s per new prompt for them), up to LENS_MAX_POS on request (only the added positions run:
# gateway.logit_lens).
LENS_POS, LENS_MAX_POS = VC.CHOICES["lens_positions"].default, VC.CHOICES["lens_positions"].hi


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


def lens_text(facts, ids, start: int, top_ids: np.ndarray) -> list[list[str]]:
    """text[layer][p]: how the top token at position start + p reads after the prompt so far
    (generation.candidate_label), worked out once per distinct token of a position."""
    ids, memo = [int(i) for i in ids], {}

    def label(p: int, token_id: int) -> str:
        if (p, token_id) not in memo:
            memo[p, token_id] = generation.candidate_label(facts, ids[:start + p + 1], token_id)
        return memo[p, token_id]
    return [[label(p, int(i)) for p, i in enumerate(row)] for row in top_ids]


def logit_lens_figure(top_probs, text, labels, t, lo: int = 0, hi: int | None = None) -> go.Figure:
    """text[layer][pos]: how the top token reads (a character fragment as the character it would complete); the
    positions lo…hi-1 of those given (all by default)."""
    hi = top_probs.shape[1] if hi is None else hi
    fig = plots.heatmap(top_probs[:, lo:hi], labels[lo:hi], [f"L{l}" for l in range(top_probs.shape[0])], zmin=0, zmax=1,
                        colorscale="Blues", title=t("residual.logit_lens_what_each_layer"),
                        x_title=t("residual.position_predicting_the_token_after"),
                        y_title=t("residual.after_layer"), value_name=t("residual.probability"))
    fig.update_traces(text=[row[lo:hi] for row in text], texttemplate="%{text}",
                      hovertemplate="%{y} · %{x}<br>%{text}: %{z:.3f}<extra></extra>")
    # the last layer on top, as a lens is read: down from the model's own prediction to where it first appears (the
    # rows a taller-than-the-screen figure shows first when a page lands on it)
    fig.update_yaxes(autorange=True)
    return fig


# ----------------------------------------------------------------------------- drawing
def draw(ctx: ViewContext) -> None:
    st.subheader(ctx.t("residual.title"))
    with section("residual", "norms"):
        draw_norms(ctx)  # the main figure
    with plots.explainer(ctx, ctx.t("residual.stream_expander")):
        draw_intro(ctx)
    with section("residual", "contributions"):
        draw_contributions(ctx)
    with section("residual", "lens"):
        draw_lens(ctx)


def draw_intro(ctx: ViewContext) -> None:
    t = ctx.t
    st.markdown(t("residual.think_of_the_residual_stream"))
    st.latex(r"h_l = x_l + \mathrm{Attn}(\mathrm{RMSNorm}(x_l)),\quad x_{l+1} = h_l + \mathrm{FFN}(\mathrm{RMSNorm}(h_l))")
    st.latex(r"\mathrm{lens}_l = \mathrm{softmax}\big(W_\text{out}\,\mathrm{RMSNorm}(x_{l+1})\big)")


def draw_norms(ctx: ViewContext) -> None:
    t, n_layers = ctx.t, ctx.cfg.n_layers
    st.subheader(t("residual.size_of_the_residual_stream"))
    norms = gateway.derived("residual_norms", ctx.source, ctx.ids, norms_data)  # once per recording
    rows = [t("residual.layer_in", layer=l) for l in range(n_layers)] + [t("residual.layer_out", layer=n_layers - 1)]
    choice_state.start("residual_log")
    log = st.toggle(t("residual.colour_by_log_one_huge"), key="residual_log")
    cap = norm_colour_cap(norms)
    shown = np.log10(norms) if log else norms
    zmin, zmax = (0.0, cap) if cap is not None and not log else (float(shown.min()), float(shown.max()))
    n = norms.shape[1]
    lo, hi = token_window.span("residual_norms", n, token_window.fitting(ctx, rows), ctx.token)
    labels = ctx.labels[lo:hi]  # the figure is named by the labels, not by the whole context's selection
    fig = lambda: plots.heatmap(  # noqa: E731  (built only when not cached: plots.show)
        shown[:, lo:hi], labels, rows, colorscale="Viridis", zmin=zmin, zmax=zmax,
        title=t("residual.x_per_layer_and_token"), x_title=t("residual.token"),
        y_title=t("residual.residual_stream_entering_layer"),
        value_name="log10 ‖x‖₂" if log else "‖x‖₂", fmt=".3f" if log else ".2f")
    plots.show(fig, ctx, key="residual_norms")
    token_window.controls(ctx, "residual_norms", n, lo, hi)
    capped = "" if log or cap is None else t("residual.colours_stop_at_so_the", cap=cap)
    st.caption(t("residual.each_block_only_adds_to") + capped)
    label = t("residual.csv_norms")
    plots.csv_button(ctx, label, label, lambda: plots.matrix_csv(norms, rows, ctx.labels, "layer"),
                     "residual_norms.csv", key="residual_csv_norms")


def draw_contributions(ctx: ViewContext) -> None:
    attn, mlp = gateway.derived("residual_contributions", ctx.source, ctx.ids, contributions_data)
    plots.show(partial(contributions_figure, attn, mlp, ctx.token, ctx.pieces[ctx.token], ctx.t), ctx, key="residual_contrib", height=420)


def lens_positions(ctx: ViewContext) -> int:
    """How many of the last positions the lens shows: LENS_POS, or what the visitor chose (kept within the prompt)."""
    T = len(ctx.ids)
    if T <= LENS_POS:
        return T
    top = min(T, LENS_MAX_POS)
    choice_state.start("lens_positions", LENS_POS, hi=top)
    return int(st.slider(ctx.t("residual.lens_positions"), 1, top, key="lens_positions"))


def draw_lens(ctx: ViewContext) -> None:
    t, T = ctx.t, len(ctx.ids)
    st.subheader(t("residual.logit_lens"))
    start = T - lens_positions(ctx)
    with plots.waiting(t("residual.applying_the_output_layer_to"), not gateway.lens_cached(ctx.source, ctx.ids, start)):
        top_ids, top_probs = gateway.logit_lens(ctx.source, ctx.ids, start)
    text = lens_text(ctx.facts, ctx.ids, start, top_ids)
    n = top_ids.shape[1]
    fit = token_window.fitting(ctx, [f"L{l}" for l in range(len(text))],
                               min_cell=token_window.text_cell([s for row in text for s in row], ctx.presenter))
    lo, hi = token_window.span("residual_lens", n, fit, ctx.token - start)
    plots.show(partial(logit_lens_figure, top_probs, text, ctx.labels[start:], t, lo, hi), ctx, key="residual_lens")
    token_window.controls(ctx, "residual_lens", n, lo, hi)
    st.caption(t("residual.lens_caption") + (t("residual.lens_window", n=T - start) if start else ""))

    def csv() -> str:
        rows = ([l, start + p, ctx.pieces[start + p], int(top_ids[l, p]), text[l][p], float(top_probs[l, p])]
                for l in range(top_ids.shape[0]) for p in range(top_ids.shape[1]))
        return plots.to_csv(["layer", "position", "token", "top_id", "top_token", "probability"], rows)
    label = t("residual.csv_lens")
    plots.csv_button(ctx, label, label, csv, "logit_lens.csv", key="residual_csv_lens")
