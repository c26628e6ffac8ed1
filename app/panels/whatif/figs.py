"""The What-if view's figures and the data they draw: pure functions of numpy arrays and run dicts (no Streamlit)."""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from app import plots
from app.figure_text import legend_line
from explorer_model import interventions as I
from explorer_model.analysis import views_data as V

N_TOP = 10


def pattern_of(run: dict, layer: int, ivs) -> np.ndarray:
    """[head, q, k] attention of a changed run, rebuilt from its rotated Q and K like the recorder does;
    where no-mask applies the mask is pushed past the last key, as the intervention does."""
    q, k = run["rot"][layer]
    unmasked = any(isinstance(iv, I.NoMask) and iv.layer in (None, layer) for iv in ivs)
    return V.pattern_from_rotated(q, k, unmasked)


def distribution_data(clean_logits, changed_logits, n: int = N_TOP) -> dict:
    """Last-position probabilities: the union of both runs' top n tokens, and the n tokens that moved most."""
    return V.distribution_data(clean_logits, changed_logits, n)


LEGEND_CHARS = 44  # of a line of the changed run's name in a legend: a long list of changes or source prompt is cut


def changed_name(t, specs: str, source_text: str | None = None) -> str:
    """The changed run as a legend names it: "changed · no-mask", and for a patch the prompt it copied from on a
    second line ("changed · patch:blocks.27.hook_resid_post@-1" / "← “She walked along the bank of the river…”"),
    so that a figure read or saved on its own still says what was changed. Plotly reads a legend's text as HTML."""
    first = f"{t('whatif.changed')} · {legend_line(specs, LEGEND_CHARS)}"
    return first + (f"<br>← “{legend_line(source_text, LEGEND_CHARS)}”" if source_text else "")


def distribution_figure(d: dict, name, t, changed: str) -> go.Figure:
    """name(id): how a candidate token reads (a character fragment as the character it completes); `changed`: the
    changed run's name (changed_name). A row per candidate, the likeliest on top: every candidate keeps its name
    on a phone, where twenty upright labels side by side would leave room for every other one."""
    y = [f"{name(int(i))} ({int(i)})" for i in d["ids"]]
    fig = go.Figure([go.Bar(x=d["clean"], y=y, orientation="h", name=t("whatif.unchanged"), marker_color="#888888"),
                     go.Bar(x=d["changed"], y=y, orientation="h", name=changed, marker_color="#d62728")])
    fig.update_layout(barmode="group", title=t("whatif.next_token_probabilities_at_the"),
                      yaxis_title=t("whatif.token_id"), xaxis_title=t("whatif.probability"),
                      margin=dict(l=10, r=10, t=50, b=10), legend=dict(orientation="h", y=-0.15))
    fig.update_yaxes(type="category", autorange="reversed")
    return fig


def moved_figure(d: dict, name, t, changed: str) -> go.Figure:
    """Δp of the tokens that moved most; the title names the change on its next line (the first line of `changed`,
    changed_name's: this figure has one series, no legend to say it; a patch's source prompt is left to the
    figures beside it, in a column this narrow it would double the title)."""
    y = [f"{name(int(i))} ({int(i)})" for i in d["moved"]]
    colours = np.where(d["delta"] > 0, "#2ca02c", "#d62728")
    fig = go.Figure(go.Bar(x=d["delta"], y=y, orientation="h", marker_color=colours,
                           hovertemplate="%{y}<br>Δp = %{x:.4f}<extra></extra>"))
    fig.update_layout(title=f'{t("whatif.tokens_that_moved_most_p")}<br>{changed.split("<br>")[0]}',
                      xaxis_title="Δp", margin=dict(l=10, r=10, t=50, b=10))
    fig.update_yaxes(autorange="reversed", type="category")
    return fig


