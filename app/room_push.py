"""A follower's page reruns when the presenter moves, at the server's request: one thread per server process
watches the room's version (explorer_model/room.py: one indexed SQLite read every WATCH_SECONDS) and, when it
changes, asks every following page of this process for a rerun, the way Streamlit's run-on-save asks a page to
rerun when its script changed.

Why not each page asking the room: a page's question is a script run (a fragment's run_every), about 10 ms of the
server's CPU whether or not anything moved, so thirty followers asking twice a second kept half a core busy and
still saw a step up to half a second late. One watcher per process costs a read per tick, and a page hears of a
step within a tick. The rerun asked for is the page's own: its last URL and no widget change; what it then shows
is decided by room_follow.sync() in that run, which reads the room and never writes it.

Only where Streamlit's runtime serves the page (not in AppTest): `available()` says whether pages can be reached
this way; room_follow falls back to the page asking.
"""
from __future__ import annotations

import logging
import threading

from explorer_model.room import Room

WATCH_SECONDS = 0.1
log = logging.getLogger("llama_explorer.room")


def available() -> bool:
    from streamlit import runtime

    return runtime.exists() and hasattr(runtime.get_instance(), "get_app_session")


class Watcher:
    """This process's following pages ({session id: the query string of its URL}) and the thread that reruns them
    when the room's version changes (`tick`, every `every` seconds once a page follows)."""

    def __init__(self, room: Room, rerun, every: float = WATCH_SECONDS):
        self.room, self._rerun, self.every = room, rerun, every
        self.pages: dict[str, str] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._seen = self._version()

    def follow(self, session_id: str, query: str) -> None:
        with self._lock:
            self.pages[session_id] = query
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, daemon=True, name="room-watch")
                self._thread.start()

    def leave(self, session_id: str) -> None:
        with self._lock:
            self.pages.pop(session_id, None)

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(self.every):
            self.tick()

    def tick(self) -> None:
        """Rerun every following page if the room changed since the last tick; forget the pages that are gone."""
        version = self._version()
        if version is None or version == self._seen:
            return
        self._seen = version
        with self._lock:
            pages = list(self.pages.items())
        for session_id, query in pages:
            if not self._rerun(session_id, query):
                self.leave(session_id)

    def _version(self) -> int | None:
        try:
            return self.room.version()
        except Exception:  # a locked or vanished file: the next tick reads again
            log.info("reading the room failed", exc_info=True)
            return None


def rerun_page(session_id: str, query: str) -> bool:
    """Ask the session for a page run with this URL and no widget change (on the server's event loop, where the
    session's methods run); False when the session has ended, or when no server runs the pages (AppTest runs a
    page without one)."""
    from streamlit import runtime
    from streamlit.proto.ClientState_pb2 import ClientState

    if not runtime.exists():
        return False
    server = runtime.get_instance()
    session = server.get_app_session(session_id)
    if session is None:
        return False
    server.stopped.get_loop().call_soon_threadsafe(session.request_rerun, ClientState(query_string=query))
    return True


_WATCHERS: dict[str, Watcher] = {}
_WATCHERS_LOCK = threading.Lock()


def watcher(room: Room) -> Watcher:
    """The process's one watcher of this room file."""
    with _WATCHERS_LOCK:
        if room.path not in _WATCHERS:
            _WATCHERS[room.path] = Watcher(room, rerun_page)
        return _WATCHERS[room.path]
