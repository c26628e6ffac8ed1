"""The attention view's lessons against the recording: which heads link two tokens (and the jump to one), multi-head
attention piece by piece (V, z, concatenation, W_O), and why the scores are divided by √d_k."""
import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from apptest_util import all_text, by_id, decode, record_prompt, run_app, trace, title

PROMPT = "The animal didn't cross the street because it was too tired."


@pytest.fixture(scope="module")
def reference(loaded):
    return (loaded, *record_prompt(loaded, PROMPT))


@pytest.fixture(scope="module")
def page():
    return run_app(view="attention", prompt=PROMPT, layer=3, head=4, token=9)


def test_head_link_map_is_the_pattern_cell_in_every_layer_and_head(page, reference):
    loaded, ids, rec = reference
    cfg = loaded.model.cfg
    q, k = 8, 1  # "it" -> "animal"
    page.number_input(key="attn_link_q").set_value(q)
    page.number_input(key="attn_link_k").set_value(k).run()
    assert not page.exception and not page.error
    fig = by_id(page, "attn_link")
    m = decode(fig["data"][0]["z"])
    expected = np.array([[rec.pattern(layer)[0, h, q, k].item() for h in range(cfg.n_heads)]
                         for layer in range(cfg.n_layers)])
    np.testing.assert_allclose(m, expected, atol=1e-5)
    best = np.unravel_index(np.argmax(expected), expected.shape)
    assert f"layer {best[0]}, head {best[1]} (KV {best[1] // cfg.n_rep})" in all_text(page)
    # the chosen pair is outlined on the main heatmap (window coordinates = positions here)
    cells = trace(by_id(page, "attn_head"), "cells")
    assert decode(cells["customdata"]).astype(int)[cells["selectedpoints"]].tolist() == [[q, k]]
    # "Open layer L, head H" selects that head and the query token in the sidebar
    page.button(key="attn_link_go").click().run()
    assert (page.sidebar.slider(key="layer").value, page.sidebar.slider(key="head").value) == tuple(map(int, best))
    assert page.sidebar.slider(key="token").value == q
    assert f"Layer {best[0]}, head {best[1]}" in title(by_id(page, "attn_head"))


def test_key_after_query_is_explained_not_drawn(page):
    page.number_input(key="attn_link_q").set_value(2)
    page.number_input(key="attn_link_k").set_value(5).run()
    assert not page.exception and not page.error
    assert "causal mask gives it weight 0" in " ".join(i.value for i in page.info)
    assert not [f for f in page.get("plotly_chart") if '"attn_link"' in f.proto.spec]


def click_script():
    """A page that feeds a Plotly selection event (as Streamlit delivers it) to the view's callbacks."""
    import streamlit as st

    from app.panels.attention import links as L

    event = {"selection": {"points": [{"curve_number": 1, "point_number": 7, "point_index": 7, "x": "head 5 (KV 1)",
                                       "y": "layer 12", "customdata": [12, 5]}], "point_indices": [7],
                           "box": [], "lasso": []}}
    st.session_state["fake_map"] = event
    st.session_state["fake_head"] = {"selection": {**event["selection"], "points": [
        {"curve_number": 1, "point_index": 3, "customdata": {"0": 6, "1": 2}}]}}  # a typed array, as Chromium sends it
    L._jump_from_map("fake_map", 9)()
    L.pick_pair_callback("fake_head", list(range(40, 89)))()  # the figure shows positions 40…88
    st.session_state["fake_map"] = {"selection": {"points": [], "point_indices": [], "box": [], "lasso": []}}
    L._jump_from_map("fake_map", 0)()  # an empty selection (a second click deselects) changes nothing
    st.text(" ".join(str(st.session_state[k]) for k in ("layer", "head", "token", L.Q_KEY, L.K_KEY)))


def test_click_callbacks_read_the_selection_event():
    at = AppTest.from_function(click_script).run()
    assert not at.exception
    assert at.text[0].value.split() == ["12", "5", "9", "46", "42"]


