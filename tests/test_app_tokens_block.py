"""The tokens/shapes view and the block view show this prompt's real ids, shapes, counts, costs and norms."""
import re

import numpy as np
import pytest

from apptest_util import all_text, decode, figures, run_app

PROMPT = "I love 深度学习 🦙!"
LAYER, TOKEN = 4, 2
# Published parameter totals in billions (LLaMA paper Table 2, Llama-2 and Llama-3 model cards)
PUBLISHED = {"LLaMA-1 7B": 6.74, "LLaMA-1 13B": 13.0, "LLaMA-1 33B": 32.5, "LLaMA-1 65B": 65.2,
             "Llama-2 7B": 6.74, "Llama-2 70B": 68.98, "Llama-3 8B": 8.03}
# (d_model, layers, heads, kv heads, d_ff, vocab) from the same sources
SHAPES = {"LLaMA-1 7B": (4096, 32, 32, 32, 11008, 32000), "LLaMA-1 13B": (5120, 40, 40, 40, 13824, 32000),
          "LLaMA-1 33B": (6656, 60, 52, 52, 17920, 32000), "LLaMA-1 65B": (8192, 80, 64, 64, 22016, 32000),
          "Llama-2 70B": (8192, 80, 64, 8, 28672, 32000), "Llama-3 8B": (4096, 32, 32, 8, 14336, 128256)}


def published_total(d, n, h, kv, dff, v):
    """Untied LLaMA: embedding + output + per block (Q, O, K, V, three FFN matrices, two norms) + final norm."""
    dh = d // h
    return 2 * v * d + n * (2 * d * h * dh + 2 * d * kv * dh + 3 * d * dff + 2 * d) + d


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


def fig_by_title(at, start: str) -> dict:
    found = [f for f in figures(at) if (f["layout"].get("title") or {}).get("text", "").startswith(start)]
    assert len(found) == 1, start
    return found[0]


# --------------------------------------------------------------------------- tokens
def test_token_table_is_the_tokenizers_output(tokens_page, reference):
    loaded, ids, _ = reference
    tok = loaded.tokenizer
    assert not tokens_page.exception
    df = tables(tokens_page)[0]
    assert df["id"].tolist() == ids
    assert df["UTF-8 bytes (hex)"].tolist() == [tok.token_bytes(i).hex(" ") for i in ids]
    assert df["bytes"].tolist() == [len(tok.token_bytes(i)) for i in ids]
    assert df["special"].tolist() == [tok.is_special(i) for i in ids]
    assert "␣love" in df["piece"].tolist()
    assert [i for i in ids if not _valid_utf8(tok.token_bytes(i))] and not df["whole UTF-8"].all()
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


def test_bos_state_and_its_effect_on_attention(reference):
    """SmolLM2 adds no BOS: the page says so, and the comparison is the first-position attention of both runs."""
    from explorer_model.recording import record

    loaded, _, _ = reference
    prompt = "深度学习很"
    ids = loaded.tokenizer.encode(prompt)
    bos = loaded.tokenizer.bos_id
    assert not loaded.tokenizer.add_bos
    at = run_app(view="tokens", prompt=prompt)
    assert "does **not** add a BOS token" in all_text(at) and f"(id {bos})" in all_text(at)
    assert not [f for f in figures(at) if "with and without BOS" in f["layout"]["title"]["text"]]
    at.button(key="tokens_bos_go").click().run()
    assert not at.exception
    fig = fig_by_title(at, "Attention to position 0")
    assert fig["data"][0]["name"] == f"without BOS (position 0 = {tables(at)[0]['piece'][0]})"  # the page's own label

    def sink(run_ids):
        rec = record(loaded.model, run_ids)
        return [rec.pattern(l)[0, :, 1:, 0].double().mean().item() for l in range(rec.cfg.n_layers)]
    np.testing.assert_allclose(decode(fig["data"][0]["y"]), sink(ids), atol=1e-5)
    np.testing.assert_allclose(decode(fig["data"][1]["y"]), sink([bos] + ids), atol=1e-5)


def test_prompt_that_starts_with_bos_shows_it(reference):
    """With BOS in front (as the sidebar's switch puts it), position 0 is named as BOS and drawn as the dark chip;
    the comparison then uses this page's own recording for the BOS run."""
    loaded, _, _ = reference
    bos = loaded.tokenizer.bos_id
    prompt = loaded.tokenizer.piece(bos) + "深度学习很"
    ids = loaded.tokenizer.encode(prompt)
    assert ids[0] == bos
    at = run_app(view="tokens", prompt=prompt)
    assert not at.exception
    assert f"Position 0 is now that BOS token: the {len(ids) - 1} tokens of the text" in at.success[0].value
    chips = next(m.value for m in at.markdown if "<span" in m.value)
    assert chips.count("background:#1f2937") == 1 and chips.index("background:#1f2937") < chips.index("<span", chips.index("<span") + 1)
    assert tables(at)[0]["id"].tolist()[0] == bos
    at.button(key="tokens_bos_go").click().run()
    fig = fig_by_title(at, "Attention to position 0")
    assert fig["data"][1]["name"].startswith("with BOS") and len(decode(fig["data"][1]["y"])) == loaded.model.cfg.n_layers


