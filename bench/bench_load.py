"""Classroom load: N simulated visitors on one shared server, spoken to over Streamlit's own websocket.
(The visitor protocol, the run and its report belong together here; starting and watching the server is in
load_server.py, the determinism check in load_determinism.py.)

Each visitor is a websocket client doing what the browser does: it opens /_stcore/stream with the
"streamlit" subprotocol, sends BackMsg.rerun_script (query string on the first run, then only the widget
it changed, identified by the id the server sent in the element's proto) and reads ForwardMsgs until
script_finished. Latency is measured from sending the BackMsg to receiving script_finished, i.e. what a
visitor waits for the page to settle. 30 such clients cost a few % of one core; 30 browsers would not
fit on the 2 cores that also run the server.

Per visitor: open the page, then for each of its prompts (all different, 10-60 tokens): type the prompt,
switch view, layer, head, view, layer, with a random pause ("think time") between actions.
An error is an exception element or an st.error on the page, a run that did not finish successfully, a
page whose URL state disagrees with what was asked, a dropped connection, or no answer within --timeout.
The server's memory is the RSS of its process tree, read from /proc every 0.2 s; it must stay under
model weights + the recording-cache bound (--cache-mb) + a fixed overhead (--overhead-mb, see OVERHEAD_MB).

Determinism is checked apart from the server: the same prompt recorded in several threads at once (plain
`record` calls, and through app.result_cache.ResultCache with a zero budget so each get recomputes), and in
two separate `llama-explorer record` processes; every tensor must be bit-identical.

With --processes N (N > 1) the server is `llama-explorer serve --share --processes N`: HAProxy with docs/haproxy.cfg
in front of N app processes (each its own model and cache, torch threads = cores / N); the visitors load the page
first to get the balancer's cookie, memory is the whole process tree's and the bound N times one server's.

The server's CPU seconds (user + system, all its processes, from /proc) over the load give the work per action,
which unlike wall time does not depend on what else the machine runs; a quiet visitor alone afterwards gives
the CPU of each action kind (--quiet-prompts). --taskset confines the server to some cores.

Usage: .venv/bin/python bench/bench_load.py [--visitors 30] [--prompts 5] [--processes 1]   (prints a JSON report;
exit status 0 when there were no errors, memory stayed under the bound and recordings were identical)
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
from load_server import CpuMeter, free_port, MemorySampler, rss_kb, start_server, stop_server, tree_pids, wait_healthy  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/ modules, imported or run
from machine import machine_line  # noqa: E402

# What the server holds besides the weights and the cached recordings: Python, torch, Streamlit and their
# libraries (~0.42 GB after the first page), one recording in flight (~1.07 MiB per token of SmolLM2: 64 MiB
# at 60 tokens, 0.55 GiB at the shared-mode cap of 512), the working arrays of the page runs in progress,
# and memory glibc keeps in its per-thread arenas between trims. Measured with 30 visitors on 2 cores
# (when a recording held 1.55 MiB per token): 1.3-1.56 GB over five runs; the bound allows 1.75 GB. It grows with the page runs in progress at once,
# not with the number of visitors connected.
OVERHEAD_MB = 1792
BACKENDS: collections.Counter = collections.Counter()  # visitors per server process (--processes > 1)
ACTIONS = ("open", "new_prompt", "switch_view", "switch_layer", "switch_head")

EN = (["The teacher", "A small robot", "My grandmother", "The old library", "Every student", "The river pilot",
       "A tired engineer", "The city council", "Our neighbour's cat", "The young doctor"],
      ["explained", "painted", "carried", "forgot", "repaired", "described", "counted", "found", "sold", "opened"],
      ["three equations on the board", "a map of the northern islands", "the broken bicycle",
       "a letter from nineteen years ago", "seven baskets of apples", "the secret garden gate",
       "a recipe for bread", "the noisy printer", "two paintings of the sea", "the last train ticket"],
      ["before lunch", "in the rain", "while the bells rang", "after the long meeting", "near the harbour",
       "during the exam", "on a quiet Sunday", "at the edge of town"])
ZH = ["今天老师在黑板上写了三个方程，", "小机器人在雨中修好了自行车，", "图书馆里有一封很旧的信，",
      "我们在公园里数了七篮苹果，", "医生在会议之后打开了花园的门，"]


def make_prompts(visitor: int, count: int, seed: int, chars: int = 0) -> list[str]:
    """`count` different prompts for one visitor, unique across visitors (so every one is a forward pass);
    with `chars`, each is repeated up to that many characters."""
    rng = random.Random(seed * 1000 + visitor)
    out = []
    for i in range(count):
        if rng.random() < 0.2:
            text = "".join(rng.sample(ZH, rng.randint(1, 3))) + f"第{visitor}号学生问了第{i}个问题。"
        else:
            parts = [f"{rng.choice(EN[0])} {rng.choice(EN[1])} {rng.choice(EN[2])} {rng.choice(EN[3])}"
                     for _ in range(rng.randint(1, 3))]
            text = f"Visitor {visitor}, question {i}: " + ", and then ".join(parts) + "."
        out.append((text + " ") * (chars // (len(text) + 1)) + text[:chars % (len(text) + 1)] if chars else text)
    return out


def percentile(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[max(0, math.ceil(p / 100 * len(s)) - 1)]


# --------------------------------------------------------------------------- one visitor
class Visitor:
    """One browser tab, reduced to Streamlit's protocol."""

    def __init__(self, port: int, timeout: float, sticky: bool = False):
        self.url, self.timeout = f"ws://127.0.0.1:{port}/_stcore/stream", timeout
        self.ws, self.ids, self.query, self.view_labels = None, {}, {}, []
        self.sticky, self.backend = sticky, None

    async def connect(self) -> None:
        import websockets

        headers = {}
        if self.sticky:  # behind HAProxy a browser first loads the page, and gets the cookie naming its process
            self.backend = await asyncio.to_thread(self._page_cookie)
            headers["Cookie"] = f"EXPLORER={self.backend}"
        self.ws = await websockets.connect(self.url, subprotocols=["streamlit"], max_size=None,
                                           open_timeout=self.timeout, additional_headers=headers)

    def _page_cookie(self) -> str:
        import urllib.request

        with urllib.request.urlopen(self.url.replace("ws://", "http://").replace("/_stcore/stream", "/"),
                                    timeout=self.timeout) as r:
            cookie = r.headers.get("Set-Cookie", "")
        if not cookie.startswith("EXPLORER="):
            raise RuntimeError(f"no EXPLORER cookie from the load balancer ({cookie!r})")
        return cookie.split(";", 1)[0].split("=", 1)[1]

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()

    async def rerun(self, query: str = "", widget: tuple[str, str, object] | None = None) -> tuple[float, list[str]]:
        """One script run; (seconds until script_finished, problems seen on the page)."""
        from streamlit.proto.BackMsg_pb2 import BackMsg

        msg = BackMsg()
        msg.rerun_script.query_string = query
        if widget is not None:
            key, kind, value = widget
            ws = msg.rerun_script.widget_states.widgets.add()
            ws.id = self.ids[key]
            if kind == "string":
                ws.string_value = value
            elif kind == "double_array":
                ws.double_array_value.data[:] = value
            else:
                ws.string_array_value.data[:] = value
        t0 = time.perf_counter()
        await self.ws.send(msg.SerializeToString())
        problems = await asyncio.wait_for(self._read_run(), self.timeout)
        return time.perf_counter() - t0, problems

    async def _read_run(self) -> list[str]:
        from streamlit.proto.Alert_pb2 import Alert
        from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

        problems = []
        while True:
            f = ForwardMsg()
            f.ParseFromString(await self.ws.recv())
            kind = f.WhichOneof("type")
            if kind == "delta" and f.delta.WhichOneof("type") == "new_element":
                el_kind = f.delta.new_element.WhichOneof("type")
                el = getattr(f.delta.new_element, el_kind)
                if getattr(el, "id", ""):
                    self.ids[el.id.rsplit("-", 1)[-1]] = el.id
                if el_kind == "button_group":
                    self.view_labels = [o.content for o in el.options]
                if el_kind == "exception":
                    problems.append(f"exception: {el.type}: {el.message}")
                elif el_kind == "alert" and el.format == Alert.ERROR:
                    problems.append(f"error: {el.body[:200]}")
            elif kind == "page_info_changed":
                self.query = {k: v[0] for k, v in parse_qs(f.page_info_changed.query_string).items()}
            elif kind == "script_finished":
                if f.script_finished != ForwardMsg.FINISHED_SUCCESSFULLY:
                    problems.append(f"script_finished status {f.script_finished}")
                return problems

    def mismatch(self, **wanted) -> list[str]:
        return [f"URL has {k}={self.query.get(k)!r}, expected {v!r}" for k, v in wanted.items()
                if self.query.get(k) != str(v)]


