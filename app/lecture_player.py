"""Lectures in the page: open one (shipped, uploaded, `serve --lecture FILE`, or `?lecture=NAME&step=I`), play it
from the projector (step i / N, title, caption, Previous / Next, the clicker's keys) and author it ("add this view as
a step", edit, reorder, delete, download). The file format is explorer_model/lecture.py.

A step is applied the way a link is read: its fields set the same session state the URL's query parameters set
(app/url_state.py), a step with a lesson sets the preset's lesson, which app/main.py's apply_lesson finds on the
model, its choices are the view's (every other choice back to its default) and the page lands on its section.

State (st.session_state):
  lecture        {"title": {en, zh}, "steps": [step tables]} or absent;  lecture_name  the shipped name or None
  lecture_step   the step on screen (0-based);  lecture_missing  the model the current step names, when not offered
  lecture_problems  lines saying why the last file did not open
"""
from __future__ import annotations

import hashlib
import logging
import os
import threading
from pathlib import Path

import streamlit as st

from app import choice_state, gateway, sections
from app import lecture_rules as rules
from app.context import plain
from app.i18n import t
from app.presets import BY_KEY, opened
from explorer_model import interventions as I
from explorer_model import lecture as L
from explorer_model.paths import ASSETS

SHIPPED = ASSETS / "lectures"
log = logging.getLogger("llama_explorer.lecture")
_PREPARED: set[str] = set()
_PREPARED_LOCK = threading.Lock()
LECTURE_ENV = "LLAMA_EXPLORER_LECTURE"  # set by `serve --lecture FILE`


def tr(key: str, **values) -> str:
    return t(key, st.session_state.get("lang", "en"), **values)


def view_keys() -> list[str]:
    from app.panels import VIEWS

    return [v[0] for v in VIEWS]


def lessons() -> dict[str, str]:
    return rules.lessons()


def check_step(step: dict, i: int, problems: list) -> dict:
    """One step checked as the page reads it (app/lecture_rules.py), its mistakes in the page's language."""
    return rules.check_step(step, i, problems, st.session_state.get("lang", "en"))


def parse(data: bytes | str) -> tuple[L.Lecture | None, list[L.Problem]]:
    """A lecture file checked as the page reads it (app/lecture_rules.py; `serve --lecture` checks the same)."""
    return rules.parse(data, st.session_state.get("lang", "en"))


def shipped() -> list[str]:
    return sorted(p.stem for p in SHIPPED.glob("*.toml")) if SHIPPED.is_dir() else []


_TEXTS: dict[str, str] = {}
_TEXTS_LOCK = threading.Lock()


def lecture_text(lecture: dict) -> str:
    """The open lecture ({"title", "steps"}) as TOML (explorer_model.lecture.dumps), written once per content: the
    presenter's page hands it to the room and the Lecture box offers it as a file on every run, and the writer
    quotes every string in Python (tens of ms for a shipped lecture); its repr is a small fraction of that."""
    key = repr((lecture["title"], lecture["steps"]))
    with _TEXTS_LOCK:
        if key in _TEXTS:
            return _TEXTS[key]
    text = L.dumps(L.Lecture(lecture["title"], lecture["steps"]))
    with _TEXTS_LOCK:
        while len(_TEXTS) >= 16:
            _TEXTS.pop(next(iter(_TEXTS)))
        _TEXTS[key] = text
    return text


KIND_KEYS = {words: key for key, words in L.KIND_WORDS.items()}


def problem_line(p: L.Problem) -> str:
    """One mistake in the reader's language: where (step, field) and what is allowed."""
    detail = {k: plain(v) for k, v in p.detail.items()}
    if p.detail.get("kind") in KIND_KEYS:  # "a table { en, zh }": in the reader's language too
        detail["kind"] = tr(f"lecture.kind.{KIND_KEYS[p.detail['kind']]}")
    what = tr(f"lecture.err.{p.code}", **detail)
    if p.step:
        return tr("lecture.where_step", step=p.step, field=plain(p.field or "-"), what=what)
    return tr("lecture.where_file", field=plain(p.field or "-"), what=what) if p.field else what


def open_lecture(data: bytes, name: str | None) -> bool:
    """Parse and open a lecture at its first step; on mistakes keep what is open and list them."""
    lecture, problems = parse(data)
    if lecture is None:
        st.session_state["lecture_problems"] = [problem_line(p) for p in problems[:20]]
        return False
    st.session_state.pop("lecture_problems", None)
    st.session_state.update(lecture={"title": lecture.title, "steps": lecture.steps}, lecture_name=name)
    prepare(data, lecture.steps)
    go(0)
    return True


