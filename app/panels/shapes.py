"""Part of the Tokens & shapes view: the tutorial's shape table for this model or for a real LLaMA configuration
(LLaMA-1 7B … 65B, Llama-2 7B / 70B, Llama-3 8B) at the current prompt length, without any weights — every
tensor's shape, parameters per component, memory per dtype and the KV cache.

This model's shapes are checked against the recording; a family config's against its model built on PyTorch's
meta device (explorer_model.families), so the table and the code that would run agree by construction.
"""
from __future__ import annotations

from functools import partial

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from app import choice_state, plots
from app.context import ViewContext
from app.sections import section
from explorer_model import families
from explorer_model import view_choices as VC

THIS = VC.THIS_MODEL
# Published parameter totals (LLaMA paper Table 2; Llama-2 paper / model cards; Llama-3 model card), in billions:
# what the table's computed totals are compared with.
PUBLISHED_B = {"LLaMA-1 7B": 6.74, "LLaMA-1 13B": 13.0, "LLaMA-1 33B": 32.5, "LLaMA-1 65B": 65.2,
               "Llama-2 7B": 6.74, "Llama-2 70B": 68.98, "Llama-3 8B": 8.03}
COMPONENTS = ("embedding", "attention", "ffn", "norms", "output", "total")


def _steps(cfg, layer: int, t):
    """(label, symbolic shape, dims of the expected shape without B, hook name, permutation from hook layout)."""
    L, norm = layer, "RMSNorm" if cfg.norm_type == "rms" else "LayerNorm"
    ffn = "SwiGLU" if cfg.ffn_type == "swiglu" else "FFN"
    gqa = " (GQA)" if cfg.n_rep > 1 else ""
    qkv = (0, 2, 1, 3)  # hooks keep [B, T, heads, Dh]; the matmul works on [B, heads, T, Dh]
    steps = [
        (t("tokens.step.ids"), "[B, T]", ("T",), "token_ids", None),
        (t("tokens.step.embed"), "[B, T, D]", ("T", "D"), "hook_embed", None),
        (f"{norm} (ln1)", "[B, T, D]", ("T", "D"), f"blocks.{L}.ln1.hook_normalized", None),
        ("Q", "[B, H, T, Dh]", ("H", "T", "Dh"), f"blocks.{L}.attn.hook_q", qkv),
        ("K" + gqa, "[B, H_kv, T, Dh]", ("Hkv", "T", "Dh"), f"blocks.{L}.attn.hook_k", qkv),
        ("V" + gqa, "[B, H_kv, T, Dh]", ("Hkv", "T", "Dh"), f"blocks.{L}.attn.hook_v", qkv),
        (t("tokens.step.scores"), "[B, H, T, T]", ("H", "T", "T"), f"blocks.{L}.attn.hook_attn_scores", None),
        (t("tokens.step.pattern"), "[B, H, T, T]", ("H", "T", "T"), f"blocks.{L}.attn.hook_pattern", None),
        (t("tokens.step.z"), "[B, H, T, Dh]", ("H", "T", "Dh"), f"blocks.{L}.attn.hook_z", qkv),
        (t("tokens.step.attn_out"), "[B, T, D]", ("T", "D"), f"blocks.{L}.hook_attn_out", None),
        (t("tokens.step.ffn_hidden", ffn=ffn), "[B, T, Dff]", ("T", "Dff"), f"blocks.{L}.mlp.hook_post", None),
        (t("tokens.step.block_out"), "[B, T, D]", ("T", "D"), f"blocks.{L}.hook_resid_post", None),
    ]
    if cfg.norm_placement == "pre":
        steps.append((t("tokens.step.final_norm", norm=norm), "[B, T, D]", ("T", "D"), "ln_final.hook_normalized", None))
    steps.append(("logits", "[B, T, V]", ("T", "V"), "logits", None))
    return steps


