"""In Debian's Chromium: a preset picked in the sidebar lands on its lesson, for the first preset of each kind of
lesson (every preset's lesson is checked against the recording in AppTest: test_app_lessons.py and
test_app_compare_state.py; every download opened and Chinese without byte escapes in every view, on a tablet:
test_browser_downloads.py; presenter mode on a projector and phones: test_browser_layout.py).

The presets are chosen one after another on one page, as a teacher goes through them; a comparison preset (which
may change the model) and the first preset of a run start from a freshly opened page. Every check reads what the
browser shows and compares it with the prompt or an independent rule.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

from browser_util import (browser, figures, open_app, page, query, server, settle_figures, sync_api,  # noqa: F401
                          view_errors, wait_idle)

pytestmark = pytest.mark.browser

# --------------------------------------------------------------------------- presets land on their lesson
def presets():
    """The first preset of each kind of lesson, in the menu's order: the others of a kind differ only in their
    prompt, and the same check of each runs without a browser."""
    from app.presets import PRESETS

    first: dict = {}
    for p in PRESETS:
        first.setdefault(p.kind, p)
    return list(first.values())


def preset_id(p) -> str:
    return getattr(p, "key", None) or str(p[0])


def clean(label: str) -> str:
    """A token label's word: without its position prefix ("8:␣it") and the visible-space mark."""
    return re.sub(r"^\d+:", "", label).replace("\u2423", " ").strip().lower()


def square_heatmap(pg) -> tuple[list[str], list[list[float]]]:
    for fig in figures(pg):
        for tr in fig["data"]:
            if tr.get("type") == "heatmap" and tr.get("x") and tr.get("x") == tr.get("y"):
                return [str(v) for v in tr["x"]], [[np.nan if v is None else v for v in row] for row in tr["z"]]
    pytest.fail("the view shows no square token × token attention heatmap")


def choose_preset(pg, label: str, prompt: str) -> None:
    """Pick the preset in the sidebar and wait until its run has put its prompt in the URL (a busy machine may
    start the rerun late); if it never does, the test's first assertion says so."""
    from app.i18n import t

    box = pg.locator('[data-testid="stSidebar"] [data-testid="stSelectbox"]').filter(
        has_text=t("sidebar.preset", "en"))
    box.first.click()
    pg.get_by_role("option", name=label, exact=True).click()
    try:  # the preset's run writes its prompt to the URL before it draws the view
        pg.wait_for_function("p => new URLSearchParams(location.search).get('prompt') === p", arg=prompt,
                             timeout=60_000)
    except sync_api.TimeoutError:
        return
    wait_idle(pg, started_within=0)
    settle_figures(pg)


def sidebar_token_piece(pg) -> str:
    text = pg.locator('[data-testid="stSidebar"]').inner_text()
    m = re.search(r"Token \d+ is “([^”]*)”", text)
    assert m, "the sidebar does not name the selected token"
    return m.group(1)


