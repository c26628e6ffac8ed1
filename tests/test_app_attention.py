"""The attention view shows exactly the recorded scores and patterns, with the future blank."""
import numpy as np
import pytest

from apptest_util import all_text, decode, figures, run_app

PROMPT = "The animal didn't cross the street because it was too tired."


@pytest.fixture(scope="module")
def reference():
    from explorer_model.loaders import load
    from explorer_model.recording import record

    loaded = load("smollm2")
    ids = loaded.tokenizer.encode(PROMPT)
    return loaded, ids, record(loaded.model, ids)


@pytest.fixture(scope="module")
def page():
    return run_app(view="attention", prompt=PROMPT, layer=3, head=4, token=9)


def test_heatmap_equals_hook_pattern_with_blank_future(page, reference):
    _, ids, rec = reference
    assert not page.exception
    fig = figures(page)[0]
    z = decode(fig["data"][0]["z"])
    expected = rec.pattern(3)[0, 4].double().numpy()
    future = np.triu(np.ones_like(expected, dtype=bool), 1)
    assert z.shape == (len(ids), len(ids))
    assert np.isnan(z[future]).all()  # masked cells are empty, not a colour
    np.testing.assert_allclose(z[~future], expected[~future], atol=1e-6)
    assert fig["data"][0]["hoverongaps"] is False
    assert "%{z:.4f}" in fig["data"][0]["hovertemplate"]
    assert len(fig["data"][0]["x"]) == len(ids) and fig["data"][0]["x"][0].startswith("0:")


def test_scores_switch_shows_scaled_masked_scores(page, reference):
    _, _, rec = reference
    page.radio(key="attn_kind").set_value("scores").run()
    z = decode(figures(page)[0]["data"][0]["z"])
    expected = rec.scores(3)[0, 4].double().numpy()
    finite = np.isfinite(expected)
    assert np.isnan(z[~finite]).all()
    np.testing.assert_allclose(z[finite], expected[finite], atol=1e-4)
    page.radio(key="attn_kind").set_value("pattern").run()


def test_grid_groups_heads_by_kv_head_and_overview(page, reference):
    loaded, ids, rec = reference
    cfg = loaded.model.cfg
    figs = figures(page)
    grid = figs[1]
    assert len(grid["data"]) == cfg.n_heads
    titles = [a["text"] for a in grid["layout"]["annotations"]]
    assert "head 4 (KV 1)" in titles
    entropy, sink = decode(figs[2]["data"][0]["z"]), decode(figs[3]["data"][0]["z"])
    assert entropy.shape == sink.shape == (cfg.n_layers, cfg.n_heads)
    p = rec.pattern(5)[0, 2, 1:].double().numpy()
    np.testing.assert_allclose(sink[5, 2], p[:, 0].mean(), atol=1e-6)
    ent = -(np.where(p > 0, p * np.log(np.where(p > 0, p, 1)), 0)).sum(-1).mean()
    np.testing.assert_allclose(entropy[5, 2], ent, atol=1e-6)


def test_query_token_text_highlight(page):
    text = all_text(page)
    assert "What token 9" in text
    assert "future: masked" in text  # later tokens are shown as masked


def test_switching_layer_head_token_runs_no_forward(page):
    from app import explorer as state

    before = state.FORWARDS["count"]
    page.sidebar.slider(key="layer").set_value(10).run()
    page.sidebar.slider(key="head").set_value(8).run()
    page.sidebar.slider(key="token").set_value(2).run()
    assert state.FORWARDS["count"] == before
    assert "Layer 10, head 8 (KV 2)" in figures(page)[0]["layout"]["title"]["text"]
    assert page.query_params["layer"] == "10" and page.query_params["head"] == "8"


def test_chinese(reference):
    at = run_app(view="attention", prompt=PROMPT, lang="zh", layer=1, head=0)
    assert not at.exception
    assert "第 1 层" in figures(at)[0]["layout"]["title"]["text"]
    assert "注意力" in all_text(at)
