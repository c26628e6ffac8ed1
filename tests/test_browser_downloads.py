"""In Debian's Chromium, on a tablet (768×1024) with a Chinese prompt typed into the 中文 page, one walk through every
view checks three things:

- every download button (the sidebar's recording, What-if's changed run, each view's CSVs, the PNG camera of each
  view's first and last figure) delivers a file that opens, and its contents agree with the page: the recordings'
  arrays and what they say they hold, the CSVs' token axis with the prompt's tokens, a PNG with its signature and
  size;
- no view's text, figure or CSV shows a byte escape or U+FFFD (SmolLM2 splits most Chinese characters into byte
  fragments: the app names them like 深·1/3);
- the tablet's layout (layout_util.py, as test_browser_layout.py measures phones and the projector), and with every
  expander open no formula clipped.

Screenshots go to $SCREENSHOT_DIR (default artifacts/screenshots) as layout_tablet_<view>.png, w768_<view>.png (the
whole page, expanders open) and tokens_zh.png (`SCREENSHOT_DIR=docs/screenshots` regenerates the README's)."""
from __future__ import annotations

import csv
import io
import json
import re
import struct

import numpy as np
import pytest

from app.i18n import t
from browser_util import (CORE_VIEWS, browser, download, each_view_drawn, figures, forget, garbled,  # noqa: F401
                          module_page, open_app, server, set_prompt, settle_figures, shots_dir, steady, strings,
                          view_errors)
from layout_util import MAIN, clipped_formulas, drawn_for_screen, page_problems, screenshot

pytestmark = pytest.mark.browser


# --------------------------------------------------------------------------- 1. downloads
NPZ_NAMES = ("token_ids", "logits", "hook_embed")
NPZ_LAYER_NAMES = ("blocks.{L}.hook_resid_pre", "blocks.{L}.attn.hook_pattern", "blocks.{L}.hook_attn_out",
                   "blocks.{L}.hook_resid_mid", "blocks.{L}.hook_resid_post")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
LANG, ZH_PROMPT = "zh", "\u6df1\u5ea6\u5b66\u4e60\u5f88"  # 深度学习很: 10 SmolLM2 tokens, 9 of them parts of a character
TABLET_TEXT_PX = 12  # the smallest text a figure or table may have on a tablet, as on a phone
# the page's font faces loaded or loading, as screen_probe.js's PAGE_FONTS names them
LOADED_FONTS = ("() => [...document.fonts].filter(f => f.status !== 'unloaded')"
                ".map(f => `${f.family}|${f.weight}|${f.style}`)")
FRAGMENT = re.compile(r"[\u4e00-\u9fff]\u00b7\d/\d")  # 深·1/3: a character's part, as the token labels name it


def check_npz(name: str, data: bytes, n_tokens: int, n_layers: int) -> None:
    arrays = np.load(io.BytesIO(data))
    names = set(arrays.files)
    wanted = set(NPZ_NAMES) | {n.format(L=L) for n in NPZ_LAYER_NAMES for L in range(n_layers)}
    assert wanted <= names, f"the .npz lacks recorded names: {sorted(wanted - names)[:8]}"
    assert arrays["token_ids"].shape[-1] == n_tokens, "the .npz holds another prompt's tokens"
    about = json.loads(arrays["about"].item())  # the file names its model and the prompt typed in the page
    assert (about["model"], about["text"]) == ("SmolLM2-135M-Instruct", ZH_PROMPT), about
    # the sidebar's file is the unchanged run, What-if's the changed one, and each says so
    assert bool(about["changes"]) == (name == "recording_changed.npz"), (name, about)
    pattern = arrays[f"blocks.{n_layers - 1}.attn.hook_pattern"]
    assert pattern.shape[-2:] == (n_tokens, n_tokens)
    np.testing.assert_allclose(pattern.sum(-1), 1.0, atol=1e-4)  # softmax rows, independent of the app


# layers/queries × the prompt's tokens: one column per token, named like the figures' axes ("8:␣it")
TOKEN_MATRIX = re.compile(r"attention_L\d+_H\d+_pattern\.csv|rms_divisor_\w+\.csv|residual_norms\.csv")
# file name → the columns its header starts with (a dotted name is the catalog's, in the page's language)
FIRST_COLUMNS = {
    r"tokens\.csv": ("tokens.col.position", "tokens.col.piece", "id"),
    r"attention_overview\.csv": ("layer", "head", "kv_head", "entropy_nats"),
    r"logit_lens\.csv": ("layer", "position", "token", "top_id", "top_token", "probability"),
    r"rope_theta\.csv": ("pair",),
    r"rope_angles\.csv": ("position", "0", "1"),
    r"residual_norms\.csv|rms_divisor_\w+\.csv": ("layer",),
}