def test_bos_variants():
    from app.panels.tokens import bos_variants

    assert bos_variants([5, 6], 1) == ((5, 6), (1, 5, 6))
    assert bos_variants([1, 5, 6], 1) == ((5, 6), (1, 5, 6))


def test_embedding_charts_are_hook_embed(tokens_page, reference):
    _, ids, rec = reference
    emb = rec["hook_embed"][0].double().numpy()
    bar, heat = figures(tokens_page)[0], figures(tokens_page)[1]
    np.testing.assert_allclose(decode(bar["data"][0]["y"]), emb[TOKEN, :64], atol=1e-6)
    np.testing.assert_allclose(decode(heat["data"][0]["z"]), emb[:, :64], atol=1e-6)
    assert len(heat["data"][0]["y"]) == len(ids)


def test_shapes_table_equals_recorded_shapes(tokens_page, reference):
    loaded, ids, rec = reference
    cfg, T = loaded.model.cfg, len(ids)
    df = tables(tokens_page)[1]
    hooks = df["hook"].tolist()
    for hook, got in zip(hooks, df["recorded shape"]):
        tensor = rec.token_ids if hook == "token_ids" else rec.logits if hook == "logits" else rec[hook]
        assert got == str(list(tensor.shape)), hook
    assert df["matches"].all()
    row = dict(zip(hooks, df["numeric"]))
    assert row[f"blocks.{LAYER}.attn.hook_q"] == str([1, cfg.n_heads, T, cfg.head_dim])
    assert row[f"blocks.{LAYER}.attn.hook_k"] == str([1, cfg.n_kv_heads, T, cfg.head_dim])
    assert row[f"blocks.{LAYER}.attn.hook_z"] == str([1, cfg.n_heads, T, cfg.head_dim])
    assert row[f"blocks.{LAYER}.attn.hook_pattern"] == str([1, cfg.n_heads, T, T])
    assert row["logits"] == str([1, T, cfg.vocab_size])


def test_param_counts_are_the_models(tokens_page, reference):
    loaded, _, _ = reference
    counts = loaded.model.param_counts()
    df = tables(tokens_page)[3]
    names = ["embedding", "attention", "FFN", "norms", "output", "total"]
    assert df["component"].tolist() == names
    assert df["parameters"].tolist() == [counts[k] for k in ("embedding", "attention", "ffn", "norms", "output", "total")]
    assert df["formula value"].tolist() == df["parameters"].tolist()
    assert counts["output"] == 0 and "Tied embeddings" in all_text(tokens_page)
    bar = fig_by_title(tokens_page, "Parameters per component")
    assert decode(bar["data"][0]["y"]).tolist() == [counts[k] for k in ("embedding", "attention", "ffn", "norms", "output")]


