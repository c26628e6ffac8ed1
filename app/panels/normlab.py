"""Pre vs Post-Norm lab: the two trained twins side by side, gradients of fresh models at initialization,
and a short training race. Why LLaMA puts the norm first.

The twins are read through the gateway's cached recordings, never run for drawing. The experiments (in
explorer_model.lab.normlab) run in the gateway's one lab worker process, one at a time server-wide; a visitor
whose experiment waits sees their place in the queue, and finished results are cached by the gateway.
"""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import streamlit as st

from app import explorer, plots
from app.context import ViewContext, display_piece
from app.context import plain as plain_md
from explorer_model.lab import normlab as lab
from explorer_model.lab.corpus import HELDOUT_LINE

COLORS = {"pre": "#4c78a8", "post": "#e45756", "deepnorm": "#54a24b"}
RACE_DASH = {True: "solid", False: "dot"}
RACE_LRS = (3e-4, 1e-3, 3e-3, 1e-2)
RACE_TIME_LIMIT = 60.0


def plain(piece: str) -> str:
    """A token for a Plotly label: whitespace made visible, and <s> not taken for an HTML strike-through tag."""
    return display_piece(piece).replace("<", "‹").replace(">", "›")


def variant_name(t, v: str) -> str:
    return {"pre": t("Pre-Norm", "Pre-Norm（前置）"), "post": t("Post-Norm", "Post-Norm（后置）"),
            "deepnorm": "DeepNorm"}[v]


def run_name(t, key: str) -> str:
    placement, warm = key.split("_")
    return variant_name(t, placement) + (t(", warmup", "，有预热") if warm == "warmup" else t(", no warmup", "，无预热"))


def _fig(fig_id: str, title: str, x_title: str, y_title: str, height: int = 360, **layout) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(title=title, xaxis_title=x_title, yaxis_title=y_title, height=height, meta={"id": fig_id},
                      margin=dict(l=10, r=10, t=50, b=10), legend=dict(orientation="h", y=-0.2), **layout)
    return fig


# --------------------------------------------------------------------------- twin figures
def twin_lines_figure(fig_id, title, x, series: dict, t, y_title, x_title) -> go.Figure:
    """series: {trace meta: (name, values, color, dash[, own x])}"""
    fig = _fig(fig_id, title, x_title, y_title)
    for meta, (name, ys, color, dash, *own_x) in series.items():
        fig.add_trace(go.Scatter(x=list(own_x[0] if own_x else x), y=ys, name=name, meta=meta, mode="lines+markers",
                                 line=dict(color=color, dash=dash),
                                 hovertemplate="%{x}: %{y:.4g}<extra>" + name + "</extra>"))
    return fig


def twin_attention_figure(rec, layer: int, head: int, labels, t, v: str) -> go.Figure:
    z = plots.masked_to_nan(rec.scores(layer)[0, head])
    z = np.where(np.isnan(z), np.nan, rec.pattern(layer)[0, head].float().numpy())
    fig = plots.heatmap(z, x=labels, y=labels, zmin=0, zmax=1, fmt=".3f",
                        title=t(f"{variant_name(t, v)}: layer {layer}, head {head}", f"{variant_name(t, v)}：第 {layer} 层，头 {head}"),
                        x_title=t("key", "键"), y_title=t("query", "查询"), value_name=t("weight", "权重"))
    fig.update_layout(height=360, meta={"id": f"normlab_attn_{v}"})
    return fig


def top_figure(pieces, probs, t, v: str) -> go.Figure:
    fig = _fig(f"normlab_top_{v}", t(f"{variant_name(t, v)}: next token", f"{variant_name(t, v)}：下一个 token"),
               t("probability", "概率"), "", height=260)
    fig.add_trace(go.Bar(x=probs, y=pieces, orientation="h", marker_color=COLORS[v], meta="top",
                         hovertemplate="%{y}: %{x:.4f}<extra></extra>"))
    fig.update_yaxes(autorange="reversed", type="category")
    return fig


def train_grad_figure(curves: dict, t, v: str) -> go.Figure:
    g = np.asarray(curves["grad_down"], dtype=float)  # [log point, layer]
    fig = _fig(f"normlab_train_grads_{v}", t(f"{variant_name(t, v)}: ‖∇W_down‖ per layer while training",
                                              f"{variant_name(t, v)}：训练中各层 ‖∇W_down‖"),
               t("step", "步数"), t("gradient norm (log)", "梯度范数（对数）"), yaxis_type="log")
    for layer in range(g.shape[1]):
        shade = 0.45 + 0.55 * layer / max(g.shape[1] - 1, 1)
        fig.add_trace(go.Scatter(x=curves["grad_step"], y=g[:, layer], name=t(f"layer {layer}", f"第 {layer} 层"),
                                 meta=f"L{layer}", mode="lines", line=dict(color=COLORS[v], width=1 + 2 * shade),
                                 opacity=shade))
    return fig