def test_multihead_parts_concat_times_w_o_is_attn_out(page, reference):
    loaded, ids, rec = reference
    cfg = loaded.model.cfg
    page.sidebar.slider(key="layer").set_value(3)
    page.sidebar.slider(key="head").set_value(4)
    page.sidebar.slider(key="token").set_value(9).run()
    fig = by_id(page, "attn_mh_flow")
    n = len(ids)
    v = rec["blocks.3.attn.hook_v"][0].double().numpy()
    z = rec["blocks.3.attn.hook_z"][0].double().numpy()
    out = rec["blocks.3.hook_attn_out"][0].double().numpy()
    np.testing.assert_allclose(decode(trace(fig, "V")["z"]), v.reshape(n, -1), atol=1e-5)
    np.testing.assert_allclose(decode(trace(fig, "z")["z"]), z[:, 4], atol=1e-5)
    concat = decode(trace(fig, "concat")["z"])
    assert concat.shape == (n, cfg.n_heads * cfg.head_dim)
    np.testing.assert_allclose(concat[:, 4 * cfg.head_dim:5 * cfg.head_dim], z[:, 4], atol=1e-5)
    # z of head 4 really is its pattern times the values of KV head 4 // n_rep
    p = rec.pattern(3)[0, 4].double().numpy()
    np.testing.assert_allclose(z[:, 4], p @ v[:, 4 // cfg.n_rep], atol=1e-4)
    w_o = loaded.model.blocks[3].attn.o_proj.weight.detach().double().numpy()
    np.testing.assert_allclose(concat @ w_o.T, out, atol=2e-4 * np.abs(out).max())
    np.testing.assert_allclose(decode(trace(fig, "attn_out")["z"]), out, atol=1e-5)
    norms = decode(by_id(page, "attn_mh_norms")["data"][0]["y"])
    d = cfg.head_dim
    expected = [np.linalg.norm(z[9, h] @ w_o[:, h * d:(h + 1) * d].T) for h in range(cfg.n_heads)]
    np.testing.assert_allclose(norms, expected, rtol=1e-5)
    assert f"[{n}, {cfg.n_heads}·{cfg.head_dim} = {cfg.n_heads * cfg.head_dim}]" in all_text(page)


def test_sqrt_dk_study_against_numpy_softmax(page, reference):
    loaded, ids, rec = reference
    cfg = loaded.model.cfg
    fig = by_id(page, "attn_scale")
    d = cfg.head_dim
    n = len(ids)
    ent_s, ent_u, raw = [], [], []
    for layer in range(cfg.n_layers):
        q = rec[f"blocks.{layer}.attn.hook_rot_q"][0].double().numpy()  # [T, H, d]
        k = rec[f"blocks.{layer}.attn.hook_rot_k"][0].double().numpy()  # [T, KV, d]
        k = np.repeat(k, cfg.n_rep, axis=1)
        dots = np.einsum("qhd,khd->hqk", q, k)[:, 1:]  # query 0 left out
        visible = np.tril(np.ones((n, n), dtype=bool))[1:]
        raw.append(dots[:, visible].std())
        for scale, out in ((np.sqrt(d), ent_s), (1.0, ent_u)):
            s = np.where(visible, dots / scale, -np.inf)
            p = np.exp(s - s.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            h = -np.where(p > 0, p * np.log(np.where(p > 0, p, 1)), 0).sum(-1)  # nats
            out.append(h.mean())
    np.testing.assert_allclose(decode(trace(fig, "entropy_scaled")["y"]), ent_s, atol=2e-3)
    np.testing.assert_allclose(decode(trace(fig, "entropy_unscaled")["y"]), ent_u, atol=2e-3)
    np.testing.assert_allclose(decode(trace(fig, "raw_std")["y"]), raw, rtol=1e-3)
    np.testing.assert_allclose(decode(trace(fig, "scaled_std")["y"]), np.array(raw) / np.sqrt(d), rtol=1e-3)
    assert np.all(np.array(ent_u) < np.array(ent_s))  # without the scale the softmax saturates
    uniform = decode(trace(fig, "uniform")["y"])
    np.testing.assert_allclose(uniform, np.log(np.arange(2, n + 1)).mean(), atol=1e-9)
