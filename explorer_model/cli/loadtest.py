"""Classroom load, as a browser's protocol and a server's footprint: simulated visitors spoken to over Streamlit's own
websocket (bench/bench_load.py and `llama-explorer classroom-check` drive them), and the server they visit started,
watched (CPU seconds and RSS of its process tree, from /proc) and stopped.

Each visitor is a websocket client doing what the browser does: it opens /_stcore/stream with the "streamlit"
subprotocol, sends BackMsg.rerun_script (query string on the first run, then only the widget it changed, identified
by the id the server sent in the element's proto) and reads ForwardMsgs until script_finished. Latency is measured
from sending the BackMsg to receiving script_finished, i.e. what a visitor waits for the page to settle. 30 such
clients cost a few % of one core; 30 browsers would not fit on the cores that also run the server.

The visitor itself is in visitor.py, the adversarial one in adversary.py. Per visitor: open the page, then for
each of its prompts (all different, 10-60 tokens): type the prompt, switch view, layer, head, view, layer, with a
random pause ("think time") between actions. An error is an exception element or an st.error on the page, a run
that did not finish successfully, a page whose URL state disagrees with what was asked, a dropped connection, or no
answer within the timeout.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlencode

from explorer_model.cli.adversary import adversary_run
from explorer_model.cli.serve import free_port  # noqa: F401  (the benches import it from here)
from explorer_model.cli.visitor import EN, ZH, Visitor, make_prompts, percentile  # noqa: F401  (re-exported)

ROOT = Path(__file__).resolve().parents[2]

BACKENDS: collections.Counter = collections.Counter()  # visitors per server process (--processes > 1)
ACTIONS = ("open", "new_prompt", "switch_view", "switch_layer", "switch_head")

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
        model = getattr(args, "model", None)  # the page's default model unless the run names another
        query = {"view": state["view"], "lang": lang, **({"model": model} if model else {})}
        await act("open", urlencode(query), view=state["view"], lang=lang)
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
                    hi = v.limits.get(kind, 29 if kind == "layer" else 8)  # the slider's max (SmolLM2's)
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
        await v.close()
    return done


async def run_visitors(port: int, args, deadline: float) -> tuple[dict, list, list[int]]:
    """The ordinary visitors' actions in times[<action>], the last `args.adversaries` visitors' (adversary_run)
    in times["adv_*"] and their refusals in times["refusals"] (a Counter)."""
    from app.panels import VIEWS

    views = [x[0] for x in VIEWS if not args.views or x[0] in args.views.split(",")]
    times = {a: [] for a in ACTIONS}
    errors: list[dict] = []
    adversaries = min(getattr(args, "adversaries", 0), args.visitors)
    refusals: collections.Counter = collections.Counter()
    done = await asyncio.gather(*[
        adversary_run(n, port, args, deadline, times, errors, refusals) if n >= args.visitors - adversaries else
        visitor_run(n, port, make_prompts(n, args.prompts, args.seed, args.prompt_chars), views, args, deadline, times, errors)
        for n in range(args.visitors)])
    if adversaries:
        times["refusals"] = refusals
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



# --------------------------------------------------------------------------- the server
def tree_pids(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d))
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def app_torch_threads(root: int) -> list[int]:
    """The torch thread count of each app server process under `root` (the Streamlit ones; not HAProxy, not the
    lab worker), as its environment sets it: OMP_NUM_THREADS, else one per core (torch's default)."""
    out = []
    for p in tree_pids(root):
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                if b"streamlit" not in f.read():
                    continue
            with open(f"/proc/{p}/environ", "rb") as f:
                env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
        except OSError:
            continue
        value = env.get(b"OMP_NUM_THREADS", b"")
        out.append(int(value) if value.isdigit() and int(value) > 0 else os.cpu_count() or 1)
    return sorted(out)


def memory_kb(pids: list[int]) -> dict[str, int]:
    """The memory a server's processes hold (kB): their private pages (RssAnon and RssShmem, summed) and the pages
    of files they map (RssFile) counted once, as the largest process's. A server and its lab worker map the same
    libraries, and the server's processes the same memory-mapped weight cache: a sum of their RSS counted those
    pages once per process, and so depended on whether the worker happened to be running. (Proportional set sizes
    count them once too, but also split a page with any process outside the group that maps it, such as a client
    that loaded the same weights.)"""
    anon, file = 0, 0
    for p in pids:
        try:
            with open(f"/proc/{p}/status") as f:
                fields = {k: int(v.split()[0]) for k, _, v in (line.partition(":") for line in f)
                          if k in ("RssAnon", "RssFile", "RssShmem")}
        except (OSError, ValueError):  # ended meanwhile
            continue
        anon += fields.get("RssAnon", 0) + fields.get("RssShmem", 0)
        file = max(file, fields.get("RssFile", 0))
    return {"total": anon + file, "anon": anon, "file": file}


CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pids: list[int]) -> float:
    """CPU seconds (user + system) the processes have used so far, their waited-for children included: the work
    a server did, which unlike wall time does not depend on what else the machine runs."""
    ticks = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    return ticks / CLOCK_TICKS


