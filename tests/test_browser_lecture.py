"""A shipped lecture on the projector (1280×720, presenter mode): the clicker's keys step through it, and a step, a
preset or a button that is about one part of a view lands with that part on the first screen (a step's with the
lecture's player, pinned at the top, above it); a lecture made in the sidebar's Lecture box downloads as its file
and opens again."""
from __future__ import annotations

import pytest
from browser_util import (browser, download, forget, module_page, open_app, query, server, shots_dir,  # noqa: F401
                          SCRIPT_STATE, steady, sync_api, view_errors, wait_idle)
from layout_util import drawn_for_screen

from app.i18n import t
from app.sections import COMPARISON
from explorer_model import lecture as L

pytestmark = pytest.mark.browser


def counter(pg) -> str:
    return pg.locator('[data-testid="stMain"] p').filter(has_text="Step ").first.inner_text()


def press(pg, key: str) -> None:
    pg.keyboard.press(key)
    wait_idle(pg)


FIRST_SCREEN = 720
SHOWN_PX = 150  # this much of a section (or all of a shorter one) must be on the first screen


@pytest.fixture(scope="module")
def projector(browser):
    """One 1280×720 page for the module's tests, each opening its own link (a page load in a page that has loaded the
    app before costs the browser about half of a first one)."""
    pg = module_page(browser, 1280, FIRST_SCREEN)
    yield pg
    forget(pg)


def test_the_keyboard_steps_through_a_lecture_in_presenter_mode(server, projector):
    pg = projector
    open_app(pg, server, lecture="tutorial-000", step=1, presenter=1)
    assert counter(pg).startswith("Step 1 / 21") and query(pg)["view"] == "predict"
    # the first page of a new browser: its screen probe reports, and the page runs again for that screen
    drawn_for_screen(pg)
    assert_landed(pg, "predict", "loss", "step 1, opened by link")
    next_button = pg.locator(".st-key-lecture_next button")
    box = next_button.bounding_box()
    assert box and box["y"] + box["height"] <= 720  # in the first screen of the main area
    pg.locator('[data-testid="stMain"] h1').first.click()  # focus on the page, not a text box
    press(pg, "ArrowRight")
    assert counter(pg).startswith("Step 2 / 21") and query(pg)["view"] == "block" and query(pg)["step"] == "2"
    press(pg, "PageDown")
    assert counter(pg).startswith("Step 3 / 21") and query(pg)["step"] == "3"
    press(pg, " ")
    assert counter(pg).startswith("Step 4 / 21") and query(pg)["view"] == "norm"
    assert query(pg)["model"] == "tiny-pre"
    press(pg, "ArrowLeft")
    press(pg, "PageUp")
    assert counter(pg).startswith("Step 2 / 21") and query(pg)["view"] == "block"
    assert query(pg)["model"] == "smollm2"
    assert view_errors(pg) == []
    # presses that reach the page while a step's run is still going each count: four quick presses are four steps
    for _ in range(4):
        pg.keyboard.press("ArrowRight")
        pg.wait_for_timeout(150)
    wait_idle(pg)
    assert counter(pg).startswith("Step 6 / 21") and query(pg)["step"] == "6", counter(pg)
    press(pg, "ArrowRight")  # the head's heatmap, taller than the room under the player: its top first
    assert_landed(pg, "attention", "head", "step 7")
    # the teacher opens the sidebar (to open another lecture): the title and the player's buttons still show whole
    pg.locator('[data-testid="stExpandSidebarButton"]').click()
    pg.wait_for_timeout(400)  # the screen probe's report of the narrower main column, and the page's run for it
    drawn_for_screen(pg)
    top = pg.evaluate(TOP)
    assert not top["under"] and not top["cut"], f"with the sidebar open: {top}"
    pg.locator('[data-testid="stSidebarCollapseButton"] button').click()
    pg.screenshot(path=str(shots_dir() / "lecture_presenter.png"))


# the page's title under a control of its row (kept on one line, wider than its column), and the player's buttons whose
# words are cut ("← Pre…")
TOP = """() => { const box = e => e.getBoundingClientRect(), range = document.createRange();
    range.selectNodeContents(document.querySelector('[data-testid="stMain"] h1'));
    const title = range.getBoundingClientRect();
    const under = [...document.querySelectorAll('[data-testid="stMain"] :is(.st-key-preset, .st-key-layer, .st-key-head,'
        + ' .st-key-token)')].map(box).some(r => Math.min(r.right, title.right) - Math.max(r.left, title.left) > 1 &&
                                                 Math.min(r.bottom, title.bottom) - Math.max(r.top, title.top) > 1);
    const cut = [...document.querySelectorAll('.st-key-lecture_bar button')].filter(b =>
        [b, ...b.querySelectorAll('*')].some(e => e.scrollWidth > e.clientWidth + 1)).map(b => b.innerText);
    return {under, cut}; }"""


