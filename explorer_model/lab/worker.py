"""The lab's worker process: the app runs every Pre/Post-Norm experiment here, one at a time.

torch's thread count is process-wide. A server that set it for an experiment would slow every other
visitor's forward pass (and two overlapping experiments could leave it at one thread for good), so the
experiments run in a separate process started with `spawn`, whose initializer sets one thread there
(fastest for models this small, and sums in a fixed order). Progress goes back through a queue as
(job id, fraction, message, partial result).
"""
from __future__ import annotations

from contextlib import ExitStack

import torch

from . import normlab as lab

_QUEUE = None
_PROCESS = ExitStack()  # contexts held for the worker process's whole life


def init_worker(queue) -> None:
    """ProcessPoolExecutor initializer: runs once in the worker process, never in the server."""
    global _QUEUE
    _QUEUE = queue
    _PROCESS.enter_context(lab.threads(1))  # this process only: entered once, never left


def _report(job: int, fraction: float, message: str, partial=None) -> None:
    if _QUEUE is not None:
        _QUEUE.put((job, fraction, message, partial))


def worker_threads() -> int:
    """torch's thread count inside the worker (tests check it is 1 there and untouched in the server)."""
    return torch.get_num_threads()


def run_init_gradients(job: int, options: dict, depth: int) -> dict:
    opts = lab.LabOptions(**options)
    return lab.init_gradients(opts, depth=depth, progress=lambda f, msg: _report(job, f, msg))


def run_race(job: int, config: dict, time_limit: float | None) -> dict:
    rc = lab.RaceConfig(**config)

    def live(r: dict) -> None:
        _report(job, min(1.0, r["steps"][-1] / rc.steps), f"step {r['steps'][-1]}",
                {**r, "steps": list(r["steps"]), "curves": {k: list(v) for k, v in r["curves"].items()}})
    return lab.race(rc, time_limit=time_limit, on_log=live)


