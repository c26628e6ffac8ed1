"""LLaMA Explorer: `streamlit run app/main.py`. Page flow and URL state; the sidebar is app/sidebar.py, each view
lives in app/panels.

State that a copied link must reproduce (model, prompt or its token ids, language, view, layer, head, token,
presenter mode, BOS) is read from the URL's query parameters once per session and written back after every run.
(Streamlit's own widget binding keys options by their displayed label, which changes with the language.)
"""
from __future__ import annotations

import logging

import explorer_model  # noqa: F401  (sets OMP_WAIT_POLICY before torch loads)
import streamlit as st
from explorer_model.runtime import keep_freed_memory

from app import (compare, gateway, lecture_editor, lecture_player, prompt_cost, room_follow, screen, screen_probe,
                 state_guard)
from app import sidebar as side
from app.context import ViewContext, display_piece, plain, token_labels
from app.panels import VIEWS
from app.presets import BY_KEY
from app.i18n import error_text
from app.sidebar import tr

log = logging.getLogger("llama_explorer.app")
URL_KEYS = ("lang", "view", "layer", "head", "token", "prompt", "whatif", "whatif_source") + compare.URL_KEYS
URL_FLAGS = ("presenter", "bos")  # written as 1 when on, left out when off

# presenter mode folds the sidebar away on a projector; no page icon (an emoji renders as a box without its font)
st.set_page_config(page_title="LLaMA Explorer", layout="wide",
                   initial_sidebar_state="collapsed" if st.query_params.get("presenter") == "1" else "auto")
keep_freed_memory()  # each new prompt's recording reuses the memory of evicted ones


def read_url_once() -> None:
    if st.session_state.get("_url_read"):
        return
    st.session_state._url_read = True
    for key in URL_KEYS:
        if key in st.query_params:
            st.session_state[key] = st.query_params[key]
    for key in URL_FLAGS:
        st.session_state[key] = st.query_params.get(key) == "1"
    if "ids" in st.query_params:
        st.session_state["_url_ids"] = st.query_params["ids"]
    st.session_state["_token_auto"] = "token" not in st.query_params
    if st.session_state.get("lang") not in ("en", "zh"):
        st.session_state.lang = "en"
    if st.session_state.get("view") not in [v[0] for v in VIEWS]:
        st.session_state.view = VIEWS[0][0]


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


def write_url(ids_param: str) -> dict:
    wanted = {k: str(st.session_state[k]) for k in URL_KEYS if st.session_state.get(k) not in (None, "")}
    wanted.update({k: "1" for k in URL_FLAGS if st.session_state.get(k)})
    if ids_param:
        wanted["ids"] = ids_param
    wanted["model"] = st.session_state.get("active_model", gateway.DEFAULT_SOURCE)
    state = dict(wanted)
    wanted.update(lecture_player.url_params())  # a shipped lecture's name and step
    if dict(st.query_params) != wanted:
        st.query_params.from_dict(wanted)
    return state


def apply_lesson(facts, ids: list[int], pieces: list[str]) -> None:
    """A preset's lesson: on its first run put the selection where its point is visible (found on this model by the
    gateway); while the prompt is the preset's, say in one sentence what to look for."""
    key = st.session_state.get("lesson")
    preset = BY_KEY.get(key)
    if preset is None or st.session_state.get("prompt") != preset.prompt:
        st.session_state.pop("lesson", None)
        return
    if preset.kind == "compare":  # a comparison's lesson is found on A and its B (app/compare.py)
        return compare.apply_lesson(preset, ids, pieces)
    try:
        target = gateway.lesson_target(st.session_state.active_model, key, tuple(ids))
    except ValueError as e:
        st.info(tr("app.lesson_failed", error=plain(e)))
        return
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
    st.info(tr(f"preset.lesson.{preset.kind}", **{k: plain(v) if isinstance(v, str) else v
                                                  for k, v in values.items()}), icon=None)


