"""The visitor's screen: how wide the page's main column is, whether Streamlit has put its columns under each other
(a phone), and whether the pointer is a finger. Figures are sized to it (app/figure_layout.py) and heatmaps over many
tokens show as many tokens as a finger can tap (app/token_window.py).

The browser reports it through a small component (app/screen_probe.py) whenever it differs from what the server
assumed, and keeps its last measurement in a cookie; a page opened later in the same browser starts from that
cookie, so its figures are drawn once at the right size instead of being drawn for a guess and again. Without the
cookie the server guesses from the browser's user agent.
"""
from __future__ import annotations

from dataclasses import dataclass
import streamlit as st

STACK_BELOW = 640  # px: in a window narrower than this Streamlit puts columns under each other
COLUMN_GAP = 16  # px between two of Streamlit's columns (at most)
WIDTH_STEP = 8  # the main column's width is reported rounded down to this many px
STATE_KEY = "_screen"  # the last report, kept apart from the component's own state (which lives only while drawn)
COOKIE = "explorer_screen"  # "main.window.touch", e.g. "1040.1500.0", written by app/screen_probe.js


@dataclass(frozen=True)
class Screen:
    main: int = 820  # px across the main column's content (a 1280 px window with the sidebar open)
    window: int = 1280  # px across the browser window
    touch: bool = False  # the primary pointer is coarse: a finger

    @property
    def stacked(self) -> bool:
        """Columns stand under each other, each as wide as the main column (a phone)."""
        return self.window < STACK_BELOW

    def column(self, share: float = 1.0) -> int:
        """px across a column holding `share` of the main column's width (the whole column when stacked)."""
        if share >= 1 or self.stacked:
            return self.main
        return int((self.main - COLUMN_GAP) * share)


PHONE = Screen(main=358, window=390, touch=True)
TABLET = Screen(main=736, window=768, touch=True)
DESKTOP = Screen()


def guess(user_agent: str) -> Screen:
    """The screen before the browser has said: a phone or a tablet by its user agent, otherwise a desktop."""
    ua = user_agent or ""
    if "Mobi" in ua or "iPhone" in ua:
        return PHONE
    if "iPad" in ua or "Android" in ua or "Tablet" in ua:
        return TABLET
    return DESKTOP


def from_report(value) -> Screen | None:
    """A Screen from what the browser sent, or None when it is not a plausible report."""
    if not isinstance(value, dict):
        return None
    try:
        main, window, touch = int(value["main"]), int(value["window"]), bool(value["touch"])
    except (KeyError, TypeError, ValueError):
        return None
    if not (100 <= main <= 10_000 and 100 <= window <= 10_000):
        return None
    return Screen(main=main, window=window, touch=touch)


def from_cookie(value) -> Screen | None:
    """The Screen a COOKIE value describes, or None when it is not one (the browser's to send, so anything)."""
    parts = value.split(".") if isinstance(value, str) and len(value) <= 32 else []
    if len(parts) != 3 or not all(p.isascii() and p.isdigit() for p in parts) or parts[2] not in ("0", "1"):
        return None
    return from_report({"main": parts[0], "window": parts[1], "touch": parts[2] == "1"})


def current() -> Screen:
    """This visitor's screen: the browser's last report in this page, or the one its cookie kept from an earlier
    page, or the guess from its user agent."""
    known = st.session_state.get(STATE_KEY)
    if isinstance(known, Screen):
        return known
    try:
        kept = from_cookie(st.context.cookies.get(COOKIE))
        ua = st.context.headers.get("User-Agent", "")
    except Exception:  # noqa: BLE001  (no request behind this run, e.g. a test harness)
        kept, ua = None, ""
    return kept or guess(ua)
