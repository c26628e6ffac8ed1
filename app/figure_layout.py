"""Figures sized to the width the page gives them (app/screen.py).

Plotly is told no width: a figure fills its column, whatever the screen. What the server sizes for that width:

- a heatmap's height, margins and colour bar: cells about square, every row labelled when the rows fit, a colour
  bar under the plot on a phone (beside it, no more ticks than fit along it), no label cut;
- the tick labels of every axis: of categories every k-th one, k from the px each label gets along its axis and the
  room a label's line needs (1.33 font sizes), so labels never overlap; a numeric x axis as many ticks as fit, a
  log axis over less than a decade enough to read by;
- a legend: above the plot, under the title, the figure grown for its rows;
- subplots side by side: room between them for each one's y axis labels and title; between rows, room for the
  lower row's titles; above the first row, room for the title's lines and the subplot titles' lines;
- its text (app/figure_text.py): titles wrapped to the width, nothing smaller than the screen allows.

Every function here is pure: a figure (its spec, app/figure_spec.py) and sizes in, the figure changed in place.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

from app.figure_spec import Figure, axes, axis_categories, y_of
from app.figure_text import (CHAR_EM, LINE, PAD, STANDOFF, TICK_GAP, TITLE_TOP, TOOLBAR_CLEAR, TOOLBAR_H, Sizes, cut,
                             cut_cell_text, place_title, presenter_fonts, raise_fonts, text_px, title_pad,
                             wrap_subplot_titles)
from app.figure_ticks import LABEL_CHARS, LABEL_ROOM, NARROW_LABEL_CHARS, room_left_of, thin, thin_ticks

NARROW = 560  # px: a figure narrower than this has its colour bar under the plot
CELL_MAX = 48  # px: a heatmap's rows are never taller than this
HEAT_MAX_H = 560  # px: the tallest plot area of a heatmap
PRESENTER_MAX_H = 680  # px: the tallest figure in presenter mode (the main figure fits a 1280×720 first screen)
COLORBAR_PX = 14  # thickness of a colour bar
COLOR_TRACES = ("heatmap", "contour", "histogram2d")  # traces that draw a colour bar of their own
TITLE_GAP = 6  # px between a figure's title and the subplot titles under it
MIN_SUBPLOT = 0.2  # of a row's width: side-by-side subplots are never made narrower to fit their axes' labels
LEGEND_ITEM_PX, LEGEND_ROW = 46, 1.6  # a legend item's symbol and gaps (px), a row's height (× its font size)
LEGEND_GROUP_GAP = 10  # px Plotly leaves between groups of legend items (legend.tracegroupgap's default)


# --------------------------------------------------------------------------- heatmaps
def is_heatmap(fig: Figure) -> bool:
    """One heatmap on one pair of category axes (plots.heatmap and its kind): sized here as a whole."""
    if not fig.data or fig.data[0].type != "heatmap" or len(axes(fig, "x")) != 1:
        return False
    x, y = fig.data[0].x, fig.data[0].y  # labels are lists of text; numbers come base64-typed (a dict)
    return isinstance(x, list) and isinstance(y, list) and bool(x and y) and all(isinstance(v[0], str) for v in (x, y))


@dataclass(frozen=True)
class HeatFrame:
    """Margins of a heatmap (px) and where its colour bar goes."""
    left: float
    right: float
    top: float
    bottom: float
    colorbar_under: bool
    label_chars: int

    def plot_width(self, width: float) -> float:
        return max(width - self.left - self.right, 40.0)


def heat_frame(width: float, x_labels: Sequence, y_labels: Sequence, sizes: Sizes, *, title_lines: int,
               x_title: bool, y_title: bool, colorbar: bool, colorbar_title: bool = False, show_x: bool = True,
               show_y: bool = True) -> HeatFrame:
    """The margins a heatmap needs at this width: its labels (cut to label_chars), axis titles (STANDOFF px from
    the labels), title and colour bar. The figure keeps exactly these (Plotly does not widen them), so the cells
    are as wide as computed here."""
    under = width < NARROW
    chars = NARROW_LABEL_CHARS if under else LABEL_CHARS
    label = lambda labels: max((text_px(cut(v, chars), sizes.tick) for v in labels), default=0.0)  # noqa: E731
    axis_title = STANDOFF + (sizes.tick + 2) * LINE
    left = PAD + (label(y_labels) + TICK_GAP if show_y else 0) + (axis_title if y_title else 0)
    bottom = PAD + (label(x_labels) + TICK_GAP if show_x else 0) + (axis_title if x_title else 0)
    right = 12
    bar_title = sizes.text * LINE + 4 if colorbar_title else 0
    if colorbar and under:
        bottom += 10 + COLORBAR_PX + 4 + sizes.text * LINE + bar_title
    elif colorbar:
        right += 10 + COLORBAR_PX + 4 + 5 * CHAR_EM * sizes.text + bar_title
    top = TITLE_TOP + title_lines * sizes.title * LINE + 12 + (TOOLBAR_CLEAR if title_lines > 1 else 0) \
        if title_lines else 16
    return HeatFrame(left, right, top, bottom, under, chars)


def size_heatmap(fig: Figure, width: float, sizes: Sizes, max_height: float | None = None,
                 touch: bool = False) -> None:
    """Height, margins, colour bar and tick labels of a one-heatmap figure `width` px wide. Rows about as tall as
    cells are wide (at most CELL_MAX; a token × token map stays square), tall enough for every row's label when
    they fit HEAT_MAX_H, never shorter than a line of cell text."""
    tr, lay = fig.data[0], fig.layout
    x, y = [str(v) for v in tr.x], [str(v) for v in tr.y]
    lines = place_title(fig, width, sizes, touch)
    colorbar = tr.showscale is not False and tr.coloraxis is None
    bar_title = bool(colorbar and tr.colorbar.title.text)
    show_y = lay.yaxis.showticklabels is not False
    frame = heat_frame(width, x, y, sizes, title_lines=len(lines), x_title=bool(lay.xaxis.title.text),
                       y_title=bool(lay.yaxis.title.text), colorbar=colorbar, colorbar_title=bar_title,
                       show_x=lay.xaxis.showticklabels is not False, show_y=show_y)
    cell_w = frame.plot_width(width) / len(x)
    cut_cell_text(tr, cell_w, sizes.text)
    spill = _text_spill(tr, cell_w, sizes)  # cell text wider than the first and last cells reaches into the margins
    if spill > min(frame.left, frame.right):
        frame = replace(frame, left=max(frame.left, spill), right=max(frame.right, spill))
        cell_w = frame.plot_width(width) / len(x)
    row = cell_w if x == y else min(cell_w, CELL_MAX)
    if show_y and len(y) * sizes.tick * LABEL_ROOM <= HEAT_MAX_H:  # every row labelled
        row = max(row, sizes.tick * LABEL_ROOM)
    if tr.texttemplate or tr.text is not None:  # cell text at the smallest size: cells are made wide for it
        tr.textfont.size = max(tr.textfont.size or 0, sizes.text)
        row = max(row, tr.textfont.size * 1.6)
    top, bottom = math.ceil(frame.top), math.ceil(frame.bottom)
    room = (max_height or 10_000) - top - bottom
    plot_h = max(min(row * len(y), HEAT_MAX_H, room), min(row, 40.0) if len(y) == 1 else 80.0)
    if lay.yaxis.title.text:  # the y axis's title stands along the plot: a plot of a few rows grows to its length
        font = lay.yaxis.title.font.size or lay.font.size or sizes.tick
        plot_h = max(plot_h, min(text_px(lay.yaxis.title.text, font) + 8, HEAT_MAX_H))
    height = top + math.ceil(plot_h) + bottom
    fig.update_layout(width=None, height=height,
                      margin=dict(l=math.ceil(frame.left), r=math.ceil(frame.right), t=top, b=bottom, pad=0,
                                  autoexpand=False))
    fig.update_xaxes(title_standoff=STANDOFF, automargin=False)
    fig.update_yaxes(title_standoff=STANDOFF, automargin=False, scaleanchor=None, constrain=None)
    if colorbar:
        tr.colorbar.update(tickfont=dict(size=sizes.text), outlinewidth=0)
        if frame.colorbar_under:
            _lay_under(tr.colorbar, height)
        else:
            # as many ticks as labels of a line each fit along it (a one-row strip's bar is a few lines long)
            tr.colorbar.update(orientation="v", x=1, xanchor="left", xref="paper", xpad=10, len=1, lenmode="fraction",
                               thickness=COLORBAR_PX, title_side="right",
                               nticks=max(2, int(plot_h // (sizes.text * LABEL_ROOM * 1.5))))
    thin(lay.xaxis, x, cell_w, sizes.tick, frame.label_chars, rotate=True)
    thin(lay.yaxis, y, plot_h / len(y), sizes.tick, frame.label_chars)


def _text_spill(tr, cell_w: float, sizes: Sizes) -> float:
    """px by which the widest cell text of a heatmap reaches out of its cell on either side (0 without text)."""
    if tr.text is None:
        return 0.0
    texts = [v for row in tr.text for v in (row if isinstance(row, (list, tuple)) else [row])]
    widest = max((text_px(v, max(tr.textfont.size or 0, sizes.text)) for v in texts), default=0.0)
    return max(0.0, (widest - cell_w) / 2 + 4)


# --------------------------------------------------------------------------- every figure
def fit_figure(fig: Figure, width: float, *, presenter: bool, touch: bool, height: int | None = None) -> None:
    """The figure as a column `width` px wide shows it: heights, fonts, titles, tick labels (see the module)."""
    sizes = Sizes.for_screen(presenter)
    if presenter:
        presenter_fonts(fig, sizes)
    if is_heatmap(fig):
        size_heatmap(fig, width, sizes, PRESENTER_MAX_H if presenter else None, touch)
    else:
        if height and not fig.layout.height:
            fig.update_layout(height=height)
        if presenter and fig.layout.height:  # larger text needs a larger figure; the first screen still holds it
            fig.update_layout(height=min(int(fig.layout.height * 1.2), PRESENTER_MAX_H))
        if width < NARROW:
            _colorbar_under(fig, sizes)
        _room_for_y_labels(fig, width, sizes)
        wrap_subplot_titles(fig, plot_area(fig, width, sizes)[0], sizes)
        _room_between_rows(fig, width, sizes)
        lines = place_title(fig, width, sizes, touch)
        extra = len(lines) - 1
        if extra > 0:  # room for the title's added lines
            grow = int(extra * (fig.layout.title.font.size or sizes.title) * LINE) + TOOLBAR_CLEAR
            top = fig.layout.margin.t
            fig.update_layout(margin_t=(top if top is not None else 100) + grow)
            if fig.layout.height:
                fig.update_layout(height=fig.layout.height + grow)
        _room_above(fig, len(lines), sizes)
        thin_ticks(fig, *plot_area(fig, width, sizes), sizes)
        _room_left(fig, sizes)
        _place_legend(fig, width, sizes, len(lines))
    raise_fonts(fig, sizes.text)
    fig.update_layout(width=None)
    if touch:  # a finger on a figure scrolls the page; Plotly's drag modes would hold it
        fig.update_layout(dragmode=False)


def _colorbars(fig: Figure) -> list:
    """The colour bars the figure shows: its traces' own, and a shared colour axis's."""
    bars = [tr.colorbar for tr in fig.data if tr.type in COLOR_TRACES and tr.showscale is not False
            and not tr.coloraxis]
    shared = []  # every colour axis a trace uses (compare mode's A · B and B − A are two), in the traces' order
    for tr in fig.data:
        name = getattr(tr, "coloraxis", None)
        if name and name not in shared:
            shared.append(name)
    axes_ = [getattr(fig.layout, name) for name in shared]
    return bars + [a.colorbar for a in axes_ if a.showscale is not False]


def _lay_under(bar, height: float, above: float = 0.0) -> None:
    """A colour bar lying under the plot, across its width, `above` px over the bottom of a figure `height` px high."""
    bar.update(orientation="h", x=0.5, xanchor="center", xref="paper", y=(PAD + above) / height, yanchor="bottom",
               yref="container", len=1, lenmode="fraction", ypad=0, thickness=COLORBAR_PX, title_side="top")


def _colorbar_under(fig: Figure, sizes: Sizes) -> None:
    """A narrow figure's upright colour bars laid under the plot, one under another in their order (two in one
    place would hide each other), the figure made taller for them."""
    bars = [b for b in _colorbars(fig) if b.orientation != "h"]
    if not bars:
        return
    each = [int(10 + COLORBAR_PX + 4 + sizes.text * LINE + (sizes.text * LINE if bar.title.text else 0))
            for bar in bars]
    extra = sum(each)
    height = (fig.layout.height or 450) + extra
    b = fig.layout.margin.b
    fig.update_layout(height=height, margin_b=(b if b is not None else 80) + extra)
    for i, bar in enumerate(bars):
        _lay_under(bar, height, above=sum(each[i + 1:]))


def _subplot_titles(fig: Figure) -> list:
    """The annotations that title a subplot (plots.grid_layout's): in paper coordinates, no arrow, standing on a
    subplot's top (anchored at their bottom)."""
    return [n for n in fig.layout.annotations if n.xref == "paper" and n.yref == "paper" and not n.showarrow
            and n.text and n.x is not None and n.y is not None and n.yanchor == "bottom"]


def _bottom_labels_px(fig: Figure, sizes: Sizes) -> float:
    """How far the x axes' tick labels and titles reach below the plot (px)."""
    return max((_label_px(fig, a, "x", a.tickfont.size or sizes.tick) for a in axes(fig, "x") if a.side != "top"),
               default=0.0)


def _title_px(fig: Figure, title_lines: int, sizes: Sizes) -> float:
    """px from the figure's top that its title takes (without a title, the toolbar's row)."""
    size = fig.layout.title.font.size or sizes.title
    # the title's top is padded (n - 1) half lines down (place_title); its lines then take n lines or fewer
    return title_pad(title_lines, size) + title_lines * size * LINE if title_lines else TOOLBAR_H


def _first_row_titles_px(fig: Figure, sizes: Sizes) -> float:
    """px the first row's subplot titles take above the plot (they grow upwards from it); 0 without them."""
    return max((len(n.text.split("<br>")) * (n.font.size or fig.layout.font.size or sizes.tick) * LINE
                for n in _subplot_titles(fig) if n.y >= 0.99), default=0.0)


def _room_above(fig: Figure, title_lines: int, sizes: Sizes) -> None:
    """The top margin holds the title's lines (or, without a title, the toolbar's row) and under them the first
    row's subplot titles (growing upwards from the plot): the figure grows by what is missing (a phone wraps)."""
    below = _first_row_titles_px(fig, sizes)
    if not below:
        return
    title = _title_px(fig, title_lines, sizes)
    top = fig.layout.margin.t if fig.layout.margin.t is not None else 100
    missing = math.ceil(title + below + TITLE_GAP - top)
    if missing > 0:
        fig.update_layout(margin_t=top + missing, height=(fig.layout.height or 450) + missing)


def _room_between_rows(fig: Figure, width: float, sizes: Sizes) -> None:
    """Rows of subplots kept apart by the titles of the row below (they stand in the gap above their subplots) and
    the tick labels of the row above: the grid's gap is a share of the height, a line's worth, and a title
    wrapped on a phone reached into the row above. The rows keep their heights; the figure grows."""
    ys = {tuple(a.domain) for a in axes(fig, "y") if a.domain}
    rows = sorted(ys, key=lambda d: -d[1])
    if len(rows) < 2 or any(above[0] < row[1] - 1e-6 for above, row in zip(rows, rows[1:])):
        return  # one row, or subplots that are not rows of a grid
    plot_h = plot_area(fig, width, sizes)[1]
    notes = _subplot_titles(fig)
    gaps = []
    for above, row in zip(rows, rows[1:]):
        lines = [len(n.text.split("<br>")) * (n.font.size or fig.layout.font.size or sizes.tick) * LINE
                 for n in notes if abs(n.y - row[1]) < 0.01]
        labels = max((_label_px(fig, xa, "x", xa.tickfont.size or sizes.tick) for xa in axes(fig, "x")
                      if xa.showticklabels is not False and xa.side != "top" and
                      tuple(y_of(fig, xa).domain or ()) == above), default=0.0)
        gaps.append(max((above[0] - row[1]) * plot_h, max(lines, default=0.0) + labels + TITLE_GAP))
    heights = [(d[1] - d[0]) * plot_h for d in rows]
    total = sum(heights) + sum(gaps)
    grow = math.ceil(total - (rows[0][1] - rows[-1][0]) * plot_h)
    if grow <= 0:
        return
    new, top = {}, 1.0 - (1 - rows[0][1]) * plot_h / (plot_h + grow)
    for i, d in enumerate(rows):
        bottom = top - heights[i] / (plot_h + grow)
        new[d] = [bottom, top]
        top = bottom - (gaps[i] / (plot_h + grow) if i < len(gaps) else 0)
    moved = [(a, new[tuple(a.domain)]) for a in axes(fig, "y") if a.domain and tuple(a.domain) in new]
    titled = [(n, new[d][1]) for n in notes for d in rows if abs(n.y - d[1]) < 0.01]  # a title stays on its row
    for a, domain in moved:
        a.update(domain=domain)
    for n, y in titled:
        n.y = y
    fig.update_layout(height=(fig.layout.height or 450) + grow)


def _room_for_y_labels(fig: Figure, width: float, sizes: Sizes) -> None:
    """Subplots side by side kept apart by what each one's y axis writes at its left (tick labels, title): the grid's
    gap is a share of the width (plots.grid_layout), which on a phone left the right subplot's axis title over its
    neighbour's bars. A row's subplots stay equally wide; their titles (annotations centred over them) move along."""
    plot_w = plot_area(fig, width, sizes)[0]
    rows: dict[tuple, list] = {}
    for xa in axes(fig, "x"):
        ya = y_of(fig, xa)
        if xa.domain and ya.domain:
            rows.setdefault(tuple(ya.domain), []).append((tuple(xa.domain), xa, ya))
    for row in rows.values():
        if len(row) < 2:
            continue
        row.sort(key=lambda r: r[0][0])
        gaps = [b[0][0] - a[0][1] for a, b in zip(row, row[1:])]
        need = max(((_label_px(fig, ya, "y", ya.tickfont.size or sizes.tick) + PAD) / plot_w
                    for _, _, ya in row[1:] if ya.side != "right"), default=0.0)
        start, end, n = row[0][0][0], row[-1][0][1], len(row)
        # subplots no narrower than MIN_SUBPLOT: what room is left, the labels are cut to (thin_ticks)
        need = min(need, (end - start) * (1 - n * MIN_SUBPLOT) / (n - 1))
        each = (end - start - (n - 1) * need) / n
        if min(gaps) >= need:
            continue
        top = row[0][2].domain[1]
        for i, (old, xa, _) in enumerate(row):
            new = [start + i * (each + need), start + i * (each + need) + each]
            xa.update(domain=new)
            for note in _subplot_titles(fig):  # the subplot's title, centred over it on the row's top
                if abs(note.x - (old[0] + old[1]) / 2) < 0.01 and abs(note.y - top) < 0.01:
                    note.x = (new[0] + new[1]) / 2


def _place_legend(fig: Figure, width: float, sizes: Sizes, title_lines: int) -> None:
    """A horizontal legend stands above the plot, left-aligned under the title, in as many rows as it needs: read
    before the lines, and on a projector's first screen whatever the figure's height (at the foot, a tall figure
    under a lecture's player left its lines without names; at the title's right, Plotly's toolbar covered it).
    Placed a fraction of the plot's height away, in Plotly's paper coordinates, it landed on the axis title or the
    figure's title whenever the labels were long or the plot short; its rows are counted here instead."""
    legend = fig.layout.legend
    if legend.orientation != "h" or legend.y is None:
        return
    font = max(legend.font.size or fig.layout.font.size or sizes.text, sizes.text)  # (raise_fonts lifts it later)
    shown = [tr for tr in fig.data if tr.name and tr.showlegend is not False]
    if not shown:
        return
    plot_w = plot_area(fig, width, sizes)[0]
    # each item: its symbol and gaps, its text, and Plotly's gap between groups when items are grouped (which
    # parts their rows too)
    gap = LEGEND_GROUP_GAP if any(getattr(tr, "legendgroup", None) for tr in shown) else 0
    items = [LEGEND_ITEM_PX + gap + text_px(tr.name, font) for tr in shown]
    # one row when every item fits side by side; otherwise Plotly lays them in columns as wide as the widest
    rows = 1 if sum(items) <= plot_w else math.ceil(len(items) / max(1, int(plot_w // max(items))))
    _legend_on_top(fig, font * LEGEND_ROW + gap, sizes, title_lines, rows)


def _legend_on_top(fig: Figure, row_px: float, sizes: Sizes, title_lines: int, rows: int) -> None:
    """A legend's rows, left-aligned, under the title's lines (or the toolbar's row): on the plot's top edge, or over
    a first row of subplot titles (which stand on that edge), just above them. The top margin holds the title, the
    legend and those titles; the figure grows by what is missing."""
    title = _title_px(fig, title_lines, sizes)
    row = rows * row_px + PAD
    top = fig.layout.margin.t if fig.layout.margin.t is not None else 100
    height = fig.layout.height or 450
    below = _first_row_titles_px(fig, sizes)
    below = below + TITLE_GAP if below else 0
    missing = max(0, math.ceil(title + row + below - top))
    fig.update_layout(margin_t=top + missing, height=height + missing)
    if below:  # its foot on the subplot titles' top, in the figure's px from its top
        fig.layout.legend.update(y=1 - (top + missing - below) / (height + missing), yanchor="bottom",
                                 yref="container", x=0, xanchor="left")
    else:
        fig.layout.legend.update(y=1, yanchor="bottom", yref="paper", x=0, xanchor="left")


def _colorbar_px(fig: Figure, sizes: Sizes) -> float:
    """Width of an upright colour bar at the figure's right, 0 when it has none."""
    bars = [b for b in _colorbars(fig) if b.orientation != "h"]
    if not bars:
        return 0.0
    return 16 + 32 + 5 * CHAR_EM * sizes.tick + (sizes.tick * LINE if bars[0].title.text else 0)


def _label_px(fig: Figure, axis, letter: str, font: float) -> float:
    """How far an axis's tick labels and title reach out from the plot (px)."""
    if axis.showticklabels is False:
        labels = 0.0
    else:
        cats = axis_categories(fig, axis, letter)
        longest = max((text_px(cut(c, LABEL_CHARS), font) for c in cats), default=5 * CHAR_EM * font)
        labels = font * LINE if letter == "x" and axis.tickangle in (None, 0) else longest
    title = STANDOFF + (font + 2) * LINE if axis.title.text else 0
    return labels + title + 8


def plot_area(fig: Figure, width: float, sizes: Sizes) -> tuple[float, float]:
    """(width, height) px of the plot area: the figure less its margins, which Plotly widens (automargin) for the
    tick labels and titles at the left and bottom and a colour bar at the right."""
    lay, m = fig.layout, fig.layout.margin
    left = max((_label_px(fig, a, "y", a.tickfont.size or sizes.tick) for a in axes(fig, "y")
                if a.side != "right"), default=0.0)
    bottom = _bottom_labels_px(fig, sizes)
    plot_w = width - max(m.l or 0, left) - max(m.r or 0, _colorbar_px(fig, sizes))
    plot_h = (lay.height or 450) - (m.t if m.t is not None else 100) - max(m.b if m.b is not None else 80, bottom)
    return max(plot_w, 40.0), max(plot_h, 40.0)


def _room_left(fig: Figure, sizes: Sizes) -> None:
    """The left margin holds a titled y axis's tick labels and its title: left to Plotly's automargin, the title
    stood over the labels (the margin it pushed out held the labels and left the title a few px short). An axis
    without a title keeps Plotly's margin, which fits its labels."""
    left = max((_label_px(fig, a, "y", a.tickfont.size or sizes.tick) for a in axes(fig, "y")
                if a.side != "right" and a.title.text and room_left_of(fig, a, 1.0) is None), default=0.0)
    if left and (fig.layout.margin.l or 0) < left + PAD:
        fig.update_layout(margin_l=math.ceil(left + PAD))

