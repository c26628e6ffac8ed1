"""Part of the block view: the block as pseudo-code with this prompt's shapes (each line a button to the part of the
view that shows its tensor), buttons from the diagram's parts to their views, and the four changes LLaMA made to
the original Transformer, each opening the comparison that shows it on the same prompt.

Views are switched by setting st.session_state["view"] in a button callback (the shell keeps `view` there), with
the section to land on (app/sections.py); a what-if is opened with its spec in st.session_state["whatif"] and
["whatif_specs"], the keys app/panels/whatif/__init__.py reads.
"""
from __future__ import annotations

import streamlit as st

from app import sections
from app.context import ViewContext


def _shape(*dims) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"


def code_lines(cfg, T: int) -> list[tuple[str, str, str, str]]:
    """(pseudo-code line, this prompt's shape of what it computes, view and section that show that tensor). Lines
    stay short (≤ ~28 characters) so each fits its button in a 768 px screen's column."""
    D, H, Hkv, Dh, Dff, V = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff, cfg.vocab_size
    norm = "RMSNorm" if cfg.norm_type == "rms" else "LayerNorm"
    sum_ = ("residual", "contributions")  # a residual branch: what attention and the FFN add
    attention = [
        ("  q, k, v = n·W_{q, k, v}", f"q {_shape(1, T, H, Dh)}, k, v {_shape(1, T, Hkv, Dh)}", "attention", "heads"),
        ("  q, k = RoPE(q), RoPE(k)", f"{_shape(1, T, H, Dh)}, {_shape(1, T, Hkv, Dh)}", "rope", "pairs"),
        ("  p = softmax(q·kᵀ/√Dh + mask)", _shape(1, H, T, T), "attention", "head"),
        ("  z = p·v", _shape(1, T, H, Dh), "attention", "heads"),
        ("  Attn = concat(z)·W_O", f"{_shape(1, T, H * Dh)} → {_shape(1, T, D)}", "attention", "heads"),
    ]
    if cfg.ffn_type == "swiglu":
        ffn = [("  g, u = n·W_gate, n·W_up", _shape(1, T, Dff), "swiglu", "heatmap"),
               ("  FFN = W_down(SiLU(g) ⊙ u)", f"{_shape(1, T, Dff)} → {_shape(1, T, D)}", "swiglu", "silu")]
    else:
        ffn = [("  FFN = W_down(ReLU(n·W_up))", f"{_shape(1, T, Dff)} → {_shape(1, T, D)}", "swiglu", "heatmap")]
    logits = ("residual", "lens")
    if cfg.norm_placement == "post":
        return [("x = E[ids]", _shape(1, T, D), "tokens", "embedding"),
                (f"h = {norm}(x + Attn(x))", _shape(1, T, D), *sum_), ("  n = x", _shape(1, T, D), "residual", "norms"),
                *attention, (f"y = {norm}(h + FFN(h))", _shape(1, T, D), *sum_),
                ("  n = h", _shape(1, T, D), "residual", "norms"), *ffn, ("logits = y·W_outᵀ", _shape(1, T, V), *logits)]
    return [("x = E[ids]", _shape(1, T, D), "tokens", "embedding"),
            (f"h = x + Attn({norm}(x))", _shape(1, T, D), *sum_),
            (f"  n = {norm}(x)", _shape(1, T, D), "norm", "divisors"), *attention,
            (f"y = h + FFN({norm}(h))", _shape(1, T, D), *sum_),
            (f"  n = {norm}(h)", _shape(1, T, D), "norm", "divisors"), *ffn,
            (f"logits = {norm}(x)·W_outᵀ", _shape(1, T, V), *logits)]


def view_names(t) -> dict[str, str]:
    return {"tokens": t("block.node.tokens"), "norm": t("block.node.norm"), "attention": t("block.node.attention"),
            "rope": t("block.node.rope"), "swiglu": t("block.node.swiglu"), "residual": t("block.node.residual"),
            "normlab": t("block.node.normlab"), "whatif": t("block.node.whatif")}


