"""What if…: change one part of the model for one run and compare it with the unchanged run.

The unchanged run is the app's cached recording. The changed run, its KL and the head sweep are asked of the
gateway (app/explorer.py), which runs them under its forward lock and keeps them in its one byte-bounded cache. The interventions live in the URL (`whatif=no-mask,ablate:blocks.3.attn.head5`), so a link shows the
same experiment.
"""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import streamlit as st

from app import explorer, plots
from app.context import ViewContext, display_piece, plain
from app.presets import BANK_PAIR
from explorer_model.analysis import interventions as I
from explorer_model.analysis import measures as M
from explorer_model.analysis import views_data as V

KL_MAX_POS = explorer.KL_MAX_POS
N_TOP = 10
KINDS = [  # builder choices: (key, English, 中文)
    ("ablate-head", "Ablate the selected head", "消融所选的头"),
    ("ablate-layer", "Ablate every head of the layer", "消融该层所有头"),
    ("skip-attn", "Skip the layer's attention", "跳过该层注意力"), ("skip-mlp", "Skip the layer's FFN", "跳过该层 FFN"),
    ("no-mask", "Remove the causal mask", "去掉因果掩码"), ("no-rope", "Remove RoPE", "去掉 RoPE"),
    ("norm-identity", "RMSNorm → no normalization (γ kept)", "RMSNorm → 不归一化（保留 γ）"),
    ("norm-eps", "Change RMSNorm's ε", "修改 RMSNorm 的 ε"), ("scale", "Scale a residual branch", "缩放残差分支"),
    ("gate-off", "SwiGLU gate off (gate ≡ 1)", "关闭 SwiGLU 门（gate ≡ 1）"), ("relu", "SiLU → ReLU", "SiLU → ReLU"),
    ("patch", "Patch from a second prompt", "从第二个提示词修补激活"),
]
PATCH_HOOKS = ["hook_resid_pre", "hook_resid_mid", "hook_resid_post", "hook_attn_out", "hook_mlp_out"]


# ----------------------------------------------------------------------------- pure data / figures
def pattern_of(run: dict, layer: int, ivs) -> np.ndarray:
    """[head, q, k] attention of a changed run, rebuilt from its rotated Q and K like the recorder does;
    where no-mask applies the mask is pushed past the last key, as the intervention does."""
    q, k = run["rot"][layer]
    unmasked = any(isinstance(iv, I.NoMask) and iv.layer in (None, layer) for iv in ivs)
    return V.pattern_from_rotated(q, k, unmasked)


def distribution_data(clean_logits, changed_logits, n: int = N_TOP) -> dict:
    """Last-position probabilities: the union of both runs' top n tokens, and the n tokens that moved most."""
    return V.distribution_data(clean_logits, changed_logits, n)


def distribution_figure(d: dict, piece, t) -> go.Figure:
    x = [f"{display_piece(piece(int(i)))} ({int(i)})" for i in d["ids"]]
    fig = go.Figure([go.Bar(x=x, y=d["clean"], name=t("unchanged", "原模型"), marker_color="#888888"),
                     go.Bar(x=x, y=d["changed"], name=t("changed", "修改后"), marker_color="#d62728")])
    fig.update_layout(barmode="group", title=t("Next-token probabilities at the last position, with and without the change",
                                               "最后一个位置的下一个 token 概率：修改前后对比"),
                      xaxis_title=t("token (id)", "token（id）"), yaxis_title=t("probability", "概率"),
                      margin=dict(l=10, r=10, t=50, b=10), legend=dict(orientation="h", y=-0.3))
    fig.update_xaxes(type="category")
    return fig


