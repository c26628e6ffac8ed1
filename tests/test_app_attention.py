"""The attention view shows exactly the recorded scores and patterns, with the future blank, through a window of
tokens on long prompts; its downloads leave masked cells empty."""
import csv
import io
from unittest import mock

import numpy as np
import pytest

from apptest_util import all_text, by_id, decode, run_app, select, title

PROMPT = "The animal didn't cross the street because it was too tired."
LONG = " ".join(["Once upon a time a small fox ran through the forest, looked at the river and sang a song."] * 16)


@pytest.fixture(scope="module")
def reference(loaded):
    from explorer_model.recording import record

    ids = loaded.tokenizer.encode(PROMPT)
    return loaded, ids, record(loaded.model, ids)


@pytest.fixture(scope="module")
def page():
    return run_app(view="attention", prompt=PROMPT, layer=3, head=4, token=9)


def positions(labels) -> np.ndarray:
    """Token positions read from the figure's own axis labels ('12:␣street')."""
    return np.array([int(str(s).split(":")[0]) for s in labels])


def test_heatmap_equals_hook_pattern_with_blank_future(page, reference):
    _, ids, rec = reference
    assert not page.exception and not page.error
    fig = by_id(page, "attn_head")
    z = decode(fig["data"][0]["z"])
    expected = rec.pattern(3)[0, 4].double().numpy()
    future = np.triu(np.ones_like(expected, dtype=bool), 1)
    assert z.shape == (len(ids), len(ids))  # 13 tokens: the ±24 window holds the whole prompt
    assert np.isnan(z[future]).all()  # masked cells are empty, not a colour
    np.testing.assert_allclose(z[~future], expected[~future], atol=1e-6)
    assert fig["data"][0]["hoverongaps"] is False
    assert positions(fig["data"][0]["x"]).tolist() == list(range(len(ids)))
    # the click overlay covers exactly the visible cells, with their (query, key) positions
    cells = fig["data"][1]
    assert cells["meta"] == "cells"
    cell_pairs = sorted(map(tuple, decode(cells["customdata"]).astype(int).tolist()))
    assert cell_pairs == sorted(zip(*np.tril_indices(len(ids))))


def test_scores_switch_shows_scaled_masked_scores(page, reference):
    _, _, rec = reference
    page.radio(key="attn_kind").set_value("scores").run()
    z = decode(by_id(page, "attn_head")["data"][0]["z"])
    expected = rec.scores(3)[0, 4].double().numpy()
    finite = np.isfinite(expected)
    assert np.isnan(z[~finite]).all()
    np.testing.assert_allclose(z[finite], expected[finite], atol=1e-4)
    page.radio(key="attn_kind").set_value("pattern").run()


def test_grid_groups_heads_by_kv_head_with_token_labels(page, reference):
    loaded, ids, rec = reference
    cfg = loaded.model.cfg
    grid = by_id(page, "attn_grid")
    assert len(grid["data"]) == cfg.n_heads
    assert "head 4 (KV 1)" in [a["text"] for a in grid["layout"]["annotations"]]
    for tr in grid["data"]:
        np.testing.assert_allclose(np.nan_to_num(decode(tr["z"]), nan=-1),
                                   np.nan_to_num(np.where(np.triu(np.ones((len(ids),) * 2), 1) > 0, np.nan,
                                                          rec.pattern(3)[0, tr["meta"]].double().numpy()), nan=-1),
                                   atol=1e-6)
    lay = grid["layout"]
    shown_y = [k for k, v in lay.items() if k.startswith("yaxis") and v.get("showticklabels")]
    shown_x = [k for k, v in lay.items() if k.startswith("xaxis") and v.get("showticklabels")]
    assert len(shown_y) == cfg.n_rep and len(shown_x) == cfg.n_kv_heads  # outer axes carry token labels
    assert positions(lay["xaxis"]["tickvals"]).tolist() == list(range(len(ids)))


def test_overview_uses_nats_entropy_and_first_token_share(page, reference):
    loaded, _, rec = reference
    cfg = loaded.model.cfg
    entropy = decode(by_id(page, "attn_entropy")["data"][0]["z"])
    sink = decode(by_id(page, "attn_sink")["data"][0]["z"])
    assert entropy.shape == sink.shape == (cfg.n_layers, cfg.n_heads)
    for layer, head in ((5, 2), (0, 0), (29, 8)):
        p = rec.pattern(layer)[0, head, 1:].double().numpy()  # query 0 left out
        np.testing.assert_allclose(sink[layer, head], p[:, 0].mean(), atol=1e-6)
        ent = -(np.where(p > 0, p * np.log(np.where(p > 0, p, 1)), 0)).sum(-1).mean()  # natural log: nats
        np.testing.assert_allclose(entropy[layer, head], ent, atol=1e-6)
    assert "nats" in title(by_id(page, "attn_entropy"))


def test_query_token_text_highlight(page):
    text = all_text(page)
    assert "What token 9" in text
    assert "future: masked" in text  # later tokens are shown as masked


def capture_downloads(at, names):
    """Run `at` and return {file name: the CSV its download button would serve} for the given names (the
    buttons' data are callables that Streamlit calls on click; here they are called directly)."""
    from apptest_util import deferred_downloads

    seen = deferred_downloads(at)
    return {name: seen[name]() for name in names}


