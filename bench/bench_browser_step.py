"""A generation step as a person sees it: in Debian's Chromium, the Next token view, "Take the top token" clicked
--steps times; seconds from the click (the page's click event) until the page has settled: Streamlit's script state back to not running
(the extended recording, its lens and the whole view sent) and the browser done drawing it (the end of the last
long task, > 50 ms, on the page's main thread: Plotly keeps drawing after the script state changes).

Usage: .venv/bin/python bench/bench_browser_step.py [--steps 5]   (needs /usr/bin/chromium and playwright)
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from load_server import free_port, start_server, stop_server, wait_healthy  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/ modules, imported or run
from machine import machine_line  # noqa: E402

# 28 tokens of SmolLM2: the steps run at 28-36 tokens, around a 30-token classroom prompt
PROMPT = ("In the morning the teacher wrote three equations on the board and asked the class to explain, one student"
          " at a time, how each of them")
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run"]
STATE = "document.querySelector('[data-testid=\"stApp\"]')?.getAttribute('data-test-script-state')"
# Keeps the end (performance.now() ms) of the page's last long task; a step's drawing ends there.
LONG_TASKS = """() => { window.__lastLongTask = 0;
  new PerformanceObserver(list => { for (const e of list.getEntries())
    window.__lastLongTask = Math.max(window.__lastLongTask, e.startTime + e.duration); })
  .observe({type: 'longtask', buffered: true});
  document.addEventListener('click', () => { window.__clickAt = performance.now(); }, true); }"""
QUIET_S = 1.0  # a step counts as drawn when no long task started for this long after the script state settled


def chromium_args(js_flags: str = "") -> list[str]:
    """FLAGS, and V8's flags when given: the test suite's browser runs with --max-opt=1 (tests/browser_util.py), a
    visitor's with V8's defaults; --js-flags on a benchmark's command line compares the two."""
    return FLAGS + ([f"--js-flags={js_flags}"] if js_flags else [])


def main() -> None:
    print(machine_line(), file=sys.stderr, flush=True)
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    port = free_port()
    proc = start_server(port, None, None, Path(tempfile.mkdtemp()) / "server.log")
    try:
        wait_healthy(port, proc)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=FLAGS)
            page = browser.new_page(viewport={"width": 1500, "height": 1100})
            page.set_default_timeout(120_000)
            page.goto(f"http://127.0.0.1:{port}/?" + urllib.parse.urlencode({"view": "predict", "prompt": PROMPT}))
            page.evaluate(LONG_TASKS)
            button = page.get_by_role("button", name="Take the top token")
            button.wait_for()
            page.wait_for_function(f"() => {STATE} !== 'running'")
            sent, drawn = [], []
            for _ in range(args.steps):
                time.sleep(QUIET_S)
                button.click()
                page.wait_for_function(f"() => {STATE} === 'running'", timeout=5_000)
                page.wait_for_function(f"() => {STATE} !== 'running'")
                t1 = page.evaluate("performance.now()")
                time.sleep(QUIET_S)
                t0, last = page.evaluate("[window.__clickAt, window.__lastLongTask]")
                sent.append((t1 - t0) / 1000)
                drawn.append((max(t1, last) - t0) / 1000)
                button.wait_for()
            tokens = page.locator('[data-testid="stSidebar"] textarea').first.input_value()
            browser.close()
    finally:
        stop_server(proc)
    print(json.dumps({"prompt_chars": len(PROMPT), "steps": args.steps,
                      "script_done_s": [round(t, 3) for t in sent], "drawn_s": [round(t, 3) for t in drawn],
                      "median_script_done_s": round(statistics.median(sent), 3),
                      "median_drawn_s": round(statistics.median(drawn), 3), "max_drawn_s": round(max(drawn), 3),
                      "prompt_after": tokens[-60:], "loadavg": round(os.getloadavg()[0], 2)}, ensure_ascii=False,
                     indent=1))


if __name__ == "__main__":
    main()
