"""LLaMA Explorer: `streamlit run app/main.py`. The page's flow; the link's state is app/url_state.py, the sidebar
app/sidebar.py, the presets and the selection app/controls.py, each view lives in app/panels.
"""
from __future__ import annotations

import logging

import explorer_model  # noqa: F401  (sets OMP_WAIT_POLICY before torch loads)
import streamlit as st
from explorer_model.runtime import keep_freed_memory

from app import (choice_state, compare, controls, gateway, lecture_editor, lecture_player, page_style, prompt_cost,
                 room_follow, screen, screen_probe, sections, share, state_guard, url_state)
from app import sidebar as side
from app.context import ViewContext, display_piece, plain, token_labels
from app.panels import VIEWS
from app.presets import BY_KEY
from app.i18n import error_text
from app.sidebar import tr

log = logging.getLogger("llama_explorer.app")

# presenter mode folds the sidebar away on a projector; no page icon (an emoji renders as a box without its font)
st.set_page_config(page_title="LLaMA Explorer", layout="wide",
                   initial_sidebar_state="collapsed" if st.query_params.get("presenter") == "1" else "auto")
keep_freed_memory()  # each new prompt's recording reuses the memory of evicted ones


def url_ids_once(facts) -> None:
    """A link's `ids=`: the prompt as token ids (set when its text does not give them back)."""
    raw = st.session_state.pop("_url_ids", None)
    if raw is None:
        return
    ids = side.parse_ids(raw, facts.cfg.vocab_size)
    if ids is None:
        st.warning(tr("app.bad_ids"))
        return
    text = side.clean_text(facts, ids)
    st.session_state.update(prompt=text, ids=ids, ids_text=text)


def apply_lesson(facts, ids: list[int], pieces: list[str]) -> str | None:
    """A preset's lesson: on its first run put the selection where its point is visible (found on this model by the
    gateway); while the prompt is the preset's and its view is on screen, the one sentence that says what to look
    for (shown over the part the page lands on: sections.lesson_note). Another view chosen ends the lesson: its
    sentence is about its own view's figure, and the link and a lecture step taken from the page hold the lesson
    only while the page shows it (a step kept as a lesson reopens on the lesson's view, whatever view was on screen
    when it was added)."""
    ss = st.session_state
    key = ss.get("lesson")
    preset = BY_KEY.get(key)
    left = preset is not None and not ss.get("_lesson_pending") and ss.get("view") != preset.view
    if preset is None or ss.get("prompt") != preset.prompt or left:
        ss.pop("lesson", None)
        ss.pop("lesson_values", None)
        return None
    if preset.kind == "compare":  # a comparison's lesson is found on A and its B (app/compare.py)
        return compare.apply_lesson(preset, ids, pieces)
    try:
        target = gateway.lesson_target(st.session_state.active_model, key, tuple(ids))
    except ValueError as e:
        st.info(tr("app.lesson_failed", error=plain(e)))
        return None
    if st.session_state.pop("_lesson_pending", False):
        st.session_state.update(view=target["view"], layer=target["layer"], head=target["head"],
                                token=target["token"], _token_auto=False)
    values = dict(target["values"])
    if preset.kind == "link":
        values.update(query=preset.args[0], other=preset.args[1])
    if "top_id" in values:
        values["piece"] = display_piece(facts.piece(int(values.pop("top_id"))))
    if "key" in target and preset.kind != "link":
        values["other"] = pieces[target["key"]]
    if preset.kind == "split":
        values["example"] = pieces[target["token"]]
    st.session_state["lesson_values"] = values  # a lecture step's caption may quote them
    if st.session_state.get("view") != target["view"]:  # its sentence is about its view's figure: not over another's
        return None
    return tr(f"preset.lesson.{preset.kind}", **{k: plain(v) if isinstance(v, str) else v for k, v in values.items()})