def check_csv(name: str, data: bytes, labels: list[str], lang: str) -> None:
    text = data.decode("utf-8-sig")  # a CSV must be UTF-8 (Excel's BOM allowed)
    rows = list(csv.reader(io.StringIO(text)))
    assert len(rows) >= 2, f"{name}: no data rows"
    header = rows[0]
    assert all(h.strip() for h in header) and len(header) >= 2, f"{name}: header {header!r} has empty columns"
    assert len(set(header)) == len(header), f"{name}: repeated column names {header!r}"
    ragged = [i for i, r in enumerate(rows) if len(r) != len(header)]
    assert not ragged, f"{name}: rows {ragged[:5]} do not have the header's {len(header)} columns"
    assert not garbled(text), f"{name}: byte escapes or U+FFFD: {garbled(text)[:3]}"
    assert "nan" not in {c.strip().lower() for r in rows[1:] for c in r}, f"{name}: masked cells written as nan"
    # a matrix over the prompt's tokens names its columns by the tokens, in order
    file = name.rsplit(" ", 1)[-1]
    if TOKEN_MATRIX.fullmatch(file):
        assert header[1:] == labels, f"{name}: columns {header[1:]} are not the prompt's tokens {labels}"
    for pattern, first in FIRST_COLUMNS.items():
        if re.fullmatch(pattern, file):
            first = [t(c, lang) if "." in c else c for c in first]
            assert header[:len(first)] == first, f"{name}: header {header} does not start {first}"
    bare = [re.sub(r"^\d+:", "", v) for v in labels]  # labels without the figure's "position:" prefix
    cols = [re.sub(r"^\d+:", "", v) for v in header[1:]]
    if len(cols) >= 2 and set(cols) <= set(bare):
        assert any(cols == bare[i:i + len(cols)] for i in range(len(bare) - len(cols) + 1)), \
            f"{name}: token columns {cols} are not the prompt's tokens in order"


def check_png(name: str, data: bytes) -> None:
    assert data[:8] == PNG_SIGNATURE, f"{name}: not a PNG (starts {data[:8]!r})"
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR" and length == 13, f"{name}: PNG without its IHDR header"
    width, height = struct.unpack(">II", data[16:24])
    assert 100 <= width <= 10_000 and 100 <= height <= 10_000, f"{name}: a {width}×{height} PNG is no figure"
    assert data[-8:-4] == b"IEND", f"{name}: the PNG is truncated (no IEND chunk at its end)"


def open_file(pg, click, what: str, server, labels, n_layers, lang: str) -> str:
    """Click, receive the file, open it by its kind; returns its name."""
    name, data = download(pg, click, what, server)
    if name.endswith(".csv"):
        check_csv(f"{what}: {name}", data, labels, lang)
    elif name.endswith(".npz"):
        check_npz(name, data, len(labels), n_layers)
    elif name.endswith(".png"):
        check_png(f"{what}: {name}", data)
    else:
        raise AssertionError(f"{what} delivered {name}: neither CSV, .npz nor PNG")
    return name


def token_axis(pg) -> list[str]:
    """The prompt's token labels as the attention view's first square heatmap names them."""
    for fig in figures(pg):
        for tr in fig["data"]:
            if tr.get("type") == "heatmap" and tr.get("x") and tr.get("x") == tr.get("y"):
                return [str(v) for v in tr["x"]]
    return []


def slider_max(pg, index: int) -> int:
    return int(pg.locator('[data-testid="stSidebar"] [data-testid="stSlider"] input[type="range"]').nth(index)
               .get_attribute("max"))


def chinese_problems(page, view: str) -> list[str]:
    """Byte escapes or U+FFFD in the view's text or figures; split characters not named by their parts."""
    problems = []
    bad = garbled(page.locator("body").inner_text())
    if bad:
        problems.append(f"{view}: page text has byte escapes or U+FFFD: {bad[:3]}")
    texts = list(strings(figures(page)))
    bad = [s for s in texts if garbled(s)]
    if bad:
        problems.append(f"{view}: Plotly figure texts have byte escapes or U+FFFD: {bad[:3]}")
    if view == "attention" and not any(FRAGMENT.search(s) for s in texts):
        problems.append("attention: no axis names a split character by its part (like 深·1/3)")
    if view == "tokens":  # the top of the view: the prompt's tokens, split characters named (深·1/3)
        page.evaluate("() => { const m = document.querySelector('[data-testid=\"stMain\"]'); if (m) m.scrollTo(0, 0);"
                      " window.scrollTo(0, 0); }")
        page.wait_for_timeout(300)
        page.screenshot(path=str(shots_dir() / "tokens_zh.png"))
    return problems


