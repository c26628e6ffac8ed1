"""The tokens/shapes view shows this prompt's real ids, shapes, counts and costs (the block view: test_app_block.py)."""

import numpy as np
import pytest

from apptest_util import all_text, decode, figures, record_prompt, run_app, title

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
def reference(loaded):
    return (loaded, *record_prompt(loaded, PROMPT))


@pytest.fixture(scope="module")
def tokens_page():
    return run_app(view="tokens", prompt=PROMPT, layer=LAYER, token=TOKEN)


def tables(at):
    return [el.value for el in at.dataframe]


def fig_by_title(at, start: str) -> dict:
    found = [f for f in figures(at) if title(f).startswith(start)]
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
    assert not [f for f in figures(at) if "with and without BOS" in title(f)]
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
    """With BOS in front, position 0 is named as BOS and drawn as the dark chip; the comparison then uses this
    page's own recording for the BOS run. Put there by the sidebar's switch, the text moved one place to the
    right; typed as the text's first token (a chat template starts with SmolLM2's BOS), nothing moved."""
    loaded, _, _ = reference
    bos = loaded.tokenizer.bos_id
    switched = run_app(view="tokens", prompt="深度学习很", bos=1)
    n = len(loaded.tokenizer.encode("深度学习很"))
    assert f"Position 0 is now that BOS token: the {n} tokens of the text" in switched.success[0].value
    prompt = loaded.tokenizer.piece(bos) + "深度学习很"
    ids = loaded.tokenizer.encode(prompt)
    assert ids[0] == bos
    at = run_app(view="tokens", prompt=prompt)
    assert not at.exception and not at.success
    assert "Position 0 is that BOS token because the text typed starts with it" in all_text(at)
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


def test_a_projector_s_tables_say_yes_and_no_in_no_language():
    """Presenter mode draws tables as HTML, where yes and no were written "True" / "False" on a Chinese page: ✓ and ✗,
    as the grid's ticked and empty boxes, for the token table's special and whole-character columns and the shapes
    table's agreement."""
    at = run_app(view="tokens", presenter=1, lang="zh", prompt="深度学习很")
    tokens, shapes = at.table[0].value, at.table[1].value
    assert tokens["片段"].tolist()[:4] == ["深·1/3", "深·2/3", "深·3/3", "度"]
    assert tokens["完整 UTF-8"].tolist()[:4] == ["✗", "✗", "✗", "✓"] and set(tokens["特殊"]) == {"✗"}
    assert set(shapes["一致"]) == {"✓"}


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
        # Q, K, V and z: the hook's own order named beside its numbers (the formula's column has T third)
        order = " = [B, T, H_kv, Dh]" if hook.endswith(("hook_k", "hook_v")) else \
            " = [B, T, H, Dh]" if hook.endswith(("hook_q", "hook_z")) else ""
        assert got == str(list(tensor.shape)) + order, hook
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
    # hooks keep [B, T, heads, Dh], and say so
    assert row[f"blocks.{LAYER}.attn.hook_q"] == str([1, T, h, d // h]) + " = [B, T, H, Dh]"
    assert row[f"blocks.{LAYER}.attn.hook_k"] == str([1, T, kv, d // h]) + " = [B, T, H_kv, Dh]"
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


@pytest.mark.parametrize("view", ["tokens", "block"])
def test_presenter_mode_folds_the_explanations(view):
    at = run_app(view=view, prompt="深度学习很")
    assert at.main.expander and all(e.proto.expanded for e in at.main.expander)
    at.sidebar.toggle(key="presenter").set_value(True).run()
    assert not at.exception
    assert at.main.expander and not any(e.proto.expanded for e in at.main.expander)