class CpuMeter:
    """Server CPU seconds of a process tree between two readings. A process of the tree that ends between them
    takes its CPU time along (unless its parent waited for it), so the tree is re-read at every sample and the
    largest figure each pid reached is kept."""

    def __init__(self, root: int):
        self.root, self.seen = root, {}

    def read(self) -> float:
        for p in tree_pids(self.root):
            self.seen[p] = max(self.seen.get(p, 0.0), cpu_seconds([p]))
        return sum(self.seen.values())


class MemorySampler(threading.Thread):
    """The peak memory (memory_kb) of process trees, sampled from /proc."""

    def __init__(self, pids: list[int], every: float = 0.2):
        super().__init__(daemon=True)
        self.pids, self.every, self.samples = list(pids), every, 0
        self.cpu = [CpuMeter(p) for p in self.pids]  # read at each sample, so short-lived processes are counted
        self.peak = {"total": 0, "anon": 0, "file": 0}
        self.last = dict(self.peak)
        self.history: list[int] = []  # the total of every sample, kB
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            self.last = memory_kb([p for root in self.pids for p in tree_pids(root)])
            self.cpu_seconds()
            self.samples += 1
            self.history.append(self.last["total"])
            if self.last["total"] > self.peak["total"]:
                self.peak = self.last
            self._halt.wait(self.every)

    def cpu_seconds(self) -> float:
        return sum(m.read() for m in self.cpu)

    def stop(self) -> None:
        self._halt.set()
        self.join()


def start_server(port: int, cache_mb: int | None, max_tokens: int | None, log_path: Path,
                 processes: int = 1, taskset: str = "", root: Path = ROOT, room: bool = False) -> subprocess.Popen:
    """One shared server as `serve --share` runs it, or with processes > 1, another `root` or a `room` the `serve
    --share [--processes N]` command itself (app servers behind HAProxy; the room's presenter link printed into the
    log, its state in the log's folder); in its own process group, so stopping it stops all of it. With `taskset` (a
    CPU list such as "0") the whole server is confined to those cores. `root`: another checkout of the project (a
    git worktree of another version) whose own `serve --share` is started instead, to measure two versions with the
    same visitors."""
    from explorer_model.cli.serve import server_env, streamlit_command

    log = open(log_path, "wb")
    if processes > 1 or room or Path(root).resolve() != ROOT:
        cmd = [sys.executable, "-m", "explorer_model.cli", "serve", "--share", "--processes", str(processes),
               "--port", str(port)] + (["--cache-mb", str(cache_mb)] if cache_mb else []) + \
              (["--max-tokens", str(max_tokens)] if max_tokens else [])
        env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", PYTHONPATH=str(root), XDG_RUNTIME_DIR=str(log_path.parent))
    else:
        cmd, env = streamlit_command(port, "127.0.0.1"), server_env(share=True, max_tokens=max_tokens, cache_mb=cache_mb)
    if taskset:
        cmd = ["taskset", "-c", taskset] + cmd
    return subprocess.Popen(cmd, cwd=root, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def wait_healthy(port: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with status {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise RuntimeError("the server did not become healthy")
