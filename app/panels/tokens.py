"""Tokens and shapes: text -> ids -> embedding rows, the tensor shape at every step, parameters, KV cache.

Everything comes from the recording and the model's facts (the embedding rows shown from the gateway); nothing
here runs the model.
"""
from __future__ import annotations

import html

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from app import explorer, plots
from app.context import ViewContext, plain

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


def chips_html(rows: list[dict], selected: int) -> str:
    """Coloured chips, one per token; every piece of text is escaped (prompts are user input)."""
    out = []
    for r in rows:
        colour = "#e5e7eb" if r["special"] else CHIP_COLOURS[r["position"] % len(CHIP_COLOURS)]
        border = "2px solid #dc2626" if r["position"] == selected else (
            "2px dashed #7c3aed" if not r["whole_utf8"] else "1px solid #9ca3af")
        tip = html.escape(f"{r['position']}: id {r['id']}, bytes {r['bytes']}", quote=True)
        out.append(
            f'<span title="{tip}" style="display:inline-block;margin:2px;padding:2px 6px;border-radius:6px;'
            f'background:{colour};color:#111827;border:{border};font-family:monospace;white-space:pre">'
            f'{html.escape(r["piece"])}<sub style="color:#6b7280;margin-left:3px">{r["id"]}</sub></span>')
    return '<div style="line-height:2.1">' + "".join(out) + "</div>"


def _shape_steps(cfg, layer: int, has_final_norm: bool):
    """(English, 中文, symbolic, expected shape without B, hook name, permutation from hook layout)."""
    L, norm = layer, "RMSNorm" if cfg.norm_type == "rms" else "LayerNorm"
    ffn = "SwiGLU" if cfg.ffn_type == "swiglu" else "FFN"
    gqa_en, gqa_zh = (" (GQA)", "（GQA）") if cfg.n_rep > 1 else ("", "")
    qkv = (0, 2, 1, 3)  # hooks keep [B, T, heads, Dh]; the matmul works on [B, heads, T, Dh]
    steps = [
        ("token ids", "token id", "[B, T]", ("T",), "token_ids", None),
        ("embedding x = E[t]", "嵌入 x = E[t]", "[B, T, D]", ("T", "D"), "hook_embed", None),
        (f"{norm} (ln1)", f"{norm}（ln1）", "[B, T, D]", ("T", "D"), f"blocks.{L}.ln1.hook_normalized", None),
        ("Q", "Q", "[B, H, T, Dh]", ("H", "T", "Dh"), f"blocks.{L}.attn.hook_q", qkv),
        ("K" + gqa_en, "K" + gqa_zh, "[B, H_kv, T, Dh]", ("Hkv", "T", "Dh"), f"blocks.{L}.attn.hook_k", qkv),
        ("V" + gqa_en, "V" + gqa_zh, "[B, H_kv, T, Dh]", ("Hkv", "T", "Dh"), f"blocks.{L}.attn.hook_v", qkv),
        ("scores QKᵀ/√Dh", "分数 QKᵀ/√Dh", "[B, H, T, T]", ("H", "T", "T"), f"blocks.{L}.attn.hook_attn_scores", None),
        ("pattern softmax", "注意力权重 softmax", "[B, H, T, T]", ("H", "T", "T"), f"blocks.{L}.attn.hook_pattern", None),
        ("attention output", "注意力输出", "[B, T, D]", ("T", "D"), f"blocks.{L}.hook_attn_out", None),
        (f"{ffn} hidden", f"{ffn} 隐藏层", "[B, T, Dff]", ("T", "Dff"), f"blocks.{L}.mlp.hook_post", None),
        ("block output", "模块输出", "[B, T, D]", ("T", "D"), f"blocks.{L}.hook_resid_post", None),
    ]
    if has_final_norm:
        steps.append((f"final {norm}", f"最终 {norm}", "[B, T, D]", ("T", "D"), "ln_final.hook_normalized", None))
    steps.append(("logits", "logits", "[B, T, V]", ("T", "V"), "logits", None))
    return steps


