"""Plotly and layout helpers shared by the panels: heatmaps with blank masked cells, showing, CSV downloads, the
explanations' expander and the view title."""
from __future__ import annotations

import contextlib
import csv
import functools
import io
from typing import Sequence

import numpy as np
import pandas as pd
import plotly.basedatatypes
import plotly.graph_objects as go
import plotly.io
import streamlit as st

from app import gateway, i18n, sections

from .context import ViewContext
from .figure_layout import fit_figure
from .figure_spec import Figure, axes, spec
from .figure_text import toolbar_dropped


def memoize_plotly_paths() -> None:
    """Plotly parses a property path ("xaxis_title_text", "marker.colorbar") from scratch at every figure update
    and property check, defining a class per call on the way (`basedatatypes._str_to_dict_path_full`): a fifth
    to a quarter of this app's drawing time, all of it holding the GIL a classroom server's pages share. The
    parse is a pure function of the string, so it is memoized once per process. Were plotly to rename the
    function, nothing would change but speed."""
    parse = getattr(plotly.basedatatypes, "_str_to_dict_path_full", None)
    if parse is not None and not hasattr(parse, "cache_info"):
        plotly.basedatatypes._str_to_dict_path_full = functools.lru_cache(maxsize=4096)(parse)


memoize_plotly_paths()


def blank_future(m: np.ndarray) -> np.ndarray:
    """The causal mask's cells (key after query: above the diagonal of the last two axes) become NaN, which Plotly
    draws as an empty cell rather than a colour: a masked probability is not a small number. The app's one masking
    rule for drawing, whether the matrix holds scores or probabilities."""
    return np.where(np.triu(np.ones(m.shape[-2:], dtype=bool), 1), np.nan, m)


def explainer(ctx: ViewContext, label: str, expanded: bool = True):
    """The expander holding a view's explanations: open, but collapsed in presenter mode (the room sees figures)."""
    return st.expander(label, expanded=expanded and not ctx.presenter)


def waiting(text: str, needed: bool = True):
    """A spinner around work that will take time; nothing when the answer is already there. Each spinner costs a
    thread and two messages, so a page run that only redraws shows none."""
    return st.spinner(text) if needed else contextlib.nullcontext()


def titled(ctx: ViewContext, title: str, too_short: str) -> bool:
    """The view's one-line title; False, after the one-line note `too_short`, when the prompt has one token
    (nothing for attention to compare)."""
    st.subheader(title)
    if len(ctx.ids) < 2:
        st.caption(too_short)
        return False
    return True


def heatmap(z, x: Sequence[str], y: Sequence[str], *, title: str = "", colorscale: str = "Viridis",
            zmid: float | None = None, zmin: float | None = None, zmax: float | None = None,
            x_title: str = "", y_title: str = "", value_name: str = "", fmt: str = ".4f") -> go.Figure:
    """A heatmap over two category axes (x/y: unique labels); the hover names every cell. It is sized when shown,
    for the width its column has (app/figure_layout.py: cells about square, as many tick labels as fit)."""
    x, y = list(x), list(y)
    fig = go.Figure(go.Heatmap(
        z=z, x=x, y=y, colorscale=colorscale, zmid=zmid, zmin=zmin, zmax=zmax,
        hoverongaps=False,
        hovertemplate=f"{y_title or '↓'}: %{{y}}<br>{x_title or '→'}: %{{x}}<br>{value_name + ': ' if value_name else ''}"
                      f"%{{z:{fmt}}}<extra></extra>",  # arrows, not words: the same in every language
    ))
    fig.update_layout(title=title, xaxis_title=x_title, yaxis_title=y_title)
    fig.update_yaxes(autorange="reversed", type="category", categoryarray=y)
    fig.update_xaxes(type="category", categoryarray=x, tickangle=-90)
    return fig


