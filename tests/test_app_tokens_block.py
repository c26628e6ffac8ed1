"""The tokens/shapes view and the block view show this prompt's real ids, shapes, counts and norms."""
import numpy as np
import pytest

from apptest_util import all_text, decode, figures, run_app

PROMPT = "I love 深度学习 🦙!"
LAYER, TOKEN = 4, 2


@pytest.fixture(scope="module")
def reference():
    from explorer_model.loaders import load
    from explorer_model.recording import record

    loaded = load("smollm2")
    ids = loaded.tokenizer.encode(PROMPT)
    return loaded, ids, record(loaded.model, ids)


@pytest.fixture(scope="module")
def tokens_page():
    return run_app(view="tokens", prompt=PROMPT, layer=LAYER, token=TOKEN)


@pytest.fixture(scope="module")
def block_page():
    return run_app(view="block", prompt=PROMPT, layer=LAYER, token=TOKEN)


def tables(at):
    return [el.value for el in at.dataframe]


# --------------------------------------------------------------------------- tokens & shapes
def test_token_table_is_the_tokenizers_output(tokens_page, reference):
    loaded, ids, _ = reference
    tok = loaded.tokenizer
    assert not tokens_page.exception
    df = tables(tokens_page)[0]
    assert df["id"].tolist() == ids
    assert df["position"].tolist() == list(range(len(ids)))
    assert df["UTF-8 bytes (hex)"].tolist() == [tok.token_bytes(i).hex(" ") for i in ids]
    assert df["special"].tolist() == [tok.is_special(i) for i in ids]
    assert "␣love" in df["piece"].tolist()  # whitespace made visible
    # the emoji (4 bytes) and some Chinese characters are cut into byte pieces: the page says so
    partial = [i for i in ids if not _valid_utf8(tok.token_bytes(i))]
    assert partial and not df["whole UTF-8"].all()
    assert "Byte-level BPE" in all_text(tokens_page)
    chips = next(m.value for m in tokens_page.markdown if "<span" in m.value)
    assert chips.count("<span title=") == len(ids)


def _valid_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def test_chips_escape_html():
    from app.panels.tokens import chips_html

    html = chips_html([dict(position=0, piece="<script>", id=5, bytes="3c", special=False, whole_utf8=True)], 0)
    assert "<script>" not in html and "&lt;script&gt;" in html


def test_embedding_charts_are_hook_embed(tokens_page, reference):
    _, ids, rec = reference
    emb = rec["hook_embed"][0].double().numpy()
    figs = figures(tokens_page)
    bar, heat = figs[0], figs[1]
    np.testing.assert_allclose(decode(bar["data"][0]["y"]), emb[TOKEN, :64], atol=1e-6)
    np.testing.assert_allclose(decode(heat["data"][0]["z"]), emb[:, :64], atol=1e-6)
    assert len(heat["data"][0]["y"]) == len(ids)


def test_shapes_table_equals_recorded_shapes(tokens_page, reference):
    loaded, ids, rec = reference
    cfg, T = loaded.model.cfg, len(ids)
    df = tables(tokens_page)[1]
    hooks = df["recorded hook"].tolist()
    assert f"blocks.{LAYER}.attn.hook_q" in hooks and "logits" in hooks and "hook_embed" in hooks
    for hook, got, numeric in zip(hooks, df["hook shape"], df["this model"]):
        tensor = rec.token_ids if hook == "token_ids" else rec.logits if hook == "logits" else rec[hook]
        assert got == str(list(tensor.shape)), hook
        assert numeric.startswith("[1, ")
    assert df["matches"].all()
    row = dict(zip(hooks, df["this model"]))
    assert row[f"blocks.{LAYER}.attn.hook_q"] == str([1, cfg.n_heads, T, cfg.head_dim])
    assert row[f"blocks.{LAYER}.attn.hook_k"] == str([1, cfg.n_kv_heads, T, cfg.head_dim])
    assert row[f"blocks.{LAYER}.attn.hook_pattern"] == str([1, cfg.n_heads, T, T])
    assert row[f"blocks.{LAYER}.mlp.hook_post"] == str([1, T, cfg.d_ff])
    assert row["logits"] == str([1, T, cfg.vocab_size])


def test_param_counts_are_the_models(tokens_page, reference):
    loaded, _, _ = reference
    counts = loaded.model.param_counts()
    df = tables(tokens_page)[2]
    assert dict(zip(df["component"], df["parameters"])) == counts
    assert df["formula value"].tolist() == df["parameters"].tolist()  # the formulas add up
    assert counts["output"] == 0 and "Tied embeddings" in all_text(tokens_page)
    bar = figures(tokens_page)[2]
    assert decode(bar["data"][0]["y"]).tolist() == [counts[k] for k in ("embedding", "attention", "ffn",
                                                                         "norms", "output")]


