"""Part of the gateway (app/gateway/__init__.py re-exports it): the lab's one worker process and its queue.

Pre/Post-Norm experiments run in a separate `spawn` process, one at a time, with torch's thread count set there
(explorer_model/lab/worker.py), never in the server; a waiting visitor sees their place in the queue. Finished
experiments go into the gateway's one result cache, and each one started counts as one model run.

The queue is bounded: one unfinished experiment per visitor (joining the same experiment somebody else started
is free), at most `lab_queue_cap()` waiting in the room; a refusal says so in one line (LabBusy). An experiment
still waiting whose visitors have all left (their Streamlit sessions ended) is cancelled before it runs.
"""
from __future__ import annotations

import multiprocessing
import os
import sys
import threading
import types
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict

from app.gateway import state as gateway_state
from app.gateway.lanes import LANE
from app.gateway.settings import lab_enabled
from explorer_model.lab import normlab as lab
from explorer_model.lab import worker


class LabJob:
    """One experiment in the lab worker: place in the queue, latest progress, result."""

    def __init__(self, key: tuple, future=None, result=None):
        self.key, self.future, self._result = key, future, result
        self.fraction, self.message, self.partial = 0.0, "", None
        self.visitors: set = set()  # the sessions waiting for it (None: a caller outside any page)

    def done(self) -> bool:
        return self.future is None or self.future.done()

    def position(self) -> int:
        """0 = running (or done), n = n experiments before this one."""
        with _LAB_LOCK:
            _drop_abandoned()
            waiting = [j for j in _LAB_JOBS if not j.done()]
        return waiting.index(self) if self in waiting else 0

    def result(self, timeout: float | None = None) -> dict:
        if self.future is not None and self._result is None:
            with LANE.released():  # other pages draw while this one waits for the worker
                self._result = self.future.result(timeout)
            _keep(self.key, self._result)
        return self._result

    def wait(self, on_update=None, every: float = 0.25) -> dict:
        """Block until done, calling on_update(job) every `every` seconds (for a queue message or live curves)."""
        while not self.done():
            if on_update:
                on_update(self)
            try:
                with LANE.released():
                    self.future.result(timeout=every)
            except TimeoutError:
                pass
        return self.result()


_LAB_LOCK = threading.Lock()
_LAB_JOBS: list[LabJob] = []
_LAB: dict = {}


def _lab_pool() -> tuple[ProcessPoolExecutor, object]:
    """The one worker process (started on first use; started again if it died)."""
    with _LAB_LOCK:
        if "pool" not in _LAB or getattr(_LAB["pool"], "_broken", False):
            ctx = multiprocessing.get_context("spawn")
            queue = ctx.Queue()
            pool = ProcessPoolExecutor(max_workers=1, mp_context=ctx, initializer=worker.init_worker, initargs=(queue,))
            # Streamlit runs the app script as __main__, and a spawned child imports __main__ again: it would run
            # the whole page in the worker. Start the worker with a bare __main__ instead.
            main = sys.modules["__main__"]
            sys.modules["__main__"] = types.ModuleType("__main__")
            try:
                pool.submit(worker.worker_threads).result()
            finally:
                sys.modules["__main__"] = main
            _LAB.update(pool=pool, queue=queue, next=_LAB.get("next", 0))
            threading.Thread(target=_read_progress, args=(queue,), daemon=True, name="lab-progress").start()
        return _LAB["pool"], _LAB["queue"]


def _read_progress(queue) -> None:
    while True:
        try:
            job_id, fraction, message, partial = queue.get()
        except (EOFError, OSError):
            return
        with _LAB_LOCK:
            job = next((j for j in _LAB_JOBS if getattr(j, "id", None) == job_id), None)
        if job is not None:
            job.fraction, job.message, job.partial = fraction, message, partial


class LabDisabled(RuntimeError):
    """The server was started with --no-lab: experiments not computed yet are not run."""