def prepare(data: bytes, steps: list[dict]) -> None:
    """On a server, once per lecture file: every step's recording (its lesson's target, its what-if run) computed in
    the background through the gateway, so each step opens from the cache when the lecturer gets there."""
    from app.gateway.settings import warm_up_enabled

    digest = hashlib.sha256(data).hexdigest()
    with _PREPARED_LOCK:
        if digest in _PREPARED or not warm_up_enabled():  # a server `serve` started, not AppTest
            return
        _PREPARED.add(digest)

    def run() -> None:
        for step in steps:
            try:
                _prepare_step(step)
            except Exception:  # the step says what is wrong when it is opened
                log.info("preparing a lecture step failed", exc_info=True)
    threading.Thread(target=run, daemon=True, name="lecture-prepare").start()


def _prepare_step(step: dict) -> None:
    preset = BY_KEY.get(step.get("lesson"))
    picked = opened(preset.key).get("active_model") if preset is not None else None  # a comparison's model
    source = picked or step.get("model") or gateway.default_source()
    if source not in gateway.offered_models():
        return
    facts, _ = gateway.try_load(source)
    if facts is None:
        return
    if "ids" in step:
        body = list(step["ids"])
    else:
        body, _ = gateway.encode_prompt(source, preset.prompt if preset else step.get("prompt", ""),
                                         min(gateway.DEFAULT_MAX_TOKENS, gateway.token_cap()))
    bos = [facts.bos_id] if step.get("bos") and facts.bos_id is not None and not facts.add_bos else []
    if not body:
        return
    ids = tuple(bos + body)
    gateway.recording(source, ids)
    if preset is not None and preset.kind != "compare":
        gateway.lesson_target(source, preset.key, ids)
    if step.get("whatif") and not step.get("whatif_source"):  # the What-if view's run and its KL, as it asks
        specs = I.format_list(gateway.check_interventions(source, step["whatif"]))
        gateway.whatif_run(source, ids, specs, ())
        gateway.whatif_kl(source, ids, specs, ())


def start() -> None:
    """Once per session, before the widgets: the link's lecture (?lecture=NAME&step=I) or the server's (--lecture)."""
    ss = st.session_state
    if ss.get("_lecture_started"):
        return
    ss["_lecture_started"] = True
    name = st.query_params.get("lecture")
    ss["_lecture_linked"] = name is not None
    if name is not None:
        if not L.NAME.match(name) or name not in shipped():
            ss["lecture_problems"] = [tr("lecture.no_such", name=plain(name), names=", ".join(shipped()))]
            return
        if not open_lecture((SHIPPED / f"{name}.toml").read_bytes(), name):
            return
    elif os.environ.get(LECTURE_ENV):
        path = Path(os.environ[LECTURE_ENV])
        try:
            data = path.read_bytes()[:L.MAX_BYTES + 1]
        except OSError as e:
            ss["lecture_problems"] = [tr("lecture.unreadable", error=plain(e.strerror or e))]
            return
        if not open_lecture(data, None):
            return
    else:
        return
    try:
        wanted = int(st.query_params.get("step", "1")) - 1
    except ValueError:
        wanted = 0
    go(min(max(wanted, 0), len(ss.lecture["steps"]) - 1))


def named_by_link() -> bool:
    """Whether the session's link named a lecture (?lecture=NAME): a presenter's link that does jumps the room."""
    return bool(st.session_state.get("_lecture_linked"))


def go(i: int) -> None:
    """Open step i: set the state its fields name (a button's callback or before the widgets exist)."""
    ss = st.session_state
    steps = ss["lecture"]["steps"]
    i = min(max(i, 0), len(steps) - 1)
    ss["lecture_step"] = i
    step = steps[i]
    model = step.get("model")
    if model is not None and model not in gateway.offered_models():
        ss["lecture_missing"] = model  # this step stays unopened; the others still open
        return
    ss.pop("lecture_missing", None)
    preset = BY_KEY.get(step.get("lesson"))
    prompt = preset.prompt if preset else step.get("prompt")
    if prompt is not None or "ids" in step:
        ss.update(prompt=prompt or "", ids=None, ids_text=None, ids_history=[])
    if "ids" in step:
        ss["_url_ids"] = ",".join(str(v) for v in step["ids"])  # checked against the vocabulary as a link's are
    ss.pop("my_state", None)
    # a step shows the same on every page whatever the page showed before (a student rejoining from their own
    # exploration, a link to the step): the layer and head a step does not name are the first, as a link's
    state = {"bos": bool(step.get("bos", False)), "cmp": step.get("cmp", ""), "layer": 0, "head": 0}
    for k in ("view", "layer", "head", "token", "presenter", "whatif", "whatif_source", "cmp_prompt", "cmp_model",
              "cmp_iv", "cmp_align"):
        if k in step:
            state[k] = step[k]
        elif k.startswith(("cmp_", "whatif")):
            ss.pop(k, None)  # a step holds its whole comparison: nothing of the previous step's stays
    if model is not None:
        state.update(active_model=model, model_pick=model)
    state["_token_auto"] = "token" not in step
    if preset is not None:  # its view, lesson and B; the prompt is set above, BOS is the step's
        state.update({k: v for k, v in opened(preset.key).items() if k not in ("prompt", "ids", "ids_text", "bos")})
    else:
        ss.pop("lesson", None)
    choice_state.reset_all(step.get("choices"))
    ss.update(state)
    sections.request(ss.get("view"), step.get("section", preset.section if preset else None))