def recorded_shapes(rec, cfg, layer: int) -> dict[str, list[int]]:
    """Hook name -> shape of the tensors the recording holds for the table's steps (plus token ids and logits)."""
    out = {hook: list(rec[hook].shape) for _, _, _, hook, _ in _steps(cfg, layer, lambda key, **_: key)
           if hook not in ("token_ids", "logits") and hook in rec}
    out["token_ids"], out["logits"] = list(rec.token_ids.shape), list(rec.logits.shape)
    return out


def shape_rows(cfg, T: int, layer: int, got: dict, t) -> list[dict]:
    """Each step's symbolic and numeric shape, next to `got` (hook -> shape: the recording's, or the meta model's)."""
    sizes = {"T": T, "D": cfg.d_model, "H": cfg.n_heads, "Hkv": cfg.n_kv_heads, "Dh": cfg.head_dim,
             "Dff": cfg.d_ff, "V": cfg.vocab_size}
    rows = []
    for label, sym, dims, hook, perm in _steps(cfg, layer, t):
        expected = [1] + [sizes[d] for d in dims]
        shape = got.get(hook)
        used = None if shape is None else ([shape[p] for p in perm] if perm else list(shape))
        rows.append({"step": label, "symbolic": sym, "numeric": str(expected), "hook": hook,
                     "hook_shape": "—" if shape is None else str(list(shape)) + hook_order(sym, perm),
                     "matches": used == expected})
    return rows


def hook_order(sym: str, perm: tuple | None) -> str:
    """" = [B, T, H, Dh]" where the hook keeps its dimensions in another order than the step's formula (Q is
    [B, H, T, Dh] in the product, the hook's [1, 13, 9, 64] has T second): a reader sees which number is which."""
    if not perm:
        return ""
    names = sym.strip("[]").split(", ")
    return " = [" + ", ".join(names[perm.index(j)] for j in range(len(perm))) + "]"


def weight_rows(cfg, layer: int) -> list[dict]:
    """Every weight outside the blocks and every weight of block `layer` (all blocks are alike), with its size."""
    rows = []
    for key, shape in families.weight_shapes(cfg).items():
        if key.startswith("blocks.") and not key.startswith(f"blocks.{layer}."):
            continue
        n = 1
        for d in shape:
            n *= d
        rows.append({"weight": key, "shape": str(list(shape)), "count": n, "per_block": key.startswith("blocks.")})
    return rows


def param_rows(cfg, counts, t) -> list[dict]:
    """Parameter counts per component next to the same numbers written as formulas of the config."""
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
        "output": (t("tokens.params.tied_formula") if cfg.tie_embeddings else "V·D", 0 if cfg.tie_embeddings else V * D),
    }
    formulas["total"] = (t("tokens.params.sum"), sum(v for _, v in formulas.values()))
    return [{"component": k, "count": int(counts[k]), "formula": formulas[k][0], "formula_value": formulas[k][1]}
            for k in COMPONENTS]


def component_names(t) -> dict[str, str]:
    return {"embedding": t("tokens.comp.embedding"), "attention": t("tokens.comp.attention"),
            "ffn": t("tokens.comp.ffn"), "norms": t("tokens.comp.norms"), "output": t("tokens.comp.output"),
            "total": t("tokens.comp.total")}


def billions(n: int) -> str:
    return (f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.1f} M" if n >= 1e6 else f"{n / 1e3:.1f} K" if n >= 1e3
            else str(n))


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 / 10 else f"{n / 2**20:.1f} MiB" if n >= 2**20 / 10 else f"{n / 1024:.1f} KiB"


def param_figure(rows: list[dict], name: str, t) -> go.Figure:
    names = component_names(t)
    parts = [r for r in rows if r["component"] != "total"]
    fig = go.Figure(go.Bar(x=[names[r["component"]] for r in parts], y=[r["count"] for r in parts],
                           text=[billions(r["count"]) for r in parts], textposition="outside",
                           marker_color="#059669", hovertemplate="%{x}: %{y:,}<extra></extra>"))
    fig.update_layout(title=t("tokens.params.fig_title", name=name), yaxis_title=t("tokens.params.col_count"),
                      height=340, margin=dict(l=10, r=10, t=40, b=10))
    fig.update_yaxes(range=[0, 1.18 * max(r["count"] for r in parts)])
    return fig


