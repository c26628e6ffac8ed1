"""Phones and the projector, in Debian's Chromium: every view at 390×844 (a phone: touch) and 1280×720 in
presenter mode (a projector), measured on what the browser draws (layout_util.py; the tablet, 768×1024, is
measured the same way by test_browser_downloads.py on its walk through every view).

For each view's main figure: as wide as its column, most of it plot. For every figure of the view: no text (SVG
text and its spans) under 12 px (14 px on the projector), no two tick labels of an axis overlapping (their boxes),
no text outside the figure, no title under Plotly's toolbar. The page never scrolls sideways; on the projector
tables are HTML tables of 14 px text or larger, the sidebar is folded away and each view's first figure starts on
the first screen (the eight core views; What-if and the lab open with their choices). A view chosen draws its own
figures only, not the last view's again while it fills. On the phone one tap on a cell of the attention map
selects it (the query/key pair below it changes to that cell), as a click does, and a swipe that starts on it
scrolls the page and selects nothing. Screenshots go to $SCREENSHOT_DIR (default
artifacts/screenshots) as layout_<screen>_<view>.png and presenter.png (the attention view's first projector
screen; `SCREENSHOT_DIR=docs/screenshots` regenerates the README's).
"""
from __future__ import annotations

import importlib.util
import io

import numpy as np
import pytest
from PIL import Image

from browser_util import (CORE_VIEWS, PROMPT, ROOT, browser, each_view_drawn, forget, module_page,  # noqa: F401
                          open_app, open_expanders, query, server, settle_figures, shots_dir, steady, sync_api,
                          view_errors, wait_idle)
from layout_util import MAIN, drawn_for_screen, page_problems, screenshot

pytestmark = pytest.mark.browser

# name: (viewport, browser context, link parameters, smallest text in px)
SCREENS = {
    "phone": ((390, 844), dict(is_mobile=True, has_touch=True), {}, 12),
    "projector": ((1280, 720), {}, {"presenter": "1"}, 14),
}


# the projector's first screen: this much of a view's main figure shows on it, the page scrolled to the top (the
# first Plotly figure of the view; in the tokens view the token chips, the prompt as the model reads it)
FIRST_SCREEN, VISIBLE_PX = 720, 150
FIRST_FIGURE = {"tokens": '[data-testid="stMarkdownContainer"] span[title]'}


def first_figure_box(pg, view: str) -> dict | None:
    """Top edge and height (px) of the view's first figure with the page scrolled to the top."""
    return pg.evaluate("""sel => { window.scrollTo(0, 0);
        const el = document.querySelector('[data-testid="stMain"] ' + sel);
        const box = el && (el.matches('span') ? el.parentElement : el).getBoundingClientRect();
        return box ? {top: box.top, height: box.height} : null; }""", FIRST_FIGURE.get(view, ".js-plotly-plot"))


def projector_problems(pg, view: str) -> list[str]:
    """Presenter mode kept in the link, the sidebar folded away, the view's first figure on the first screen."""
    problems = []
    if query(pg).get("presenter") != "1":
        problems.append(f"{view}: presenter mode is not kept in the URL: {pg.url}")
    sidebar = pg.locator('[data-testid="stSidebar"]')
    if sidebar.get_attribute("data-collapsed") != "true" or sidebar.bounding_box()["width"] >= 1:
        problems.append(f"{view}: presenter mode leaves the sidebar open")
    box = first_figure_box(pg, view)
    if box is None:
        problems.append(f"{view}: the view has no figure")
    elif box["top"] + min(VISIBLE_PX, box["height"]) > FIRST_SCREEN:
        problems.append(f"{view}: the first figure starts at y={box['top']:.0f} px, not on the first screen")
    if view == "attention":
        pg.screenshot(path=str(shots_dir() / "presenter.png"))
    return problems


@pytest.fixture(scope="module")
def page_for(browser):
    """One page per screen for the module's tests (the tap test opens its link in the phone's: a page load in a page
    that has loaded the app before costs the browser about half of a first one)."""
    made = {}

    def page(screen: str):
        if screen not in made:
            (width, height), context, _, _ = SCREENS[screen]
            made[screen] = module_page(browser, width, height, **context)
        return made[screen]
    yield page
    for pg in made.values():
        forget(pg)


