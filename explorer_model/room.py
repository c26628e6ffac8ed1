"""The room of a shared server: which lecture the presenter shows and at which step, kept in SQLite (WAL mode) so
every server process of `serve --processes N` reads the same state and a restarted process finds it again.

One row: a version that grows with every change, the lecture's TOML text, its shipped name (or ""), the step.
Readers poll `version()` (one indexed read) and fetch the row only when it changed. Pure: no Streamlit; whether a
page may write is decided by the app (app/room_follow.py checks the presenter's key).
"""
from __future__ import annotations

import os
import sqlite3
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path

ROOM_DB_ENV = "LLAMA_EXPLORER_ROOM_DB"  # set by `serve --share`
ROOM_KEY_ENV = "LLAMA_EXPLORER_ROOM_KEY"

SCHEMA = ("CREATE TABLE IF NOT EXISTS room (id INTEGER PRIMARY KEY CHECK (id = 1), version INTEGER NOT NULL, "
          "lecture TEXT NOT NULL, name TEXT NOT NULL, step INTEGER NOT NULL)")


def runtime_dir(port: int) -> Path:
    """The shared server's folder for state that outlives a process: one per port, private to this user."""
    base = Path(os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir())
    d = base / f"llama-explorer-{os.getuid() if hasattr(os, 'getuid') else 'user'}-{port}"
    d.mkdir(mode=0o700, exist_ok=True)
    return d


class Room:
    """One connection per process, shared by its threads under a lock: Streamlit runs every page run in a thread of
    its own, so a connection per thread would be opened again (file, WAL, schema) at every run of every page. Each
    use is one short statement or, for `publish`, one short transaction; a reader sees every commit made before
    its statement (autocommit: each statement is its own read transaction)."""

    def __init__(self, path: str | Path):
        self.path = str(path)
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._pid = 0

    @contextmanager
    def _db(self):
        with self._lock:
            if self._conn is None or self._pid != os.getpid():  # (a forked child opens its own)
                db = sqlite3.connect(self.path, timeout=5, isolation_level=None, check_same_thread=False)
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=NORMAL")
                db.execute(SCHEMA)
                self._conn, self._pid = db, os.getpid()
            yield self._conn

    def version(self) -> int:
        with self._db() as db:
            row = db.execute("SELECT version FROM room WHERE id = 1").fetchone()
        return row[0] if row else 0

    def current(self) -> dict | None:
        with self._db() as db:
            row = db.execute("SELECT version, lecture, name, step FROM room WHERE id = 1").fetchone()
        return None if row is None else {"version": row[0], "lecture": row[1], "name": row[2], "step": row[3]}

    def publish(self, lecture: str, name: str, step: int) -> int:
        """Set the room's lecture and step; the version grows only when something changed. Returns the version."""
        with self._db() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                row = db.execute("SELECT version, lecture, name, step FROM room WHERE id = 1").fetchone()
                if row is None:
                    db.execute("INSERT INTO room VALUES (1, 1, ?, ?, ?)", (lecture, name, step))
                    version = 1
                elif (row[1], row[2], row[3]) != (lecture, name, step):
                    version = row[0] + 1
                    db.execute("UPDATE room SET version = ?, lecture = ?, name = ?, step = ? WHERE id = 1",
                               (version, lecture, name, step))
                else:
                    version = row[0]
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
            return version

    def clear(self) -> None:
        with self._db() as db:
            db.execute("DELETE FROM room")