# what became of each oversized prompt (--prompt-chars): refused, cut by the text box, or closed by the server
outcomes: collections.Counter = collections.Counter()


async def visitor_run(n: int, port: int, prompts: list[str], views: list[str], args, deadline: float,
                      times: dict[str, list[float]], errors: list[dict], cpu=None) -> int:
    """All actions of one visitor; returns how many it completed. With `cpu` (a function returning the server's
    CPU seconds so far), the server CPU of each action goes to times["cpu:<action>"]: meaningful only when this
    visitor is the server's only one."""
    from app.panels import VIEWS

    all_views = [x[0] for x in VIEWS]  # the server's option order
    rng = random.Random(args.seed * 7919 + n)
    await asyncio.sleep(rng.uniform(0, args.ramp))  # a class does not arrive in the same millisecond
    v = Visitor(port, args.timeout, sticky=args.processes > 1)
    done, action = 0, "open"
    state = {"view": rng.choice(views), "layer": 0, "head": 0}

    async def act(name: str, query: str = "", widget=None, refused: bool = False, **wanted) -> None:
        nonlocal done, action
        action = name
        cpu0 = cpu() if cpu else 0.0
        dt, problems = await v.rerun(query, widget)
        if cpu:
            await asyncio.sleep(0.3)  # the server's work after script_finished (sending, session bookkeeping)
            used = cpu() - cpu0
            times.setdefault(f"cpu:{name}", []).append(used)
            if name == "switch_view":
                times.setdefault(f"cpu:switch_view:{state['view']}", []).append(used)
        if refused:  # an oversized prompt: refused with one message, or cut by the text box (max_chars)
            said = [p for p in problems if p.startswith("error: ") and "characters" in p]
            outcomes["refused" if said else "cut by the text box"] += 1
            problems = [p for p in problems if p not in said]
        problems += v.mismatch(**wanted)
        times[name].append(dt)
        if name == "switch_view":
            times.setdefault(f"switch_view:{state['view']}", []).append(dt)
        for p in problems:
            errors.append({"visitor": n, "action": name, "problem": p})
        done += 1
        await asyncio.sleep(rng.uniform(0.5, 1.5) * args.think)

    try:
        await v.connect()
        if v.backend:
            BACKENDS[v.backend] += 1
        lang = "zh" if n % 3 == 2 else "en"
        await act("open", urlencode({"view": state["view"], "lang": lang}), view=state["view"], lang=lang)
        for text in prompts:
            if time.monotonic() > deadline:
                break
            if args.prompt_chars:  # refused before tokenizing: one message on the page, nothing to switch
                await act("new_prompt", widget=("prompt", "string", text), refused=True)
                continue
            await act("new_prompt", widget=("prompt", "string", text), prompt=text)
            for kind in ("view", "layer", "head", "view", "layer"):
                if kind == "view":
                    state["view"] = rng.choice([x for x in views if x != state["view"]])
                    label = v.view_labels[all_views.index(state["view"])]
                    await act("switch_view", widget=("view", "string_array", [label]), view=state["view"])
                else:
                    hi = 29 if kind == "layer" else 8  # SmolLM2: 30 layers, 9 heads
                    state[kind] = rng.choice([x for x in range(hi + 1) if x != state[kind]])
                    await act(f"switch_{kind}", widget=(kind, "double_array", [float(state[kind])]),
                              **{kind: state[kind]})
    except asyncio.TimeoutError:
        errors.append({"visitor": n, "action": action, "problem": f"timeout: no script_finished within {args.timeout} s"})
    except Exception as e:  # a dropped connection, or anything else that ends this visitor early
        if args.prompt_chars and "1009" in str(e):  # the server's websocket limit closed it: no work was done
            outcomes["closed by the server (message too big)"] += 1
        else:
            errors.append({"visitor": n, "action": action, "problem": f"{type(e).__name__}: {e}"})
    finally:
        try:
            await v.close()
        except Exception:
            pass
    return done


