"""The steps of the room's browser test (test_browser_room.py): a shared server started as `serve --share` starts
it, what a page shows and its history, following, and a raw websocket client that tries to move the room.

Each follower's lag per step is printed: measured, never asserted (bench/bench_load.py --lecture measures it
under load); every wait is for a condition, with a generous timeout."""
from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from unittest import mock

import pytest

from browser_util import ROOT, another_page, free_port, new_page, open_app, query, settle_figures, steady, wait_idle
from explorer_model.cli.room_load import presenter_key
from explorer_model.cli.visitor import Visitor
from explorer_model.room import Room, runtime_dir

HAPROXY = Path("/usr/sbin/haproxy")
LECTURE, STEPS = "tutorial-000", 21
CLICKER = ("ArrowRight", "PageDown", " ")
# One follower per role: a laptop that only follows, and a phone that explores on its own, rejoins and asks for whole
# views (the size of a class is bench/bench_load.py --lecture's to measure). The laptop is a second page of the
# presenter's browser context (None: its own session, the presenter's balancer cookie, so the presenter's process;
# the app's scripts not fetched and compiled again); the phone has a context of its own, which HAProxy gives the
# process with fewer connections: the one without the presenter.
FOLLOWERS = ((1280, 720, None), (390, 844, {"is_mobile": True, "has_touch": True}))
URL_STATE = ("lecture", "step", "model", "prompt", "view", "layer", "head", "token")
FOLLOW_TIMEOUT = 240  # seconds: a generous bound on a busy machine, not a speed (bench/ measures that)

# What a page shows: the player's counter and step title, the view selector's choice, the sidebar's prompt and
# sliders (the sidebar is in the page even when folded away); `running` while a script run is in progress.
SHOWN = """() => {
    const text = sel => (document.querySelector(sel)?.textContent || '').trim();
    const value = sel => document.querySelector(sel)?.value ?? null;
    const counter = [...document.querySelectorAll('[data-testid="stMain"] p')]
        .map(p => p.textContent).find(t => /^Step \\d+ \\/ \\d+/.test(t)) || '';
    return {counter: counter.split(' · ')[0], title: text('.st-key-lecture_bar h3'),
            view: text('.st-key-view [role="radio"][aria-checked="true"]'), prompt: value('.st-key-prompt textarea'),
            layer: value('.st-key-layer input[type="range"]'), head: value('.st-key-head input[type="range"]'),
            token: value('.st-key-token input[type="range"]'),
            running: document.querySelector('[data-testid="stApp"]')?.getAttribute('data-test-script-state')
                     === 'running'};
}"""
# Every page keeps the history of what it shows (SHOWN and its URL, with the time of each change, checked every
# 50 ms), so a follower's lag is read from the page itself, not from when this test got round to looking at it.
HISTORY = """(() => {
    window.__shown = [];
    let last = '';
    setInterval(() => {
        if (!document.querySelector('[data-testid="stApp"]')) return;
        const now = JSON.stringify([(%s)(), location.search]);
        if (now !== last) { last = now; window.__shown.push([Date.now(), now]); window.__shown.splice(0, window.__shown.length - 400); }
    }, 50);
})()""" % SHOWN


class SharedServer:
    """`llama-explorer serve --share --no-lab [--processes N]` on a free loopback port: its address, the presenter's
    key (from the link it printed) and its room's file."""

    def __init__(self, folder: Path, processes: int = 1):
        self.port, self.folder, self.processes = free_port(), folder, processes
        self.log = folder / "serve.log"
        env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", XDG_RUNTIME_DIR=str(folder), PYTHONPATH=str(ROOT))
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "explorer_model.cli", "serve", "--share", "--no-lab",
                                          "--port", str(self.port), "--processes", str(processes)], cwd=ROOT,
                                         env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.url = f"http://127.0.0.1:{self.port}"
        self.key = presenter_key(self.log, 120)
        with mock.patch.dict(os.environ, {"XDG_RUNTIME_DIR": str(folder)}):
            self.room = Room(runtime_dir(self.port) / "room.sqlite3")
        wait_until(lambda: healthy(self.port) or self.proc.poll() is not None, 240, "the server to answer")
        assert self.proc.poll() is None, self.output()

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def backends(self) -> dict[str, int]:
        """{HAProxy's cookie value (p1, p2): the pid of the app server behind it, for those running}."""
        by_port, config = {}, None
        for pid in self.children():
            try:
                args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:  # ended since ps listed it
                continue
            if b"--server.port" in args:
                by_port[int(args[args.index(b"--server.port") + 1])] = pid
            elif b"-f" in args:
                config = Path(args[args.index(b"-f") + 1].decode()).read_text()
        return {name: by_port[int(port)] for name, port in re.findall(r"server (p\d+) 127\.0\.0\.1:(\d+)", config)
                if int(port) in by_port}  # (a killed one is absent until it is started again)

    def children(self) -> list[int]:
        """The pids of the processes `serve` started (app servers, HAProxy)."""
        out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(self.proc.pid)], capture_output=True, text=True)
        return [int(pid) for pid in out.stdout.split()]

    def stop(self) -> None:
        """SIGTERM to `serve` alone, as a service manager stops it: it must stop what it started (the caller checks)."""
        os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def healthy(port: int) -> bool:
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=5).read() == b"ok"
    except OSError:
        return False


