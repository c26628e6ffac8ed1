"""CSS for the whole page that belongs to no view.

A lecture's player (app/lecture_player.py: step i / N, the step's title and caption) stays at the top of the main
area while the page scrolls, on any screen at least 560 px high: a step that lands on a part further down its view
(app/sections.py) would otherwise scroll the step's title and caption off the screen, and the class (or a student
following on a phone) would see a figure without the words that say what to look at (two steps on one view would
look the same). On a phone the player keeps to about a fifth of the screen (its own CSS: app/lecture_player.py).

Streamlit's own words that would show in English on a Chinese page are hidden where the page says the same in its
language: "Press Ctrl+Enter to apply" under the prompt box.

A display formula wider than its column (on a phone: attention's scores and mask, the residual stream's update)
scrolls sideways inside its own box, and nothing on the page said so: the formula simply ended at the screen's edge.
Each edge it continues past now shows a soft shadow, which goes when the formula is scrolled to that end (two
backgrounds that scroll with the formula cover two that stay with the box; a formula that fits covers both).

A table's toolbar (show columns, download, search, full screen) stands above its top edge; a mouse shows it on
hover, a touch screen always, where it lay over the control above the table (RoPE's key-token box: its + and −
could not be tapped). On a touch screen a table leaves the toolbar's height free above it.

The lecture file picker's line "1MB per file • TOML" is hidden: Streamlit can state a limit in whole megabytes only,
and a lecture file may have 256 KB; the picker's own label says so, in the page's language (app/lecture_editor.py).
"""
from __future__ import annotations

import streamlit as st

PAGE = "#ffffff"  # the page's background (serve runs Streamlit's light theme)
FORMULA_EDGES = (
    "[data-testid='stMain'] .katex-display {"
    f"background: linear-gradient(to right, {PAGE} 30%, rgba(255,255,255,0)) left center / 2.5rem 100% no-repeat local,"
    f" linear-gradient(to left, {PAGE} 30%, rgba(255,255,255,0)) right center / 2.5rem 100% no-repeat local,"
    " radial-gradient(farthest-side at 0 50%, rgba(0,0,0,0.25), rgba(0,0,0,0))"
    " left center / 0.9rem 100% no-repeat scroll,"
    " radial-gradient(farthest-side at 100% 50%, rgba(0,0,0,0.25), rgba(0,0,0,0))"
    " right center / 0.9rem 100% no-repeat scroll;}")

TOOLBAR_ROOM = "@media (hover: none) {[data-testid='stMain'] [data-testid='stDataFrame'] {margin-top: 2.75rem;}}"
UPLOAD_LIMIT = ".st-key-lecture_upload [data-testid='stFileUploaderDropzoneInstructions'] {display: none;}"
# Streamlit's "Press Ctrl+Enter to apply" under the prompt box is English on every page; the box's own label says it
# in the page's language, with a phone's way too ("Prompt (Ctrl+Enter, or a tap outside the box, runs it)")
PROMPT_HINT = ".st-key-prompt [data-testid='InputInstructions'] {display: none;}"

# Streamlit's header is 3.75rem high and lies over the main area's top (see-through: made opaque while the player
# is pinned, or what scrolls past the player would show above it); the player's block (the layout wrapper around
# its keyed container, found by :has) sticks just under it, opaque, with a shadow over what scrolls beneath.
PINNED_MIN = "(min-height: 560px)"
BUTTONS = ".st-key-lecture_bar [data-testid='stHorizontalBlock']:has(.st-key-lecture_prev)"
ROOM_ROW = ".st-key-lecture_bar [data-testid='stHorizontalBlock']:has(.st-key-room_detach)"
LECTURE_BAR = (
    f"@media {PINNED_MIN} {{"
    "[data-testid='stMain'] [data-testid='stLayoutWrapper']:has(> .st-key-lecture_bar) {"
    f"position: sticky; top: 3.75rem; z-index: 99; background: {PAGE};"
    # a shadow under it, and page colour a little past its sides (a slider's knob may reach past the column)
    f" box-shadow: 0 0.6rem 0.6rem -0.6rem rgba(0,0,0,0.25), 0 0 0 0.5rem {PAGE};}}"
    f"[data-testid='stHeader'] {{background: {PAGE};}}}}"
    ".st-key-lecture_bar h3 {padding: 0;}"
    # beside the step's title, Previous and Next keep their words whole (with the sidebar open on a projector their
    # columns' shares left "← Pre…"), and the title's column gives up the room, in one row
    f"@media (min-width: 641px) {{{BUTTONS} {{flex-wrap: nowrap;}}"
    f"{BUTTONS} > [data-testid='stColumn']:is(:first-child, :last-child) {{min-width: max-content;}}"
    f"{BUTTONS} > [data-testid='stColumn']:nth-child(2) {{min-width: 0;}}}}"
    # on a phone, where Streamlit stacks columns, Previous and Next share the first row and the counter and title
    # follow (stacked in page order, Next came between the title and the caption); a room's line and its button
    # share a row
    "@media (max-width: 640px) {"
    f"{BUTTONS} {{flex-flow: row wrap;}}"
    f"{BUTTONS} > [data-testid='stColumn'] {{min-width: 0; flex: 1 1 40%;}}"
    f"{BUTTONS} > [data-testid='stColumn']:nth-child(2) {{order: 1; flex-basis: 100%;}}"
    f"{ROOM_ROW} {{flex-flow: row nowrap;}} {ROOM_ROW} > [data-testid='stColumn'] {{min-width: 0; flex: 1 1 0;}}"
    f"{ROOM_ROW} > [data-testid='stColumn']:last-child {{flex: 0 0 auto; width: auto;}}"
    ".st-key-lecture_caption {max-height: 5.4em; overflow-y: auto;}}")


def apply() -> None:
    """The page's style; the player's only while a lecture is open. A `:has()` selector makes the browser check
    changes to the page against it: a `body:has(…)` rule cost 18% more of Chromium's CPU over the walk through the
    views on a phone and a projector (tests/test_browser_layout.py), so the player's rules look only at its own block
    and its parent, where the walks through a lecture measure no cost."""
    player = LECTURE_BAR if st.session_state.get("lecture") else ""
    st.html(f"<style>{FORMULA_EDGES}{TOOLBAR_ROOM}{UPLOAD_LIMIT}{PROMPT_HINT}{player}</style>")
