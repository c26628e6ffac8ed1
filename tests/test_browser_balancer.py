"""`llama-explorer serve --processes 2`: two app processes behind HAProxy (docs/haproxy.cfg), in Chromium. Each
visitor is pinned to one process by the balancer's cookie, new visitors go to the least busy process, and the
recording download (a file the visitor's own process serves) arrives through the balancer. Stopping the command
stops every process it started."""
from __future__ import annotations

import io
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from browser_util import ROOT, browser, free_port, new_page, open_app, wait_idle  # noqa: F401

pytestmark = pytest.mark.browser
HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
if not Path(HAPROXY).exists():
    pytest.skip("HAProxy is not installed (apt-get install haproxy)", allow_module_level=True)


def healthy(url: str, procs, seconds: float = 180) -> None:
    end = time.time() + seconds
    while time.time() < end:
        assert all(p.poll() is None for p in procs), "a process of the fleet exited"
        try:
            if urllib.request.urlopen(url + "/_stcore/health", timeout=5).read() == b"ok":
                return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"{url} did not become healthy")


def children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


@pytest.fixture(scope="module")
def fleet():
    """`serve --processes 2` on a free port; on the way out, SIGTERM to the command must end its processes too."""
    import sys

    front = free_port()
    log = tempfile.TemporaryFile()
    cli = subprocess.Popen([sys.executable, "-m", "explorer_model.cli", "serve", "--processes", "2", "--port",
                            str(front)], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                           env=dict(os.environ, OMP_WAIT_POLICY="PASSIVE"))
    try:
        healthy(f"http://127.0.0.1:{front}", [cli])
        started = children(cli.pid)
        assert len(started) == 3, started  # two app servers and HAProxy
        yield f"http://127.0.0.1:{front}"
    finally:
        cli.terminate()
        cli.wait(30)
    end = time.time() + 1  # they may take up to a second to go; no need to wait that long when they are gone
    while (alive := [p for p in started if running(p)]) and time.time() < end:
        time.sleep(0.05)
    assert not alive, f"processes left running after the command stopped: {alive}"


def running(pid: int) -> bool:
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


def process_of(pg) -> str:
    return next(c["value"] for c in pg.context.cookies() if c["name"] == "EXPLORER")


def test_two_visitors_two_processes_and_each_download_arrives(fleet, browser):  # noqa: F811
    prompt = "The cat sat on the mat because it was warm"
    pages = [new_page(browser) for _ in range(2)]
    try:
        for pg in pages:
            open_app(pg, fleet, prompt=prompt, view="tokens")
            wait_idle(pg, started_within=1_000)  # a second run, if any, follows the first at once
        where = [process_of(pg) for pg in pages]
        assert sorted(where) == ["p1", "p2"]  # the second visitor went to the process with no connection
        for pg, name in zip(pages, where):
            button = pg.locator('[data-testid="stSidebar"] [data-testid="stDownloadButton"] button').first
            with pg.expect_download(timeout=120_000) as info:
                button.click()
            d = info.value
            assert d.failure() is None
            with np.load(io.BytesIO(Path(d.path()).read_bytes())) as data:
                assert "blocks.0.hook_resid_pre" in data.files and data["token_ids"].shape[-1] >= 9
            assert process_of(pg) == name  # still pinned to its process
    finally:
        for pg in pages:
            pg.context.close()