# --------------------------------------------------------------------------- experiment figures
def variants_figure(fig_id, title, x, ys_by_variant: dict, t, x_title, y_title, log_y=False, log_x=False) -> go.Figure:
    fig = _fig(fig_id, title, x_title, y_title, yaxis_type="log" if log_y else None, xaxis_type="log" if log_x else None)
    if log_x:
        fig.update_xaxes(tickvals=list(x))
    for v, ys in ys_by_variant.items():
        fig.add_trace(go.Scatter(x=list(x), y=ys, name=variant_name(t, v), meta=v, mode="lines+markers",
                                 line=dict(color=COLORS[v]), hovertemplate="%{x}: %{y:.4g}<extra></extra>"))
    return fig


def race_figure(result: dict | None, t, shipped: dict | None = None, fig_id: str = "normlab_race") -> go.Figure:
    """Live (or finished) race curves, with the shipped seeds faint behind them, and the unigram line."""
    fig = _fig(fig_id, t("Training loss: Pre vs Post, with and without warmup", "训练损失：Pre 与 Post，有无预热"),
               t("step", "步数"), t("training loss (nats / token)", "训练损失（奈特 / token）"), height=420)
    if shipped:  # faint behind a live race; the legend names them only when they are alone
        for i, (seed, runs) in enumerate(shipped["seeds"].items()):
            for key, ys in runs.items():
                fig.add_trace(go.Scatter(x=shipped["steps"], y=ys, name=run_name(t, key), legendgroup=key,
                                         meta=f"shipped_{key}_{seed}", mode="lines", opacity=0.3 if result else 0.8,
                                         showlegend=i == 0 and not result,
                                         hovertemplate=t("seed", "种子") + f" {seed}, " + "%{x}: %{y:.3f}<extra></extra>",
                                         line=dict(color=COLORS[key.split("_")[0]], dash=RACE_DASH[key.endswith("_warmup")], width=1.5)))
    if result:
        for key, ys in result["curves"].items():
            fig.add_trace(go.Scatter(x=result["steps"], y=ys, name=run_name(t, key), meta=key, mode="lines",
                                     legendgroup=key, hovertemplate="%{x}: %{y:.3f}<extra></extra>",
                                     line=dict(color=COLORS[key.split("_")[0]], dash=RACE_DASH[key.endswith("_warmup")], width=3)))
    h = (result or shipped or {}).get("unigram_entropy")
    if h is not None:
        fig.add_hline(y=h, line=dict(color="gray", dash="dash"),
                      annotation_text=t(f"unigram entropy {h:.2f}: learned token frequencies only",
                                        f"一元熵 {h:.2f}：只学会了 token 频率"), annotation_position="top right")
    return fig


# --------------------------------------------------------------------------- experiments (in the gateway's lab worker)
def wait_for(job, t, box, on_partial=None, label=None):
    """Wait for a lab job, showing the place in the queue or the progress; returns the result.
    on_partial(partial) runs once for each new partial result (e.g. a race's next log point)."""
    drawn = [None]

    def update(j) -> None:
        pos = j.position()
        if pos > 0:
            box.info(t(f"Waiting for the lab: {pos} experiment(s) ahead of yours (one runs at a time on this server).",
                       f"正在排队：前面还有 {pos} 个实验（本服务器一次只运行一个）。"))
        else:
            text = (label(j) if label and j.partial else j.message) or t("starting …", "正在启动 …")
            box.progress(min(max(j.fraction, 0.0), 1.0), text=text)
            if on_partial and j.partial and j.partial is not drawn[0]:
                drawn[0] = j.partial
                on_partial(j.partial)
    r = job.wait(update)
    box.empty()
    return r


def init_gradients(ffn: str, init: str, norm: str, depth: int, t=None, box=None) -> dict:
    job = explorer.lab_init_gradients(lab.LabOptions(ffn=ffn, init=init, norm=norm), depth)
    return wait_for(job, t, box) if box is not None else job.result()


