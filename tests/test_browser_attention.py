"""In Chromium: a click on a cell of the attention heatmap picks the query/key pair, and a click on the layers × heads
map jumps the sidebar to that layer and head (Streamlit's selection events, through the invisible cell markers)."""
from __future__ import annotations

import pytest

from browser_util import browser, page, server, wait_idle  # noqa: F401  (fixtures: one server, one browser)

pytestmark = pytest.mark.browser
PROMPT = "The animal didn't cross the street because it was too tired."

CELL_XY = """([id, x, y]) => {
  const gd = [...document.querySelectorAll('.js-plotly-plot')].find(g => g.layout.meta && g.layout.meta.id === id);
  gd.scrollIntoView({block: 'center'});
  const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis, box = gd.getBoundingClientRect();
  return [box.left + xa._offset + xa.d2p(x), box.top + ya._offset + ya.d2p(y)];
}"""


def numbers_become(pg, labels: tuple[str, ...], expected: tuple[int, ...], timeout_s: float = 60) -> tuple:
    """The values of the number inputs once they equal `expected` (the rerun a click starts may begin late on a
    busy machine), or as they are after `timeout_s`."""
    for _ in range(int(timeout_s / 0.25)):
        got = tuple(int(pg.get_by_label(lab, exact=True).input_value()) for lab in labels)
        if got == expected:
            break
        pg.wait_for_timeout(250)
    return got


def click_cell(pg, fig_id: str, x: str, y: str) -> None:
    """Move the mouse onto the cell until Plotly reports hovering it (the page may still be scrolling), then click."""
    for _ in range(10):
        px, py = pg.evaluate(CELL_XY, [fig_id, x, y])
        pg.mouse.move(px, py)
        pg.wait_for_timeout(300)
        hovered = pg.evaluate("""(id) => { const gd = [...document.querySelectorAll('.js-plotly-plot')]
            .find(g => g.layout.meta && g.layout.meta.id === id);
            const h = gd._hoverdata || []; return h.length ? [h[0].x, h[0].y] : null; }""", fig_id)
        if hovered == [x, y]:
            break
    else:
        raise AssertionError(f"could not hover the cell {x}, {y} of {fig_id}")
    pg.mouse.click(px, py)
    wait_idle(pg)


def test_click_cell_picks_pair_and_map_click_jumps(server, page):  # noqa: F811
    from urllib.parse import urlencode

    page.goto(server + "/?" + urlencode(dict(view="attention", prompt=PROMPT, layer=3, head=4, token=9)),
              wait_until="domcontentloaded")
    page.wait_for_selector(".js-plotly-plot", timeout=120_000)
    wait_idle(page, 120_000)
    labels = page.evaluate("""() => [...document.querySelectorAll('.js-plotly-plot')]
        .find(g => g.layout.meta && g.layout.meta.id === 'attn_head').data[0].x""")
    click_cell(page, "attn_head", labels[1], labels[8])  # query 8 ("it"), key 1 ("animal")
    assert numbers_become(page, ("Query token (position)", "Key token (position)"), (8, 1)) == (8, 1)
    wait_idle(page)
    heads = page.evaluate("""() => [...document.querySelectorAll('.js-plotly-plot')]
        .find(g => g.layout.meta && g.layout.meta.id === 'attn_link').data[0].x""")
    click_cell(page, "attn_link", heads[7], "layer 12")
    page.wait_for_function("() => new URLSearchParams(location.search).get('layer') === '12'", timeout=60_000)
    params = page.evaluate("() => Object.fromEntries(new URLSearchParams(location.search))")
    assert (params["layer"], params["head"], params["token"]) == ("12", "7", "8")