def _move(delta: int) -> None:
    go(st.session_state.get("lecture_step", 0) + delta)


def _close() -> None:
    for k in ("lecture", "lecture_name", "lecture_step", "lecture_missing"):
        st.session_state.pop(k, None)


def url_params() -> dict[str, str]:
    """The link's lecture and step (1-based), for a shipped lecture: a copied link reopens it there."""
    ss = st.session_state
    if ss.get("lecture") and ss.get("lecture_name"):
        return {"lecture": ss["lecture_name"], "step": str(ss.get("lecture_step", 0) + 1)}
    return {}


def _lang_text(table: dict) -> str:
    lang = st.session_state.get("lang", "en")
    return (table or {}).get(lang) or (table or {}).get("en") or ""


def _plain_lines(text: str) -> str:
    return "  \n".join(plain(line) for line in text.split("\n"))


# On a phone the pinned player took a third of the screen while following and nearly half while exploring (its
# buttons, a 1.5rem title and five lines of caption, each with a rem of gap), and the figure's title hid under it.
# There it keeps to its essentials, smaller: Previous, Next and Go to… in one row of short buttons, a title of body
# size, three lines of caption before its box scrolls, the room's line in small text and little space between them.
# (page_style.py pins it and lays out its rows; these rules only make them smaller, under its block alone.)
BAR = ".st-key-lecture_bar"
PHONE_PLAYER = (
    "@media (max-width: 640px) {"
    f"{BAR} {{gap: 0.35rem; padding: 0.5rem 0.75rem;}}"
    f"{BAR} [data-testid='stVerticalBlock'] {{gap: 0.35rem;}}"
    f"{BAR} [data-testid='stHorizontalBlock'] {{gap: 0.35rem 0.5rem;}}"
    f"{BAR} button {{min-height: 2.75rem; padding: 0.1rem 0.5rem;}}"  # a finger's tap target: 44 px high
    f"{BAR} button p, {BAR} [data-testid='stCaptionContainer'] p {{font-size: 0.85rem; line-height: 1.3;}}"
    # (Streamlit pulls a text's block up by a rem into its gap: with the gap narrowed, it would overlap the next)
    f"{BAR} [data-testid='stMarkdownContainer'] {{margin-bottom: 0;}}"
    f"{BAR} [data-testid='stMarkdownContainer'] p {{font-size: 0.9rem; line-height: 1.4; margin-bottom: 0;}}"
    f"{BAR} h3 {{font-size: 1.1rem; line-height: 1.3;}}"
    f"{BAR} .st-key-lecture_caption {{max-height: 4.2em;}}"  # three lines of 1.4
    # Go to… beside Next rather than under it: the row of buttons is one row
    f"{BAR} [data-testid='stColumn']:has(.st-key-lecture_next) {{flex: 2 1 55%;}}"
    f"{BAR} [data-testid='stColumn']:has(.st-key-lecture_next) > [data-testid='stVerticalBlock'] "
    "{flex-direction: row;}"
    f"{BAR} [data-testid='stColumn']:has(.st-key-lecture_next) > [data-testid='stVerticalBlock'] > * "
    "{flex: 1 1 0; min-width: 0; width: auto;}}")


