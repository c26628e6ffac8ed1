"""Norm lab, section 2: gradients of fresh models at initialization (run in the gateway's lab worker).

The lesson's sentences quote ratios measured by explorer_model/lab/lesson_numbers.py and shipped in
assets/lab/lesson_numbers.json; nothing in them is typed.
"""
from __future__ import annotations

import inspect

import streamlit as st

from app import choice_state, gateway, plots
from app.context import ViewContext
from app.panels.normlab.common import variants_figure, wait_for
from explorer_model import view_choices as VC
from explorer_model.lab import lesson_numbers
from explorer_model.lab import normlab as lab


# the depth sweep averages fewer initializations: init_gradients' own default, so the prose follows the code
INIT_SWEEP_SEEDS = inspect.signature(lab.init_gradients).parameters["sweep_seeds"].default


def init_gradients(ffn: str, init: str, norm: str, depth: int, t=None, box=None) -> dict:
    job = gateway.lab_init_gradients(lab.LabOptions(ffn=ffn, init=init, norm=norm), depth)
    return wait_for(job, t, box) if box is not None else job.result()


def draw_init(ctx: ViewContext) -> dict | None:
    """The experiment's choices, its run and the gradient per layer; its result (with the depth chosen) for
    draw_depth, None before it is run."""
    t = ctx.t
    st.subheader(t("normlab.2_gradients_at_initialization"))
    o = lab.LabOptions()
    st.markdown(t("normlab.fresh_random_models", d=o.d_model, heads=o.heads, batch=o.batch, seq=o.seq, seeds=o.seeds,
                  sweep_seeds=INIT_SWEEP_SEEDS))
    c = st.columns(4)
    for key in ("lab_ffn", "lab_init", "lab_norm", "lab_depth", "lab_init_go"):
        choice_state.start(key)
    ffn = c[0].radio(t("normlab.ffn"), VC.values("lab_ffn"), key="lab_ffn", horizontal=True,
                     format_func=lambda x: {"relu": "ReLU", "swiglu": "SwiGLU"}[x])
    init = c[1].radio(t("normlab.initialization"), VC.values("lab_init"), key="lab_init", horizontal=True,
                      format_func=lambda x: {"xavier": "Xavier", "llama": "N(0, 0.02)"}[x])
    norm = c[2].radio(t("normlab.norm"), VC.values("lab_norm"), key="lab_norm", horizontal=True,
                      format_func=lambda x: {"layer": "LayerNorm", "rms": "RMSNorm"}[x])
    depth = c[3].select_slider(t("normlab.depth_n"), lab.DEPTHS, key="lab_depth")
    if st.button(t("normlab.run_the_experiment"), key="lab_init_run"):
        st.session_state["lab_init_go"] = True
    if not st.session_state.get("lab_init_go"):
        st.info(t("normlab.press_the_button_results_are"))
        return None
    try:
        r = init_gradients(ffn, init, norm, int(depth), t, st.empty())
    except gateway.LabDisabled:  # serve --no-lab: only results computed before are shown
        st.info(t("normlab.lab_off"))
        return None
    prof, sweep = r["profile"], r["sweep"]
    ratio = {v: lab.last_first_ratio(prof[v]["grad_down"]) for v in prof}
    grows = {v: sum(x > 1 for x in prof[v]["ratio_seeds"]) for v in prof}
    plots.show(lambda: variants_figure("normlab_init_profile", t("normlab.w_down_per_layer_at", depth=depth),
                               range(depth), {v: prof[v]["grad_down"] for v in prof}, t, t("normlab.layer"),
                               t("normlab.gradient_norm")), ctx, key="normlab_init_profile_fig")
    st.caption(t("normlab.last_first_layer_ratio_pre", ratio_pre=ratio['pre'], ratio_post=ratio['post'], ratio_deepnorm=ratio['deepnorm'], grows_pre=grows['pre'], len_r_seeds=len(r['seeds']), grows_post=grows['post'], grows_deepnorm=grows['deepnorm']) + init_lesson(t, ffn, init))
    return {**r, "depth": int(depth)}


