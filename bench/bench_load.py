"""Classroom load: N simulated visitors on one shared server, spoken to over Streamlit's own websocket.
(The visitors, and starting and watching the server, are in explorer_model/cli/loadtest.py, which `llama-explorer
classroom-check` drives too; the run and its report are here, the determinism check in load_determinism.py.)

Per visitor: open the page, then for each of its prompts (all different, 10-60 tokens): type the prompt,
switch view, layer, head, view, layer, with a random pause ("think time") between actions.
An error is an exception element or an st.error on the page, a run that did not finish successfully, a
page whose URL state disagrees with what was asked, a dropped connection, or no answer within --timeout.
The server's memory is its process tree's, a mapped file's pages counted once (explorer_model/cli/loadtest.py's
memory_kb), read from /proc every 0.2 s; it must stay under
model weights + the recording-cache bound (--cache-mb) + a fixed overhead (--overhead-mb, see OVERHEAD_MB).

Determinism is checked apart from the server: the same prompt recorded in several threads at once (plain
`record` calls, and through app.gateway.result_cache.ResultCache with a zero budget so each get recomputes), and in
two separate `llama-explorer record` processes; every tensor must be bit-identical.

With --processes N (N > 1) the server is `llama-explorer serve --share --processes N`: HAProxy with docs/haproxy.cfg
in front of N app processes (each its own model and cache and its share of the cores' torch threads, reported); the visitors load the page
first to get the balancer's cookie, memory is the whole process tree's and the bound N times one server's.

The server's CPU seconds (user + system, all its processes, from /proc) over the load give the work per action,
which unlike wall time does not depend on what else the machine runs; a quiet visitor alone afterwards gives
the CPU of each action kind (--quiet-prompts). --taskset confines the server to some cores.

With --lecture NAME the class follows a lecturer instead (explorer_model/cli/room_load.py): the server is `serve
--share`, one presenter presses Next every --step-every seconds through --steps steps of the shipped lecture NAME, and
the visitors are followers; it reports the follow lag (from the press to each follower's page showing the step)
beside the other actions' latency, and the server CPU per step, between steps and per action kind.

Usage: .venv/bin/python bench/bench_load.py [--visitors 30] [--prompts 5] [--processes 1] [--lecture tutorial-000]
(prints a JSON report; exit status 0 when there were no errors, memory stayed under the bound and recordings were
identical)
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import math
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import parse_qs, urlencode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))  # its sibling load_server.py, also when loaded from a file path
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from load_determinism import determinism  # noqa: E402
from explorer_model.cli.loadtest import (ACTIONS, BACKENDS, CpuMeter, MemorySampler, Visitor,  # noqa: E402
                                     app_torch_threads, free_port, outcomes, percentile, quiet_visitor_cpu, memory_kb,
                                     run_visitors, start_server, stop_server, tree_pids, wait_healthy)
from explorer_model.cli import room_load  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/ modules, imported or run
from machine import machine_line  # noqa: E402

# What the server holds besides the weights and the cached recordings: Python, torch, Streamlit and their
# libraries (~0.42 GB after the first page), one recording in flight (~1.07 MiB per token of SmolLM2: 64 MiB
# at 60 tokens, 0.55 GiB at the shared-mode cap of 512), the working arrays of the page runs in progress,
# and memory glibc keeps in its per-thread arenas between trims. Measured with 30 visitors on 2 cores
# (when a recording held 1.55 MiB per token): 1.3-1.56 GB over five runs; the bound allows 1.75 GB. It grows with the page runs in progress at once,
# not with the number of visitors connected.
OVERHEAD_MB = 1792
# --------------------------------------------------------------------------- the whole run
def run(args) -> dict:
    t_start = time.monotonic()
    report: dict = {"visitors": args.visitors, "prompts_per_visitor": args.prompts, "think_s": args.think,
                    "ramp_s": args.ramp, "timeout_s": args.timeout, "cpus": os.cpu_count(),
                    "loadavg_before": round(os.getloadavg()[0], 2)}  # other work on the machine skews latency
    from explorer_model.loaders import load

    loaded = load("smollm2")
    weights = list(loaded.model.parameters()) + list(loaded.model.buffers())
    model_mb = sum(t.numel() * t.element_size() for t in weights) / 2**20
    if not args.no_determinism:
        report["determinism"] = determinism(loaded, args.determinism_prompt)
    del loaded, weights
    cache_mb = args.cache_mb if args.cache_mb else 2048  # app.gateway.settings' default
    tmp = Path(tempfile.mkdtemp(prefix="bench_load_"))
    port = free_port()
    # one server, or `serve --processes N`: N servers behind HAProxy (docs/haproxy.cfg) pinning each visitor to one
    proc = start_server(port, args.cache_mb, args.max_tokens, tmp / "server.log", args.processes, args.taskset,
                        Path(args.server_root) if args.server_root else ROOT, room=bool(args.lecture))
    if args.server_root:
        report["server_root"] = str(Path(args.server_root).resolve())
    if args.taskset:
        report["server_taskset"] = args.taskset
    sampler = MemorySampler([proc.pid])
    sampler.start()
    client_cpu0 = time.process_time()
    try:
        wait_healthy(port, proc)
        if args.processes > 1:
            report["processes"] = {"count": args.processes, "balancer": "haproxy"}
        report["server_torch_threads"] = app_torch_threads(proc.pid)  # per app process, from its environment
        report["memory_idle_mb"] = round(memory_kb(tree_pids(proc.pid))["total"] / 1024)

        async def warm_up() -> float:  # the teacher opens the page first: each process loads its model once
            pages = [Visitor(port, args.timeout, sticky=args.processes > 1) for _ in range(args.processes)]
            slowest = 0.0
            for v in pages:  # each stays connected, so the balancer sends the next to another process
                await v.connect()
                dt, problems = await v.rerun("view=tokens")
                if problems:
                    raise RuntimeError(f"the first page failed: {problems}")
                slowest = max(slowest, dt)
            for v in pages:
                await v.close()
            return slowest

        report["first_page_s"] = round(asyncio.run(warm_up()), 2)
        report["memory_after_first_page_mb"] = round(memory_kb(tree_pids(proc.pid))["total"] / 1024)
        deadline = t_start + args.max_seconds - 60  # leave a minute to finish the runs in progress
        meter = CpuMeter(proc.pid)
        t0, cpu0 = time.monotonic(), meter.read()
        left = args.max_seconds - (time.monotonic() - t_start)
        if args.lecture:  # a lecturer and followers; their actions' CPU is measured inside the scenario
            key = room_load.presenter_key(tmp / "server.log")
            times, errors, report["room"] = asyncio.run(asyncio.wait_for(
                room_load.lecture_run(port, key, args, meter.read, deadline), left))
            done = [len(times["follow"]) + len(times["present_step"])]
        else:
            times, errors, done = asyncio.run(asyncio.wait_for(run_visitors(port, args, deadline), left))
        report["load_seconds"] = round(time.monotonic() - t0, 1)
        report["loadavg_after"] = round(os.getloadavg()[0], 2)
        cpu_s = meter.read() - cpu0
        report["server_cpu"] = {"seconds": round(cpu_s, 1), "per_action_s": round(cpu_s / max(1, sum(done)), 3),
                                "cores_busy": round(cpu_s / report["load_seconds"], 2),
                                "actions_per_s": round(sum(done) / report["load_seconds"], 2)}
        if args.quiet_prompts and not args.lecture:
            report["server_cpu"]["per_kind_quiet_visitor_s"] = quiet_visitor_cpu(port, args, meter)
    except asyncio.TimeoutError:
        times, errors, done = {a: [] for a in ACTIONS}, [{"problem": "the whole run exceeded --max-seconds"}], []
    except RuntimeError as e:  # the server did not start or its first page failed
        times, errors, done = {a: [] for a in ACTIONS}, [{"problem": str(e)}], []
    finally:
        report["client_cpu_s"] = round(time.process_time() - client_cpu0, 1)
        sampler.stop()
        server_alive = proc.poll() is None
        stop_server(proc)
    log = (tmp / "server.log").read_text(errors="replace")
    report["server_log"] = str(tmp / "server.log")
    if BACKENDS:
        report["processes"]["visitors_each"] = dict(sorted(BACKENDS.items()))
    ordinary = args.visitors - min(args.adversaries, args.visitors)
    planned = ordinary * (1 + (1 if args.prompt_chars else 6) * args.prompts)
    done = done[:ordinary]  # an adversary's actions are not the class's
    if args.prompt_chars:  # a visitor whose connection the server closed sends nothing more
        report["oversized_prompts"] = {"chars": args.prompt_chars, **outcomes}
    elif not args.lecture and sum(done) < planned:
        errors.append({"problem": f"only {sum(done)} of {planned} actions ran (time bound reached)"})
    if not server_alive:
        errors.append({"problem": f"the server exited during the run: {log[-500:]}"})
    tracebacks = log.count("Traceback")
    refusals = times.pop("refusals", None)
    report["latency_s"] = {a: {"n": len(t), "p50": round(percentile(t, 50), 3), "p95": round(percentile(t, 95), 3),
                               "max": round(max(t), 3)} for a, t in times.items() if t and not a.startswith("adv_")}
    if args.adversaries:
        report["adversaries"] = {"count": args.adversaries, "answers": dict(refusals or {}),
                                 "latency_s": {a: {"n": len(t), "p50": round(percentile(t, 50), 3),
                                                   "p95": round(percentile(t, 95), 3), "max": round(max(t), 3)}
                                               for a, t in times.items() if t and a.startswith("adv_")}}
    report["actions"] = sum(done)
    report["errors"] = len(errors)
    report["error_examples"] = errors[:10]
    report["server_log_tracebacks"] = tracebacks
    bound = args.processes * (model_mb + cache_mb + args.overhead_mb)  # each process its own model and cache
    peak = sampler.peak
    report["memory_mb"] = {"peak": round(peak["total"] / 1024), "peak_anon": round(peak["anon"] / 1024),
                           "peak_file": round(peak["file"] / 1024), "samples": sampler.samples,
                           "p50": round(percentile(sampler.history, 50) / 1024) if sampler.history else 0,
                           "p95": round(percentile(sampler.history, 95) / 1024) if sampler.history else 0,
                           "model": round(model_mb), "cache_bound": cache_mb, "overhead": args.overhead_mb,
                           "processes": args.processes,
                           "bound": round(bound)}
    report["total_seconds"] = round(time.monotonic() - t_start, 1)
    report["ok"] = (not errors and not tracebacks and peak["total"] / 1024 < bound
                    and report.get("determinism", {"identical": True})["identical"])
    if report["ok"]:  # keep the server's log only when something went wrong
        shutil.rmtree(tmp, ignore_errors=True)
        del report["server_log"]
    return report


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--visitors", type=int, default=30)
    p.add_argument("--prompts", type=int, default=5, help="different prompts each visitor types")
    p.add_argument("--think", type=float, default=1.0, help="mean pause between a visitor's actions (s)")
    p.add_argument("--ramp", type=float, default=10.0, help="visitors arrive spread over this many seconds")
    p.add_argument("--timeout", type=float, default=120.0, help="longest wait for one page run (s)")
    p.add_argument("--max-seconds", type=float, default=900.0, help="bound on the whole benchmark (s)")
    p.add_argument("--cache-mb", type=int, default=None, help="the server's recording cache (default: the app's 2048)")
    p.add_argument("--max-tokens", type=int, default=None, help="the server's token cap (default: the app's)")
    p.add_argument("--overhead-mb", type=int, default=OVERHEAD_MB, help="memory allowed beyond weights + cache")
    p.add_argument("--views", default="", help="comma-separated view keys to visit (default: all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--adversaries", type=int, default=0,
                   help="of the visitors, this many adversarial ones (loadtest.adversary_run): thousand-item what-if "
                        "links, a long prompt against its no-mask twin, .npz downloads, the lab button pressed again "
                        "and again; the others' latency is reported as usual")
    p.add_argument("--prompt-chars", type=int, default=0,
                   help="pad every prompt to this many characters (a burst of oversized prompts: the server "
                        "must refuse them before tokenizing and stay under its memory bound)")
    p.add_argument("--processes", type=int, default=1,
                   help="server processes behind HAProxy (docs/haproxy.cfg), each with its own model and cache "
                        "and its share of the cores as torch threads")
    p.add_argument("--quiet-prompts", type=int, default=2,
                   help="after the load, one visitor alone types this many prompts with the server's CPU read around "
                        "each action: server CPU per action kind (0: skip)")
    p.add_argument("--taskset", default="", metavar="CPUS",
                   help="confine the server to these cores (taskset -c CPUS, e.g. 0): a stand-in for a slower host")
    p.add_argument("--lecture", default="", metavar="NAME",
                   help="the lecture scenario: one presenter steps through the shipped lecture NAME (e.g. "
                        "tutorial-000) and the visitors follow it (explorer_model/cli/room_load.py)")
    p.add_argument("--steps", type=int, default=10, help="with --lecture: how many times the presenter presses Next")
    p.add_argument("--step-every", type=float, default=20.0, help="with --lecture: seconds between two presses")
    p.add_argument("--server-root", default="", metavar="DIR",
                   help="serve another checkout of the project (e.g. a git worktree of another version) to the same "
                        "visitors: two versions measured on one machine")
    p.add_argument("--no-determinism", action="store_true")
    p.add_argument("--determinism-prompt", default="The animal didn't cross the street because it was too tired.")
    return p.parse_args(argv)


def main(argv=None) -> int:
    line = machine_line()
    print(line, file=sys.stderr, flush=True)
    report = {"machine": line, **run(parse_args(argv))}
    print(json.dumps(report, indent=2, ensure_ascii=False))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