def page_top() -> controls.Places:
    sb = st.sidebar
    with sb:
        screen_probe.probe()
        page_style.apply()
    sb.radio("Language / \u8bed\u8a00", ["en", "zh"], key="lang", horizontal=True,
             format_func=lambda v: "English" if v == "en" else "\u4e2d\u6587")
    sb.toggle(tr("app.presenter"), key="presenter", help=tr("app.presenter_help"))
    presenter = bool(st.session_state.get("presenter"))
    if presenter:  # larger prose; figures scale in plots.show; slider values never wrap; the row of the title and
        # the controls starts below the page's header (3.75rem), which would cover the controls' labels
        st.markdown("<style>[data-testid='stMain'] :is(.stMarkdown, p, li, label) {font-size: 1.3rem !important;}"
                    "[data-testid='stSliderTickBar'] {display: none;}"
                    "[data-testid='stMain'] h1 {white-space: nowrap; padding-top: 0;}"
                    "[data-testid='stTable'] :is(td, th) {font-size: 1.1rem !important;}"
                    "[data-testid='stMainBlockContainer'] {padding-top: 3.75rem;}</style>",
                    unsafe_allow_html=True)  # the main area only: larger sidebar labels would wrap
    sections.landing()
    places = controls.top_row(presenter, gateway.shared())
    if places.share is not None and not st.session_state.get("room_following"):  # a follower is in the room already
        share.box(places.share, gateway.public_port() or int(st.get_option("server.port")))
    return places


def head():
    """The top of the page, drawn before the page's turn in the drawing lane: what the page is (its link, its
    lecture step, the room's step), the title and the lecture's player. A few ms of Python, so when the presenter
    moves, thirty followers' pages show the new step's number, title and caption together instead of one after
    another; the rest of each page waits its turn (gateway.page_run). Returns the places of the
    controls' row and the caption's slot."""
    state_guard.run_starts()
    side.apply_pending()
    choice_state.new_run()
    dropped = url_state.read_once()
    dropped += state_guard.check_state({"view": tuple(v[0] for v in VIEWS), "cmp": compare.MODES})
    lecture_player.start()  # a lecture link's (or `serve --lecture`'s) step, before the widgets exist
    room_follow.sync()  # shared server: the presenter writes the room's step, followers take it
    places = page_top()
    if dropped:
        st.info(tr("app.state_reset"))
    lecture_slot = lecture_player.bar(room_follow.controls)
    return places, lecture_slot