def wait_until(condition, seconds: float, what: str) -> None:
    end = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > end:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.1)


# --------------------------------------------------------------------------- what a page shows
def as_state(shown: dict, search: str) -> dict:
    url = {k: v[-1] for k, v in urllib.parse.parse_qs(search.lstrip("?")).items()}
    return {**{k: url.get(k) for k in URL_STATE}, **{f"shown_{k}": v for k, v in shown.items()}}


def state(pg) -> dict:
    """The page's URL state and what it shows (SHOWN)."""
    return as_state(pg.evaluate(SHOWN), urllib.parse.urlparse(pg.url).query)


def shows(page_state: dict, wanted: dict) -> bool:
    """Whether a page shows what `wanted` (the presenter's page) shows, and has finished drawing it."""
    return not page_state["shown_running"] and all(page_state[k] == v for k, v in wanted.items())


def history(pg) -> list[tuple[float, dict]]:
    return [(t / 1000, as_state(*json.loads(entry))) for t, entry in pg.evaluate("window.__shown")]


def follow(wanted: dict, followers: list, since: float) -> list[tuple[float, float]]:
    """Wait until every follower shows what the presenter shows; then, from each page's own history, when it first
    showed the step's number (the player's counter) and when it first showed all of it, drawn, in seconds after
    `since` (time.time())."""
    end, last = time.monotonic() + FOLLOW_TIMEOUT, {}
    pending = list(range(len(followers)))
    while pending:
        for i in list(pending):
            last[i] = state(followers[i])
            if shows(last[i], wanted):
                pending.remove(i)
        if pending and time.monotonic() > end:
            differ = {i: {k: v for k, v in last[i].items() if v != wanted.get(k)} for i in pending}
            pytest.fail(f"followers {pending} did not follow within {FOLLOW_TIMEOUT} s; they show {differ}, "
                        f"the presenter {wanted}")
        time.sleep(0.2 if pending else 0)  # the lag is read from each page's own history, not from this loop
    lags = []
    for pg in followers:
        seen: list = []
        wait_until(lambda: seen.extend(h for h in history(pg) if h[0] >= since and shows(h[1], wanted)) or seen,
                   5, "the page's history to hold what it shows")  # recorded within 50 ms of being shown
        counter = next(t for t, h in history(pg) if t >= since and h["shown_counter"] == wanted["shown_counter"])
        lags.append((counter - since, seen[0][0] - since))
    return lags


def lag_line(lags: list[tuple[float, float]]) -> str:
    return ("its number shown after " + ", ".join(f"{a:.2f}" for a, _ in lags) + " s; drawn after "
            + ", ".join(f"{b:.2f}" for _, b in lags) + " s")


def press(presenter, key: str, step: int) -> tuple[float, dict]:
    """The clicker's key on the presenter's page; (when it was pressed, what the page then shows at `step`)."""
    t0 = time.time()
    presenter.keyboard.press(key)
    wait_idle(presenter)
    s = state(presenter)
    assert s["step"] == str(step) and s["shown_counter"] == f"Step {step} / {STEPS}", s
    return t0, {k: v for k, v in s.items() if k != "shown_running"}


def room_of(presenter_state: dict) -> tuple[str, int]:
    return LECTURE, int(presenter_state["step"]) - 1