# --------------------------------------------------------------------------- sections
def draw_intro(ctx: ViewContext) -> None:
    st.markdown(ctx.t(
        "Where the normalization sits decides how gradients travel. **Post-Norm** (the 2017 Transformer) "
        "normalizes *after* adding the sublayer's output, so every signal, forward and backward, passes "
        "through every norm. **Pre-Norm** (GPT-2, LLaMA) normalizes only the *input* of each sublayer and "
        "leaves the residual sum untouched: an identity path runs from the loss to the first layer. "
        "**DeepNorm** keeps Post-Norm but up-weights the residual by α and shrinks the initial weights by β.",
        "归一化放在哪里，决定了梯度如何传递。**Post-Norm**（2017 年的 Transformer）在加上子层输出*之后*才归一化，"
        "前向和反向的信号都要穿过每一个归一化。**Pre-Norm**（GPT-2、LLaMA）只归一化每个子层的*输入*，"
        "残差求和本身不动：从损失到第一层有一条恒等通路。**DeepNorm** 保留 Post-Norm，但把残差放大 α 倍，"
        "并把初始权重缩小 β 倍。"))
    st.latex(r"\begin{aligned}\text{Pre:}\quad & x_{l+1}=x_l+F(\mathrm{Norm}(x_l))\\"
             r"\text{Post:}\quad & x_{l+1}=\mathrm{Norm}(x_l+F(x_l))\\"
             r"\text{DeepNorm:}\quad & x_{l+1}=\mathrm{Norm}(\alpha x_l+F(x_l)),\quad \alpha=(2N)^{1/4},\ "
             r"W_{V,O,\mathrm{FFN}}\sim\beta\cdot\text{init},\ \beta=(8N)^{-1/4}\end{aligned}")


def _twin_recordings(ctx: ViewContext):
    """{variant: (facts, ids, rec, line_rec)} for the twins, or None with a message if they are missing."""
    twins, err = explorer.twin_recordings(st.session_state.get("prompt") or "",
                                          int(st.session_state.get("max_tokens") or 256))
    if twins is None:
        st.info(ctx.t(f"A twin is not available ({plain_md(err)}).", f"孪生模型不可用（{plain_md(err)}）。"))
        return None
    return {v: (w["facts"], w["ids"], w["rec"], w["line_rec"]) for v, w in twins.items()}


def draw_twins(ctx: ViewContext) -> dict | None:
    st.subheader(ctx.t("1 · The trained twins on your prompt", "1 · 训练好的孪生模型读你的提示词"))
    twins = _twin_recordings(ctx)
    if twins is None:
        return None
    t = ctx.t
    cfg = twins["pre"][2].cfg
    st.markdown(t(
        f"`tiny-pre` and `tiny-post`: {cfg.n_layers} layers, d = {cfg.d_model}, same data, same initial weights, "
        "same schedule; only the norm placement differs. They read the prompt in their own tokenizer "
        f"({len(twins['pre'][1])} tokens).",
        f"`tiny-pre` 与 `tiny-post`：{cfg.n_layers} 层，d = {cfg.d_model}，数据、初始权重、学习率计划都相同，"
        f"只有归一化的位置不同。它们用自己的分词器读提示词（{len(twins['pre'][1])} 个 token）。"))
    res = {v: lab.residual_norms(twins[v][2]) for v in twins}
    layers_x = ["emb"] + [f"L{i}" for i in range(cfg.n_layers)]
    plots.show(twin_lines_figure("normlab_resid", t("Residual-stream size after each block (mean ‖x‖ over tokens)",
                                                    "每个模块之后残差流的大小（各 token ‖x‖ 的平均）"),
                                 layers_x, {v: (variant_name(t, v), res[v], COLORS[v], "solid") for v in res}, t,
                                 "‖x‖", t("layer", "层")), ctx, key="normlab_resid_fig")
    st.caption(t(
        f"Pre-Norm lets the residual grow ({res['pre'][1]:.3g} → {res['pre'][-1]:.3g}): each block adds to it and "
        f"nothing shrinks it until the final norm. Post-Norm re-normalizes after every block, so its size stays "
        f"pinned, set by the norms' gains γ rather than by depth ({res['post'][-1]:.3g} at the output).",
        f"Pre-Norm 的残差不断增长（{res['pre'][1]:.3g} → {res['pre'][-1]:.3g}）：每个模块都往上加，直到最终归一化才缩回。"
        f"Post-Norm 每个模块后都重新归一化，大小被钉住，由归一化的增益 γ 决定而与深度无关（输出处为 {res['post'][-1]:.3g}）。"))
    sc = {f"{v}_{w}": (f"{variant_name(t, v)} {w}", lab.norm_scales(twins[v][2], w), COLORS[v],
                       "solid" if w == "ln1" else "dot") for v in twins for w in ("ln1", "ln2")}
    plots.show(twin_lines_figure("normlab_scales", t("Norm divisors per layer (mean over tokens)", "每层归一化的除数（各 token 平均）"),
                                 layers_x[1:], sc, t, t("divisor", "除数"), t("layer", "层")), ctx, key="normlab_scales_fig")
    st.caption(t("A Pre-Norm divisor is the size of the residual read at that point, so it climbs with depth; a "
                 "Post-Norm divisor measures x + F(x) just before it is squeezed back.",
                 "Pre-Norm 的除数就是该处残差的大小，所以随深度上升；Post-Norm 的除数衡量的是被压回之前的 x + F(x)。"))
    cols = st.columns(2)
    for col, v in zip(cols, ("pre", "post")):
        loaded, ids, rec, line_rec = twins[v]
        labels = [f"{i}:{plain(loaded.piece(x))}" for i, x in enumerate(ids)]
        layer, head = min(ctx.layer, rec.cfg.n_layers - 1), min(ctx.head, rec.cfg.n_heads - 1)
        with col:
            plots.show(twin_attention_figure(rec, layer, head, labels, t, v), ctx, key=f"normlab_attn_{v}_fig")
            top, probs = lab.top_predictions(rec)
            plots.show(top_figure([plain(loaded.piece(i)) for i in top], probs, t, v), ctx,
                       key=f"normlab_top_{v}_fig")
            st.metric(t("loss on the held-out line", "留出句上的损失"), f"{lab.sequence_loss(line_rec):.3f}",
                      help=t(f"“{HELDOUT_LINE}” (from Hamlet, never trained on); nats per token",
                             f"“{HELDOUT_LINE}”（出自《哈姆雷特》，训练中从未见过）；单位：奈特 / token"))
    st.caption(t("Layer and head follow the sidebar, clamped to the twins' size.", "层与头跟随侧边栏，超出孪生模型规模时取最大值。"))
    rows = lambda: plots.to_csv(["twin", "layer", "resid_norm_after", "ln1_divisor", "ln2_divisor"],  # noqa: E731
                                ([v, i, res[v][i + 1], sc[f"{v}_ln1"][1][i], sc[f"{v}_ln2"][1][i]]
                                 for v in res for i in range(cfg.n_layers)))
    plots.csv_button(ctx, "Twins per layer (CSV)", "孪生模型逐层数值（CSV）", rows, "normlab_twins.csv", key="normlab_csv_twins")
    draw_train_logs(ctx)
    return twins