def moved_figure(d: dict, piece, t) -> go.Figure:
    y = [f"{display_piece(piece(int(i)))} ({int(i)})" for i in d["moved"]]
    colours = np.where(d["delta"] > 0, "#2ca02c", "#d62728")
    fig = go.Figure(go.Bar(x=d["delta"], y=y, orientation="h", marker_color=colours,
                           hovertemplate="%{y}<br>Δp = %{x:.4f}<extra></extra>"))
    fig.update_layout(title=t("Tokens that moved most: Δp = changed − unchanged", "变化最大的 token：Δp = 修改后 − 原模型"),
                      xaxis_title="Δp", margin=dict(l=10, r=10, t=50, b=10))
    fig.update_yaxes(autorange="reversed", type="category")
    return fig


def kl_figure(kl: np.ndarray, t) -> go.Figure:
    fig = go.Figure(go.Bar(x=list(range(len(kl))), y=kl, marker_color="#9467bd",
                           hovertemplate="L%{x}: %{y:.4f} nats<extra></extra>"))
    fig.update_layout(title=t("Where the runs part: KL(unchanged ‖ changed) of the logit lens after each layer",
                              "两次运行从哪里开始分开：每层之后 logit lens 的 KL(原模型 ‖ 修改后)"),
                      xaxis_title=t("layer", "层"), yaxis_title=t("KL (nats), mean over positions", "KL（nats），位置平均"),
                      margin=dict(l=10, r=10, t=50, b=10))
    return fig


def own_token_figure(p_clean: np.ndarray, p_changed: np.ndarray, labels, t) -> go.Figure:
    x = labels[:len(p_clean)]
    fig = go.Figure([go.Scatter(x=x, y=y, mode="lines+markers", name=name, line=dict(color=colour)) for y, name, colour in
                     ((p_clean, t("unchanged", "原模型"), "#888888"), (p_changed, t("changed", "修改后"), "#d62728"))])
    fig.update_layout(title=t("Probability each position gives to the prompt's own next token",
                              "每个位置给提示词中真实下一个 token 的概率"),
                      xaxis_title=t("position (predicting the token after it)", "位置（预测其后的 token）"),
                      yaxis_title=t("probability", "概率"), yaxis_range=[0, 1.02], margin=dict(l=10, r=10, t=50, b=10),
                      legend=dict(orientation="h", y=-0.3))
    fig.update_xaxes(type="category")
    return fig


def attention_figure(mats: list[np.ndarray], titles: list[str], label_sets: list[list[str]], t) -> go.Figure:
    """Side-by-side patterns; cells the mask removes are blank (NaN), cells it would remove but did not are coloured."""
    layout = plots.grid_layout(1, len(mats), titles, hspace=0.04)
    traces = []
    for c, (m, labels) in enumerate(zip(mats, label_sets)):
        xa, ya = plots.axis_ids(1, c + 1, len(mats))
        traces.append(go.Heatmap(z=m, x=labels, y=labels, coloraxis="coloraxis", hoverongaps=False, xaxis=xa, yaxis=ya,
                                 hovertemplate="q %{y}<br>k %{x}<br>%{z:.4f}<extra></extra>"))
        layout["yaxis" + ya[1:]].update(autorange="reversed", type="category", showticklabels=c == 0)
        layout["xaxis" + xa[1:]].update(type="category", showticklabels=False)
    fig = go.Figure(traces, layout)
    fig.update_layout(coloraxis=dict(colorscale="Blues", cmin=0, cmax=1), margin=dict(l=10, r=10, t=40, b=10))
    return fig


def masked_blank(m: np.ndarray, ivs, layer: int) -> np.ndarray:
    """Blank the future only where the mask is still in force (a masked probability is not a small number)."""
    if any(isinstance(iv, I.NoMask) and iv.layer in (None, layer) for iv in ivs):
        return m
    return np.where(np.triu(np.ones(m.shape, dtype=bool), 1), np.nan, m)


def sweep_figure(delta: np.ndarray, layers, target_piece: str, p_clean: float, t) -> go.Figure:
    lim = float(np.abs(delta).max()) or 1.0
    fig = plots.heatmap(delta, [t(f"head {h}", f"头 {h}") for h in range(delta.shape[1])],
                        [t(f"layer {l}", f"第 {l} 层") for l in layers], colorscale="RdBu", zmid=0, zmin=-lim, zmax=lim,
                        title=t(f"Which heads matter: change of p(“{target_piece}”) = {p_clean:.3f} when one head is ablated",
                                f"哪些头重要：消融一个头时 p(“{target_piece}”) = {p_clean:.3f} 的变化"),
                        x_title=t("head", "头"), y_title=t("layer", "层"), value_name="Δp")
    return fig


