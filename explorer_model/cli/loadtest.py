"""Classroom load, as a browser's protocol and a server's footprint: simulated visitors spoken to over Streamlit's own
websocket (bench/bench_load.py and `llama-explorer classroom-check` drive them), and the server they visit started,
watched (CPU seconds and RSS of its process tree, from /proc) and stopped.

Each visitor is a websocket client doing what the browser does: it opens /_stcore/stream with the "streamlit"
subprotocol, sends BackMsg.rerun_script (query string on the first run, then only the widget it changed, identified
by the id the server sent in the element's proto) and reads ForwardMsgs until script_finished. Latency is measured
from sending the BackMsg to receiving script_finished, i.e. what a visitor waits for the page to settle. 30 such
clients cost a few % of one core; 30 browsers would not fit on the cores that also run the server.

Per visitor: open the page, then for each of its prompts (all different, 10-60 tokens): type the prompt, switch
view, layer, head, view, layer, with a random pause ("think time") between actions. An error is an exception
element or an st.error on the page, a run that did not finish successfully, a page whose URL state disagrees with
what was asked, a dropped connection, or no answer within the timeout.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import math
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from urllib.parse import parse_qs, urlencode

from explorer_model.cli.serve import free_port  # noqa: F401  (the benches import it from here)

ROOT = Path(__file__).resolve().parents[2]

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
        self.ws, self.ids, self.query, self.view_labels, self.limits = None, {}, {}, [], {}
        self.downloads: dict[str, str] = {}  # a download button's key -> its deferred file id
        self.session_id = ""
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
            elif kind == "trigger":  # a button press
                ws.trigger_value = True
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
                    if el_kind == "slider":  # the layer and head sliders' ranges: the model's shape
                        self.limits[el.id.rsplit("-", 1)[-1]] = int(el.max)
                if el_kind == "download_button" and el.deferred_file_id:
                    self.downloads[el.id.rsplit("-", 1)[-1]] = el.deferred_file_id
                if el_kind == "button_group":
                    self.view_labels = [o.content for o in el.options]
                if el_kind == "exception":
                    problems.append(f"exception: {el.type}: {el.message}")
                elif el_kind == "alert" and el.format == Alert.ERROR:
                    problems.append(f"error: {el.body[:200]}")
            elif kind == "new_session" and f.new_session.initialize.session_id:
                self.session_id = f.new_session.initialize.session_id
            elif kind == "page_info_changed":
                self.query = {k: v[0] for k, v in parse_qs(f.page_info_changed.query_string).items()}
            elif kind == "script_finished":
                if f.script_finished != ForwardMsg.FINISHED_SUCCESSFULLY:
                    problems.append(f"script_finished status {f.script_finished}")
                return problems

    async def download(self, key: str) -> tuple[float, int, str]:
        """Click download button `key` as a browser does: ask the server for the file (Streamlit's deferred-file
        request, which runs the page's data callable), then fetch it. (seconds, bytes, problem or "")."""
        import urllib.request

        from streamlit.proto.BackMsg_pb2 import BackMsg
        from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

        if key not in self.downloads:
            return 0.0, 0, f"no download button {key!r} on the page"
        msg = BackMsg()
        msg.backend_operation_request.request_id = f"{key}-{time.monotonic_ns()}"
        msg.backend_operation_request.session_id = self.session_id
        msg.backend_operation_request.deferred_file.file_id = self.downloads[key]
        t0 = time.perf_counter()
        await self.ws.send(msg.SerializeToString())

        async def answer():
            while True:
                f = ForwardMsg()
                f.ParseFromString(await self.ws.recv())
                if f.WhichOneof("type") == "backend_operation_response":
                    return f.backend_operation_response
        r = await asyncio.wait_for(answer(), self.timeout)
        if r.error_msg:
            return time.perf_counter() - t0, 0, f"download refused: {r.error_msg}"
        base = self.url.replace("ws://", "http://").replace("/_stcore/stream", "")

        def fetch() -> int:
            size = 0
            with urllib.request.urlopen(base + r.deferred_file.url, timeout=self.timeout) as body:
                while chunk := body.read(1 << 20):
                    size += len(chunk)
            return size
        size = await asyncio.to_thread(fetch)
        return time.perf_counter() - t0, size, ""

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
        try:
            await v.close()
        except Exception:
            pass
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


def rss_kb(pids: list[int]) -> dict[str, int]:
    total = {"VmRSS": 0, "RssAnon": 0, "RssFile": 0}
    for p in pids:
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    k, _, v = line.partition(":")
                    if k in total:
                        total[k] += int(v.split()[0])
        except OSError:
            pass
    return total


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
    """Peak RSS of a process tree, sampled from /proc."""

    def __init__(self, pids: list[int], every: float = 0.2):
        super().__init__(daemon=True)
        self.pids, self.every, self.samples = list(pids), every, 0
        self.cpu = [CpuMeter(p) for p in self.pids]  # read at each sample, so short-lived processes are counted
        self.peak = {"VmRSS": 0, "RssAnon": 0, "RssFile": 0}
        self.last = dict(self.peak)
        self.history: list[int] = []  # VmRSS of every sample, kB
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            self.last = rss_kb([p for root in self.pids for p in tree_pids(root)])
            self.cpu_seconds()
            self.samples += 1
            self.history.append(self.last["VmRSS"])
            if self.last["VmRSS"] > self.peak["VmRSS"]:
                self.peak = self.last
            self._halt.wait(self.every)

    def cpu_seconds(self) -> float:
        return sum(m.read() for m in self.cpu)

    def stop(self) -> None:
        self._halt.set()
        self.join()


def start_server(port: int, cache_mb: int | None, max_tokens: int | None, log_path: Path,
                 processes: int = 1, taskset: str = "") -> subprocess.Popen:
    """One shared server as `serve --share` runs it, or with processes > 1 the `serve --share --processes N` command
    itself (app servers behind HAProxy); in its own process group, so stopping it stops all of it. With `taskset`
    (a CPU list such as "0") the whole server is confined to those cores."""
    from explorer_model.cli.serve import server_env, streamlit_command

    log = open(log_path, "wb")
    if processes > 1:
        cmd = [sys.executable, "-m", "explorer_model.cli", "serve", "--share", "--processes", str(processes),
               "--port", str(port)] + (["--cache-mb", str(cache_mb)] if cache_mb else []) + \
              (["--max-tokens", str(max_tokens)] if max_tokens else [])
        env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
    else:
        cmd, env = streamlit_command(port, "127.0.0.1"), server_env(share=True, max_tokens=max_tokens, cache_mb=cache_mb)
    if taskset:
        cmd = ["taskset", "-c", taskset] + cmd
    return subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)


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


