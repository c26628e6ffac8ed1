"""The room of test_browser_room.py against `serve --share --processes 2`, with followers on both processes: nothing a
follower does moves the room (a lecture link to another step, a wrong key, the clicker's keys, a raw websocket
client pressing the presenter's Next button), and a backend killed with SIGKILL is restarted by `serve` and its
followers follow again."""
from __future__ import annotations

import os
import signal

import pytest

from browser_util import browser  # noqa: F401
from room_util import (HAPROXY, SharedServer, cannot_move_the_room, close, follow, lag_line, open_room, press,
                       process_of, steps, wait_until)

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    if not HAPROXY.exists():
        pytest.skip("HAProxy is not installed (apt-get install haproxy)")
    server = SharedServer(tmp_path_factory.mktemp("room2"), processes=2)
    yield server
    server.stop()


def test_two_processes_followers_on_both_cannot_move_the_room_and_a_killed_backend_s_follow_again(browser,
                                                                                                  two_processes):
    server = two_processes
    presenter, followers = open_room(browser, server, step=3)
    try:
        where = [process_of(pg) for pg in followers]
        assert set(where) == {"p1", "p2"}, where  # followers on both processes
        now = steps(presenter, followers, 2, start=3)  # (the restart then lands on a step whose lesson finds its head)
        now = cannot_move_the_room(presenter, followers, server, now)
        victim = next(name for name in ("p1", "p2") if name != process_of(presenter))
        assert victim in [process_of(pg) for pg in followers]
        pid = server.backends()[victim]
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: server.backends().get(victim, pid) != pid, 60,  # one listing: it changes meanwhile
                   "serve to restart the killed backend")
        t0, now = press(presenter, "ArrowRight", int(now["step"]) + 1)
        print(f"step {now['step']} after the restart: " + lag_line(follow(now, followers, t0)))
        assert "restarting it (1 in the last minute)" in server.output()
    finally:
        close([presenter, *followers])