# --------------------------------------------------------------------------- a raw websocket client
async def crafted_messages(port: int, sticky: bool) -> list[str]:
    """A student's page spoken to without a browser: it explores and presses its own Next (its page moves), rejoins,
    then presses Next by the widget id it learnt, claims the presenter's flag as a widget, and reruns with a guessed
    key in its query. Returns the problems its pages showed (there should be none: these change only its own
    page)."""
    from streamlit.proto.BackMsg_pb2 import BackMsg

    v = Visitor(port, FOLLOW_TIMEOUT, sticky=sticky)
    said: list[str] = []
    try:
        await v.connect()
        said += (await v.rerun(""))[1]
        assert "room_detach" in v.ids and "lecture_next" not in v.ids  # a follower: no Next button to press
        said += (await v.rerun(widget=("room_detach", "trigger", True)))[1]
        assert "lecture_next" in v.ids  # exploring: its own Previous / Next, and now their ids
        step = v.query["step"]
        said += (await v.rerun(widget=("lecture_next", "trigger", True)))[1]
        assert int(v.query["step"]) == int(step) + 1  # its own page moves, the room does not (checked by the caller)
        said += (await v.rerun(widget=("room_rejoin", "trigger", True)))[1]
        assert v.query["step"] == step
        said += (await v.rerun(widget=("lecture_next", "trigger", True)))[1]
        msg = BackMsg()
        for widget_id, flag in ((v.ids["lecture_next"], "trigger_value"), ("room_presenter", "bool_value")):
            state_ = msg.rerun_script.widget_states.widgets.add()
            state_.id = widget_id
            setattr(state_, flag, True)
        await v.ws.send(msg.SerializeToString())
        said += await v._read_run()
        said += (await v.rerun(f"lecture={LECTURE}&step=9&room_key=guess&presenter=1"))[1]
    finally:
        await v.close()
    return said


# --------------------------------------------------------------------------- the scenario
def room_page(browser, width: int, height: int, **extra):
    pg = new_page(browser, width, height, **extra)
    pg.context.add_init_script(HISTORY)
    return pg


def open_room(browser, server: SharedServer, step: int = 1):
    """The presenter's page and the FOLLOWERS' pages, each with the room open."""
    presenter = room_page(browser, 1280, 720)
    open_app(presenter, server.url, lecture=LECTURE, step=step, room_key=server.key, presenter=1)
    assert "room_key" not in query(presenter)  # the key leaves the address bar
    followers = [another_page(presenter) if extra is None else room_page(browser, w, h, **extra)
                 for w, h, extra in FOLLOWERS]
    for pg in followers:
        open_app(pg, server.url)
        assert pg.locator(".st-key-lecture_next button").count() == 0  # no way to move the room
    presenter.locator('[data-testid="stMain"] h1').first.click()  # the keys go to the page, not a text box
    return presenter, followers


def steps(presenter, followers, n: int, start: int = 1) -> dict:
    """The presenter presses the clicker's keys n times from step `start`; after each step every follower shows
    what it shows."""
    now = None
    for step in range(start + 1, start + 1 + n):
        t0, now = press(presenter, CLICKER[step % len(CLICKER)], step)
        print(f"step {step} ({now['view']}): " + lag_line(follow(now, followers, t0)))
        for pg in followers:
            player_on_screen(pg, f"step {step}")
    return now


# the player's box (counter, title, caption and the follower's Explore button) against the screen's free part
PLAYER_BOX = """() => { const bar = document.querySelector('.st-key-lecture_bar');
    const r = bar && bar.getBoundingClientRect();
    return r && {top: r.top, bottom: r.bottom, screen: innerHeight,
                 header: document.querySelector('[data-testid="stHeader"]').getBoundingClientRect().bottom}; }"""


def player_on_screen(pg, what: str) -> None:
    """Once the page has landed on the step's part (its scroll held still), the player is whole on the screen under
    the header: a student reads which step this is and what to look at beside the part, and can explore."""
    steady(pg, "String(document.querySelector('[data-testid=\"stMain\"]').scrollTop)", 600)
    box = pg.evaluate(PLAYER_BOX)
    size = pg.viewport_size
    assert box and box["header"] - 1 <= box["top"] and box["bottom"] <= box["screen"] + 1, \
        f"{what}: the player of the {size['width']}×{size['height']} follower is at y={box and round(box['top'])}.." \
        f"{box and round(box['bottom'])} px, not whole on its screen under the header"
    assert pg.locator(".st-key-lecture_bar .st-key-room_detach button").count() == 1, \
        f"{what}: the follower's player holds no Explore button"


