"""Plotly helpers shared by the panels: heatmaps with blank masked cells, showing, CSV downloads."""
from __future__ import annotations

import csv
import io
from typing import Sequence

import numpy as np
import plotly.graph_objects as go
import streamlit as st

from .context import ViewContext


def masked_to_nan(a) -> np.ndarray:
    """-inf (masked attention) becomes NaN, which Plotly draws as an empty cell rather than a colour."""
    a = np.asarray(a, dtype=np.float64)
    return np.where(np.isneginf(a), np.nan, a)


def heatmap(z, x: Sequence[str], y: Sequence[str], *, title: str = "", colorscale: str = "Viridis",
            zmid: float | None = None, zmin: float | None = None, zmax: float | None = None,
            x_title: str = "", y_title: str = "", value_name: str = "value", fmt: str = ".4f") -> go.Figure:
    fig = go.Figure(go.Heatmap(
        z=z, x=list(x), y=list(y), colorscale=colorscale, zmid=zmid, zmin=zmin, zmax=zmax,
        hoverongaps=False,
        hovertemplate=f"{y_title or 'row'}: %{{y}}<br>{x_title or 'column'}: %{{x}}<br>{value_name}: %{{z:{fmt}}}<extra></extra>",
    ))
    fig.update_layout(title=title, xaxis_title=x_title, yaxis_title=y_title, margin=dict(l=10, r=10, t=40, b=10))
    fig.update_yaxes(autorange="reversed", type="category")
    fig.update_xaxes(type="category")
    return fig


def show(fig: go.Figure, ctx: ViewContext, key: str, filename: str | None = None, height: int | None = None,
         **chart_args) -> None:
    """Render with Plotly's own PNG download button; larger fonts in presenter mode.
    chart_args go to st.plotly_chart (e.g. on_select=callback, selection_mode="points" for clickable cells)."""
    if ctx.presenter:
        fig.update_layout(font=dict(size=18), title_font=dict(size=22))
    if height:
        fig.update_layout(height=height)
    st.plotly_chart(fig, key=key, **chart_args, config={
        "displaylogo": False,
        "toImageButtonOptions": {"format": "png", "filename": filename or key, "scale": 2},
    })


def to_csv(header: Sequence[str], rows) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(header)
    for r in rows:
        w.writerow([f"{v:.6g}" if isinstance(v, (float, np.floating)) else v for v in r])
    return buf.getvalue()


def matrix_csv(m, row_labels: Sequence[str], col_labels: Sequence[str], corner: str = "") -> str:
    m = np.asarray(m)
    return to_csv([corner, *col_labels], ([row_labels[i], *m[i].tolist()] for i in range(m.shape[0])))


def csv_button(ctx: ViewContext, label_en: str, label_zh: str, data, filename: str, key: str) -> None:
    """data: a CSV string or a zero-argument callable producing one (computed only on click)."""
    st.download_button(ctx.t(label_en, label_zh), data=data, file_name=filename, mime="text/csv", key=key,
                       on_click="ignore")


# --------------------------------------------------------------------------- subplot grids
def axis_ids(r: int, c: int, cols: int) -> tuple[str, str]:
    n = (r - 1) * cols + c
    return ("x", "y") if n == 1 else (f"x{n}", f"y{n}")


def grid_layout(rows: int, cols: int, titles, *, hspace: float = 0.03, vspace: float = 0.1,
                row_heights=None, equal: bool = False, share_x: bool = False) -> dict:
    """Layout dict of a rows × cols subplot grid (axes x, x2, …; titles as annotations).

    Built by hand because make_subplots plus per-cell add_trace costs ~0.1-0.2 s for a dozen cells,
    too slow for a view that redraws on every slider move.
    """
    row_heights = row_heights or [1 / rows] * rows
    total_h = 1 - vspace * (rows - 1)
    w = (1 - hspace * (cols - 1)) / cols
    lay, ann, top = {}, [], 1.0
    for r in range(1, rows + 1):
        h = total_h * row_heights[r - 1] / sum(row_heights)
        for c in range(1, cols + 1):
            xa, ya = axis_ids(r, c, cols)
            x0 = (c - 1) * (w + hspace)
            xd = [max(x0, 0.0), min(x0 + w, 1.0)]
            lay["xaxis" + xa[1:]] = dict(domain=xd, anchor=ya)
            lay["yaxis" + ya[1:]] = dict(domain=[max(top - h, 0.0), min(top, 1.0)], anchor=xa)
            if equal:
                lay["yaxis" + ya[1:]]["scaleanchor"] = xa
            if share_x and r < rows:
                lay["xaxis" + xa[1:]].update(matches=axis_ids(rows, c, cols)[0], showticklabels=False)
            i = (r - 1) * cols + c - 1
            if titles and i < len(titles):
                ann.append(dict(text=titles[i], x=(xd[0] + xd[1]) / 2, y=top, xref="paper", yref="paper",
                                xanchor="center", yanchor="bottom", showarrow=False))
        top -= h + vspace
    lay["annotations"] = ann
    return lay