def test_kv_cache_bytes(tokens_page, reference):
    loaded, ids, _ = reference
    cfg, T = loaded.model.cfg, len(ids)
    df = tables(tokens_page)[3]
    per_token = df["bytes per token"].tolist()
    assert per_token == [2 * cfg.n_layers * h * cfg.head_dim * b
                         for h in (cfg.n_kv_heads, cfg.n_heads) for b in (4, 2)]
    assert per_token[0] == loaded.model.kv_cache_bytes_per_token(4) == 2 * 30 * 3 * 64 * 4
    assert df[f"bytes, this prompt (T={T})"].tolist() == [p * T for p in per_token]
    assert "3× larger" in all_text(tokens_page)


def test_tokens_view_in_chinese():
    at = run_app(view="tokens", prompt="今天天气很好", lang="zh")
    assert not at.exception
    text = all_text(at)
    assert "参数在哪里" in text and "字节级 BPE" in text
    assert "位置" in tables(at)[0].columns


# --------------------------------------------------------------------------- the block
def test_block_diagram_has_this_prompts_shapes(block_page, reference):
    loaded, ids, _ = reference
    cfg, T = loaded.model.cfg, len(ids)
    assert not block_page.exception
    figs = figures(block_page)
    block_text = " ".join(a["text"] for a in figs[0]["layout"]["annotations"])
    assert f"[1, {T}, {cfg.d_model}]" in block_text
    assert f"[1, {T}, {cfg.d_ff}]" in block_text and "RoPE" in block_text and "residual" in block_text
    assert f"Q [1, {cfg.n_heads}, {T}, {cfg.head_dim}]" in block_text
    assert len(figs[0]["layout"]["shapes"]) >= 8  # boxes, adds, skip lines
    model_text = " ".join(a["text"] for a in figs[1]["layout"]["annotations"])
    assert f"[1, {T}]" in model_text and f"[1, {T}, {cfg.vocab_size}]" in model_text
    assert f"× {cfg.n_layers}" in model_text
    assert "W_{down}" in all_text(block_page)


def test_post_norm_drawing_is_a_parameter(reference):
    from app.panels.block import block_figure, block_nodes

    cfg = reference[0].model.cfg
    kinds = lambda placement: [n["kind"] for n in block_nodes(cfg, 7, placement)[0]]  # noqa: E731
    assert kinds("pre") == ["io", "norm", "attention", "add", "norm", "ffn", "add", "io"]
    assert kinds("post") == ["io", "attention", "add", "norm", "ffn", "add", "norm", "io"]
    assert "Post-Norm" in block_figure(cfg, 7, "post").layout.title.text


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


def test_node_button_switches_view(reference):
    _, ids, _ = reference
    at = run_app(view="block", prompt=PROMPT)
    at.button(key="block_go_tokens").click().run()
    assert not at.exception
    assert at.session_state["view"] == "tokens"
    assert tables(at)[0]["id"].tolist() == ids  # the tokens view is drawn now
    assert not [b for b in at.button if b.key and b.key.startswith("block_go_")]
    at = run_app(view="block", prompt=PROMPT)
    at.button(key="block_go_norm").click().run()
    assert at.session_state["view"] == "norm" and not at.exception
    assert not [b for b in at.button if b.key and b.key.startswith("block_go_")]


def test_block_view_in_chinese():
    at = run_app(view="block", prompt="深度学习很", lang="zh")
    assert not at.exception
    text = " ".join(a["text"] for a in figures(at)[0]["layout"]["annotations"])
    assert "注意力" in text and "残差" in text
    assert "模块中的数值" in all_text(at)


def test_switching_layer_and_token_runs_no_forward(block_page):
    from app import explorer as state

    before = state.FORWARDS["count"]
    block_page.sidebar.slider(key="layer").set_value(7).run()
    block_page.sidebar.slider(key="token").set_value(1).run()
    assert not block_page.exception
    assert "block 7" in all_text(block_page)
    block_page.segmented_control(key="view").set_value("tokens").run()
    block_page.sidebar.slider(key="layer").set_value(9).run()
    assert not block_page.exception
    assert "blocks.9.attn.hook_q" in tables(block_page)[1]["recorded hook"].tolist()
    assert state.FORWARDS["count"] == before