def section_box(pg, view: str, key: str) -> dict:
    """Where the section is on the screen, once the page has landed there and held still (app/sections.py); the
    view None: the part is the comparison's figures."""
    css = f"section_{view}_{key}" if view else COMPARISON
    where = f"document.querySelector('.st-key-{css}')"
    steady(pg, f"{where} && [{where}.getBoundingClientRect().top, "
               f"document.querySelector('[data-testid=\"stMain\"]').scrollTop].join('|')", 2000)
    return pg.evaluate(f"() => {{ const r = {where}.getBoundingClientRect(); return {{top: r.top, height: r.height}}; }}")


# the bottom of Streamlit's header, and the lecture player's box (None outside a lecture)
COVERS = """() => { const bar = document.querySelector('.st-key-lecture_bar');
    const r = bar && bar.getBoundingClientRect();
    return {header: document.querySelector('[data-testid="stHeader"]').getBoundingClientRect().bottom,
            player: r && {top: r.top, bottom: r.bottom}}; }"""


# the elements of the main area that stand across the bottom edge of what covers the page's top (the player where it
# is pinned, else the header): their text cut in two, a heading's lower half or a slider's value without its label
CUT = """() => { const header = document.querySelector('[data-testid="stHeader"]').getBoundingClientRect().bottom;
    const bar = document.querySelector('.st-key-lecture_bar'), r = bar && bar.getBoundingClientRect();
    const edge = r && r.top <= header + 1 ? r.bottom : header;
    return [...document.querySelectorAll('[data-testid="stMain"] [data-testid="stElementContainer"]')]
        .filter(e => !(bar && bar.contains(e))).filter(e => { const b = e.getBoundingClientRect();
            return b.height > 0 && b.top < edge - 1 && edge + 1 < b.bottom; })
        .map(e => `${(e.innerText || '').trim().slice(0, 40)} (${e.className.match(/st-key-\\S+/) || ''})`); }"""


def assert_landed(pg, view: str | None, key: str, what: str) -> None:
    """The part is on the first screen, below the header; in a lecture the player (the step's counter, title and
    caption) is on that screen too, above the part; nothing stands half under the player or the header."""
    box = section_box(pg, view, key)
    cut = pg.evaluate(CUT)
    assert not cut, f"{what}: half under the page's header or the lecture's player: {cut}"
    part = f"the {view} view's {key} section" if view else "the comparison's figures"
    covers = pg.evaluate(COVERS)
    free = covers["header"]
    if covers["player"]:
        player = covers["player"]
        assert covers["header"] - 1 <= player["top"] and player["bottom"] <= box["top"], \
            f"{what}: the lecture's player is at y={player['top']:.0f}..{player['bottom']:.0f} px, not on the " \
            f"screen above {part} (at y={box['top']:.0f} px)"
        free = player["bottom"]
    assert free <= box["top"] and box["top"] + min(SHOWN_PX, box["height"]) <= FIRST_SCREEN, \
        f"{what}: {part} is at y={box['top']:.0f} px (height {box['height']:.0f}): not on " \
        f"the first 1280×720 screen"


def test_steps_and_presets_land_on_their_section_on_the_projector(server, projector):
    pg = projector
    open_app(pg, server, lecture="tutorial-000", step=14, presenter=1)
    assert query(pg)["section"] == "shift"
    assert_landed(pg, "rope", "shift", "step 14")
    pg.screenshot(path=str(shots_dir() / "lecture_section.png"))
    press(pg, "ArrowRight")  # the clocks, further down the same view
    assert_landed(pg, "rope", "clock", "step 15")
    press(pg, "ArrowRight")  # a comparison without a section: its figures
    assert counter(pg).startswith("Step 16 / 21") and "section" not in query(pg) and query(pg)["cmp"]
    assert_landed(pg, None, "figures", "step 16, a comparison")
    press(pg, "ArrowRight")
    assert_landed(pg, "swiglu", "positionwise", "step 17")
    assert view_errors(pg) == []
    # a larger projector: the player is shorter and step 20's heatmap needs only a small scroll, one that left the
    # title's row half under the header (the sliders' values without their labels)
    pg.set_viewport_size({"width": 1920, "height": 1080})
    pg.wait_for_timeout(400)  # the screen probe's report of the new width, and the page's run for it
    drawn_for_screen(pg)
    pg.locator('[data-testid="stPopover"] button').filter(has_text=t("lecture.jump", "en")).click()
    pg.locator('[data-testid="stPopoverBody"] button').filter(has_text="20 · ").click()
    wait_idle(pg)
    assert counter(pg).startswith("Step 20 / 21")
    assert_landed(pg, "swiglu", "heatmap", "step 20 at 1920×1080")
    pg.set_viewport_size({"width": 1280, "height": FIRST_SCREEN})

    open_app(pg, server, view="tokens", prompt="Hello there", presenter=1)  # a preset, from the presenter's row
    sidebar = pg.locator('[data-testid="stSidebar"]')
    assert sidebar.get_attribute("data-collapsed") == "true"
    for key in ("layer", "head", "token"):
        box = pg.locator(f'[data-testid="stMain"] .st-key-{key}').bounding_box()
        assert box and box["y"] + box["height"] <= FIRST_SCREEN, f"the {key} slider is not on the first screen"
    preset = pg.locator('[data-testid="stMain"] [data-testid="stSelectbox"]').filter(
        has_text=t("sidebar.preset", "en"))
    preset.first.click()
    pg.get_by_role("option", name=t("preset.fact", "en"), exact=True).click()
    pg.wait_for_function("() => new URLSearchParams(location.search).get('section') === 'lens'", timeout=120_000)
    wait_idle(pg, started_within=0)
    assert_landed(pg, "residual", "lens", "the fact preset")
    pg.screenshot(path=str(shots_dir() / "preset_section.png"))


