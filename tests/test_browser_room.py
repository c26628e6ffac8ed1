"""A shared server's room in Chromium, served as `serve --share --processes 2` (HAProxy in front of two app servers,
one room file): the presenter (projector size, presenter mode) steps through a shipped lecture with the clicker's
keys (→, PageDown, space), and after each step two followers (a laptop on the presenter's process, a phone on the
other) show the presenter's view, layer, head, token and prompt, in their URL and on their page.

A follower explores on its own and rejoins at the current step; nothing a follower does moves the room (the
clicker's keys, a lecture link to another step, a wrong key, a raw websocket client pressing the presenter's Next
button); a phone asks for whole views; a backend killed with SIGKILL is restarted by `serve` and its followers
follow again. A follower on the presenter's own process is what a one-process room has: the room is the same SQLite
file read the same way by every process (explorer_model/room.py). What the scenario's steps do: room_util.py.

The balancer's part: each page is pinned to one process by HAProxy's cookie and new pages go to the less busy
process (the followers land on both), a recording download (a file only the page's own process holds) arrives
through the balancer, and SIGTERM to `serve` ends every process it started."""
from __future__ import annotations

import io
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from browser_util import browser  # noqa: F401
from room_util import (HAPROXY, SharedServer, cannot_move_the_room, close, explore_and_rejoin, follow, lag_line,
                       open_room, press, process_of, shows_whole_views, steps, wait_until)

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    if not HAPROXY.exists():
        pytest.skip("HAProxy is not installed (apt-get install haproxy)")
    server = SharedServer(tmp_path_factory.mktemp("room"), processes=2)
    started = server.children()
    assert len(started) == 3, started  # two app servers and HAProxy
    yield server
    server.stop()
    end = time.time() + 1  # they may take up to a second to go; no need to wait that long when they are gone
    while (alive := [pid for pid in started if running(pid)]) and time.time() < end:
        time.sleep(0.05)
    if alive:
        os.killpg(server.proc.pid, signal.SIGKILL)  # (its own session: start_new_session)
    assert not alive, f"processes left running after serve stopped: {alive}"


def running(pid: int) -> bool:
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


def test_followers_on_both_processes_follow_explore_rejoin_cannot_move_the_room_and_survive_a_killed_backend(
        browser, two_processes):
    # From step 7: two Attention steps (their own heads and queries), then a follower explores while the room moves
    # on and rejoins; the followers try to move the room (What-if is the step after); the backend without the
    # presenter is killed and its followers follow RoPE, the next step, after its restart; a phone asks for whole
    # views of RoPE.
    server = two_processes
    presenter, followers = open_room(browser, server, step=7)
    try:
        where = [process_of(pg) for pg in followers]
        assert set(where) == {"p1", "p2"} and process_of(presenter) in where, where  # followers on both processes
        now = steps(presenter, followers, 2, start=7)
        now = explore_and_rejoin(presenter, followers, now)
        now = cannot_move_the_room(presenter, followers, server, now)
        victim = next(name for name in ("p1", "p2") if name != process_of(presenter))
        assert victim in where
        pid = server.backends()[victim]
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: server.backends().get(victim, pid) != pid, 60,  # one listing: it changes meanwhile
                   "serve to restart the killed backend")
        t0, now = press(presenter, "ArrowRight", int(now["step"]) + 1)
        print(f"step {now['step']} after the restart: " + lag_line(follow(now, followers, t0)))
        assert "restarting it (1 in the last minute)" in server.output()
        shows_whole_views(followers[1], now)  # a phone
        laptop = followers[0]  # the sidebar's recording, from the laptop's own process, through the balancer
        pinned = process_of(laptop)
        button = laptop.locator('[data-testid="stSidebar"] [data-testid="stDownloadButton"] button').first
        with laptop.expect_download(timeout=120_000) as info:
            button.click()
        assert info.value.failure() is None
        with np.load(io.BytesIO(Path(info.value.path()).read_bytes())) as data:
            assert "blocks.0.hook_resid_pre" in data.files and data["token_ids"].shape[-1] >= 2
        assert process_of(laptop) == pinned  # still pinned to its process
    finally:
        close([presenter, *followers])
