"""Legends (app/figure_layout.py's _place_legend): above the plot, left-aligned under the title, in as many rows as
their names need, on every screen; checked on the figures themselves (test_browser_layout.py measures the same
figures in Chromium: no legend on a title, an axis or a subplot title)."""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import pytest

from app import plots
from app.figure_layout import PAD
from app.figure_text import LINE, TITLE_TOP, TOOLBAR_H, Sizes
from app.screen import DESKTOP, PHONE
from test_figure_layout import TOKENS, fit


def four_series(width: float, title: str = "") -> go.Figure:
    fig = go.Figure([go.Bar(x=TOKENS, y=np.arange(len(TOKENS)) + s, name=name)
                     for s, name in enumerate(["raw (49152)", "Temperature (49152)", "top-k (50)", "top-p (23)"])],
                    layout=dict(height=400, margin=dict(l=10, r=10, t=50, b=10), xaxis_title="token (rank: text)",
                                legend=dict(orientation="h", y=-0.3), title=title))
    return fit(fig, width, presenter=False, touch=width == PHONE.main)


def test_on_a_phone_a_legend_s_rows_stand_above_the_plot_and_the_foot_stays_the_panel_s():
    """Four series over upright token labels on a phone: four rows of names above the plot, under the toolbar's
    row; the foot keeps the panel's margin (Plotly widens it for the labels and the axis title)."""
    lay = four_series(PHONE.main).layout
    assert (lay.legend.y, lay.legend.yanchor, lay.legend.yref, lay.legend.x) == (1, "bottom", "paper", 0)
    rows = (lay.margin.t - TOOLBAR_H - PAD) / (12 * 1.6)
    assert rows == pytest.approx(4, abs=0.1)  # each name on its own row: one is wider than half the plot
    assert lay.height - 400 == lay.margin.t - 50 and lay.margin.b == 10


@pytest.mark.parametrize("title", ["", "Next-token probabilities after each change",
                                   "Next-token probabilities after each change, token by token, with its rank and"
                                   " the probability every sampling rule leaves it"])
def test_a_legend_of_one_row_on_a_wide_figure_stands_above_the_plot_under_the_title(title):
    """Where a projector's first screen shows it (at the foot, a tall figure under a lecture's player left its lines
    without names): the plot's top edge, the top margin holding the title's lines (or the toolbar's row) above it;
    the figure grows by that row at most, and its foot stays as it was."""
    lay = four_series(DESKTOP.main, title).layout
    assert (lay.legend.y, lay.legend.yanchor, lay.legend.yref, lay.legend.x, lay.legend.xanchor) == (
        1, "bottom", "paper", 0, "left")
    lines = len(lay.title.text.split("<br>")) if title else 0
    size = lay.title.font.size or Sizes.for_screen(False).title  # (the page's title size when the figure sets none)
    title_px = TITLE_TOP + (lines - 1) * size * LINE / 2 + lines * size * LINE if title else 30  # the toolbar's row
    assert lay.margin.t >= title_px + 12 * 1.6  # the title's lines, then the legend's row
    assert lay.height - 400 <= lay.margin.t - 50  # grown at the top only, by what the margin lacked
    assert lay.margin.b == 10  # the foot as the panel set it (Plotly widens it for the labels), no legend row


def test_a_legend_of_several_rows_on_a_wide_figure_stands_above_the_plot_in_its_rows():
    names = [f"softmax(q·k / √d_k) of layer {i}: the model as it runs, every head" for i in range(6)]
    fig = go.Figure([go.Scatter(x=[0, 1], y=[i, i + 1], name=n) for i, n in enumerate(names)],
                    layout=dict(height=400, margin=dict(l=10, r=10, t=50, b=10), title="six long names",
                                legend=dict(orientation="h", y=-0.2)))
    lay = fit(fig, DESKTOP.main, presenter=False, touch=False).layout
    assert (lay.legend.y, lay.legend.yanchor, lay.legend.yref) == (1, "bottom", "paper")
    size = lay.title.font.size or Sizes.for_screen(False).title
    rows = (lay.margin.t - TITLE_TOP - size * LINE) / (12 * 1.6)
    assert rows >= 3  # each name is wider than a third of the plot: at least three rows, all in the top margin