# The diagram's parts, in drawing order, and the view each opens
NODE_VIEWS = ("tokens", "norm", "attention", "rope", "swiglu", "residual")


def _go(view: str, section: str | None = None) -> None:
    st.session_state["view"] = view
    sections.request(view, section)


def _whatif(spec: str) -> None:
    """Open the what-if view with this intervention (both the value and its text box, as whatif.py keeps them), at
    its results."""
    st.session_state["whatif"] = st.session_state["whatif_specs"] = spec
    _go("whatif", "results")


def draw_code(ctx: ViewContext) -> None:
    t, names = ctx.t, view_names(ctx.t)
    st.caption(t("block.code.caption", layers=ctx.cfg.n_layers))
    for i, (code, shape, view, section) in enumerate(code_lines(ctx.cfg, len(ctx.ids))):
        left, right = st.columns([2, 1], vertical_alignment="center")
        inside = code.startswith(" ")  # a step inside the line above: marked, since buttons centre their text
        left.button(("↳ " if inside else "") + f"`{code.strip()}`", key=f"block_code_{i}", on_click=_go,
                    args=(view, section), width="stretch",
                    help=t("block.code.opens", view=names[view]))
        right.caption(shape)


def draw_node_buttons(ctx: ViewContext) -> None:
    names = view_names(ctx.t)
    st.caption(ctx.t("block.node.caption"))
    for col, view in zip(st.columns(len(NODE_VIEWS)), NODE_VIEWS):
        col.button(names[view] + " →", key=f"block_go_{view}", on_click=_go, args=(view,), width="stretch")


def changes(t, layer: int) -> list[dict]:
    """The four changes from the original Transformer to LLaMA, each with the comparisons that show it:
    (button key, label, callback, its arguments: the view and the section it opens, or the what-if spec)."""
    return [
        {"change": t("block.change.norm_place"), "before": "Post-Norm: Norm(x + F(x))", "after": "Pre-Norm: x + F(Norm(x))",
         "shows": t("block.change.norm_place_shows"),
         "links": [("block_change_twins", t("block.change.open_twins"), _go, ("normlab", "twins"))]},
        {"change": t("block.change.norm_kind"), "before": "LayerNorm", "after": "RMSNorm",
         "shows": t("block.change.norm_kind_shows", layer=layer),
         "links": [("block_change_normid", t("block.change.open_norm_identity", layer=layer), _whatif,
                    (f"norm-identity:blocks.{layer}.ln1",)),
                   ("block_change_norm", t("block.change.open_norm"), _go, ("norm", "layernorm"))]},
        {"change": t("block.change.position"), "before": t("block.change.sinusoidal"), "after": "RoPE",
         "shows": t("block.change.position_shows"),
         "links": [("block_change_norope", t("block.change.open_no_rope"), _whatif, ("no-rope",)),
                   ("block_change_rope", t("block.change.open_rope"), _go, ("rope", "sinusoidal"))]},
        {"change": t("block.change.ffn"), "before": "ReLU FFN", "after": "SwiGLU",
         "shows": t("block.change.ffn_shows"),
         "links": [("block_change_relu", t("block.change.open_relu"), _whatif, ("relu",)),
                   ("block_change_swiglu", t("block.change.open_swiglu"), _go, ("swiglu", "silu"))]},
    ]


def draw_changes(ctx: ViewContext) -> None:
    t = ctx.t
    st.subheader(t("block.change.title"))
    head = st.columns([2, 2, 2, 4, 3])
    for col, label in zip(head, (t("block.change.col_change"), t("block.change.col_before"), t("block.change.col_after"),
                                 t("block.change.col_shows"), t("block.change.col_open"))):
        col.markdown(f"**{label}**")
    for row in changes(t, ctx.layer):
        cols = st.columns([2, 2, 2, 4, 3])
        cols[0].markdown(row["change"])
        cols[1].markdown(row["before"])
        cols[2].markdown(row["after"])
        cols[3].markdown(row["shows"])
        for key, label, fn, args in row["links"]:
            cols[4].button(label, key=key, on_click=fn, args=args, width="stretch")
