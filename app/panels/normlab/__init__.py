"""Pre vs Post-Norm lab: the two trained twins side by side, gradients of fresh models at initialization,
and a short training race. Why LLaMA puts the norm first.

The twins are read through the gateway's cached recordings, never run for drawing. The experiments (in
explorer_model.lab.normlab) run in the gateway's one lab worker process, one at a time server-wide; a visitor
whose experiment waits sees their place in the queue, and finished results are cached by the gateway.
"""
from __future__ import annotations

from functools import partial

import numpy as np
import plotly.graph_objects as go
import streamlit as st

from app import gateway, plots
from app.context import ViewContext, token_labels
from app.context import plain as plain_md
from app.sections import section
from explorer_model.lab import normlab as lab
from explorer_model.lab.corpus import HELDOUT_LINE

from app.panels.normlab.common import COLORS, fig_frame, variant_name, wait_for  # noqa: F401 (wait_for: API)
from app.panels.generation import candidate_label
from app.panels.normlab.initialization import draw_depth, draw_init
from app.panels.normlab.race import draw_race


# --------------------------------------------------------------------------- twin figures
def twin_lines_figure(fig_id, title, x, series: dict, t, y_title, x_title) -> go.Figure:
    """series: {trace meta: (name, values, color, dash[, own x])}"""
    fig = fig_frame(fig_id, title, x_title, y_title)
    for meta, (name, ys, color, dash, *own_x) in series.items():
        fig.add_trace(go.Scatter(x=list(own_x[0] if own_x else x), y=ys, name=name, meta=meta, mode="lines+markers",
                                 line=dict(color=color, dash=dash),
                                 hovertemplate="%{x}: %{y:.4g}<extra>" + name + "</extra>"))
    return fig


def twin_attention_figure(pattern, layer: int, head: int, labels, t, v: str) -> go.Figure:
    """One twin's attention pattern ([query, key] of `head` in `layer`), the masked future left blank."""
    fig = plots.heatmap(plots.blank_future(pattern), x=labels, y=labels, zmin=0, zmax=1, fmt=".3f",
                        title=t("normlab.layer_head", variant_name_t_v=variant_name(t, v), layer=layer, head=head),
                        x_title=t("normlab.key"), y_title=t("normlab.query"), value_name=t("normlab.weight"))
    fig.update_layout(height=360, meta={"id": f"normlab_attn_{v}"})
    return fig


def top_figure(pieces, probs, t, v: str) -> go.Figure:
    fig = fig_frame(f"normlab_top_{v}", t("normlab.next_token", variant_name_t_v=variant_name(t, v)),
               t("normlab.probability"), "", height=260)
    fig.add_trace(go.Bar(x=probs, y=pieces, orientation="h", marker_color=COLORS[v], meta="top",
                         hovertemplate="%{y}: %{x:.4f}<extra></extra>"))
    fig.update_yaxes(autorange="reversed", type="category")
    return fig


def train_grad_figure(curves: dict, t, v: str) -> go.Figure:
    g = np.asarray(curves["grad_down"], dtype=float)  # [log point, layer]
    fig = fig_frame(f"normlab_train_grads_{v}", t("normlab.w_down_per_layer_while", variant_name_t_v=variant_name(t, v)),
               t("normlab.step"), t("normlab.gradient_norm_log"), yaxis_type="log")
    for layer in range(g.shape[1]):
        shade = 0.45 + 0.55 * layer / max(g.shape[1] - 1, 1)
        fig.add_trace(go.Scatter(x=curves["grad_step"], y=g[:, layer], name=t("normlab.layer_2", layer=layer),
                                 meta=f"L{layer}", mode="lines", line=dict(color=COLORS[v], width=1 + 2 * shade),
                                 opacity=shade))
    return fig


