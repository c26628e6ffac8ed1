"""A view's own choices in the session (the table is explorer_model/view_choices.py): the value each widget starts
from, kept inside what the view offers this run, and which of them the page's link holds.

A view calls `start(key, …)` just before it creates the widget of `key` (or draws what a flag unfolds): the value
in st.session_state[key] (from the link, a lecture step or the widget itself) is kept when the view offers it,
moved inside a range the model or prompt narrows, or replaced by the default; the widget is then created without a
value of its own. `start` also notes the choice as drawn in this page run, with the default the view used:
app/url_state.py writes exactly the drawn choices whose value is not their default, so a link holds what is on
screen and nothing a hidden widget left behind.
"""
from __future__ import annotations

import streamlit as st

from explorer_model import view_choices as VC

DRAWN = "_choices_drawn"  # {key: default} of the choices drawn in this page run
KEPT = "_choices_kept"  # {key: value} of the choices kept while their view is not shown (start(keep=True))


def new_run() -> None:
    """At the start of every page run: nothing drawn yet."""
    st.session_state[DRAWN] = {}


def start(key: str, default=None, lo=None, hi=None, offered=None, keep: bool = False):
    """The value `key`'s widget starts from, set in st.session_state before the widget exists; returns it.
    default: the view's own (None: the table's); lo/hi: a numeric range narrowed to this model or prompt;
    offered: the options of a widget whose options depend on the model (a select slider's); keep: the value
    outlives its widget while another view is shown (Streamlit forgets a widget's value then)."""
    spec = VC.CHOICES[key]
    ss = st.session_state
    default = spec.default if default is None else default
    if keep and key not in ss and key in (ss.get(KEPT) or {}):
        ss[key] = ss[KEPT][key]
    value = ss.get(key)
    if value is not None and VC.check(key, value):
        value = VC.native(key, value)
        if spec.kind in ("int", "float") and (lo is not None or hi is not None):
            value = min(max(value, spec.lo if lo is None else lo), spec.hi if hi is None else hi)
        elif spec.kind == "ints" and hi is not None:
            value = [v for v in value if v <= hi]
        elif spec.kind == "pair" and hi is not None and value[1] > hi:
            value = None
        if offered is not None and value not in offered:
            value = None
    else:
        value = None
    value = default if value is None else value
    if ss.get(key) != value or type(ss.get(key)) is not type(value):
        ss[key] = value
    ss.setdefault(DRAWN, {})[key] = default
    if keep:
        ss.setdefault(KEPT, {})[key] = value
    return value


def drawn() -> dict:
    """{key: default} of the choices drawn so far in this page run."""
    return dict(st.session_state.get(DRAWN) or {})


def link_params() -> dict[str, str]:
    """The drawn choices whose value is not the view's default, as the link's query parameters."""
    ss, out = st.session_state, {}
    for key, default in drawn().items():
        value = ss.get(key)
        if value is not None and VC.check(key, value) and VC.native(key, value) != default:
            out[key] = VC.to_text(key, value)
    return out


def step_choices(params: dict) -> dict:
    """The choices of a link's parameters as a lecture step holds them (native values)."""
    out = {}
    for key, text in params.items():
        if key in VC.CHOICES:
            value = VC.from_text(key, text)
            if value is not None:
                out[key] = list(value) if isinstance(value, tuple) else value
    return out


def from_link(params) -> list[str]:
    """Before any widget: each choice of the link set in st.session_state; the keys whose value no view offers
    (dropped, so their widgets start from their defaults)."""
    bad = []
    for key in VC.CHOICES:
        if key in params:
            value = VC.from_text(key, params[key])
            if value is None:
                bad.append(key)
            else:
                st.session_state[key] = value
    return bad


def reset_all(keep: dict | None = None) -> None:
    """Every view's choice back to its default but those in `keep` (a lecture step's): the step shows what its
    file says, whatever the step before it had chosen."""
    ss = st.session_state
    for key in VC.CHOICES:
        ss.pop(key, None)
    ss.pop(KEPT, None)
    ss.update({k: VC.native(k, v) for k, v in (keep or {}).items() if VC.check(k, v)})