def test_the_block_views_changes_open_the_part_that_shows_them(server, projector):
    pg = projector
    open_app(pg, server, view="block", prompt="The capital of France is", presenter=1)
    button = pg.locator(".st-key-block_change_rope button")
    button.scroll_into_view_if_needed()
    button.click()
    wait_idle(pg)
    assert query(pg)["view"] == "rope" and query(pg)["section"] == "sinusoidal"
    assert_landed(pg, "rope", "sinusoidal", "the RoPE change's button")


def test_a_lecture_made_in_the_page_downloads_as_its_file_and_opens_again(server, projector, tmp_path):
    """The sidebar's Lecture box: add the view as a step, give the lecture a title, download the file (clicked in
    Chromium: named after the title, a lecture file with that title and step), and open that file again."""
    pg = projector
    open_app(pg, server, view="norm", prompt="Hello there", layer=2)
    drawn_for_screen(pg)  # the page's second run, for this screen, has drawn the sidebar where the clicks go
    side = pg.locator('[data-testid="stSidebar"]')
    if side.get_attribute("data-collapsed") == "true":  # the browser keeps the fold a visitor chose (the walk above)
        pg.locator('[data-testid="stExpandSidebarButton"]').click()
        steady(pg, "JSON.stringify(document.querySelector('[data-testid=\"stSidebar\"]').getBoundingClientRect())",
               300)  # slid open: the screen probe reports the narrower main column, and the page runs for it
        drawn_for_screen(pg)
    side.locator('[data-testid="stExpander"] summary').filter(has_text=t("lecture.box", "en")).click()
    # no run under way and the button where it stays: a click on a button a run is drawing again can be lost
    steady(pg, f"{SCRIPT_STATE} !== 'running' && "
               "JSON.stringify(document.querySelector('.st-key-lecture_add').getBoundingClientRect())", 500)
    side.locator(".st-key-lecture_add button").click()
    wait_idle(pg)
    bar = pg.locator(".st-key-lecture_bar")
    try:
        bar.wait_for(timeout=60_000)
    except sync_api.TimeoutError:
        raise AssertionError("'Add this view as a step' opened no lecture; the sidebar shows: "
                             + side.inner_text()[:600]) from None
    assert counter(pg).startswith("Step 1 / 1")
    side.locator('[class*="st-key-lecture_title_en_"] input').fill("Norms in class")
    side.locator('[class*="st-key-lecture_title_en_"] input').press("Tab")
    side.locator('[data-testid="stFormSubmitButton"] button').click()
    wait_idle(pg)
    assert "Norms in class" in counter(pg)
    name, data = download(pg, side.locator(".st-key-lecture_download button").click, "the lecture's download", server)
    lecture, problems = L.parse(data)
    assert name == "norms-in-class.toml" and problems == []
    assert lecture.title["en"] == "Norms in class" and [(s["view"], s["layer"]) for s in lecture.steps] == [("norm", 2)]
    side.locator(".st-key-lecture_close button").click()
    wait_idle(pg)
    assert pg.locator(".st-key-lecture_bar").count() == 0
    path = tmp_path / name
    path.write_bytes(data)
    side.locator('[data-testid="stFileUploaderDropzoneInput"]').set_input_files(str(path))
    wait_idle(pg)
    assert counter(pg).startswith("Step 1 / 1 · Norms in class") and query(pg)["view"] == "norm"
    assert "section" not in query(pg)
    assert_landed(pg, "norm", "divisors", "a step about no part: its view's main figure")


