"""Phones, tablets and the projector, in Debian's Chromium: every view at 390×844 (a phone: touch), 768×1024 (a
tablet) and 1280×720 in presenter mode (a projector), measured on what the browser draws.

For each view's main figure: as wide as its column, most of it plot. For every figure of the view: no text (SVG
text and its spans) under 12 px (14 px on the projector), no two tick labels of an axis overlapping (their boxes),
no text outside the figure, no title under Plotly's toolbar. The page never scrolls sideways; on the projector
tables are HTML tables of 14 px text or larger, the sidebar is folded away and each view's first figure starts on
the first screen (the eight core views; What-if and the lab open with their choices). On the tablet (768 px wide)
no formula is clipped, with every expander open. On the phone one tap on a cell of the attention map selects it
(the query/key pair below it changes to that cell), as a click does, and a swipe that starts on it scrolls the page
and selects nothing. Screenshots go to $SCREENSHOT_DIR (default
artifacts/screenshots) as layout_<screen>_<view>.png, w768_<view>.png (the whole tablet page, expanders open) and
presenter.png (the attention view's first projector screen; `SCREENSHOT_DIR=docs/screenshots` regenerates the
README's).
"""
from __future__ import annotations

import pytest

from browser_util import (CORE_VIEWS, LAYOUT, PROMPT, browser, each_view_drawn, new_page, open_app,  # noqa: F401
                          open_expanders, query, server, settle_figures, shots_dir, steady, sync_api, view_errors,
                          wait_idle)

pytestmark = pytest.mark.browser

# name: (viewport, browser context, link parameters, smallest text in px)
SCREENS = {
    "phone": ((390, 844), dict(is_mobile=True, has_touch=True), {}, 12),
    "tablet": ((768, 1024), {}, {}, 12),
    "projector": ((1280, 720), {}, {"presenter": "1"}, 14),
}
# each view's main figure, by the key of its chart (the what-if view's after its "no causal mask" button)
MAIN = {"tokens": "tokens_embed_heat", "attention": "attn_head", "norm": "norm_divisor_fig", "rope": "rope_angle_fig",
        "swiglu": "swiglu_heatmap", "residual": "residual_norms", "predict": "residual_loss_strip",
        "block": "block_diagram", "whatif": "whatif_dist", "normlab": "normlab_resid_fig"}
PLOT_SHARE = 0.55  # of a main figure's width, at least, is its plot area (not a small square in a wide box)

MEASURE = """() => {
    const box = e => e.getBoundingClientRect();
    const overlap = (a, b) => Math.min(a.right, b.right) - Math.max(a.left, b.left) > 0.5 &&
                              Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top) > 0.5;
    return [...document.querySelectorAll('[data-testid="stMain"] .js-plotly-plot')].map(gd => {
        const holder = gd.closest('[data-testid="stElementContainer"]');
        const key = ([...holder.classList].find(c => c.startsWith('st-key-')) || '').slice(7);
        const column = holder.parentElement, style = getComputedStyle(column);
        const frame = box(gd);
        const texts = [...gd.querySelectorAll('text, tspan')].filter(t => t.textContent.trim() &&
            !t.closest('.hoverlayer') && box(t).width > 0);
        const sizes = texts.map(t => [parseFloat(getComputedStyle(t).fontSize), t.textContent.trim().slice(0, 24)]);
        const clashes = [];
        for (const layer of gd.querySelectorAll('.xaxislayer-above, .yaxislayer-above')) {
            const labels = [...layer.querySelectorAll('text')].filter(t => t.textContent.trim() && box(t).width);
            for (let i = 0; i < labels.length; i++) for (let j = i + 1; j < labels.length; j++)
                if (overlap(box(labels[i]), box(labels[j])))
                    clashes.push(labels[i].textContent + ' / ' + labels[j].textContent);
        }
        const outside = texts.filter(t => t.tagName === 'text').filter(t => { const r = box(t);
            return r.left < frame.left - 1 || r.right > frame.right + 1 || r.top < frame.top - 1 ||
                   r.bottom > frame.bottom + 1; }).map(t => t.textContent.slice(0, 24));
        const bar = gd.querySelector('.modebar'), title = gd.querySelector('.g-gtitle');
        return {key, title: String((gd.layout.title && gd.layout.title.text) || '').replace(/<[^>]+>/g, ' '),
                width: frame.width, room: column.clientWidth - parseFloat(style.paddingLeft) -
                parseFloat(style.paddingRight), plot: gd._fullLayout._size.w,
                smallest: sizes.sort((a, b) => a[0] - b[0])[0] || null, clashes, outside,
                covered: !!(bar && title && title.textContent.trim() && overlap(box(bar), box(title)))};
    });
}"""
PAGE = """() => {
    const main = document.querySelector('[data-testid="stMain"]');
    const cells = [...main.querySelectorAll('[data-testid="stTable"] :is(td, th)')].filter(c => c.textContent.trim());
    return {sideways: Math.max(document.documentElement.scrollWidth - innerWidth, main.scrollWidth - main.clientWidth),
            grids: main.querySelectorAll('[data-testid="stDataFrame"]').length,
            table_px: cells.length ? Math.min(...cells.map(c => parseFloat(getComputedStyle(c).fontSize))) : null};
}"""


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


