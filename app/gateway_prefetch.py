"""Part of the gateway: what a visitor's next view will probably ask the model for, done while nobody waits.

With one server process a classroom's slowest view switches were the first visits of views that run the model
for a new prompt (the logit lens, SwiGLU's changed-token recording): each queued behind other visitors' passes
for the one forward lock. After a page is drawn, its prompt's likely next requests are queued here (newest
first, a few at most) and one background thread runs them when no forward pass is running or waiting and no page
is drawing, through the ordinary gateway calls, so the results land in the one result cache and a later visit
finds them. A visitor's own pass arriving meanwhile waits at most for the one prefetch that is running.
Only in processes `serve` started (explorer.warm_up_enabled()): AppTest and the tests keep their own counts.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Callable

from app import explorer as gw

MAX_QUEUED = 6  # the newest pages' jobs; older ones are dropped (their visitors have moved on)
IDLE_POLL_S = 0.02
log = logging.getLogger("llama_explorer.prefetch")

_jobs: deque[Callable[[], object]] = deque(maxlen=MAX_QUEUED)
_wake = threading.Condition()
_worker: dict = {"thread": None}


def prefetch(*jobs: Callable[[], object]) -> None:
    """Queue zero-argument gateway calls (each cached by the gateway: one already done costs a lookup)."""
    if not jobs or not gw.warm_up_enabled():
        return
    with _wake:
        for job in reversed(jobs):  # the first named runs first
            _jobs.appendleft(job)
        if _worker["thread"] is None:
            _worker["thread"] = threading.Thread(target=_run, daemon=True, name="prefetch")
            _worker["thread"].start()
        _wake.notify()


def idle() -> bool:
    """No forward pass running or waiting, no page drawing or waiting to draw."""
    return gw.forwards_ahead() == 0 and gw.pages_ahead() == 0


def _run() -> None:
    while True:
        with _wake:
            while not _jobs:
                _wake.wait()
            job = _jobs.popleft()
        while not idle():
            time.sleep(IDLE_POLL_S)
        try:
            job()
        except Exception:  # a prompt that cannot be recorded here: the visitor's own request will say why
            log.info("prefetch failed", exc_info=True)


def queued() -> int:
    with _wake:
        return len(_jobs)