async def run_visitors(port: int, args, deadline: float) -> tuple[dict, list, list[int]]:
    from app.panels import VIEWS

    views = [x[0] for x in VIEWS if not args.views or x[0] in args.views.split(",")]
    times = {a: [] for a in ACTIONS}
    errors: list[dict] = []
    done = await asyncio.gather(*[
        visitor_run(n, port, make_prompts(n, args.prompts, args.seed, args.prompt_chars), views, args, deadline, times, errors)
        for n in range(args.visitors)])
    return times, errors, list(done)


def quiet_visitor_cpu(port: int, args, meter: CpuMeter) -> dict:
    """Server CPU seconds per action kind, measured around each action of one visitor alone on the server (fresh
    prompts, no think time): what each kind costs, which the mix's total cannot attribute."""
    from app.panels import VIEWS

    quiet = argparse.Namespace(**{**vars(args), "ramp": 0.0, "think": 0.0})
    times: dict = {a: [] for a in ACTIONS}
    errors: list = []
    asyncio.run(visitor_run(args.visitors + 1, port, make_prompts(10_000, args.quiet_prompts, args.seed + 1),
                            [x[0] for x in VIEWS], quiet, time.monotonic() + 600, times, errors, cpu=meter.read))
    out = {k.split(":", 1)[1]: {"n": len(v), "mean": round(sum(v) / len(v), 3), "max": round(max(v), 3)}
           for k, v in times.items() if k.startswith("cpu:")}
    if errors:
        out["errors"] = errors[:3]
    return out


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
    cache_mb = args.cache_mb if args.cache_mb else 2048  # app.settings' default
    tmp = Path(tempfile.mkdtemp(prefix="bench_load_"))
    port = free_port()
    # one server, or `serve --processes N`: N servers behind HAProxy (docs/haproxy.cfg) pinning each visitor to one
    proc = start_server(port, args.cache_mb, args.max_tokens, tmp / "server.log", args.processes, args.taskset)
    if args.taskset:
        report["server_taskset"] = args.taskset
    sampler = MemorySampler([proc.pid])
    sampler.start()
    client_cpu0 = time.process_time()
    try:
        wait_healthy(port, proc)
        if args.processes > 1:
            report["processes"] = {"count": args.processes, "balancer": "haproxy",
                                   "torch_threads_each": max(1, (os.cpu_count() or 1) // args.processes)}
        report["rss_idle_mb"] = round(rss_kb(tree_pids(proc.pid))["VmRSS"] / 1024)

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
        report["rss_after_first_page_mb"] = round(rss_kb(tree_pids(proc.pid))["VmRSS"] / 1024)
        deadline = t_start + args.max_seconds - 60  # leave a minute to finish the runs in progress
        meter = CpuMeter(proc.pid)
        t0, cpu0 = time.monotonic(), meter.read()
        times, errors, done = asyncio.run(asyncio.wait_for(run_visitors(port, args, deadline),
                                                           args.max_seconds - (time.monotonic() - t_start)))
        report["load_seconds"] = round(time.monotonic() - t0, 1)
        report["loadavg_after"] = round(os.getloadavg()[0], 2)
        cpu_s = meter.read() - cpu0
        report["server_cpu"] = {"seconds": round(cpu_s, 1), "per_action_s": round(cpu_s / max(1, sum(done)), 3),
                                "cores_busy": round(cpu_s / report["load_seconds"], 2),
                                "actions_per_s": round(sum(done) / report["load_seconds"], 2)}
        if args.quiet_prompts:
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
    planned = args.visitors * (1 + (1 if args.prompt_chars else 6) * args.prompts)
    if args.prompt_chars:  # a visitor whose connection the server closed sends nothing more
        report["oversized_prompts"] = {"chars": args.prompt_chars, **outcomes}
    elif sum(done) < planned:
        errors.append({"problem": f"only {sum(done)} of {planned} actions ran (time bound reached)"})
    if not server_alive:
        errors.append({"problem": f"the server exited during the run: {log[-500:]}"})
    tracebacks = log.count("Traceback")
    report["latency_s"] = {a: {"n": len(t), "p50": round(percentile(t, 50), 3), "p95": round(percentile(t, 95), 3),
                               "max": round(max(t), 3)} for a, t in times.items() if t}
    report["actions"] = sum(done)
    report["errors"] = len(errors)
    report["error_examples"] = errors[:10]
    report["server_log_tracebacks"] = tracebacks
    bound = args.processes * (model_mb + cache_mb + args.overhead_mb)  # each process its own model and cache
    peak = sampler.peak
    report["memory_mb"] = {"peak_rss": round(peak["VmRSS"] / 1024), "peak_rss_anon": round(peak["RssAnon"] / 1024),
                           "peak_rss_file": round(peak["RssFile"] / 1024), "samples": sampler.samples,
                           "p50_rss": round(percentile(sampler.history, 50) / 1024) if sampler.history else 0,
                           "p95_rss": round(percentile(sampler.history, 95) / 1024) if sampler.history else 0,
                           "model": round(model_mb), "cache_bound": cache_mb, "overhead": args.overhead_mb,
                           "processes": args.processes,
                           "bound": round(bound)}
    report["total_seconds"] = round(time.monotonic() - t_start, 1)
    report["ok"] = (not errors and not tracebacks and peak["VmRSS"] / 1024 < bound
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