def explore_and_rejoin(presenter, followers, now: dict) -> dict:
    """The last follower (the phone) explores on its own (another view, another layer) while the room moves on, then
    rejoins at the current step."""
    explorer = followers[-1]
    others = [pg for pg in followers if pg is not explorer]
    explorer.locator(".st-key-room_detach button").click()
    wait_idle(explorer)
    labels = explorer.locator('.st-key-view [role="radio"]')
    other_view = next(t.strip() for t in labels.all_inner_texts() if t.strip() != now["shown_view"])
    labels.get_by_text(other_view, exact=True).first.click()
    wait_idle(explorer)
    explorer.locator('.st-key-layer input[type="range"]').press("ArrowRight")
    wait_idle(explorer)
    own = state(explorer)
    assert own["shown_view"] == other_view and own["layer"] != now["layer"] and own["step"] == now["step"], own
    back = explorer.locator(".st-key-room_rejoin button")  # the way back names the room's step (in English)
    assert back.inner_text().strip() == f"Back to the lecture (now step {now['step']} / {STEPS})", back.inner_text()
    box = back.bounding_box()
    assert box and box["x"] >= 0 and box["x"] + box["width"] <= explorer.viewport_size["width"], box
    t0, now = press(presenter, "ArrowRight", int(now["step"]) + 1)
    follow(now, others, t0)
    assert {k: v for k, v in state(explorer).items() if k != "shown_running"} == \
        {k: v for k, v in own.items() if k != "shown_running"}  # the room moved on without it
    t0 = time.time()
    explorer.locator(".st-key-room_rejoin button").click()
    print(f"rejoined at step {now['step']}: " + lag_line(follow(now, [explorer], t0)))
    return now


def keys_do_not_move_the_room(page, followers, server: SharedServer, now: dict) -> None:
    """The clicker's keys on a following page move neither the room nor any page."""
    before = server.room.current()
    assert (before["name"], before["step"]) == room_of(now)
    page.locator('[data-testid="stMain"] h1').first.click()
    for key in CLICKER:
        page.keyboard.press(key)
    follow(now, followers, 0)
    assert server.room.current() == before


def shows_whole_views(page, now: dict) -> None:
    """A following page shows the step's part of its view alone; "Show whole views" shows every part, and the page
    still shows the room's step."""
    charts = page.locator('[data-testid="stMain"] .js-plotly-plot')
    alone = charts.count()
    page.locator(".st-key-room_rest button").click()
    wait_idle(page)
    settle_figures(page)
    assert charts.count() > alone >= 1, (alone, charts.count())
    assert page.locator(".st-key-room_rest").count() == 0 and page.locator(".st-key-room_part button").count() == 1
    assert {k: v for k, v in state(page).items() if k != "shown_running"} == now


def cannot_move_the_room(presenter, followers, server: SharedServer, now: dict) -> dict:
    """A follower's keys, a lecture link, a wrong key and crafted websocket messages leave the room where it is: the
    presenter's next press then moves every page exactly one step."""
    keys_do_not_move_the_room(followers[-1], followers, server, now)
    before, linker = server.room.current(), followers[-1]
    open_app(linker, server.url, lecture=LECTURE, step=9)
    wrong = server.key[:-1] + ("y" if server.key.endswith("x") else "x")  # one character off, never the key itself
    open_app(linker, server.url, lecture=LECTURE, step=9, room_key=wrong, presenter=1)
    assert linker.locator(".st-key-lecture_next button").count() == 0
    with ThreadPoolExecutor(1) as pool:  # Playwright's own event loop runs in this thread
        assert pool.submit(asyncio.run, crafted_messages(server.port, sticky=server.processes > 1)).result() == []
    follow(now, followers, 0)  # every page, the link's and the keys' too, still at the room's step
    assert server.room.current() == before
    t0, now = press(presenter, "ArrowRight", int(now["step"]) + 1)
    follow(now, followers, t0)
    assert server.room.current()["version"] == before["version"] + 1
    return now


def close(pages) -> None:
    for pg in pages:
        pg.close()
        if not pg.context.pages:
            pg.context.close()


def process_of(pg) -> str:
    return next(c["value"] for c in pg.context.cookies() if c["name"] == "EXPLORER")
