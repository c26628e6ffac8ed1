"""Authoring a lecture in the page (the sidebar's "Lecture" box): open a file or a shipped lecture, add the view on
screen as a step, edit the lecture's title and the current step's title and caption, move the step, delete it,
download the file (named after the lecture's English title).

A new step is the state the page's link holds (app/main.py hands it to note_state each run): the view, its section
and its own choices, the preset's lesson while its view is on screen (its target is then found again on the model
when the step opens; another view chosen ends the lesson, app/main.py's apply_lesson, and the step holds that view,
the layer, head and token on screen and the prompt).
"""
from __future__ import annotations

import functools
import re
import tomllib

import streamlit as st

from app import choice_state
from app import lecture_player as P
from app.context import plain
from app.i18n import t
from explorer_model import lecture as L

EDITED = ("title_en", "title_zh", "caption_en", "caption_zh")


def note_state(url: dict) -> None:
    """The page's state as its URL holds it, kept for "add this view as a step"."""
    st.session_state["_lecture_here"] = dict(url)


def step_from_state() -> dict:
    ss = st.session_state
    url = ss.get("_lecture_here") or {}
    step: dict = {"title": {lang: t(f"view.{url.get('view', 'tokens')}", lang) for lang in L.LANGS},
                  "caption": {lang: "" for lang in L.LANGS}}
    for k in L.URL_FIELDS:
        if k not in url:
            continue
        v = url[k]
        kind = L.SCHEMA["step"][k][0]
        if kind == "int":
            step[k] = int(v)
        elif kind == "bool":
            step[k] = v == "1"
        elif kind == "ids":
            step[k] = [int(i) for i in v.split(",")]
        else:
            step[k] = v
    if not url.get("token") or ss.get("_token_auto", True):
        step.pop("token", None)  # the last token of whatever the prompt is
    if url.get("lesson") in P.lessons():
        step["lesson"] = url["lesson"]
        for k in L.FROM_LESSON:
            step.pop(k, None)
    choices = choice_state.step_choices(url)  # the view's choices as the link holds them: not their defaults
    if choices:
        step["choices"] = choices
    return step


def _add() -> None:
    ss = st.session_state
    if not ss.get("lecture"):
        ss.update(lecture={"title": {lang: t("lecture.new_title", lang) for lang in L.LANGS}, "steps": []},
                  lecture_name=None)
    steps = ss["lecture"]["steps"]
    at = ss.get("lecture_step", -1) + 1 if steps else 0
    steps.insert(at, step_from_state())
    ss["lecture_name"] = None  # edited: no longer the shipped file a link could name
    ss["lecture_step"] = at


def _swap(delta: int) -> None:
    ss = st.session_state
    steps, i = ss["lecture"]["steps"], ss["lecture_step"]
    j = i + delta
    if 0 <= j < len(steps):
        steps[i], steps[j] = steps[j], steps[i]
        ss.update(lecture_step=j, lecture_name=None)


def _delete() -> None:
    ss = st.session_state
    steps = ss["lecture"]["steps"]
    steps.pop(ss["lecture_step"])
    if not steps:
        P._close()
        return
    ss.update(lecture_step=min(ss["lecture_step"], len(steps) - 1), lecture_name=None)


def edit_key(name: str, i: int, step: dict) -> str:
    """A text box's key names the step it edits (its place and identity), so the boxes of another step start
    from that step's texts."""
    return f"lecture_edit_{name}_{i}_{id(step)}"


def title_key(lang: str, lecture: dict) -> str:
    """The lecture title's box in `lang`, named by the lecture it edits (another lecture's boxes start afresh)."""
    return f"lecture_title_{lang}_{id(lecture)}"


def file_name(lecture: dict, name: str | None) -> str:
    """The downloaded file's name: a shipped lecture's own, else the English title's words in lower case joined by
    hyphens (`inside-one-llama-block.toml`), else lecture.toml."""
    words = re.findall(r"[a-z0-9]+", ((lecture.get("title") or {}).get("en") or "").lower())
    return f"{name or '-'.join(words)[:60].strip('-') or 'lecture'}.toml"


def _save_texts(i: int, ident: int) -> None:
    """The Save button of the boxes: what the lecturer typed into the step. The boxes are a form, committed only
    by that button: a box's own change event also fires for boxes the browser has not shown yet (the folded
    sidebar of presenter mode), with an empty text that would wipe the step."""
    ss = st.session_state
    steps = ss["lecture"]["steps"] if ss.get("lecture") else []
    if i >= len(steps) or id(steps[i]) != ident:  # the boxes of a step no longer there
        return
    changed = False
    lecture = ss["lecture"]
    for lang in L.LANGS:  # an emptied title box keeps the title: a lecture file needs one
        text = (ss.get(title_key(lang, lecture)) or "").strip()
        if text and text != lecture["title"].get(lang, ""):
            lecture["title"][lang] = text
            changed = True
    for name in EDITED:
        part, lang = name.split("_")
        text = ss.get(edit_key(name, i, steps[i])) or ""
        if text != (steps[i].get(part) or {}).get(lang, ""):
            steps[i].setdefault(part, {lang: "" for lang in L.LANGS})[lang] = text
            changed = True
    if changed:
        ss["lecture_name"] = None  # edited: no longer the shipped file a link could name


