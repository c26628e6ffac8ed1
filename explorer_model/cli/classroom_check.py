"""`llama-explorer classroom-check`: will this machine hold a class? It starts a private server on loopback (a free
port, the shared mode a classroom uses), drives it for about a minute with simulated students (the load bench's
visitors, explorer_model/cli/loadtest.py), and answers from that run: the p95 a student waits for a new prompt and for
a view switch, an estimate of how many students the machine serves within 3 s / 1.5 s, whether `serve --processes
2` would help, and the memory the server needed. Nothing is left running afterwards: the server runs in its own
process group, which is killed on the way out whatever happened.

The estimate extrapolates from what the run measured, and says so. A server process draws one page at a time
(app/gateway/lanes.py), so one process gives the class at most one core for drawing: at utilisation u the mean queue
multiplies an action's time by 1 / (1 - u), and the p95 of such a wait is about ln(20) = 3 times its mean. A kind
of action whose own time is s stays within a target T while 3·s / (1 - u) <= T, so u <= 1 - 3·s / T; the
students served are then cores · u / (server CPU per action × actions per student per second). s is the kind's
lower-quartile latency in the run: an action that met little queue (the median already carries the run's own
queueing, which would make a busy run judge itself twice).
"""
from __future__ import annotations

import argparse
import asyncio
import math
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

from explorer_model.cli import loadtest as L

P95_FACTOR = math.log(20)  # p95 / mean of an exponential wait
TARGETS = {"new_prompt": 3.0, "switch": 1.5}  # seconds a student may wait, new prompt and view switch
SWITCHES = ("switch_view", "switch_layer", "switch_head")
ACTIONS_PER_PROMPT = 6  # a new prompt and five switches (loadtest.visitor_run)


