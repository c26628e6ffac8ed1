"""A visitor's browser can send any value for any widget over its websocket, and any query parameter in a link:
NaN or infinite numbers, numbers too big for anything, text where a number belongs, numbers where a choice
belongs. The page must check them at its entry, fall back to a default and draw a sensible page: never a
traceback, never an error naming the app's code."""
from __future__ import annotations

import math

import pytest
from apptest_util import all_text, run_app

PROMPT = "The cat sat on the mat"
KINDS = ("radio", "number_input", "slider", "toggle", "text_area", "selectbox", "button_group", "text_input",
         "select_slider")


def send(at, key: str, **field):
    """Rerun with widget `key`'s value replaced by a raw WidgetState field, as a crafted websocket message carries
    it (any oneof field, any value: double_value=nan, int_value=7, string_value="x", double_array_value=[inf])."""
    from streamlit.proto.WidgetStates_pb2 import WidgetState

    widget = next(w for kind in KINDS for w in at.get(kind) if getattr(w, "key", None) == key)
    ws = WidgetState()
    ws.id = widget.id
    for name, value in field.items():
        if name.endswith("array_value"):
            getattr(ws, name).data.extend(value)
        else:
            setattr(ws, name, value)
    widget.__class__ = type("Crafted", (type(widget),), {"_widget_state": property(lambda self: ws)})
    return at.run()


def page_is_sane(at, what) -> None:
    assert not at.exception, f"{what}: {at.exception}"
    text = all_text(at)
    assert "Traceback" not in text and "main.py" not in text and "sidebar.py" not in text, what
    assert at.title and at.title[0].value in ("LLaMA Explorer", "LLaMA 探索器"), what  # the page, not an error
    assert at.session_state["lang"] in ("en", "zh")


SENT = [("lang", dict(int_value=7)), ("lang", dict(string_value="fr")), ("lang", dict(double_value=math.nan)),
        ("view", dict(string_array_value=["nope"])), ("view", dict(int_array_value=[99])),
        ("view", dict(double_value=math.nan)),
        ("max_tokens", dict(double_value=math.nan)), ("max_tokens", dict(double_value=math.inf)),
        ("max_tokens", dict(double_value=1e30)), ("max_tokens", dict(string_value="many")),
        ("layer", dict(double_array_value=[math.nan])), ("layer", dict(double_array_value=[1e30])),
        ("layer", dict(string_value="x")), ("token", dict(double_array_value=[math.inf])),
        ("head", dict(double_array_value=[])), ("presenter", dict(string_value="yes")),
        ("prompt", dict(int_value=12345)), ("prompt", dict(double_value=math.nan))]
GENERATION = [("pred_seed", dict(double_value=math.nan)), ("pred_seed", dict(string_value="x")),
              ("pred_seed", dict(double_value=1e30)), ("pred_top_k", dict(double_value=math.inf)),
              ("pred_temperature", dict(double_array_value=[math.nan])), ("pred_top_p", dict(string_value="high")),
              ("pred_continue_n", dict(double_value=math.nan))]


@pytest.mark.parametrize("key, field", SENT, ids=[f"{k}-{v}" for k, v in SENT])
def test_a_crafted_widget_message_falls_back_without_a_traceback(key, field):
    at = run_app(view="tokens", prompt=PROMPT, model="tiny-pre")
    page_is_sane(send(at, key, **field), (key, field))


@pytest.mark.parametrize("key, field", GENERATION, ids=[f"{k}-{v}" for k, v in GENERATION])
def test_crafted_sampling_values_in_the_generation_view(key, field):
    at = run_app(view="predict", prompt=PROMPT, model="tiny-pre")
    at = send(at, key, **field)
    page_is_sane(at, (key, field))
    assert not [e.value for e in at.error], [e.value for e in at.error]



def test_a_run_cut_short_has_the_next_run_send_the_values_the_page_set():
    """Streamlit tells the browser a value set from session state only in the run that set it; when that run is cut
    short the browser may never hear it and sends the widget's default back (a link's prompt came back empty on a
    phone when the screen probe's first report cut the link's first run short). The run after one that did not
    reach its end sends the page's values again."""
    at = run_app(prompt=PROMPT, view="attention", layer=2, lang="zh", model="tiny-pre")
    assert not at.exception and at.session_state["_run_open"] is False  # a whole run reached its end
    boxes = lambda: {"prompt": at.text_area(key="prompt"), "layer": at.slider(key="layer"),  # noqa: E731
                     "lang": at.radio(key="lang"), "model_pick": at.selectbox(key="model_pick")}
    at.run()  # an ordinary rerun: the browser already shows these values, none is sent again
    assert {k: w.proto.set_value for k, w in boxes().items() if k != "layer"} == dict.fromkeys(
        ("prompt", "lang", "model_pick"), False)
    at.session_state["_run_open"] = True  # as a run cut short leaves it
    at.run()
    sent = {k: (w.proto.set_value, w.value) for k, w in boxes().items()}
    assert sent == {"prompt": (True, PROMPT), "layer": (True, 2), "lang": (True, "zh"),
                    "model_pick": (True, "tiny-pre")}, sent
    at.run()
    assert {k: w.proto.set_value for k, w in boxes().items() if k != "layer"} == dict.fromkeys(
        ("prompt", "lang", "model_pick"), False)