def show(fig, ctx: ViewContext, key: str, filename: str | None = None, height: int | None = None,
         share: float = 1.0, into=None, **chart_args):
    """Render with Plotly's own PNG download button, as wide as its column: `share` is the column's part of the main
    column's width (1 when the figure is not in columns). The figure is sized for that width and the visitor's
    screen (app/figure_layout.py); presenter mode enlarges every font (tick labels PRESENTER_FONT px).
    `fig` is a figure, or a function of no arguments that builds one: then the finished figure is kept in the
    gateway's cache under what the function closes over and the sizes (app/gateway/figures.py), and a page run that
    asks for it again builds nothing. `into`: the container to draw in (an st.empty() slot redrawn as a run goes
    on); the page where it is called when None. chart_args go to st.plotly_chart (e.g. on_select); its return value
    is returned; None in a part of the view that the page does not show (app/sections.py's `unsent`)."""
    if sections.unsent():
        return None
    width = ctx.screen.column(share)
    if callable(fig):
        done = gateway.figure(fig, lambda built: finish(built, ctx, height, width),
                              (key, ctx.presenter, height, width, ctx.screen.touch))
    else:
        done = finish(fig, ctx, height, width)
    place = st if into is None else into
    return place.plotly_chart(ServedFigure(done), key=key, config=chart_config(ctx, filename or key), width="stretch",
                              **chart_args)


# Plotly's own words that this app's figures can show (its toolbar's buttons, its download notices, the hint after
# a zoom) -> the catalog's key: Plotly looks a text up in its config's locale dictionary before it shows it
PLOTLY_TEXTS = {"Download plot as a PNG": "plotly.download_png", "Zoom": "plotly.zoom", "Pan": "plotly.pan",
                "Reset axes": "plotly.reset_axes", "Double-click to zoom back out": "plotly.zoom_back",
                "Preparing image - this may take a few seconds": "plotly.preparing_image",
                "Image download succeeded": "plotly.image_saved",
                "Sorry, there was a problem downloading your image!": "plotly.image_failed"}


def chart_config(ctx: ViewContext, filename: str) -> dict:
    """Plotly's options for a figure of this page: its PNG download, the toolbar buttons for this screen, and
    Plotly's own words in the page's language."""
    config = {"displaylogo": False, "toImageButtonOptions": {"format": "png", "filename": filename, "scale": 2},
              "modeBarButtonsToRemove": toolbar_dropped(ctx.screen.touch)}
    if ctx.lang != "en":  # (numbers keep Plotly's English format: the locale names no other)
        words = {text: i18n.t(key, ctx.lang) for text, key in PLOTLY_TEXTS.items()}
        config.update(locale=ctx.lang, locales={ctx.lang: {"dictionary": words}})
    return config


class ServedFigure(plotly.basedatatypes.BaseFigure):
    """A finished figure (`finish`), handed to st.plotly_chart as the JSON the browser receives. Streamlit asks a
    figure for `to_dict()` and encodes what it returns with `plotly.io.to_json`; handed a dict it would first
    rebuild it into a Figure, validating every property, and a dict of the spec it would encode again at every
    page run. Here `to_dict()` gives a ServedSpec, which carries the JSON made once, and `plotly.io.to_json`
    returns that JSON as it is (serve_json_as_is). Plotly's own constructor is not run: nothing but `to_dict` is
    ever asked of it."""

    def __init__(self, finished: tuple[str, dict]):  # noqa: D107  (BaseFigure.__init__ deliberately not called)
        object.__setattr__(self, "_finished", finished)

    def to_dict(self) -> dict:
        return ServedSpec(*self._finished)


class ServedSpec(dict):
    """What ServedFigure.to_dict gives: the figure's width and height (Streamlit reads them to size the chart's
    frame), carrying its finished JSON for plotly.io.to_json."""

    def __init__(self, spec_json: str, size: dict):
        super().__init__(layout=dict(size))
        self.json = spec_json