def page_top() -> None:
    sb = st.sidebar
    with sb:
        screen_probe.probe()
    sb.radio("Language / \u8bed\u8a00", ["en", "zh"], key="lang", horizontal=True,
             format_func=lambda v: "English" if v == "en" else "\u4e2d\u6587")
    sb.toggle(tr("app.presenter"), key="presenter", help=tr("app.presenter_help"))
    if st.session_state.get("presenter"):  # larger prose; figures scale in plots.show; slider values never wrap
        st.markdown("<style>[data-testid='stMain'] :is(.stMarkdown, p, li, label) {font-size: 1.3rem !important;}"
                    "[data-testid='stSliderTickBar'] {display: none;}"
                    "[data-testid='stTable'] :is(td, th) {font-size: 1.1rem !important;}"
                    "[data-testid='stMainBlockContainer'] {padding-top: 1.5rem;}</style>",
                    unsafe_allow_html=True)  # the main area only: larger sidebar labels would wrap
    st.title(tr("app.title"))
    if gateway.shared():
        side.share_box(gateway.public_port() or int(st.get_option("server.port")))


def main() -> None:
    side.apply_pending()
    read_url_once()
    dropped = state_guard.check_state({"view": tuple(v[0] for v in VIEWS), "cmp": compare.MODES})
    lecture_player.start()  # a lecture link's (or `serve --lecture`'s) step, before the widgets exist
    room_follow.sync()  # shared server: the presenter writes the room's step, followers take it
    page_top()
    if dropped:
        st.info(tr("app.state_reset"))
    lecture_slot = lecture_player.bar()
    room_follow.controls()
    lecture_editor.editor()
    facts = side.choose_model()
    if facts is not None:
        gateway.warm_up()  # once per process: the lab twins, in the background
    if facts is not None:
        url_ids_once(facts)  # before the prompt box exists: it may set the box's text
    prompt = side.sidebar_prompt(facts)
    if facts is None:
        return
    if not prompt.strip() and not st.session_state.get("ids"):
        st.info(tr("app.empty_prompt"))
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
    apply_lesson(facts, ids, pieces)
    lecture_player.caption(lecture_slot)
    layer, head, token = side.selection(facts, ids, pieces)
    side.download(source, ids)

    keys = [v[0] for v in VIEWS]
    view = st.segmented_control(tr("app.view"), keys, key="view", required=True,
                                format_func=lambda k: tr(f"view.{k}"))
    view = view or keys[0]
    extras = {"source": source, **side.step_api(facts, body)}
    ctx = ViewContext(facts=facts, rec=rec, ids=ids, pieces=pieces, layer=layer, head=head, token=token,
                      lang=st.session_state.get("lang", "en"), presenter=bool(st.session_state.get("presenter")),
                      screen=screen.current(), extras=extras)
    lecture_editor.note_state(write_url(side.url_ids(source, prompt, body)))
    draw = next(v[-1] for v in VIEWS if v[0] == view)
    try:
        if not compare.draw(view, ctx, cmp_spec):  # A and B side by side; A's own view when off or asked for
            draw(ctx)
    except (gateway.RunRefused, gateway.LabBusy) as e:  # a run this server cannot give now: memory, time, queue
        st.error(error_text(e, ctx.lang))
    except Exception as e:  # a broken view must not take the page down; the log keeps the traceback
        log.exception("view %s failed", view)
        st.error(tr("app.view_failed", error=plain(gateway.visitor_message(e, source))))
    finally:  # widgets and download buttons keep ctx for the whole session: let it hold only the cache key
        ctx.rec = gateway.RecordingRef(source, tuple(ids))


_waiting = st.empty()
if gateway.pages_ahead():  # a frozen page would look broken: say why it waits
    _waiting.caption(tr("app.queue_pages", n=gateway.pages_ahead()))
with gateway.page_run():  # one page draws at a time; forward passes run beside it (app/gateway/lanes.py)
    _waiting.empty()
    try:
        main()
    except Exception:  # a value no entry check foresaw: one line, and the settings back to their defaults
        log.exception("page run failed")
        state_guard.reset_widgets()
        st.error(tr("app.state_reset"))
