"""SwiGLU view: the gated feed-forward network, read from the recording (no forward pass for drawing).

The two-prompt comparison asks the gateway for the recordings of its two prompts (cached).
"""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import streamlit as st
from plotly.subplots import make_subplots

from app import explorer, plots
from app.context import ViewContext, display_piece, plain
from explorer_model.analysis import views_data as V
from app.presets import BANK_PAIR

# key -> (hook suffix, English name, 中文名); order = order of the computation
QUANTITIES = {
    "pre": ("mlp.hook_pre", "gate  W_gate·n", "门控  W_gate·n"),
    "act": ("mlp.hook_act", "SiLU(gate)", "SiLU(门控)"),
    "up": ("mlp.hook_pre_linear", "up  W_up·n", "上投影  W_up·n"),
    "post": ("mlp.hook_post", "product  SiLU(gate)⊙up", "乘积  SiLU(门控)⊙上投影"),
}
# With a causal mask a word's activations depend only on the words before it, so the money/river
# context has to come first for the word to differ.
CONTEXT_FIRST_PAIR = ("I deposited my salary at the bank", "We had a picnic on the grassy river bank")
N_TOKEN_NEURONS = 12


# ----------------------------------------------------------------------------- pure data / figures
def mlp_values(rec, layer: int) -> dict[str, np.ndarray]:
    """The four FFN tensors of one layer, each [pos, d_ff]."""
    return {k: rec[f"blocks.{layer}.{suffix}"][0].float().numpy() for k, (suffix, _, _) in QUANTITIES.items()}


