"""The block view shows this prompt's real shapes, numbers and norms (prompt and helpers: test_app_tokens_block.py)."""
import re

import numpy as np
import pytest

from apptest_util import all_text, decode, figures, record_prompt, run_app
from test_app_tokens_block import LAYER, PROMPT, TOKEN, tables


@pytest.fixture(scope="module")
def reference(loaded):
    return (loaded, *record_prompt(loaded, PROMPT))


@pytest.fixture(scope="module")
def block_page():
    return run_app(view="block", prompt=PROMPT, layer=LAYER, token=TOKEN)


def _t(key, **values):
    from app import i18n
    return i18n.t(key, "en", **values)


def test_block_diagram_has_this_prompts_shapes(block_page, reference):
    loaded, ids, _ = reference
    cfg, T = loaded.model.cfg, len(ids)
    assert not block_page.exception
    figs = figures(block_page)
    block_text = " ".join(a["text"] for a in figs[0]["layout"]["annotations"])
    assert f"[1, {T}, {cfg.d_model}]" in block_text and f"[1, {T}, {cfg.d_ff}]" in block_text
    assert "RoPE" in block_text and "residual" in block_text
    assert f"Q [1, {cfg.n_heads}, {T}, {cfg.head_dim}]" in block_text
    model_text = " ".join(a["text"] for a in figs[1]["layout"]["annotations"])
    assert f"[1, {T}]" in model_text and f"[1, {T}, {cfg.vocab_size}]" in model_text and f"× {cfg.n_layers}" in model_text


def test_post_norm_drawing_is_a_parameter(reference):
    from app.panels.block import block_figure, block_nodes

    cfg = reference[0].model.cfg
    kinds = lambda placement: [n["kind"] for n in block_nodes(cfg, 7, placement, _t)[0]]  # noqa: E731
    assert kinds("pre") == ["io", "norm", "attention", "add", "norm", "ffn", "add"]
    assert kinds("post") == ["io", "attention", "add", "norm", "ffn", "add", "norm"]
    assert "Post-Norm" in block_figure(cfg, 7, "post", _t).layout.title.text


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_diagram_labels_fit_their_boxes_at_768px(reference, lang):
    """Each box is at least as wide as its widest text line and as tall as its lines, at the narrowest width the
    figure gets at a 768 px screen: the block drawing's column (320 px of plot) and the full-width model chain (700)."""
    import unicodedata

    from app import i18n
    from app.panels.block import block_figure, model_figure

    cfg = reference[0].model.cfg
    tr = lambda key, **v: i18n.t(key, lang, **v)  # noqa: E731
    block = block_figure(cfg, 256, "pre", tr)
    assert block.layout.height - 70 >= block.layout.yaxis.range[1] - block.layout.yaxis.range[0]  # 1 y unit <= 1 px
    for fig, plot_px, y_px in ((block, 320, 1.0), (model_figure(cfg, 256, tr), 700, None)):
        lo, hi = fig.layout.xaxis.range
        px = plot_px / (hi - lo)
        notes = {(round(a.x, 6), round(a.y, 6)): a for a in fig.layout.annotations if a.text and not a.showarrow}
        boxes = [s for s in fig.layout.shapes if s.type == "rect"]
        assert len(boxes) >= 5
        for s in boxes:
            note = notes[round((s.x0 + s.x1) / 2, 6), round((s.y0 + s.y1) / 2, 6)]
            lines = re.sub(r"</?[bi]>", "", note.text).split("<br>")
            width = max(sum(1.0 if unicodedata.east_asian_width(c) in "WF" else 0.62 for c in line) for line in lines)
            assert width * note.font.size <= (s.x1 - s.x0) * px, note.text
            if y_px:
                assert len(lines) * note.font.size * 1.2 <= (s.y1 - s.y0) * y_px, note.text
            assert note.font.size >= 8


def test_block_numbers_are_the_recordings(block_page, reference):
    _, _, rec = reference
    df = tables(block_page)[0]
    values = dict(zip(df["quantity"], df[f"token {TOKEN}"]))
    means = dict(zip(df["quantity"], df["mean over tokens"]))

    def norm(name):
        return rec[f"blocks.{LAYER}.{name}"][0].double().norm(dim=-1).numpy()

    x, a = norm("hook_resid_pre"), norm("hook_attn_out")
    s1 = rec[f"blocks.{LAYER}.ln1.hook_scale"][0, :, 0].double().numpy()
    np.testing.assert_allclose(values["‖x‖ (block input)"], x[TOKEN], rtol=1e-5)
    np.testing.assert_allclose(values["ln1 RMS divisor"], s1[TOKEN], rtol=1e-5)
    np.testing.assert_allclose(means["‖attention output‖"], a.mean(), rtol=1e-5)
    np.testing.assert_allclose(values["‖attention output‖ / ‖x‖"], a[TOKEN] / x[TOKEN], rtol=1e-5)
    lines = figures(block_page)[2]["data"]
    np.testing.assert_allclose(decode(lines[1]["y"]), [
        rec[f"blocks.{L}.hook_attn_out"][0, TOKEN].double().norm().item() for L in range(rec.cfg.n_layers)], rtol=1e-5)