def test_a_widget_the_browser_has_not_reported_gets_the_page_s_value_again():
    """When a run overtakes the one that set a value before the browser drew it (the screen probe's first report
    while a link's page draws), the browser's next request has no value for that widget: the page sends its value
    again rather than letting the widget come back with its default."""
    at = run_app(prompt=PROMPT, view="attention", layer=2, lang="zh", model="tiny-pre")
    assert not at.exception
    boxes = lambda: {"prompt": at.text_area(key="prompt"), "lang": at.radio(key="lang"),  # noqa: E731
                     "model_pick": at.selectbox(key="model_pick"), "view": at.button_group(key="view")}
    tree = type(at._tree)
    full = tree.get_widget_states

    def without_prompt_and_model(self):
        states = full(self)
        keep = [w for w in states.widgets if w.id.rsplit("-", 1)[-1] not in ("prompt", "model_pick")]
        del states.widgets[:]
        states.widgets.extend(keep)
        return states
    tree.get_widget_states = without_prompt_and_model
    try:
        at.run()
    finally:
        tree.get_widget_states = full
    sent = {k: (w.proto.set_value, w.value) for k, w in boxes().items()}
    assert sent == {"prompt": (True, PROMPT), "lang": (False, "zh"), "model_pick": (True, "tiny-pre"),
                    "view": (False, "attention")}, sent
    at.run()
    assert {k: w.proto.set_value for k, w in boxes().items()} == dict.fromkeys(boxes(), False)


def test_a_value_the_browser_never_took_is_sent_again_when_it_reports_what_it_had():
    """The browser's next request carries the values it showed before the page moved on (the run that moved the
    page was overtaken before the browser drew it, or the page reconnected to a restarted server): the page keeps
    and sends its own values again; a value the visitor changes afterwards is theirs."""
    at = run_app(lecture="tutorial-000", step=5, model="tiny-pre")
    assert not at.exception and at.session_state["view"] == "normlab"
    tree = type(at._tree)
    full = tree.get_widget_states
    before = full(at._tree)  # what the browser showed at step 5
    at.button(key="lecture_next").click().run()
    assert (at.session_state["lecture_step"], at.session_state["view"]) == (5, "norm")

    def as_before(self):
        return before
    tree.get_widget_states = as_before
    try:
        at.run()
    finally:
        tree.get_widget_states = full
    view = at.button_group(key="view")
    assert (at.session_state["view"], view.value, view.proto.set_value) == ("norm", "norm", True)
    at.button_group(key="view").set_value("normlab").run()  # the visitor's own choice, back to the old view, stays
    at.run()
    assert at.session_state["view"] == "normlab"


SETTABLE = {"Radio", "NumberInput", "Slider", "SelectSlider", "Toggle", "Checkbox", "TextArea", "TextInput",
            "Selectbox", "Multiselect", "ButtonGroup", "DateInput", "TimeInput", "ColorPicker"}


def test_every_widget_whose_value_the_page_can_set_is_sent_again_after_a_run_cut_short():
    """The list of keys run_starts() sets again holds every value widget of every view (a missing one, the model
    box, came back as the default model after a cut-short run)."""
    from app.panels import VIEWS
    from app.state_guard import SET_BY_THE_PAGE

    found = {}

    def walk(node):
        for child in (node.children.values() if isinstance(getattr(node, "children", None), dict) else ()):
            walk(child)
        if type(node).__name__ in SETTABLE and getattr(node, "key", None):
            found[node.key] = type(node).__name__

    for view, compare in [(view, None) for view, *_ in VIEWS] + [("attention", "prompt")]:
        at = run_app(prompt=PROMPT, view=view, model="tiny-pre", **({"cmp": compare} if compare else {}))
        assert not at.exception, (view, at.exception)
        walk(at._tree)
    assert {"prompt", "model_pick", "view", "_w_cmp", "_w_cmp_prompt", "whatif_specs", "lab_norm"} <= set(found)
    assert {k: kind for k, kind in found.items() if k not in SET_BY_THE_PAGE} == {}


def test_a_value_set_late_in_a_run_overtaken_before_its_end_is_sent_again(monkeypatch):
    """A preset's lesson puts the layer, head and token where its point is once the model has run, late in the page
    run. When that run is overtaken before its end (a follower's page reconnecting to a restarted server) and the
    browser reports what it showed before, the lesson's values come back, not the browser's old ones."""
    import app.state_guard as guard

    at = run_app(prompt=PROMPT, view="attention", model="tiny-pre")
    tree = type(at._tree)
    full = tree.get_widget_states
    monkeypatch.setattr(guard, "run_ends", lambda: None)  # the run never reaches its last line
    at.selectbox(key="preset").set_value("sink")
    before = full(at._tree)  # the browser's request: the preset picked, layer 0, head 0
    at.run()
    assert not at.exception
    target = {k: at.session_state[k] for k in ("layer", "head")}
    assert at.session_state["view"] == "attention" and target != {"layer": 0, "head": 0}, target
    noted = {k: value for k, (value, _) in at.session_state["_page_set"].items() if k in target}
    assert noted == target  # noted as they were set, though the run did not reach its end
    monkeypatch.undo()
    tree.get_widget_states = lambda self: before
    try:
        at.run()
    finally:
        tree.get_widget_states = full
    assert not at.exception
    assert {k: at.session_state[k] for k in target} == target
    assert [at.slider(key=k).value for k in target] == list(target.values())
