"""The SwiGLU and Residual/prediction views: their figures show exactly what the recording holds."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from apptest_util import all_text, decode, figures, run_app

import app.explorer as app_explorer
from app.presets import BANK_PAIR
from explorer_model.sampling import filter_steps

pytestmark = pytest.mark.slow
PROMPT = "The animal didn't cross the street because it was too tired."


@pytest.fixture(scope="module")
def loaded():
    from explorer_model.loaders import load
    return load("smollm2")


def recording(loaded, text):
    from explorer_model.recording import record
    tok = loaded.tokenizer
    ids = tok.encode(text, add_bos=tok.add_bos)
    return ids, record(loaded.model, ids)


def fig_with(at, title_part):
    for f in figures(at):
        title = f["layout"].get("title", {})
        if title_part in (title.get("text", "") if isinstance(title, dict) else str(title)):
            return f
    raise AssertionError(f"no figure titled …{title_part}…")


# ----------------------------------------------------------------------------- SwiGLU
def test_swiglu_matches_recording(loaded):
    ids, rec = recording(loaded, PROMPT)
    layer, token = 7, 3
    at = run_app(view="swiglu", prompt=PROMPT, layer=layer, token=token)
    assert not at.exception

    post = rec[f"blocks.{layer}.mlp.hook_post"][0].numpy()
    expected = np.argsort(-np.abs(post).mean(0), kind="stable")[:32]
    heat = fig_with(at, "product")["data"][0]
    assert [int(x[1:]) for x in heat["x"]] == expected.tolist()
    np.testing.assert_allclose(decode(heat["z"]), post[:, expected], rtol=1e-5, atol=1e-6)
    assert len(heat["y"]) == len(ids)

    at.radio(key="swiglu_quantity").set_value("act").run()
    at.number_input(key="swiglu_topk").set_value(8).run()
    heat = figures(at)[0]["data"][0]
    act = rec[f"blocks.{layer}.mlp.hook_act"][0].numpy()
    assert [int(x[1:]) for x in heat["x"]] == expected[:8].tolist()
    np.testing.assert_allclose(decode(heat["z"]), act[:, expected[:8]], rtol=1e-5, atol=1e-6)

    # the token's table: top neurons by |product| with gate, SiLU, up, product
    tok_fig = fig_with(at, "Top neurons of token")
    top = np.argsort(-np.abs(post[token]), kind="stable")[:12]
    assert [int(x[1:]) for x in tok_fig["data"][0]["x"]] == top.tolist()
    for trace, hook in zip(tok_fig["data"], ("hook_pre", "hook_act", "hook_pre_linear", "hook_post")):
        np.testing.assert_allclose(decode(trace["y"]), rec[f"blocks.{layer}.mlp.{hook}"][0, token, top].numpy(),
                                   rtol=1e-5, atol=1e-6)

    # sparsity per layer, at the default threshold and a changed one
    for thr in (0.1, 0.05):
        if thr != 0.1:
            at.number_input(key="swiglu_threshold").set_value(thr).run()
        bars = fig_with(at, "Share of FFN neurons")["data"]
        acts = np.stack([rec[f"blocks.{l}.mlp.hook_act"][0].numpy() for l in range(rec.cfg.n_layers)])
        posts = np.stack([rec[f"blocks.{l}.mlp.hook_post"][0].numpy() for l in range(rec.cfg.n_layers)])
        np.testing.assert_allclose(decode(bars[0]["y"]), (np.abs(acts) < thr).mean(axis=(1, 2)), atol=1e-6)
        np.testing.assert_allclose(decode(bars[1]["y"]), (np.abs(posts) < thr).mean(axis=(1, 2)), atol=1e-6)

    # histogram of the gate values counts every token × neuron
    silu = fig_with(at, "SiLU against ReLU")["data"]
    assert decode(silu[0]["y"]).sum() == len(ids) * rec.cfg.d_ff

    # the bank comparison finds " bank" in both default prompts
    text = all_text(at)
    assert "token 1 “␣bank” of A" in text and "token 1 “␣bank” of B" in text
    sim = fig_with(at, "Same word, two contexts")["data"]
    for trace in sim:
        y = decode(trace["y"])
        assert y.shape == (rec.cfg.n_layers,) and np.all((y >= -1) & (y <= 1))
    # identical prefixes up to " bank" (the causal mask): the same activations, so similarity 1 everywhere
    np.testing.assert_allclose(decode(sim[0]["y"]), 1.0, atol=1e-5)
    assert at.session_state["swiglu_prompt_a"] == BANK_PAIR[0]

    # the context-first pair diverges in later layers
    at.button(key="swiglu_context_first").click().run()
    assert not at.exception
    y = decode(fig_with(at, "Same word, two contexts")["data"][0]["y"])
    assert y[0] > 0.95 and y[1:].min() < 0.9
    ids_a, rec_a = recording(loaded, at.session_state["swiglu_prompt_a"])
    ids_b, rec_b = recording(loaded, at.session_state["swiglu_prompt_b"])
    i, j = len(ids_a) - 1, len(ids_b) - 1  # both context-first prompts end with " bank"
    table = at.dataframe[-1].value
    neurons = table.iloc[:, 0].to_numpy()
    a = rec_a[f"blocks.{layer}.mlp.hook_act"][0, i].numpy()
    b = rec_b[f"blocks.{layer}.mlp.hook_act"][0, j].numpy()
    np.testing.assert_allclose(table["A"].to_numpy(), a[neurons], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(table["B"].to_numpy(), b[neurons], rtol=1e-5, atol=1e-6)
    assert neurons[0] == int(np.abs(a - b).argmax())

    # switching the shared selection reruns only the drawing
    before = app_explorer.FORWARDS["count"]
    at.sidebar.slider(key="layer").set_value(2).run()
    at.sidebar.slider(key="token").set_value(1).run()
    at.sidebar.slider(key="head").set_value(4).run()
    assert not at.exception
    assert app_explorer.FORWARDS["count"] == before


def test_swiglu_chinese():
    at = run_app(view="swiglu", prompt="深度学习很", lang="zh")
    assert not at.exception
    assert "门控" in all_text(at)
    assert fig_with(at, "同一个词")