def twin_summary(rec, layer: int, head: int) -> dict:
    """What the twins' section shows of one twin's recording: the residual stream's size after each layer, the
    mean norm divisors of ln1 and ln2 per layer, one head's attention pattern and the top next tokens."""
    return {"resid": lab.residual_norms(rec), "ln1": lab.norm_scales(rec, "ln1"), "ln2": lab.norm_scales(rec, "ln2"),
            "pattern": rec.pattern(layer)[0, head].double().numpy(), "top": lab.top_predictions(rec)}


# --------------------------------------------------------------------------- sections
def draw_intro(ctx: ViewContext) -> None:
    st.markdown(ctx.t("normlab.where_the_normalization_sits_decides"))
    st.latex(r"\begin{aligned}\text{Pre:}\quad & x_{l+1}=x_l+F(\mathrm{Norm}(x_l))\\"
             r"\text{Post:}\quad & x_{l+1}=\mathrm{Norm}(x_l+F(x_l))\\"
             r"\text{DeepNorm:}\quad & x_{l+1}=\mathrm{Norm}(\alpha x_l+F(x_l)),\quad \alpha=(2N)^{1/4},\ "
             r"W_{V,O,\mathrm{FFN}}\sim\beta\cdot\text{init},\ \beta=(8N)^{-1/4}\end{aligned}")


def _twin_recordings(ctx: ViewContext):
    """{variant: (facts, ids, rec, line_rec)} for the twins, or None with a message if they are missing."""
    twins, err = gateway.twin_recordings(st.session_state.get("prompt") or "",
                                          int(st.session_state.get("max_tokens") or 256))
    if twins is None:
        st.info(ctx.t("normlab.a_twin_is_not_available", plain_md_err=plain_md(err)))
        return None
    return {v: (w["facts"], w["ids"], w["rec"], w["line_rec"]) for v, w in twins.items()}


def draw_twins(ctx: ViewContext) -> dict | None:
    st.subheader(ctx.t("normlab.1_the_trained_twins_on"))
    twins = _twin_recordings(ctx)
    if twins is None:
        return None
    t = ctx.t
    cfg = twins["pre"][2].cfg
    st.markdown(t("normlab.tiny_pre_and_tiny_post", cfg_n_layers=cfg.n_layers, cfg_d_model=cfg.d_model, len_twins_pre_1=len(twins['pre'][1])))
    sources = dict(zip(("pre", "post"), lab.TWINS))
    layer = {v: min(ctx.layer, twins[v][2].cfg.n_layers - 1) for v in twins}
    head = {v: min(ctx.head, twins[v][2].cfg.n_heads - 1) for v in twins}
    summary = {v: gateway.derived("normlab_twin", sources[v], twins[v][1], twin_summary, layer[v], head[v])
               for v in twins}  # once per twin, prompt and selection
    res = {v: summary[v]["resid"] for v in twins}
    layers_x = ["emb"] + [f"L{i}" for i in range(cfg.n_layers)]
    plots.show(lambda: twin_lines_figure("normlab_resid", t("normlab.residual_stream_size_after_each"),
                                 layers_x, {v: (variant_name(t, v), res[v], COLORS[v], "solid") for v in res}, t,
                                 "‖x‖", t("normlab.layer")), ctx, key="normlab_resid_fig")
    st.caption(t("normlab.pre_norm_lets_the_residual", res_pre_1=res['pre'][1], res_pre_12=res['pre'][-1], res_post_1=res['post'][-1]))
    sc = {f"{v}_{w}": (f"{variant_name(t, v)} {w}", summary[v][w], COLORS[v], "solid" if w == "ln1" else "dot")
          for v in twins for w in ("ln1", "ln2")}
    plots.show(lambda: twin_lines_figure("normlab_scales", t("normlab.norm_divisors_per_layer_mean"),
                                 layers_x[1:], sc, t, t("normlab.divisor"), t("normlab.layer")), ctx, key="normlab_scales_fig")
    st.caption(t("normlab.a_pre_norm_divisor_is"))
    cols = st.columns(2)
    for col, v in zip(cols, ("pre", "post")):
        loaded, ids, _, line_rec = twins[v]
        labels = [f"{i}:{x}" for i, x in enumerate(token_labels(loaded, ids))]  # split characters named, not bytes
        with col:
            pattern = summary[v]["pattern"]
            plots.show(partial(twin_attention_figure, pattern, layer[v], head[v], labels, t, v), ctx,
                       key=f"normlab_attn_{v}_fig", share=0.5)
            top, probs = summary[v]["top"]
            names = [candidate_label(loaded, list(ids), int(i)) for i in top]
            plots.show(partial(top_figure, names, probs, t, v), ctx, key=f"normlab_top_{v}_fig", share=0.5)
            st.metric(t("normlab.loss_on_the_held_out"), f"{lab.sequence_loss(line_rec):.3f}",
                      help=t("normlab.from_hamlet_never_trained_on", heldout_line=HELDOUT_LINE))
    st.caption(t("normlab.layer_and_head_follow_above" if ctx.presenter else "normlab.layer_and_head_follow_the"))
    rows = lambda: plots.to_csv(["twin", "layer", "resid_norm_after", "ln1_divisor", "ln2_divisor"],  # noqa: E731
                                ([v, i, res[v][i + 1], sc[f"{v}_ln1"][1][i], sc[f"{v}_ln2"][1][i]]
                                 for v in res for i in range(cfg.n_layers)))
    label = t("normlab.csv_twins")
    plots.csv_button(ctx, label, label, rows, "normlab_twins.csv", key="normlab_csv_twins")
    draw_train_logs(ctx)
    return twins


