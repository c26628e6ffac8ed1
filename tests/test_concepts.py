"""The concept data layer (explorer_model/analysis: objective, attention_math, encodings, ffn, costs, lesson) against
written-out equations, a tiny random model built here, and hand-made recordings. The slow tests check the lesson
claims on the real SmolLM2."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from explorer_model import LlamaModel, ModelConfig
from explorer_model.analysis import attention_math as AM
from explorer_model.analysis import costs as C
from explorer_model.analysis import encodings as E
from explorer_model.analysis import ffn as FF
from explorer_model.analysis import lesson as LS
from explorer_model.analysis.measures import prompt_loss
from explorer_model.analysis.objective import position_losses
from explorer_model.recording import Recording, record


def tiny(**kw) -> LlamaModel:
    base = dict(vocab_size=61, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=48,
                norm_eps=1e-5, rope_theta=10000.0, max_seq_len=64, tie_embeddings=False)
    base.update(kw)
    torch.manual_seed(1)
    model = LlamaModel(ModelConfig(**base)).eval().requires_grad_(False)
    for name, p in model.named_parameters():  # non-trivial γ so a forgotten γ fails the FFN check
        if "ln" in name and name.endswith("weight"):
            p.copy_(1 + 0.3 * torch.randn_like(p))
    return model


IDS = [3, 14, 15, 9, 26, 53, 58, 9, 7, 32, 38, 46]


@pytest.fixture(scope="module")
def model():
    return tiny()


@pytest.fixture(scope="module")
def rec(model):
    return record(model, IDS)


def W(p) -> np.ndarray:
    return p.detach().double().numpy()


# --------------------------------------------------------------------------- 15.1 per-position loss
def test_position_losses_are_the_cross_entropy_of_each_next_token(model, rec):
    out = position_losses(rec)
    logits = rec.logits[0].double().numpy()
    lse = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    expected = np.array([lse[t] - logits[t, IDS[t + 1]] for t in range(len(IDS) - 1)])
    np.testing.assert_allclose(out.losses, expected, rtol=1e-5)
    assert out.mean == pytest.approx(expected.mean(), rel=1e-5) == prompt_loss(rec.logits, IDS)
    np.testing.assert_allclose(out.target_prob, np.exp(-expected), rtol=1e-5)
    assert list(out.targets) == IDS[1:] and list(out.predicted) == list(logits[:-1].argmax(-1))
    assert all(out.target_rank[t] == (logits[t] > logits[t, IDS[t + 1]]).sum() for t in range(len(IDS) - 1))
    # Training reads all positions in one pass; generation would run each prefix again: same numbers.
    for t in (0, 4, len(IDS) - 2):
        last = model(torch.tensor([IDS[:t + 1]]))[0, -1]
        assert float(F.cross_entropy(last[None], torch.tensor([IDS[t + 1]]))) == pytest.approx(out.losses[t], rel=1e-4)


def test_position_losses_of_one_token(model):
    out = position_losses(record(model, [5]))
    assert out.losses.shape == (0,) and math.isnan(out.mean)


# --------------------------------------------------------------------------- 15.2 √d_k
def test_scale_study_against_written_out_dot_products(rec):
    st = AM.scale_study(rec)
    d_k, n, n_heads = rec.cfg.head_dim, rec.n_pos, rec.cfg.n_heads

    def entropy_and_max(raw, scale, first=1):  # softmax over the visible keys of query rows first … n−1, by hand
        ent, mx = np.zeros(n_heads), np.zeros(n_heads)
        for h in range(n_heads):
            for i in range(first, n):
                e = np.exp(raw[h, i, :i + 1] * scale - (raw[h, i, :i + 1] * scale).max())
                p = e / e.sum()
                ent[h] += -(p[p > 0] * np.log(p[p > 0])).sum() / (n - first)
                mx[h] += p.max() / (n - first)
        return ent, mx

    for layer in range(rec.cfg.n_layers):
        q = rec[f"blocks.{layer}.attn.hook_rot_q"][0].double().numpy()
        k = rec[f"blocks.{layer}.attn.hook_rot_k"][0].double().numpy()
        raw = np.full((n_heads, n, n), np.nan)
        for h in range(n_heads):
            for i in range(n):
                for j in range(i + 1):
                    raw[h, i, j] = q[i, h] @ k[j, h // rec.cfg.n_rep]  # query head h reads KV head h // n_rep
        vis = raw[:, 1:][~np.isnan(raw[:, 1:])]  # causal pairs of queries 1 … n−1
        assert st.raw_std[layer] == pytest.approx(vis.std(), rel=1e-5)
        assert st.scaled_std[layer] == pytest.approx(vis.std() / math.sqrt(d_k), rel=1e-5)
        for scale, ent, mx in ((1 / math.sqrt(d_k), st.entropy_scaled, st.max_weight_scaled),
                               (1.0, st.entropy_unscaled, st.max_weight_unscaled)):
            e, m = entropy_and_max(raw, scale)
            np.testing.assert_allclose(ent[layer], e, atol=1e-5)
            np.testing.assert_allclose(mx[layer], m, atol=1e-5)
        np.testing.assert_allclose(AM.attention_entropy(rec.pattern(layer)[0].numpy()), st.entropy_scaled[layer],
                                   atol=1e-5)
        window = AM.scale_study(rec, layers=[layer], max_queries=4)  # the last 4 query rows only
        np.testing.assert_allclose(window.entropy_unscaled[0], entropy_and_max(raw, 1.0, n - 4)[0], atol=1e-5)
        assert window.raw_std[0] == pytest.approx(raw[:, n - 4:][~np.isnan(raw[:, n - 4:])].std(), rel=1e-5)
        assert window.queries == 4
    assert st.uniform_entropy == pytest.approx(np.mean([math.log(i + 1) for i in range(1, n)]))
    assert st.queries == n - 1 and st.layers == [0, 1]


def test_random_dot_products_spread_like_sqrt_d():
    t = AM.random_dot_spread((4, 64, 1024), n_pairs=6000)
    np.testing.assert_allclose(t["std"] / np.sqrt([4, 64, 1024]), 1.0, atol=0.06)
    np.testing.assert_allclose(t["std_scaled"], 1.0, atol=0.06)
    assert t["entropy_unscaled"][-1] < 0.1 * t["max_entropy"]  # d_k = 1024 unscaled: nearly one-hot
    assert np.all(t["entropy_scaled"] > 0.8 * t["max_entropy"])  # scaled: spread, whatever d_k
    assert np.all(np.diff(t["entropy_unscaled"]) < 0)


# --------------------------------------------------------------------------- 11.14 multi-head
def test_heads_concatenate_and_project_to_the_attention_output(model, rec):
    for layer in range(rec.cfg.n_layers):
        mh = AM.multihead_parts(rec, layer)
        p = rec.pattern(layer)[0].double().numpy()
        for h in range(rec.cfg.n_heads):  # z_h = pattern_h · V of KV head h // n_rep, written out per head
            np.testing.assert_allclose(mh.z[:, h], p[h] @ mh.v[:, h // 2], atol=1e-5)
            np.testing.assert_array_equal(mh.concat[:, 8 * h:8 * h + 8], mh.z[:, h])
        w_o = W(model.blocks[layer].attn.o_proj.weight)
        np.testing.assert_allclose(AM.project_heads(mh.concat, w_o), mh.attn_out, atol=1e-5)
        np.testing.assert_allclose(AM.head_contributions(mh.z, w_o).sum(0), mh.attn_out, atol=1e-5)
        assert list(mh.kv_head_of) == [0, 0, 1, 1]
        assert mh.shapes == {"V": (12, 2, 8), "z": (12, 4, 8), "concat": (12, 32), "W_O": (32, 32),
                             "attn_out": (12, 32)}
    with pytest.raises(ValueError, match="columns"):
        AM.project_heads(mh.concat, w_o[:, :16])


# --------------------------------------------------------------------------- 15.3 sinusoidal vs RoPE
def test_sinusoidal_encoding_follows_the_formula():
    for d in (6, 7):
        pe = E.sinusoidal_encoding(5, d)
        for pos in range(5):
            for j in range(d):
                angle = pos / 10000 ** (2 * (j // 2) / d)
                assert pe[pos, j] == pytest.approx(math.sin(angle) if j % 2 == 0 else math.cos(angle), abs=1e-12)
    np.testing.assert_allclose(np.linalg.norm(E.sinusoidal_encoding(9, 6), axis=-1), math.sqrt(3))
    with pytest.raises(ValueError):
        E.sinusoidal_encoding(3, 0)


def test_encoding_against_the_embeddings_and_into_v(model, rec):
    info = E.encoding_vs_embedding(rec)
    emb = model.embed.weight[IDS].double().numpy()
    np.testing.assert_allclose(info["embed_norm"], np.linalg.norm(emb, axis=-1), rtol=1e-6)
    np.testing.assert_allclose(info["ratio"], 4.0 / np.linalg.norm(emb, axis=-1), rtol=1e-6)  # √(32/2) = 4
    assert info["similarity"][0, 0] == pytest.approx(1.0) and info["cosine"][0] < 1
    lin = model.blocks[0].attn.v_proj
    v = E.absolute_in_v(emb, info["pe"], W(lin.weight))
    with torch.no_grad():  # the same projection, by torch's own layer on x + PE
        ref = lin(torch.tensor(emb + info["pe"], dtype=torch.float32)).double().numpy()
    np.testing.assert_allclose(v["v_abs"], ref, atol=1e-5)
    np.testing.assert_allclose(v["v_abs"] - v["v_plain"], v["v_position"], atol=1e-10)
    assert v["relative_change"][0] > 0.05  # the encoding reaches V at every position (PE[0] = [0, 1, 0, 1, …])
    with pytest.raises(ValueError):
        E.absolute_in_v(emb, info["pe"][:3], W(lin.weight))


def test_rope_turns_q_and_k_but_not_v(rec):
    f = E.rope_footprint(rec, 1)
    assert f["q_change"][0] == pytest.approx(0, abs=1e-7) and f["k_change"][0] == pytest.approx(0, abs=1e-7)
    assert np.all(f["q_change"][1:] > 1e-3) and np.all(f["k_change"][1:] > 1e-3)
    np.testing.assert_allclose(f["q_norm_ratio"], 1, atol=1e-5)
    np.testing.assert_allclose(f["k_norm_ratio"], 1, atol=1e-5)
    assert f["v_z_error"] < 1e-5


# --------------------------------------------------------------------------- 15.4 position-wise FFN
def ffn_weights(model, layer):
    m = model.blocks[layer].mlp
    return dict(w_up=W(m.up_proj.weight), w_down=W(m.down_proj.weight),
                w_gate=W(m.gate_proj.weight) if m.gated else None, gamma=W(model.blocks[layer].ln2.weight))


def test_ffn_output_is_recomputed_from_its_own_position(model, rec):
    for layer in range(2):
        for pos in (0, 5, 11):
            out = FF.ffn_at_position(rec, layer, pos, **ffn_weights(model, layer))
            assert out["rel_diff"] < 1e-5
    with pytest.raises(ValueError, match="γ"):
        FF.ffn_at_position(rec, 0, 1, **{**ffn_weights(model, 0), "gamma": None})
    with pytest.raises(ValueError, match="outside"):
        FF.ffn_at_position(rec, 0, 12, **ffn_weights(model, 0))
    relu = tiny(ffn_type="relu")
    r = record(relu, IDS)
    assert FF.ffn_at_position(r, 1, 3, **ffn_weights(relu, 1))["rel_diff"] < 1e-5
    # Without γ the rebuilt output is wrong: the check can fail.
    wrong = FF.ffn_at_position(rec, 1, 3, **{**ffn_weights(model, 1), "gamma": np.ones(32)})
    assert wrong["rel_diff"] > 1e-2


def test_changing_one_token_changes_ffn_outputs_only_through_their_inputs(model, rec):
    other = list(IDS)
    other[6] = 1
    cmp = FF.position_wise_comparison(rec, record(model, other), layer=1)
    assert list(np.flatnonzero(cmp["token_changed"])) == [6]
    assert not cmp["input_changed"][:6].any() and not cmp["output_changed"][:6].any()
    assert cmp["input_changed"][6:].all() and cmp["output_changed"][6:].all()
    assert cmp["only_through_input"]
    # A recording whose FFN output moved at position 2 with an unchanged input breaks the claim.
    store = dict(rec._store)
    bent = store["blocks.1.hook_mlp_out"].clone()
    bent[0, 2] += 1.0
    store["blocks.1.hook_mlp_out"] = bent
    fake = Recording(rec.cfg, rec.names, store, rec._rotated, rec.dtype, rec._rebuilt)
    fake.token_ids = rec.token_ids
    assert not FF.position_wise_comparison(rec, fake, layer=1)["only_through_input"]
    with pytest.raises(ValueError, match="same length"):
        FF.position_wise_comparison(rec, record(model, IDS[:5]), layer=1)


# --------------------------------------------------------------------------- 15.5 gate kinds
def test_the_tutorials_gate_example_reads_keep_weaken_close_partly_keep():
    kinds = [FF.GATE_KINDS[i] for i in FF.classify_gates([0.9, 0.1, 0.0, 0.7, -0.2, 3.0])]
    assert kinds == ["keep", "weaken", "close", "partly keep", "weaken", "keep"]


def test_gate_kinds_of_one_token(model, rec):
    gk = FF.gate_kinds(rec, layer=1, pos=7, top=3)
    g = rec["blocks.1.mlp.hook_act"][0, 7].double().numpy()
    np.testing.assert_allclose(gk.gate, FF.silu(rec["blocks.1.mlp.hook_pre"][0, 7].double().numpy()), atol=1e-6)
    a = np.abs(g)
    expected = {"close": a < 0.05, "weaken": (a >= 0.05) & (a < 0.5), "partly keep": (a >= 0.5) & (a < 0.85),
                "keep": a >= 0.85}
    assert gk.counts == {k: int(v.sum()) for k, v in expected.items()} and sum(gk.counts.values()) == 48
    for kind, ex in gk.examples.items():
        assert len(ex) == min(3, gk.counts[kind])
        assert all(expected[kind][e["neuron"]] for e in ex)
        ups = [abs(e["up"]) for e in ex]
        assert ups == sorted(ups, reverse=True)
        assert all(e["product"] == pytest.approx(e["gate"] * e["up"]) for e in ex)
    assert gk.amplified == int((g > 1).sum()) and gk.flipped == int((g < 0).sum())
    with pytest.raises(ValueError, match="ReLU"):
        FF.gate_kinds(record(tiny(ffn_type="relu"), IDS), 0, 0)


# --------------------------------------------------------------------------- 15.7 costs
LLAMA1_7B = ModelConfig(vocab_size=32000, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=32, head_dim=128,
                        d_ff=11008, norm_eps=1e-6, rope_theta=1e4, max_seq_len=2048, tie_embeddings=False)
LLAMA2_70B = ModelConfig(vocab_size=32000, d_model=8192, n_layers=80, n_heads=64, n_kv_heads=8, head_dim=128,
                         d_ff=28672, norm_eps=1e-5, rope_theta=1e4, max_seq_len=4096, tie_embeddings=False)


def test_kv_cache_of_published_models():
    # Widely quoted fp16 figures: LLaMA-1 7B 0.5 MiB per token; Llama-2 70B 320 KiB per token (GQA, 8 KV heads).
    assert C.kv_cache_bytes_per_token(LLAMA1_7B) == 512 * 1024
    assert C.kv_cache_bytes_per_token(LLAMA2_70B) == 320 * 1024
    rows = {r["name"]: r for r in C.kv_cache_table({"7B": LLAMA1_7B, "70B": LLAMA2_70B}, n_tokens=4096)}
    assert rows["7B"]["kind"] == "MHA" and rows["7B"]["saving"] == 1 and rows["7B"]["bytes"] == 2 * 1024**3
    assert rows["70B"]["kind"] == "GQA" and rows["70B"]["saving"] == 8
    assert C.kv_cache_bytes_per_token(C.as_mha(LLAMA2_70B)) == 8 * 320 * 1024


def test_attention_cost_grows_with_t_squared(model):
    cfg = model.cfg
    c = C.attention_costs(cfg, [10, 20, 40], bytes_per_value=4)
    np.testing.assert_allclose(c["score_bytes_per_layer"], 4 * 4 * np.array([100, 400, 1600]))
    np.testing.assert_allclose(c["attention_flops"][1:] / c["attention_flops"][:-1], 4)
    np.testing.assert_allclose(c["matmul_flops"][1:] / c["matmul_flops"][:-1], 2)
    # Linear FLOPs = 2 per weight per token, from the model's own matrices (the embedding is a lookup, not a matmul).
    weights = sum(p.numel() for n, p in model.named_parameters() if p.dim() == 2 and not n.startswith("embed."))
    np.testing.assert_allclose(c["matmul_flops"], 2 * np.array([10, 20, 40]) * weights)
    # QKᵀ and pattern·V, each H·T²·d_k multiply-adds per layer, counted by torch's own matmul shapes.
    assert c["attention_flops"][0] == 2 * 2 * (cfg.n_heads * 10 * 10 * cfg.head_dim) * cfg.n_layers
    # K and V: one row of each projection's output per token and layer, 4 bytes a value
    per_token = sum(4 * (b.attn.k_proj.out_features + b.attn.v_proj.out_features) for b in model.blocks)
    assert C.kv_cache_bytes_per_token(cfg, 4) == per_token
    np.testing.assert_allclose(c["kv_cache_bytes"], np.array([10, 20, 40]) * per_token)
    t = C.crossover_length(LLAMA1_7B)
    at = C.attention_costs(LLAMA1_7B, [round(t)])
    assert at["attention_share"][0] == pytest.approx(0.5, abs=0.01)
    with pytest.raises(ValueError):
        C.attention_costs(cfg, [0])


# --------------------------------------------------------------------------- 11.11 / 11.10 lesson targets
def test_head_link_map_reads_every_layers_pattern(model, rec):
    m = LS.head_link_map(rec, 9, 3)
    expected = np.stack([rec.pattern(l)[0, :, 9, 3].double().numpy() for l in range(2)])
    np.testing.assert_allclose(m, expected, atol=1e-6)
    best = LS.strongest(m)
    assert m[best["layer"], best["head"]] == best["weight"] == m.max()
    only_pattern = record(model, IDS, names=["blocks.*.attn.hook_pattern"])  # no rotated Q/K: read the pattern
    np.testing.assert_allclose(LS.head_link_map(only_pattern, 9, 3), expected, atol=1e-6)
    with pytest.raises(ValueError, match="after query"):
        LS.head_link_map(rec, 3, 9)
    nomask = record(model, IDS, interventions=["no-mask"])  # a stored, unmasked pattern is read as it is
    expected = np.stack([nomask.pattern(l)[0, :, 9, 3].double().numpy() for l in range(2)])
    np.testing.assert_allclose(LS.head_link_map(nomask, 9, 3), expected, atol=1e-6)
    assert not np.allclose(expected, m, atol=1e-3)


def test_word_positions():
    pieces = ["The", " animal", " didn", "'t", " cross", " because", " it", " was", " with", " it"]
    assert LS.word_positions(pieces, "it") == [[6], [9]]  # not inside "with"
    assert LS.word_positions(["▁The", "▁ani", "mal"], "Animal") == [[1, 2]]
    b = "深度学习很".encode()
    assert LS.word_positions([b[:2], b[2:3], b[3:6], b[6:9], b[9:12], b[12:]], "学习") == [[3, 4]]
    with pytest.raises(ValueError):
        LS.word_positions(pieces, " ")


def test_link_target_and_sink(rec):
    pieces = [f" w{i}" for i in range(12)]
    t = LS.word_link_target(rec, pieces, "w10", "w4")
    assert (t["q"], t["k"]) == (10, 4) and t["layer"] == LS.link_target(rec, 10, 4)["layer"]
    np.testing.assert_allclose(t["map"], LS.head_link_map(rec, 10, 4))
    assert t["weight"] == t["map"].max()
    with pytest.raises(ValueError, match="before"):
        LS.word_link_target(rec, pieces, "w4", "w10")
    with pytest.raises(ValueError, match="not a word"):
        LS.word_link_target(rec, pieces, "zebra", "w4")
    s = LS.sink_share(rec)
    for l in range(2):
        p = rec.pattern(l)[0].double().numpy()
        np.testing.assert_allclose(s[l], [np.mean([p[h, q, 0] for q in range(1, 12)]) for h in range(4)])


def repeated_random_tokens(period: int, candidates, seed: int = 0, prefix=()) -> list[int]:
    """An induction prompt: prefix + a random sequence of `period` distinct ids drawn from `candidates` + the same sequence again."""
    candidates = np.asarray(list(candidates), dtype=np.int64)
    if period < 2 or period > candidates.size:
        raise ValueError(f"period must be between 2 and {candidates.size}, got {period}")
    seq = np.random.default_rng(seed).choice(candidates, size=period, replace=False).tolist()
    return [int(i) for i in prefix] + seq + seq


def test_induction_scores(model):
    ids = repeated_random_tokens(5, range(10, 60), seed=3, prefix=[1])
    assert len(ids) == 11 and ids[1:6] == ids[6:] and len(set(ids[1:6])) == 5
    r = record(model, ids)
    s = LS.induction_scores(r, 5)
    for l in range(2):
        p = r.pattern(l)[0].double().numpy()
        np.testing.assert_allclose(s[l], [np.mean([p[h, i, i - 4] for i in range(6, 11)]) for h in range(4)])
    with pytest.raises(ValueError, match="repeated"):
        LS.induction_scores(record(model, IDS), 5)


# --------------------------------------------------------------------------- the real model
@pytest.fixture(scope="module")
def smol():
    from explorer_model.loaders import load

    return load("smollm2")


@pytest.mark.slow
def test_real_lesson_targets(smol):
    tok = smol.tokenizer
    ids = tok.encode("The animal didn't cross the street because it was too tired.")
    rec = record(smol.model, ids)
    pieces = [tok.token_bytes(i) for i in ids]
    t = LS.word_link_target(rec, pieces, "it", "animal")
    assert t["weight"] >= 0.5
    assert LS.sink_share(rec).mean() > 0.3  # most heads park attention on the first token
    rng_ids = repeated_random_tokens(20, range(1000, 20000), seed=0, prefix=ids[:1])
    ind = LS.induction_scores(record(smol.model, rng_ids), 20)
    assert ind.max() > 0.5


@pytest.mark.slow
def test_real_scale_ffn_heads_and_loss(smol):
    model = smol.model
    ids = smol.tokenizer.encode("I love machine learning because it helps me understand the world.")
    rec = record(model, ids)
    st = AM.scale_study(rec)
    assert np.all(st.entropy_unscaled.mean(-1) < st.entropy_scaled.mean(-1))  # without /√d_k softmax saturates
    assert np.all(st.max_weight_unscaled.mean(-1) > st.max_weight_scaled.mean(-1))
    for layer in (0, 15, 29):
        assert FF.ffn_at_position(rec, layer, 6, **ffn_weights(model, layer))["rel_diff"] < 1e-4
        mh = AM.multihead_parts(rec, layer)
        w_o = W(model.blocks[layer].attn.o_proj.weight)
        np.testing.assert_allclose(AM.project_heads(mh.concat, w_o), mh.attn_out, atol=1e-3)
    gk = FF.gate_kinds(rec, 15, 6)
    assert sum(gk.counts.values()) == model.cfg.d_ff and all(gk.counts.values())
    pl = position_losses(rec)
    assert pl.mean == pytest.approx(prompt_loss(rec.logits, ids)) and 0 < pl.mean < 10
    other = list(ids)
    other[4] = ids[2]
    cmp = FF.position_wise_comparison(rec, record(model, other), layer=10)
    assert cmp["only_through_input"] and not cmp["output_changed"][:4].any() and cmp["output_changed"][4:].all()
    assert E.rope_footprint(rec, 10)["v_z_error"] < 1e-4
