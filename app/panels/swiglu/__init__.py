"""SwiGLU view: the gated feed-forward network, read from the recording (no forward pass for drawing).

The two-prompt comparison asks the gateway for the recordings of its two prompts (cached). The gate kinds and
the position-wise demonstration live in swiglu_gates.py and swiglu_positionwise.py.
"""
from __future__ import annotations

from functools import cache, partial

import numpy as np
import plotly.graph_objects as go
import streamlit as st
from plotly.subplots import make_subplots

from app import choice_state, gateway, plots
from app.context import ViewContext, display_piece, plain
from app.sections import section
from app.panels.swiglu import gates as swiglu_gates
from app.panels.swiglu import positionwise as swiglu_positionwise
from explorer_model.analysis import views_data as V

# key -> hook suffix; order = order of the computation
QUANTITIES = {"pre": "mlp.hook_pre", "act": "mlp.hook_act", "up": "mlp.hook_pre_linear", "post": "mlp.hook_post"}


def quantity_name(t, q: str) -> str:
    return {"pre": t("swiglu.q_pre"), "act": t("swiglu.q_act"), "up": t("swiglu.q_up"), "post": t("swiglu.q_post")}[q]
# With a causal mask a word's activations depend only on the words before it, so the money/river
# context has to come first for the word to differ.
CONTEXT_FIRST_PAIR = ("I deposited my salary at the bank", "We had a picnic on the grassy river bank")
N_TOKEN_NEURONS = 12


# ----------------------------------------------------------------------------- pure data / figures
def mlp_values(rec, layer: int) -> dict[str, np.ndarray]:
    """The four FFN tensors of one layer, each [pos, d_ff]."""
    return {k: rec[f"blocks.{layer}.{suffix}"][0].float().numpy() for k, suffix in QUANTITIES.items()}


