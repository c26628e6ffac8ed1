"""What the norm lab's three files share: colours, names of the variants and runs, a figure frame, and waiting for a
lab job with the place in the queue shown."""
from __future__ import annotations

import plotly.graph_objects as go

COLORS = {"pre": "#4c78a8", "post": "#e45756", "deepnorm": "#54a24b"}


def variant_name(t, v: str) -> str:
    return {"pre": t("normlab.pre_norm"), "post": t("normlab.post_norm"),
            "deepnorm": t("normlab.deepnorm")}[v]


def run_name(t, key: str) -> str:
    placement, warm = key.split("_")
    return variant_name(t, placement) + (t("normlab.warmup") if warm == "warmup" else t("normlab.no_warmup"))


def fig_frame(fig_id: str, title: str, x_title: str, y_title: str, height: int = 360, **layout) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(title=title, xaxis_title=x_title, yaxis_title=y_title, height=height, meta={"id": fig_id},
                      margin=dict(l=10, r=10, t=50, b=10), legend=dict(orientation="h", y=-0.2), **layout)
    return fig


def variants_figure(fig_id, title, x, ys_by_variant: dict, t, x_title, y_title, log_y=False, log_x=False) -> go.Figure:
    fig = fig_frame(fig_id, title, x_title, y_title, yaxis_type="log" if log_y else None, xaxis_type="log" if log_x else None)
    if log_x:
        fig.update_xaxes(tickvals=list(x))
    for v, ys in ys_by_variant.items():
        fig.add_trace(go.Scatter(x=list(x), y=ys, name=variant_name(t, v), meta=v, mode="lines+markers",
                                 line=dict(color=COLORS[v]), hovertemplate="%{x}: %{y:.4g}<extra></extra>"))
    return fig


def wait_for(job, t, box, on_partial=None, label=None):
    """Wait for a lab job, showing the place in the queue or the progress; returns the result.
    on_partial(partial) runs once for each new partial result (e.g. a race's next log point)."""
    drawn = [None]

    def update(j) -> None:
        pos = j.position()
        if pos > 0:
            box.info(t("normlab.waiting_for_the_lab_experiment", pos=pos))
        else:
            text = (label(j) if label and j.partial else j.message) or t("normlab.starting")
            box.progress(min(max(j.fraction, 0.0), 1.0), text=text)
            if on_partial and j.partial and j.partial is not drawn[0]:
                drawn[0] = j.partial
                on_partial(j.partial)
    r = job.wait(update)
    box.empty()
    return r