CODE_VIEWS = [("x = E[ids]", "tokens"), ("h = x + Attn(RMSNorm(x))", "residual"), ("n = RMSNorm(x)", "norm"),
              ("q, k, v = ", "attention"), ("q, k = RoPE(q), RoPE(k)", "rope"), ("p = softmax(", "attention"),
              ("z = p·v", "attention"), ("Attn = concat(z)·W_O", "attention"), ("y = h + FFN(RMSNorm(h))", "residual"),
              ("n = RMSNorm(h)", "norm"), ("g, u = n·W_gate, n·W_up", "swiglu"), ("FFN = W_down(SiLU(g) ⊙ u)", "swiglu"),
              ("logits = ", "residual")]
CODE_SECTIONS = {2: "divisors", 4: "pairs", 11: "silu"}  # where the norm, the RoPE and the SwiGLU line land


def test_pseudo_code_lines_carry_shapes_and_switch_view(block_page, reference):
    loaded, ids, _ = reference
    cfg, T = loaded.model.cfg, len(ids)
    labels = [b.label for b in block_page.button if b.key and b.key.startswith("block_code_")]
    assert len(labels) == len(CODE_VIEWS)
    for label, (code, _) in zip(labels, CODE_VIEWS):
        assert code in label
    shapes = [c.value for c in block_page.caption if c.value.startswith(("[", "q ["))]
    assert len(shapes) == len(CODE_VIEWS)
    by_code = dict(zip([c for c, _ in CODE_VIEWS], shapes))
    assert f"[1, {cfg.n_heads}, {T}, {T}]" in by_code["p = softmax("]
    assert f"[1, {T}, {cfg.n_heads * cfg.head_dim}] → [1, {T}, {cfg.d_model}]" in by_code["Attn = concat(z)·W_O"]
    assert f"[1, {T}, {cfg.d_ff}]" in by_code["FFN = W_down(SiLU(g) ⊙ u)"]
    assert f"[1, {T}, {cfg.n_heads}, {cfg.head_dim}]" == by_code["z = p·v"]
    for i, section in CODE_SECTIONS.items():  # a norm, the RoPE and the SwiGLU line
        at = run_app(view="block", prompt=PROMPT)
        at.button(key=f"block_code_{i}").click().run()
        assert not at.exception and at.session_state["view"] == CODE_VIEWS[i][1]
        assert not [b for b in at.button if b.key and b.key.startswith("block_code_")]  # left the block view
        assert at.query_params["section"] == section and at.session_state["_landing"] == 1  # landed on its part


def test_node_button_switches_view(reference):
    _, ids, _ = reference
    at = run_app(view="block", prompt=PROMPT)
    at.button(key="block_go_tokens").click().run()
    assert not at.exception and at.session_state["view"] == "tokens"
    assert tables(at)[0]["id"].tolist() == ids


@pytest.mark.parametrize("key, spec", [("block_change_norope", "no-rope"), ("block_change_relu", "relu"),
                                       ("block_change_normid", f"norm-identity:blocks.{LAYER}.ln1")])
def test_four_changes_open_the_what_if(key, spec):
    at = run_app(view="block", prompt=PROMPT, layer=LAYER)
    at.button(key=key).click().run()
    assert not at.exception
    assert at.session_state["view"] == "whatif" and at.session_state["whatif"] == spec
    assert at.text_input(key="whatif_specs").value == spec  # the what-if view shows and runs that spec
    assert at.query_params["section"] == "results" and at.session_state["_landing"] == 1  # landed on its results


def test_four_changes_table_and_other_links(block_page):
    text = all_text(block_page)
    for word in ("where the norm sits", "which norm", "how position enters", "the FFN's activation"):
        assert word in text
    for key, target in (("block_change_twins", ("normlab", "twins")), ("block_change_rope", ("rope", "sinusoidal")),
                        ("block_change_norm", ("norm", "layernorm")), ("block_change_swiglu", ("swiglu", "silu"))):
        assert block_page.button(key=key).proto.label
        from app.panels.block import code as blockcode
        row = next(l for r in blockcode.changes(_t, LAYER) for l in r["links"] if l[0] == key)
        assert row[2] is blockcode._go and row[3] == target  # the view and the part of it that shows the change


def test_block_view_in_chinese():
    at = run_app(view="block", prompt="深度学习很", lang="zh")
    assert not at.exception
    text = " ".join(a["text"] for a in figures(at)[0]["layout"]["annotations"])
    assert "注意力" in text and "残差" in text
    assert "模块中的数值" in all_text(at) and "四处改动" in all_text(at)


def test_switching_layer_and_token_runs_no_forward(block_page):
    from app import gateway as state

    before = state.FORWARDS["count"]
    block_page.sidebar.slider(key="layer").set_value(7).run()
    block_page.sidebar.slider(key="token").set_value(1).run()
    assert not block_page.exception
    assert "block 7" in all_text(block_page)
    block_page.segmented_control(key="view").set_value("tokens").run()
    block_page.sidebar.slider(key="layer").set_value(9).run()
    assert not block_page.exception
    assert "blocks.9.attn.hook_q" in tables(block_page)[1]["hook"].tolist()
    assert state.FORWARDS["count"] == before