def shape_rows(rec, cfg, layer: int, t=lambda en, zh: en) -> list[dict]:
    """Each step's symbolic and numeric shape, checked against the tensor the recording holds."""
    T = rec.n_pos
    sizes = {"T": T, "D": cfg.d_model, "H": cfg.n_heads, "Hkv": cfg.n_kv_heads, "Dh": cfg.head_dim,
             "Dff": cfg.d_ff, "V": cfg.vocab_size}
    rows = []
    for en, zh, sym, dims, hook, perm in _shape_steps(cfg, layer, cfg.norm_placement == "pre"):
        expected = [1] + [sizes[d] for d in dims]
        if hook == "token_ids":
            got = list(rec.token_ids.shape)
        elif hook == "logits":
            got = list(rec.logits.shape)
        elif hook in rec:
            got = list(rec[hook].shape)
        else:
            got = None
        used = None if got is None else ([got[p] for p in perm] if perm else got)
        rows.append({t("step", "步骤"): t(en, zh), t("symbolic", "符号形状"): sym,
                     t("this model", "本模型"): str(expected), t("recorded hook", "记录的钩子"): hook,
                     t("hook shape", "钩子形状"): "—" if got is None else str(got),
                     t("matches", "一致"): used == expected})
    return rows


def param_rows(facts) -> list[dict]:
    """The model's parameter counts (ModelFacts.param_counts) next to the same numbers written as formulas of the config."""
    cfg, counts = facts.cfg, facts.param_counts
    D, N, H, Hkv, Dh, Dff, V = (cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim,
                                cfg.d_ff, cfg.vocab_size)
    n_mats = 3 if cfg.ffn_type == "swiglu" else 2
    per_norm = D if cfg.norm_type == "rms" else 2 * D
    n_final = 1 if cfg.norm_placement == "pre" else 0
    formulas = {
        "embedding": ("V·D", V * D),
        "attention": ("N·[D·(H·Dh) + 2·D·(H_kv·Dh) + (H·Dh)·D]", N * (D * H * Dh + 2 * D * Hkv * Dh + H * Dh * D)),
        "ffn": (f"N·{n_mats}·D·Dff", N * n_mats * D * Dff),
        "norms": (f"(2N{' + 1' if n_final else ''})·{'D' if per_norm == D else '2D'}", (2 * N + n_final) * per_norm),
        "output": ("0 (tied: W_out = E)" if cfg.tie_embeddings else "V·D", 0 if cfg.tie_embeddings else V * D),
    }
    formulas["total"] = ("sum", sum(v for _, v in formulas.values()))
    return [{"component": k, "count": int(counts[k]), "formula": formulas[k][0], "formula value": formulas[k][1]}
            for k in counts]


def kv_rows(facts, T: int) -> list[dict]:
    """KV-cache bytes: 2 (K and V) × layers × kv_heads × head_dim × tokens × bytes per value."""
    cfg, model = facts.cfg, facts
    rows = []
    for heads, gqa in ((cfg.n_kv_heads, True), (cfg.n_heads, False)):
        for bytes_per, dtype in ((4, "fp32"), (2, "fp16")):
            per_token = (model.kv_cache_bytes_per_token(bytes_per) if gqa
                         else 2 * cfg.n_layers * heads * cfg.head_dim * bytes_per)
            rows.append({"gqa": gqa, "kv_heads": heads, "dtype": dtype, "bytes_per_token": per_token,
                         "bytes_prompt": per_token * T, "bytes_max_context": per_token * cfg.max_seq_len})
    return rows


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024


