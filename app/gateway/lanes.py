"""Part of the gateway: who runs Python at the same time in the server process.

Every page run is a thread of this one process, and Python lets one thread at a time run Python code (the GIL).
A forward pass is a few thousand torch calls; each gives the GIL up and must win it back, waiting out the time
slice of whichever thread runs Python meanwhile. Recording 35 tokens took 0.16 s alone, 8.7 s beside ONE thread
drawing figures at Python's default 5 ms slice, and 115 s beside four (bench/bench_gil.py); a classroom's new
prompts queued behind each other for seconds. So:
  - one page run draws at a time (the drawing lane, held for a whole page run, handed over in arrival order:
    a plain lock lets the thread that just released it take it again, and a page waiting to start a forward
    pass waited seconds); drawing is Python, which runs one thread at a time anyway;
  - a page run gives the lane up while it waits for or runs a forward pass, or waits for a lab experiment,
    so other visitors' pages draw meanwhile, and the forward pass competes with one drawing thread at most;
    likewise while it computes a view's data from a recording (gateway.derived: array work that leaves the GIL
    free most of the time; bench_load.py --think 10, one process: a new prompt's p95 went from 1.44-1.90 s in
    four runs to 1.14-1.36 s in three, a view switch's from 1.42-1.87 s to 1.17-1.59 s);
    it then takes the lane back ahead of the pages that arrived meanwhile (it had waited its turn already:
    at the back of the line, a page whose view runs the model paid the whole queue twice);
  - while a thread runs such work (a forward pass, a view's array work), the interpreter switches threads every
    0.1 ms instead of every 5 ms: beside one drawing thread that recording took 0.39 s instead of 8.7 s (at 1 ms:
    1.6 s), and the drawing thread lost 12 % of its speed. When none does, Python's own 5 ms stands: thirty
    followers' pages reaching a lecture step together are all Python, and forced switches among them every
    0.1 ms only cost (bench_load.py --lecture: the server's CPU per step, see docs/benchmarks.md).
"""
from __future__ import annotations

import sys
import threading
from collections import deque
from contextlib import contextmanager

SWITCH_INTERVAL_S = 0.0001
PYTHON_SWITCH_INTERVAL_S = 0.005  # Python's default


class FifoLock:
    """A lock handed to its waiters in the order they asked (each waiter blocks on a lock of its own)."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._waiters: deque[threading.Lock] = deque()
        self._owned = False

    def acquire(self, blocking: bool = True, first: bool = False) -> bool:
        """first: wait at the front of the line instead of the back (a holder coming back)."""
        with self._mutex:
            if not self._owned:
                self._owned = True
                return True
            if not blocking:
                return False
            turn = threading.Lock()
            turn.acquire()
            (self._waiters.appendleft if first else self._waiters.append)(turn)
        turn.acquire()  # released by the owner before us: the lock is ours, passed on without a gap
        return True

    def queue_length(self) -> int:
        """The holder and those waiting."""
        with self._mutex:
            return int(self._owned) + len(self._waiters)

    def release(self) -> None:
        with self._mutex:
            if self._waiters:
                self._waiters.popleft().release()
            else:
                self._owned = False


class DrawingLane:
    """A lock held by at most one page run; per-thread state so `released()` is a no-op where it is not held."""

    def __init__(self) -> None:
        self._lock = FifoLock()
        self._local = threading.local()

    def holding(self) -> bool:
        return getattr(self._local, "held", False)

    def pages(self) -> int:
        """Page runs drawing or waiting to draw."""
        return self._lock.queue_length()

    @contextmanager
    def held(self):
        """Around a whole page run (app/main.py)."""
        if self.holding():  # a nested page run in one thread (AppTest runs scripts in the caller's thread)
            yield
            return
        self._lock.acquire()
        self._local.held = True
        try:
            yield
        finally:
            self._local.held = False
            self._lock.release()

    @contextmanager
    def released(self):
        """Around a wait that needs no drawing: the forward lock, a lab experiment. The lane comes back at the
        front of the line."""
        if not self.holding():
            yield
            return
        self._local.held = False
        self._lock.release()
        try:
            yield
        finally:
            self._lock.acquire(first=True)
            self._local.held = True


class ForwardLock:
    """The gateway's one forward lock (re-entrant), which gives the drawing lane up while waiting and running."""

    def __init__(self, lane: DrawingLane) -> None:
        self._lock = threading.RLock()
        self._lane = lane
        self._local = threading.local()
        self._wanted = 0  # threads running a forward pass or waiting for one
        self._count_lock = threading.Lock()

    def wanted(self) -> int:
        return self._wanted

    def __enter__(self):
        if getattr(self._local, "depth", 0) == 0:
            with self._count_lock:
                self._wanted += 1
            self._local.released = self._lane.released()
            self._local.released.__enter__()
        self._lock.acquire()
        self._local.depth = getattr(self._local, "depth", 0) + 1
        if self._local.depth == 1:
            SWITCHES.enter()
        return self

    def __exit__(self, *exc) -> None:
        if self._local.depth == 1:
            SWITCHES.leave()
        self._lock.release()
        self._local.depth -= 1
        if self._local.depth == 0:
            with self._count_lock:
                self._wanted -= 1
            self._local.released.__exit__(None, None, None)


class Flights:
    """One computation of a key at a time. Thirty followers' pages reach a new lecture step together and ask for
    the same view data and figures: without this each would compute them; with it the first computes and the
    others wait for it and find the result cached (result_cache.get checks again after taking the lock). A page
    waits for a key with the drawing lane given up: the page computing it may need the lane to finish."""

    def __init__(self, lane: DrawingLane) -> None:
        self._lane = lane
        self._mutex = threading.Lock()
        self._keys: dict[object, list] = {}  # key -> [its lock, how many hold or wait for it]

    @contextmanager
    def one(self, key):
        with self._mutex:
            entry = self._keys.setdefault(key, [threading.Lock(), 0])
            entry[1] += 1
        lock = entry[0]
        try:
            if not lock.acquire(blocking=False):
                with self._lane.released():
                    lock.acquire()
            try:
                yield
            finally:
                lock.release()
        finally:
            with self._mutex:
                entry[1] -= 1
                if not entry[1]:
                    del self._keys[key]


class QuickSwitches:
    """Threads switch every SWITCH_INTERVAL_S while at least one thread runs work that gives the GIL up at every
    torch or numpy call (see the module docstring), every PYTHON_SWITCH_INTERVAL_S otherwise. The interval is
    process-wide and cheap to set (unlike a torch thread count)."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._running = 0

    def enter(self) -> None:
        with self._mutex:
            self._running += 1
            if self._running == 1:
                sys.setswitchinterval(SWITCH_INTERVAL_S)

    def leave(self) -> None:
        with self._mutex:
            self._running -= 1
            if self._running == 0:
                sys.setswitchinterval(PYTHON_SWITCH_INTERVAL_S)

    def running(self) -> int:
        return self._running

    @contextmanager
    def during(self):
        self.enter()
        try:
            yield
        finally:
            self.leave()


SWITCHES = QuickSwitches()
LANE = DrawingLane()
FLIGHTS = Flights(LANE)
