"""A shared server's room in Chromium: the presenter (projector size) steps with the keyboard, two followers (one at
phone size) show the same step, a follower explores on its own and rejoins at the current step."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request

from browser_util import ROOT, browser, free_port, new_page, open_app, query, wait_idle  # noqa: F401


def counter(pg) -> str:
    return pg.locator('[data-testid="stMain"] p').filter(has_text="Step ").first.inner_text()


def wait_step(pg, i: int, timeout: float = 60) -> float:
    """Seconds until the page shows step i (polled, not asserted as a speed: bench/ measures that)."""
    t0 = time.time()
    pg.wait_for_function(f"""() => [...document.querySelectorAll('[data-testid="stMain"] p')]
        .some(p => p.innerText.startsWith('Step {i} /'))""", timeout=timeout * 1000)
    return time.time() - t0


def start_shared(tmp_path):
    port = free_port()
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", XDG_RUNTIME_DIR=str(tmp_path), PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "explorer_model.cli", "serve", "--share", "--port", str(port),
                             "--no-lab"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, text=True)
    link = None
    while link is None:
        line = proc.stdout.readline()
        assert line, "the server stopped before printing its presenter link"
        if line.startswith("Presenter link"):
            link = line.strip().split(": ", 1)[1]
    key = link.split("room_key=")[1].split("&")[0]
    for _ in range(360):
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2).read() == b"ok":
                break
        except OSError:
            time.sleep(0.5)
    return proc, f"http://127.0.0.1:{port}", key


def test_followers_follow_the_presenter_detach_and_rejoin(browser, tmp_path):
    proc, url, key = start_shared(tmp_path)
    pages = []
    try:
        presenter = new_page(browser, 1280, 720)
        pages.append(presenter)
        open_app(presenter, url, lecture="tutorial-000", step=1, room_key=key, presenter=1)
        assert "room_key" not in query(presenter)
        followers = [new_page(browser, 1280, 720), new_page(browser, 390, 844, is_mobile=True, has_touch=True)]
        pages += followers
        for f in followers:
            open_app(f, url)
            assert counter(f).startswith("Step 1 / 21")
            assert f.locator(".st-key-lecture_next button").count() == 0
        presenter.locator('[data-testid="stMain"] h1').first.click()
        lags = []
        for i in (2, 3):
            presenter.keyboard.press("ArrowRight")
            wait_idle(presenter)
            assert counter(presenter).startswith(f"Step {i} / 21")
            lags += [wait_step(f, i) for f in followers]
        assert query(followers[1])["view"] == query(presenter)["view"]
        print("follow lags (s):", ", ".join(f"{x:.2f}" for x in lags))
        # a follower pressing the keys or opening a link to another step changes nothing in the room
        followers[0].keyboard.press("ArrowRight")
        followers[0].goto(url + "/?lecture=tutorial-000&step=9&room_key=guess", wait_until="domcontentloaded")
        wait_step(followers[0], 3)
        followers[1].locator(".st-key-room_detach button").click()
        wait_idle(followers[1])
        presenter.keyboard.press("ArrowRight")
        wait_idle(presenter)
        wait_step(followers[0], 4)
        time.sleep(2)
        assert counter(followers[1]).startswith("Step 3 / 21") and counter(presenter).startswith("Step 4 / 21")
        followers[1].locator(".st-key-room_rejoin button").click()
        wait_step(followers[1], 4)
    finally:
        for pg in pages:
            pg.context.close()
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