def draw_depth(ctx: ViewContext, r: dict) -> None:
    """The same experiment against depth (its own part: a lecture step about depth lands on it): the last layer's
    gradient, the residual's size and one update's effect, and the experiment's numbers as CSV."""
    t, o, depth = ctx.t, lab.LabOptions(), r["depth"]
    prof, sweep = r["profile"], r["sweep"]
    depths = r["depths"]
    plots.show(lambda: variants_figure("normlab_init_depth", t("normlab.last_layer_s_w_down"),
                               depths, {v: sweep[v]["last_grad"] for v in sweep}, t, t("normlab.layers_n_log"),
                               t("normlab.gradient_norm_log"), log_y=True, log_x=True), ctx, key="normlab_init_depth_fig")
    lg = {v: sweep[v]["last_grad"] for v in sweep}
    st.caption(t("normlab.from_to_layers_the_last", depths_0=depths[0], depths_1=depths[-1], lg_pre_0=lg['pre'][0], lg_pre_1=lg['pre'][-1], lg_post_0=lg['post'][0], lg_post_1=lg['post'][-1], lg_deepnorm_0=lg['deepnorm'][0], lg_deepnorm_1=lg['deepnorm'][-1]))
    cols = st.columns(2)
    with cols[0]:
        plots.show(lambda: variants_figure("normlab_init_resid", t("normlab.residual_rms_after_each_block", depth=depth),
                                   range(depth), {v: prof[v]["resid_rms"] for v in prof}, t, t("normlab.layer"), "RMS"),
                   ctx, key="normlab_init_resid_fig", share=0.5)
    oc = {v: sweep[v]["output_change"] for v in sweep}
    with cols[1]:
        plots.show(lambda: variants_figure("normlab_init_update", t("normlab.output_change_after_one_adam", lr=o.probe_lr),
                                   depths, oc, t, t("normlab.layers_n_log"), t("normlab.rms_change_of_the_logits"), log_x=True),
                   ctx, key="normlab_init_update_fig", share=0.5)
    st.caption(t("normlab.left_pre_norm_s_residual", prof_pre_resid_rms_0=prof['pre']['resid_rms'][0], prof_pre_resid_rms_1=prof['pre']['resid_rms'][-1], depths_1=depths[-1], oc_pre_1=oc['pre'][-1], oc_post_1=oc['post'][-1], oc_deepnorm_1=oc['deepnorm'][-1], depths_0=depths[0], oc_pre_0=oc['pre'][0], oc_post_0=oc['post'][0], oc_deepnorm_0=oc['deepnorm'][0]))
    rows = lambda: plots.to_csv(["variant", "depth", "layer", "grad_down", "resid_rms"],  # noqa: E731
                                ([v, depth, i, g, x] for v in prof for i, (g, x) in
                                 enumerate(zip(prof[v]["grad_down"], prof[v]["resid_rms"]))))
    label = t("normlab.csv_init")
    plots.csv_button(ctx, label, label, rows, "normlab_init.csv", key="normlab_csv_init")


def init_lesson(t, ffn: str, init: str) -> str:
    """What a student should see for these options, with the ratios measured over the shipped seeds (not typed)."""
    nums = lesson_numbers.load()
    if not nums:
        return ""
    r = nums["init_ratio"][lesson_numbers.combo_key(ffn, init)]
    at = dict(depth=nums["depth"], seeds=nums["seeds"])
    pre = t("normlab.init_lesson_pre", lo=r["pre"]["lo"], hi=r["pre"]["hi"], **at)
    post = dict(lo=r["post"]["lo"], hi=r["post"]["hi"], **at)
    if init == "llama":
        return pre + t("normlab.init_lesson_llama", **post)
    if ffn == "swiglu":
        return pre + t("normlab.init_lesson_swiglu", **post)
    return pre + t("normlab.init_lesson_xavier_relu", **post)