def main(places: controls.Places, lecture_slot) -> None:
    """The rest of the page, in its turn: the sidebar's model, prompt and selection, and the view."""
    lecture_editor.editor()
    facts = side.choose_model()
    if facts is not None:
        gateway.warm_up()  # once per process: the lab twins, in the background
    if facts is not None:
        url_ids_once(facts)  # before the prompt box exists: it may set the box's text
    prompt = side.sidebar_prompt(facts, places)
    if facts is None:
        return
    if not prompt.strip() and not st.session_state.get("ids"):
        st.info(tr("app.empty_prompt_presenter" if st.session_state.get("presenter") else "app.empty_prompt"))
        return
    source = st.session_state.active_model
    cmp_spec = compare.chooser(source)  # B, or None (compare mode off)
    try:
        ids, body, n_total = side.prompt_ids(facts, source, prompt, int(st.session_state.max_tokens))
    except gateway.PromptError:  # too long for this server, or not text: one line, nothing run
        st.error(tr("app.prompt_refused", chars=len(prompt), limit=gateway.prompt_char_limit()))
        return
    if n_total > len(ids):
        st.warning(tr("app.truncated", total=n_total, used=len(ids)))
    if not ids:
        st.info(tr("app.no_tokens"))
        return
    rec = prompt_cost.recording_or_refusal(source, ids)  # says the cost first; refuses what cannot fit
    if rec is None:
        return
    pieces = token_labels(facts, ids)
    lesson = apply_lesson(facts, ids, pieces)
    lecture_player.caption(lecture_slot)
    layer, head, token = controls.selection(facts, ids, pieces, places)
    side.download(source, ids)

    keys = [v[0] for v in VIEWS]
    view = st.segmented_control(tr("app.view"), keys, key="view", required=True,
                                format_func=lambda k: tr(f"view.{k}"), on_change=_view_chosen)
    view = view or keys[0]
    # bos_added: whether a BOS at position 0 was put there for the text (by the tokenizer or the sidebar's switch),
    # not typed as part of it (a chat template starts with SmolLM2's <|im_start|>, its BOS)
    extras = {"source": source, "bos_added": facts.add_bos or len(ids) > len(body), **side.step_api(facts, body)}
    ctx = ViewContext(facts=facts, rec=rec, ids=ids, pieces=pieces, layer=layer, head=head, token=token,
                      lang=st.session_state.get("lang", "en"), presenter=bool(st.session_state.get("presenter")),
                      screen=screen.current(), extras=extras)
    draw = next(v[-1] for v in VIEWS if v[0] == view)
    part_only = room_follow.part_only() and cmp_spec is None  # a following page: the step's part alone
    block = view_block((view, cmp_spec is not None, part_only))  # compare mode and a part alone: other blocks
    try:
        preset = BY_KEY.get(st.session_state.get("lesson")) if lesson else None  # the lesson's own part of the view
        part = preset.section if preset is not None and preset.view == view else None
        with block, sections.lesson_note(view, lesson, part, cmp_spec is not None), sections.only(view, part_only):
            if not compare.draw(view, ctx, cmp_spec):  # A and B side by side; A's own view when off or asked for
                draw(ctx)
    except sections.Rest:  # the parts below the step's
        pass
    except (gateway.RunRefused, gateway.LabBusy) as e:  # a run this server cannot give now: memory, time, queue
        st.error(error_text(e, ctx.lang))
    except Exception as e:  # a broken view must not take the page down; the log keeps the traceback
        log.exception("view %s failed", view)
        st.error(tr("app.view_failed", error=plain(gateway.visitor_message(e, source))))
    finally:  # widgets and download buttons keep ctx for the whole session: let it hold only the cache key
        ctx.rec = gateway.RecordingRef(source, tuple(ids))
    if part_only:
        room_follow.rest_button()
    lecture_editor.note_state(url_state.write(side.url_ids(source, prompt, body), view))  # with the view's choices
    room_follow.step_drawn()


def view_block(shown: tuple):
    """The container the view draws in; `shown`: the view and its mode. Streamlit shows the last run's elements
    until this run replaces them, and a block sent where the last run had a block of the same kind takes over that
    block's children: while a newly chosen view filled, the browser would draw the last view's figures again inside
    it (a quarter more figures drawn over a walk through the views). So views take turns between two places: a newly
    chosen view draws in the place that held nothing, and the last view's place is emptied first; a run of the same
    view keeps its place, and the figures that did not change are not drawn again."""
    place = st.session_state.get("_view_place", 0)
    if st.session_state.get("_view_drawn") != shown:
        place = 1 - place
    st.session_state["_view_place"], st.session_state["_view_drawn"] = place, shown
    outer = st.container()
    if place == 0:
        body = outer.container()
        outer.empty()
    else:
        outer.empty()
        body = outer.container()
    return body


def _view_chosen() -> None:
    """A view chosen by hand: no part of the view before it is named any more."""
    st.session_state.pop("section", None)


def failed() -> None:
    """A value no entry check foresaw: one line, and the settings back to their defaults."""
    log.exception("page run failed")
    state_guard.reset_widgets()
    st.error(tr("app.state_reset"))


_waiting = st.empty()
try:
    _top, _drawn = head(), True
except Exception:
    failed()
    _drawn = False
if _drawn:
    if gateway.pages_ahead():  # a frozen page would look broken: say why it waits
        _waiting.caption(tr("app.queue_pages", n=gateway.pages_ahead()))
    with gateway.page_run():  # one page draws at a time; forward passes run beside it (app/gateway/lanes.py)
        _waiting.empty()
        try:
            main(*_top)
        except Exception:
            failed()
state_guard.run_ends()  # not reached when the run is cut short
