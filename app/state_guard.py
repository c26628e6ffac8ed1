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
# Every widget whose value the page sets from session state (a link, a lecture step, a preset, the room's step, a
# callback clearing a choice): the link's keys, the model box, the comparison's boxes, What-if's text boxes, the
# pickers a callback resets to empty, and each view's own choices. Buttons are not among them (Streamlit refuses
# a value set for a button), nor the lecture editor's form boxes (a form sends its values only when saved).
SET_BY_THE_PAGE = ("prompt", "lang", "presenter", "bos", "max_tokens", "view", "layer", "head", "token",
                   "model_pick", "model_input", "cmp_full", "_w_cmp", "_w_cmp_prompt", "_w_cmp_model", "_w_cmp_iv",
                   "_w_cmp_align", "whatif_specs", "whatif_source_text", "preset", "lecture_shipped", *VC.CHOICES)


def run_starts() -> None:
    """At the top of every page run. Streamlit tells the browser a widget's value set from session state only in
    the run that set it, and the browser takes it only if it draws that run's widget. When the next run overtakes
    it first (the screen probe's first report arrives while the link's first run is drawn, the room's push to a
    follower, st.rerun), the browser never hears the value, shows the widget's default and sends that back with
    its next click: a link's prompt came back empty on a phone. So every value the page sets is set again, and
    this run sends it, when the browser has not yet reported the widget (its request carries the other widgets'
    values but not this one's), and after a run that did not reach its end."""
    ss = st.session_state
    reported = _reported_widgets()
    for key in SET_BY_THE_PAGE:
        if key in ss and (ss.get(RUN_OPEN) or reported is not None and key not in reported):
            ss[key] = ss[key]
    ss[RUN_OPEN] = True


def _reported_widgets() -> set[str] | None:
    """The keys (of SET_BY_THE_PAGE) whose widget values came with this run's request from the browser; None when
    the request carried none (a run the server started, or the page's first). Streamlit keeps the browser's
    values by widget id until the page's widgets are drawn again."""
    from streamlit.runtime.state.session_state_proxy import get_session_state

    state = get_session_state()._state
    sent = state._new_widget_state.states
    if not sent:
        return None
    return {key for key in SET_BY_THE_PAGE if state._key_id_mapper.get_id_from_key(key) in sent}


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