@pytest.mark.parametrize("name", ["LLaMA-1 7B", "LLaMA-1 65B", "Llama-2 70B", "Llama-3 8B"])
def test_family_table_has_published_totals_and_shapes(name):
    from explorer_model import families

    at = run_app(view="tokens", prompt="深度学习很", layer=LAYER)
    T = len(tables(at)[0])
    at.selectbox(key="tokens_family").set_value(name).run()
    assert not at.exception
    d, n, h, kv, dff, v = SHAPES[name]
    shapes, weights, params, memory = tables(at)[1], tables(at)[2], tables(at)[3], tables(at)[4]
    row = dict(zip(shapes["hook"], shapes["shape on the meta device"]))
    assert row[f"blocks.{LAYER}.attn.hook_q"] == str([1, T, h, d // h])  # hooks keep [B, T, heads, Dh]
    assert row[f"blocks.{LAYER}.attn.hook_k"] == str([1, T, kv, d // h])
    assert row[f"blocks.{LAYER}.mlp.hook_post"] == str([1, T, dff]) and row["logits"] == str([1, T, v])
    assert shapes["matches"].all()
    w = dict(zip(weights["weight"], weights["shape"]))
    assert w[f"blocks.{LAYER}.attn.q_proj.weight"] == str([h * (d // h), d])
    assert w[f"blocks.{LAYER}.attn.k_proj.weight"] == str([kv * (d // h), d])
    assert w[f"blocks.{LAYER}.mlp.down_proj.weight"] == str([d, dff]) and w["unembed.weight"] == str([v, d])
    total = params["parameters"].tolist()[-1]
    assert (weights["parameters"] * weights["copies"]).sum() == total  # the weights add up to the total
    assert total == families.component_params(families.FAMILIES[name])["total"] == published_total(*SHAPES[name])
    assert abs(total / (PUBLISHED[name] * 1e9) - 1) < 0.002
    assert params["rounded"].tolist()[-1] == f"{total / 1e9:.2f} B"
    assert f"published figure for {name} is {PUBLISHED[name]} B" in all_text(at)
    kv_bytes = dict(zip(memory["dtype"], memory["KV cache per token (bytes)"]))
    assert kv_bytes["float32"] == 2 * n * kv * (d // h) * 4 and kv_bytes["bfloat16"] == 2 * n * kv * (d // h) * 2
    weights = dict(zip(memory["dtype"], memory["weights"]))
    assert weights["bfloat16"] == f"{total * 2 / 2**30:.2f} GiB"


def test_attention_costs_grow_with_t_squared(tokens_page, reference):
    loaded, ids, _ = reference
    cfg, T = loaded.model.cfg, len(ids)
    d7, n7, h7 = 4096, 32, 32
    mem = fig_by_title(tokens_page, "Attention scores of one layer")
    flops = fig_by_title(tokens_page, "Attention FLOPs")
    for fig, per in ((mem, {"this model": lambda t: cfg.n_heads * t**2 * 4, "LLaMA-1 7B": lambda t: h7 * t**2 * 4}),
                     (flops, {"this model": lambda t: cfg.n_layers * 4 * cfg.n_heads * t**2 * cfg.head_dim,
                              "LLaMA-1 7B": lambda t: n7 * 4 * h7 * t**2 * (d7 // h7)})):
        for trace in [tr for tr in fig["data"] if tr.get("meta") in per]:
            x = decode(trace["x"])
            assert T in x.tolist() and 8192 in x.tolist()
            np.testing.assert_allclose(decode(trace["y"]), per[trace["meta"]](x), rtol=1e-12)
    linear = next(tr for tr in flops["data"] if tr.get("meta") == "LLaMA-1 7B:matmul_flops")
    y = decode(linear["y"])
    np.testing.assert_allclose(y[1:] / y[:-1], decode(linear["x"])[1:] / decode(linear["x"])[:-1])  # ∝ T


def test_kv_cache_bytes_mha_vs_gqa(tokens_page, reference):
    loaded, ids, _ = reference
    cfg, T = loaded.model.cfg, len(ids)
    expected = {"this model": 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * 2,
                "LLaMA-1 7B": 2 * 32 * 32 * 128 * 2, "Llama-2 70B": 2 * 80 * 8 * 128 * 2}
    df = tables(tokens_page)[5]
    assert dict(zip(df["model"], df["bytes per token"])) == expected
    assert dict(zip(df["model"], df["attention"])) == {"this model": "GQA", "LLaMA-1 7B": "MHA", "Llama-2 70B": "GQA"}
    assert df[f"bytes, T = {T}"].tolist() == [expected[m] * T for m in df["model"]]
    assert dict(zip(df["model"], df["smaller by"]))["Llama-2 70B"] == "8×"
    fig = fig_by_title(tokens_page, "KV cache per token")
    actual = next(tr for tr in fig["data"] if tr["meta"] == "actual")
    np.testing.assert_allclose(decode(actual["y"]), [expected[m] / 1024 for m in actual["x"]])


def test_tokens_view_in_chinese():
    at = run_app(view="tokens", prompt="今天天气很好", lang="zh")
    assert not at.exception
    text = all_text(at)
    assert "参数在哪里" in text and "字节级 BPE" in text and "不会" in text
    params = tables(at)[3]
    assert params["部分"].tolist() == ["嵌入", "注意力", "前馈网络 FFN", "归一化", "输出层", "合计"]
    assert params["公式"].tolist()[-1] == "求和" and params["公式"].tolist()[-2].startswith("0（共享")


# --------------------------------------------------------------------------- the block
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
    for i in (2, 4, 11):  # a norm, the RoPE and the SwiGLU line
        at = run_app(view="block", prompt=PROMPT)
        at.button(key=f"block_code_{i}").click().run()
        assert not at.exception and at.session_state["view"] == CODE_VIEWS[i][1]
        assert not [b for b in at.button if b.key and b.key.startswith("block_code_")]  # left the block view


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


def test_four_changes_table_and_other_links(block_page):
    text = all_text(block_page)
    for word in ("where the norm sits", "which norm", "how position enters", "the FFN's activation"):
        assert word in text
    for key, view in (("block_change_twins", "normlab"), ("block_change_rope", "rope"), ("block_change_norm", "norm"),
                      ("block_change_swiglu", "swiglu")):
        assert block_page.button(key=key).proto.label
        from app.panels import blockcode
        row = next(l for r in blockcode.changes(_t, LAYER) for l in r["links"] if l[0] == key)
        assert row[2] is blockcode._go and row[3] == view


def test_block_view_in_chinese():
    at = run_app(view="block", prompt="深度学习很", lang="zh")
    assert not at.exception
    text = " ".join(a["text"] for a in figures(at)[0]["layout"]["annotations"])
    assert "注意力" in text and "残差" in text
    assert "模块中的数值" in all_text(at) and "四处改动" in all_text(at)


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
    assert "blocks.9.attn.hook_q" in tables(block_page)[1]["hook"].tolist()
    assert state.FORWARDS["count"] == before


@pytest.mark.parametrize("view", ["tokens", "block"])
def test_presenter_mode_folds_the_explanations(view):
    at = run_app(view=view, prompt="深度学习很")
    assert at.expander and all(e.proto.expanded for e in at.expander)
    at.sidebar.toggle(key="presenter").set_value(True).run()
    assert not at.exception
    assert at.expander and not any(e.proto.expanded for e in at.expander)
