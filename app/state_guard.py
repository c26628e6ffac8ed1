"""The page's entry check of every value a visitor's browser or link can set: a widget's value arrives over the
websocket as whatever the browser sends (NaN, infinity, 10^30, text where a number belongs), a query parameter as
any text. Checked before any widget exists, a value the page cannot use is dropped, so its widget starts from its
default; the page says so in one line. A value Streamlit itself cannot convert is dropped before that
(guard_widget_values).
"""
from __future__ import annotations

import math
from numbers import Number

import streamlit as st

from explorer_model import view_choices as VC

CHOICES = {"lang": ("en", "zh")}  # plus "view" (the views' keys) and "cmp" (compare.MODES), given by main
FLAGS = ("presenter", "bos", "cmp_full")
TEXTS = ("prompt", "cmp_prompt", "cmp_model", "cmp_iv", "cmp_align", "whatif", "whatif_source", "model_input",
         "whatif_specs", "whatif_source_text", "_w_cmp_prompt", "_w_cmp_iv", "_w_cmp_align")
INTEGERS = ("layer", "head", "token", "max_tokens", "pred_seed", "pred_top_k", "pred_continue_n", "big_sweep_first",
            "whatif_sweep_layers", "lens_positions", "lab_race_steps")
LARGEST = 2 ** 53  # beyond this a float has no integers left, and no widget of the page goes near it


def usable_number(value) -> bool:
    """A real, finite number of sensible size (True/False are flags, not numbers)."""
    if isinstance(value, bool) or not isinstance(value, Number):
        return False
    try:
        return math.isfinite(float(value)) and abs(float(value)) <= LARGEST
    except (TypeError, ValueError, OverflowError):
        return False


def as_index(value) -> int | None:
    """A layer/head/token/count as sent: an int, a whole float, or digits (a link's text); else None."""
    if isinstance(value, str):
        value = value.strip()
        return int(value) if value.lstrip("-").isdigit() and len(value) < 16 else None
    return int(value) if usable_number(value) and float(value) == int(value) else None


def check_state(choices: dict[str, tuple]) -> list[str]:
    """Drop (or correct) every value of st.session_state the page cannot use; the keys dropped."""
    ss, dropped = st.session_state, []
    allowed = {**CHOICES, **choices}
    for key in list(ss.keys()):
        value = ss[key]
        bad = False
        if key in allowed:
            bad = value not in allowed[key]
        elif key in FLAGS:
            bad = not isinstance(value, bool)
        elif key in TEXTS:
            bad = value is not None and not isinstance(value, str)
        elif key in INTEGERS:
            index = as_index(value)
            bad = index is None or (key == "max_tokens" and index < 1)
            if not bad and index != value:
                ss[key] = index  # a link's "3" is the integer 3
        elif isinstance(value, float) or isinstance(value, int) and not isinstance(value, bool):
            bad = not usable_number(value)  # any other number widget: NaN, infinity, 10^30
        if bad:
            dropped.append(key)
            del ss[key]
    if "lang" not in ss:
        ss["lang"] = "en"
    return dropped


KEPT_ON_RESET = ("lang", "prompt", "ids", "ids_text", "active_model", "model_pick", "_url_read", "_screen")


def reset_widgets() -> None:
    """After a page run failed on a value no check foresaw: every setting back to its default but the prompt,
    the model and the language, so the visitor's next click draws a page again."""
    for key in list(st.session_state.keys()):
        if key not in KEPT_ON_RESET:
            del st.session_state[key]


RUN_OPEN = "_run_open"  # True from the start of a page run to its last line
# The widgets whose value the page sets from session state (a link, a lecture step, a preset, the room's step)
SET_BY_THE_PAGE = ("prompt", "lang", "presenter", "bos", "max_tokens", "view", "layer", "head", "token",
                   *VC.CHOICES)


def run_starts() -> None:
    """At the top of every page run. Streamlit tells the browser a widget's value set from session state only in
    the run that set it; when that run is cut short (the browser asked for another run before it ended: the screen
    probe's first report, the room's push to a follower, st.rerun), the browser may never hear it, shows the
    widget's default and sends that back with its next click: a link's prompt came back empty on a phone. So
    after a run that did not reach its end, every value the page sets is set again, and this run sends it."""
    ss = st.session_state
    if ss.get(RUN_OPEN):
        for key in SET_BY_THE_PAGE:
            if key in ss:
                ss[key] = ss[key]
    ss[RUN_OPEN] = True


def run_ends() -> None:
    """The page run reached its last line."""
    st.session_state[RUN_OPEN] = False


def guard_widget_values() -> None:
    """A widget's value arrives from the browser as a protobuf field, and Streamlit converts it with the widget's
    own rule before any line of the page runs (WStates.__getitem__ -> the widget's deserializer): a NaN for an
    integer input, an index past a radio's options or a field of the wrong type raises there, inside Streamlit.
    Such a value is treated as never sent, so the widget keeps its default; the page's own check (check_state)
    then sees only values a widget produced. Installed once per process."""
    from streamlit.runtime.state import session_state

    states = session_state.WStates
    if getattr(states.__getitem__, "_guarded", False):
        return
    plain_getitem = states.__getitem__

    def getitem(self, k):
        try:
            return plain_getitem(self, k)
        except KeyError:
            raise
        except (ValueError, TypeError, IndexError, OverflowError, AttributeError):
            raise KeyError(k) from None  # (left in place: Streamlit may be iterating over the states)
    getitem._guarded = True
    states.__getitem__ = getitem


guard_widget_values()
