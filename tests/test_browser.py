"""End to end in Debian's Chromium: start the server, type a prompt, browse views, save screenshots.

Screenshots go to $SCREENSHOT_DIR (default artifacts/screenshots); the README's come from
`SCREENSHOT_DIR=docs/screenshots pytest tests/test_browser.py`.
"""
from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.browser

if not Path(CHROMIUM).exists():
    pytest.skip("Debian's chromium is not installed (apt-get install chromium)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    from explorer_model.serve import streamlit_command

    port = free_port()
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
    proc = subprocess.Popen(streamlit_command(port), cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 90
    while time.time() < deadline:
        try:
            if urllib.request.urlopen(url + "/_stcore/health", timeout=2).read() == b"ok":
                break
        except OSError:
            time.sleep(0.5)
    else:
        proc.kill()
        pytest.fail("the Streamlit server did not start: " + proc.stdout.read().decode(errors="replace")[-2000:])
    yield url
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture(scope="module")
def page(server):
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run"])
        pg = browser.new_page(viewport={"width": 1500, "height": 1100})
        requests: list[str] = []
        pg.on("request", lambda r: requests.append(r.url))
        pg.requests = requests
        yield pg
        browser.close()


def shots_dir() -> Path:
    d = Path(os.environ.get("SCREENSHOT_DIR", ROOT / "artifacts" / "screenshots"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def wait_idle(pg, timeout=60_000):
    """Streamlit shows a 'Running…' status widget while the script runs."""
    pg.wait_for_timeout(300)
    pg.wait_for_function("() => !document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=timeout)


def pick_view(pg, label: str):
    pg.locator('[data-testid="stButtonGroup"]').get_by_text(label, exact=True).click()
    wait_idle(pg)


def test_type_prompt_browse_views_and_switch_language(server, page):
    page.goto(server + "/?view=attention", wait_until="domcontentloaded")
    page.wait_for_selector('[data-testid="stSidebar"] textarea', timeout=90_000)
    wait_idle(page, 120_000)
    box = page.locator('[data-testid="stSidebar"] textarea')
    box.fill("I love machine learning because it")
    box.press("Control+Enter")
    wait_idle(page)
    heatmap = page.locator(".js-plotly-plot").first
    heatmap.wait_for(timeout=60_000)
    assert page.locator(".js-plotly-plot .heatmaplayer").count() > 0
    page.wait_for_timeout(800)  # let Plotly finish drawing
    page.screenshot(path=str(shots_dir() / "attention.png"), full_page=False)
    assert "because" in page.locator("body").inner_text()

    page.locator('[data-testid="stSidebar"]').get_by_text("中文", exact=True).click()
    wait_idle(page)
    assert "注意力" in page.locator("body").inner_text()
    page.screenshot(path=str(shots_dir() / "attention_zh.png"))

    pick_view(page, "RoPE")
    page.locator(".js-plotly-plot").first.wait_for(timeout=60_000)
    page.wait_for_timeout(800)
    page.screenshot(path=str(shots_dir() / "rope_zh.png"))

    pick_view(page, "SwiGLU")
    page.locator(".js-plotly-plot").first.wait_for(timeout=60_000)
    page.wait_for_timeout(800)
    page.screenshot(path=str(shots_dir() / "swiglu_zh.png"))
    assert "view=swiglu" in page.url and "lang=zh" in page.url

    outside = [u for u in page.requests if not u.startswith(server.replace("http", "ws")) and
               not u.startswith(server) and not u.startswith("data:") and not u.startswith("blob:")]
    assert outside == [], f"the page fetched from outside this machine: {outside[:5]}"


def test_copied_link_opens_the_same_picture(server, page):
    page.goto(server + "/?view=norm&lang=en&layer=4&token=2&prompt=The+bank+approved+the+loan.",
              wait_until="domcontentloaded")
    page.locator(".js-plotly-plot").first.wait_for(timeout=90_000)
    wait_idle(page)
    text = page.locator("body").inner_text()
    assert "RMSNorm" in text
    assert page.locator('[data-testid="stSidebar"] textarea').input_value() == "The bank approved the loan."
    page.screenshot(path=str(shots_dir() / "rmsnorm.png"))
