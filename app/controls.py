"""Where the lecturer's controls stand. The presets and the shared selection (layer, head, token) sit in the sidebar;
in presenter mode the sidebar is folded away on the projector, so they stand in one row beside the page's title,
in the main area, where they take no screen height of their own (under the title when the main column is too narrow
for both, as with the sidebar open on a projector). On a shared server the room's address (app/share.py)
closes the row.
"""
from __future__ import annotations

from dataclasses import dataclass

import streamlit as st

from app import screen
from app.context import plain
from app.facts import ModelFacts
from app.i18n import t


def tr(key: str, **values) -> str:
    return t(key, st.session_state.get("lang", "en"), **values)


@dataclass
class Places:
    """The containers the controls are drawn in."""
    preset: object
    layer: object
    head: object
    token: object
    share: object | None  # the room's address (a shared server only)


# The main column's width (px) from which presenter mode's title stands beside its controls: its column holds "LLaMA
# Explorer" in presenter mode's heading at 1280×720 with the sidebar folded (1120 px). With the sidebar open (a
# teacher opening a lecture, 820 px) the title, kept on one line, ran under the preset box.
TITLE_BESIDE_PX = 1000


def top_row(presenter: bool, shared: bool) -> Places:
    """The page's title and, in presenter mode, the controls beside it; the places of every control."""
    sb = st.sidebar
    if presenter:
        if screen.current().main < TITLE_BESIDE_PX:  # the title over the row: beside it, it would not fit
            st.title(tr("app.title"))
            cols = st.columns([2.6, 1.5, 1.5, 1.5] + ([1.8] if shared else []), vertical_alignment="bottom")
            return Places(*cols[:4], cols[4] if shared else None)
        cols = st.columns([3.4, 2.6, 1.5, 1.5, 1.5] + ([1.8] if shared else []), vertical_alignment="bottom")
        cols[0].title(tr("app.title"))
        return Places(cols[1], cols[2], cols[3], cols[4], cols[5] if shared else None)
    if shared:
        title, share = st.columns([5, 1], vertical_alignment="bottom")
        title.title(tr("app.title"))
        return Places(sb, sb, sb, sb, share)
    st.title(tr("app.title"))
    return Places(sb, sb, sb, sb, None)


def selection(facts: ModelFacts, ids: list[int], pieces: list[str], places: Places) -> tuple[int, int, int]:
    """The layer, head and token every view shows, kept inside this model and prompt."""
    cfg, sb = facts.cfg, st.sidebar
    if st.session_state.get("_token_auto", True):  # the token whose prediction is shown, until the visitor moves it
        st.session_state.token = len(ids) - 1
    for key, hi in (("layer", cfg.n_layers - 1), ("head", cfg.n_heads - 1), ("token", len(ids) - 1)):
        _clamp(key, hi)
    if places.layer is sb:
        sb.divider()
    places.layer.slider(tr("sidebar.layer"), 0, max(cfg.n_layers - 1, 1), key="layer", disabled=cfg.n_layers == 1)
    places.head.slider(tr("sidebar.head"), 0, max(cfg.n_heads - 1, 1), key="head", disabled=cfg.n_heads == 1,
                       help=tr("sidebar.head_help", n_rep=cfg.n_rep))
    places.token.slider(tr("sidebar.token"), 0, max(len(ids) - 1, 1), key="token", disabled=len(ids) == 1,
                        on_change=lambda: st.session_state.update(_token_auto=False))
    layer = min(int(st.session_state.layer), cfg.n_layers - 1)
    head = min(int(st.session_state.head), cfg.n_heads - 1)
    token = min(int(st.session_state.token), len(ids) - 1)
    sb.caption(tr("sidebar.token_caption", token=token, piece=plain(pieces[token]), id=ids[token], head=head,
                  kv=head // cfg.n_rep))
    return layer, head, token


def _clamp(key: str, hi: int) -> None:
    """A link made for a bigger model or a longer prompt must not break the sliders."""
    try:
        v = int(st.session_state.get(key))
    except (TypeError, ValueError):
        v = 0
    st.session_state[key] = min(max(v, 0), hi)