# ----------------------------------------------------------------------------- choosing interventions
def _set_specs(text: str) -> None:
    st.session_state["whatif"] = text
    st.session_state["whatif_specs"] = text


def _typed() -> None:
    text = st.session_state.get("whatif_specs", "").strip()
    try:
        text = I.format_list(I.parse_list(text))
    except ValueError:
        pass  # kept as typed; the error is shown below the box
    _set_specs(text)


def _add(spec: str) -> None:
    current = st.session_state.get("whatif", "")
    specs = [s for s in current.split(",") if s.strip()]
    _set_specs(",".join(dict.fromkeys(specs + [spec])))


def _set_bank() -> None:
    st.session_state["prompt"] = BANK_PAIR[0]
    st.session_state["whatif_source"] = st.session_state["whatif_source_text"] = BANK_PAIR[1]


def _clamp(key: str, lo: int, hi: int, default: int) -> None:
    """Keep a number widget's state in range (the prompt or model may have changed); its default lives here,
    not in the widget, so Streamlit does not see two sources of its value."""
    st.session_state[key] = min(max(int(st.session_state.get(key, default)), lo), hi)


def built_spec(ctx: ViewContext, kind: str) -> str:
    """The string form the builder's widgets describe (layer and head from the sidebar selection)."""
    L, t, b = ctx.layer, ctx.t, f"blocks.{ctx.layer}"
    if kind in ("ablate-head", "ablate-layer"):
        mean = st.toggle(t("Mean over positions instead of zero", "用位置平均值代替 0"), key="whatif_mean")
        return f"{'ablate-mean' if mean else 'ablate'}:{b}.attn" + (f".head{ctx.head}" if kind == "ablate-head" else "")
    if kind in ("skip-attn", "skip-mlp"):
        return f"skip:{b}.{kind[5:]}"
    if kind in ("no-mask", "no-rope", "gate-off", "relu"):
        every = st.radio(t("Where", "范围"), [True, False], key="whatif_scope", horizontal=True,
                         format_func=lambda v: t("every layer", "所有层") if v else t(f"layer {L} only", f"仅第 {L} 层"))
        return kind + ("" if every else f":{b}")
    if kind in ("norm-identity", "norm-eps"):
        norm = st.radio(t("Which norm", "哪个归一化"), ["ln1", "ln2", "ln_final"], key="whatif_norm", horizontal=True,
                        format_func=lambda v: {"ln1": t("before attention (ln1)", "注意力之前（ln1）"),
                                               "ln2": t("before the FFN (ln2)", "FFN 之前（ln2）")}.get(v, t("final norm", "最终归一化")))
        target = norm if norm == "ln_final" else f"{b}.{norm}"
        if kind == "norm-identity":
            return f"norm-identity:{target}"
        eps = st.number_input("ε", min_value=0.0, value=1e-2, format="%.1e", key="whatif_eps")
        return f"norm-eps:{target}={I.fmt_number(eps)}"
    if kind == "scale":
        branch = st.radio(t("Branch", "分支"), ["hook_attn_out", "hook_mlp_out"], key="whatif_branch", horizontal=True,
                          format_func=lambda v: t("attention output", "注意力输出") if "attn" in v else t("FFN output", "FFN 输出"))
        factor = st.number_input(t("Factor", "倍数"), value=0.5, step=0.1, key="whatif_factor")
        return f"scale:{b}.{branch}={I.fmt_number(factor)}"
    hook = st.selectbox(t("Activation", "激活"), PATCH_HOOKS, key="whatif_patch_hook")
    _clamp("whatif_patch_pos", -len(ctx.ids), len(ctx.ids) - 1, -1)
    pos = st.number_input(t("Position (negative = from the end)", "位置（负数 = 从末尾数）"), -len(ctx.ids), len(ctx.ids) - 1,
                          key="whatif_patch_pos")
    return f"patch:{b}.{hook}@{int(pos)}"


