"""The text of a figure on this screen: its font sizes, titles wrapped to the width (short of Plotly's toolbar),
and no text smaller than a phone or a projector can show (app/figure_layout.py sizes the rest).

A figure here is its spec (app/figure_spec.py). Widths are estimated from the characters: CHAR_EM font sizes a
Latin character (with room to spare), WIDE_EM a Chinese one. Every function here is pure.
"""
from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

from app.figure_spec import Figure, axes

FONT, PRESENTER_FONT = 12, 16  # tick labels (px)
MIN_TEXT, PRESENTER_MIN_TEXT = 12, 14  # no text of a figure is smaller (px)
TITLE_FONT, PRESENTER_TITLE_FONT = 16, 22
PAD, TICK_GAP, STANDOFF = 8, 6, 12  # px: a heatmap's edge, between its tick labels and the plot, axis title to labels
CHAR_EM, WIDE_EM = 0.62, 1.0  # width of a character in font sizes (Latin with room to spare; CJK)
# a title's Latin characters: its words average 0.43 font sizes in Chromium ("Next-token probabilities at the", bold,
# 295 px at 22 px); CHAR_EM wrapped titles at two thirds of their room, in three lines where two fit
TITLE_EM = 0.52
LINE = 1.3  # Plotly's line spacing, in font sizes
# Chinese punctuation that never starts (closing marks) / ends (opening marks) a line; escaped: no CJK in code
CLOSING = "\uff0c\u3002\u3001\uff1a\uff1b\uff01\uff1f\uff09\u300d\u300f\u3011\u300b\u201d\u2019"
OPENING = "\uff08\u300c\u300e\u3010\u300a\u201c\u2018"  # (curly quotes too: Chinese text uses them)
SHORT_GROUP = 12  # characters of a bracketed group no line breaks inside
TITLE_TOP = 8  # px above a figure's title
TOOLBAR_CLEAR = 3  # px more above a title of several lines: its second line, which may run under the toolbar,
# starts below the buttons (place_title)
CELL_TEXT_PAD = 3  # px a heatmap's cell text keeps from either side of its cell
TAG = re.compile(r"<[^<>]*>")  # Plotly's text tags (<b>, <i>, <br>), which take no room of their own
# px across Plotly's toolbar, which sits over the figure's top right corner (measured in Chromium: 80 and 152)
TOOLBAR_PX, TOUCH_TOOLBAR_PX = 160, 88
TOOLBAR_H = 30  # px down from the figure's top that the toolbar's buttons take (measured in Chromium: 26)
# Plotly's toolbar keeps the PNG download, Streamlit's full screen and, with a mouse, zoom, pan and reset; a finger
# scrolls the page instead (dragmode off), so a touch screen gets no zoom buttons
TOOLBAR_DROPPED = ("select2d", "lasso2d", "zoomIn2d", "zoomOut2d", "autoScale2d")
TOUCH_TOOLBAR_DROPPED = TOOLBAR_DROPPED + ("zoom2d", "pan2d", "resetScale2d")


@dataclass(frozen=True)
class Sizes:
    """The fonts of a figure on this screen."""
    tick: int
    text: int  # the smallest text allowed
    title: int

    @classmethod
    def for_screen(cls, presenter: bool) -> "Sizes":
        if presenter:
            return cls(PRESENTER_FONT, PRESENTER_MIN_TEXT, PRESENTER_TITLE_FONT)
        return cls(FONT, MIN_TEXT, TITLE_FONT)


def text_px(text, font: float, em: float = CHAR_EM) -> float:
    """Rendered width of one line of text (tags dropped), at the font size `font`, `em` font sizes a Latin character."""
    s = TAG.sub("", str(text))
    return sum(font * (WIDE_EM if unicodedata.east_asian_width(c) in "WF" else em) for c in s)


def cut(label, n: int) -> str:
    s = str(label)
    return s if len(s) <= n else s[:n - 1] + "…"


def legend_line(text, n: int) -> str:
    """Text a person wrote (a prompt, a list of changes, a path) as one line of a legend: on one line, cut to `n`
    characters with "…", its angle brackets made harmless (Plotly reads a legend's text as HTML)."""
    return cut(" ".join(str(text).split()), n).replace("<", "‹").replace(">", "›")


