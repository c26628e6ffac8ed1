"""The lab's worker process: the app runs every Pre/Post-Norm experiment here, one at a time.

torch's thread count is process-wide. A server that set it for an experiment would slow every other
visitor's forward pass (and two overlapping experiments could leave it at one thread for good), so the
experiments run in a separate process started with `spawn`, whose initializer sets one thread there
(fastest for models this small, and sums in a fixed order). Progress goes back through a queue as
(job id, fraction, message, partial result).
"""
from __future__ import annotations

import functools
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


@functools.lru_cache(maxsize=4096)
def kept_probe(variant: str, depth: int, opts: lab.LabOptions, seed: int) -> dict:
    """One probe of the init experiment, kept for the worker's life (a few hundred bytes): experiments that share a
    (variant, depth, options, seed) compute it once. The depth sweep does not depend on the depth slider, so a new
    depth computes only its own profile. A kept result is the one a new run would give: the same seeded model and
    tokens, the same operations in the same order on this process's one thread. Read it only."""
    return lab.probe(variant, depth, opts, seed)


def run_init_gradients(job: int, options: dict, depth: int) -> dict:
    opts = lab.LabOptions(**options)
    return lab.init_gradients(opts, depth=depth, progress=lambda f, msg: _report(job, f, msg), probe_fn=kept_probe)


def run_race(job: int, config: dict, time_limit: float | None) -> dict:
    rc = lab.RaceConfig(**config)

    def live(r: dict) -> None:
        _report(job, min(1.0, r["steps"][-1] / rc.steps), f"step {r['steps'][-1]}",
                {**r, "steps": list(r["steps"]), "curves": {k: list(v) for k, v in r["curves"].items()}})
    return lab.race(rc, time_limit=time_limit, on_log=live)


