"""Compare mode in Chromium: A and B side by side in several views, B chosen in the sidebar, one view in Chinese.

Screenshots go to $SCREENSHOT_DIR (default artifacts/screenshots); docs/views.md's "Compare mode" ones come from
`SCREENSHOT_DIR=docs/screenshots pytest -m browser tests/test_browser_compare.py`.
"""
from __future__ import annotations

import pytest

from browser_util import (browser, figures, open_app, page, pick_view, query, server, settle_figures,  # noqa: F401
                          shots_dir, view_errors, wait_idle)
from layout_util import MEASURE

pytestmark = pytest.mark.browser
LINE = "Shall I compare thee to a summer's day?"
BANK_A, BANK_B = "The bank of the river", "The bank approved the loan"


def by_id(pg, fig_id: str) -> dict:
    found = [f for f in figures(pg) if (f["layout"].get("meta") or {}).get("id") == fig_id]
    assert len(found) == 1, f"{fig_id}: {len(found)} figures"
    return found[0]


def traces(fig: dict) -> dict:
    return {t.get("meta"): t for t in fig["data"]}


def crossings(pg) -> list[str]:
    """Texts of different parts of a figure that overlap (an axis title on its tick labels…), as layout_util
    measures the views' own figures."""
    return [f"{f['key']}: {c}" for f in pg.evaluate(MEASURE) for c in f["crossings"]]


def test_twins_side_by_side_in_three_views(server, page):  # noqa: F811
    open_app(page, server, model="tiny-pre", prompt=LINE, view="norm", layer=2, head=3)
    # B chosen in the sidebar as a visitor would: mode, then the model (the twin is offered first)
    page.locator('[data-testid="stSidebar"] [data-testid="stSelectbox"]').filter(has_text="Compare with").first.click()
    page.get_by_role("option", name="another model", exact=True).click()
    wait_idle(page)
    settle_figures(page)
    assert query(page)["cmp"] == "model" and query(page)["cmp_model"] == "tiny-post"
    assert view_errors(page) == []
    stream = traces(by_id(page, "compare_norm_stream"))
    pre, post = stream["A"]["y"], stream["B"]["y"]
    assert pre[-1] > 5 * pre[0] and all(abs(v - 1) < 0.3 for v in post[1:])  # Pre grows; Post held near 1
    assert page.get_by_text("Pre-Norm (A): the residual stream").is_visible()
    assert crossings(page) == []
    page.screenshot(path=str(shots_dir() / "compare_norm.png"))

    pick_view(page, "Attention")
    settle_figures(page)
    att = traces(by_id(page, "compare_attention"))
    assert set(att) == {"A", "B", "B-A"}
    a, b, d = att["A"]["z"], att["B"]["z"], att["B-A"]["z"]
    assert d[5][2] == pytest.approx(b[5][2] - a[5][2], abs=1e-6) and d[2][5] is None  # future cells stay blank
    assert crossings(page) == []
    page.screenshot(path=str(shots_dir() / "compare_attention.png"))

    pick_view(page, "The block")
    settle_figures(page)
    block = traces(by_id(page, "compare_block"))
    assert {"A:0", "B:0", "A:5", "B:5"} <= set(block)
    assert view_errors(page) == [] and query(page)["view"] == "block"


def test_minimal_pair_in_chinese(server, page):  # noqa: F811
    open_app(page, server, prompt=BANK_A, cmp="prompt", cmp_prompt=BANK_B, view="residual", lang="zh")
    settle_figures(page)
    assert view_errors(page) == []
    assert page.get_by_text("\u5bf9\u6bd4 \u00b7").first.is_visible()  # the compare title, in Chinese
    fig = by_id(page, "compare_change_map")
    z = fig["data"][0]["z"]
    top = fig["layout"]["meta"]["top"]
    assert max(row[top[0]] for row in z) > 0.1 and all(abs(row[0]) < 1e-6 for row in z)  # "The" cannot see the change
    page.get_by_text("\u6700\u5c0f\u5bf9").first.scroll_into_view_if_needed()
    page.screenshot(path=str(shots_dir() / "compare_minimal_pair_zh.png"))
