"""The instrumented model against written-out equations, in the manner of TransformerLens's tests."""
import math

import pytest
import torch
import torch.nn.functional as F

from explorer_model import KVCache, LlamaModel, ModelConfig
from explorer_model.recording import record, recorder
from explorer_model.rope import adjacent_to_hf, apply_rope, cos_sin, hf_to_adjacent, inverse_frequencies
from explorer_model.generate.sampling import generate


def tiny_config(**kw) -> ModelConfig:
    base = dict(vocab_size=97, d_model=48, n_layers=3, n_heads=6, n_kv_heads=2, head_dim=8, d_ff=80,
                norm_eps=1e-5, rope_theta=10000.0, max_seq_len=64, tie_embeddings=False)
    base.update(kw)
    return ModelConfig(**base)


def tiny_model(**kw) -> LlamaModel:
    torch.manual_seed(0)
    model = LlamaModel(tiny_config(**kw)).eval().requires_grad_(False)
    for name, p in model.named_parameters():  # non-trivial gammas so the norm tests can fail
        if name.endswith("ln1.weight") or name.endswith("ln2.weight") or name == "ln_final.weight":
            p.copy_(1 + 0.3 * torch.randn_like(p))
    return model


TOKENS = torch.tensor([[3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46]])


@pytest.fixture(scope="module")
def model():
    return tiny_model()


@pytest.fixture(scope="module")
def rec(model):
    return record(model, TOKENS)


def block_names(L, gated=True, final=True):
    names = [f"blocks.{L}.hook_resid_pre", f"blocks.{L}.ln1.hook_scale", f"blocks.{L}.ln1.hook_normalized"]
    names += [f"blocks.{L}.attn.hook_{n}" for n in ("q", "k", "v", "rot_q", "rot_k", "attn_scores", "pattern", "z")]
    names += [f"blocks.{L}.hook_attn_out", f"blocks.{L}.hook_resid_mid",
              f"blocks.{L}.ln2.hook_scale", f"blocks.{L}.ln2.hook_normalized", f"blocks.{L}.mlp.hook_pre",
              f"blocks.{L}.mlp.hook_act"]
    names += [f"blocks.{L}.mlp.hook_pre_linear"] if gated else []
    names += [f"blocks.{L}.mlp.hook_post", f"blocks.{L}.hook_mlp_out", f"blocks.{L}.hook_resid_post"]
    return names


def test_exact_hook_names(model):
    expected = ["hook_embed"] + [n for L in range(3) for n in block_names(L)]
    expected += ["ln_final.hook_scale", "ln_final.hook_normalized", "logits"]
    assert model.hook_names() == expected


def test_hook_names_of_post_norm_relu_variant():
    m = tiny_model(norm_placement="post", ffn_type="relu", norm_type="layer")
    expected = ["hook_embed"] + [n for L in range(3) for n in block_names(L, gated=False)] + ["logits"]
    assert m.hook_names() == expected


def test_shapes(rec):
    B, T = TOKENS.shape
    cfg = rec.cfg
    assert rec["hook_embed"].shape == (B, T, cfg.d_model)
    assert rec["blocks.1.ln1.hook_scale"].shape == (B, T, 1)
    assert rec["blocks.1.attn.hook_q"].shape == (B, T, cfg.n_heads, cfg.head_dim)
    assert rec["blocks.1.attn.hook_k"].shape == (B, T, cfg.n_kv_heads, cfg.head_dim)
    assert rec["blocks.1.attn.hook_pattern"].shape == (B, cfg.n_heads, T, T)
    assert rec["blocks.1.mlp.hook_post"].shape == (B, T, cfg.d_ff)
    assert rec["logits"].shape == (B, T, cfg.vocab_size)


def test_rmsnorm_equation(model, rec):
    g = model.blocks[1].ln1.weight
    x = rec["blocks.1.hook_resid_pre"]
    scale = torch.sqrt((x**2).mean(-1, keepdim=True) + model.cfg.norm_eps)
    torch.testing.assert_close(rec["blocks.1.ln1.hook_scale"], scale)
    torch.testing.assert_close(rec["blocks.1.ln1.hook_normalized"], x / scale)
    q_expected = (x / scale * g) @ model.blocks[1].attn.q_proj.weight.T
    torch.testing.assert_close(rec["blocks.1.attn.hook_q"].flatten(-2), q_expected, atol=1e-5, rtol=1e-5)


