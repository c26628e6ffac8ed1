"""What the layout tests measure on a drawn page (test_browser_layout.py on a phone and a projector,
test_browser_downloads.py on a tablet): each view's main figure as wide as its column and mostly plot, no text
under the screen's smallest size, no overlapping tick labels, no two parts' texts overlapping (a legend, the title,
an axis title, a subplot's title, a colour bar) nor an axis's text inside another subplot's plot, no text outside its
figure, no title (nor subplot title) under Plotly's toolbar, no sideways scrolling, tables of readable text, no
table's toolbar over a control above it, a token window's ◀ and ▶ side by side, no formula clipped (nor scrolling
in a column beside a figure)."""
from __future__ import annotations

from browser_util import LAYOUT, open_expanders, settle_figures, shots_dir, steady, wait_idle

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
        for (const layer of gd.querySelectorAll('.xaxislayer-above, .yaxislayer-above, .colorbar')) {
            const labels = [...layer.querySelectorAll('text')].filter(t => t.textContent.trim() && box(t).width &&
                                                                     !/title/.test(t.parentElement.getAttribute('class')));
            for (let i = 0; i < labels.length; i++) for (let j = i + 1; j < labels.length; j++)
                if (overlap(box(labels[i]), box(labels[j])))
                    clashes.push(labels[i].textContent + ' / ' + labels[j].textContent);
        }
        const outside = texts.filter(t => t.tagName === 'text').filter(t => { const r = box(t);
            return r.left < frame.left - 1 || r.right > frame.right + 1 || r.top < frame.top - 1 ||
                   r.bottom > frame.bottom + 1; }).map(t => t.textContent.slice(0, 24));
        // texts of different parts of the figure that overlap (a legend on an axis title, the title on a subplot's
        // title), and an axis's labels or title inside another subplot's plot area
        const part = t => t.closest('.legend') ? 'legend' : t.closest('.colorbar') ? 'colour bar' :
            t.closest('.xaxislayer-above, .yaxislayer-above') ? 'tick labels' : t.closest('.g-gtitle') ? 'title' :
            t.closest('.annotation') ? 'annotation' : t.closest('.infolayer') && /title/.test(t.getAttribute('class'))
            ? 'axis title' : null;
        const parts = texts.filter(t => t.tagName === 'text' && part(t)).map(t => ({t, p: part(t), r: box(t)}));
        const crossings = [];
        for (let i = 0; i < parts.length; i++) for (let j = i + 1; j < parts.length; j++)
            if (parts[i].p !== parts[j].p && overlap(parts[i].r, parts[j].r))
                crossings.push(`${parts[i].p} “${parts[i].t.textContent.slice(0, 20)}” / ${parts[j].p} ` +
                               `“${parts[j].t.textContent.slice(0, 20)}”`);
        const plots = [...gd.querySelectorAll('.nsewdrag')].map(box);
        if (plots.length > 1)
            for (const o of parts.filter(o => o.p === 'axis title' || o.p === 'tick labels'))
                if (plots.some(r => overlap(o.r, r))) crossings.push(`${o.p} “${o.t.textContent.slice(0, 20)}” ` +
                                                                    'inside a plot area');
        // the toolbar's buttons (not its padded bar) against each line of the title: a title's first line stands
        // beside the toolbar, the lines under it may be as wide as the figure
        const icons = [...gd.querySelectorAll('.modebar-btn svg')].map(box), title = gd.querySelector('.g-gtitle');
        const lines = title ? [...title.querySelectorAll('tspan.line')] : [];
        const titleBoxes = (lines.length ? lines : title ? [title] : []).map(box);
        const notes = [...gd.querySelectorAll('.annotation-text')].filter(n => n.textContent.trim()).map(box);
        return {key, title: String((gd.layout.title && gd.layout.title.text) || '').replace(/<[^>]+>/g, ' '),
                width: frame.width, room: column.clientWidth - parseFloat(style.paddingLeft) -
                parseFloat(style.paddingRight), plot: gd._fullLayout._size.w,
                smallest: sizes.sort((a, b) => a[0] - b[0])[0] || null, clashes, outside, crossings,
                covered: !!(title && title.textContent.trim() &&
                            titleBoxes.some(t => icons.some(i => overlap(i, t)))) ||
                         notes.some(n => icons.some(i => overlap(i, n)))};
    });
}"""
PAGE = """() => {
    const main = document.querySelector('[data-testid="stMain"]');
    const cells = [...main.querySelectorAll('[data-testid="stTable"] :is(td, th)')].filter(c => c.textContent.trim());
    // a table's or chart's toolbar shown (a touch screen shows it always) over a control above it: a tap there
    // lands on the toolbar
    const shown = el => { const cs = getComputedStyle(el); return cs.visibility !== 'hidden' && +cs.opacity > 0; };
    const bars = [...main.querySelectorAll('[data-testid="stElementToolbar"]')].filter(shown)
        .map(b => b.getBoundingClientRect()).filter(r => r.width > 0 && r.height > 0);
    const hit = (a, b) => Math.min(a.right, b.right) - Math.max(a.left, b.left) > 1 &&
                          Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top) > 1;
    const covered = [...main.querySelectorAll('input, button, [role="slider"]')]
        .filter(c => !c.closest('[data-testid="stElementToolbar"]') && bars.some(r => hit(r, c.getBoundingClientRect())))
        .map(c => (c.getAttribute('aria-label') || c.innerText || c.tagName).trim().slice(0, 40));
    // a token window's ◀ and ▶ (app/token_window.py): a pair in one row, whatever the sentence beside them wraps to
    const apart = [...main.querySelectorAll('[class*="_window_bar"]')].filter(bar => {
        const [a, b] = [...bar.querySelectorAll('button')].map(x => x.getBoundingClientRect()).filter(r => r.width > 0);
        return !a || !b || Math.abs(a.top - b.top) > 2 || b.left - a.right > 24; })
        .map(bar => [...bar.classList].find(c => c.endsWith('_window_bar')));
    return {sideways: Math.max(document.documentElement.scrollWidth - innerWidth, main.scrollWidth - main.clientWidth),
            grids: main.querySelectorAll('[data-testid="stDataFrame"]').length, covered, apart,
            table_px: cells.length ? Math.min(...cells.map(c => parseFloat(getComputedStyle(c).fontSize))) : null};
}"""


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
        if f["crossings"]:
            problems.append(f"{name}: {len(f['crossings'])} overlapping texts, e.g. {f['crossings'][:2]}")
        if f["covered"]:
            problems.append(f"{name}: Plotly's toolbar covers the title or a subplot's title")
    return problems


def screenshot(pg, view: str, screen: str) -> None:
    """layout_<screen>_<view>.png in $SCREENSHOT_DIR, the view's main figure scrolled into sight."""
    main = pg.locator(f'.st-key-{MAIN[view]}')
    if main.count():
        main.first.scroll_into_view_if_needed()
    pg.screenshot(path=str(shots_dir() / f"layout_{screen}_{view}.png"))