def test_a_legend_over_subplot_titles_stands_between_them_and_the_title():
    def figure(names):
        return go.Figure([go.Scatter(x=[0, 1], y=[0, 1], name=names[0]),
                          go.Scatter(x=[0, 1], y=[1, 0], name=names[1], xaxis="x2", yaxis="y2")],
                         layout=dict(plots.grid_layout(1, 2, ["A", "B"], hspace=0.1), height=300, title="two runs",
                                     margin=dict(l=10, r=10, t=50, b=10), legend=dict(orientation="h", y=-0.2)))
    unnamed = fit(figure(["", ""]), DESKTOP.main, presenter=False, touch=False).layout  # no legend
    lay = fit(figure(["unchanged", "changed"]), DESKTOP.main, presenter=False, touch=False).layout
    assert (lay.legend.yref, lay.legend.yanchor, lay.legend.xanchor) == ("container", "bottom", "left")
    size = lay.title.font.size or Sizes.for_screen(False).title
    foot = (1 - lay.legend.y) * lay.height  # px from the figure's top
    # its row between the title's line and the subplot titles' line on the plot's top edge
    assert foot - 12 * 1.6 - PAD == pytest.approx(TITLE_TOP + size * LINE, abs=1)  # (the margin in whole px)
    assert lay.margin.t - foot >= 12 * LINE
    assert 0 < lay.height - unnamed.height <= 12 * 1.6 + PAD + 1 and lay.margin.b == 10  # grown by its row


def test_grouped_legend_items_get_plotly_s_gap_between_groups_in_their_rows():
    """Grouped items (a run's curve and its faint seeds) stand 10 px further apart, across and down: the normlab
    race's four names took four rows of 29 px on a phone, and the last reached into the title."""
    def figure(grouped: bool):
        names = ["Pre-Norm, warmup", "Pre-Norm, no warmup", "Post-Norm, warmup", "Post-Norm, no warmup"]
        return go.Figure([go.Scatter(x=[0, 1], y=[i, i], name=n, legendgroup=n if grouped else None)
                          for i, n in enumerate(names)],
                         layout=dict(height=420, margin=dict(l=10, r=10, t=50, b=10), title="Training loss",
                                     legend=dict(orientation="h", y=-0.2)))
    plain, grouped = (fit(figure(g), PHONE.main, presenter=False, touch=True).layout for g in (False, True))
    assert grouped.margin.t - plain.margin.t == 4 * 10  # four rows (one name each on a phone), 10 px more each


@pytest.mark.parametrize("width", [PHONE.main, DESKTOP.main])
def test_a_legend_a_panel_put_beside_the_title_moves_under_it_out_of_the_toolbar_s_way(width):
    """At the title's right, Plotly's toolbar (shown while the pointer is on the figure) covered the names."""
    fig = go.Figure([go.Scatter(x=[0, 1], y=[0, 1], name="q·k(Δ)"),
                     go.Scatter(x=[0, 1], y=[1, 0], name="envelope (smoothed max |q·k|)")],
                    layout=dict(height=360, margin=dict(l=10, r=10, t=40, b=10), title="score by distance",
                                legend=dict(orientation="h", y=1.12, x=1, xanchor="right")))
    lay = fit(fig, width, presenter=False, touch=width == PHONE.main).layout
    assert (lay.legend.y, lay.legend.yref, lay.legend.x, lay.legend.xanchor) == (1, "paper", 0, "left")
    assert lay.margin.t >= TITLE_TOP + (lay.title.font.size or Sizes.for_screen(False).title) * LINE + 12 * 1.6