def test_attention_equations(model, rec):
    cfg, L = model.cfg, 2
    rq, rk, v = (rec[f"blocks.{L}.attn.hook_{n}"][0] for n in ("rot_q", "rot_k", "v"))  # [pos, head, d]
    T = rq.shape[0]
    pattern = rec.pattern(L)[0]
    for h in range(cfg.n_heads):
        kv = h // (cfg.n_heads // cfg.n_kv_heads)  # GQA: query head h reads KV head h // n_rep
        s = rq[:, h] @ rk[:, kv].T / math.sqrt(cfg.head_dim)
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        torch.testing.assert_close(rec.scores(L)[0, h], s)
        torch.testing.assert_close(pattern[h], torch.softmax(s, -1))
        torch.testing.assert_close(rec[f"blocks.{L}.attn.hook_z"][0, :, h], pattern[h] @ v[:, kv], atol=1e-5, rtol=1e-5)
    z = rec[f"blocks.{L}.attn.hook_z"].flatten(-2)
    torch.testing.assert_close(rec[f"blocks.{L}.hook_attn_out"], z @ model.blocks[L].attn.o_proj.weight.T,
                               atol=1e-5, rtol=1e-5)


def test_pattern_rows_sum_to_one_and_future_is_exactly_zero(rec):
    for L in range(rec.cfg.n_layers):
        p = rec.pattern(L)
        torch.testing.assert_close(p.sum(-1), torch.ones(p.shape[:-1]))
        future = torch.ones(p.shape[-2:], dtype=torch.bool).triu(1)
        assert (p[..., future] == 0).all()
        assert torch.isneginf(rec.scores(L)[..., future]).all()


