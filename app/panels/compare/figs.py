"""Compare mode's figures: A and B side by side on one colour scale (and B − A on its own, centred at 0), curves
of both on one axis, top-k lists side by side, and the minimal-pairs change map.

Every trace carries meta "A", "B" or "B-A" (the change map "change", the distances "js"), and every figure a
layout.meta id, so tests read the numbers a figure shows and compare them with the two recordings.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import plotly.graph_objects as go

from app.plots import grid_layout, rows_height

A_COLOR, B_COLOR = "#1f77b4", "#d62728"
HOVER = "↓ %{y}<br>→ %{x}<br>%{z:.4f}<extra></extra>"  # arrows, not words: the same in every language


def _finite_range(*ms) -> tuple[float, float]:
    vals = np.concatenate([np.asarray(m, dtype=np.float64).ravel() for m in ms])
    vals = vals[np.isfinite(vals)]
    if not vals.size:
        return 0.0, 1.0
    lo, hi = float(vals.min()), float(vals.max())
    return (lo, hi) if hi > lo else (lo - 0.5, hi + 0.5)


def pair_heatmaps(fig_id: str, panels: Sequence[tuple[str, str, np.ndarray, Sequence[str], Sequence[str]]],
                  diff: tuple[str, np.ndarray, Sequence[str], Sequence[str]] | None = None, *,
                  zmin: float | None = None, zmax: float | None = None, colorscale: str = "Viridis",
                  height: int = 430, stacked_row: int | None = None) -> go.Figure:
    """A and B (panels: (meta, title, z, x labels, y labels)) on one shared colour axis (zmin/zmax, else the range
    of both), and B − A (diff: (title, z, x, y)) on a second, diverging axis centred at 0. Side by side, or, with
    `stacked_row` (px a heatmap's row of the grid gets), one under another: three side by side on a phone were
    strips a few px wide under titles wrapped to four lines, each one's labels over its neighbour."""
    n = len(panels) + (diff is not None)
    titles = [p[1] for p in panels] + ([diff[0]] if diff is not None else [])
    if stacked_row:
        lay, height = grid_layout(n, 1, titles, vspace=0.02), n * stacked_row + 120
    else:
        lay = grid_layout(1, n, titles, hspace=0.1)
    if zmin is None or zmax is None:
        lo, hi = _finite_range(*[p[2] for p in panels])
        zmin, zmax = (lo if zmin is None else zmin), (hi if zmax is None else zmax)
    fig = go.Figure()
    for k, (meta, _, z, x, y) in enumerate(panels):
        xa, ya = ("x", "y") if k == 0 else (f"x{k + 1}", f"y{k + 1}")
        fig.add_trace(go.Heatmap(z=z, x=list(x), y=list(y), xaxis=xa, yaxis=ya, coloraxis="coloraxis", meta=meta,
                                 hoverongaps=False, hovertemplate=HOVER))
    if diff is not None:
        _, dz, dx, dy = diff
        k = len(panels)
        m = float(np.nanmax(np.abs(dz))) if np.isfinite(dz).any() else 1.0
        fig.add_trace(go.Heatmap(z=dz, x=list(dx), y=list(dy), xaxis=f"x{k + 1}", yaxis=f"y{k + 1}",
                                 coloraxis="coloraxis2", meta="B-A", hoverongaps=False, hovertemplate=HOVER))
        fig.update_layout(coloraxis2=dict(colorscale="RdBu_r", cmid=0, cmin=-(m or 1.0), cmax=m or 1.0,
                                          colorbar=dict(x=1.1, len=0.9, thickness=12, title="B − A")))
    # both colour bars right of the last panel: between panels they would cover the next panel's labels
    fig.update_layout(**lay, coloraxis=dict(colorscale=colorscale, cmin=zmin, cmax=zmax,
                                            colorbar=dict(x=1.01, len=0.9, thickness=12, title="A · B")),
                      meta={"id": fig_id}, height=height,
                      margin=dict(l=60, r=10 if stacked_row else 130 if diff is not None else 60, t=40, b=80))
    fig.update_xaxes(type="category", tickangle=-90)
    fig.update_yaxes(type="category", autorange="reversed")
    return fig


def curves_figure(fig_id: str, series: Sequence[tuple[str, str, np.ndarray, np.ndarray]], *, title: str,
                  x_title: str, y_title: str, log_y: bool = False, height: int = 340) -> go.Figure:
    """Lines on one shared axis; series: (meta "A"/"B", legend name, x, y)."""
    fig = go.Figure()
    for meta, name, x, y in series:
        color = A_COLOR if meta.startswith("A") else B_COLOR
        fig.add_trace(go.Scatter(x=np.asarray(x, dtype=float), y=np.asarray(y, dtype=float), mode="lines+markers",
                                 name=name, meta=meta, line=dict(color=color, dash="dot" if meta.endswith("2") else None)))
    fig.update_layout(title=title, xaxis_title=x_title, yaxis_title=y_title, meta={"id": fig_id}, height=height,
                      legend=dict(orientation="h", y=-0.25), margin=dict(t=50, b=40))
    if log_y:
        fig.update_yaxes(type="log")
    return fig


X_TITLE_DROP = 30  # px from the plots' foot to a shared x title: the tick labels' line stands between


def curves_grid(fig_id: str, panels: Sequence[tuple[str, Sequence[tuple[str, str, np.ndarray, np.ndarray]]]], *,
                x_title: str, cols: int = 3, height: int = 520) -> go.Figure:
    """Several curve panels (title, series), A and B on each, x shared (relative depth)."""
    rows = -(-len(panels) // cols)
    fig = go.Figure()
    fig.update_layout(**grid_layout(rows, cols, [p[0] for p in panels], hspace=0.08, vspace=0.16))
    for k, (_, series) in enumerate(panels):
        xa, ya = ("x", "y") if k == 0 else (f"x{k + 1}", f"y{k + 1}")
        for meta, name, x, y in series:
            fig.add_trace(go.Scatter(x=np.asarray(x, dtype=float), y=np.asarray(y, dtype=float), mode="lines+markers",
                                     name=name, meta=f"{meta}:{k}", xaxis=xa, yaxis=ya, showlegend=k == 0,
                                     line=dict(color=A_COLOR if meta == "A" else B_COLOR)))
    fig.update_layout(meta={"id": fig_id}, height=height, margin=dict(t=40, b=90),
                      legend=dict(orientation="h", x=0, y=-0.1, yanchor="top"))
    fig.update_xaxes(range=[-0.05, 1.05])
    # under the tick labels (a line of them, up to a projector's size, below the plots' foot), right of the legend
    fig.add_annotation(text=x_title, x=1, y=0, yshift=-X_TITLE_DROP, xref="paper", yref="paper", showarrow=False,
                       xanchor="right", yanchor="top")
    return fig


def bars_figure(fig_id: str, labels: Sequence[str], series: Sequence[tuple[str, str, np.ndarray]], *, title: str,
                y_title: str, highlight: Sequence[int] = (), height: int = 340, rows: bool = False) -> go.Figure:
    """Grouped bars over categories (one trace per series: meta, name, y); highlighted categories get a box.
    `rows`: a row per category, the first on top (ranked candidates: each keeps its name on a phone, where
    twenty upright labels side by side leave room for every other one); y_title then names the values' axis."""
    if rows:
        fig = go.Figure([go.Bar(x=np.asarray(y, dtype=float), y=list(labels), orientation="h", name=name, meta=meta,
                                marker_color={"A": A_COLOR, "B": B_COLOR}.get(meta, "#555555"))
                         for meta, name, y in series])
        fig.update_layout(title=title, xaxis_title=y_title, barmode="group", meta={"id": fig_id},
                          height=max(height, rows_height(len(labels))), legend=dict(orientation="h", y=-0.15),
                          margin=dict(t=50, b=40))
        return fig.update_yaxes(type="category", autorange="reversed")
    fig = go.Figure()
    for meta, name, y in series:
        color = {"A": A_COLOR, "B": B_COLOR}.get(meta, "#555555")
        fig.add_trace(go.Bar(x=list(labels), y=np.asarray(y, dtype=float), name=name, meta=meta, marker_color=color))
    for i in highlight:
        fig.add_vrect(x0=i - 0.5, x1=i + 0.5, line_width=0, fillcolor="orange", opacity=0.2)
    fig.update_layout(title=title, yaxis_title=y_title, barmode="group", meta={"id": fig_id}, height=height,
                      legend=dict(orientation="h", y=-0.35), margin=dict(t=50, b=40))
    fig.update_xaxes(type="category", tickangle=-60)
    return fig


def change_map_figure(fig_id: str, ratio: np.ndarray, depth: np.ndarray, labels: Sequence[str], top: Sequence[int],
                      *, title: str, x_title: str, y_title: str) -> go.Figure:
    """Minimal pairs: ‖Δ resid‖ / ‖resid‖ over (blocks passed, compared position); the most-changed columns framed."""
    y = [f"{k}" for k in range(len(depth))]
    fig = go.Figure(go.Heatmap(z=ratio, x=list(labels), y=y, colorscale="Reds", meta="change", zmin=0,
                               hovertemplate=HOVER, customdata=np.broadcast_to(depth[:, None], ratio.shape)))
    for i in top:
        fig.add_shape(type="rect", x0=i - 0.5, x1=i + 0.5, y0=-0.5, y1=len(y) - 0.5, line=dict(color=A_COLOR, width=3))
    fig.update_layout(title=title, xaxis_title=x_title, yaxis_title=y_title, meta={"id": fig_id, "top": list(top)},
                      height=max(320, 40 + 18 * len(y)), margin=dict(t=50, b=80))
    fig.update_xaxes(type="category", tickangle=-90)
    fig.update_yaxes(type="category", autorange="reversed")
    return fig