# --------------------------------------------------------------------------- figures
def embedding_bar_figure(row: np.ndarray, label: str, n_dims: int, t) -> go.Figure:
    fig = go.Figure(go.Bar(x=list(range(n_dims)), y=row[:n_dims], marker_color="#2563eb",
                           hovertemplate="dim %{x}: %{y:.5f}<extra></extra>"))
    fig.update_layout(title=t(f"Embedding row E[id] of token {label}: first {n_dims} dims",
                              f"token {label} 的嵌入行 E[id]：前 {n_dims} 维"),
                      xaxis_title=t("dimension", "维度"), yaxis_title=t("value", "数值"), height=320,
                      margin=dict(l=10, r=10, t=40, b=10))
    return fig


def param_figure(rows: list[dict], t) -> go.Figure:
    parts = [r for r in rows if r["component"] != "total"]
    names = {"embedding": t("embedding", "嵌入"), "attention": t("attention", "注意力"), "ffn": t("FFN", "前馈网络"),
             "norms": t("norms", "归一化"), "output": t("output", "输出层")}
    fig = go.Figure(go.Bar(x=[names[r["component"]] for r in parts], y=[r["count"] for r in parts],
                           text=[f"{r['count'] / 1e6:.2f}M" for r in parts], textposition="outside",
                           marker_color="#059669", hovertemplate="%{x}: %{y:,}<extra></extra>"))
    fig.update_layout(title=t("Parameters per component", "各部分参数量"), yaxis_title=t("parameters", "参数量"),
                      height=340, margin=dict(l=10, r=10, t=40, b=10))
    fig.update_yaxes(range=[0, 1.18 * max(r["count"] for r in parts)])
    return fig


def kv_figure(rows: list[dict], T: int, t) -> go.Figure:
    fig = go.Figure()
    for dtype in ("fp32", "fp16"):
        sel = [r for r in rows if r["dtype"] == dtype]
        fig.add_bar(name=dtype, x=[t(f"GQA ({r['kv_heads']} KV heads)", f"GQA（{r['kv_heads']} 个 KV 头）") if r["gqa"]
                                   else t(f"no GQA ({r['kv_heads']} heads)", f"无 GQA（{r['kv_heads']} 个头）")
                                   for r in sel],
                    y=[r["bytes_prompt"] / 1024 for r in sel], hovertemplate="%{x}: %{y:.1f} KiB<extra></extra>")
    fig.update_layout(title=t(f"KV cache for this prompt (T = {T})", f"本提示词的 KV 缓存（T = {T}）"),
                      yaxis_title="KiB", barmode="group", height=320, margin=dict(l=10, r=10, t=40, b=10))
    return fig


# --------------------------------------------------------------------------- sections
def draw_tokens(ctx: ViewContext) -> None:
    t = ctx.t
    st.subheader(t("1. Text → pieces → ids", "1. 文本 → 片段 → id"))
    st.markdown(t("The tokenizer cuts the prompt into pieces from a fixed vocabulary and replaces each piece by "
                  f"its number, the **id** (0 … {ctx.cfg.vocab_size - 1}). ␣ marks a space, ↵ a newline. "
                  "Grey chips are special tokens; dashed chips hold only part of a character.",
                  "分词器把提示词切成固定词表中的片段，并把每个片段换成它的编号 **id**"
                  f"（0 … {ctx.cfg.vocab_size - 1}）。␣ 表示空格，↵ 表示换行。灰色块是特殊 token；虚线框的块只含一个字符的一部分。"))
    rows = token_rows(ctx.facts, ctx.ids, ctx.pieces)
    st.markdown(chips_html(rows, ctx.token), unsafe_allow_html=True)
    runs = split_characters(ctx.facts, ctx.ids, rows)
    if runs:
        parts = "; ".join(f"{a}–{b} → “{plain(text)}”" if a != b else f"{a} → “{plain(text)}”" for a, b, text in runs)
        st.info(t("Byte-level BPE works on UTF-8 bytes, so a Chinese character or an emoji (3–4 bytes) can be "
                  f"split over several tokens that are not valid text on their own. Tokens {parts}.",
                  "字节级 BPE 处理的是 UTF-8 字节，一个汉字或表情符号（3–4 个字节）可能被拆到几个 token 中，"
                  f"单独看每个都不是合法文本。token {parts}。"))
    df = pd.DataFrame([{t("position", "位置"): r["position"], t("piece", "片段"): r["piece"], "id": r["id"],
                        t("UTF-8 bytes (hex)", "UTF-8 字节（十六进制）"): r["bytes"],
                        t("special", "特殊"): r["special"], t("whole UTF-8", "完整 UTF-8"): r["whole_utf8"]}
                       for r in rows])
    st.dataframe(df, hide_index=True, key="tokens_table", height=min(36 * (len(df) + 1) + 4, 400))
    plots.csv_button(ctx, "Token table (CSV)", "token 表（CSV）", lambda: df.to_csv(index=False),
                     "tokens.csv", "tokens_csv_table")


