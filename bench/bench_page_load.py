"""What opening the app costs the browser: Chromium's CPU seconds (all its processes, from /proc) to load the
attention view of SmolLM2 until it is drawn for its screen and quiet, in a fresh page (a new browser context, as a
new visitor) and again in a page that has loaded the app before (a link opened in the same tab), interleaved.

A page that loaded the app before has Streamlit's and Plotly's JavaScript compiled, and the screen probe's cookie
(app/screen.py), so its figures are drawn once for its width instead of for a guess and again.

Usage: .venv/bin/python bench/bench_page_load.py [--rounds 4] [--width 1500 --height 1100] [--js-flags=--max-opt=1]
       (needs /usr/bin/chromium and playwright; prints JSON)
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
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/ modules, imported or run

from bench_browser_step import LONG_TASKS, STATE, chromium_args  # noqa: E402
from load_server import free_port, start_server, stop_server, wait_healthy  # noqa: E402
from machine import machine_line  # noqa: E402

PROMPT = "The quick brown fox jumps over the lazy dog because it wanted to see the other side."
QUIET_MS = 1500  # drawn: no long task on the page's main thread for this long


def chromium_cpu() -> float:
    """CPU seconds of the Chromium processes running now."""
    total = 0.0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"chromium" not in f.read():
                    continue
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except OSError:
            continue
    return total


def load(page, url: str) -> float:
    """Chromium's CPU seconds from opening `url` in `page` until the page is drawn and quiet."""
    before = chromium_cpu()
    page.goto(url, wait_until="domcontentloaded")
    page.evaluate(LONG_TASKS)
    page.wait_for_function("() => document.documentElement.dataset.screen === 'drawn'")
    page.wait_for_function(f"() => {STATE} !== 'running' && document.querySelector('.js-plotly-plot')")
    page.wait_for_function(f"() => performance.now() - Math.max(window.__lastLongTask, 0) > {QUIET_MS}",
                           polling=200)
    return chromium_cpu() - before


def main() -> None:
    print(machine_line(), file=sys.stderr, flush=True)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--width", type=int, default=1500)
    ap.add_argument("--height", type=int, default=1100)
    ap.add_argument("--js-flags", default="", help="flags for V8, e.g. --max-opt=1 (as the test suite's browser)")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    port = free_port()
    proc = start_server(port, None, None, Path(tempfile.mkdtemp()) / "server.log")
    url = f"http://127.0.0.1:{port}/?" + urllib.parse.urlencode({"view": "attention", "prompt": PROMPT})
    fresh, again = [], []
    try:
        wait_healthy(port, proc)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=chromium_args(args.js_flags))
            viewport = {"width": args.width, "height": args.height}
            warm = browser.new_context(viewport=viewport)
            load(warm.new_page(), url)  # the server's first page (its model loaded, the prompt recorded)
            warm.close()
            kept = browser.new_context(viewport=viewport).new_page()
            load(kept, url)
            for _ in range(args.rounds):
                ctx = browser.new_context(viewport=viewport)
                ctx.set_default_timeout(120_000)
                fresh.append(load(ctx.new_page(), url))
                ctx.close()
                again.append(load(kept, url))
            browser.close()
    finally:
        stop_server(proc)
    print(json.dumps({"view": "attention", "viewport": [args.width, args.height], "js_flags": args.js_flags,
                      "rounds": args.rounds,
                      "fresh_page_cpu_s": [round(x, 2) for x in fresh], "same_page_cpu_s": [round(x, 2) for x in again],
                      "median_fresh_s": round(statistics.median(fresh), 2),
                      "median_same_page_s": round(statistics.median(again), 2),
                      "loadavg": round(os.getloadavg()[0], 2)}, indent=1))


if __name__ == "__main__":
    main()
