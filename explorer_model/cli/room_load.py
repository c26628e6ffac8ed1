"""The lecture scenario of the load test (bench/bench_load.py --lecture NAME): a presenter steps through a shipped
lecture on a shared server while N followers, spoken to over Streamlit's websocket as loadtest.py's visitors are,
follow it.

The presenter opens the presenter link (?lecture=NAME&step=1&room_key=KEY&presenter=1) and presses Next every
`step_every` seconds, the first time once the server is at rest (the lecture's recordings prepared in the background,
as a lecturer opening the lecture before class finds them: "prepared_after_s"); its own page run is "present_step". A follower opens the server's address and then behaves as
a student's tab does while it follows: it reads every page run the server sends, and when the page asks for
auto-reruns (a fragment with run_every) it sends them at their interval, as the browser's timer does ("poll": one
that changed nothing). A follower's lag for a step ("follow") runs from the presenter's press to the end of the
follower's first page run that shows the step, "follow_shown" to the first element of the follower's page that
names it (the player's counter). After each step every follower's URL must hold the presenter's lecture, step,
model, prompt, view, layer, head and token.
"""
from __future__ import annotations

import asyncio
import collections
import random
import re
import sys
import time
from pathlib import Path
from urllib.parse import urlencode

from .visitor import Visitor, percentile

COUNTER = re.compile(r"\*\*\D*?(\d+) / (\d+)")  # the player's "**Step i / N**" ("**第 i / N 步**" in Chinese)
SAME = ("lecture", "step", "model", "prompt", "ids", "view", "layer", "head", "token")  # a follower's URL = presenter's
ACTIONS = ("open", "present_step", "follow", "follow_shown", "poll")
KEY_LINE = re.compile(r"room_key=([A-Za-z0-9_-]+)")


def presenter_key(log: Path, timeout: float = 60) -> str:
    """The room key from the presenter link `serve --share` printed into its log."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        found = KEY_LINE.search(log.read_text(errors="replace")) if log.exists() else None
        if found:
            return found.group(1)
        time.sleep(0.2)
    raise RuntimeError("the server printed no presenter link")


def rerun_msg(query: str = "", fragment_id: str = "", widget: tuple[str, bool] | None = None) -> bytes:
    """A BackMsg rerun_script as the browser sends it: the page's URL query, a fragment's auto-rerun, or one trigger
    (a button press: (widget id, True))."""
    from streamlit.proto.BackMsg_pb2 import BackMsg

    msg = BackMsg()
    msg.rerun_script.query_string = query
    if fragment_id:
        msg.rerun_script.fragment_id = fragment_id
        msg.rerun_script.is_auto_rerun = True
    if widget is not None:
        state = msg.rerun_script.widget_states.widgets.add()
        state.id, state.trigger_value = widget
    return msg.SerializeToString()


class Follower:
    """One student's tab while it follows the room: it reads every message the server sends and answers the page's
    auto-rerun requests at their interval, as a browser does. `pages` holds (end time, step, URL) of every full page
    run, `shown` (time, step) of every player counter that arrived."""

    def __init__(self, n: int, port: int, timeout: float, sticky: bool = False):
        self.n, self.v, self.timeout = n, Visitor(port, timeout, sticky=sticky), timeout
        self.pages: list[tuple[float, int | None, dict]] = []
        self.shown: list[tuple[float, int]] = []
        self.polls: list[float] = []  # seconds from sending an auto-rerun to its end, when it changed nothing
        self.problems: list[str] = []
        self._sent: collections.deque[float] = collections.deque()
        self._timers: dict[str, asyncio.Task] = {}
        self._reader: asyncio.Task | None = None
        self._news = asyncio.Event()
        self._closing = False

    async def open(self, query: str = "") -> float:
        """Connect and ask for the first page; seconds until that page run ended."""
        await self.v.connect()
        self._reader = asyncio.create_task(self._read())
        t0 = time.perf_counter()
        await self.v.ws.send(rerun_msg(query))
        if not await self.wait(lambda: bool(self.pages)):
            raise asyncio.TimeoutError
        return time.perf_counter() - t0

    async def send(self, data: bytes) -> None:
        await self.v.ws.send(data)

    def settled(self, step: int, since: float) -> tuple[float, dict] | None:
        """(end time, URL) of the first full page run ended after `since` that shows `step`."""
        return next(((t, url) for t, s, url in self.pages if s == step and t >= since), None)

    def shown_at(self, step: int, since: float) -> float | None:
        return next((t for t, s in self.shown if s == step and t >= since), None)

    async def wait(self, done, timeout: float | None = None) -> bool:
        """Until done() holds (checked after every page run) or the timeout; whether it holds."""
        end = time.perf_counter() + (self.timeout if timeout is None else timeout)
        while not done():
            self._news.clear()
            left = end - time.perf_counter()
            if left <= 0 or self._reader is None or self._reader.done():
                return done()
            try:
                await asyncio.wait_for(self._news.wait(), left)
            except asyncio.TimeoutError:
                pass
        return True

    async def _read(self) -> None:
        from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

        fragment_run = False
        try:
            while True:
                f = ForwardMsg()
                f.ParseFromString(await self.v.ws.recv())
                now, kind = time.perf_counter(), f.WhichOneof("type")
                self.problems += self.v.take(f)
                if kind == "new_session":
                    fragment_run = bool(f.metadata.run.fragment_ids)
                elif kind == "delta" and f.delta.new_element.WhichOneof("type") == "markdown":
                    counter = COUNTER.match(f.delta.new_element.markdown.body)
                    if counter:
                        self.shown.append((now, int(counter.group(1))))
                elif kind == "auto_rerun":
                    self._every(f.auto_rerun.fragment_id, f.auto_rerun.interval)
                elif kind == "stop_auto_rerun":
                    for fragment_id in f.stop_auto_rerun.fragment_ids:
                        if fragment_id in self._timers:
                            self._timers.pop(fragment_id).cancel()
                elif kind == "script_finished":
                    status = f.script_finished
                    if status == ForwardMsg.FINISHED_FRAGMENT_RUN_SUCCESSFULLY and self._sent:
                        self.polls.append(now - self._sent[0])
                    elif status == ForwardMsg.FINISHED_SUCCESSFULLY and not fragment_run:
                        step = self.v.query.get("step", "")
                        self.pages.append((now, int(step) if step.isdigit() else None, dict(self.v.query)))
                    elif status == ForwardMsg.FINISHED_WITH_COMPILE_ERROR:
                        self.problems.append("script_finished with a compile error")
                    if status != ForwardMsg.FINISHED_EARLY_FOR_RERUN:  # early: the run it asked for follows
                        self._sent.clear()
                    self._news.set()
        except Exception as e:  # the connection closed: by close(), or by the server (a problem)
            if not self._closing:
                self.problems.append(f"connection: {type(e).__name__}: {e}")
            self._news.set()

    def _every(self, fragment_id: str, interval: float) -> None:
        """The browser's timer for a fragment's run_every: one per fragment, kept while the interval is the same."""
        if fragment_id in self._timers:
            return

        async def tick() -> None:
            while True:
                await asyncio.sleep(interval)
                self._sent.append(time.perf_counter())
                await self.v.ws.send(rerun_msg(urlencode(self.v.query), fragment_id))
        self._timers[fragment_id] = asyncio.create_task(tick())

    async def close(self) -> None:
        self._closing = True
        for task in [*self._timers.values(), self._reader]:
            if task is not None:
                task.cancel()
        await self.v.close()


async def server_at_rest(cpu, quiet: float = 0.1, window: float = 2.0, longest: float = 180.0) -> float:
    """Wait until the server works less than `quiet` of a core over `window` seconds (the lecture's recordings
    prepared in the background, as a lecturer who opens the lecture before the class starts finds them); the
    seconds waited, at most `longest`."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < longest:
        c0 = cpu()
        await asyncio.sleep(window)
        if cpu() - c0 < quiet * window:
            break
    return round(time.perf_counter() - t0, 1)