def view_change_probe():
    """bench/bench_view_change.py's DRAWN (the chart keys of the figures Plotly draws and how many times it drew
    each, since the last RESET) and SHOWN (those on the page): a view chosen must draw its own figures only, not the
    last view's again while it fills (app/main.py's view_block), and none more than MOST_DRAWS times."""
    spec = importlib.util.spec_from_file_location("bench_view_change", ROOT / "bench" / "bench_view_change.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench.DRAWN, bench.SHOWN, bench.RESET


# Streamlit's chart hands Plotly each new figure twice as it mounts (two Plotly.react calls, each a full draw). A
# third draw is Plotly's after a font load: it draws a figure again when any font of the page that was not loaded
# as the drawing began has loaded by its end, and a view's first formulas load KaTeX's fonts while its figures
# draw (app/screen_probe.js loads the page's fonts first).
MOST_DRAWS = 2


@pytest.mark.parametrize("screen", SCREENS)
def test_every_view_fits_the_screen(server, page_for, screen):
    _, _, params, least = SCREENS[screen]
    pg = page_for(screen)
    drawn, shown, reset = view_change_probe()
    pg.add_init_script(f"({drawn})()")
    open_app(pg, server, lang="en", view="tokens", prompt=PROMPT, **params)
    drawn_for_screen(pg)
    problems, seen = [], []
    pg.evaluate(reset)
    for label, view in each_view_drawn(pg):
        seen.append(view)
        if view_errors(pg):
            problems.append(f"{view}: the view shows an error: {view_errors(pg)[0][:200]}")
        others = sorted(set(pg.evaluate("[...window.__drawn]")) - set(pg.evaluate(shown)))
        if others:
            problems.append(f"{view}: figures not on the page were drawn while it filled: {others}")
        again = {key: n for key, n in pg.evaluate("window.__draws").items() if n > MOST_DRAWS}
        if again:
            problems.append(f"{view}: figures drawn more than {MOST_DRAWS} times: {again}")
        problems += page_problems(pg, view, least, presenter=bool(params.get("presenter")))
        if params.get("presenter") and view in CORE_VIEWS:  # What-if and the lab open with their choices
            problems += projector_problems(pg, view)
        screenshot(pg, view, screen)
        pg.evaluate(reset)  # before the next view is chosen
    assert set(seen) == set(MAIN), f"the view selector offered {seen}"
    assert not problems, "\n".join(problems)


CELL = """(gd, [row, col]) => { const r = gd.querySelector('.nsewdrag').getBoundingClientRect();
    const n = gd.data[0].x.length;
    return {x: r.left + (col + 0.5) * r.width / n, y: r.top + (row + 0.5) * r.height / n, cell: r.width / n,
            labels: gd.data[0].x}; }"""
PAIR = "() => ['q', 'k'].map(s => document.querySelector(`.st-key-attn_link_${s} input`)?.value)"


def swipe(pg, x: float, y: float, dy: float) -> None:
    """A finger put down at (x, y) and moved dy px up or down in ten steps, then lifted (Chromium's touch input)."""
    cdp = pg.context.new_cdp_session(pg)
    cdp.send("Input.dispatchTouchEvent", {"type": "touchStart", "touchPoints": [{"x": x, "y": y}]})
    for i in range(1, 11):
        cdp.send("Input.dispatchTouchEvent", {"type": "touchMove", "touchPoints": [{"x": x, "y": y + dy * i / 10}]})
    cdp.send("Input.dispatchTouchEvent", {"type": "touchEnd", "touchPoints": []})
    cdp.detach()


def test_one_tap_selects_a_cell_and_a_swipe_only_scrolls(server, page_for):
    pg = page_for("phone")
    open_app(pg, server, lang="en", view="attention", prompt=PROMPT)
    drawn_for_screen(pg)
    chart = pg.locator(".st-key-attn_head .js-plotly-plot")
    chart.scroll_into_view_if_needed()
    before = pg.evaluate(PAIR)
    row, col = 4, 1  # a cell below the diagonal: one a query reads
    cell = chart.evaluate(CELL, [row, col])
    assert cell["cell"] >= 24, f"the attention map's cells are {cell['cell']:.0f} px: too small for a finger"
    target = [str(int(cell["labels"][i].split(":")[0])) for i in (row, col)]
    assert before != target
    pg.touchscreen.tap(cell["x"], cell["y"])
    try:  # the tap's page run sets the pair below the map
        pg.wait_for_function(f"t => JSON.stringify(({PAIR})()) === JSON.stringify(t)", arg=target, timeout=60_000)
    except sync_api.TimeoutError:
        pytest.fail(f"one tap on a cell did not select it: the pair below the map is {pg.evaluate(PAIR)}, "
                    f"the cell is {target}")
    wait_idle(pg, started_within=0)
    settle_figures(pg)

    chart.scroll_into_view_if_needed()
    start = chart.evaluate(CELL, [row + 1, col])
    top = pg.evaluate("document.querySelector('[data-testid=\"stMain\"]').scrollTop")
    swipe(pg, start["x"], start["y"], -250)
    steady(pg, "String(document.querySelector('[data-testid=\"stMain\"]').scrollTop)", 300)
    assert pg.evaluate("document.querySelector('[data-testid=\"stMain\"]').scrollTop") > top + 100, \
        "a swipe that starts on the map does not scroll the page"
    wait_idle(pg, started_within=2_000)
    assert pg.evaluate(PAIR) == target, "a swipe over the map selected a cell"

    # the formulas (attention's scores and mask) are wider than a phone: the edge a formula continues past shows a
    # shadow (app/page_style.py), which goes when it is scrolled to that end
    open_expanders(pg)
    formula = pg.locator(FORMULA).first
    formula.scroll_into_view_if_needed()
    assert formula.evaluate("e => e.scrollWidth - e.clientWidth") > 20, "the formula fits a phone: nothing to show"
    start = edge_shades(formula)
    formula.evaluate("e => { e.scrollLeft = e.scrollWidth; }")
    end = edge_shades(formula)
    assert start["right"] > SHADE and start["left"] < 1, f"at its start: {start}"
    assert end["left"] > SHADE and end["right"] < 1, f"scrolled to its end: {end}"


FORMULA = '[data-testid="stMain"] .katex-display'  # a display formula's box (KaTeX's, which scrolls sideways)
SHADE = 8  # of 255: how much darker the shadow makes the strip at an edge, on average, at least


def edge_shades(el) -> dict:
    """How much darker the page's style makes the outermost 4 px of the page's first formula box (el) on each side,
    against the same box without its background (the formula's own glyphs are in both), once its scroll holds."""
    steady(el.page, f"String(document.querySelector({FORMULA!r}).scrollLeft)", 200)
    shaded = Image.open(io.BytesIO(el.screenshot())).convert("L")
    el.evaluate("e => { e.style.background = 'none'; }")
    plain = Image.open(io.BytesIO(el.screenshot())).convert("L")
    el.evaluate("e => { e.style.background = ''; }")
    darker = np.asarray(plain, dtype=float) - np.asarray(shaded, dtype=float)  # rows × columns
    return {"left": round(float(darker[:, :4].mean()), 1), "right": round(float(darker[:, -4:].mean()), 1)}
