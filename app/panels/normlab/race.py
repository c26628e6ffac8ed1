"""Norm lab, section 3: the training race, one chart: the shipped seeds faint, a live run drawn over them.

The lesson's numbers are measured from the shipped curves (explorer_model.lab.race.race_lesson_numbers) and the
unigram line is explained from assets/lab/lesson_numbers.json; nothing in the prose is typed.
"""
from __future__ import annotations

from dataclasses import asdict

import plotly.graph_objects as go
import streamlit as st

from app import choice_state, gateway, plots
from app.context import ViewContext
from app.i18n import error_text
from app.panels.normlab.common import COLORS, fig_frame, run_name, wait_for
from explorer_model import view_choices as VC
from explorer_model.lab import lesson_numbers
from explorer_model.lab import normlab as lab
from explorer_model.lab.race import race_lesson_numbers

RACE_DASH = {True: "solid", False: "dot"}
RACE_DEPTHS, RACE_LRS = VC.values("lab_race_depth"), VC.values("lab_race_lr")
RACE_TIME_LIMIT = 60.0
# Defaults that show the difference: at 6 layers and lr 3e-3 every shipped Pre run leaves the unigram line by step
# ~100 and every Post run stays on it; 150 steps fit the time limit on a 2-core machine (bench: see the report).
DEFAULT_DEPTH, DEFAULT_LR, DEFAULT_STEPS = (VC.CHOICES[k].default for k in ("lab_race_depth", "lab_race_lr",
                                                                            "lab_race_steps"))


def race_figure(result: dict | None, t, shipped: dict | None = None, fig_id: str = "normlab_race") -> go.Figure:
    """Live (or finished) race curves, with the shipped seeds faint behind them, and the unigram line."""
    fig = fig_frame(fig_id, t("normlab.training_loss_pre_vs_post"),
               t("normlab.step"), t("normlab.training_loss_nats_token"), height=420)
    if shipped:  # faint behind a live race; the legend names them only when they are alone
        for i, (seed, runs) in enumerate(shipped["seeds"].items()):
            for key, ys in runs.items():
                fig.add_trace(go.Scatter(x=shipped["steps"], y=ys, name=run_name(t, key), legendgroup=key,
                                         meta=f"shipped_{key}_{seed}", mode="lines", opacity=0.3 if result else 0.8,
                                         showlegend=i == 0 and not result,
                                         hovertemplate=t("normlab.seed") + f" {seed}, " + "%{x}: %{y:.3f}<extra></extra>",
                                         line=dict(color=COLORS[key.split("_")[0]], dash=RACE_DASH[key.endswith("_warmup")], width=1.5)))
    if result:
        for key, ys in result["curves"].items():
            fig.add_trace(go.Scatter(x=result["steps"], y=ys, name=run_name(t, key), meta=key, mode="lines",
                                     legendgroup=key, hovertemplate="%{x}: %{y:.3f}<extra></extra>",
                                     line=dict(color=COLORS[key.split("_")[0]], dash=RACE_DASH[key.endswith("_warmup")], width=3)))
    h = (result or shipped or {}).get("unigram_entropy")
    if h is not None:
        fig.add_hline(y=h, line=dict(color="gray", dash="dash"),
                      annotation_text=t("normlab.unigram_entropy_learned_token_frequencies", h=h), annotation_position="top right")
    return fig