def draw_chooser(ctx: ViewContext) -> tuple[list, str | None]:
    """The widgets; returns the parsed interventions (empty on error) and the source prompt's text."""
    t = ctx.t
    # Without a source in the link, the other bank sentence is the source (the same for whoever opens it).
    other = BANK_PAIR[1] if st.session_state.get("prompt") != BANK_PAIR[1] else BANK_PAIR[0]
    for key, widget, default in (("whatif", "whatif_specs", ""), ("whatif_source", "whatif_source_text", other)):
        if widget not in st.session_state:  # a widget's state is dropped while another view is shown
            st.session_state[widget] = st.session_state.get(key) or default
    c = st.columns(5)
    c[0].button(t("No causal mask", "去掉因果掩码"), key="whatif_q_mask", on_click=_set_specs, args=("no-mask",))
    c[1].button(t("No RoPE", "去掉 RoPE"), key="whatif_q_rope", on_click=_set_specs, args=("no-rope",))
    c[2].button(t("No RoPE, no mask", "去掉 RoPE 和掩码"), key="whatif_q_both", on_click=_set_specs, args=("no-rope,no-mask",))
    c[3].button(t("Bank → river patch", "bank 句子修补"), key="whatif_q_bank", on_click=lambda: (
        _set_bank(), _set_specs(f"patch:blocks.{ctx.layer}.hook_resid_post@-1")))
    c[4].button(t("Clear", "清除"), key="whatif_clear", on_click=_set_specs, args=("",))
    left, right = st.columns([2, 3])
    with left:
        kind = st.selectbox(t("Build one", "构造一个"), [k[0] for k in KINDS], key="whatif_kind",
                            format_func=lambda k: t(*next(x[1:] for x in KINDS if x[0] == k)))
        spec = built_spec(ctx, kind)
        st.button(t(f"Add {spec}", f"添加 {spec}"), key="whatif_add", on_click=_add, args=(spec,))
        st.caption(t("Layer and head come from the sidebar.", "层和头取自侧边栏。"))
    with right:
        st.text_input(t("Interventions (comma-separated; also in the page's link)", "干预（逗号分隔；也在页面链接中）"),
                      key="whatif_specs", on_change=_typed, placeholder="no-mask, ablate:blocks.3.attn.head5")
        try:
            ivs = explorer.check_interventions(ctx.source, st.session_state.get("whatif", ""))
        except ValueError as e:
            st.error(plain(e))  # it quotes what was typed (or came in the link): never markdown
            return [], None
        source = None
        if I.needs_source(ivs):
            st.text_input(t("Source prompt (activations are copied from it)", "源提示词（从中复制激活）"),
                          key="whatif_source_text", on_change=lambda: st.session_state.update(
                              whatif_source=st.session_state.get("whatif_source_text", "")))
            source = st.session_state.get("whatif_source_text") or ""
    return ivs, source


# ----------------------------------------------------------------------------- drawing
def draw(ctx: ViewContext) -> None:
    draw_intro(ctx)
    ivs, source_text = draw_chooser(ctx)
    if ivs:
        draw_results(ctx, ivs, source_text)
    draw_sweep(ctx)


