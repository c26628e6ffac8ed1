"""A window of tokens for a heatmap whose columns are tokens, so that a finger can tap one cell and a cell's text
fits it.

On a touch screen the window holds as many tokens as fit at TOUCH_CELL px a cell in the figure's column. A figure
whose cells show text (the loss strip, the logit lens) holds, on every screen, as many as fit at cells wide enough
for CELL_TEXT_CHARS characters of it. A view may ask for fewer (the attention view's slider). The window stands
around the selected token; the buttons under the figure move it, and choosing another token centres it again. With a
mouse (which points at any cell and reads its hover), or when every token fits, a figure shows every token its view
asks for.

A figure about two tokens (the attention map: a query and the key it reads most) keeps both in view: the window
slides to hold the other one too, and when the two are further apart than the window is wide, the other one stands
apart at the window's edge, the tokens between them left out and counted under the figure.
"""
from __future__ import annotations

import streamlit as st

from app.context import ViewContext
from app.figure_layout import heat_frame
from app.figure_text import Sizes, cut, text_px

TOUCH_CELL = 32  # px: a cell a fingertip hits (WCAG's smallest target is 24 px)
CELL_TEXT_CHARS = 4  # a cell with text is at least as wide as this many of its characters (more reach its neighbours)


def text_cell(texts, presenter: bool) -> float:
    """px a cell needs to show the longest of `texts` (cut at CELL_TEXT_CHARS characters) at the smallest text size."""
    size = Sizes.for_screen(presenter).text
    return max((text_px(cut(t, CELL_TEXT_CHARS), size) for t in texts), default=0.0) + 8


def fitting(ctx: ViewContext, y_labels, *, share: float = 1.0, min_cell: float = 0.0, y_title: bool = True,
            colorbar: bool = True) -> int | None:
    """How many token columns a heatmap in this column can show at cells of at least min_cell px (and TOUCH_CELL on a
    touch screen); None when any number can (a mouse and no minimum)."""
    cell = max(min_cell, TOUCH_CELL if ctx.screen.touch else 0.0)
    if cell <= 0:
        return None
    width = ctx.screen.column(share)
    frame = heat_frame(width, [], y_labels, Sizes.for_screen(ctx.presenter), title_lines=1, x_title=True,
                       y_title=y_title, colorbar=colorbar)
    return max(1, int(frame.plot_width(width) // cell))


def centred(n: int, focus: int, size: int) -> int:
    """The first of `size` positions around `focus`, moved to stay inside 0…n-1 so the window keeps its size."""
    size = min(n, size)
    return min(max(int(focus) - (size - 1) // 2, 0), n - size)


def keeping(n: int, size: int, focus: int, keep: int | None, lo: int | None = None) -> tuple[int, int, int | None]:
    """([lo, hi), pinned): the run of positions a figure shows around `focus` (from `lo` when the buttons moved the
    window) and the position `keep` shown apart from it, or None when the run holds `keep`. When the two fit in
    `size`, the window slides as little as brings `keep` in; otherwise it stays around `focus` and gives up its cell
    nearest to `keep`, so the figure keeps `size` cells."""
    size = min(n, size)
    if keep is not None and not 0 <= keep < n:
        keep = None
    if lo is None:
        lo = centred(n, focus, size)
        if keep is not None and abs(focus - keep) < size:
            lo = min(max(lo, keep - size + 1), keep)
    lo = min(max(int(lo), 0), n - size)
    if keep is None or lo <= keep < lo + size:
        return lo, lo + size, None
    return (lo + 1, lo + size, keep) if keep < lo else (lo, lo + size - 1, keep)


def span_keeping(key: str, n: int, size: int | None, focus: int, keep: int | None) -> tuple[int, int, int | None]:
    """span() for a figure about two tokens: the run [lo, hi) around `focus` and `keep` shown apart when the run
    cannot hold it (keeping()); the buttons of controls() move the run, `keep` stays."""
    if size is None or size >= n:
        return 0, n, None
    focus = min(max(int(focus), 0), n - 1)
    kept = st.session_state.get(_state_key(key))
    lo = None
    if isinstance(kept, tuple) and len(kept) == 3 and kept[:2] == ((focus, keep), size):
        lo = kept[2]
    lo, hi, pinned = keeping(n, size, focus, keep, lo)
    window_lo = lo - 1 if pinned is not None and pinned < lo else lo  # the whole window's first, which _move moves
    st.session_state[_state_key(key)] = ((focus, keep), size, window_lo)
    return lo, hi, pinned


def shown(lo: int, hi: int, pinned: int | None) -> list[int]:
    """The positions a figure shows, in order: the run and the position kept apart."""
    return sorted(set(range(lo, hi)) | ({pinned} if pinned is not None else set()))


def _state_key(key: str) -> str:
    return f"{key}_window"


def span(key: str, n: int, size: int | None, focus: int) -> tuple[int, int]:
    """[lo, hi) of the n positions a figure shows: all of them, or `size` around `focus` as last moved by the
    buttons of controls() (a new focus or size centres the window again)."""
    if size is None or size >= n:
        return 0, n
    focus = min(max(int(focus), 0), n - 1)
    kept = st.session_state.get(_state_key(key))
    lo = centred(n, focus, size)
    if isinstance(kept, tuple) and len(kept) == 3 and kept[:2] == (focus, size):
        lo = min(max(int(kept[2]), 0), n - size)
    st.session_state[_state_key(key)] = (focus, size, lo)
    return lo, lo + size


def _move(key: str, by: int, n: int) -> None:
    kept = st.session_state.get(_state_key(key))
    if isinstance(kept, tuple) and len(kept) == 3:
        focus, size, lo = kept
        st.session_state[_state_key(key)] = (focus, size, min(max(lo + by, 0), n - size))


def controls(ctx: ViewContext, key: str, n: int, lo: int, hi: int, pinned: int | None = None) -> None:
    """Under a windowed figure: buttons that move the window by half its size, side by side, then which tokens it
    shows (and the one kept apart, with how many are left out between): on a phone the sentence wraps under the
    pair instead of standing between the two buttons."""
    if hi - lo >= n:
        return
    hidden = set(range(n)) - set(shown(lo, hi, pinned))
    step = max(1, (hi - lo + (pinned is not None)) // 2)
    with st.container(horizontal=True, vertical_alignment="center", key=f"{key}_window_bar"):
        st.button("◀", key=f"{key}_earlier", on_click=_move, args=(key, -step, n),
                  disabled=not any(h < lo for h in hidden), help=ctx.t("window.earlier"))
        st.button("▶", key=f"{key}_later", on_click=_move, args=(key, step, n),
                  disabled=not any(h >= hi for h in hidden), help=ctx.t("window.later"))
        if pinned is None:
            st.caption(ctx.t("window.shown", first=lo, last=hi - 1, n=n))
        else:
            gap = lo - pinned - 1 if pinned < lo else pinned - hi
            st.caption(ctx.t("window.shown_apart", first=lo, last=hi - 1, n=n, kept=pinned, gap=gap))
