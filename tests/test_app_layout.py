"""Heatmaps over tokens on a phone (the page driven by AppTest, its screen set as the browser reports it): a window of
tokens a finger can tap, around the selected token, moved by the buttons under the figure, its cells the same
numbers as the whole figure's; every token on a desktop; large HTML tables in presenter mode. The browser's
rendering is measured in test_browser_layout.py."""
from __future__ import annotations

import numpy as np
import pytest

from apptest_util import all_text, by_id, decode, fig_with, figures, run_app, select
from app.i18n import t
from app.plots import PHONE_TABLE_ROWS
from app.figure_text import MIN_TEXT, text_px
from app.screen import DESKTOP, PHONE
from app.token_window import TOUCH_CELL

PROMPT = "The animal didn't cross the street because it was too tired."  # 13 tokens
T = 13


def on(screen, **query):
    """The page as a browser with this screen gets it (the screen probe's report stored, the page run again)."""
    at = run_app(prompt=PROMPT, **query)
    at.session_state["_screen"] = screen
    at.run()
    assert not at.exception
    return at


def positions(fig: dict) -> list[int]:
    return [int(str(label).split(":")[0]) for label in fig["data"][0]["x"]]


def cell_px(fig: dict, screen) -> float:
    m = fig["layout"]["margin"]
    return (screen.main - m["l"] - m["r"]) / len(fig["data"][0]["x"])


@pytest.fixture(scope="module")
def desktop_attention():
    return on(DESKTOP, view="attention")