# a formula (KaTeX) wider than its box, and not scrollable into view there
CLIPPED = """() => {
    const out = [];
    const W = document.documentElement.clientWidth;
    for (const el of document.querySelectorAll('[data-testid="stMain"] :is(.katex-display, .katex)')) {
        const r = el.getBoundingClientRect();
        if (!r.width || !el.getClientRects().length) continue;  // inside something folded away
        const p = el.parentElement;
        const fits = p.scrollWidth <= p.clientWidth + 1;
        let shown = r.left >= -1 && r.right <= W + 1;
        for (let a = p; shown && a && a !== document.body; a = a.parentElement) {
            const s = getComputedStyle(a);
            if (s.overflowX !== 'visible') {
                const b = a.getBoundingClientRect();
                shown = r.left >= b.left - 1 && r.right <= b.right + 1;
            }
        }
        if (!fits && !shown) out.push(el.textContent.slice(0, 60) + ' (' + Math.round(r.width) + ' px in '
                                      + p.clientWidth + ' px)');
    }
    return out;
}"""


def clipped_formulas(pg, view: str) -> list[str]:
    """With every expander of the view open (after the figures were measured as a visitor first sees them)."""
    open_expanders(pg)
    steady(pg, LAYOUT, 300)
    pg.screenshot(path=str(shots_dir() / f"w768_{view}.png"), full_page=True)
    clipped = pg.evaluate(CLIPPED)
    return [f"{view}: clipped formulas: {clipped[:3]}"] if clipped else []


def drawn_for_screen(pg) -> None:
    """Wait until the page has been drawn for this screen: the probe has reported it and the page run again."""
    pg.wait_for_function("document.documentElement.dataset.screen === 'drawn'", timeout=180_000)
    wait_idle(pg, started_within=0)
    settle_figures(pg)


def figure_problems(view: str, figures: list[dict], least: int) -> list[str]:
    problems = []
    main = [f for f in figures if f["key"] == MAIN[view]]
    if len(main) != 1:
        return [f"{view}: its main figure ({MAIN[view]}) is not on the page once: {[f['key'] for f in figures]}"]
    m = main[0]
    if m["width"] < m["room"] - 2:
        problems.append(f"{view}: the main figure is {m['width']:.0f} px wide in a column of {m['room']:.0f} px")
    if m["plot"] < PLOT_SHARE * m["width"]:
        problems.append(f"{view}: the main figure's plot is {m['plot']:.0f} px of its {m['width']:.0f} px")
    for f in figures:
        name = f"{view}/{f['key'] or f['title'][:40]}"
        if f["smallest"] and f["smallest"][0] < least:
            problems.append(f"{name}: text “{f['smallest'][1]}” is {f['smallest'][0]} px (at least {least})")
        if f["clashes"]:
            problems.append(f"{name}: {len(f['clashes'])} overlapping tick labels, e.g. {f['clashes'][:2]}")
        if f["outside"]:
            problems.append(f"{name}: text outside the figure: {f['outside'][:3]}")
        if f["covered"]:
            problems.append(f"{name}: Plotly's toolbar covers the title")
    return problems


@pytest.mark.parametrize("screen", SCREENS)
def test_every_view_fits_the_screen(server, browser, screen):
    (width, height), context, params, least = SCREENS[screen]
    pg = new_page(browser, width, height, **context)
    try:
        open_app(pg, server, lang="en", view="tokens", prompt=PROMPT, **params)
        drawn_for_screen(pg)
        problems, seen = [], []
        for label, view in each_view_drawn(pg):
            seen.append(view)
            if view_errors(pg):
                problems.append(f"{view}: the view shows an error: {view_errors(pg)[0][:200]}")
            problems += figure_problems(view, pg.evaluate(MEASURE), least)
            page = pg.evaluate(PAGE)
            if page["sideways"] > 1:
                problems.append(f"{view}: the page scrolls sideways by {page['sideways']} px")
            if params.get("presenter") and page["grids"]:
                problems.append(f"{view}: {page['grids']} tables drawn as a canvas grid in presenter mode")
            if page["table_px"] is not None and page["table_px"] < least:
                problems.append(f"{view}: table text of {page['table_px']} px")
            if params.get("presenter") and view in CORE_VIEWS:  # What-if and the lab open with their choices
                problems += projector_problems(pg, view)
            main = pg.locator(f'.st-key-{MAIN[view]}')
            if main.count():
                main.first.scroll_into_view_if_needed()
            pg.screenshot(path=str(shots_dir() / f"layout_{screen}_{view}.png"))
            if screen == "tablet":
                problems += clipped_formulas(pg, view)
        assert set(seen) == set(MAIN), f"the view selector offered {seen}"
        assert not problems, "\n".join(problems)
    finally:
        pg.context.close()


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


def test_one_tap_selects_a_cell_and_a_swipe_only_scrolls(server, browser):
    pg = new_page(browser, 390, 844, is_mobile=True, has_touch=True)
    try:
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
    finally:
        pg.context.close()
