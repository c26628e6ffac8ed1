"""Tick labels that never overlap: categories every k-th, upright when they do not fit side by side, cut to the
room between two subplots; numeric axes a 1-2-5 step whose labels fit (app/figure_layout.py sizes the rest)."""
from __future__ import annotations

import math

from app.figure_spec import Figure, axes, axis_categories, fitting_step, log_ticks, whole_span, whole_step, x_extent, y_of
from app.figure_text import CHAR_EM, PAD, STANDOFF, Sizes, cut, text_px

LABEL_ROOM = 1.45  # × the font size: the room along an axis one line of label text needs
LABEL_CHARS, NARROW_LABEL_CHARS = 14, 9  # longer tick labels are cut, with "…" (the hover names them whole)
MIN_LABEL_CHARS = 7  # a label cut to fit between two subplots keeps this much ("12:␣th…")


def thin(axis, cats: list[str], px_each: float, font: int, chars: int, rotate: bool = False) -> None:
    """Every k-th category labelled, so each label line gets LABEL_ROOM × font px along the axis."""
    k = max(1, math.ceil(font * LABEL_ROOM / max(px_each, 0.1)))
    shown = cats[::k]
    axis.update(type="category", categoryarray=cats, tickmode="array", tickvals=shown,
                ticktext=[cut(c, chars) for c in shown], tickfont=dict(size=font))
    if rotate:
        axis.update(tickangle=-90)


def thin_ticks(fig: Figure, plot_w: float, plot_h: float, sizes: Sizes) -> None:
    """Tick labels that never overlap. An axis of categories: horizontal when all fit side by side, otherwise
    upright, every k-th. A numeric x axis: at most as many ticks as labels of five characters fit."""
    for letter in ("x", "y"):
        for axis in axes(fig, letter):
            axis.update(title_standoff=STANDOFF)
            if axis.showticklabels is False:
                continue
            font = axis.tickfont.size or sizes.tick
            domain = axis.domain or (0, 1)
            length = (domain[1] - domain[0]) * (plot_w if letter == "x" else plot_h)
            cats = axis_categories(fig, axis, letter) if axis.type in (None, "-", "category") else []
            room = room_left_of(fig, axis, plot_w) if letter == "y" else None
            if len(cats) >= 2:
                _thin_categories(axis, cats, letter, length, font, _chars_within(cats, room, font))
            elif axis.type == "log" and (vals := log_ticks(fig, axis, letter)):
                axis.update(tickvals=vals)
            elif letter == "x" and axis.tickvals is None and axis.dtick is None:
                most = max(2, int(length // (5 * CHAR_EM * font + 24)))
                numeric = axis.type not in ("log", "date", "category", "multicategory")
                span = whole_span(fig, axis) if numeric else None
                reach = (list(axis.range) if axis.range is not None else x_extent(fig, axis)) if numeric else None
                if span:  # positions, counts: Plotly's own ticks would go to 0.5 where no point is
                    axis.update(tick0=0, dtick=whole_step(span / most))
                elif reach:  # as many ticks as fit inside what is drawn
                    axis.update(tick0=0, dtick=fitting_step(*reach, most))
                else:
                    axis.update(nticks=most)


def room_left_of(fig: Figure, ya, plot_w: float) -> float | None:
    """px between the subplot of y axis `ya` and its left neighbour in the same row, where its tick labels stand;
    None for the first subplot of a row (its labels stand in the figure's margin)."""
    mine = [xa for xa in axes(fig, "x") if xa.domain and y_of(fig, xa).plotly_name == ya.plotly_name]
    if not mine or not ya.domain or ya.side == "right":
        return None
    lefts = [xa.domain[1] for xa in axes(fig, "x") if xa.domain and xa.domain[1] <= mine[0].domain[0]
             and tuple(y_of(fig, xa).domain or ()) == tuple(ya.domain)]
    return (mine[0].domain[0] - max(lefts)) * plot_w if lefts else None


def _chars_within(cats: list[str], room: float | None, font: float) -> int:
    """The most characters (up to LABEL_CHARS, at least MIN_LABEL_CHARS: a position and a few letters) every label
    keeps where `room` px is all a subplot's labels have."""
    n = LABEL_CHARS
    while room is not None and n > MIN_LABEL_CHARS and max(text_px(cut(c, n), font) for c in cats) + 8 + PAD > room:
        n -= 1
    return n


def _thin_categories(axis, cats: list[str], letter: str, length: float, font: float, chars: int = LABEL_CHARS) -> None:
    if axis.range is None and axis.autorange is None:  # the categories span the axis (a line's label widens it)
        axis.update(range=[-0.5, len(cats) - 0.5])
    each = length / len(cats)
    widest = max(text_px(cut(c, chars), font) for c in cats)
    if letter == "x" and widest + 8 <= each:
        axis.update(tickangle=0, tickmode="array", tickvals=cats, ticktext=[cut(c, chars) for c in cats])
        return
    k = max(_panel_step(axis, cats), math.ceil(font * LABEL_ROOM / max(each, 0.1)))
    shown = cats[::k]
    axis.update(tickmode="array", tickvals=shown, ticktext=[cut(c, chars) for c in shown])
    if letter == "x":
        axis.update(tickangle=-90)


def _panel_step(axis, cats: list[str]) -> int:
    """The step of a panel's own choice of tick labels (every k-th category), 1 when it made none."""
    vals = axis.tickvals if isinstance(axis.tickvals, list) else []
    if len(vals) < 2 or vals[0] not in cats or vals[1] not in cats:
        return 1
    return max(1, cats.index(vals[1]) - cats.index(vals[0]))