# --------------------------------------------------------------------------- the adversarial visitor
# What one visitor can ask of a shared server that costs the most: a what-if link with thousands of changes, a long
# prompt compared with its no-mask twin (side B), the recording's .npz download, and the lab's experiment button
# pressed again and again. Each is answered (or refused in one line) without holding up the others for long; the
# ordinary visitors' p95 with and without one of these beside them is the measure (bench/bench_load.py
# --adversaries 1).
ADVERSARY_ACTIONS = ("adv_long_whatif", "adv_huge_b", "adv_download", "adv_lab_flood")
LONG_WHATIF_ITEMS = 2500
LAB_PRESSES = 6


def long_prompt(sentences: int = 60) -> str:
    """Far longer than the server's token cap: the page records (and compares) the longest prompt it allows."""
    return " ".join(make_prompts(999, sentences, sentences))


async def adversary_run(n: int, port: int, args, deadline: float, times: dict[str, list[float]],
                        errors: list[dict], refusals: collections.Counter) -> int:
    """One adversarial visitor's rounds (args.prompts of them). A refusal on the page (an error alert) is the answer
    it should get and is counted in `refusals` (with the bytes downloaded); an exception, a timeout or a failed download is an error."""
    rng = random.Random(args.seed * 104729 + n)
    await asyncio.sleep(rng.uniform(0, args.ramp))
    v = Visitor(port, args.timeout, sticky=args.processes > 1)
    done, action = 0, "open"

    async def act(name: str, query: str = "", widget=None) -> None:
        nonlocal done, action, v
        action = name
        if query:  # a link is read when a page opens: each one in a new tab, as a visitor pasting it would
            await v.close()
            v = Visitor(port, args.timeout, sticky=args.processes > 1)
            await v.connect()
        dt, problems = await v.rerun(query, widget)
        times.setdefault(name, []).append(dt)
        for p in problems:
            if p.startswith("error: "):
                refusals[f"{name} refused"] += 1
            else:
                errors.append({"visitor": n, "action": name, "problem": p})
        done += 1
        await asyncio.sleep(rng.uniform(0.5, 1.5) * args.think)

    try:
        await v.connect()
        for _ in range(max(1, args.prompts)):
            if time.monotonic() > deadline:
                break
            # distinct changes (repeats of one change collapse into one): more than the model has heads
            changes = ",".join(f"scale:blocks.{i % 30}.hook_attn_out=1.{i:04d}" for i in range(LONG_WHATIF_ITEMS))
            await act("adv_long_whatif", urlencode({"view": "whatif", "whatif": changes}))
            await act("adv_huge_b", urlencode({"view": "attention", "prompt": long_prompt(), "cmp": "whatif",
                                              "cmp_iv": "no-mask"}))
            action = "adv_download"
            if "download_npz" not in v.downloads:  # over the server's download cap: refused before a click
                refusals["adv_download refused"] += 1
            else:
                dt, size, problem = await v.download("download_npz")
                times.setdefault("adv_download", []).append(dt)
                if problem:
                    errors.append({"visitor": n, "action": "adv_download", "problem": problem})
                else:
                    refusals["downloaded bytes"] += size
            done += 1
            await act("adv_lab_flood", urlencode({"view": "normlab"}))
            for _ in range(LAB_PRESSES):
                if "lab_init_run" in v.ids:
                    await act("adv_lab_flood", widget=("lab_init_run", "trigger", True))
    except asyncio.TimeoutError:
        errors.append({"visitor": n, "action": action, "problem": f"timeout: no answer within {args.timeout} s"})
    except Exception as e:
        errors.append({"visitor": n, "action": action, "problem": f"{type(e).__name__}: {e}"})
    finally:
        try:
            await v.close()
        except Exception:
            pass
    return done