# --------------------------------------------------------------------------- the section
def choice(ctx: ViewContext) -> tuple[str, object, dict]:
    """(name, config, per-component counts) of the selected configuration."""
    options = [THIS, *families.FAMILIES]
    choice_state.start("tokens_family", offered=options)
    pick = st.selectbox(ctx.t("tokens.family.pick"), options, key="tokens_family",
                        format_func=lambda o: ctx.t("tokens.family.this") if o == THIS else o)
    if pick == THIS:
        return ctx.t("tokens.family.this"), ctx.cfg, dict(ctx.facts.param_counts)
    cfg = families.FAMILIES[pick]
    return pick, cfg, families.component_params(cfg)


def draw(ctx: ViewContext) -> None:
    with section("tokens", "shapes"):
        st.subheader(ctx.t("tokens.shapes.title"))
        name, cfg, counts = choice(ctx)
        draw_shapes(ctx, name, cfg)
    with section("tokens", "params"):
        draw_params(ctx, name, cfg, counts)
    with section("tokens", "memory"):
        draw_memory(ctx, name, cfg)


def shapes_frame(ctx: ViewContext, cfg, layer: int) -> pd.DataFrame:
    """The shape table: each step's shapes next to the recording's (this model) or the meta model's (a family)."""
    t, T, this = ctx.t, len(ctx.ids), cfg is ctx.cfg
    got = recorded_shapes(ctx.rec, cfg, layer) if this else {k: list(v) for k, v in families.tensor_shapes(cfg, T, (layer,)).items()}
    if not this:
        got["token_ids"] = [1, T]
    return pd.DataFrame([{t("tokens.shapes.col_step"): r["step"], t("tokens.shapes.col_symbolic"): r["symbolic"],
                          t("tokens.shapes.col_numeric"): r["numeric"], t("tokens.shapes.col_hook"): r["hook"],
                          (t("tokens.shapes.col_recorded") if this else t("tokens.shapes.col_meta")): r["hook_shape"],
                          t("tokens.shapes.col_matches"): r["matches"]} for r in shape_rows(cfg, T, layer, got, t)])


def weights_frame(cfg, layer: int, t) -> pd.DataFrame:
    return pd.DataFrame([{t("tokens.weights.col_weight"): r["weight"], t("tokens.weights.col_shape"): r["shape"],
                          t("tokens.weights.col_count"): r["count"],
                          t("tokens.weights.col_times"): cfg.n_layers if r["per_block"] else 1}
                         for r in weight_rows(cfg, layer)])


def draw_shapes(ctx: ViewContext, name: str, cfg) -> None:
    t, T = ctx.t, len(ctx.ids)
    this = cfg is ctx.cfg
    layer = min(ctx.layer, cfg.n_layers - 1)
    st.markdown(t("tokens.shapes.sizes", name=name, T=T, D=cfg.d_model, N=cfg.n_layers, H=cfg.n_heads,
                  Hkv=cfg.n_kv_heads, Dh=cfg.head_dim, Dff=cfg.d_ff, V=cfg.vocab_size, layer=layer))
    shapes = partial(shapes_frame, ctx, cfg, layer)  # built once per selection (plots.table keeps it)
    n_rows = len(_steps(cfg, layer, lambda key, **_: key))
    plots.table(ctx, shapes, key="tokens_shapes", height=36 * (n_rows + 1) + 4)
    with plots.explainer(ctx, t("tokens.shapes.more")):
        st.markdown(t("tokens.shapes.explain_recorded") if this else t("tokens.shapes.explain_meta"))
        if cfg.n_rep > 1:
            st.markdown(t("tokens.shapes.gqa", kv=cfg.n_kv_heads, rep=cfg.n_rep))
    plots.csv_button(ctx, t("tokens.csv.shapes"), t("tokens.csv.shapes"), lambda: shapes().to_csv(index=False),
                     "shapes.csv", "tokens_csv_shapes")
    st.markdown(t("tokens.weights.title", name=name, layer=layer, N=cfg.n_layers))
    plots.table(ctx, partial(weights_frame, cfg, layer, t), key="tokens_weights")


