"""Step-by-step generation in Chromium, in the Next token view: one top token, then several at once, undo, with the
prompt box, the link and the steps table following (the browser keeps no state the server did not set)."""
from __future__ import annotations

import pytest
import torch

from browser_util import browser, open_app, page, query, server, wait_idle  # noqa: F401

pytestmark = pytest.mark.browser
PROMPT = "The capital of France is"


def prompt_box(pg) -> str:
    return pg.locator('[data-testid="stSidebar"] textarea').first.input_value()


def test_step_continue_and_undo_in_the_browser(page, server):
    from explorer_model.loaders import load
    loaded = load("smollm2")
    tok = loaded.tokenizer
    ids = tok.encode(PROMPT)
    expected = list(ids)
    for _ in range(6):  # independent oracle: a full forward per token, its argmax appended
        with torch.no_grad():
            expected.append(int(loaded.model(torch.tensor([expected]))[0, -1].argmax()))

    open_app(page, server, view="predict", prompt=PROMPT, lang="en")
    page.get_by_role("button", name="Take the top token").click()
    wait_idle(page)
    assert prompt_box(page) == tok.decode(expected[:len(ids) + 1])
    page.locator('[data-testid="stNumberInput"] input[aria-label="Tokens to add"]').fill("5")
    page.keyboard.press("Enter")
    wait_idle(page)
    page.get_by_role("button", name="Top token × 5").click()
    wait_idle(page)
    assert prompt_box(page) == tok.decode(expected)
    assert query(page).get("prompt") == tok.decode(expected)
    table = page.locator('[data-testid="stMain"] [data-testid="stDataFrame"]').last
    assert table.is_visible()
    page.get_by_role("button", name="Undo").click()
    wait_idle(page)
    assert prompt_box(page) == tok.decode(expected[:len(ids) + 1])
    page.get_by_role("button", name="Undo").click()
    wait_idle(page)
    assert prompt_box(page) == PROMPT