def draw_embedding(ctx: ViewContext) -> None:
    t = ctx.t
    st.subheader(t("2. Ids → vectors: the embedding", "2. id → 向量：嵌入"))
    st.markdown(t("Each id picks one row of the embedding matrix E (V × D). Nothing is computed: it is a table "
                  "lookup, and the rows were learned in training.",
                  "每个 id 选出嵌入矩阵 E（V × D）中的一行。这里没有计算，只是查表，这些行是训练中学到的。"))
    st.latex(r"x_i = E[t_i] \in \mathbb{R}^{D},\quad E \in \mathbb{R}^{V\times D},\ "
             rf"V={ctx.cfg.vocab_size},\ D={ctx.cfg.d_model}")
    emb = ctx.rec["hook_embed"][0].float().numpy()  # [T, D]
    tid = ctx.ids[ctx.token]
    weight_row = explorer.embedding_rows(ctx.source, [tid])[0]
    choices = [d for d in DIM_CHOICES if d < ctx.cfg.d_model] + [ctx.cfg.d_model]
    n_dims = st.select_slider(t("Dimensions shown", "显示的维数"), choices, value=min(64, ctx.cfg.d_model),
                              key="tokens_embed_dims")
    left, right = st.columns(2)
    with left:
        plots.show(embedding_bar_figure(emb[ctx.token], ctx.labels[ctx.token], n_dims, t), ctx,
                   key="tokens_embed_bar", filename="embedding_row")
    with right:
        fig = plots.heatmap(emb[:, :n_dims], [str(d) for d in range(n_dims)], ctx.labels, colorscale="RdBu",
                            zmid=0.0, title=t(f"All tokens × first {n_dims} dims", f"全部 token × 前 {n_dims} 维"),
                            x_title=t("dimension", "维度"), y_title="token", value_name=t("value", "数值"))
        plots.show(fig, ctx, key="tokens_embed_heat", filename="embedding_rows",
                   height=min(120 + 18 * len(ctx.ids), 600))
    st.caption(t(f"Recorded x_{ctx.token} (hook_embed) vs the weight row E[{tid}]: max difference "
                 f"{np.abs(emb[ctx.token] - weight_row).max():.2g}.",
                 f"记录的 x_{ctx.token}（hook_embed）与权重行 E[{tid}] 的最大差 "
                 f"{np.abs(emb[ctx.token] - weight_row).max():.2g}。"))