def draw_intro(ctx: ViewContext) -> None:
    t = ctx.t
    st.markdown(t(
        "Switch one part of the real model off or change it, run the same prompt again, and put the two runs side by "
        "side. How far the prediction moves tells how much the model relied on that part for this prompt. The loss is "
        "the model's average surprise at the prompt's own next tokens; the KL divergence measures, after every layer "
        "(read through the final norm and the output matrix), how far the changed run's prediction has drifted.",
        "把真实模型的某个部件关掉或改掉，对同一个提示词再运行一次，并把两次运行并排比较。预测移动得越多，说明模型在"
        "这个提示词上越依赖这个部件。损失是模型对提示词中每个真实下一个 token 的平均“意外程度”；KL 散度则在每一层之后"
        "（经最终归一化和输出矩阵读出）衡量修改后的预测偏离了多少。"))
    st.latex(r"\mathcal{L}=-\frac{1}{T-1}\sum_{t=0}^{T-2}\log p(x_{t+1}\mid x_{\le t}),\qquad "
             r"\mathrm{KL}_l=\frac{1}{T}\sum_t\sum_v p_{l,t}(v)\log\frac{p_{l,t}(v)}{\tilde p_{l,t}(v)}")


def draw_results(ctx: ViewContext, ivs: list, source_text: str | None) -> None:
    t, tok, source = ctx.t, ctx.facts, ctx.source
    specs, ids = I.format_list(ivs), tuple(ctx.ids)
    source_ids: tuple[int, ...] = ()
    if source_text is not None:
        if not source_text.strip():
            st.warning(t("Type the source prompt to patch from.", "请输入用于修补的源提示词。"))
            return
        source_ids = tuple(explorer.encode_prompt(source, source_text, int(st.session_state.get(
            "max_tokens", explorer.DEFAULT_MAX_TOKENS)))[0])
    try:
        with st.spinner(t("Running the changed model …", "正在运行修改后的模型 …")):
            run = explorer.whatif_run(source, ids, specs, source_ids)
            kl = explorer.whatif_kl(source, ids, specs, source_ids)
    except ValueError as e:  # e.g. a patch position beyond the source prompt
        st.error(plain(e))
        return
    st.subheader(t(f"With {plain(specs)}", f"施加 {plain(specs)} 之后"))
    loss0, loss1 = M.prompt_loss(ctx.rec.logits, ids), run["loss"]
    d = distribution_data(ctx.rec.logits[0, -1], run["last"])
    top0, top1 = int(ctx.rec.logits[0, -1].argmax()), int(run["last"].argmax())
    c = st.columns(4)
    c[0].metric(t("Loss on the prompt, unchanged", "提示词损失（原模型）"), f"{loss0:.3f}")
    c[1].metric(t("Loss on the prompt, changed", "提示词损失（修改后）"), f"{loss1:.3f}", f"{loss1 - loss0:+.3f}",
                delta_color="inverse")
    c[2].metric(t("Top next token", "最可能的下一个 token"), f"{display_piece(tok.piece(top0))} → {display_piece(tok.piece(top1))}")
    c[3].metric(t("KL at the output", "输出处的 KL"), f"{kl[-1]:.4f}")
    left, right = st.columns([3, 2])
    with left:
        plots.show(distribution_figure(d, tok.piece, t), ctx, key="whatif_dist", height=420)
    with right:
        plots.show(moved_figure(d, tok.piece, t), ctx, key="whatif_moved", height=420)
    plots.show(kl_figure(kl, t), ctx, key="whatif_kl", height=340)
    start = max(0, len(ids) - KL_MAX_POS)
    st.caption(t(f"Averaged over positions {start}…{len(ids) - 1}. A layer before the first change shows 0.",
                 f"在位置 {start}…{len(ids) - 1} 上平均。第一个改动之前的层为 0。"))
    own0 = M.next_token_logprobs(ctx.rec.logits, ids).exp().numpy()
    own1 = run["own"]
    if len(ids) > 1:
        plots.show(own_token_figure(own0, own1, ctx.labels, t), ctx, key="whatif_own", height=360)
        if any(isinstance(iv, I.NoMask) for iv in ivs):
            st.caption(t("Without the mask every position can read the token it is asked to predict: watch the red line "
                         "jump towards 1 and the loss fall. That is why training needs the mask.",
                         "没有掩码时，每个位置都能直接读到它要预测的那个 token：红线跳向 1，损失下降。"
                         "这就是训练时必须有掩码的原因。"))
    if any(isinstance(iv, (I.NoMask, I.NoRope)) for iv in ivs):
        draw_attention(ctx, ivs, run, specs, source_ids)

    def csv() -> str:
        rows = [("next", int(i), tok.piece(int(i)), float(a), float(b)) for i, a, b in zip(d["ids"], d["clean"], d["changed"])]
        rows += [("kl_layer", l, "", float(v), "") for l, v in enumerate(kl)]
        rows += [("own_next", p, ctx.pieces[p + 1], float(a), float(b)) for p, (a, b) in enumerate(zip(own0, own1))]
        rows += [("loss", "", "", loss0, loss1)]
        return plots.to_csv(["quantity", "id_or_position", "token", "unchanged", "changed"], rows)
    plots.csv_button(ctx, "Both runs' numbers (CSV)", "两次运行的数值（CSV）", csv, "whatif.csv", key="whatif_csv")