def test_rope_turns_q_and_k_by_position(model, rec):
    cfg = model.cfg
    q, rq = rec["blocks.0.attn.hook_q"][0], rec["blocks.0.attn.hook_rot_q"][0]
    theta = cfg.rope_theta ** (-torch.arange(0, cfg.head_dim, 2).float() / cfg.head_dim)
    for m in (0, 3, 10):  # position 0 would hide a pairing bug, so check later positions too
        for i in range(cfg.head_dim // 2):
            c, s = math.cos(m * theta[i]), math.sin(m * theta[i])
            x0, x1 = q[m, :, 2 * i], q[m, :, 2 * i + 1]
            torch.testing.assert_close(rq[m, :, 2 * i], x0 * c - x1 * s, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(rq[m, :, 2 * i + 1], x0 * s + x1 * c, atol=1e-5, rtol=1e-5)
    # V is never rotated: it is the plain projection.
    n = rec["blocks.0.ln1.hook_normalized"] * model.blocks[0].ln1.weight
    v = (n @ model.blocks[0].attn.v_proj.weight.T).view_as(rec["blocks.0.attn.hook_v"])
    torch.testing.assert_close(rec["blocks.0.attn.hook_v"], v)


def test_rope_score_depends_only_on_relative_position():
    torch.manual_seed(1)
    inv = inverse_frequencies(16, 10000.0)
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)

    def score(m, n):
        cq, sq = cos_sin(inv, torch.tensor([m]))
        ck, sk = cos_sin(inv, torch.tensor([n]))
        return (apply_rope(q, cq, sq) * apply_rope(k, ck, sk)).sum()

    torch.testing.assert_close(score(7, 3), score(27, 23), atol=1e-4, rtol=1e-4)
    assert not torch.isclose(score(7, 3), score(7, 4))


def test_hf_layout_conversion_matches_rotate_half():
    torch.manual_seed(2)
    n_heads, d_head, d_in, T = 3, 8, 12, 5
    w_hf = torch.randn(n_heads * d_head, d_in)
    x = torch.randn(T, d_in)
    inv = inverse_frequencies(d_head, 500.0)
    cos, sin = cos_sin(inv, torch.arange(T))
    # HF: rotate_half on (i, i + d/2) pairs with cos/sin repeated twice.
    q_hf = (x @ w_hf.T).view(T, n_heads, d_head)
    c2, s2 = torch.cat([cos, cos], -1)[:, None], torch.cat([sin, sin], -1)[:, None]
    rot_half = torch.cat([-q_hf[..., d_head // 2:], q_hf[..., : d_head // 2]], -1)
    rq_hf = q_hf * c2 + rot_half * s2
    w_adj = hf_to_adjacent(w_hf, n_heads)
    rq = apply_rope((x @ w_adj.T).view(1, T, n_heads, d_head), cos, sin)[0]
    # Same vectors, dimensions reordered [0, d/2, 1, d/2+1, ...] -> identical dot products.
    order = torch.stack([torch.arange(d_head // 2), torch.arange(d_head // 2) + d_head // 2], -1).flatten()
    torch.testing.assert_close(rq, rq_hf[..., order], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(adjacent_to_hf(w_adj, n_heads), w_hf)


def test_swiglu_equation(model, rec):
    mlp = model.blocks[1].mlp
    n = rec["blocks.1.ln2.hook_normalized"] * model.blocks[1].ln2.weight
    gate, up = n @ mlp.gate_proj.weight.T, n @ mlp.up_proj.weight.T
    torch.testing.assert_close(rec["blocks.1.mlp.hook_pre"], gate, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(rec["blocks.1.mlp.hook_act"], gate * torch.sigmoid(gate), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(rec["blocks.1.mlp.hook_pre_linear"], up, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(rec["blocks.1.mlp.hook_post"], F.silu(gate) * up, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(rec["blocks.1.hook_mlp_out"], rec["blocks.1.mlp.hook_post"] @ mlp.down_proj.weight.T,
                               atol=1e-5, rtol=1e-5)


def test_residual_invariants(model, rec):
    torch.testing.assert_close(rec["blocks.0.hook_resid_pre"], rec["hook_embed"])
    for L in range(model.cfg.n_layers):
        torch.testing.assert_close(rec[f"blocks.{L}.hook_resid_mid"],
                                   rec[f"blocks.{L}.hook_resid_pre"] + rec[f"blocks.{L}.hook_attn_out"])
        torch.testing.assert_close(rec[f"blocks.{L}.hook_resid_post"],
                                   rec[f"blocks.{L}.hook_resid_mid"] + rec[f"blocks.{L}.hook_mlp_out"])
        if L:
            torch.testing.assert_close(rec[f"blocks.{L}.hook_resid_pre"], rec[f"blocks.{L - 1}.hook_resid_post"])
    final = rec["ln_final.hook_normalized"] * model.ln_final.weight
    torch.testing.assert_close(rec["logits"], final @ model.unembed.weight.T, atol=1e-5, rtol=1e-5)


def test_post_norm_equations():
    m = tiny_model(norm_placement="post")
    r = record(m, TOKENS)
    for L in range(m.cfg.n_layers):
        b = m.blocks[L]
        x, a = r[f"blocks.{L}.hook_resid_pre"], r[f"blocks.{L}.hook_attn_out"]
        s = x + a
        h = s / torch.sqrt((s**2).mean(-1, keepdim=True) + m.cfg.norm_eps) * b.ln1.weight
        torch.testing.assert_close(r[f"blocks.{L}.hook_resid_mid"], h, atol=1e-5, rtol=1e-5)
        s2 = h + r[f"blocks.{L}.hook_mlp_out"]
        y = s2 / torch.sqrt((s2**2).mean(-1, keepdim=True) + m.cfg.norm_eps) * b.ln2.weight
        torch.testing.assert_close(r[f"blocks.{L}.hook_resid_post"], y, atol=1e-5, rtol=1e-5)
    assert m.ln_final is None


def test_layernorm_and_relu_variants():
    m = tiny_model(norm_type="layer", ffn_type="relu")
    r = record(m, TOKENS)
    x = r["blocks.0.hook_resid_pre"]
    c = x - x.mean(-1, keepdim=True)
    scale = torch.sqrt((c**2).mean(-1, keepdim=True) + m.cfg.norm_eps)
    torch.testing.assert_close(r["blocks.0.ln1.hook_scale"], scale)
    torch.testing.assert_close(r["blocks.0.ln1.hook_normalized"], c / scale)
    torch.testing.assert_close(r["blocks.0.mlp.hook_act"], torch.relu(r["blocks.0.mlp.hook_pre"]))


def test_derived_attention_equals_stored_and_fused_equals_explicit(model):
    derived = record(model, TOKENS)  # the fused kernel ran; scores and weights are rebuilt on access
    stored = record(model, TOKENS, attention="stored")  # hooking them forces the written-out attention
    from explorer_model.model import attention_pattern, causal_scores

    for L in range(model.cfg.n_layers):
        q, k = derived[f"blocks.{L}.attn.hook_rot_q"], derived[f"blocks.{L}.attn.hook_rot_k"]
        # By construction: the rebuild is causal_scores and attention_pattern on the recorded rotated Q and K.
        assert torch.equal(derived.scores(L), causal_scores(q, k))
        assert torch.equal(derived.pattern(L), attention_pattern(causal_scores(q, k)))
        # The fused kernel's z is pattern @ V to within float32 rounding (GQA: head h reads KV head h // n_rep).
        v = derived[f"blocks.{L}.attn.hook_v"].repeat_interleave(model.cfg.n_rep, dim=2).transpose(1, 2)
        z = torch.matmul(derived.pattern(L), v).transpose(1, 2)
        torch.testing.assert_close(derived[f"blocks.{L}.attn.hook_z"], z, atol=1e-6, rtol=1e-5)
        # The two paths agree to within float32 rounding, masked cells exactly.
        torch.testing.assert_close(derived.scores(L), stored.scores(L), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(derived.pattern(L), stored.pattern(L), atol=1e-6, rtol=1e-5)
        assert torch.equal(stored.pattern(L) == 0, torch.ones_like(stored.pattern(L), dtype=torch.bool).triu(1))
    torch.testing.assert_close(derived.logits, stored.logits, atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        assert torch.equal(model(TOKENS), derived.logits)  # a recording changes nothing of the unhooked pass


def test_recorder_selection_float16_and_cleanup(model):
    r = record(model, TOKENS, names=["blocks.*.attn.hook_pattern", "hook_embed"], layers=[1], dtype=torch.float16)
    assert r.names == ["hook_embed", "blocks.1.attn.hook_pattern", "logits"]
    assert r["hook_embed"].dtype == torch.float16 and r.pattern(1).dtype == torch.float16
    assert not r["hook_embed"].requires_grad and r["hook_embed"].device.type == "cpu"
    with pytest.raises(KeyError):
        r["blocks.0.attn.hook_pattern"]
    with pytest.raises(RuntimeError):
        with recorder(model):
            raise RuntimeError("boom")
    assert not any(hp.fns for hp in model.hook_dict.values())  # hooks gone even after an error


def test_float16_recording_halves_memory(model):
    names = ["blocks.*.mlp.hook_pre*", "blocks.*.hook_resid_*"]  # hooks a float32 recording stores too
    full = record(model, TOKENS, names=names)
    half = record(model, TOKENS, names=names, dtype=torch.float16)
    assert half.stored_bytes() == full.stored_bytes() // 2


def test_kv_cache_generation_matches_full_recompute():
    m = tiny_model()
    prompt = [5, 17, 2, 44, 9]
    new = generate(m, prompt, max_new_tokens=6)
    seq = list(prompt)
    for _ in range(6):
        seq.append(int(m(torch.tensor([seq]))[0, -1].argmax()))
    assert new == seq[len(prompt):]
    cache = KVCache(m.cfg.n_layers)
    part = torch.cat([m(torch.tensor([prompt[:3]]), cache), m(torch.tensor([prompt[3:]]), cache)], 1)
    torch.testing.assert_close(part, m(torch.tensor([prompt])), atol=1e-5, rtol=1e-5)


def test_tied_embeddings_share_one_matrix():
    m = tiny_model(tie_embeddings=True)
    assert m.unembed.weight is m.embed.weight
    assert "unembed.weight" not in m.expected_shapes()
    assert m.param_counts()["output"] == 0


def test_load_weights_reports_shape_mismatch():
    m = tiny_model()
    state = {k: v.clone() for k, v in m.state_dict().items()}
    state["blocks.0.attn.q_proj.weight"] = torch.zeros(3, 3)
    with pytest.raises(ValueError, match="shape mismatch for blocks.0.attn.q_proj.weight"):
        LlamaModel.from_weights(m.cfg, state)