def test_csv_leaves_masked_cells_empty(page, reference):
    _, ids, rec = reference
    files = capture_downloads(page, ["attention_L3_H4_pattern.csv", "attention_overview.csv"])
    rows = list(csv.reader(io.StringIO(files["attention_L3_H4_pattern.csv"])))
    assert len(rows) == len(ids) + 1 and len(rows[0]) == len(ids) + 1
    expected = rec.pattern(3)[0, 4].double().numpy()
    for q, row in enumerate(rows[1:]):
        cells = row[1:]
        assert all(c == "" for c in cells[q + 1:])  # the future: empty, never "nan"
        np.testing.assert_allclose([float(c) for c in cells[: q + 1]], expected[q, : q + 1], atol=1e-5)
    assert "nan" not in files["attention_overview.csv"].lower()


def test_long_prompt_window_is_the_recordings_sub_matrix(loaded):
    from app.panels.attention.links import strongest_key
    from app.token_window import keeping, shown as window
    from explorer_model.recording import record

    ids = loaded.tokenizer.encode(LONG)[:256]
    assert len(ids) == 256
    at = run_app(view="attention", prompt=LONG, layer=7, head=2, token=100)
    assert not at.exception and not at.error
    rec = record(loaded.model, ids)
    key = strongest_key(rec, 7, 2, 100)
    fig = by_id(at, "attn_head")
    z, shown = decode(fig["data"][0]["z"]), positions(fig["data"][0]["y"])
    run = [p for p in shown if 76 <= p <= 124]  # ±24 around token 100 …
    assert key in shown and len(shown) == 49 and run == list(range(run[0], 125))  # … and the key it reads most
    expected = rec.pattern(7)[0, 2].double().numpy()[np.ix_(shown, shown)]
    np.testing.assert_allclose(np.nan_to_num(z, nan=-1), np.where(np.isnan(z), -1, expected), atol=1e-6)
    assert np.isnan(z[np.triu_indices(49, 1)]).all()
    grid = by_id(at, "attn_grid")
    for tr in grid["data"]:  # every small multiple is the same window, labelled with ≤ 16 token ticks
        assert decode(tr["z"]).shape == (49, 49)
        assert positions(tr["x"]).tolist() == shown.tolist()
    assert len(grid["layout"]["xaxis"]["tickvals"]) <= 16
    assert f"Showing tokens {run[0]}–124 of 256" in all_text(at)
    # position 0 is outside the window: its share of these queries' attention, from the recording, is stated
    sink = rec.pattern(7)[0, 2, run[0]:125, 0].double().mean().item()
    assert f"queries {run[0]}–124 put {sink:.0%} of their attention on it" in all_text(at)
    # near the end the window keeps its size; a smaller window shows fewer tokens
    at.sidebar.slider(key="token").set_value(255).run()
    expect = window(*keeping(256, 49, 255, strongest_key(rec, 7, 2, 255)))
    assert positions(by_id(at, "attn_head")["data"][0]["y"]).tolist() == expect
    assert [p for p in expect if p >= 208] == list(range(208, 256))
    at.select_slider(key="attn_window").set_value(8).run()
    fig = by_id(at, "attn_head")
    shown = positions(fig["data"][0]["x"])
    assert shown.tolist() == window(*keeping(256, 17, 255, strongest_key(rec, 7, 2, 255)))
    z = decode(fig["data"][0]["z"])
    np.testing.assert_allclose(z[-1], rec.pattern(7)[0, 2, 255, shown].double().numpy(), atol=1e-6)


def test_switching_layer_head_token_runs_no_forward(page):
    from app import gateway as state

    before = state.FORWARDS["count"]
    select(page, layer=10, head=8, token=2)
    assert state.FORWARDS["count"] == before
    assert "Layer 10, head 8 (KV 2)" in title(by_id(page, "attn_head"))
    assert page.query_params["layer"] == "10" and page.query_params["head"] == "8"


def test_chinese(reference):
    at = run_app(view="attention", prompt=PROMPT, lang="zh", layer=1, head=0)
    assert not at.exception and not at.error
    assert "第 1 层" in title(by_id(at, "attn_head"))
    text = all_text(at)
    assert "注意力" in text and "哪些头连接这两个 token" in text and "nats" in text
    assert "Which heads" not in text and "What token" not in text


def test_main_figure_first_and_presenter_folds_explanations():
    from apptest_util import figures

    at = run_app(view="attention", prompt=PROMPT, layer=2, head=1, token=4)
    assert not at.exception and not at.error
    assert (figures(at)[0]["layout"].get("meta") or {}).get("id") == "attn_head"
    assert len(at.main.expander) == 3 and all(e.proto.expanded for e in at.main.expander)  # attention, heads, √d_k
    at.sidebar.toggle(key="presenter").set_value(True).run()
    assert not at.exception and not at.error
    assert len(at.main.expander) == 3 and not any(e.proto.expanded for e in at.main.expander)


def test_the_bos_token_reads_as_its_text_on_every_axis():
    """LLaMA's BOS is "<s>": Plotly reads an axis label as HTML, where <s> starts a strike-through and shows nothing
    (every label read "0:" and struck through the rest); token labels write angle brackets as ‹ ›."""
    from apptest_util import figures

    at = run_app(view="attention", model="tiny-pre", prompt="the cat sat")
    assert not at.exception
    labels = [str(v) for fig in figures(at) for tr in fig["data"] for axis in ("x", "y")
              if isinstance(tr.get(axis), list) for v in tr[axis] if isinstance(v, str) and ":" in v]
    assert "0:‹s›" in labels and not [v for v in labels if "<" in v or ">" in v], sorted(set(labels))[:8]