async def lecture_run(port: int, key: str, args, cpu, deadline: float) -> tuple[dict, list[dict], dict]:
    """The scenario: times per action (ACTIONS), errors, and what the room cost the server (`cpu()` reads the
    server's CPU seconds so far): per step from the press until every follower showed it, and per second between
    steps while the followers wait; with args.quiet_prompts, per action kind measured with one follower or none.
    No step starts after `deadline` (time.monotonic()); the steps done so far are reported."""
    times: dict[str, list[float]] = {a: [] for a in ACTIONS}
    errors: list[dict] = []
    sticky = args.processes > 1
    presenter = Visitor(port, args.timeout, sticky=sticky)
    rng = random.Random(args.seed)
    followers = [Follower(n, port, args.timeout, sticky) for n in range(args.visitors)]
    report: dict = {"lecture": args.lecture, "followers": args.visitors, "steps": args.steps,
                    "step_every_s": args.step_every}

    def problem(who, action: str, text: str) -> None:
        errors.append({"visitor": who, "action": action, "problem": text})

    async def arrive(f: Follower) -> None:
        await asyncio.sleep(rng.uniform(0, args.ramp))
        try:
            times["open"].append(await f.open(urlencode({"lang": "zh" if f.n % 3 == 2 else "en"})))
        except asyncio.TimeoutError:
            problem(f.n, "open", f"no page within {args.timeout} s")

    try:
        await presenter.connect()
        _, said = await presenter.rerun(urlencode({"lecture": args.lecture, "step": 1, "room_key": key,
                                                   "presenter": 1}))
        for p in said:
            problem("presenter", "open", p)
        if "lecture_next" not in presenter.ids:
            problem("presenter", "open", "the presenter's page has no Next button (is the key right?)")
            return times, errors, report
        await asyncio.gather(*(arrive(f) for f in followers))
        report["prepared_after_s"] = await server_at_rest(cpu)
        t_steps, step_cpu, idle = [], [], [0.0, 0.0]  # idle: CPU seconds and wall seconds between steps
        last = (time.perf_counter(), cpu())
        for step in range(2, args.steps + 2):
            await asyncio.sleep(max(0.0, t_steps[-1] + args.step_every - time.perf_counter()) if t_steps else 1.0)
            if time.monotonic() > deadline:
                problem("presenter", f"step {step}", "the time bound (--max-seconds) was reached")
                break
            t0, c0 = time.perf_counter(), cpu()
            if t_steps:  # from the last follower's page until this press: the room waiting
                idle = [idle[0] + c0 - last[1], idle[1] + t0 - last[0]]
            t_steps.append(t0)
            dt, said = await presenter.rerun(widget=("lecture_next", "trigger", True))
            times["present_step"].append(dt)
            for p in said:
                problem("presenter", f"step {step}", p)
            want = {k: presenter.query.get(k) for k in SAME}
            if want["step"] != str(step):
                problem("presenter", f"step {step}", f"the presenter's URL shows step {want['step']}")
                break
            bound = max(1.0, min(args.timeout, deadline + 30 - time.monotonic()))
            await asyncio.gather(*(f.wait(lambda f=f: f.settled(step, t0) is not None, bound) for f in followers))
            last = (time.perf_counter(), cpu())
            step_cpu.append(last[1] - c0)
            lags = []
            for f in followers:
                got = f.settled(step, t0)
                if got is None:
                    problem(f.n, f"step {step}", f"did not show step {step} within {bound:.0f} s")
                    continue
                lags.append(got[0] - t0)
                shown = f.shown_at(step, t0)
                if shown is not None:
                    times["follow_shown"].append(shown - t0)
                wrong = [f"{k}={got[1].get(k)!r} (presenter: {want[k]!r})" for k in SAME if got[1].get(k) != want[k]]
                if wrong:
                    problem(f.n, f"step {step}", "URL differs: " + ", ".join(wrong))
            times["follow"] += lags
            report.setdefault("follow_p95_by_step_s", []).append(round(percentile(lags, 95), 3) if lags else None)
            print(f"step {step}: {len(lags)} of {len(followers)} followers showed it, p95 "
                  f"{percentile(lags, 95) if lags else float('nan'):.2f} s; the server's CPU "
                  f"{step_cpu[-1]:.1f} s", file=sys.stderr, flush=True)
        for f in followers:
            times["poll"] += f.polls
            for p in f.problems:
                problem(f.n, "follow", p)
        report["server_cpu_per_step_s"] = round(sum(step_cpu) / max(1, len(step_cpu)), 3)
        report["server_cores_busy_between_steps"] = round(idle[0] / idle[1], 3) if idle[1] else None
        report["polls_per_s"] = round(len(times["poll"]) / max(1e-9, time.perf_counter() - t_steps[0]), 2) \
            if t_steps else 0.0
        if sticky:
            report["visitors_each"] = dict(sorted(collections.Counter(f.v.backend for f in followers).items()))
        if args.quiet_prompts and not errors and time.monotonic() < deadline:
            report["per_kind_quiet_s"] = await quiet_costs(presenter, followers, cpu)
    except asyncio.TimeoutError:
        problem("presenter", "step", f"timeout: no answer within {args.timeout} s")
    finally:
        await asyncio.gather(*(f.close() for f in followers))
        await presenter.close()
    return times, errors, report