def top_neurons(post: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k neurons with the largest mean |product| over the tokens, largest first."""
    score = np.abs(post).mean(axis=0)
    return np.argsort(-score, kind="stable")[:k]


def heatmap_figure(vals: dict, neurons: np.ndarray, labels, quantity: str, t) -> go.Figure:
    """Tokens (rows) × top neurons (columns) for one quantity, or all four as small panels."""
    cols = [f"n{i}" for i in neurons]
    hover = t("token", "token") + ": %{y}<br>" + t("neuron", "神经元") + ": %{x}<br>%{z:.4f}<extra></extra>"
    if quantity != "all":
        z = vals[quantity][:, neurons]
        name = t(QUANTITIES[quantity][1], QUANTITIES[quantity][2])
        fig = plots.heatmap(z, cols, labels, colorscale="RdBu_r", zmid=0.0, title=name,
                            x_title=t("neuron (top by mean |product|)", "神经元（按平均 |乘积| 排序）"),
                            y_title=t("token", "token"), value_name=name)
        return fig
    names = [t(QUANTITIES[q][1], QUANTITIES[q][2]) for q in QUANTITIES]
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


def silu_figure(gates: np.ndarray, t, bins: int = 80) -> go.Figure:
    """SiLU and ReLU curves over the range of the recorded gate values, with their histogram behind."""
    lo, hi = min(float(gates.min()), -4.0), max(float(gates.max()), 2.0)
    counts, edges = np.histogram(gates, bins=bins, range=(lo, hi))
    centres = (edges[:-1] + edges[1:]) / 2
    z = np.linspace(lo, hi, 400)
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Bar(x=centres, y=counts, width=edges[1] - edges[0], marker_color="rgba(120,120,200,0.35)",
                         name=t("recorded gate values", "记录到的门控值"),
                         hovertemplate="z≈%{x:.2f}: %{y}<extra></extra>"), secondary_y=True)
    fig.add_trace(go.Scatter(x=z, y=silu(z), name="SiLU(z) = z·σ(z)", line=dict(width=3, color="#d62728")))
    fig.add_trace(go.Scatter(x=z, y=np.maximum(z, 0), name="ReLU(z)", line=dict(dash="dash", color="#555")))
    fig.update_layout(title=t("SiLU against ReLU, over where this layer's gate values fall",
                              "SiLU 与 ReLU 对比，以及本层门控值的分布"),
                      xaxis_title=t("gate pre-activation z", "门控预激活 z"), bargap=0,
                      margin=dict(l=10, r=10, t=50, b=10), legend=dict(orientation="h", y=-0.2))
    fig.update_yaxes(title_text=t("activation", "激活值"), secondary_y=False)
    fig.update_yaxes(title_text=t("count (tokens × neurons)", "计数（token × 神经元）"), secondary_y=True,
                     showgrid=False)
    return fig


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
    fig.update_layout(barmode="group", title=t(f"Share of FFN neurons below {threshold:g}, per layer",
                                               f"各层中绝对值低于 {threshold:g} 的 FFN 神经元比例"),
                      xaxis_title=t("layer", "层"), yaxis_title=t("share", "比例"), yaxis_range=[0, 1],
                      margin=dict(l=10, r=10, t=50, b=10), legend=dict(orientation="h", y=-0.2))
    return fig


def token_neurons_data(vals: dict, token: int, n: int = N_TOKEN_NEURONS) -> tuple[np.ndarray, np.ndarray]:
    """The token's n neurons with the largest |product|, and their [n, 4] values (gate, SiLU, up, product)."""
    idx = np.argsort(-np.abs(vals["post"][token]), kind="stable")[:n]
    return idx, np.stack([vals[q][token, idx] for q in QUANTITIES], axis=1)


def token_neurons_figure(idx, table, piece: str, t) -> go.Figure:
    colours = ["#9467bd", "#d62728", "#2ca02c", "#ff7f0e"]
    fig = go.Figure([go.Bar(x=[f"n{i}" for i in idx], y=table[:, c], name=t(QUANTITIES[q][1], QUANTITIES[q][2]),
                            marker_color=colours[c]) for c, q in enumerate(QUANTITIES)])
    fig.update_layout(barmode="group", title=t(f"Top neurons of token “{piece}”", f"token“{piece}”最活跃的神经元"),
                      xaxis_title=t("neuron", "神经元"), yaxis_title=t("value", "数值"),
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
        go.Scatter(x=x, y=sim_act, mode="lines+markers", name=t("SiLU(gate) (hook_act)", "SiLU(门控)（hook_act）")),
        go.Scatter(x=x, y=sim_pre, mode="lines", line=dict(dash="dot"),
                   name=t("gate before SiLU (hook_pre)", "SiLU 之前的门控（hook_pre）")),
    ])
    fig.add_vline(x=layer, line_dash="dot", line_color="#888")
    fig.update_layout(title=t("Same word, two contexts: cosine similarity of its gate pattern per layer",
                              "同一个词、两种语境：各层门控模式的余弦相似度"),
                      xaxis_title=t("layer", "层"), yaxis_title=t("cosine similarity", "余弦相似度"),
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
    draw_intro(ctx)
    if ctx.cfg.ffn_type != "swiglu":
        st.info(t("This model's feed-forward network is not gated (plain ReLU FFN), so there is no SwiGLU to show.",
                  "该模型的前馈网络没有门控（普通 ReLU FFN），因此没有 SwiGLU 可展示。"))
        return
    vals = mlp_values(ctx.rec, ctx.layer)
    draw_heatmap(ctx, vals)
    c1, c2 = st.columns(2)
    with c1:
        draw_silu(ctx, vals)
    with c2:
        draw_sparsity(ctx)
    draw_token(ctx, vals)
    draw_compare(ctx)


def draw_intro(ctx: ViewContext) -> None:
    t, cfg = ctx.t, ctx.cfg
    st.markdown(t(
        "Every block ends with a feed-forward network that works on each token separately. LLaMA's version has "
        "**two** input projections: one (*gate*) goes through SiLU and acts as a soft valve, the other (*up*) "
        "carries the content; they are multiplied neuron by neuron, so each gate value decides how much of its "
        "up-projected feature gets through to W_down.",
        "每个模块最后是一个逐 token 独立计算的前馈网络。LLaMA 的版本有**两个**输入投影：一个（*门控*）经过 SiLU，"
        "像一个可调的阀门；另一个（*上投影*）携带内容。两者逐个神经元相乘，所以每个门控值决定了对应的上投影特征"
        "有多少能传到 W_down。"))
    st.latex(r"\mathrm{FFN}(n) = W_\text{down}\big(\mathrm{SiLU}(W_\text{gate}\,n)\odot W_\text{up}\,n\big),"
             r"\qquad \mathrm{SiLU}(z) = z\,\sigma(z) = \frac{z}{1+e^{-z}}")
    st.markdown(t(
        f"Here n is the RMS-normalized residual stream (D = {cfg.d_model}); W_gate and W_up map it to "
        f"D_ff = {cfg.d_ff} neurons (×{cfg.d_ff / cfg.d_model:.2f} the width) and W_down maps back to {cfg.d_model}.",
        f"这里 n 是经过 RMS 归一化的残差流（D = {cfg.d_model}）；W_gate 和 W_up 把它映射到 D_ff = {cfg.d_ff} 个神经元"
        f"（宽度的 {cfg.d_ff / cfg.d_model:.2f} 倍），W_down 再映射回 {cfg.d_model} 维。"))


def draw_heatmap(ctx: ViewContext, vals: dict) -> None:
    t = ctx.t
    st.subheader(t(f"Layer {ctx.layer}: the most active neurons for every token",
                   f"第 {ctx.layer} 层：每个 token 最活跃的神经元"))
    c1, c2 = st.columns([3, 1])
    options = [*QUANTITIES, "all"]
    quantity = c1.radio(t("Show", "显示"), options, index=3, horizontal=True, key="swiglu_quantity",
                        format_func=lambda q: t("all four", "四者并列") if q == "all" else t(*QUANTITIES[q][1:]))
    k = int(c2.number_input(t("Top-k neurons", "前 k 个神经元"), 1, min(256, ctx.cfg.d_ff), 32, key="swiglu_topk"))
    neurons = top_neurons(vals["post"], k)
    fig = heatmap_figure(vals, neurons, ctx.labels, quantity or "post", t)
    rows = len(ctx.ids) * (2 if quantity == "all" else 1)
    plots.show(fig, ctx, key="swiglu_heatmap", filename=f"swiglu_layer{ctx.layer}",
               height=int(min(900, 160 + 20 * rows)))
    st.caption(t("Red = positive, blue = negative. Neurons are ordered by their mean |product| over the prompt; "
                 f"most of the {ctx.cfg.d_ff} neurons are near zero for any given token.",
                 "红色为正，蓝色为负。神经元按其在整个提示词上的平均 |乘积| 排序；对任一 token，"
                 f"这一层 {ctx.cfg.d_ff} 个神经元中的大多数都接近 0。"))

    def csv() -> str:
        cols = [f"n{i}" for i in neurons]
        rows = ([q, lab, *vals[q][p, neurons].tolist()] for q in QUANTITIES for p, lab in enumerate(ctx.labels))
        return plots.to_csv(["quantity", "token", *cols], rows)
    plots.csv_button(ctx, "Heatmap values (CSV)", "热力图数值（CSV）", csv, f"swiglu_layer{ctx.layer}.csv",
                     key="swiglu_csv_heatmap")


def draw_silu(ctx: ViewContext, vals: dict) -> None:
    t = ctx.t
    gates = vals["pre"].ravel()
    plots.show(silu_figure(gates, t), ctx, key="swiglu_silu", height=420)
    neg = float((gates < 0).mean())
    st.caption(t(f"{neg:.0%} of this layer's gate values are negative: there SiLU is not zero like ReLU but a small "
                 "negative number (lowest ≈ −0.28 at z ≈ −1.28), so those neurons leak a little instead of switching off.",
                 f"本层 {neg:.0%} 的门控值为负：在这里 SiLU 不像 ReLU 那样为 0，而是一个小的负数（最低约 −0.28，"
                 "位于 z ≈ −1.28），因此这些神经元只是“漏”过一点点，而不是完全关闭。"))


def draw_sparsity(ctx: ViewContext) -> None:
    t = ctx.t
    thr = float(st.number_input(t("Threshold", "阈值"), 0.0, 10.0, 0.1, 0.01, key="swiglu_threshold"))
    act_frac, post_frac = sparsity_data(ctx.rec, thr)
    plots.show(sparsity_figure(act_frac, post_frac, ctx.layer, thr, t), ctx, key="swiglu_sparsity", height=380)
    st.caption(t("A high bar means most neurons barely pass anything for these tokens: the FFN is sparse in practice "
                 "even though SiLU never outputs an exact zero.",
                 "柱子越高，说明对这些 token 大多数神经元几乎不放行任何东西：虽然 SiLU 从不精确输出 0，FFN 实际上仍是稀疏的。"))


def draw_token(ctx: ViewContext, vals: dict) -> None:
    t = ctx.t
    piece = ctx.pieces[ctx.token]
    st.subheader(t(f"Token {ctx.token} “{plain(piece)}”: its strongest neurons in layer {ctx.layer}",
                   f"第 {ctx.token} 个 token“{plain(piece)}”：第 {ctx.layer} 层中最强的神经元"))
    idx, table = token_neurons_data(vals, ctx.token)
    c1, c2 = st.columns([1, 1])
    heads = [t("neuron", "神经元"), *(t(*QUANTITIES[q][1:]) for q in QUANTITIES)]
    c1.dataframe({heads[0]: [int(i) for i in idx], **{h: table[:, c] for c, h in enumerate(heads[1:])}},
                 hide_index=True, height=460)
    with c2:
        plots.show(token_neurons_figure(idx, table, piece, t), ctx, key="swiglu_token", height=420)
    plots.csv_button(ctx, "Token neuron table (CSV)", "token 神经元表（CSV）",
                     plots.to_csv(["neuron", *QUANTITIES], ([int(i), *row.tolist()] for i, row in zip(idx, table))),
                     f"swiglu_layer{ctx.layer}_token{ctx.token}.csv", key="swiglu_csv_token")


def _use_context_first() -> None:
    st.session_state["swiglu_prompt_a"], st.session_state["swiglu_prompt_b"] = CONTEXT_FIRST_PAIR
    st.session_state["swiglu_word"] = "bank"


def _pick_token(ctx, col, key: str, pieces: list[str], found: int | None) -> int:
    if found is not None:
        return found
    return int(col.selectbox(ctx.t("Token to compare", "要比较的 token"), range(len(pieces)), key=key,
                             format_func=lambda i: f"{i}: {display_piece(pieces[i])}"))


def draw_compare(ctx: ViewContext) -> None:
    t, tok = ctx.t, ctx.facts
    st.subheader(t("One word, two contexts", "同一个词，两种语境"))
    st.session_state.setdefault("swiglu_prompt_a", BANK_PAIR[0])
    st.session_state.setdefault("swiglu_prompt_b", BANK_PAIR[1])
    st.session_state.setdefault("swiglu_word", "bank")
    c1, c2, c3 = st.columns([4, 4, 2])
    text_a = c1.text_input(t("Prompt A", "提示词 A"), key="swiglu_prompt_a")
    text_b = c2.text_input(t("Prompt B", "提示词 B"), key="swiglu_prompt_b")
    word = c3.text_input(t("Word (blank: pick tokens)", "词（留空则手动选 token）"), key="swiglu_word")
    ids_a = explorer.encode_prompt(ctx.source, text_a or "", 256)[0]
    ids_b = explorer.encode_prompt(ctx.source, text_b or "", 256)[0]
    if not ids_a or not ids_b:
        st.info(t("Type two prompts to compare.", "请输入两个要比较的提示词。"))
        return
    source = ctx.extras["source"]
    rec_a, rec_b = explorer.recording(source, ids_a), explorer.recording(source, ids_b)
    pieces_a, pieces_b = [tok.piece(i) for i in ids_a], [tok.piece(i) for i in ids_b]
    fa, fb = find_word(pieces_a, word or ""), find_word(pieces_b, word or "")
    if word and (fa is None or fb is None):
        st.warning(t(f"“{plain(word)}” is not in both prompts; pick a token in each.",
                     f"两个提示词中并非都含有“{plain(word)}”；请分别选择 token。"))
    if fa is None or fb is None:
        fa = fb = None
    i = _pick_token(ctx, c1, "swiglu_tok_a", pieces_a, fa)
    j = _pick_token(ctx, c2, "swiglu_tok_b", pieces_b, fb)
    st.caption(t(f"Comparing token {i} “{display_piece(pieces_a[i])}” of A with token {j} “{display_piece(pieces_b[j])}” "
                 "of B, using SiLU(gate) (hook_act, solid) and the raw gate (hook_pre, dotted).",
                 f"比较 A 的第 {i} 个 token“{display_piece(pieces_a[i])}”和 B 的第 {j} 个 token"
                 f"“{display_piece(pieces_b[j])}”，实线为 SiLU(门控)（hook_act），虚线为原始门控（hook_pre）。"))
    same = ids_a[:i + 1] == ids_b[:j + 1]
    if same:
        st.info(t("Both prompts are identical up to and including this word. The model is causal: a token only sees "
                  "the tokens before it, so the word's activations are exactly the same in both and the similarity "
                  "is 1 in every layer. Put the context before the word to see it change.",
                  "两个提示词到这个词为止（含该词）完全相同。模型是因果的：一个 token 只能看到它之前的 token，"
                  "因此这个词在两处的激活完全一样，每一层的相似度都是 1。把语境放在这个词之前，才能看到变化。"))
        st.button(t("Use a pair with the context first", "使用语境在前的一对句子"), key="swiglu_context_first",
                  on_click=_use_context_first)
    sim_act = similarity_data(rec_a, rec_b, i, j, "mlp.hook_act")
    sim_pre = similarity_data(rec_a, rec_b, i, j, "mlp.hook_pre")
    c1, c2 = st.columns([3, 2])
    with c1:
        plots.show(similarity_figure(sim_act, sim_pre, ctx.layer, t), ctx, key="swiglu_similarity", height=400)
    plots.csv_button(ctx, "Per-layer similarity (CSV)", "各层相似度（CSV）",
                     plots.to_csv(["layer", "cosine_hook_act", "cosine_hook_pre"],
                                  ([L, float(sim_act[L]), float(sim_pre[L])] for L in range(len(sim_act)))),
                     "swiglu_similarity.csv", key="swiglu_csv_similarity")
    if same:
        return  # every difference is zero; a "most different" table would list arbitrary neurons
    idx, va, vb = differing_neurons(rec_a, rec_b, i, j, ctx.layer)
    c2.markdown(t(f"**Layer {ctx.layer}: neurons whose SiLU(gate) differs most**",
                  f"**第 {ctx.layer} 层：SiLU(门控) 差别最大的神经元**"))
    c2.dataframe({t("neuron", "神经元"): [int(n) for n in idx], "A": va, "B": vb, t("A − B", "A − B"): va - vb},
                 hide_index=True)