@pytest.fixture(scope="module")
def page(browser):
    """A tablet's page: 768×1024, a mouse."""
    pg = module_page(browser, 768, 1024)
    yield pg
    forget(pg)


def test_every_download_button_delivers_a_file_that_opens(server, page):
    open_app(page, server, lang=LANG, view="attention")
    drawn_for_screen(page)
    set_prompt(page, ZH_PROMPT)
    assert "\ufffd" not in page.url and "%EF%BF%BD" not in page.url.upper(), "the URL holds U+FFFD"
    settle_figures(page)
    labels = token_axis(page)
    assert len(labels) == 10, f"the attention view does not show the prompt's 10 tokens: {labels}"
    n_layers = slider_max(page, 0) + 1
    opened: dict[str, list[str]] = {}
    problems: list[str] = []

    def attempt(view: str, click, what: str, kind: str) -> None:
        try:
            name = open_file(page, click, what, server, labels, n_layers, LANG)
        except AssertionError as e:
            problems.append(str(e).split("\nassert")[0])
            return
        if not name.endswith(kind):
            problems.append(f"{what} delivered {name}, expected a {kind} file")
        opened.setdefault(view, []).append(name)

    page.evaluate("document.fonts.ready")
    fonts = page.evaluate(LOADED_FONTS)
    seen = []
    for label, view in each_view_drawn(page):
        seen.append(view)
        problems += page_problems(page, view, TABLET_TEXT_PX)  # as a visitor first sees the view
        screenshot(page, view, "tablet")
        problems += clipped_formulas(page, view)  # opens every expander: their downloads are pressed too
        problems += chinese_problems(page, view)
        buttons = page.locator('[data-testid="stMain"] [data-testid="stDownloadButton"] button')
        for i in range(buttons.count()):
            b = buttons.nth(i)
            b.scroll_into_view_if_needed()
            attempt(view, b.click, f"“{b.inner_text().strip()}” in the {label} view", "")
        # The camera is Plotly's own button with the file name and scale the app sets in one place (plots.py):
        # the first and last figure of each view stand for the rest.
        plots = page.locator('[data-testid="stMain"] .js-plotly-plot')
        for i in sorted({0, plots.count() - 1} if plots.count() else set()):
            fig = plots.nth(i)
            fig.scroll_into_view_if_needed()
            fig.hover()
            camera = fig.locator(f'.modebar-btn[data-title="{t("plotly.download_png", LANG)}"]')  # Plotly's words, translated
            camera.wait_for(state="visible", timeout=30_000)
            attempt(view, camera.click, f"the PNG camera of figure {i} in the {label} view", ".png")
        if view_errors(page):
            problems.append(f"the {label} view shows an error: {view_errors(page)[0][:200]}")
    # every font the walk needed (every view, every explanation open) was loaded with the page (app/screen_probe.js's
    # PAGE_FONTS): one loaded while a view's figures drew would have had Plotly draw them again
    late = sorted(set(page.evaluate(LOADED_FONTS)) - set(fonts))
    if late:
        problems.append(f"fonts first loaded during the walk (add them to screen_probe.js's PAGE_FONTS): {late}")
    # the sidebar, folded away on a tablet, opened last (open, it narrows the main area the walk measured): once it
    # has slid open, the page is drawn again for its narrower column (the screen probe's run), and a download
    # button pressed during that run would name a file the run has just replaced
    if page.locator('[data-testid="stSidebar"]').get_attribute("data-collapsed") == "true":
        page.locator('[data-testid="stExpandSidebarButton"]').click()
        steady(page, "JSON.stringify(document.querySelector('[data-testid=\"stSidebar\"]').getBoundingClientRect())",
               300)
        drawn_for_screen(page)
    side = page.locator('[data-testid="stSidebar"] [data-testid="stDownloadButton"] button')
    assert side.count() >= 1, "the sidebar has no download button for the recording"
    attempt("sidebar", side.first.click, "the sidebar's recording download", ".npz")
    print("downloads opened:", opened)
    assert set(seen) == set(MAIN), f"the view selector offered {seen}"
    for view in (*CORE_VIEWS, "whatif"):
        if not any(n.endswith(".png") for n in opened.get(view, [])):
            problems.append(f"the {view} view delivered no figure PNG")
    if "recording_changed.npz" not in opened.get("whatif", []):
        problems.append("the What-if view delivered no recording of its changed run")
    if not any(n.endswith(".csv") for names in opened.values() for n in names):
        problems.append("no view delivered a CSV")
    assert not problems, "\n".join(problems)