async def quiet_costs(presenter: Visitor, followers: list[Follower], cpu, presses: int = 3) -> dict:
    """Server CPU seconds per action kind, from the presenter's presses with one follower and with none (back
    `presses` steps and forward again, over steps the load already opened): a press alone ("present_step"), what one
    follower adds to it ("follow"), and what a waiting follower costs per second ("wait_per_s")."""
    keep = followers[0]
    await asyncio.gather(*(f.close() for f in followers[1:]))

    async def press(key: str, follower: Follower | None) -> float:
        t0, c0 = time.perf_counter(), cpu()
        await presenter.rerun(widget=(key, "trigger", True))
        step = int(presenter.query.get("step", "0"))
        if follower is not None:
            await follower.wait(lambda: follower.settled(step, t0) is not None)
        await asyncio.sleep(0.3)  # the server's work after the last script_finished
        return cpu() - c0

    async def idle(seconds: float = 5.0) -> float:
        c0 = cpu()
        await asyncio.sleep(seconds)
        return (cpu() - c0) / seconds

    keys = ["lecture_prev"] * presses + ["lecture_next"] * presses
    with_one = [await press(k, keep) for k in keys]
    idle_one = await idle()
    await keep.close()
    alone = [await press(k, None) for k in keys]
    idle_none = await idle()
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    return {"present_step": round(mean(alone), 3), "follow": round(mean(with_one) - mean(alone), 3),
            "wait_per_s": round(idle_one - idle_none, 4)}