class ProgressBar(threading.Thread):
    """A text bar on stderr, redrawn twice a second from the actions the students have completed."""

    def __init__(self, planned: int, times: dict, stream=sys.stderr, width: int = 30):
        super().__init__(daemon=True)
        self.planned, self.times, self.stream, self.width = max(1, planned), times, stream, width
        self._halt, self.t0 = threading.Event(), time.monotonic()

    def line(self) -> str:
        done = sum(len(v) for k, v in list(self.times.items()) if k in L.ACTIONS)
        filled = min(self.width, self.width * done // self.planned)
        return (f"\r[{'#' * filled}{'.' * (self.width - filled)}] {done}/{self.planned} "
                f"{time.monotonic() - self.t0:4.0f} s")

    def run(self) -> None:
        while not self._halt.wait(0.5):
            self.stream.write(self.line())
            self.stream.flush()

    def stop(self) -> None:
        self._halt.set()
        self.join()
        self.stream.write(self.line() + "\n")
        self.stream.flush()


def utilisation_within(own_s: float, target_s: float) -> float:
    """Highest server utilisation at which an action taking `own_s` alone keeps its p95 within `target_s`."""
    return max(0.0, 1.0 - P95_FACTOR * own_s / target_s)


def verdict(times: dict, cpu_s: float, load_s: float, students: int, peak_rss_mb: float, cores: int) -> dict:
    """Everything the answer states, computed from one run's recorded latencies and server counters."""
    done = sum(len(times[a]) for a in L.ACTIONS)
    switches = [x for k in SWITCHES for x in times[k]]
    groups = {"new_prompt": times["new_prompt"], "switch": switches}
    p95 = {g: round(L.percentile(xs, 95), 3) if xs else None for g, xs in groups.items()}
    own = {g: L.percentile(xs, 25) if xs else None for g, xs in groups.items()}  # an action's own time (see above)
    per_action = cpu_s / max(1, done)
    rate = done / max(1e-9, students * load_s)  # actions per student per second
    busy = cpu_s / max(1e-9, load_s)

    def served(processes: int) -> dict:
        usable = min(processes, cores)  # one process draws one page at a time: one core each
        out = {}
        for g, target in TARGETS.items():
            u = utilisation_within(own[g], target) if own[g] is not None else 0.0
            out[g] = int(usable * u / max(1e-9, per_action * rate))
        return {"within_3s_new_prompt": out["new_prompt"], "within_1.5s_switch": out["switch"],
                "students": min(out.values())}

    one, two = served(1), served(2)
    # Two processes help when there is a second core to use and the one process was the limit: it kept about one
    # core busy (page runs queue behind each other, whatever the other cores do) and waits exceeded a target.
    slow = any(p95[g] is not None and p95[g] > TARGETS[g] for g in TARGETS)
    helps = cores >= 2 and ((two["students"] > one["students"] and (busy >= 0.7 or slow or one["students"] < students))
                            or (slow and busy >= 0.7))
    return {"actions": done, "load_seconds": round(load_s, 1), "p95_s": p95,
            "own_time_s": {g: round(m, 3) if m is not None else None for g, m in own.items()},
            "server_cpu": {"seconds": round(cpu_s, 2), "per_action_s": round(per_action, 4),
                           "cores_busy": round(busy, 2)},
            "actions_per_student_per_s": round(rate, 4), "cores": cores, "targets_missed": slow,
            "estimate_one_process": one, "estimate_two_processes": two, "processes_2_helps": helps,
            "peak_rss_mb": round(peak_rss_mb)}


def run_check(students: int = 30, pace: float = 10.0, duration: float = 60.0, model: str | None = None,
              progress: bool = True, timeout: float = 120.0) -> dict:
    """Start the server, drive it, stop it; the report (verdict, the run's settings and its raw latencies)."""
    prompts = max(1, round(duration / (ACTIONS_PER_PROMPT * pace)))
    ramp = min(pace, duration / 4)
    args = argparse.Namespace(seed=0, ramp=ramp, think=pace, timeout=timeout, processes=1, prompt_chars=0,
                              views="", model=model, prompts=prompts, visitors=students)
    tmp = Path(tempfile.mkdtemp(prefix="classroom_check_"))
    port = L.free_port()
    proc = L.start_server(port, None, None, tmp / "server.log")
    report: dict = {"students": students, "pace_s": pace, "prompts_each": prompts, "model": model or "smollm2",
                    "server_pid": proc.pid}
    sampler = L.MemorySampler([proc.pid])
    sampler.start()
    bar = None
    try:
        L.wait_healthy(port, proc)
        report["first_page_s"] = round(asyncio.run(_first_page(port, timeout, model)), 2)
        meter = L.CpuMeter(proc.pid)
        times = {a: [] for a in L.ACTIONS}
        errors: list = []
        if progress:
            bar = ProgressBar(students * (1 + ACTIONS_PER_PROMPT * prompts), times)
            bar.start()
        t0, cpu0 = time.monotonic(), meter.read()
        # every student types all its prompts (their number follows from duration and pace); the deadline only
        # bounds a run whose server stopped answering
        asyncio.run(_drive(port, args, times, errors, t0 + 3 * duration + ramp + timeout))
        load_s, cpu_s = time.monotonic() - t0, meter.read() - cpu0
    finally:
        if bar is not None:
            bar.stop()
        sampler.stop()
        L.stop_server(proc)
        log = (tmp / "server.log").read_text(errors="replace") if (tmp / "server.log").exists() else ""
        shutil.rmtree(tmp, ignore_errors=True)
    report.update(verdict(times, cpu_s, load_s, students, sampler.peak["total"] / 1024,
                          len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))
    report["errors"] = len(errors)
    report["error_examples"] = errors[:5]
    report["server_log_tracebacks"] = log.count("Traceback")
    report["latencies_s"] = {a: [round(x, 4) for x in times[a]] for a in L.ACTIONS}
    return report


async def _first_page(port: int, timeout: float, model: str | None) -> float:
    """The teacher opens the page first: the server loads its model once, before the students arrive."""
    from urllib.parse import urlencode

    v = L.Visitor(port, timeout)
    await v.connect()
    try:
        dt, problems = await v.rerun(urlencode({"view": "tokens", **({"model": model} if model else {})}))
    finally:
        await v.close()
    if problems:
        raise RuntimeError(f"the first page failed: {problems[0]}")
    return dt


async def _drive(port: int, args, times: dict, errors: list, deadline: float) -> None:
    import logging

    logging.getLogger("streamlit").setLevel(logging.ERROR)  # the view list is imported here, outside any page run
    from app.panels import VIEWS

    views = [x[0] for x in VIEWS]
    await asyncio.gather(*[L.visitor_run(n, port, L.make_prompts(n, args.prompts, args.seed), views, args, deadline,
                                         times, errors) for n in range(args.visitors)])


def default_lang(environ=os.environ) -> str:
    """zh when the environment's locale is Chinese (LC_ALL, LC_MESSAGES or LANG), else en."""
    for name in ("LC_ALL", "LC_MESSAGES", "LANG"):
        if environ.get(name):
            return "zh" if environ[name].lower().startswith("zh") else "en"
    return "en"


def answer(report: dict, lang: str) -> str:
    """The one paragraph a lecturer reads, in their language, every number taken from `report`."""
    from app.i18n import t

    one, two = report["estimate_one_process"], report["estimate_two_processes"]
    seconds = lambda x: "–" if x is None else f"{x:.1f}"  # noqa: E731
    text = t("classroom_check.answer", lang, seconds=f"{report['load_seconds']:.0f}", students=report["students"],
             pace=f"{report['pace_s']:g}", actions=report["actions"], p95_prompt=seconds(report["p95_s"]["new_prompt"]),
             p95_switch=seconds(report["p95_s"]["switch"]),
             cpu=f"{report['server_cpu']['per_action_s']:.2f}", busy=f"{report['server_cpu']['cores_busy']:.2f}",
             served=one["students"], served_prompt=one["within_3s_new_prompt"],
             served_switch=one["within_1.5s_switch"], rss=report["peak_rss_mb"])
    if report["processes_2_helps"]:
        text += " " + t("classroom_check.p2_helps", lang, cores=report["cores"], served2=two["students"])
    elif report["targets_missed"]:
        slowest = max(TARGETS, key=lambda g: (report["own_time_s"][g] or 0) / TARGETS[g])
        text += " " + t("classroom_check.too_slow", lang, own=seconds(report["own_time_s"][slowest]),
                        target=f"{TARGETS[slowest]:g}")
    elif report["cores"] < 2:
        text += " " + t("classroom_check.p2_one_core", lang)
    else:
        text += " " + t("classroom_check.p2_not_needed", lang)
    if report["errors"]:
        first = report["error_examples"][0].get("problem", "") if report["error_examples"] else ""
        text += " " + t("classroom_check.errors", lang, n=report["errors"], first=first[:160])
    return text