def _upload() -> None:
    f = st.session_state.get("lecture_upload")
    if f is not None:
        P.open_lecture(f.getvalue()[:L.MAX_BYTES + 1], None)


@functools.cache
def _shipped_title(name: str) -> dict:
    """A shipped lecture's title {en, zh}, read once per process (the files ship with the app)."""
    try:
        title = tomllib.loads((P.SHIPPED / f"{name}.toml").read_text(encoding="utf-8")).get("title")
    except (OSError, ValueError):
        return {}
    return title if isinstance(title, dict) else {}


def shipped_label(name: str) -> str:
    """A shipped lecture in the list: its title in the page's language, and its name, which a link
    (?lecture=NAME) and the benches use."""
    title = P._lang_text(_shipped_title(name))
    return P.tr("lecture.shipped_item", title=title, name=name) if isinstance(title, str) and title else name


def _open_shipped() -> None:
    name = st.session_state.get("lecture_shipped")
    if name in P.shipped():
        P.open_lecture((P.SHIPPED / f"{name}.toml").read_bytes(), name)
    st.session_state["lecture_shipped"] = None


def editor() -> None:
    ss = st.session_state
    if ss.get("room_following"):  # the room's lecture is the presenter's: "explore on my own" opens the box
        return
    with st.sidebar.expander(P.tr("lecture.box"), expanded=False):
        st.selectbox(P.tr("lecture.open_shipped"), P.shipped(), index=None, key="lecture_shipped",
                     on_change=_open_shipped, placeholder=P.tr("lecture.choose"), format_func=shipped_label)
        # The label says a lecture file's own limit: Streamlit's line under the picker names whole megabytes only
        # ("1MB per file"), so app/page_style.py hides it. With 1 MB the browser refuses a bigger file before
        # sending it (and serve's server.maxUploadSize refuses one sent anyway); parse() says what is over 256 KB.
        st.file_uploader(P.tr("lecture.open_file", kb=L.MAX_BYTES // 1024), type=["toml"], max_upload_size=1,
                         key="lecture_upload", on_change=_upload)
        st.button(P.tr("lecture.add"), key="lecture_add", on_click=_add, use_container_width=True)
        if not ss.get("lecture"):
            return
        steps, i = ss["lecture"]["steps"], ss["lecture_step"]
        with st.form("lecture_texts", border=False):
            for lang in L.LANGS:
                key = title_key(lang, ss["lecture"])
                if key not in ss:
                    ss[key] = ss["lecture"]["title"].get(lang, "")
                st.text_input(P.tr(f"lecture.edit_lecture_title_{lang}"), key=key, max_chars=L.MAX_TEXT)
            st.caption(P.tr("lecture.editing", i=i + 1, n=len(steps)))
            for name in EDITED:
                key = edit_key(name, i, steps[i])
                if key not in ss:  # this step's box, new: the step's text in it
                    part, lang = name.split("_")
                    ss[key] = (steps[i].get(part) or {}).get(lang, "")
                widget = st.text_area if name.startswith("caption") else st.text_input
                widget(P.tr(f"lecture.edit_{name}"), key=key, max_chars=L.MAX_TEXT)
            st.form_submit_button(P.tr("lecture.save_texts"), key="lecture_save", on_click=_save_texts,
                                  args=(i, id(steps[i])), use_container_width=True)
        problems: list[L.Problem] = []
        P.check_step(steps[i], i + 1, problems)
        for p in problems:
            st.warning(P.problem_line(p))
        up, down = st.columns(2)  # (three in a row cut their labels short in the sidebar)
        up.button(P.tr("lecture.up"), key="lecture_up", on_click=_swap, args=(-1,), disabled=i == 0,
                  use_container_width=True)
        down.button(P.tr("lecture.down"), key="lecture_down", on_click=_swap, args=(1,),
                    disabled=i == len(steps) - 1, use_container_width=True)
        st.button(P.tr("lecture.delete"), key="lecture_delete", on_click=_delete, use_container_width=True)
        data = P.lecture_text(ss["lecture"]).encode("utf-8")  # built here: the callback has no session
        st.download_button(P.tr("lecture.download"), data=data,
                           file_name=file_name(ss["lecture"], ss.get("lecture_name")),
                           mime="application/toml", on_click="ignore", key="lecture_download",
                           use_container_width=True)
        st.button(P.tr("lecture.close"), key="lecture_close", on_click=P._close)
        st.caption(plain(P.tr("lecture.edit_hint")))