def draw_train_logs(ctx: ViewContext) -> None:
    t = ctx.t
    logs = {v: lab.train_log(name) for v, name in zip(("pre", "post"), lab.TWINS)}
    if any(l is None for l in logs.values()):
        st.info(t("Training logs of the twins are missing.", "缺少孪生模型的训练日志。"))
        return
    curves = {v: lab.log_curves(l) for v, l in logs.items()}
    series = {}
    for v, c in curves.items():
        series[f"{v}_train"] = (f"{variant_name(t, v)} · " + t("train", "训练"), c["train_loss"], COLORS[v], "solid", c["step"])
        series[f"{v}_heldout"] = (f"{variant_name(t, v)} · " + t("held-out", "留出"), c["heldout_loss"], COLORS[v], "dot", c["step"])
    fig = twin_lines_figure("normlab_train_loss", t("How the twins were trained: loss", "孪生模型的训练过程：损失"),
                            curves["pre"]["step"], series, t, t("loss (nats / token)", "损失（奈特 / token）"), t("step", "步数"))
    h = logs["pre"].get("unigram_entropy_train")
    if h:
        fig.add_hline(y=h, line=dict(color="gray", dash="dash"), annotation_text=t("unigram entropy", "一元熵"))
    plots.show(fig, ctx, key="normlab_train_loss_fig")
    cols = st.columns(2)
    for col, v in zip(cols, ("pre", "post")):
        with col:
            plots.show(train_grad_figure(curves[v], t, v), ctx, key=f"normlab_train_grads_{v}_fig")
    fin = {v: logs[v].get("final", {}) for v in logs}
    tc = logs["post"].get("train_config", {})
    ratio = {v: [g[-1] / g[0] for g in (curves[v]["grad_down"][0], curves[v]["grad_down"][-1])] for v in curves}
    nan = float("nan")
    st.caption(t(
        f"Both twins: {tc.get('steps', '?')} steps, peak learning rate {tc.get('lr', nan):g} after {tc.get('warmup', '?')} "
        f"warmup steps. Final held-out loss: Pre {fin['pre'].get('heldout_loss', nan):.3f}, Post "
        f"{fin['post'].get('heldout_loss', nan):.3f} (unigram baseline on the same text "
        f"{logs['pre'].get('unigram_cross_entropy_heldout', nan):.3f}). Last/first layer ‖∇W_down‖ at the first and last "
        f"log entries: Pre {ratio['pre'][0]:.2f} → {ratio['pre'][1]:.2f}, Post {ratio['post'][0]:.2f} → {ratio['post'][1]:.2f}.",
        f"两个模型：{tc.get('steps', '?')} 步，预热 {tc.get('warmup', '?')} 步后学习率峰值 {tc.get('lr', nan):g}。"
        f"最终留出损失：Pre {fin['pre'].get('heldout_loss', nan):.3f}，Post {fin['post'].get('heldout_loss', nan):.3f}"
        f"（同一文本上的一元基线 {logs['pre'].get('unigram_cross_entropy_heldout', nan):.3f}）。"
        f"首末两条日志中最后一层 / 第一层的 ‖∇W_down‖ 之比：Pre {ratio['pre'][0]:.2f} → {ratio['pre'][1]:.2f}，"
        f"Post {ratio['post'][0]:.2f} → {ratio['post'][1]:.2f}。"))


