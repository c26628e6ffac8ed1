"""A shipped lecture on the projector (1280×720, presenter mode): the clicker's keys step through it."""
from __future__ import annotations

from browser_util import browser, new_page, open_app, query, server, shots_dir, view_errors, wait_idle  # noqa: F401


def counter(pg) -> str:
    return pg.locator('[data-testid="stMain"] p').filter(has_text="Step ").first.inner_text()


def press(pg, key: str) -> None:
    pg.keyboard.press(key)
    wait_idle(pg)


def test_the_keyboard_steps_through_a_lecture_in_presenter_mode(server, browser):
    pg = new_page(browser, 1280, 720)
    try:
        open_app(pg, server, lecture="tutorial-000", step=1, presenter=1)
        assert counter(pg).startswith("Step 1 / 21") and query(pg)["view"] == "predict"
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
        pg.screenshot(path=str(shots_dir() / "lecture_presenter.png"))
    finally:
        pg.context.close()
