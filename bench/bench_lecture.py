"""How long a lecture step takes to open: every step of a shipped lecture through the page (AppTest, the whole
script run: the lesson, the view, its figures), first with nothing cached, then again with every recording cached.

    python bench/bench_lecture.py [tutorial-000|tutorial-001]
"""
from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/ modules, imported or run
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from machine import machine_line  # noqa: E402


def pass_times(at, n: int) -> list[float]:
    times = []
    for _ in range(n - 1):
        t0 = time.perf_counter()
        at.button(key="lecture_next").click().run(timeout=600)
        times.append(time.perf_counter() - t0)
        assert not at.exception, at.exception
    return times


def main() -> None:
    print(machine_line(), flush=True)
    from apptest_util import run_app

    name = sys.argv[1] if len(sys.argv) > 1 else "tutorial-000"
    at = run_app(timeout=600, lecture=name, step=1, presenter=1)
    n = len(at.session_state["lecture"]["steps"])
    for label in ("first pass (recordings computed)", "second pass (recordings cached)"):
        times = pass_times(at, n)
        print(f"{name} {label}: {n - 1} steps, median {statistics.median(times):.2f} s, "
              f"p90 {sorted(times)[int(0.9 * (len(times) - 1))]:.2f} s, max {max(times):.2f} s", flush=True)
        at = run_app(timeout=600, lecture=name, step=1, presenter=1)  # a new visitor; the server's cache stays


if __name__ == "__main__":
    main()