def draw_init(ctx: ViewContext) -> dict | None:
    t = ctx.t
    st.subheader(t("2 · Gradients at initialization", "2 · 初始化时的梯度"))
    st.markdown(t(
        "Fresh random models (d = 64, 4 heads), one batch of 4 × 32 random tokens with word-like (Zipf) "
        "frequencies. For every layer: the gradient norm of the FFN output matrix W_down. Numbers are averaged "
        "over 5 initializations (2 for the depth sweeps) because a single model is noisy.",
        "全新的随机模型（d = 64，4 个头），一批 4 × 32 个按词频规律（Zipf）抽取的随机 token。"
        "对每一层求前馈输出矩阵 W_down 的梯度范数。数值是 5 次随机初始化的平均（深度扫描为 2 次），因为单个模型噪声很大。"))
    c = st.columns(4)
    ffn = c[0].radio(t("FFN", "前馈网络"), ("relu", "swiglu"), key="lab_ffn", horizontal=True,
                     format_func=lambda x: {"relu": "ReLU", "swiglu": "SwiGLU"}[x])
    init = c[1].radio(t("Initialization", "初始化"), ("xavier", "llama"), key="lab_init", horizontal=True,
                      format_func=lambda x: {"xavier": "Xavier", "llama": "N(0, 0.02)"}[x])
    norm = c[2].radio(t("Norm", "归一化"), ("layer", "rms"), key="lab_norm", horizontal=True,
                      format_func=lambda x: {"layer": "LayerNorm", "rms": "RMSNorm"}[x])
    depth = c[3].select_slider(t("Depth N", "深度 N"), lab.DEPTHS, value=12, key="lab_depth")
    if st.button(t("Run the experiment (≈ 5–20 s)", "运行实验（约 5–20 秒）"), key="lab_init_run"):
        st.session_state["lab_init_go"] = True
    if not st.session_state.get("lab_init_go"):
        st.info(t("Press the button; results are kept for each combination of options.", "请按按钮；每组选项的结果都会被保存。"))
        return None
    r = init_gradients(ffn, init, norm, int(depth), t, st.empty())
    prof, sweep = r["profile"], r["sweep"]
    ratio = {v: lab.last_first_ratio(prof[v]["grad_down"]) for v in prof}
    grows = {v: sum(x > 1 for x in prof[v]["ratio_seeds"]) for v in prof}
    plots.show(variants_figure("normlab_init_profile", t(f"‖∇W_down‖ per layer at initialization, N = {depth}",
                                                          f"初始化时各层的 ‖∇W_down‖，N = {depth}"),
                               range(depth), {v: prof[v]["grad_down"] for v in prof}, t, t("layer", "层"),
                               t("gradient norm", "梯度范数")), ctx, key="normlab_init_profile_fig")
    st.caption(t(
        f"Last/first layer ratio: Pre {ratio['pre']:.2f}, Post {ratio['post']:.2f}, DeepNorm {ratio['deepnorm']:.2f} "
        f"(single models above 1: Pre {grows['pre']}/{len(r['seeds'])}, Post {grows['post']}/{len(r['seeds'])}, "
        f"DeepNorm {grows['deepnorm']}/{len(r['seeds'])}). ",
        f"最后一层 / 第一层之比：Pre {ratio['pre']:.2f}，Post {ratio['post']:.2f}，DeepNorm {ratio['deepnorm']:.2f}"
        f"（单个模型中比值大于 1 的：Pre {grows['pre']}/{len(r['seeds'])}，Post {grows['post']}/{len(r['seeds'])}，"
        f"DeepNorm {grows['deepnorm']}/{len(r['seeds'])}）。") + init_lesson(t, ffn, init))
    depths = r["depths"]
    plots.show(variants_figure("normlab_init_depth", t("Last layer's ‖∇W_down‖ against depth", "最后一层 ‖∇W_down‖ 随深度的变化"),
                               depths, {v: sweep[v]["last_grad"] for v in sweep}, t, t("layers N (log)", "层数 N（对数）"),
                               t("gradient norm (log)", "梯度范数（对数）"), log_y=True, log_x=True), ctx, key="normlab_init_depth_fig")
    lg = {v: sweep[v]["last_grad"] for v in sweep}
    st.caption(t(
        f"From {depths[0]} to {depths[-1]} layers the last layer's gradient goes Pre {lg['pre'][0]:.3g} → {lg['pre'][-1]:.3g}, "
        f"Post {lg['post'][0]:.3g} → {lg['post'][-1]:.3g}, DeepNorm {lg['deepnorm'][0]:.3g} → {lg['deepnorm'][-1]:.3g}. "
        "Post-Norm's top layer gets the same large gradient however deep the model is; Xiong et al. argue this is why "
        "it needs warmup and a small learning rate. Pre-Norm's shrinks with depth (about as 1/√N), which tames deep models.",
        f"从 {depths[0]} 层到 {depths[-1]} 层，最后一层的梯度：Pre {lg['pre'][0]:.3g} → {lg['pre'][-1]:.3g}，"
        f"Post {lg['post'][0]:.3g} → {lg['post'][-1]:.3g}，DeepNorm {lg['deepnorm'][0]:.3g} → {lg['deepnorm'][-1]:.3g}。"
        "无论多深，Post-Norm 顶层拿到的梯度都一样大；Xiong 等认为这正是它需要预热和小学习率的原因。Pre-Norm 的随深度变小（约按 1/√N），深层模型因此更好驯服。"))
    cols = st.columns(2)
    with cols[0]:
        plots.show(variants_figure("normlab_init_resid", t(f"Residual RMS after each block, N = {depth}", f"每个模块后的残差 RMS，N = {depth}"),
                                   range(depth), {v: prof[v]["resid_rms"] for v in prof}, t, t("layer", "层"), "RMS"),
                   ctx, key="normlab_init_resid_fig")
    oc = {v: sweep[v]["output_change"] for v in sweep}
    with cols[1]:
        plots.show(variants_figure("normlab_init_update", t("Output change after one Adam step (lr 1e-3)", "一步 Adam（lr 1e-3）后输出的变化"),
                                   depths, oc, t, t("layers N (log)", "层数 N（对数）"), t("RMS change of the logits", "logits 变化的 RMS"), log_x=True),
                   ctx, key="normlab_init_update_fig")
    st.caption(t(
        f"Left: Pre-Norm's residual grows layer by layer (RMS {prof['pre']['resid_rms'][0]:.2f} → {prof['pre']['resid_rms'][-1]:.2f}); "
        f"Post-Norm and DeepNorm are pinned at 1 by their norms. Right: one update of fixed size moves the output "
        f"of a {depths[-1]}-layer model by Pre {oc['pre'][-1]:.3g}, Post {oc['post'][-1]:.3g}, "
        f"DeepNorm {oc['deepnorm'][-1]:.3g} (at {depths[0]} layers: {oc['pre'][0]:.3g}, {oc['post'][0]:.3g}, {oc['deepnorm'][0]:.3g}). "
        "Liu et al. (2020) call this amplification: Post-Norm leans on every residual branch, so small changes in many "
        "layers add up. Here Post moves more than Pre at every depth, but by a factor, not a different growth law; "
        "DeepNorm's α and β are built to keep this change bounded.",
        f"左：Pre-Norm 的残差逐层变大（RMS {prof['pre']['resid_rms'][0]:.2f} → {prof['pre']['resid_rms'][-1]:.2f}）；"
        f"Post-Norm 与 DeepNorm 被各自的归一化钉在 1。右：同样大小的一步更新，使 {depths[-1]} 层模型的输出变化："
        f"Pre {oc['pre'][-1]:.3g}，Post {oc['post'][-1]:.3g}，DeepNorm {oc['deepnorm'][-1]:.3g}"
        f"（{depths[0]} 层时：{oc['pre'][0]:.3g}、{oc['post'][0]:.3g}、{oc['deepnorm'][0]:.3g}）。Liu 等（2020）称之为放大效应："
        "Post-Norm 依赖每一个残差分支，许多层的小变化会累加起来。这里 Post 在每个深度都比 Pre 动得多，但只是倍数差别，"
        "增长规律并无不同；DeepNorm 的 α 和 β 正是为了让这个变化有界。"))
    rows = lambda: plots.to_csv(["variant", "depth", "layer", "grad_down", "resid_rms"],  # noqa: E731
                                ([v, depth, i, g, x] for v in prof for i, (g, x) in
                                 enumerate(zip(prof[v]["grad_down"], prof[v]["resid_rms"]))))
    plots.csv_button(ctx, "Per-layer numbers (CSV)", "逐层数值（CSV）", rows, "normlab_init.csv", key="normlab_csv_init")
    return r