def serve_json_as_is() -> None:
    """plotly.io.to_json returns a ServedSpec's JSON as it is; any other figure is encoded as before. Installed
    once per process (Streamlit looks the function up on plotly.io at each chart)."""
    plain = plotly.io.to_json
    if getattr(plain, "_serves", False):
        return

    def to_json(fig, *args, **kwargs):
        return fig.json if isinstance(fig, ServedSpec) else plain(fig, *args, **kwargs)
    to_json._serves = True
    plotly.io.to_json = to_json


serve_json_as_is()


def finish(fig: go.Figure | dict, ctx: ViewContext, height: int | None, width: int | None = None) -> tuple[str, dict]:
    """The figure as the browser receives it (Plotly's JSON) and its layout's width and height, shown in a column
    `width` px wide (the main column's when None): its height, log axes' ticks, sizes and fonts for the visitor's screen and presenter mode (see
    `show`). Sized on the spec, not on Plotly's graph objects, whose every read and write is validated
    (app/figure_spec.py). `fig`: a figure, or its spec (plain dicts, changed here)."""
    done = Figure(fig if isinstance(fig, dict) else spec(fig))
    # log axes label powers of ten only: Plotly's in-between digits are small (12 px) and crowd the axis
    for axis in (*axes(done, "x"), *axes(done, "y")):
        if axis.type == "log" and axis.dtick is None:
            axis.update(dtick=1)
    fit_figure(done, width or ctx.screen.main, presenter=ctx.presenter, touch=ctx.screen.touch, height=height)
    size = {k: v for k, v in (done.spec.get("layout") or {}).items() if k in ("width", "height")}
    return plotly.io.to_json(done.spec, validate=False), size  # encoded as Streamlit encodes a figure's dict


# On a phone a table of this many rows or fewer is an HTML table, its headers wrapped to the screen's width: the
# grid sizes each column to its header and left the last ones off the screen (What if…'s shuffled-order table).
PHONE_TABLE_ROWS = 12


def table(ctx: ViewContext, data, *, key: str | None = None, height: int | None = None,
          labels: dict | None = None, formats: dict | None = None) -> None:
    """A table: on a visitor's screen Streamlit's interactive grid (sortable, scrolling); in presenter mode an HTML
    table, whose text the page's style makes large enough for a room (the grid draws 14 px text on a canvas), and
    on a phone an HTML table when it is short (PHONE_TABLE_ROWS).
    `data`: a DataFrame or a dict of columns, or a function of no arguments that returns one. The Arrow table the
    page sends is kept in the gateway's cache, named by the values (or by what the function closes over, as
    plots.show names a figure): a page run that asks for it again converts nothing, and given a function, builds
    nothing either.
    labels: column -> the header shown; formats: column -> a printf format of its numbers ("%.6f"). Nothing in a
    part of the view that the page does not show (app/sections.py's `unsent`)."""
    if sections.unsent():
        return
    labels, formats = labels or {}, formats or {}
    build = data if callable(data) else (lambda: data)  # named by its values when given them

    def shown_as(html: bool):
        return gateway.table(build, lambda built: arrow_table(built, html, labels, formats),
                             (html, tuple(labels.items()), tuple(formats.items())))
    html = ctx.presenter
    shown = shown_as(html)
    if not html and ctx.screen.stacked and shown.num_rows <= PHONE_TABLE_ROWS:
        html, shown = True, shown_as(True)
    if not html:
        config = {c: st.column_config.NumberColumn(labels.get(c, c), format=formats[c]) if c in formats
                  else st.column_config.Column(labels[c]) for c in {*labels, *formats}}
        st.dataframe(shown, hide_index=True, key=key, height=height or "auto", column_config=config or None)
    else:
        st.table(shown, hide_index=True, height=height or "content")