def page_problems(pg, view: str, least: int, presenter: bool = False) -> list[str]:
    """figure_problems for every figure of the view, and the page's own: sideways scrolling, table text, a shown
    toolbar over a control, a token window's buttons apart, and in presenter mode tables drawn as a canvas grid (a
    projector needs HTML tables of large text)."""
    problems = figure_problems(view, pg.evaluate(MEASURE), least)
    page = pg.evaluate(PAGE)
    if page["sideways"] > 1:
        problems.append(f"{view}: the page scrolls sideways by {page['sideways']} px")
    if presenter and page["grids"]:
        problems.append(f"{view}: {page['grids']} tables drawn as a canvas grid in presenter mode")
    if page["apart"]:
        problems.append(f"{view}: a token window's ◀ and ▶ stand apart: {page['apart']}")
    if page["covered"]:
        problems.append(f"{view}: a toolbar lies over controls above it: {page['covered'][:3]}")
    if page["table_px"] is not None and page["table_px"] < least:
        problems.append(f"{view}: table text of {page['table_px']} px")
    return problems


# a formula (KaTeX) wider than its box, and not scrollable into view there, or standing in a column beside a figure
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
        // beside a figure (a column narrower than the main area), a formula that scrolls hides its end: only the
        // reader who tries to scroll it finds the rest
        const column = p.closest('[data-testid="stColumn"]'), main = document.querySelector('[data-testid="stMain"]');
        const beside = column && column.getBoundingClientRect().width < main.clientWidth * 0.8;
        if (!fits && (!shown || beside)) out.push(el.textContent.slice(0, 60) + ' (' + Math.round(r.width) +
                                                  ' px in ' + p.clientWidth + ' px' + (beside ? ', beside a figure' : '') + ')');
    }
    return out;
}"""


# what KaTeX could not read, in its error colour: a whole formula it could not parse (its message in the title), or
# an unknown command (\\quadx for \\quad x) inside one it drew
BROKEN = """() => [...document.querySelectorAll('[data-testid="stMain"] :is(.katex-error, .katex-html [style*="rgb(204, 0, 0)"]:not(:has(*)))')]
    .map(el => ((el.getAttribute('title') || '') + ' ' + el.textContent).trim().slice(0, 80))"""


def clipped_formulas(pg, view: str) -> list[str]:
    """With every expander of the view open (after the figures were measured as a visitor first sees them): formulas
    cut at the screen's edge, and formulas KaTeX could not read."""
    open_expanders(pg)
    steady(pg, LAYOUT, 300)
    pg.screenshot(path=str(shots_dir() / f"w768_{view}.png"), full_page=True)
    clipped, broken = pg.evaluate(CLIPPED), pg.evaluate(BROKEN)
    return ([f"{view}: clipped formulas: {clipped[:3]}"] if clipped else []) + (
        [f"{view}: formulas KaTeX cannot read: {broken[:3]}"] if broken else [])