def draw_params(ctx: ViewContext, name: str, cfg, counts: dict) -> None:
    t = ctx.t
    st.subheader(t("tokens.params.title", name=name))
    rows = param_rows(cfg, counts, t)
    total = rows[-1]["count"]
    published = PUBLISHED_B.get(name)
    frame = partial(params_frame, rows, t)
    plots.table(ctx, frame, key="tokens_params")
    if published is not None:
        st.markdown(t("tokens.params.published", name=name, total=billions(total), published=published,
                      diff=100 * (total / (published * 1e9) - 1)))
    left, right = st.columns([3, 2])
    with left:
        plots.show(lambda: param_figure(rows, name, t), ctx, key="tokens_params_bar", filename="parameters", share=0.6)
    with right:
        if cfg.tie_embeddings:
            st.markdown(t("tokens.params.tied", extra=cfg.vocab_size * cfg.d_model))
        else:
            st.markdown(t("tokens.params.untied"))
        plots.csv_button(ctx, t("tokens.csv.params"), t("tokens.csv.params"), lambda: frame().to_csv(index=False),
                         "parameters.csv", "tokens_csv_params")
    with plots.explainer(ctx, t("tokens.params.more")):  # full width: formulas are long
        n_mats = 3 if cfg.ffn_type == "swiglu" else 2
        attn = 2 * cfg.d_model * cfg.n_heads * cfg.head_dim + 2 * cfg.d_model * cfg.n_kv_heads * cfg.head_dim
        st.latex(t("tokens.params.latex_attn", value=f"{attn:,}"))
        st.latex(t("tokens.params.latex_ffn", n=n_mats, value=f"{n_mats * cfg.d_model * cfg.d_ff:,}"))


def params_frame(rows: list[dict], t) -> pd.DataFrame:
    names, total = component_names(t), rows[-1]["count"]
    return pd.DataFrame([{t("tokens.params.col_component"): names[r["component"]], t("tokens.params.col_count"): r["count"],
                          t("tokens.params.col_billions"): billions(r["count"]),
                          t("tokens.params.col_share"): f"{100 * r['count'] / total:.1f}%",
                          t("tokens.params.col_formula"): r["formula"],
                          t("tokens.params.col_formula_value"): r["formula_value"]} for r in rows])


def memory_frame(rows: list[dict], context: int, T: int, t) -> pd.DataFrame:
    return pd.DataFrame([{t("tokens.memory.col_dtype"): r["dtype"], t("tokens.memory.col_weights"): gib(r["weights"]),
                          t("tokens.memory.col_runtime"): gib(r["runtime"]), t("tokens.memory.col_total"): gib(r["total"]),
                          t("tokens.memory.col_kv_token"): r["kv_per_token"],
                          t("tokens.memory.col_kv_prompt", T=T): gib(r["kv_per_token"] * T),
                          t("tokens.memory.col_kv_context", n=context): gib(r["kv_per_token"] * context)}
                         for r in rows])


def draw_memory(ctx: ViewContext, name: str, cfg) -> None:
    t, T = ctx.t, len(ctx.ids)
    st.subheader(t("tokens.memory.title", name=name, T=T))
    rows = families.memory_table(cfg, T)
    plots.table(ctx, partial(memory_frame, rows, cfg.max_seq_len, T, t), key="tokens_memory")
    with plots.explainer(ctx, t("tokens.memory.more")):
        st.markdown(t("tokens.memory.explain"))
        st.latex(t("tokens.memory.latex_kv", N=cfg.n_layers, Hkv=cfg.n_kv_heads, Dh=cfg.head_dim,
                   value=f"{rows[0]['kv_per_token']:,}"))