def draw_shapes(ctx: ViewContext) -> None:
    t, cfg = ctx.t, ctx.cfg
    st.subheader(t(f"3. Tensor shapes through the model (layer {ctx.layer})", f"3. 前向传播中的张量形状（第 {ctx.layer} 层）"))
    st.markdown(t(f"B = 1 prompt, T = {len(ctx.ids)} tokens, D = {cfg.d_model}, H = {cfg.n_heads} query heads, "
                  f"H_kv = {cfg.n_kv_heads} key/value heads, Dh = {cfg.head_dim}, Dff = {cfg.d_ff}, "
                  f"V = {cfg.vocab_size}. Each row is checked against the tensor the recording holds. "
                  "The hooks store Q, K, V as [B, T, heads, Dh]; attention transposes them to [B, heads, T, Dh].",
                  f"B = 1 条提示词，T = {len(ctx.ids)} 个 token，D = {cfg.d_model}，H = {cfg.n_heads} 个查询头，"
                  f"H_kv = {cfg.n_kv_heads} 个键/值头，Dh = {cfg.head_dim}，Dff = {cfg.d_ff}，V = {cfg.vocab_size}。"
                  "每一行都与记录中的实际张量核对。钩子以 [B, T, 头, Dh] 存 Q、K、V；注意力计算时转置为 [B, 头, T, Dh]。"))
    if cfg.n_rep > 1:
        st.markdown(t(f"**GQA**: K and V have only {cfg.n_kv_heads} heads; each is shared by {cfg.n_rep} query heads.",
                      f"**GQA**：K 和 V 只有 {cfg.n_kv_heads} 个头，每个由 {cfg.n_rep} 个查询头共用。"))
    df = pd.DataFrame(shape_rows(ctx.rec, cfg, ctx.layer, t))
    st.dataframe(df, hide_index=True, key="tokens_shapes", height=36 * (len(df) + 1) + 4)
    plots.csv_button(ctx, "Shapes table (CSV)", "形状表（CSV）", lambda: df.to_csv(index=False),
                     "shapes.csv", "tokens_csv_shapes")


def draw_params(ctx: ViewContext) -> None:
    t, cfg = ctx.t, ctx.cfg
    st.subheader(t("4. Where the parameters are", "4. 参数在哪里"))
    st.latex(r"\text{attention per block} = D\,(H D_h) + 2\,D\,(H_{kv} D_h) + (H D_h)\,D = "
             rf"{cfg.d_model * cfg.n_heads * cfg.head_dim * 2 + 2 * cfg.d_model * cfg.n_kv_heads * cfg.head_dim:,}")
    n_mats = 3 if cfg.ffn_type == "swiglu" else 2
    norm_sym, norm_n = ("2D", 2 * cfg.d_model) if cfg.norm_type == "rms" else ("4D", 4 * cfg.d_model)
    st.latex(rf"\text{{FFN per block}} = {n_mats}\,D\,D_{{ff}} = {n_mats * cfg.d_model * cfg.d_ff:,}"
             rf"\qquad \text{{norms per block}} = {norm_sym} = {norm_n:,}")
    rows = param_rows(ctx.facts)
    df = pd.DataFrame([{t("component", "部分"): r["component"], t("parameters", "参数量"): r["count"],
                        t("share", "占比"): f"{100 * r['count'] / rows[-1]['count']:.1f}%",
                        t("formula", "公式"): r["formula"], t("formula value", "公式值"): r["formula value"]}
                       for r in rows])
    st.dataframe(df, hide_index=True, key="tokens_params")
    left, right = st.columns([3, 2])
    with left:
        plots.show(param_figure(rows, t), ctx, key="tokens_params_bar", filename="parameters")
    with right:
        if cfg.tie_embeddings:
            st.markdown(t("**Tied embeddings**: the output layer reuses the embedding matrix (logits = h·Eᵀ), so "
                          "it adds no parameters of its own; it is counted once, under *embedding*. Without tying "
                          f"this model would have {cfg.vocab_size * cfg.d_model:,} more parameters.",
                          "**权重共享（tied）**：输出层直接复用嵌入矩阵（logits = h·Eᵀ），不增加自己的参数，"
                          f"只在“嵌入”中计一次。如果不共享，这个模型会多出 {cfg.vocab_size * cfg.d_model:,} 个参数。"))
        else:
            st.markdown(t("The output layer has its own matrix W_out (V × D), separate from the embedding E.",
                          "输出层有自己的矩阵 W_out（V × D），与嵌入矩阵 E 分开。"))
        plots.csv_button(ctx, "Parameters (CSV)", "参数量（CSV）", lambda: df.to_csv(index=False),
                         "parameters.csv", "tokens_csv_params")