class LabBusy(RuntimeError):
    """Not queued: this visitor has an experiment waiting or running, or the room's queue is full. `key` and
    `values` give the one line in the visitor's language (i18n.error_text)."""

    def __init__(self, key: str, **values):
        self.key, self.values = key, values
        super().__init__(key)


def lab_queue_cap() -> int:
    """Experiments the room may have waiting or running at once: LLAMA_EXPLORER_LAB_QUEUE, by default 8."""
    value = os.environ.get("LLAMA_EXPLORER_LAB_QUEUE", "")
    return max(1, int(value)) if value.isdigit() else 8


def visitor() -> str | None:
    """The Streamlit session of the page asking (None outside a page run)."""
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    ctx = get_script_run_ctx(suppress_warning=True)
    return None if ctx is None else ctx.session_id


def session_alive(session_id: str | None) -> bool:
    """Whether a visitor's session is still open (its browser tab connected); True when it cannot be known."""
    from streamlit import runtime

    if session_id is None or not runtime.exists():
        return True
    return runtime.get_instance().is_active_session(session_id)


def _drop_abandoned() -> None:
    """Cancel waiting experiments nobody waits for any more (called holding _LAB_LOCK). One that has started in
    the worker cannot be cancelled and finishes (its result is cached for the next visitor)."""
    for job in _LAB_JOBS:
        if not job.done() and job.visitors and not any(session_alive(v) for v in job.visitors):
            job.future.cancel()
    _LAB_JOBS[:] = [j for j in _LAB_JOBS if not j.done()]


def _submit(key: tuple, fn, *args, cache: bool = True) -> LabJob:
    hit = gateway_state.result_cache().peek(key) if cache else None
    if hit is not None:
        return LabJob(key, result=hit)
    if not lab_enabled():
        raise LabDisabled("the lab's experiments are switched off on this server")
    pool, _ = _lab_pool()
    me = visitor()
    with _LAB_LOCK:
        _drop_abandoned()
        same = next((j for j in _LAB_JOBS if j.key == key), None)  # somebody asked for it already: wait for theirs
        if same is not None:
            same.visitors.add(me)
            return same
        if me is not None and any(me in j.visitors for j in _LAB_JOBS):
            raise LabBusy("lab.one_each")
        if len(_LAB_JOBS) >= lab_queue_cap():
            raise LabBusy("lab.queue_full", n=len(_LAB_JOBS))
        job = LabJob(key)
        job.visitors.add(me)
        job.id = _LAB["next"] = _LAB["next"] + 1
        job.future = pool.submit(fn, job.id, *args)
        _LAB_JOBS.append(job)

    gateway_state._forward()  # one model run (in the worker) per experiment started
    job.future.add_done_callback(lambda fut: fut.exception() is None and _keep(key, fut.result()))
    return job


def _keep(key: tuple, r: dict) -> None:
    """Cache a finished experiment (a race cut off by its time limit is not the experiment's result)."""
    if r.get("completed", True) and gateway_state.result_cache().peek(key) is None:
        gateway_state.result_cache().put(key, r)


def lab_init_gradients(options: lab.LabOptions, depth: int) -> LabJob:
    """Gradients at initialization for these options (cached per options and depth, computed once per server)."""
    return _submit(("lab_init", tuple(asdict(options).items()), int(depth)), worker.run_init_gradients,
                   asdict(options), int(depth))


def lab_race(config: lab.RaceConfig, time_limit: float | None) -> LabJob:
    """The training race (deterministic per config: a completed race is cached)."""
    return _submit(("lab_race", tuple(asdict(config).items())), worker.run_race, asdict(config), time_limit)


def lab_worker_threads() -> int:
    """torch's thread count inside the lab worker (1); the server's own count is never changed."""
    pool, _ = _lab_pool()
    return pool.submit(worker.worker_threads).result()


def lab_queue_length() -> int:
    with _LAB_LOCK:
        _drop_abandoned()
        return sum(not j.done() for j in _LAB_JOBS)