def draw_attention(ctx: ViewContext, ivs: list, run: dict, specs: str, source_ids) -> None:
    t, L, H = ctx.t, ctx.layer, ctx.head
    mats = [masked_blank(ctx.rec.pattern(L)[0, H].double().numpy(), [], L),
            masked_blank(pattern_of(run, L, ivs)[H], ivs, L)]
    titles = [t("unchanged", "原模型"), t("changed", "修改后")]
    label_sets = [ctx.labels, ctx.labels]
    rope_off = any(isinstance(iv, I.NoRope) and iv.layer is None for iv in ivs)
    if rope_off:
        perm = M.shuffle_keep_last(len(ctx.ids))
        shuffled = tuple(ctx.ids[i] for i in perm)
        shuf = explorer.whatif_run(ctx.source, shuffled, specs, source_ids)
        mats.append(masked_blank(pattern_of(shuf, L, ivs)[H], ivs, L))
        titles.append(t("changed, words shuffled", "修改后，词序打乱"))
        label_sets.append([f"{i}:{ctx.pieces[j]}" for i, j in enumerate(perm)])
    fig = attention_figure(mats, titles, label_sets, t)
    fig.update_layout(title=t(f"Attention of layer {L}, head {H}", f"第 {L} 层第 {H} 个头的注意力"))
    plots.show(fig, ctx, key="whatif_attn", height=min(700, 260 + 14 * len(ctx.ids)))
    if rope_off:
        draw_shuffle(ctx, ivs, perm, shuffled, specs, source_ids)


def shuffle_rows(ctx: ViewContext, ivs: list, shuffled, specs: str, source_ids) -> list[tuple]:
    """(variant, prompt's last logits, shuffled prompt's last logits) for unchanged, changed, changed + no mask."""
    source, ids, run = ctx.source, tuple(ctx.ids), explorer.whatif_run
    rows = [(ctx.t("unchanged", "原模型"), ctx.rec.logits[0, -1], explorer.recording(source, shuffled).logits[0, -1]),
            (specs, run(source, ids, specs, source_ids)["last"], run(source, shuffled, specs, source_ids)["last"])]
    if not any(isinstance(iv, I.NoMask) and iv.layer is None for iv in ivs):
        both = I.format_list(ivs + [I.NoMask()])
        rows.append((both, run(source, ids, both, source_ids)["last"], run(source, shuffled, both, source_ids)["last"]))
    return rows


