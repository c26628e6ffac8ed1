"""The Residual/prediction view: its figures show exactly what the recording holds (SwiGLU: test_app_swiglu.py)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from apptest_util import all_text, decode, figures, run_app

import app.explorer as app_explorer
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


# ----------------------------------------------------------------------------- Residual and prediction
def test_residual_matches_recording(loaded):
    ids, rec = recording(loaded, PROMPT)
    at = run_app(view="residual", prompt=PROMPT, layer=3, token=2)
    assert not at.exception
    n = rec.cfg.n_layers

    norms = decode(fig_with(at, "per layer and token")["data"][0]["z"])
    pre = np.stack([rec[f"blocks.{l}.hook_resid_pre"][0].numpy() for l in range(n)]
                   + [rec[f"blocks.{n - 1}.hook_resid_post"][0].numpy()])
    np.testing.assert_allclose(norms, np.linalg.norm(pre, axis=-1), rtol=1e-5)

    contrib = fig_with(at, "How much each sub-layer adds")["data"]
    attn = np.stack([np.linalg.norm(rec[f"blocks.{l}.hook_attn_out"][0].numpy(), axis=-1) for l in range(n)])
    np.testing.assert_allclose(decode(contrib[0]["y"]), attn.mean(1), rtol=1e-5)
    np.testing.assert_allclose(decode(contrib[2]["y"]), attn[:, 2], rtol=1e-5)

    lens = fig_with(at, "Logit lens")["data"][0]
    assert len(lens["text"]) == n and len(lens["text"][-1]) == len(ids)
    real = rec.logits[0].argmax(-1)
    from app.context import display_piece
    assert lens["text"][-1] == [display_piece(loaded.tokenizer.piece(int(i))) for i in real]
    np.testing.assert_allclose(decode(lens["z"])[-1], torch.softmax(rec.logits[0], -1).max(-1).values.numpy(),
                               rtol=1e-4)

    def check_steps(temp, k, p):
        bars = fig_with(at, "Next-token probabilities")["data"]
        s = filter_steps(rec.logits[0, -1], temp, k, p)
        top = [int(i) for i in decode(bars[0]["customdata"])]
        assert top == torch.argsort(rec.logits[0, -1], descending=True)[:15].tolist()
        for trace, probs in zip(bars, (s.raw, s.tempered, s.top_k, s.top_p)):
            np.testing.assert_allclose(decode(trace["y"]), probs[top].numpy(), rtol=1e-5, atol=1e-7)
            assert trace["name"].endswith(f"({int((probs > 0).sum())})")

    check_steps(1.0, 50, 0.9)
    at.slider(key="pred_temperature").set_value(0.7).run()
    at.number_input(key="pred_top_k").set_value(5).run()
    at.slider(key="pred_top_p").set_value(0.5).run()
    check_steps(0.7, 5, 0.5)

    before = app_explorer.FORWARDS["count"]
    at.sidebar.slider(key="layer").set_value(9).run()
    at.sidebar.slider(key="token").set_value(5).run()
    at.sidebar.slider(key="head").set_value(1).run()
    assert not at.exception
    assert app_explorer.FORWARDS["count"] == before


def test_take_top_token_and_undo(loaded):
    prompt = "The capital of France is"
    app_explorer.result_cache().clear()  # other tests may have recorded the extended prompt already
    at = run_app(view="residual", prompt=prompt)
    assert not at.exception
    before = app_explorer.FORWARDS["count"]
    at.button(key="pred_greedy").click().run()
    assert not at.exception
    assert at.session_state["prompt"] == prompt + " Paris"
    assert app_explorer.FORWARDS["count"] == before + 2  # exactly the new prompt's recording and its logit lens
    tok = loaded.tokenizer
    assert tok.encode(at.session_state["prompt"]) == tok.encode(prompt) + tok.encode(" Paris")
    hist = at.session_state["pred_history"]
    assert [h["piece"] for h in hist] == [" Paris"] and 0 < hist[0]["p_raw"] <= 1
    # the page now predicts after " Paris": the logit lens has one more position
    assert len(fig_with(at, "Logit lens")["data"][0]["x"]) == len(tok.encode(prompt)) + 1

    at.button(key="pred_undo").click().run()
    assert not at.exception
    assert at.session_state["prompt"] == prompt and not at.session_state["pred_history"]
    assert app_explorer.FORWARDS["count"] == before + 2  # the old prompt's recording and lens are still cached

    # sampling is reproducible: the same seed and prompt give the same token
    at.button(key="pred_sample").click().run()
    first = at.session_state["prompt"]
    at.button(key="pred_undo").click().run()
    at.button(key="pred_sample").click().run()
    assert at.session_state["prompt"] == first != prompt


def test_residual_chinese():
    at = run_app(view="residual", prompt="深度学习很", lang="zh")
    assert not at.exception
    assert "残差流" in all_text(at)
    assert fig_with(at, "每一层会预测")
    assert any(b.label == "撤销" for b in at.button)
