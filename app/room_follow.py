"""The room on a shared server: the presenter's page (opened with the secret key `serve --share` prints) drives it,
every other page follows the presenter's lecture step within a second, until its visitor chooses "explore on my
own" ("back to the lecture" rejoins at the current step).

The key is checked here, on the server, against the one the server was started with: a follower's page never
writes the room, whatever its URL or messages say. The projector's tab keeps the key (app/room_key.py), so the
projector's page reloaded presents again, and a page that starts presenting while the room runs a lecture resumes
it at the room's step. The room's state is explorer_model/room.py (SQLite, shared by the
server's processes); the server reruns a following page when it changes (app/room_push.py). Session state:
room_presenter (the key matched), room_following, room_detached, room_whole (the visitor asked for whole views
while following), room_seen (the room version this page shows, once a run that took it drew its view),
_room_taking (the version this run took), _room_url (the URL the last drawn run gave the page), _room_sent (what
the presenter last wrote).

The browser holds a page's widget values: a run it asks for carries them, with its URL. A run the server asks for
(a step) can cross one the browser asked for before that step reached it (the catch-up's, a reconnecting page's),
whose values are the previous step's and would then stand. Such a run is recognised by its URL, which is not the
one the last drawn run wrote: a following page then takes the room's step again.
"""
from __future__ import annotations

import copy
import functools
import hmac
import os
from urllib.parse import urlencode

import streamlit as st

from app import lecture_player as P
from app import room_key, room_push, sections
from explorer_model import lecture as L
from explorer_model.room import ROOM_DB_ENV, ROOM_KEY_ENV, Room

POLL_SECONDS = 0.5  # where the server cannot rerun a page (room_push.available() is False), the page asks this often
# Where it can, a following page still asks now and then: a page whose connection was lost (its server process
# restarted) is not rerun by any server until it asks, and Streamlit's page asks for a run as soon as it reconnects
# when it has a timed fragment; if it did not, this is how late such a page comes back.
CATCH_UP_SECONDS = 15.0
_ROOMS: dict[str, Room] = {}


def room() -> Room | None:
    path = os.environ.get(ROOM_DB_ENV)
    if not path:
        return None
    if path not in _ROOMS:
        _ROOMS[path] = Room(path)
    return _ROOMS[path]


def is_presenter() -> bool:
    ss = st.session_state
    if "room_presenter" not in ss:  # once per session: the link's key
        ss["room_presenter"] = _holds(st.query_params.get("room_key", ""))
    return ss["room_presenter"]


def _holds(key: str) -> bool:
    """Whether `key` is the server's, compared in constant time."""
    secret = os.environ.get(ROOM_KEY_ENV, "")
    return bool(secret) and hmac.compare_digest(key.encode(), secret.encode())


def _take_kept_key() -> None:
    """The key the projector's tab kept from the presenter's link (app/room_key.py) makes a reloaded projector page
    the presenter again; a key that no longer holds (the server restarted with a new one) is said on the page."""
    ss = st.session_state
    kept = room_key.exchange(os.environ.get(ROOM_KEY_ENV) if is_presenter() else None)
    if kept is None or is_presenter():
        return
    ss["room_presenter"] = _holds(kept)
    ss["room_key_stale"] = not ss["room_presenter"]
    if ss["room_presenter"]:
        ss.update(room_detached=False, room_whole=False)