def draw_shuffle(ctx: ViewContext, ivs: list, perm, shuffled, specs: str, source_ids) -> None:
    t, piece = ctx.t, ctx.facts.piece
    st.markdown(t("**Same words, another order.** The shuffled prompt keeps the last token in place. Without RoPE, "
                  "attention scores no longer depend on distance, but the causal mask still tells order apart: each position "
                  "sees a different set of earlier words. Remove both and the last position sees just a bag of words: its "
                  "prediction no longer changes with the order (up to rounding).",
                  "**同样的词，换个顺序。** 打乱后的提示词保持最后一个 token 不动。去掉 RoPE 后，注意力分数不再依赖距离，"
                  "但因果掩码仍然能区分顺序：每个位置看到的前文集合不同。两者都去掉后，最后一个位置只看到一袋词，"
                  "它的预测不再随词序变化（仅有舍入误差）。"))
    st.text(t("Shuffled: ", "打乱后：") + " ".join(ctx.pieces[i] for i in perm))  # prompt text: never markdown
    rows = shuffle_rows(ctx, ivs, shuffled, specs, source_ids)
    table = {t("model", "模型"): [], t("top token (prompt)", "最可能 token（原顺序）"): [],
             t("top token (shuffled)", "最可能 token（打乱）"): [], t("max |Δ logit|", "最大 |Δ logit|"): []}
    def top(logits) -> str:
        i, p = V.top_token(logits)
        return f"{display_piece(piece(i))} {p:.3f}"
    for name, a, b in rows:
        for col, v in zip(table, (name, top(a), top(b), V.max_abs_diff(a, b))):
            table[col].append(v)
    st.dataframe(table, hide_index=True)


def draw_sweep(ctx: ViewContext) -> None:
    t, cfg = ctx.t, ctx.cfg
    st.subheader(t("Which heads matter for this prompt?", "对这个提示词，哪些头重要？"))
    st.markdown(t("Ablate every head in turn (the unchanged model otherwise) and measure how the probability of the model's "
                  "own top prediction at the last position changes. Red cells: heads the prediction leans on.",
                  "依次消融每一个头（其余保持不变），测量最后一个位置上模型自己首选 token 的概率如何变化。"
                  "红色格子：预测所依赖的头。"))
    c = st.columns([1, 1, 1])
    _clamp("whatif_sweep_layers", 1, cfg.n_layers, cfg.n_layers)
    n = int(c[0].number_input(t("Layers to sweep (from layer 0)", "扫描的层数（从第 0 层起）"), 1, cfg.n_layers,
                              key="whatif_sweep_layers"))
    mean = c[1].radio(t("Ablation", "消融方式"), [False, True], key="whatif_sweep_mode", horizontal=True,
                      format_func=lambda m: t("mean", "平均") if m else t("zero", "置零")) or False
    key = (ctx.source, tuple(ctx.ids), n, bool(mean))
    if c[2].button(t("Run the sweep", "运行扫描"), key="whatif_sweep_run"):
        bar = st.progress(0.0, text=t("Ablating heads …", "正在消融各个头 …"))
        explorer.head_sweep(*key, progress=lambda d, total: bar.progress(
            d / total, text=t(f"block {d} of {total}", f"第 {d}/{total} 个模块")))
        bar.empty()
        st.session_state["whatif_sweep_key"] = key
    res = explorer.cached_head_sweep(*key) if st.session_state.get("whatif_sweep_key") == key else None
    if res is None:  # not asked for here yet, or evicted from the cache since
        st.caption(t(f"{n} layers × {cfg.n_heads} heads = {n * cfg.n_heads} ablated runs, batched per layer.",
                     f"{n} 层 × {cfg.n_heads} 个头 = {n * cfg.n_heads} 次消融运行，按层成批计算。"))
        return
    delta = np.asarray(res["delta"])
    target = display_piece(ctx.facts.piece(res["target"]))
    plots.show(sweep_figure(delta, res["layers"], target, res["p_clean"], t), ctx, key="whatif_sweep",
               height=min(900, 160 + 22 * len(res["layers"])))
    l, h = np.unravel_index(np.argmin(delta), delta.shape)
    st.caption(t(f"Biggest drop: layer {res['layers'][l]}, head {h} (Δp = {delta[l, h]:+.3f}).",
                 f"下降最多：第 {res['layers'][l]} 层第 {h} 个头（Δp = {delta[l, h]:+.3f}）。"))
    plots.csv_button(ctx, "Sweep (CSV)", "扫描结果（CSV）",
                     lambda: plots.matrix_csv(delta, [str(x) for x in res["layers"]], [str(x) for x in range(cfg.n_heads)],
                                              "layer\\head"), "whatif_sweep.csv", key="whatif_csv_sweep")