def test_a_phone_shows_the_attention_window_a_finger_can_tap_and_moves_it(desktop_attention):
    at = on(PHONE, view="attention", attn_link_q=T - 1, attn_link_k=T - 1)  # a pair the window around it holds
    fig = by_id(at, "attn_head")
    shown = positions(fig)
    assert 3 <= len(shown) < T and shown == list(range(shown[0], shown[0] + len(shown)))
    assert shown[-1] == T - 1  # the selected token (the last) is in the window
    assert cell_px(fig, PHONE) >= TOUCH_CELL
    full = decode(by_id(desktop_attention, "attn_head")["data"][0]["z"])
    assert full.shape == (T, T)
    np.testing.assert_array_equal(np.nan_to_num(decode(fig["data"][0]["z"]), nan=-1),
                                  np.nan_to_num(full[np.ix_(shown, shown)], nan=-1))
    assert f"Showing tokens {shown[0]}–{T - 1} of {T}" in all_text(at)
    # the window slider asks for more either side than the screen holds: the page says how many it shows
    assert f"On this screen the map holds {len(shown)} tokens at a time" in all_text(at)
    assert "On this screen the map holds" not in all_text(desktop_attention)
    at.button(key="attn_head_earlier").click().run()
    moved = positions(by_id(at, "attn_head"))
    # half a window earlier; the pair's key (here the query itself) stays in view, apart from the run
    assert moved[:-1] == [p - len(shown) // 2 for p in shown[:-1]] and moved[-1] == T - 1
    select(at, token=2)  # another token: the window stands around it again
    around = positions(by_id(at, "attn_head"))
    assert around[0] == 0 and 2 in around and len(around) == len(shown)


FIGURES = {  # view: how to find its heatmap over tokens, and whether its cells hold text
    "norm": (lambda at: by_id(at, "norm_divisors"), False),
    "residual": (lambda at: fig_with(at, "per layer and token"), False),
    "predict": (lambda at: by_id(at, "residual_loss_strip"), True),
}


@pytest.mark.parametrize("view", FIGURES)
def test_token_heatmaps_show_a_window_on_a_phone_and_every_token_on_a_desktop(view):
    find, text = FIGURES[view]
    phone, desktop = find(on(PHONE, view=view, token=5)), find(on(DESKTOP, view=view, token=5))
    everything = positions(desktop)
    assert everything == list(range(len(everything))) and len(everything) >= T - 1
    shown = positions(phone)
    assert len(shown) < len(everything) and 5 in shown
    assert cell_px(phone, PHONE) >= TOUCH_CELL
    np.testing.assert_array_equal(decode(phone["data"][0]["z"]), decode(desktop["data"][0]["z"])[:, shown])
    if text:  # each cell shows the token it had to predict (its beginning, cut to the cell), at the phone's
        # smallest text or larger, never reaching into the next cell; the hover names it whole
        whole = [(desktop["data"][0].get("hovertext") or desktop["data"][0]["text"])[0][p] for p in shown]
        cells, size = phone["data"][0]["text"][0], phone["data"][0]["textfont"]["size"]
        assert size >= MIN_TEXT
        assert all(c == w or (c.endswith("…") and w.startswith(c[:-1]) and len(c) >= 4) for c, w in zip(cells, whole))
        assert all(text_px(c, size) <= cell_px(phone, PHONE) - 4 for c in cells)
        if cells != whole:
            assert phone["data"][0]["hovertext"][0] == whole and "%{hovertext}" in phone["data"][0]["hovertemplate"]


def test_the_logit_lens_shows_as_many_positions_as_its_text_fits_on_a_phone():
    phone = fig_with(on(PHONE, view="residual"), "Logit lens")
    labels = phone["data"][0]["x"]
    assert 2 <= len(labels) < T and positions(phone)[-1] == T - 1  # the lens ends at the selected (last) token
    assert cell_px(phone, PHONE) >= TOUCH_CELL


def test_presenter_mode_shows_tables_the_room_can_read():
    shown = on(DESKTOP, view="tokens", presenter=1)
    assert not shown.dataframe and len(shown.table) >= 2  # HTML tables, enlarged by the page's style
    assert "id" in shown.table[0].value.columns
    assert on(DESKTOP, view="tokens").dataframe  # a visitor's own screen keeps the interactive grid


def test_every_figure_fills_its_column():
    at = on(PHONE, view="norm")
    assert figures(at) and all("width" not in f["layout"] for f in figures(at))


def test_the_window_slides_to_hold_the_key_or_keeps_it_apart():
    from app.token_window import keeping
    assert keeping(13, 7, 8, None) == (5, 12, None)  # around the selected token
    assert keeping(13, 7, 8, 3) == (3, 10, None)  # slid as little as holds key 3
    assert keeping(13, 7, 8, 6) == (5, 12, None)  # already in view: unchanged
    assert keeping(13, 7, 8, 1) == (6, 12, 1)  # too far: key 1 apart, the run gives up its first cell
    assert keeping(13, 7, 8, 1, lo=0) == (0, 7, None)  # moved by the buttons onto the key
    assert keeping(13, 7, 8, 1, lo=6) == (7, 13, 1)  # moved away: the key stays, the run gives up a cell


def test_a_phone_keeps_the_lessons_key_in_view_beside_its_query():
    at = on(PHONE, lesson="coref")  # "it" (8) reads "animal" (1) most; a phone's window holds ~7 tokens
    fig = by_id(at, "attn_head")
    shown = positions(fig)
    assert 1 in shown and 8 in shown and len(shown) < T
    assert cell_px(fig, PHONE) >= TOUCH_CELL
    z = np.nan_to_num(decode(fig["data"][0]["z"]))
    assert shown[int(np.argmax(z[shown.index(8)]))] == 1  # the row of "it" shows its strongest cell
    gap = shown[1] - shown[0] - 1
    if gap:  # tokens left out between the key and the run: said under the figure and marked in it
        assert f"token {shown[0]}" in all_text(at) and f"tokens left out between them: {gap}" in all_text(at)
        assert fig["layout"].get("shapes")


@pytest.mark.parametrize("view, fig_id, b", [("attention", "compare_attention", dict(cmp="whatif", cmp_iv="no-rope")),
                                             ("norm", "compare_norm", dict(cmp="model", cmp_model="tiny-post"))])
def test_a_phone_stacks_compare_modes_a_b_and_b_minus_a(view, fig_id, b):
    fig = by_id(on(PHONE, view=view, model="tiny-pre", **b), fig_id)
    lay = fig["layout"]
    xs = [lay[k]["domain"] for k in sorted(lay) if k.startswith("xaxis")]
    ys = sorted((lay[k]["domain"] for k in lay if k.startswith("yaxis")), key=lambda d: -d[1])
    assert len(xs) == 3 and all(d[1] - d[0] > 0.9 for d in xs)  # A, B and B − A, each as wide as the figure
    assert all(lower[1] < upper[0] for upper, lower in zip(ys, ys[1:]))  # one under another
    m = lay["margin"]
    assert (PHONE.main - m["l"] - m["r"]) / len(fig["data"][0]["x"]) >= 12  # cells, not strips
    titles = [a["text"] for a in lay["annotations"] if a.get("yanchor") == "bottom"]
    assert len(titles) == 3 and not any("<br>" in t for t in titles)  # each on one line
    bars = [lay[k]["colorbar"] for k in ("coloraxis", "coloraxis2")]
    assert all(bar["orientation"] == "h" for bar in bars) and bars[0]["y"] != bars[1]["y"]  # under, not on each other


def test_a_phone_shows_a_short_table_as_html_its_headers_wrapped_to_the_screen():
    """What if…'s shuffled-order table (three rows, four columns): the grid sized each column to its header and left
    the last ones off a phone's screen; an HTML table wraps its headers. A long table keeps the scrolling grid."""
    phone, desktop = (on(screen, view="whatif", whatif="no-rope") for screen in (PHONE, DESKTOP))
    header = [t("whatif.model"), t("whatif.top_token_prompt"), t("whatif.top_token_shuffled"), t("whatif.max_logit")]
    assert [list(x.value.columns) for x in phone.table if list(x.value.columns) == header]
    assert not [x for x in desktop.table if list(x.value.columns) == header]
    assert [x for x in desktop.dataframe if list(x.value.columns) == header]
    long = on(PHONE, view="tokens")  # the tokens table: a row per token of the prompt
    assert [x for x in long.dataframe if len(x.value) > PHONE_TABLE_ROWS]


def test_whatifs_attention_matrices_stand_one_under_another_on_a_phone():
    """No RoPE: the unchanged, the changed and the shuffled prompt's matrices, three in a row on a desktop; on a phone
    each takes the column's width (side by side their cells were a few px) and names its own rows."""
    for screen, across in ((DESKTOP, 3), (PHONE, 1)):
        fig = fig_with(on(screen, view="whatif", whatif="no-rope"), "Attention of layer 0, head 0")
        lay = fig["layout"]
        xs = [tuple(lay[k]["domain"]) for k in sorted(lay) if k.startswith("xaxis")]
        ys = [tuple(lay[k]["domain"]) for k in sorted(lay) if k.startswith("yaxis")]
        assert len(xs) == 3 and len(set(xs)) == across and len(set(ys)) == 4 - across
        shown = [lay[k].get("showticklabels", True) for k in sorted(lay) if k.startswith("yaxis")]
        assert shown == [True, across == 1, True]  # beside the first, the changed run's rows are the first's


def test_compare_modes_block_curves_go_two_to_a_row_on_a_phone():
    for screen, across in ((DESKTOP, 3), (PHONE, 2)):
        lay = by_id(on(screen, view="block", cmp="prompt", cmp_prompt="The animal didn't cross the road"),
                    "compare_block")["layout"]
        xs = {tuple(lay[k]["domain"]) for k in lay if k.startswith("xaxis")}
        assert len(xs) == across