def telling_apart(text, other, n: int) -> str:
    """legend_line(text, n), or, when that would read the same as `other`'s (two prompts with a long common
    beginning, a minimal pair), the line from a few words before the first place they differ, after "…"."""
    line = legend_line(text, n)
    if line != legend_line(other, n):
        return line
    a, b = " ".join(str(text).split()), " ".join(str(other).split())
    same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    start = a.rfind(" ", 0, max(0, same - n // 3)) + 1  # a word boundary about a third of a line before
    return legend_line("…" + a[start:], n) if start > 0 else line


def cut_to(label, room: float, font: float) -> str:
    """`label` cut (with "…") to the longest beginning that fits `room` px at `font`; one character and "…" at
    least."""
    s = str(label)
    if text_px(s, font) <= room:
        return s
    n = len(s) - 1
    while n > 1 and text_px(s[:n] + "…", font) > room:
        n -= 1
    return s[:n] + "…"


def cut_cell_text(tr, cell_w: float, least: int) -> None:
    """A heatmap trace's cell text cut to its cells, `cell_w` px wide (with "…"): longer, it ran into the next cell's,
    and on a phone the loss strip read "9:␣capital10:␣of". The hover keeps each text whole (its %{text} becomes
    %{hovertext}). `least`: the smallest text size, which cell text is drawn at or above."""
    if tr.text is None:
        return
    rows = [list(row) if isinstance(row, (list, tuple)) else [row] for row in tr.text]
    font = max(tr.textfont.size or 0, least)
    cut = [[cut_to(v, cell_w - 2 * CELL_TEXT_PAD, font) for v in row] for row in rows]
    if cut == rows:
        return
    if tr.hovertext is None and "%{text}" in (tr.hovertemplate or ""):
        tr.hovertext = rows
        tr.hovertemplate = tr.hovertemplate.replace("%{text}", "%{hovertext}")
    tr.text = cut


def toolbar_dropped(touch: bool) -> list[str]:
    """The buttons Plotly's toolbar leaves out (its config's modeBarButtonsToRemove)."""
    return list(TOUCH_TOOLBAR_DROPPED if touch else TOOLBAR_DROPPED)


def toolbar_px(touch: bool) -> int:
    """Width of the toolbar: the PNG button and Streamlit's full screen, and zoom, pan and reset with a mouse."""
    return TOUCH_TOOLBAR_PX if touch else TOOLBAR_PX


def wrap(text: str, width_px: float, font: float, em: float = CHAR_EM) -> list[str]:
    """A title broken into lines no wider than width_px: at spaces, or anywhere in text without spaces (Chinese),
    into as few lines as fit and those as even as they can be (CSS's text-wrap: balance): filled line by line, the
    last one could hold a single Chinese character."""
    lines = _filled(text, width_px, font, em)
    if len(lines) < 2:
        return lines
    lo, hi = 0.0, width_px  # the narrowest width that needs no more lines
    for _ in range(10):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if len(_filled(text, mid, font, em)) <= len(lines) else (mid, hi)
    return _filled(text, hi, font, em)


def _filled(text: str, width_px: float, font: float, em: float) -> list[str]:
    """Lines filled one after another, each no wider than width_px (a piece wider than that stands alone)."""
    lines, line = [], ""
    for word in _words(text):
        if line and text_px((line + word).rstrip(), font, em) > width_px:
            lines.append(line.rstrip())
            line = word.lstrip()
        else:
            line += word
    return lines + [line.rstrip()] if line.strip() else lines


def _words(text: str) -> list[str]:
    """The pieces a line may break after: words with their space, single Chinese characters (a closing mark stays
    with the character before it, an opening one with the character after it, and a line may end before an opening
    mark). A short bracketed group stays whole: "(KV 0)" is one name, not "(KV" and "0)"."""
    whole = set()  # positions after which no line ends: inside a short group
    for i, c in enumerate(text):
        if c in "(\uff08":  # round brackets, ASCII or full-width
            end = min((j for j in (text.find(")", i), text.find("\uff09", i)) if j > i), default=-1)
            if 0 < end - i <= SHORT_GROUP:
                whole.update(range(i, end))
    out, word = [], ""
    for i, c in enumerate(text):
        word += c
        following = text[i + 1] if i + 1 < len(text) else ""
        if i in whole or following in CLOSING or c in OPENING:
            continue
        if c == " " or unicodedata.east_asian_width(c) in "WF" or following in OPENING:
            out.append(word)
            word = ""
    return out + [word] if word else out


def title_text(fig: Figure) -> str:
    t = fig.layout.title
    return (t.text or "") if t is not None else ""


def presenter_fonts(fig: Figure, sizes: Sizes) -> None:
    big = sizes.tick
    fig.update_layout(font=dict(size=big + 2), title_font=dict(size=sizes.title), legend_font=dict(size=big),
                      hoverlabel_font=dict(size=big))
    fig.update_xaxes(tickfont=dict(size=big), title_font=dict(size=big + 2))
    fig.update_yaxes(tickfont=dict(size=big), title_font=dict(size=big + 2))


def title_pad(lines: int, size: float) -> float:
    """px from a figure's top to its title's anchor, for a title of `lines` lines at `size` px."""
    return TITLE_TOP + (lines - 1) * LINE / 2 * size + (TOOLBAR_CLEAR if lines > 1 else 0)


def place_title(fig: Figure, width: float, sizes: Sizes, touch: bool) -> list[str]:
    """The title at the top left, its lines wrapped to the figure's width, the first short of the toolbar (which stands
    beside it, and would cover its end); its lines."""
    title = title_text(fig)
    if not title:
        return []
    size = fig.layout.title.font.size or sizes.title
    first, *others = title.split("<br>")
    head = (wrap(first, width - toolbar_px(touch) - 16, size, TITLE_EM) or [""])[0]
    tail = first[len(head):].strip()  # what of the first line does not fit beside the toolbar
    lines = [head] + [part for line in ([tail] if tail else []) + others for part in wrap(line, width - 16, size,
                                                                                          TITLE_EM)]
    # top-anchored in the figure; Plotly centres a title's lines on the first one's place, so a title of n lines
    # starts (n - 1) half lines lower
    fig.update_layout(title=dict(text="<br>".join(lines), x=0, xanchor="left", xref="container", y=1, yanchor="top",
                                 yref="container", pad=dict(l=8, t=title_pad(len(lines), size))))
    return lines


def wrap_subplot_titles(fig: Figure, plot_w: float, sizes: Sizes) -> None:
    """Subplot titles (annotations centred over an x axis's domain) wrapped to their subplot's share of the plot
    area's plot_w px; the figure grows at the top for a first row's added lines (its titles grow upwards)."""
    centres = [((a.domain or (0, 1))[0] + (a.domain or (0, 1))[1]) / 2 for a in axes(fig, "x")]
    spans = [(a.domain or (0, 1))[1] - (a.domain or (0, 1))[0] for a in axes(fig, "x")]
    added = 0
    for note in fig.layout.annotations:
        if note.xref != "paper" or note.showarrow or not note.text or note.x is None:
            continue
        match = [span for c, span in zip(centres, spans) if abs(c - note.x) < 0.01]
        if not match or len(spans) < 2:
            continue
        font = note.font.size or (fig.layout.font.size or sizes.tick)
        lines = [part for line in note.text.split("<br>") for part in wrap(line, match[0] * plot_w, font)]
        if note.y is not None and note.y >= 0.99:
            added = max(added, int((len(lines) - len(note.text.split("<br>"))) * font * LINE))
        note.text = "<br>".join(lines)
    if added:
        t = fig.layout.margin.t
        fig.update_layout(margin_t=(t if t is not None else 100) + added, height=(fig.layout.height or 450) + added)


def raise_fonts(fig: Figure, least: int) -> None:
    """Every font size the figure sets, at least `least` px; those it leaves unset follow the layout's font, but a
    shared colour axis's bar follows Streamlit's theme (12 px), so its size is always set."""
    def up(font) -> None:
        if font is not None and font.size is not None and font.size < least:
            font.size = least
    lay = fig.layout
    for font in (lay.font, lay.title.font, lay.legend.font, lay.hoverlabel.font):
        up(font)
    for axis in (*axes(fig, "x"), *axes(fig, "y")):
        up(axis.tickfont)
        up(axis.title.font)
    for note in lay.annotations:
        up(note.font)
    for name in sorted({tr.coloraxis for tr in fig.data if getattr(tr, "coloraxis", None)}):  # coloraxis, coloraxis2…
        bar = getattr(lay, name).colorbar
        bar.tickfont.size = max(bar.tickfont.size or 0, least)
        bar.title.font.size = max(bar.title.font.size or 0, least)
    for tr in fig.data:
        for font in (tr.textfont, tr.insidetextfont, tr.outsidetextfont, tr.colorbar.tickfont, tr.colorbar.title.font):
            up(font)