def kl_figure(kl: np.ndarray, t, changed: str) -> go.Figure:
    """KL per layer; the title names the change on its next lines, as moved_figure's."""
    fig = go.Figure(go.Bar(x=list(range(len(kl))), y=kl, marker_color="#9467bd",
                           hovertemplate="L%{x}: %{y:.4f} nats<extra></extra>"))
    fig.update_layout(title=f'{t("whatif.where_the_runs_part_kl")}<br>{changed}',
                      xaxis_title=t("whatif.layer"), yaxis_title=t("whatif.kl_nats_mean_over_positions"),
                      margin=dict(l=10, r=10, t=50, b=10))
    return fig


def own_token_figure(p_clean: np.ndarray, p_changed: np.ndarray, labels, t, changed: str) -> go.Figure:
    x = labels[:len(p_clean)]
    fig = go.Figure([go.Scatter(x=x, y=y, mode="lines+markers", name=name, line=dict(color=colour)) for y, name, colour in
                     ((p_clean, t("whatif.unchanged"), "#888888"), (p_changed, changed, "#d62728"))])
    fig.update_layout(title=t("whatif.probability_each_position_gives_to"),
                      xaxis_title=t("whatif.position_predicting_the_token_after"),
                      yaxis_title=t("whatif.probability"), yaxis_range=[0, 1.02], margin=dict(l=10, r=10, t=50, b=10),
                      legend=dict(orientation="h", y=-0.3))
    fig.update_xaxes(type="category")
    return fig


def attention_figure(mats: list[np.ndarray], titles: list[str], label_sets: list[list[str]], t,
                     stacked: bool = False) -> go.Figure:
    """Side-by-side patterns (one under another when `stacked`: a phone, where three side by side had cells of a
    few px); cells the mask removes are blank (NaN), cells it would remove but did not are coloured. Matrices over
    the same tokens side by side share the first one's row labels; one over other tokens (the shuffled prompt)
    names its own rows, with room left for them."""
    rows, cols = (len(mats), 1) if stacked else (1, len(mats))
    own_rows = [stacked or c == 0 or labels != label_sets[0] for c, labels in enumerate(label_sets)]
    layout = plots.grid_layout(rows, cols, titles, hspace=0.12 if any(own_rows[1:]) else 0.04,
                               vspace=0.3 / len(mats))
    traces = []
    for c, (m, labels) in enumerate(zip(mats, label_sets)):
        xa, ya = plots.axis_ids(c + 1, 1, 1) if stacked else plots.axis_ids(1, c + 1, len(mats))
        traces.append(go.Heatmap(z=m, x=labels, y=labels, coloraxis="coloraxis", hoverongaps=False, xaxis=xa, yaxis=ya,
                                 hovertemplate="q %{y}<br>k %{x}<br>%{z:.4f}<extra></extra>"))
        layout["yaxis" + ya[1:]].update(autorange="reversed", type="category", showticklabels=own_rows[c])
        layout["xaxis" + xa[1:]].update(type="category", tickangle=-60)  # keys labelled under every matrix
    fig = go.Figure(traces, layout)
    fig.update_layout(coloraxis=dict(colorscale="Blues", cmin=0, cmax=1), margin=dict(l=10, r=10, t=40, b=10))
    return fig


def masked_blank(m: np.ndarray, ivs, layer: int) -> np.ndarray:
    """Blank the future only where the mask is still in force (a masked probability is not a small number)."""
    if any(isinstance(iv, I.NoMask) and iv.layer in (None, layer) for iv in ivs):
        return m
    return plots.blank_future(m)


def sweep_figure(delta: np.ndarray, layers, target_piece: str, p_clean: float, t) -> go.Figure:
    lim = float(np.abs(delta).max()) or 1.0
    fig = plots.heatmap(delta, [t("whatif.head", h=h) for h in range(delta.shape[1])],
                        [t("whatif.layer_2", l=l) for l in layers], colorscale="RdBu", zmid=0, zmin=-lim, zmax=lim,
                        title=t("whatif.which_heads_matter_change_of", target_piece=target_piece, p_clean=p_clean),
                        x_title=t("whatif.head_2"), y_title=t("whatif.layer"), value_name="Δp")
    return fig