def bar(room_controls=None):
    """The player, in the main area (never the folded sidebar): step i / N, Previous / Next, title and caption,
    and under them `room_controls` (what the page is in a room: following, exploring, presenting), which stay with
    the player where it is pinned. Returns the caption's slot (filled by caption() once the lesson's values are
    computed) or None."""
    ss = st.session_state
    for line in ss.pop("lecture_problems", None) or []:
        st.error(line)
    if not ss.get("lecture"):
        if room_controls:
            room_controls()
        return None
    steps, i = ss["lecture"]["steps"], ss.get("lecture_step", 0)
    step = steps[i]
    st.html(f"<style>{PHONE_PLAYER}</style>")
    with st.container(border=True, key="lecture_bar"):
        if ss.get("room_following"):  # a follower's step is the presenter's (app/room_follow.py): no buttons
            mid = st.container()
        else:
            left, mid, right = st.columns([1, 6, 1], vertical_alignment="center")
            left.button(tr("lecture.previous"), key="lecture_prev", on_click=_move, args=(-1,), disabled=i == 0,
                        use_container_width=True)
            right.button(tr("lecture.next"), key="lecture_next", on_click=_move, args=(1,),
                         disabled=i == len(steps) - 1, use_container_width=True)
            with right:
                _picker(steps, i)
        # the counter and the step's title between the buttons, the caption under them: as short a player as it
        # can be, for on a large screen it stays pinned at the top while the page scrolls (page_style.py)
        mid.markdown(tr("lecture.counter", i=i + 1, n=len(steps), lecture=plain(_lang_text(ss["lecture"]["title"]))))
        mid.subheader(plain(_lang_text(step.get("title"))), anchor=False)
        if ss.get("lecture_missing"):
            st.warning(tr("lecture.model_missing", model=plain(ss["lecture_missing"])))
        slot = st.container(key="lecture_caption").empty()  # (its box scrolls on a phone: page_style.py)
        text = _lang_text(step.get("caption"))
        if text and not any(m.group(1) for m in L.PLACEHOLDER.finditer(text)):
            slot.markdown(_plain_lines(L.fill(text, {})))
        if room_controls:
            room_controls()
    if not ss.get("room_following"):
        keyboard()
    return slot


def _picker(steps: list[dict], i: int) -> None:
    """Any step by its number and title, under Next, folded into a popover (it adds no height to the pinned player):
    a lecturer takes a question about an earlier step, or skips ahead, in one click instead of many presses. A
    button per step, the one on screen greyed: a click is an event, where a choice list's value is state, which a
    browser that missed a step (a reconnect, an overtaken run) would send back and so move the lecture back."""
    with st.popover(tr("lecture.jump"), use_container_width=True):
        for k, step in enumerate(steps):
            st.button(f"{k + 1} · {plain(_lang_text(step.get('title')))}", key=f"lecture_go_{k}", on_click=go,
                      args=(k,), disabled=k == i, use_container_width=True)


def caption(slot) -> None:
    """The current step's caption with its {name} placeholders filled from the lesson computed on this model
    (app/main.py's apply_lesson keeps its values)."""
    ss = st.session_state
    if slot is None or not ss.get("lecture"):
        return
    step = ss["lecture"]["steps"][ss.get("lecture_step", 0)]
    text = _lang_text(step.get("caption"))
    if text and ss.get("lesson") == step.get("lesson") and ss.get("lesson_values") is not None:
        slot.markdown(_plain_lines(L.fill(text, ss["lesson_values"])))


# A clicker sends → ← PageDown PageUp or space: Streamlit has no key handler, so a component listens on the page
# (app/lecture_keys.js) and sends the step its presses lead to.
KEYS = "lecture_keys"
_KEYS = st.components.v2.component(
    "llama_explorer_lecture_keys", js=(Path(__file__).parent / "lecture_keys.js").read_text(encoding="utf-8"))


def keyboard() -> None:
    """The clicker's keys. A press is numbered (seq) so that the step it asks for is taken once, and the page's
    next press counts on from it even before the server has drawn it."""
    ss = st.session_state
    ss.setdefault("_keys_session", os.urandom(6).hex())
    st.html(f"<style>.st-key-{KEYS} {{display: none;}}</style>")
    _KEYS(key=KEYS, data={"step": ss.get("lecture_step", 0), "n": len(ss["lecture"]["steps"]),
                          "seq": ss.get("_keys_seq", 0), "session": ss["_keys_session"]},
          on_press_change=_pressed, height=0)


def _pressed() -> None:
    ss = st.session_state
    state = ss.get(KEYS) or {}
    press = state.get("press") if hasattr(state, "get") else None
    try:
        seq, step = int(press["seq"]), int(press["step"])
    except (KeyError, TypeError, ValueError):  # the browser's to send, so anything
        return
    if seq > ss.get("_keys_seq", 0) and ss.get("lecture") and not ss.get("room_following"):
        ss["_keys_seq"] = seq
        go(step)
