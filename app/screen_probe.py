"""The page's probe of its screen (app/screen_probe.js): the browser reports the main column's width, the window's
width and whether the pointer is a finger whenever they differ from what the server assumed (app/screen.py), one
tap selects a Plotly cell on a touch screen, as a click does, and the page loads the fonts of its prose, code and
formulas before its figures draw (a font loaded during a draw makes Plotly draw the figure again)."""
from __future__ import annotations

from pathlib import Path

import streamlit as st

from app.screen import COOKIE, STACK_BELOW, STATE_KEY, WIDTH_STEP, current, from_report

KEY = "screen_probe"
SLACK = 24  # px: a smaller change (a scroll bar coming or going) is not reported; it would only redraw the page

STYLE = f"<style>.st-key-{KEY} {{display: none;}}</style>"  # the probe takes no room on the page

_PROBE = st.components.v2.component(
    "llama_explorer_screen", js=Path(__file__).with_suffix(".js").read_text(encoding="utf-8"))


def _take_report() -> None:
    state = st.session_state.get(KEY) or {}
    screen = from_report(state.get("screen") if hasattr(state, "get") else None)
    if screen is not None:
        st.session_state[STATE_KEY] = screen


def probe() -> None:
    """Mount the probe; it reports a screen unlike current() and reruns the page with it."""
    st.html(STYLE)
    now = current()
    _PROBE(key=KEY, data={"main": now.main, "window": now.window, "touch": now.touch,
                          "step": WIDTH_STEP, "slack": SLACK, "stack": STACK_BELOW, "cookie": COOKIE},
           on_screen_change=_take_report, height=0)
