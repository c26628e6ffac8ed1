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
    for key, value in ss.to_dict().items():  # one pass over Streamlit's state (each read of ss[key] is another)
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


PAGE_SET = "_page_set"  # {key: (the value the page set, the browser's report of its widget when it set it)}


def run_starts() -> None:
    """At the top of every page run. Streamlit tells the browser a widget's value set from session state only in
    the run that set it, and the browser takes it only if it draws that run's widget. When the next run overtakes
    it first (the screen probe's first report arrives while the link's first run is drawn, the room's push to a
    follower, a page reconnecting to a restarted server), the browser never hears the value, keeps showing what it
    showed and sends that back: a link's prompt came back empty on a phone, a follower's view fell back a step.
    So the page's value is set again, and this run sends it,
    - when the browser's request has no value for the widget (it has not drawn it yet),
    - when it sends the very value it sent before the page set it (it never took the page's; a visitor who
      moved the widget sends another),
    - after a run that did not reach its end."""
    ss = st.session_state
    sent = _sent_by_the_browser()
    cut_short = ss.get(RUN_OPEN)
    pending = ss.get(PAGE_SET) or {}
    state = _session_state()
    set_by_callbacks = set(state._new_session_state)  # a button's callback (the lecture's Next) sets values too
    reported = {key: had for key, (_, had) in pending.items() if sent is not None and sent.get(key) is not None}
    # the browser took none of the page's values (had it drawn the run, those it did not touch would have changed):
    # a value equal to the old one is stale, not a visitor's move back to it
    took_none = all(sent[key] == had for key, had in reported.items())
    ss["_sent_at_start"] = sent
    ss["_browser_at_start"] = _browser_values(state)
    if sent is not None:
        ss[PAGE_SET] = {}  # answered: the browser's next report tells again
    ss[RUN_OPEN] = True  # from here on, every value the page sets is noted (the ones below too)
    for key in set_by_callbacks.intersection(SET_BY_THE_PAGE):  # set before this run began
        _note_page_value(state, key, ss[key])
    values = ss.to_dict()  # one pass over Streamlit's state, not a lookup per key
    for key in SET_BY_THE_PAGE:
        if key not in values:
            continue
        missed = took_none and key in reported and key not in set_by_callbacks
        if missed and values[key] != pending[key][0]:
            ss[key] = pending[key][0]
        elif cut_short or sent is not None and key not in sent:
            ss[key] = values[key]


def _note_page_value(state, key: str, value) -> None:
    """The page set widget `key` to `value` during its run (a link, a lecture step, the room, a lesson's target):
    kept with what the browser had sent, for the next run's check, as it is set, so that a run overtaken before
    its end has noted every value it set. A value equal to what the browser shows is not noted (the sliders'
    clamp sets theirs every run), and it takes back a value noted earlier in the run: a lecture's Next sets the
    layer to 0 and the step's lesson sets it back to the 13 the browser shows; left noted, the 0 counted as a
    value the browser had missed, and the page's next run (any click, a file picked) put the layer at 0."""
    if not _get(state, RUN_OPEN):
        return
    browser = _get(state, "_browser_at_start") or {}
    pending = dict(_get(state, PAGE_SET) or {})
    if key in browser and browser[key] == value:
        if key in pending:
            del pending[key]
            state[PAGE_SET] = pending
        return
    sent = _get(state, "_sent_at_start") or {}
    pending[key] = (value, sent.get(key))
    state[PAGE_SET] = pending


def _get(state, key):
    try:
        return state[key]
    except KeyError:
        return None


def _session_state():
    from streamlit.runtime.state.session_state_proxy import get_session_state

    return get_session_state()._state


def _browser_values(state) -> dict:
    """The values of SET_BY_THE_PAGE's widgets as the browser sent them this run, where Streamlit can read them
    (it knows the widget from a page run before this one, for this visitor)."""
    values = {}
    for key in SET_BY_THE_PAGE:
        widget_id = state._key_id_mapper.get_id_from_key(key)
        if widget_id is None or widget_id not in state._new_widget_state.states:
            continue
        try:
            values[key] = state._new_widget_state[widget_id]
        except KeyError:
            pass
    return values


def run_ends() -> None:
    """The page run reached its last line."""
    st.session_state[RUN_OPEN] = False


def _sent_by_the_browser() -> dict[str, bytes] | None:
    """The widget values (of SET_BY_THE_PAGE) the browser sent with this run's request, as it sent them (bytes of
    its message, comparable across runs and sessions); None when the request carried none (a run the server
    started, or the page's first)."""
    raw = _SENT.pop(id(_session_state()), None)
    if not raw:
        return None
    by_key = {}
    for widget_id, data in raw.items():
        key = widget_id.rsplit("-", 1)[-1] if "-" in widget_id else widget_id
        if key in SET_BY_THE_PAGE:
            by_key[key] = data
    return by_key


# {id of a session's state: its request's widget values}, taken by the run the request starts (Streamlit's
# session state has slots: nothing can be kept on it)
_SENT: dict[int, dict | None] = {}


def keep_what_the_browser_sent() -> None:
    """Each request's widget values as the browser sent them, kept on the session's state before Streamlit reads
    them (it turns them into values, and forgets those of widgets it does not know yet). Installed once per
    process."""
    from streamlit.runtime.state import session_state

    cls = session_state.SessionState
    if getattr(cls.on_script_will_rerun, "_keeps", False):
        return
    plain = cls.on_script_will_rerun

    def on_script_will_rerun(self, fresh_widget_states, *args, **kwargs):
        _SENT[id(self)] = None if fresh_widget_states is None else {
            w.id: w.SerializeToString(deterministic=True) for w in fresh_widget_states.widgets}
        return plain(self, fresh_widget_states, *args, **kwargs)
    on_script_will_rerun._keeps = True
    cls.on_script_will_rerun = on_script_will_rerun


def note_what_the_page_sets() -> None:
    """Every value the page sets for a widget of SET_BY_THE_PAGE is noted as it is set (see _note_page_value).
    Installed once per process."""
    from streamlit.runtime.state import session_state

    cls = session_state.SessionState
    if getattr(cls.__setitem__, "_notes", False):
        return
    plain = cls.__setitem__

    def setitem(self, user_key, value):
        plain(self, user_key, value)
        if user_key in SET_BY_THE_PAGE:
            _note_page_value(self, user_key, value)
    setitem._notes = True
    cls.__setitem__ = setitem


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
keep_what_the_browser_sent()
note_what_the_page_sets()