def arrow_table(data, html: bool, labels: dict, formats: dict):
    """The Arrow table Streamlit sends for `data` (its own conversion of a DataFrame); for an HTML table with the
    numbers already written in their formats, yes and no as ✓ and ✗ (the grid draws a ticked or empty box; an HTML
    table wrote English "true" and "false" on a Chinese page) and the headers renamed (an HTML table has no column
    settings)."""
    from streamlit.dataframe_util import convert_pandas_df_to_arrow_table

    df = data if isinstance(data, pd.DataFrame) else pd.DataFrame(data)
    if html:
        df = df.copy()
        for c, fmt in formats.items():
            df[c] = [fmt % v for v in df[c]]
        for c in df.columns[[pd.api.types.is_bool_dtype(t) for t in df.dtypes]]:
            df[c] = ["✓" if v else "✗" for v in df[c]]
        df = df.rename(columns=labels)
    return convert_pandas_df_to_arrow_table(df)


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


FORMULA_LEADS = ("=", "+", "-", "@", "\t", "\r")  # what a spreadsheet reads as the start of a formula (OWASP)


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def spreadsheet_safe(text: str) -> str:
    """A CSV whose text cells cannot run as spreadsheet formulas: a cell beginning with = + - @, a tab or a carriage
    return gets a leading single quote, unless it is a number (-0.25 stays a number). Every CSV download passes
    here (csv_button), whatever wrote it (to_csv, pandas)."""
    rows = list(csv.reader(io.StringIO(text)))
    if not any(cell[:1] in FORMULA_LEADS and not _is_number(cell) for row in rows for cell in row):
        return text
    buf = io.StringIO()
    w = csv.writer(buf)
    for row in rows:
        w.writerow(["'" + c if c[:1] in FORMULA_LEADS and not _is_number(c) else c for c in row])
    return buf.getvalue()


def csv_button(ctx: ViewContext, label: str, *args, key: str | None = None) -> None:
    """csv_button(ctx, label, data, filename, key=…) with the label already translated (ctx.t("view.csv_x")).
    data: a CSV string or a zero-argument callable producing one (computed only on click; it must not read
    st.session_state, which does not exist outside a script run). The older form csv_button(ctx, label_en,
    label_zh, data, filename, key) is still accepted while panels move to the catalogs. Nothing in a part of the
    view that the page does not show (app/sections.py's `unsent`)."""
    if sections.unsent():
        return
    if len(args) >= 3:  # older form: the Chinese label comes second
        label, args = (args[0] if ctx.lang == "zh" else label), args[1:]
    data, filename, *rest = args
    safe = (lambda: spreadsheet_safe(data())) if callable(data) else spreadsheet_safe(data)
    st.download_button(label, data=safe, file_name=filename, mime="text/csv", key=key if key else rest[0],
                       on_click="ignore")


# An .npz is a zip archive, and named so the server sends it as it is: as application/octet-stream it would be
# compressed again on every download (0.7 s of CPU at gzip's level 9 for a 23 MB recording, 12 % smaller).
NPZ_MIME = "application/zip"


def npz_button(place, label: str, source: str, n_tokens: int, data, file_name: str, key: str, lang: str) -> None:
    """A recording's .npz download in `place` (st, st.sidebar). `data`: a function of plain values that builds the
    open file (app/gateway/exports.py's npz_file); Streamlit calls it when the browser fetches the file, outside
    any script run, where st.session_state does not exist. Over this server's download cap the reason is said
    there instead, before anyone clicks."""
    try:
        gateway.check_export(source, n_tokens)
    except gateway.RunRefused as e:
        place.caption(i18n.error_text(e, lang))
        return
    place.download_button(label, data=data, file_name=file_name, mime=NPZ_MIME, on_click="ignore", key=key)


# --------------------------------------------------------------------------- subplot grids
def rows_height(n: int) -> int:
    """px of a figure with a row of bars per category, its title and legend: each row's label keeps its room."""
    return 160 + 22 * n


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