def draw_race(ctx: ViewContext) -> dict | None:
    t = ctx.t
    st.subheader(t("normlab.3_training_race"))
    rc0 = lab.RaceConfig()
    st.markdown(t("normlab.race_intro", d=rc0.d_model, warm=rc0.warmup_frac))
    c = st.columns(3)
    for key in ("lab_race_depth", "lab_race_lr", "lab_race_steps"):
        choice_state.start(key)
    depth = c[0].select_slider(t("normlab.layers"), RACE_DEPTHS, key="lab_race_depth")
    lr = c[1].select_slider(t("normlab.learning_rate"), RACE_LRS, key="lab_race_lr",
                            format_func=lambda x: f"{x:g}")
    steps = int(c[2].number_input(t("normlab.steps"), 4, 2000, step=10, key="lab_race_steps"))
    shipped_all = lab.load_race_curves()
    shipped = (shipped_all or {}).get("runs", {}).get(lab.race_grid_key(int(depth), float(lr)))
    if shipped:
        shipped = {**shipped, "unigram_entropy": shipped_all["unigram_entropy"]}
    rc = lab.RaceConfig(depth=int(depth), lr=float(lr), steps=steps, log_every=max(1, steps // 30))
    r = st.session_state.get("lab_race_result")
    r = r if r and r["config"] == asdict(rc) else None  # a finished race of other settings is not drawn here
    slot = st.empty()  # ONE chart: the shipped seeds, and the live run drawn over them as it trains
    bar = st.empty()

    def chart(result, key: str, live: bool = False) -> None:  # a finished chart is kept; a live one changes
        build = lambda: race_figure(result, t, shipped)  # noqa: E731
        plots.show(build() if live else build, ctx, key=key, filename="normlab_race", into=slot)
    chart(r, "normlab_race_fig")
    start = st.button(t("normlab.start_the_race_s", race_time_limit=RACE_TIME_LIMIT), key="lab_race_start")
    if start:
        def label(j) -> str:
            return t("normlab.step_s", step=j.partial["steps"][-1], sec=j.partial["seconds"])
        try:
            job = gateway.lab_race(rc, RACE_TIME_LIMIT)
        except gateway.LabDisabled:  # serve --no-lab: the shipped curves above still show
            st.info(t("normlab.lab_off"))
        except gateway.LabBusy as e:  # this visitor's experiment is still queued, or the room's queue is full
            st.warning(error_text(e, ctx.lang))
        else:
            r = wait_for(job, t, bar, lambda part: chart(part, f"normlab_race_live_{len(part['steps'])}", live=True),
                         label)
            st.session_state["lab_race_result"] = r
            chart(r, "normlab_race_done")
    if r and not r["completed"]:
        st.warning(t("normlab.stopped_at_step_of_after", r_steps_1=r["steps"][-1], r_config_steps=r["config"]["steps"],
                     r_seconds=r["seconds"]))
    if r:
        st.caption(t("normlab.race_live_prefix") + race_summary({"steps": r["steps"], "seeds": {"live": r["curves"]},
                                                                "unigram_entropy": r["unigram_entropy"]}, t))
    if shipped:
        st.caption(t("normlab.race_shipped_prefix") + race_summary(shipped, t))
    nums = lesson_numbers.load()
    if nums:
        u = nums["unigram"]
        st.caption(t("normlab.unigram_explained", h=u["entropy"], tokens=u["tokens"], vocab=u["vocab"]))
    if shipped_all:
        n = race_lesson_numbers(shipped_all)
        with plots.explainer(ctx, t("normlab.race_lesson_expander")):
            st.markdown(t("normlab.race_lesson", **{k: v for k, v in n.items() if k != "settings"}))
    if not shipped:
        sets = ", ".join(t("normlab.setting", depth=d, lr=x) for d, x in
                         (race_lesson_numbers(shipped_all)["settings"] if shipped_all else []))
        st.info(t("normlab.no_precomputed_curves_for_this", settings=sets))
    runs = [("live", r["steps"], r["curves"])] if r else []
    runs += [(f"shipped_seed{k}", shipped["steps"], c) for k, c in shipped["seeds"].items()] if shipped else []
    if runs:
        rows = lambda: plots.to_csv(["source", "step", *lab.RUN_KEYS],  # noqa: E731
                                    ([src, step, *(c[k][i] for k in lab.RUN_KEYS)] for src, steps, c in runs
                                     for i, step in enumerate(steps)))
        label = t("normlab.csv_race")
        plots.csv_button(ctx, label, label, rows, f"normlab_race_{depth}L_lr{lr:g}.csv", key="normlab_csv_race")
    return r


def race_summary(shipped: dict, t) -> str:
    """Final losses per run (range over seeds) and when each left the unigram plateau, in words."""
    h, steps = shipped["unigram_entropy"], shipped["steps"]

    def rng(xs, f="{:.2f}"):
        xs = sorted(x for x in xs if x is not None)
        return "–".join(dict.fromkeys(f.format(x) for x in (xs[0], xs[-1]))) if xs else "–"

    parts = []
    for k in lab.RUN_KEYS:
        runs = [r[k] for r in shipped["seeds"].values()]
        esc = [lab.escape_step(steps, ys, h) for ys in runs]
        final, never, off = rng([ys[-1] for ys in runs]), sum(e is None for e in esc), rng(esc, "{}")
        if never == len(esc):
            parts.append(t("normlab.run_never_off", run=run_name(t, k), final=final))
        elif never:
            parts.append(t("normlab.run_off_some", run=run_name(t, k), final=final, off=off, never=never, n=len(esc)))
        else:
            parts.append(t("normlab.run_off", run=run_name(t, k), final=final, off=off))
    return t("normlab.race_summary", steps=steps[-1], runs=t("normlab.list_sep").join(parts), h=h,
             margin=lab.PLATEAU_MARGIN)