def sync() -> None:
    """Before the widgets: the presenter writes the step on screen; a follower takes the room's step."""
    r, ss = room(), st.session_state
    if r is None:
        return
    _take_kept_key()
    if is_presenter():
        ss["room_following"] = False
        if not ss.get("_room_resumed"):  # once per presenting session
            ss["_room_resumed"] = True
            _resume(r)
        if ss.get("lecture"):
            sent = (P.lecture_text(ss["lecture"]), ss.get("lecture_name") or "", ss.get("lecture_step", 0))
            if ss.get("_room_sent") != sent:
                r.publish(*sent)
                ss["_room_sent"] = sent
        return
    version = r.version()
    ss["room_following"] = version != 0 and not ss.get("room_detached")  # (version 0: no presenter has written yet)
    if not ss["room_following"] or (version == ss.get("room_seen") and not _behind()):
        return
    current = r.current()
    # Seen once this run has drawn the step's view (step_drawn): a run cut short (overtaken, its server process
    # killed) or one that stopped before the view (a run refused for now, an error) left part of the step unset or
    # unshown, and the next run, a push's or the page's own catch-up, takes the whole step again.
    ss["_room_taking"] = current["version"]
    lecture = room_lecture(current["lecture"])
    if lecture is None:  # the presenter's page validated it: nothing else is ever written
        return
    if ss.get("lecture", {}).get("steps") != lecture.steps:  # a copy: a page that explores may edit its own
        ss["lecture"] = {"title": lecture.title, "steps": copy.deepcopy(lecture.steps)}
    ss["lecture_name"] = current["name"] or None
    P.go(current["step"])


def _resume(r: Room) -> None:
    """A page that starts presenting (the presenter's link opened again, the projector's page reloaded) while the room
    holds a lecture takes it at the room's step, as a follower would, unless its link named a lecture of its own (a
    lecture link with the key: the presenter jumps there). Without this it would write what it opened by itself
    (nothing, or `serve --lecture`'s file at step 1) and send every student back."""
    ss = st.session_state
    current = r.current()
    lecture = room_lecture(current["lecture"]) if current else None
    if lecture is None or P.named_by_link():
        return
    ss["lecture"] = {"title": lecture.title, "steps": copy.deepcopy(lecture.steps)}
    ss["lecture_name"] = current["name"] or None
    P.go(current["step"])
    ss["_room_sent"] = (P.lecture_text(ss["lecture"]), ss.get("lecture_name") or "", ss.get("lecture_step", 0))


def step_drawn() -> None:
    """The page run drew its view and wrote its URL: the room's step it took is on the page, and the server's
    next rerun of the page (app/room_push.py) comes with that URL, as the browser's own would."""
    ss = st.session_state
    taken = ss.pop("_room_taking", None)
    if taken is not None:
        ss["room_seen"] = taken
    ss["_room_url"] = st.query_params.to_dict()
    r = room()
    if r is not None and listening() and room_push.available():
        _pushed_with(r, ss["_room_url"])


def listening() -> bool:
    """Whether the room moves this page: it follows, or it waits for the room's first step (opened before any
    presenter wrote one: it follows from that step on, as a page opened later does)."""
    ss = st.session_state
    return room() is not None and not is_presenter() and not ss.get("room_detached")


def _moved() -> bool:
    """Whether the room holds a step this page has not drawn (a waiting page has drawn version 0, the empty room),
    or this run came from a page that had not received the last drawn run (its widget values are older)."""
    ss = st.session_state
    return room().version() != (ss.get("room_seen") or 0) or bool(ss.get("room_following")) and _behind()


def _behind() -> bool:
    """Whether this run was asked for by a page that had not yet received the last drawn run (its URL is older):
    the widget values it carried are older too."""
    shown = st.session_state.get("_room_url")
    return shown is not None and st.query_params.to_dict() != shown


@functools.lru_cache(maxsize=4)
def room_lecture(text: str) -> L.Lecture | None:
    """The room's lecture, read once per process: every follower's page takes it at each step."""
    return P.parse(text)[0]


def _detach() -> None:
    ss = st.session_state
    if not ss.get("room_whole"):  # the parts above the step's, left out while following, are drawn now: without
        sections.request(ss.get("view"), ss.get("section"))  # landing again the step's part slid under the player
    ss.update(room_detached=True, room_following=False)


def _rejoin() -> None:
    st.session_state.update(room_detached=False, room_seen=None)