def init_lesson(t, ffn: str, init: str) -> str:
    """What a student should see for these options; the numbers quoted are from our runs (12 layers, 5 inits)."""
    pre = t("Pre-Norm's gradients shrink toward the output (ratio ≈ 0.3–0.5 in our 12-layer runs): every layer gets the loss's "
            "gradient straight through the identity path, and the early ones also collect it through every later branch. ",
            "Pre-Norm 的梯度越靠近输出越小（我们在 12 层时测得比值约 0.3–0.5）：每层都经恒等通路直接拿到损失的梯度，"
            "而靠前的层还会经由后面每个分支再收集一份。")
    if init == "llama":
        return pre + t(
            "With N(0, 0.02) every sublayer starts out tiny next to the residual, so Post-Norm's norms see almost "
            "only x and all its layers get about the same gradient (ratio ≈ 1.0 in our 12-layer runs): at the start a shallow "
            "Post-Norm model is not handicapped, one reason it can train well with this init.",
            "用 N(0, 0.02) 初始化时，每个子层的输出起初都远小于残差，Post-Norm 的归一化几乎只看到 x，各层梯度差不多"
            "（我们在 12 层时测得比值约 1.0）：起步时浅层 Post-Norm 并不吃亏，这是它在这种初始化下能训练好的原因之一。")
    if ffn == "swiglu":
        return pre + t(
            "With SwiGLU Post-Norm's rise toward the output flattens, here even reverses (ratio ≈ 0.4–0.7 in our "
            "runs). A likely reason: the gate sends back more gradient than it lets signal forward, which undoes the "
            "shrinking at each Post-Norm norm.",
            "换成 SwiGLU 后，Post-Norm 越靠近输出越大的趋势变平，在这里甚至反转（我们在 12 层时测得比值约 0.4–0.7）。"
            "可能的原因：门控反向传回的梯度比前向放出的信号多，抵消了每个 Post-Norm 归一化处的缩小。")
    return pre + t(
        "With Xavier init and ReLU, Post-Norm's gradients grow toward the output (ratio ≈ 1.1–1.8 in our 12-layer runs), the "
        "ordering Xiong et al. (2020, Fig. 3) report: each norm divides the backward signal by the size of x + F(x). "
        "At this size the rise is modest and holds on average; single models can break it.",
        "Xavier 初始化加 ReLU 时，Post-Norm 的梯度越靠近输出越大（我们在 12 层时测得比值约 1.1–1.8），与 Xiong 等（2020，图 3）"
        "的结论一致：每个归一化都把反向信号除以 x + F(x) 的大小。在这么小的模型里上升幅度不大，只在平均意义上成立，单个模型可能例外。")