@pytest.mark.parametrize("preset", presets(), ids=preset_id)
def test_preset_lands_on_its_lesson(server, page, preset):
    if not hasattr(preset, "kind"):
        pytest.fail("presets are not lessons yet: app.presets.PRESETS are (label, label, prompt) tuples without a "
                    "view or a lesson kind")
    from app.i18n import t

    if preset.kind == "compare" or not page.url.startswith(server) or view_errors(page):
        open_app(page, server, lang="en", view="tokens", prompt="Hello")
    choose_preset(page, t(f"preset.{preset.key}", "en"), preset.prompt)
    q = query(page)
    assert q.get("prompt") == preset.prompt, f"the preset did not set its prompt: {q.get('prompt')!r}"
    assert q.get("view") == preset.view, f"{preset.key}: view {q.get('view')!r}, the lesson is in {preset.view!r}"
    assert {"layer", "head", "token"} <= set(q), f"{preset.key}: the URL lacks the selection: {q}"
    layer, token = int(q["layer"]), int(q["token"])
    lesson = page.locator('[data-testid="stMain"] [data-testid="stAlertContentInfo"]').all_inner_texts()
    assert lesson and lesson[0].strip(), f"{preset.key}: no sentence says what to look for"
    # the sentence stands at the top of the part the page scrolls to (a comparison's figures), not off the screen
    landing = "compare_figures" if preset.kind == "compare" else \
        f"section_{preset.view}_{preset.section}" if preset.section else None
    if landing:
        sentence = t(f"preset.{preset.key}_lesson" if preset.kind == "compare" else f"preset.lesson.{preset.kind}")
        words = max(re.split(r"\{[^}]*\}", sentence), key=len)[:30]  # no numbers
        inside = page.locator(f'.st-key-{landing} [data-testid="stAlertContentInfo"]')
        assert any(words in text for text in inside.all_inner_texts()), \
            f"{preset.key}: the sentence is not in the part the page lands on"
    assert not view_errors(page), f"{preset.key}: the view shows an error: {view_errors(page)[:1]}"

    if preset.kind == "link":  # the query word attends to the key word more than to any other token
        labels, z = square_heatmap(page)
        query_word, key_word = preset.args
        assert clean(labels[token]) == query_word, f"{preset.key}: selected token {labels[token]!r}, not {query_word!r}"
        keys = [k for k in range(token) if clean(labels[k]) == key_word]
        assert keys, f"{preset.key}: {key_word!r} is not among the keys before {query_word!r}: {labels}"
        row = np.array(z[token][:token + 1], dtype=float)
        weight = row[keys[-1]]
        assert weight == np.nanmax(row), f"{preset.key}: “{query_word}” attends more to " \
                                         f"{labels[int(np.nanargmax(row))]!r} ({np.nanmax(row):.3f}) than to " \
                                         f"“{key_word}” ({weight:.3f}) in the selected head"
        if preset.key == "coref":
            assert weight >= 0.5, f"coreference: “it” → “animal” weight {weight:.3f} < 0.5 in the shown head"
    elif preset.kind == "sink":  # the later tokens put most of their attention on the first
        labels, z = square_heatmap(page)
        share = float(np.mean([z[i][0] for i in range(1, len(labels))]))
        assert share >= 0.5, f"sink: the selected head gives the first token only {share:.3f} on average"
    elif preset.kind == "induction":  # the last token attends to the token after its previous occurrence
        words = preset.prompt.split(":", 1)[1].split()
        period = len(words) // 2
        assert words[:period] == words[period:], "the induction prompt is not one sequence repeated"
        labels, z = square_heatmap(page)
        assert token == len(labels) - 1, f"induction: selected token {token}, not the last"
        row = np.array(z[token][:token + 1], dtype=float)
        target = token - period + 1
        assert clean(labels[target]) == words[0], f"induction: {labels[target]!r} should be {words[0]!r}"
        assert int(np.nanargmax(row)) == target and row[target] >= 0.5, \
            f"induction: the last token's strongest key is {labels[int(np.nanargmax(row))]!r} " \
            f"({np.nanmax(row):.3f}), not the token after its previous occurrence ({row[target]:.3f})"
    elif preset.kind == "lens":  # the selected layer is no later than where the final answer becomes top-1
        lens = [tr for f in figures(page) for tr in f["data"]
                if tr.get("type") == "heatmap" and tr.get("text") and str((tr.get("y") or [""])[0]) == "L0"]
        assert lens, "fact: the residual view shows no logit lens heatmap (rows L0, L1, …)"
        last_col = [row[-1] for row in lens[0]["text"]]
        final = last_col[-1]
        settled = next(i for i in range(len(last_col)) if all(v == final for v in last_col[i:]))
        assert layer <= settled, f"fact: layer {layer} selected, but {final!r} is already top-1 from layer {settled}"
        assert clean(final) in lesson[0].lower(), f"fact: the lesson does not name the final answer {final!r}"
    elif preset.kind == "split":  # the first token that is part of a character, named like 深·1/3
        piece = sidebar_token_piece(page)
        assert re.search(r"[^\s\u00b7]\u00b7\d/\d", piece), f"{preset.key}: the selected token {piece!r} is not " \
                                                           f"named as part of a split character (like 深·1/3)"
    elif preset.kind == "special":
        piece = sidebar_token_piece(page)
        assert re.fullmatch(r"‹\|[a-z_]+\|›", piece), f"chat: the selected token {piece!r} is no special token"
    elif preset.kind == "compare":  # A and B side by side: B in the link, the view's compare figures drawn
        assert q.get("cmp"), f"{preset.key}: no B in the link: {q}"
        assert any(str((f["layout"].get("meta") or {}).get("id", "")).startswith("compare_") for f in figures(page))
    else:
        pytest.fail(f"{preset.key}: no check for lesson kind {preset.kind!r}")
