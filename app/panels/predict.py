"""Next token & generation view: the loss training scores at every position (all from one forward pass) beside
step-by-step generation (one token per run, serial), with the sampling steps between the logits and the choice.

A view of its own, apart from the residual stream's figures, so that a generation step redraws only what it changes
for the person clicking: the step extends the cached recording by one KV-cache step (app/panels/generation.py)
and this page draws two figures (bench/bench_browser_step.py).
"""
from __future__ import annotations

import streamlit as st

from app import plots
from app.context import ViewContext
from app.panels import generation
from app.sections import section


def draw(ctx: ViewContext) -> None:
    st.subheader(ctx.t("predict.title"))
    with section("predict", "loss"):
        generation.draw_loss_strip(ctx)  # the main figure: the training objective on this prompt
    with section("predict", "sampling"):
        generation.draw_prediction(ctx)
    with plots.explainer(ctx, ctx.t("predict.formulas")):
        st.latex(r"p = \mathrm{softmax}(\text{logits}/\tau),\qquad \text{logits} = W_\text{out}\,\mathrm{RMSNorm}(x_L)")
        st.latex(r"\mathcal{L}=\frac{1}{T-1}\sum_{t=0}^{T-2}-\ln p(x_{t+1}\mid x_{\le t})")
