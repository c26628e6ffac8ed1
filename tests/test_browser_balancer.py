"""Several server processes behind HAProxy (docs/haproxy.cfg, README "More than one process"), in Chromium: each
visitor is pinned to one process by the balancer's cookie, new visitors go to the least busy process, and the
recording download (a file the visitor's own process serves) arrives through the balancer."""
from __future__ import annotations

import io
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


@pytest.fixture(scope="module")
def fleet():
    """Two `serve --share` processes (one torch thread each) and HAProxy in front, with the documented config."""
    from explorer_model.serve import haproxy_config, server_env, streamlit_command

    tmp = Path(tempfile.mkdtemp(prefix="balancer_"))
    ports, front = [free_port(), free_port()], free_port()
    env = dict(server_env(share=True), OMP_NUM_THREADS="1")
    procs = [subprocess.Popen(streamlit_command(p, "127.0.0.1"), cwd=ROOT, env=env, stderr=subprocess.STDOUT,
                              stdout=open(tmp / f"server{i}.log", "wb")) for i, p in enumerate(ports)]
    (tmp / "haproxy.cfg").write_text(haproxy_config(front, ports))
    procs.append(subprocess.Popen([HAPROXY, "-db", "-f", str(tmp / "haproxy.cfg")],
                                  stdout=open(tmp / "haproxy.log", "wb"), stderr=subprocess.STDOUT))
    try:
        for p in ports:
            healthy(f"http://127.0.0.1:{p}", procs)
        healthy(f"http://127.0.0.1:{front}", procs)
        yield f"http://127.0.0.1:{front}"
    finally:
        for p in procs:
            p.terminate()
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)


def process_of(pg) -> str:
    return next(c["value"] for c in pg.context.cookies() if c["name"] == "EXPLORER")


def test_two_visitors_two_processes_and_each_download_arrives(fleet, browser):  # noqa: F811
    prompt = "The cat sat on the mat because it was warm"
    pages = [new_page(browser) for _ in range(2)]
    try:
        for pg in pages:
            open_app(pg, fleet, prompt=prompt, view="tokens")
            wait_idle(pg)
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
