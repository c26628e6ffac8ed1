"""Shared pieces of the attention view's figures: the token window, head names, clickable cells, CSV cells.

Streamlit's selection events return nothing for a Plotly heatmap (streamlit/streamlit#8760), so each clickable
heatmap gets an overlay of invisible square markers, one per cell, carrying the cell's (row, column) indices as
customdata: a click selects a marker, and `clicked_cell` reads the indices back from the selection.
"""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from app import gateway, plots
from app.token_window import centred
from app.context import ViewContext

WINDOW_DEFAULT = 24  # tokens either side of the selected one: 49 rows stay legible in a square of ~500 px
MAX_TICKS = 16  # tick labels per axis in the small multiples; Plotly would print all 49 on top of each other


def window(n_pos: int, token: int, half: int) -> tuple[int, int]:
    """[lo, hi) of the positions shown: 2·half+1 tokens around `token`, shifted to stay inside the prompt so the
    window keeps its size near either end."""
    size = min(n_pos, 2 * int(half) + 1)
    lo = centred(n_pos, token, size)
    return lo, lo + size


def head_label(ctx: ViewContext, h: int) -> str:
    return ctx.t("attention.head_label", head=h, kv=h // ctx.cfg.n_rep)


def layer_matrices(ctx: ViewContext, layer: int, kind: str) -> np.ndarray:
    """[head, q_pos, k_pos] probabilities or scaled scores of one layer; the masked future is NaN in both (drawn
    blank). The recording rebuilds them from Q and K on every read: kept by the gateway, once per server."""
    return gateway.derived("attention_layer", ctx.source, ctx.ids, _layer_matrices, layer, kind)


def _layer_matrices(rec, layer: int, kind: str) -> np.ndarray:
    m = plots.blank_future((rec.pattern(layer) if kind == "pattern" else rec.scores(layer))[0].double().numpy())
    m.setflags(write=False)  # every page shares it
    return m


def thinned(labels: list[str], most: int = MAX_TICKS) -> list[str]:
    """Every k-th label so that at most `most` are printed (hover still names every cell)."""
    step = max(1, int(np.ceil(len(labels) / most)))
    return list(labels[::step])


def csv_cells(m: np.ndarray) -> np.ndarray:
    """A matrix for plots.matrix_csv with masked (NaN) cells as None: an empty CSV field, not the text "nan"."""
    m = np.asarray(m, dtype=np.float64)
    return np.where(np.isnan(m), None, m.astype(object))


def click_overlay(rows: np.ndarray, cols: np.ndarray, x: list[str], y: list[str], text: list[str],
                  xaxis: str = "x", yaxis: str = "y", selected: tuple[int, int] | None = None) -> go.Scatter:
    """Invisible markers on the cells (rows[i], cols[i]) of a category heatmap with axes x/y; a click selects one.

    `text` is each cell's hover text (the heatmap's own hover is switched off under the overlay). The cell
    `selected` (row, col) is drawn with a dark outline, so the figure shows which cell is chosen.
    """
    rows, cols = np.asarray(rows, dtype=int), np.asarray(cols, dtype=int)
    chosen = [] if selected is None else [i for i in range(rows.size)
                                          if (rows[i], cols[i]) == tuple(selected)]
    return go.Scatter(
        x=[x[c] for c in cols], y=[y[r] for r in rows], mode="markers", xaxis=xaxis, yaxis=yaxis,
        customdata=np.stack([rows, cols], -1).tolist(), text=text, hovertemplate="%{text}<extra></extra>",
        marker=dict(symbol="square-open", size=12, opacity=0.0, color="#111", line=dict(width=2)),
        selectedpoints=chosen or None, selected=dict(marker=dict(opacity=1.0)),
        unselected=dict(marker=dict(opacity=0.0)), showlegend=False, meta="cells")


def clicked_cell(event) -> tuple[int, int] | None:
    """(row, col) of the clicked overlay marker in a Streamlit plotly selection event (its `selection.points`),
    or None when nothing carrying customdata is selected."""
    try:
        points = event["selection"]["points"]
    except (KeyError, TypeError):
        return None
    for p in points:
        cd = p.get("customdata") if isinstance(p, dict) else None
        if isinstance(cd, dict):  # a typed array arrives as {"0": row, "1": col}
            cd = [cd[k] for k in sorted(cd, key=int)]
        if isinstance(cd, (list, tuple)) and len(cd) == 2:
            return int(cd[0]), int(cd[1])
    return None


def clickable(fig: go.Figure) -> go.Figure:
    """A click selects one overlay marker (and nothing else: no drag-select box over the cells)."""
    return fig.update_layout(clickmode="event+select", dragmode=False)


__all__ = ["WINDOW_DEFAULT", "window", "head_label", "layer_matrices", "thinned", "csv_cells", "click_overlay",
           "clicked_cell", "clickable"]