PLAYER_PARTS = """() => { const box = s => { const el = document.querySelector('.st-key-lecture_bar ' + s);
    const r = el && el.getBoundingClientRect(); return r && {top: r.top, bottom: r.bottom}; };
  const bar = document.querySelector('.st-key-lecture_bar').getBoundingClientRect();
  return {bar: {top: bar.top, bottom: bar.bottom}, screen: innerHeight, buttons: [box('.st-key-lecture_prev'),
          box('.st-key-lecture_next'), box('[data-testid="stPopover"]')], title: box('h3'),
          counter: (el => { const r = el.getBoundingClientRect(); return {top: r.top, bottom: r.bottom}; })(
            [...document.querySelectorAll('.st-key-lecture_bar p')].find(p => !p.closest('button'))),
          caption: box('.st-key-lecture_caption')}; }"""


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_on_a_phone_the_player_leaves_most_of_the_screen_to_the_view(server, browser, lang):
    """390×844: the player (Previous, Next, Go to…, the counter, title and a long caption: step 8) is at most a
    quarter of the screen high, its buttons in one row and each a finger's tap target (44 px high), and its lines
    one under another, not over each other."""
    pg = module_page(browser, 390, 844, is_mobile=True, has_touch=True)
    open_app(pg, server, lecture="tutorial-000", step=8, lang=lang)
    drawn_for_screen(pg)
    parts = pg.evaluate(PLAYER_PARTS)
    high = parts["bar"]["bottom"] - parts["bar"]["top"]
    assert high <= 0.25 * parts["screen"], f"the player is {high:.0f} px of the phone's {parts['screen']} px"
    prev, nxt, goto = parts["buttons"]
    assert abs(prev["top"] - nxt["top"]) < 2 and abs(nxt["top"] - goto["top"]) < 2  # one row
    assert [round(b["bottom"] - b["top"]) >= 44 for b in parts["buttons"]] == [True] * 3, parts["buttons"]
    lines = [max(b["bottom"] for b in parts["buttons"]), parts["counter"], parts["title"], parts["caption"]]
    for above, below in zip([lines[0]] + [b["bottom"] for b in lines[1:-1]], lines[1:]):
        assert above <= below["top"] + 1, parts
    forget(pg)


# A page as Streamlit lays it out, standing in for a slow device: the run has ended, but the screen probe has not
# measured yet and a figure above the part is still a skeleton (components load on demand).
SLOW_PAGE = """<div data-testid="stApp" data-test-script-state="notRunning">
  <div data-testid="stMain" style="height: 600px; overflow: auto">
    <div data-testid="stElementContainer" id="above" style="height: 1500px">
      <div data-testid="stSkeleton"></div></div>
    <div class="st-key-part" style="height: 200px">the part</div>
    <div style="height: 3000px"></div>
  </div></div>"""


def part_top(pg) -> float:
    return pg.evaluate("document.querySelector('.st-key-part').getBoundingClientRect().top - "
                       "document.querySelector('[data-testid=\"stMain\"]').getBoundingClientRect().top")


@pytest.mark.parametrize("probe_mounts_after_s", [20, 70])
def test_a_landing_waits_for_a_slow_device_to_draw_the_page(browser, probe_mounts_after_s):
    """On a slow device (a phone, a busy laptop) the page draws for tens of seconds after its run: the landing keeps
    the part in place until the page is drawn for its screen, and it stops waiting after a minute. (Fake time:
    Playwright's clock runs the landing's timers.)"""
    from app.sections import LAND_JS

    pg = browser.new_page(viewport={"width": 800, "height": 700})
    try:
        pg.clock.install()
        pg.set_content(SLOW_PAGE)
        pg.evaluate(f"{LAND_JS}('part', 1)")
        pg.clock.run_for(1_000)
        assert abs(part_top(pg) - 8) <= 1, part_top(pg)  # landed under the page's top edge
        pg.clock.run_for(probe_mounts_after_s * 1_000)
        # the figure is drawn, taller than its skeleton, and the probe finds the page drawn for its screen
        pg.evaluate("""() => { document.querySelector('[data-testid="stSkeleton"]').remove();
            document.getElementById('above').style.height = '1900px';
            document.documentElement.dataset.screen = 'drawn'; }""")
        pg.clock.run_for(3_000)
        if probe_mounts_after_s < 60:
            assert abs(part_top(pg) - 8) <= 1, f"the part was left at {part_top(pg)} px when the figure above drew"
        else:  # past the minute: the landing had stopped, and the page stays where the visitor found it
            assert abs(part_top(pg) - 408) <= 1, part_top(pg)
    finally:
        pg.close()