def draw_race(ctx: ViewContext) -> dict | None:
    t = ctx.t
    st.subheader(t("3 · Training race", "3 · 训练赛跑"))
    st.markdown(t(
        "Four small models with LLaMA's recipe (RMSNorm, SwiGLU, N(0, 0.02), d = 64) train on the same "
        "Shakespeare batches with Adam: Pre and Post, each with a linear warmup over the first quarter of the "
        "steps and without one. The dashed line is the unigram entropy: a model sitting on it has learned "
        "which tokens are common, and nothing about context.",
        "四个采用 LLaMA 配方（RMSNorm、SwiGLU、N(0, 0.02)，d = 64）的小模型，用 Adam 在相同的莎士比亚文本批次上训练："
        "Pre 与 Post，各自有或没有在前四分之一步数内线性预热。虚线是一元熵：停在这条线上的模型只学会了哪些 token 常见，"
        "对上下文一无所知。"))
    c = st.columns(3)
    depth = c[0].select_slider(t("Layers", "层数"), (2, 4, 6, 8, 12), value=6, key="lab_race_depth")
    lr = c[1].select_slider(t("Learning rate", "学习率"), RACE_LRS, value=1e-3, key="lab_race_lr", format_func=lambda x: f"{x:g}")
    steps = int(c[2].number_input(t("Steps", "步数"), 4, 2000, 300, step=50, key="lab_race_steps"))
    shipped_all = lab.load_race_curves()
    shipped = (shipped_all or {}).get("runs", {}).get(lab.race_grid_key(int(depth), float(lr)))
    if shipped:
        shipped = {**shipped, "unigram_entropy": shipped_all["unigram_entropy"]}
        plots.show(race_figure(None, t, shipped, fig_id="normlab_race_shipped"), ctx, key="normlab_race_shipped_fig")
        st.caption(race_summary(shipped, t))
    if shipped_all:
        st.markdown(t(*RACE_LESSON))
    if not shipped:
        st.info(t("No precomputed curves for this setting (shipped: 6 and 12 layers at lr 0.001 and 0.003).",
                  "该设置没有预先算好的曲线（随附的有：6 层和 12 层，学习率 0.001 与 0.003）。"))
    rc = lab.RaceConfig(depth=int(depth), lr=float(lr), steps=steps, log_every=max(1, steps // 30))
    if st.button(t(f"Start the race (≤ {RACE_TIME_LIMIT:.0f} s)", f"开始赛跑（≤ {RACE_TIME_LIMIT:.0f} 秒）"), key="lab_race_start"):
        box, bar = st.empty(), st.empty()

        def live(r):
            box.plotly_chart(race_figure(r, t, shipped, fig_id="normlab_race_live"), key=f"normlab_race_live_{len(r['steps'])}")

        def label(j) -> str:
            step, sec = j.partial["steps"][-1], j.partial["seconds"]
            return t(f"step {step} · {sec:.0f} s", f"第 {step} 步 · {sec:.0f} 秒")

        st.session_state["lab_race_result"] = wait_for(explorer.lab_race(rc, RACE_TIME_LIMIT), t, bar, live, label)
        box.empty()
    r = st.session_state.get("lab_race_result")
    if r:
        plots.show(race_figure(r, t, shipped, fig_id="normlab_race_live"), ctx, key="normlab_race_result_fig")
        if not r["completed"]:
            st.warning(t(f"Stopped at step {r['steps'][-1]} of {r['config']['steps']} after {r['seconds']:.0f} s.",
                         f"用时 {r['seconds']:.0f} 秒，在第 {r['steps'][-1]} 步（共 {r['config']['steps']} 步）停止。"))
        st.caption(race_summary({"steps": r["steps"], "seeds": {"live": r["curves"]},
                                 "unigram_entropy": r["unigram_entropy"]}, t))
    runs = [("live", r["steps"], r["curves"])] if r else []
    runs += [(f"shipped_seed{k}", shipped["steps"], c) for k, c in shipped["seeds"].items()] if shipped else []
    if runs:
        rows = lambda: plots.to_csv(["source", "step", *lab.RUN_KEYS],  # noqa: E731
                                    ([src, step, *(c[k][i] for k in lab.RUN_KEYS)] for src, steps, c in runs
                                     for i, step in enumerate(steps)))
        plots.csv_button(ctx, "Race curves (CSV)", "赛跑曲线（CSV）", rows, f"normlab_race_{depth}L_lr{lr:g}.csv",
                         key="normlab_csv_race")
    return r


def race_summary(shipped: dict, t) -> str:
    """Final losses per run (range over seeds) and when each left the unigram plateau, in words."""
    h, steps = shipped["unigram_entropy"], shipped["steps"]

    def rng(xs, f="{:.2f}"):
        xs = sorted(x for x in xs if x is not None)
        return "–".join(dict.fromkeys(f.format(x) for x in (xs[0], xs[-1]))) if xs else "–"

    en, zh = [], []
    for k in lab.RUN_KEYS:
        runs = [r[k] for r in shipped["seeds"].values()]
        esc = [lab.escape_step(steps, ys, h) for ys in runs]
        final, never, off = rng([ys[-1] for ys in runs]), sum(e is None for e in esc), rng(esc, "{}")
        if never == len(esc):
            en.append(f"{run_name(t, k)} {final} (never off the plateau)")
            zh.append(f"{run_name(t, k)} {final}（从未离开平台）")
        else:
            en.append(f"{run_name(t, k)} {final} (off the plateau at step {off}" + (f"; never in {never} of {len(esc)}" if never else "") + ")")
            zh.append(f"{run_name(t, k)} {final}（第 {off} 步离开平台" + (f"；{len(esc)} 次中 {never} 次从未离开" if never else "") + "）")
    return t(f"Final training loss after {steps[-1]} steps: " + "; ".join(en) +
             f". Off the plateau = 0.15 below the unigram entropy {h:.2f}.",
             f"{steps[-1]} 步后的训练损失：" + "；".join(zh) + f"。离开平台指比一元熵 {h:.2f} 低 0.15 以上。")


RACE_LESSON = (
    "What to see in the shipped runs (3 seeds each, 300 steps): Pre-Norm leaves the unigram plateau in every setting "
    "and seed, with or without warmup, by step 60–150. At 6 layers and lr 0.001 Post-Norm gets off it too, but later "
    "(steps 140–280), and without warmup the seeds spread widely; warmup makes it steadier. At lr 0.003, or at 12 "
    "layers, Post-Norm sits on the unigram line for all 300 steps in every seed, and this short warmup does not save "
    "it. The twins above show the other side: with a longer schedule, warmup and a small init whose residual "
    "outputs shrink with depth, the 6-layer Post-Norm twin trains fine (compare their held-out losses). Small models are forgiving; depth and learning rate "
    "are where Post-Norm breaks, and where Pre-Norm's identity path pays off.",
    "随附的几组结果（每组 3 个种子，300 步）里能看到什么：Pre-Norm 在所有设置和种子下都会离开一元熵平台，"
    "无论有无预热，都在第 60–150 步之间。6 层、学习率 0.001 时 Post-Norm 也能离开，但更晚（第 140–280 步），"
    "而且不预热时各种子差异很大；预热让它更稳定。学习率 0.003 或 12 层时，Post-Norm 在每个种子下都整整 300 步"
    "停在一元熵线上，这么短的预热救不了它。上面的孪生模型展示了另一面：训练更久、有预热、残差输出随深度缩小的小初始化，"
    "6 层的 Post-Norm 孪生照样训练得不错（可比较两者的留出损失）。小模型比较宽容；真正让 Post-Norm 出问题的是深度和学习率，"
    "而 Pre-Norm 的恒等通路正是在这里显出价值。")


def draw(ctx: ViewContext) -> None:
    draw_intro(ctx)
    draw_twins(ctx)
    st.divider()
    draw_init(ctx)
    st.divider()
    draw_race(ctx)
