"""What choosing a view costs the browser: in Debian's Chromium, the ten views of SmolLM2 chosen one after another
in the view selector, twice (the second round: each view drawn once before, the server's figures cached), and for
each view change Chromium's CPU seconds (all its processes, from /proc) until the page is drawn and quiet, the
figures Plotly drew (a new plot surface) that are not on the page when the view is done (a view drawing the last
view's figures again: none expected), and the most times Plotly drew any one figure of the view.

With --js-flags, Chromium's V8 gets those flags: the suite's browser runs with --js-flags=--max-opt=1 (V8's
baseline compiler only, tests/browser_util.py); run the script with and without it to compare.

Usage: .venv/bin/python bench/bench_view_change.py [--width 1280 --height 720] [--js-flags=--max-opt=1]
       (needs /usr/bin/chromium and playwright; prints JSON)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import urllib.parse
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/ modules, imported or run

from bench_browser_step import LONG_TASKS, STATE, chromium_args  # noqa: E402
from bench_page_load import PROMPT, QUIET_MS, chromium_cpu  # noqa: E402
from load_server import free_port, start_server, stop_server, wait_healthy  # noqa: E402
from machine import machine_line  # noqa: E402

# the chart key (st-key-…) of the page element a node is in, null if none
CHART_KEY = """el => { const holder = el.closest('[data-testid="stElementContainer"]');
    const key = holder && [...holder.classList].find(c => c.startsWith('st-key-')); return key ? key.slice(7) : null; }"""
# the chart keys (st-key-…) of every plot surface Plotly adds to the page, since the last reset (RESET), and how many
# times Plotly has drawn each figure (its plotly_afterplot events; the listener is attached as the first draw adds
# the plot's surface, before that draw ends)
DRAWN = """() => { window.__drawn = new Set(); window.__draws = {};
  const keyOf = """ + CHART_KEY + """;
  new MutationObserver(records => { for (const r of records) for (const n of r.addedNodes) {
    if (n.nodeType !== 1) continue;
    for (const svg of n.matches('.main-svg') ? [n] : n.querySelectorAll('.main-svg')) {
      const key = keyOf(svg);
      if (key) window.__drawn.add(key);
      const gd = svg.closest('.js-plotly-plot');
      if (gd && gd.on && !gd.__counted) {
        gd.__counted = true;
        gd.on('plotly_afterplot', () => { const k = keyOf(gd); if (k) window.__draws[k] = (window.__draws[k] || 0) + 1; });
      }
    } } }).observe(document, {childList: true, subtree: true}); }"""
RESET = "() => { window.__drawn.clear(); window.__draws = {}; }"
SHOWN = """() => [...document.querySelectorAll('[data-testid="stMain"] .js-plotly-plot')]
  .map(gd => (""" + CHART_KEY + """)(gd) || '')"""
BUTTONS = '.st-key-view [role="radio"]'


def settled(page) -> None:
    """The script run over and the page's main thread quiet for QUIET_MS."""
    page.wait_for_function(f"() => {STATE} !== 'running'", polling=100)
    page.wait_for_function(f"() => performance.now() - Math.max(window.__lastLongTask, 0) > {QUIET_MS}",
                           polling=200)


def main() -> None:
    print(machine_line(), file=sys.stderr, flush=True)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--width", type=int, default=1280)
    ap.add_argument("--height", type=int, default=720)
    ap.add_argument("--js-flags", default="", help="flags for V8, e.g. --max-opt=1 (as the test suite's browser)")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    port = free_port()
    proc = start_server(port, None, None, Path(tempfile.mkdtemp()) / "server.log")
    url = f"http://127.0.0.1:{port}/?" + urllib.parse.urlencode({"view": "tokens", "prompt": PROMPT, "lang": "en"})
    rounds = []
    try:
        wait_healthy(port, proc)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=chromium_args(args.js_flags))
            page = browser.new_context(viewport={"width": args.width, "height": args.height}).new_page()
            page.set_default_timeout(180_000)
            page.goto(url, wait_until="domcontentloaded")
            page.evaluate(LONG_TASKS)
            page.evaluate(DRAWN)
            page.wait_for_function("() => document.documentElement.dataset.screen === 'drawn'")
            settled(page)
            n = page.locator(BUTTONS).count()
            for _ in range(2):
                views = {}
                for i in [*range(1, n), 0]:  # from the page's first view on, ending where it began
                    page.evaluate(RESET)
                    before = chromium_cpu()
                    page.locator(BUTTONS).nth(i).click()
                    page.wait_for_function("() => new URLSearchParams(location.search).get('view') !== null")
                    page.wait_for_timeout(300)  # the click's run has started
                    settled(page)
                    view = urllib.parse.parse_qs(urllib.parse.urlparse(page.url).query).get("view", ["?"])[0]
                    others = sorted(set(page.evaluate("[...window.__drawn]")) - set(page.evaluate(SHOWN)))
                    views[view] = {"chromium_cpu_s": round(chromium_cpu() - before, 2), "drawn_not_shown": others,
                                   "most_draws": max(page.evaluate("window.__draws").values(), default=0)}
                rounds.append(views)
            browser.close()
    finally:
        stop_server(proc)
    print(json.dumps({"viewport": [args.width, args.height], "js_flags": args.js_flags, "rounds": rounds,
                      "total_cpu_s": [round(sum(v["chromium_cpu_s"] for v in r.values()), 2) for r in rounds],
                      "drawn_not_shown": sum(len(v["drawn_not_shown"]) for r in rounds for v in r.values()),
                      "most_draws": [max(v["most_draws"] for v in r.values()) for r in rounds],
                      "loadavg": round(os.getloadavg()[0], 2)}, indent=1))


if __name__ == "__main__":
    main()