def top_neurons(post: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k neurons with the largest mean |product| over the tokens, largest first."""
    score = np.abs(post).mean(axis=0)
    return np.argsort(-score, kind="stable")[:k]


def heatmap_figure(vals: dict, neurons: np.ndarray, labels, quantity: str, t) -> go.Figure:
    """Tokens (rows) × top neurons (columns) for one quantity, or all four as small panels."""
    cols = [f"n{i}" for i in neurons]
    hover = t("swiglu.heat_hover") + "<extra></extra>"
    if quantity != "all":
        z = vals[quantity][:, neurons]
        name = quantity_name(t, quantity)
        fig = plots.heatmap(z, cols, labels, colorscale="RdBu_r", zmid=0.0, title=name,
                            x_title=t("swiglu.neuron_axis"), y_title=t("swiglu.token"), value_name=name)
        return fig
    names = [quantity_name(t, q) for q in QUANTITIES]
    fig = make_subplots(rows=2, cols=2, subplot_titles=names, shared_yaxes=True,
                        horizontal_spacing=0.04, vertical_spacing=0.12)
    for n, q in enumerate(QUANTITIES):
        fig.add_trace(go.Heatmap(z=vals[q][:, neurons], x=cols, y=list(labels), colorscale="RdBu_r", zmid=0.0,
                                 showscale=False, name=names[n], hovertemplate=hover),
                      row=n // 2 + 1, col=n % 2 + 1)
    fig.update_yaxes(autorange="reversed", type="category")
    fig.update_xaxes(type="category", showticklabels=False)
    fig.update_layout(margin=dict(l=10, r=10, t=50, b=10))
    return fig


def silu(z: np.ndarray) -> np.ndarray:
    return z / (1.0 + np.exp(-z))


def _nice_step(span: float) -> float:
    """A 1-2-5 step giving about four ticks over span."""
    raw = span / 4
    mag = 10 ** np.floor(np.log10(raw))
    return float(mag * min((m for m in (1, 2, 5, 10) if m * mag >= raw)))


def aligned_ranges(y_lo: float, y_hi: float, count_hi: float) -> tuple[list, list, list]:
    """Ranges of the activation axis and the count axis with zero at the same height, and count
    ticks from zero up only (the part below zero is room, not negative counts)."""
    f = -y_lo / (y_hi - y_lo)  # height of zero as a fraction of the plot
    top = 1.05 * count_hi
    step = _nice_step(top)
    return [y_lo, y_hi], [-f / (1 - f) * top, top], list(np.arange(0, top, step))


def silu_figure(gates: np.ndarray, t, bins: int = 80) -> go.Figure:
    """SiLU and ReLU curves over the range of the recorded gate values, with their histogram behind."""
    lo, hi = min(float(gates.min()), -4.0), max(float(gates.max()), 2.0)
    counts, edges = np.histogram(gates, bins=bins, range=(lo, hi))
    centres = (edges[:-1] + edges[1:]) / 2
    z = np.linspace(lo, hi, 400)
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Bar(x=centres, y=counts, width=edges[1] - edges[0], marker_color="rgba(120,120,200,0.35)",
                         name=t("swiglu.recorded_gates"), hovertemplate="z≈%{x:.2f}: %{y}<extra></extra>"),
                  secondary_y=True)
    fig.add_trace(go.Scatter(x=z, y=silu(z), name="SiLU(z) = z·σ(z)", line=dict(width=3, color="#d62728")))
    fig.add_trace(go.Scatter(x=z, y=np.maximum(z, 0), name="ReLU(z)", line=dict(dash="dash", color="#555")))
    pad = 0.05 * (hi + 0.3)
    y_range, c_range, c_ticks = aligned_ranges(-0.3 - pad, hi + pad, float(counts.max()))
    fig.update_layout(title=t("swiglu.silu_title"), xaxis_title=t("swiglu.gate_axis"), bargap=0,
                      margin=dict(l=10, r=10, t=50, b=10), legend=dict(orientation="h", y=-0.2))
    fig.update_yaxes(title_text=t("swiglu.activation"), range=y_range, zeroline=True, secondary_y=False)
    fig.update_yaxes(title_text=t("swiglu.count_axis"), secondary_y=True, showgrid=False, range=c_range,
                     tickmode="array", tickvals=c_ticks)
    return fig


@cache
def silu_minimum() -> tuple[float, float]:
    """(SiLU's lowest value, where it is), found numerically rather than typed in."""
    z = np.linspace(-6, 0, 60001)
    y = silu(z)
    return float(y.min()), float(z[y.argmin()])


def sparsity_data(rec, threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """Per layer: share of |SiLU(gate)| and of |product| below threshold, over all tokens and neurons."""
    return V.below_share(rec, "mlp.hook_act", threshold), V.below_share(rec, "mlp.hook_post", threshold)


def sparsity_figure(act_frac, post_frac, layer: int, threshold: float, t) -> go.Figure:
    x = list(range(len(act_frac)))
    fig = go.Figure([
        go.Bar(x=x, y=act_frac, name="|SiLU(gate)|", marker_color="#1f77b4"),
        go.Bar(x=x, y=post_frac, name="|SiLU(gate)⊙up|", marker_color="#ff7f0e"),
    ])
    fig.add_vline(x=layer, line_dash="dot", line_color="#888")
    fig.update_layout(barmode="group", title=t("swiglu.sparsity_title", threshold=f"{threshold:g}"),
                      xaxis_title=t("swiglu.layer"), yaxis_title=t("swiglu.share"), yaxis_range=[0, 1],
                      margin=dict(l=10, r=10, t=50, b=10), legend=dict(orientation="h", y=-0.2))
    return fig


def token_neurons_data(vals: dict, token: int, n: int = N_TOKEN_NEURONS) -> tuple[np.ndarray, np.ndarray]:
    """The token's n neurons with the largest |product|, and their [n, 4] values (gate, SiLU, up, product)."""
    idx = np.argsort(-np.abs(vals["post"][token]), kind="stable")[:n]
    return idx, np.stack([vals[q][token, idx] for q in QUANTITIES], axis=1)


def token_neurons_figure(idx, table, piece: str, t) -> go.Figure:
    colours = ["#9467bd", "#d62728", "#2ca02c", "#ff7f0e"]
    fig = go.Figure([go.Bar(x=[f"n{i}" for i in idx], y=table[:, c], name=quantity_name(t, q),
                            marker_color=colours[c]) for c, q in enumerate(QUANTITIES)])
    fig.update_layout(barmode="group", title=t("swiglu.token_fig_title", piece=piece),
                      xaxis_title=t("swiglu.neuron"), yaxis_title=t("swiglu.value"),
                      margin=dict(l=10, r=10, t=50, b=10), legend=dict(orientation="h", y=-0.25))
    fig.update_xaxes(type="category")
    return fig


def find_word(pieces: list[str], word: str) -> int | None:
    """First token whose text contains word (case-insensitive), or None."""
    w = word.strip().lower()
    if not w:
        return None
    return next((i for i, p in enumerate(pieces) if w in p.lower()), None)


def similarity_data(rec_a, rec_b, i: int, j: int, suffix: str = "mlp.hook_act") -> np.ndarray:
    """Per layer: cosine similarity of the suffix vector at token i of prompt A and token j of prompt B."""
    return V.cosine_per_layer(rec_a, rec_b, i, j, suffix)


def similarity_figure(sim_act, sim_pre, layer: int, t) -> go.Figure:
    x = list(range(len(sim_act)))
    fig = go.Figure([
        go.Scatter(x=x, y=sim_act, mode="lines+markers", name=t("swiglu.sim_act")),
        go.Scatter(x=x, y=sim_pre, mode="lines", line=dict(dash="dot"), name=t("swiglu.sim_pre")),
    ])
    fig.add_vline(x=layer, line_dash="dot", line_color="#888")
    fig.update_layout(title=t("swiglu.sim_title"), xaxis_title=t("swiglu.layer"), yaxis_title=t("swiglu.cosine"),
                      yaxis_range=[-1.05, 1.05], margin=dict(l=10, r=10, t=50, b=10),
                      legend=dict(orientation="h", y=-0.2))
    return fig


def differing_neurons(rec_a, rec_b, i: int, j: int, layer: int, n: int = N_TOKEN_NEURONS):
    """Neurons whose SiLU(gate) differs most between the two tokens: indices, A values, B values."""
    a = rec_a[f"blocks.{layer}.mlp.hook_act"][0, i].numpy()
    b = rec_b[f"blocks.{layer}.mlp.hook_act"][0, j].numpy()
    idx = np.argsort(-np.abs(a - b), kind="stable")[:n]
    return idx, a[idx], b[idx]


# ----------------------------------------------------------------------------- drawing
def draw(ctx: ViewContext) -> None:
    t = ctx.t
    st.subheader(t("swiglu.title"))
    if ctx.cfg.ffn_type != "swiglu":
        st.info(t("swiglu.not_gated"))
        return
    vals = mlp_values(ctx.rec, ctx.layer)
    with section("swiglu", "heatmap"):
        draw_heatmap(ctx, vals)  # the main figure, first on the page
    draw_intro(ctx)
    with section("swiglu", "silu"):
        c1, c2 = st.columns(2)
        with c1:
            draw_silu(ctx, vals)
        with c2:
            draw_sparsity(ctx)
    with section("swiglu", "token"):
        draw_token(ctx, vals)
    with section("swiglu", "gates"):
        swiglu_gates.draw(ctx)
    with section("swiglu", "positionwise"):
        swiglu_positionwise.draw(ctx)
    with section("swiglu", "bank"):
        draw_compare(ctx)


def draw_intro(ctx: ViewContext) -> None:
    t, cfg = ctx.t, ctx.cfg
    with plots.explainer(ctx, t("swiglu.explain")):
        st.markdown(t("swiglu.intro"))
        st.latex(r"\mathrm{FFN}(n) = W_\text{down}\big(\mathrm{SiLU}(W_\text{gate}\,n)\odot W_\text{up}\,n\big),"
                 r"\qquad \mathrm{SiLU}(z) = z\,\sigma(z) = \frac{z}{1+e^{-z}}")
        st.markdown(t("swiglu.shapes", d=cfg.d_model, d_ff=cfg.d_ff, ratio=f"{cfg.d_ff / cfg.d_model:.2f}"))


def draw_heatmap(ctx: ViewContext, vals: dict) -> None:
    t = ctx.t
    c0, c1, c2 = st.columns([3, 4, 1])
    c0.markdown(t("swiglu.heat_heading", layer=ctx.layer))
    options = [*QUANTITIES, "all"]
    choice_state.start("swiglu_quantity")
    quantity = c1.radio(t("swiglu.show"), options, horizontal=True, key="swiglu_quantity",
                        format_func=lambda q: t("swiglu.all_four") if q == "all" else quantity_name(t, q))
    choice_state.start("swiglu_topk", hi=min(256, ctx.cfg.d_ff))
    k = int(c2.number_input(t("swiglu.topk"), 1, min(256, ctx.cfg.d_ff), key="swiglu_topk"))
    neurons = top_neurons(vals["post"], k)
    # meta lets tests find the main figure
    fig = lambda: heatmap_figure(vals, neurons, ctx.labels, quantity or "post", t).update_layout(  # noqa: E731
        meta={"id": "swiglu_heatmap"})
    rows = len(ctx.ids) * (2 if quantity == "all" else 1)
    plots.show(fig, ctx, key="swiglu_heatmap", filename=f"swiglu_layer{ctx.layer}",
               height=int(min(900, 160 + 20 * rows)))
    st.caption(t("swiglu.heat_caption", d_ff=ctx.cfg.d_ff))

    def csv() -> str:
        cols = [f"n{i}" for i in neurons]
        rows = ([q, lab, *vals[q][p, neurons].tolist()] for q in QUANTITIES for p, lab in enumerate(ctx.labels))
        return plots.to_csv(["quantity", "token", *cols], rows)
    label = t("swiglu.csv_heatmap")
    plots.csv_button(ctx, label, label, csv, f"swiglu_layer{ctx.layer}.csv", key="swiglu_csv_heatmap")


def draw_silu(ctx: ViewContext, vals: dict) -> None:
    gates = vals["pre"].ravel()
    plots.show(partial(silu_figure, gates, ctx.t), ctx, key="swiglu_silu", height=420, share=0.5)
    lowest, at = silu_minimum()
    st.caption(ctx.t("swiglu.silu_caption", neg=float((gates < 0).mean()), lowest=f"{lowest:.3f}", at=f"{at:.2f}"))


def draw_sparsity(ctx: ViewContext) -> None:
    t = ctx.t
    choice_state.start("swiglu_threshold")
    thr = float(st.number_input(t("swiglu.threshold"), 0.0, 10.0, step=0.01, key="swiglu_threshold"))
    act_frac, post_frac = gateway.derived("swiglu_sparsity", ctx.source, ctx.ids, sparsity_data, thr)
    plots.show(partial(sparsity_figure, act_frac, post_frac, ctx.layer, thr, t), ctx, key="swiglu_sparsity", height=380,
               share=0.5)
    st.caption(t("swiglu.sparsity_caption"))


def draw_token(ctx: ViewContext, vals: dict) -> None:
    t = ctx.t
    piece = ctx.pieces[ctx.token]
    st.subheader(t("swiglu.token_heading", token=ctx.token, piece=plain(piece), layer=ctx.layer))
    idx, table = token_neurons_data(vals, ctx.token)
    c1, c2 = st.columns([1, 1])
    heads = [t("swiglu.neuron"), *(quantity_name(t, q) for q in QUANTITIES)]
    with c1:
        plots.table(ctx, {heads[0]: [int(i) for i in idx], **{h: table[:, c] for c, h in enumerate(heads[1:])}},
                    height=460)
    with c2:
        plots.show(lambda: token_neurons_figure(idx, table, piece, t), ctx, key="swiglu_token", height=420,
                   share=0.5)
    label = t("swiglu.csv_token")
    plots.csv_button(ctx, label, label,
                     plots.to_csv(["neuron", *QUANTITIES], ([int(i), *row.tolist()] for i, row in zip(idx, table))),
                     f"swiglu_layer{ctx.layer}_token{ctx.token}.csv", key="swiglu_csv_token")


def _use_context_first() -> None:
    st.session_state["swiglu_prompt_a"], st.session_state["swiglu_prompt_b"] = CONTEXT_FIRST_PAIR
    st.session_state["swiglu_word"] = "bank"


def _pick_token(ctx, col, key: str, pieces: list[str], found: int | None) -> int:
    if found is not None:
        return found
    choice_state.start(key, hi=len(pieces) - 1)
    return int(col.selectbox(ctx.t("swiglu.pick_token"), range(len(pieces)), key=key,
                             format_func=lambda i: f"{i}: {display_piece(pieces[i])}"))


def draw_compare(ctx: ViewContext) -> None:
    t, tok = ctx.t, ctx.facts
    st.subheader(t("swiglu.compare_heading"))
    # the context before "bank" differs (a causal model reads a word by what precedes it): the gates differ at once
    for key, default in (("swiglu_prompt_a", CONTEXT_FIRST_PAIR[0]), ("swiglu_prompt_b", CONTEXT_FIRST_PAIR[1]),
                         ("swiglu_word", "bank")):
        choice_state.start(key, default)
    c1, c2, c3 = st.columns([4, 4, 2])
    text_a = c1.text_input(t("swiglu.prompt_a"), key="swiglu_prompt_a")
    text_b = c2.text_input(t("swiglu.prompt_b"), key="swiglu_prompt_b")
    word = c3.text_input(t("swiglu.word"), key="swiglu_word")
    ids_a = gateway.encode_prompt(ctx.source, text_a or "", 256)[0]
    ids_b = gateway.encode_prompt(ctx.source, text_b or "", 256)[0]
    if not ids_a or not ids_b:
        st.info(t("swiglu.type_two"))
        return
    source = ctx.extras["source"]
    pieces_a, pieces_b = [tok.piece(i) for i in ids_a], [tok.piece(i) for i in ids_b]
    fa, fb = find_word(pieces_a, word or ""), find_word(pieces_b, word or "")
    if word and (fa is None or fb is None):
        st.warning(t("swiglu.word_missing", word=plain(word)))
    if fa is None or fb is None:
        fa = fb = None
    i = _pick_token(ctx, c1, "swiglu_tok_a", pieces_a, fa)
    j = _pick_token(ctx, c2, "swiglu_tok_b", pieces_b, fb)
    st.caption(t("swiglu.comparing", i=i, piece_a=display_piece(pieces_a[i]), j=j, piece_b=display_piece(pieces_b[j])))
    same = ids_a[:i + 1] == ids_b[:j + 1]
    if same:
        st.info(t("swiglu.same_prefix"))
        st.button(t("swiglu.context_first"), key="swiglu_context_first", on_click=_use_context_first)
    sides = ((source, ids_a, ""), (source, ids_b, ""))  # kept for the pair: the bank example is the same for all
    sim_act = gateway.pair_derived("swiglu_similarity", sides, similarity_data, i, j, "mlp.hook_act")
    sim_pre = gateway.pair_derived("swiglu_similarity", sides, similarity_data, i, j, "mlp.hook_pre")
    c1, c2 = st.columns([3, 2])
    with c1:
        plots.show(partial(similarity_figure, sim_act, sim_pre, ctx.layer, t), ctx, key="swiglu_similarity", height=400,
                   share=0.6)
    label = t("swiglu.csv_similarity")
    plots.csv_button(ctx, label, label,
                     plots.to_csv(["layer", "cosine_hook_act", "cosine_hook_pre"],
                                  ([L, float(sim_act[L]), float(sim_pre[L])] for L in range(len(sim_act)))),
                     "swiglu_similarity.csv", key="swiglu_csv_similarity")
    if same:
        return  # every difference is zero; a "most different" table would list arbitrary neurons
    idx, va, vb = gateway.pair_derived("swiglu_differing", sides, differing_neurons, i, j, ctx.layer)
    c2.markdown(t("swiglu.differ_heading", layer=ctx.layer))
    with c2:
        plots.table(ctx, {t("swiglu.neuron"): [int(n) for n in idx], "A": va, "B": vb, "A − B": va - vb})
