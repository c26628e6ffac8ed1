"""A shared server's room in Chromium: the presenter (projector size, presenter mode) steps through a shipped lecture
with the clicker's keys (→, PageDown, space), and after each step three followers (a laptop, a phone and a large
screen) show the presenter's view, layer, head, token and prompt, in their URL and on their page. A follower explores on its own and
rejoins at the current step; the clicker's keys on a following page move nothing; a phone asks for whole views.
The same room on two processes: test_browser_room_processes.py; what both use: room_util.py."""
from __future__ import annotations

import pytest

from browser_util import browser  # noqa: F401
from room_util import (SharedServer, close, explore_and_rejoin, keys_do_not_move_the_room, open_room,
                       shows_whole_views, steps)

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    server = SharedServer(tmp_path_factory.mktemp("room1"))
    yield server
    server.stop()


def test_three_followers_follow_the_steps_and_one_explores_and_rejoins(browser, one_process):
    # From step 7: three Attention steps (their own heads and queries) and What-if, where a follower leaves to
    # explore; it rejoins on RoPE, where the next press went, and the clicker's keys on its page (which had the
    # player's key script while it explored) move nothing. The two-process test below walks earlier steps.
    presenter, followers = open_room(browser, one_process, step=7)
    try:
        now = steps(presenter, followers, 4, start=7)
        now = explore_and_rejoin(presenter, followers, now)
        keys_do_not_move_the_room(followers[2], followers, one_process, now)
        shows_whole_views(followers[1], now)  # a phone
    finally:
        close([presenter, *followers])