def _ask() -> None:
    """A follower's page (or one waiting for the room's first step) asks the room for its version and reruns when
    the presenter moved, when the run that took the current step did not draw its view, or when this run came from
    a page that had not received it (its widget values are the previous step's). Only in the fragment's own runs:
    in a page run, sync() has just asked, and that run's step is seen only once its view is drawn."""
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    ctx = get_script_run_ctx()
    if ctx is None or not ctx.fragment_ids_this_run:
        return
    if listening() and _moved():
        st.rerun(scope="app")


_ask_often = st.fragment(run_every=POLL_SECONDS)(_ask)
_ask_now_and_then = st.fragment(run_every=CATCH_UP_SECONDS)(_ask)


def _listen(r: Room, listens: bool) -> None:
    """A page the room moves (listening()) is rerun by the server when the room changes (app/room_push.py) and asks
    now and then itself, or asks often where the server cannot rerun it; any other page is neither. A page opened
    before the presenter's is one of them: nothing else would ever run it again when the lecture starts."""
    if not room_push.available():
        if listens:
            _ask_often()
        return
    if listens:  # the page's URL as this run found it, until step_drawn() gives the one this run writes
        _pushed_with(r, st.query_params.to_dict())
        _ask_now_and_then()
    else:
        _pushed_with(r, None)


def _pushed_with(r: Room, url: dict | None) -> None:
    """The server reruns this page with this URL when the room changes (app/room_push.py); None: never."""
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    ctx = get_script_run_ctx()
    if ctx is None:
        return
    if url is None:
        room_push.watcher(r).leave(ctx.session_id)
    else:
        room_push.watcher(r).follow(ctx.session_id, urlencode(url))


def part_only() -> bool:
    """Whether this page shows only the step's part of its view (app/sections.py's `only`): while it follows,
    until its visitor asks for whole views."""
    ss = st.session_state
    return bool(ss.get("room_following")) and not ss.get("room_whole")


def _whole(on: bool) -> None:
    st.session_state["room_whole"] = on


def rest_button() -> None:
    """Under the step's part of a view: what is left out, and the button that shows whole views."""
    st.caption(P.tr("room.part_only"))
    st.button(P.tr("room.show_rest"), key="room_rest", on_click=_whole, args=(True,))


def controls() -> None:
    """In the main area, in the player (under the step's caption) or where it would be: what this page is in the
    room, and the way out or back."""
    r, ss = room(), st.session_state
    if r is None:
        return
    if ss.get("room_key_stale") and not is_presenter():  # in the page's language, as every line of the page
        st.warning(P.tr("room.key_stale"))
    if is_presenter():
        st.caption(P.tr("room.presenting"))
    elif ss.get("room_following"):
        c1, c2 = st.columns([3, 1], vertical_alignment="center")
        c1.caption(P.tr("room.following"))
        c2.button(P.tr("room.detach"), key="room_detach", on_click=_detach, use_container_width=True)
        if ss.get("room_whole"):  # the way back to each step's part only
            st.button(P.tr("room.part_views"), key="room_part", on_click=_whole, args=(False,))
    elif ss.get("room_detached") and r.version():
        _rejoin_now_and_then()
    _listen(r, listening())


def _rejoin_button() -> None:
    """The way back for a visitor who explores, naming the step the room is at: redrawn now and then (a fragment's
    run, not the page's), so the button keeps up with the lecturer while its visitor looks elsewhere."""
    if not st.session_state.get("room_detached"):  # its click rejoined, in a run of this fragment alone
        st.rerun(scope="app")  # the whole page takes the room's step
    r = room()
    current = r.current() if r is not None else None
    lecture = room_lecture(current["lecture"]) if current else None
    label = (P.tr("room.rejoin_at", i=current["step"] + 1, n=len(lecture.steps)) if lecture is not None
             else P.tr("room.rejoin"))
    st.button(label, key="room_rejoin", on_click=_rejoin)


_rejoin_now_and_then = st.fragment(run_every=CATCH_UP_SECONDS)(_rejoin_button)
