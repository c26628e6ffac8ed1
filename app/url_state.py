"""The link is the state: what a copied link must reopen is read from the URL's query parameters once per session and
written back after every page run.

The link holds the model, the prompt (or its token ids), the language, presenter mode, BOS, the token limit, the
view and its section, the layer, head and token, the What-if interventions, the comparison and its B, the lesson
whose sentence is on screen, and the view's own choices that differ from their defaults (app/choice_state.py).
Every value is checked as it is read: one the page cannot use falls back to its default, and the page says so in
one line. (Streamlit's own widget binding keys options by their displayed label, which changes with the language.)
"""
from __future__ import annotations

import streamlit as st

from app import choice_state, compare, gateway, lecture_player, sections
from app import sidebar as side
from app.panels import VIEWS
from app.presets import BY_KEY, opened

URL_KEYS = ("lang", "view", "layer", "head", "token", "prompt", "whatif", "whatif_source") + compare.URL_KEYS
URL_FLAGS = ("presenter", "bos", "cmp_full")  # written as 1 when on, left out when off


def read_once() -> list[str]:
    """Once per session, before any widget exists: the link's state into st.session_state; the names of the
    link's values the page could not use (they start from their defaults)."""
    ss, q = st.session_state, st.query_params
    if ss.get("_url_read"):
        return []
    ss._url_read = True
    for key in URL_KEYS:
        if key in q:
            ss[key] = q[key]
    for key in URL_FLAGS:
        ss[key] = q.get(key) == "1"
    if "ids" in q:
        ss["_url_ids"] = q["ids"]
    if "max_tokens" in q:
        ss["max_tokens"] = q["max_tokens"]  # checked by state_guard, kept within the server's cap by the sidebar
    ss["_token_auto"] = "token" not in q
    fell_back = []  # a link's language or view the page has not: its default, and the page says so
    if ss.get("lang") not in ("en", "zh"):
        fell_back += ["lang"] * ("lang" in q)
        ss.lang = "en"
    if ss.get("view") not in [v[0] for v in VIEWS]:
        fell_back += ["view"] * ("view" in q)
        ss.view = VIEWS[0][0]
    bad = fell_back + choice_state.from_link(q) + _lesson(q)
    if "section" in q:
        if sections.valid(ss.view, q["section"]):
            sections.request(ss.view, q["section"])
        else:
            bad.append("section")
    elif "cmp" in q and not ss.get("_landing"):
        sections.request(ss.view, None)  # a comparison's link lands on its figures (sections.landing), not the top
    return bad


def _lesson(q) -> list[str]:
    """The link's lesson: its sentence shows while the prompt is the preset's. A link that names a lesson and no
    prompt opens the preset itself; one without a layer lets the lesson choose where to look."""
    ss, key = st.session_state, q.get("lesson")
    if key is None:
        return []
    if key not in BY_KEY:
        return ["lesson"]
    state = opened(key)
    if "prompt" in q or "ids" in q:  # the link's own prompt (and B); the lesson applies while they are the preset's
        state = {k: v for k, v in state.items() if k in ("lesson", "_lesson_pending")}
    else:
        state = {k: v for k, v in state.items() if k == "lesson" or k not in q}  # what the link gives stays
        if "model" in q:
            state.pop("active_model", None)
            state.pop("model_pick", None)
        if "section" not in q:
            sections.request(BY_KEY[key].view if "view" not in q else ss.get("view"), BY_KEY[key].section)
    state["_lesson_pending"] = "layer" not in q
    ss.update(state)
    return []


def write(ids_param: str, view: str) -> dict:
    """After the view drew (its choices are known): the URL set to the page's state, plus a shipped lecture's name
    and step. Returns the state without the lecture, for "add this view as a step"."""
    ss = st.session_state
    wanted = {k: str(ss[k]) for k in URL_KEYS if ss.get(k) not in (None, "")}
    wanted.update({k: "1" for k in URL_FLAGS if ss.get(k)})
    if ids_param:
        wanted["ids"] = ids_param
    wanted["model"] = ss.get("active_model", gateway.default_source())
    if ss.get("max_tokens") and int(ss["max_tokens"]) != side.default_max_tokens():
        wanted["max_tokens"] = str(int(ss["max_tokens"]))
    if ss.get("lesson") in BY_KEY:
        wanted["lesson"] = ss["lesson"]
    section = sections.current(view)
    if section:
        wanted["section"] = section
    wanted.update(choice_state.link_params())
    state = dict(wanted)
    wanted.update(lecture_player.url_params())  # a shipped lecture's name and step
    if dict(st.query_params) != wanted:
        st.query_params.from_dict(wanted)
    return state