def draw_kv(ctx: ViewContext) -> None:
    t, cfg, T = ctx.t, ctx.cfg, len(ctx.ids)
    st.subheader(t("5. KV cache for this prompt", "5. 本提示词的 KV 缓存"))
    st.markdown(t("When generating, the model keeps every past token's K and V in every layer instead of "
                  "recomputing them. With GQA only the H_kv key/value heads are stored.",
                  "生成时，模型把每层中所有已出现 token 的 K 和 V 保存下来，而不是重新计算。使用 GQA 时只需保存 H_kv 个键/值头。"))
    per32 = ctx.facts.kv_cache_bytes_per_token(4)
    st.latex(rf"2 \times N \times H_{{kv}} \times D_h \times T \times \text{{bytes}} = 2 \times {cfg.n_layers} "
             rf"\times {cfg.n_kv_heads} \times {cfg.head_dim} \times {T} \times 4 = {per32 * T:,}"
             r"\ \text{bytes (fp32)}")
    rows = kv_rows(ctx.facts, T)
    df = pd.DataFrame([{"GQA": r["gqa"], t("KV heads", "KV 头数"): r["kv_heads"], t("dtype", "数据类型"): r["dtype"],
                        t("bytes per token", "每 token 字节"): r["bytes_per_token"],
                        t(f"bytes, this prompt (T={T})", f"本提示词字节（T={T}）"): r["bytes_prompt"],
                        t("this prompt", "本提示词"): human_bytes(r["bytes_prompt"]),
                        t(f"full context ({cfg.max_seq_len} tokens)", f"完整上下文（{cfg.max_seq_len} 个 token）"):
                            human_bytes(r["bytes_max_context"])} for r in rows])
    st.dataframe(df, hide_index=True, key="tokens_kv")
    left, right = st.columns([3, 2])
    with left:
        plots.show(kv_figure(rows, T, t), ctx, key="tokens_kv_bar", filename="kv_cache")
    with right:
        if cfg.n_rep > 1:
            st.markdown(t(f"Without GQA the cache would be **{cfg.n_rep}× larger** ({cfg.n_heads} instead of "
                          f"{cfg.n_kv_heads} heads per layer). The cache grows linearly with T, so at long "
                          "contexts it, not the weights, decides how much memory generation needs.",
                          f"如果不用 GQA，缓存会**大 {cfg.n_rep} 倍**（每层 {cfg.n_heads} 个头而不是 {cfg.n_kv_heads} 个）。"
                          "缓存随 T 线性增长，所以在长上下文时，决定生成所需内存的是它而不是权重。"))
        plots.csv_button(ctx, "KV cache (CSV)", "KV 缓存（CSV）", lambda: df.to_csv(index=False),
                         "kv_cache.csv", "tokens_csv_kv")


def draw(ctx: ViewContext) -> None:
    t = ctx.t
    st.markdown(t("A language model never sees letters. The text becomes a list of integer ids, each id becomes "
                  "a vector, and from then on every step is a tensor of a fixed shape.",
                  "语言模型看不到字母。文本先变成一串整数 id，每个 id 再变成一个向量，此后每一步都是形状固定的张量。"))
    st.latex(r"\text{text} \xrightarrow{\text{tokenizer}} (t_1,\dots,t_T) \xrightarrow{E} "
             r"X \in \mathbb{R}^{T\times D} \xrightarrow{N\ \text{blocks}} \cdots \xrightarrow{W_{out}} "
             r"\text{logits} \in \mathbb{R}^{T\times V}")
    draw_tokens(ctx)
    draw_embedding(ctx)
    draw_shapes(ctx)
    draw_params(ctx)
    draw_kv(ctx)