def draw_train_logs(ctx: ViewContext) -> None:
    t = ctx.t
    logs = {v: lab.train_log(name) for v, name in zip(("pre", "post"), lab.TWINS)}
    if any(l is None for l in logs.values()):
        st.info(t("normlab.training_logs_of_the_twins"))
        return
    curves = {v: lab.log_curves(l) for v, l in logs.items()}
    series = {}
    for v, c in curves.items():
        series[f"{v}_train"] = (f"{variant_name(t, v)} · " + t("normlab.train"), c["train_loss"], COLORS[v], "solid", c["step"])
        series[f"{v}_heldout"] = (f"{variant_name(t, v)} · " + t("normlab.held_out"), c["heldout_loss"], COLORS[v], "dot", c["step"])
    title, y_title, x_title = t("normlab.how_the_twins_were_trained"), t("normlab.loss_nats_token"), t("normlab.step")
    steps = curves["pre"]["step"]
    plots.show(lambda: twin_lines_figure("normlab_train_loss", title, steps, series, t, y_title, x_title), ctx,
               key="normlab_train_loss_fig")
    cols = st.columns(2)
    for col, v in zip(cols, ("pre", "post")):
        with col:
            plots.show(lambda: train_grad_figure(curves[v], t, v), ctx, key=f"normlab_train_grads_{v}_fig", share=0.5)
    fin = {v: logs[v].get("final", {}) for v in logs}
    tc = logs["post"].get("train_config", {})
    ratio = {v: [g[-1] / g[0] for g in (curves[v]["grad_down"][0], curves[v]["grad_down"][-1])] for v in curves}
    nan = float("nan")
    st.caption(t("normlab.twins_trained", steps=tc.get("steps", "?"), lr=tc.get("lr", nan), warmup=tc.get("warmup", "?"),
                 pre=fin["pre"].get("heldout_loss", nan), post=fin["post"].get("heldout_loss", nan),
                 pre0=ratio["pre"][0], pre1=ratio["pre"][1], post0=ratio["post"][0], post1=ratio["post"][1]))


def draw(ctx: ViewContext) -> None:
    st.subheader(ctx.t("normlab.title"))
    with plots.explainer(ctx, ctx.t("normlab.intro_expander")):
        draw_intro(ctx)
    with section("normlab", "twins"):
        draw_twins(ctx)
    st.divider()
    with section("normlab", "init"):
        result = draw_init(ctx)
    with section("normlab", "depth"):
        if result is not None:
            draw_depth(ctx, result)
    st.divider()
    with section("normlab", "race"):
        draw_race(ctx)
