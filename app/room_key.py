"""The presenter's key kept in the projector's browser tab, so that the projector's page, reloaded, presents again.

The presenter's link carries the server's key once: app/room_follow.py checks it and app/url_state.py leaves it out
of the address bar, where it would reach the browser's history and every link copied from the page; a reload then
opens the page without it. So the page hands the key to this component, which keeps it in the tab's
sessionStorage (this server's origin, this tab alone, while the tab lives) and gives it back to the server when the
tab's page opens again without presenting: after a reload, or after the server restarted (a new session, and a new
key, which the kept one no longer matches: the page says so).

sessionStorage, not a cookie: a cookie goes with every page of the browser, so a second tab the teacher opens to see
what the students see would present too, and write the room whenever it moved. The key is compared on the server
(room_follow.is_presenter): a key a page claims to have kept is a guess like any other.
"""
from __future__ import annotations

from pathlib import Path

import streamlit as st

KEY = "room_key_keep"
CHECKED = "_room_key_checked"  # the kept key the server has compared, so the tab does not give it again
STYLE = f"<style>.st-key-{KEY} {{display: none;}}</style>"

_KEEPER = st.components.v2.component(
    "llama_explorer_room_key", js=Path(__file__).with_suffix(".js").read_text(encoding="utf-8"))


def exchange(keep: str | None) -> str | None:
    """Mount the keeper, before anything asks whether the page presents: `keep` (the key, on the presenter's page)
    is stored in the tab; returns the key the tab kept and gave back, once, or None."""
    ss = st.session_state
    st.html(STYLE)
    _KEEPER(key=KEY, data={"keep": keep, "checked": ss.get(CHECKED)}, on_kept_change=lambda: None, height=0)
    state = ss.get(KEY) or {}
    kept = state.get("kept") if hasattr(state, "get") else None
    if not isinstance(kept, str) or not kept or kept == ss.get(CHECKED):
        return None
    ss[CHECKED] = kept
    return kept
