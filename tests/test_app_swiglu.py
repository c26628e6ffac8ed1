"""The SwiGLU view: its figures show exactly what the recording holds; gate kinds counted from hook_act; the FFN
recomputed from a recorded input equals hook_mlp_out; replacing another token changes a position's FFN output only
where its FFN input changed."""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from apptest_util import all_text, by_id, decode, fig_with, figures, record_prompt, run_app, select, trace, title

import app.gateway as app_explorer
from app.presets import BANK_PAIR

pytestmark = pytest.mark.slow
PROMPT = "The animal didn't cross the street because it was too tired."


# ----------------------------------------------------------------------------- SwiGLU
def test_swiglu_matches_recording(loaded):
    ids, rec = record_prompt(loaded, PROMPT)
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
    for line, hook in zip(tok_fig["data"], ("hook_pre", "hook_act", "hook_pre_linear", "hook_post")):
        np.testing.assert_allclose(decode(line["y"]), rec[f"blocks.{layer}.mlp.{hook}"][0, token, top].numpy(),
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

    # the bank comparison opens on the context-first pair (both end in " bank"): it diverges in later layers
    ids_a, rec_a = record_prompt(loaded, at.session_state["swiglu_prompt_a"])
    ids_b, rec_b = record_prompt(loaded, at.session_state["swiglu_prompt_b"])
    i, j = len(ids_a) - 1, len(ids_b) - 1
    text = all_text(at)
    assert f"token {i} “␣bank” of A" in text and f"token {j} “␣bank” of B" in text
    sim = fig_with(at, "Same word, two contexts")["data"]
    for trace in sim:
        y = decode(trace["y"])
        assert y.shape == (rec.cfg.n_layers,) and np.all((y >= -1) & (y <= 1))
    y = decode(sim[0]["y"])
    assert y[0] > 0.95 and y[1:].min() < 0.9
    table = at.dataframe[-1].value
    neurons = table.iloc[:, 0].to_numpy()
    a = rec_a[f"blocks.{layer}.mlp.hook_act"][0, i].numpy()
    b = rec_b[f"blocks.{layer}.mlp.hook_act"][0, j].numpy()
    np.testing.assert_allclose(table["A"].to_numpy(), a[neurons], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(table["B"].to_numpy(), b[neurons], rtol=1e-5, atol=1e-6)
    assert neurons[0] == int(np.abs(a - b).argmax())

    # the bank presets' pair, whose " bank" comes before any context (the causal mask): the same activations,
    # similarity 1 everywhere, and the page offers the context-first pair back
    at.text_input(key="swiglu_prompt_a").set_value(BANK_PAIR[0]).run()
    at.text_input(key="swiglu_prompt_b").set_value(BANK_PAIR[1]).run()
    assert "token 1 “␣bank” of A" in all_text(at) and "token 1 “␣bank” of B" in all_text(at)
    np.testing.assert_allclose(decode(fig_with(at, "Same word, two contexts")["data"][0]["y"]), 1.0, atol=1e-5)
    at.button(key="swiglu_context_first").click().run()
    from app.panels.swiglu import CONTEXT_FIRST_PAIR
    assert not at.exception and (at.session_state["swiglu_prompt_a"], at.session_state["swiglu_prompt_b"]) == \
        CONTEXT_FIRST_PAIR

    # switching the shared selection reruns only the drawing
    before = app_explorer.FORWARDS["count"]
    select(at, layer=2, token=1, head=4)
    assert not at.exception
    assert app_explorer.FORWARDS["count"] == before


def test_swiglu_chinese():
    at = run_app(view="swiglu", prompt="深度学习很", lang="zh")
    assert not at.exception
    assert "门控" in all_text(at)
    assert fig_with(at, "同一个词")


# ----------------------------------------------------------------------------- axes, position-wise FFN, gate kinds
LAYER, TOKEN = 7, 4


@pytest.fixture(scope="module")
def page():
    return run_app(view="swiglu", prompt=PROMPT, layer=LAYER, token=TOKEN)


def test_silu_chart_axes_share_their_zero(page):
    layout = fig_with(page, "SiLU against ReLU")["layout"]
    (lo1, hi1), (lo2, hi2) = layout["yaxis"]["range"], layout["yaxis2"]["range"]
    assert lo1 < 0 < hi1 and lo2 < 0 < hi2
    assert -lo1 / (hi1 - lo1) == pytest.approx(-lo2 / (hi2 - lo2), abs=1e-9)
    assert min(layout["yaxis2"]["tickvals"]) == 0  # no negative counts labelled


def test_gate_kinds_counted_from_hook_act(page, loaded):
    _, rec = record_prompt(loaded, PROMPT)
    g = rec[f"blocks.{LAYER}.mlp.hook_act"][0, TOKEN].double().numpy()
    u = rec[f"blocks.{LAYER}.mlp.hook_pre_linear"][0, TOKEN].double().numpy()
    a = np.abs(g)
    expected = {"close": a < 0.05, "weaken": (a >= 0.05) & (a < 0.5), "partly keep": (a >= 0.5) & (a < 0.85),
                "keep": a >= 0.85}
    fig = by_id(page, "swiglu_gate_kinds")
    for kind, mask in expected.items():
        tr = trace(fig, kind)
        neurons = decode(tr["customdata"]).astype(int)
        assert sorted(neurons) == np.flatnonzero(mask).tolist()
        np.testing.assert_allclose(decode(tr["x"]), g[neurons], rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(decode(tr["y"]), u[neurons], rtol=1e-6, atol=1e-7)
        assert tr["name"].endswith(f"({int(mask.sum())})")
    assert sum(m.sum() for m in expected.values()) == rec.cfg.d_ff
    table = next(d.value for d in page.dataframe if "g·u" in d.value.columns)
    for _, row in table.iterrows():  # each example is a neuron of its kind, with its recorded g and u
        n = int(row.iloc[1])
        assert row["g"] == pytest.approx(g[n], rel=1e-6, abs=1e-7) and row["u"] == pytest.approx(u[n], rel=1e-6, abs=1e-7)
    counts = all_text(page)
    assert f"**{int(expected['keep'].sum())}**" in counts and f"**{int(expected['close'].sum())}**" in counts


def _ffn(loaded, rec, layer):
    """The FFN of every position, written out here from the weights and the recorded ln2 output."""
    blk = loaded.model.blocks[layer]
    n = rec[f"blocks.{layer}.ln2.hook_normalized"][0].double() * blk.ln2.weight.double()
    w = lambda lin: lin.weight.double()  # noqa: E731
    gate = torch.nn.functional.silu(n @ w(blk.mlp.gate_proj).T)
    return (gate * (n @ w(blk.mlp.up_proj).T)) @ w(blk.mlp.down_proj).T


@pytest.mark.parametrize("pos, word", [(9, " dog"), (2, " cat"), (0, " A")])
def test_ffn_is_position_wise(page, loaded, pos, word):
    ids, _ = record_prompt(loaded, PROMPT)
    if "swiglu_pw_run" in [b.key for b in page.button]:  # the page's first comparison (the page is shared)
        page.button(key="swiglu_pw_run").click().run()
    page.selectbox(key="swiglu_pw_pos").set_value(pos).run()
    page.text_input(key="swiglu_pw_word").set_value(word).run()
    assert not page.exception and not page.error
    new = loaded.tokenizer.encode(word)[0]
    changed = list(ids)
    changed[pos] = new
    # the recordings the page drew (the changed prompt runs from the replaced position on: an extension, equal to a
    # fresh recording within float32 rounding only, tests/test_extend.py)
    rec, rec_b = (app_explorer.recording(app_explorer.DEFAULT_SOURCE, x) for x in (ids, changed))
    fig = by_id(page, "swiglu_positionwise")
    diff = lambda name: (rec[f"blocks.{LAYER}.{name}"][0].double()  # noqa: E731
                         - rec_b[f"blocks.{LAYER}.{name}"][0].double()).abs().amax(-1).numpy()
    din, dout = diff("ln2.hook_normalized"), diff("hook_mlp_out")
    np.testing.assert_allclose(decode(trace(fig, "input_diff")["y"]), din, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(decode(trace(fig, "output_diff")["y"]), dout, rtol=1e-6, atol=1e-9)
    # causal: positions before the replaced token see the same prompt; equal FFN input -> equal FFN output
    assert np.all(din[:pos] == 0) and np.all(din[pos:] > 0)
    assert np.all(dout[din == 0] == 0) and np.all(dout[din > 0] > 0)
    # the FFN of each position, recomputed from that position's recorded input alone, is hook_mlp_out
    for r in (rec, rec_b):
        y = _ffn(loaded, r, LAYER)
        assert (y - r[f"blocks.{LAYER}.hook_mlp_out"][0].double()).abs().max() < 1e-4
    text = all_text(page)
    assert (f"At {int((din == 0).sum())} of {len(ids)} positions the FFN input is unchanged" in text) == (pos > 0)
    reported = [float(x) for x in re.search(r"up to (\S+) in the original prompt and (\S+) in the changed", text).groups()]
    assert max(reported) < 1e-4  # the page's own recomputation at the selected token agrees too


def test_swiglu_new_parts_chinese():
    at = run_app(view="swiglu", prompt=PROMPT, lang="zh", layer=3, token=5)
    assert not at.exception and not at.error
    text = all_text(at)
    assert "部分保留" in text and "FFN 对每个位置单独计算" in text
    assert "每个神经元的门控" in title(by_id(at, "swiglu_gate_kinds"))


def test_the_position_wise_comparison_runs_when_asked_for_or_when_a_step_or_link_is_about_it():
    """Its changed prompt is a second recording: the view runs it when the visitor asks (or a step or link lands
    on the section), not on every first visit to the view."""
    pw = lambda at: [f for f in figures(at) if (f["layout"].get("meta") or {}).get("id") == "swiglu_positionwise"]  # noqa: E731
    at = run_app(view="swiglu", prompt=PROMPT, layer=LAYER, token=TOKEN)
    assert not at.exception and not pw(at) and "swiglu_pw_run" in [b.key for b in at.button]
    at.button(key="swiglu_pw_run").click().run()
    assert len(pw(at)) == 1 and at.session_state["swiglu_pw_go"] is True
    linked = run_app(view="swiglu", prompt=PROMPT, layer=LAYER, token=TOKEN, section="positionwise")
    assert not linked.exception and len(pw(linked)) == 1 and "swiglu_pw_run" not in [b.key for b in linked.button]
