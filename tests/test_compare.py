"""Compare mode's data layer against computations written out here (loops and numpy formulas). The next-token
comparisons and the lesson key are in test_compare_next_token.py (same models and recordings)."""
import math

import numpy as np
import pytest
import torch

from explorer_model import LlamaModel, ModelConfig
from explorer_model.analysis.compare import (
    CURVE_HOOKS, CompareError, align_minimal_pair, alignment_from_pairs, attention_js, comparable, hook_difference,
    layer_curves, relative_depth, resid_change_map, stream)
from explorer_model.recording import record

EPS = 1e-5
POST_GAMMA = (1.7, 0.6, 2.2)  # ln2 gamma of each Post-Norm block: the stream's RMS after that block
A_IDS = [3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46]
B_IDS = [3, 14, 15, 7, 8, 9, 35, 89, 79, 32, 38, 46]  # two tokens of A replaced by three


def make(seed=0, **kw):
    base = dict(vocab_size=97, d_model=48, n_layers=3, n_heads=6, n_kv_heads=2, head_dim=8, d_ff=80,
                norm_eps=EPS, rope_theta=10000.0, max_seq_len=64, tie_embeddings=False)
    base.update(kw)
    torch.manual_seed(seed)
    model = LlamaModel(ModelConfig(**base)).eval().requires_grad_(False)
    for name, p in model.named_parameters():  # non-trivial gammas, so a formula that ignores them fails
        if name.endswith(("ln1.weight", "ln2.weight")) or name == "ln_final.weight":
            p.copy_(1 + 0.3 * torch.randn_like(p))
    if base.get("norm_placement") == "post":
        for block, g in zip(model.blocks, POST_GAMMA):
            block.ln2.weight.fill_(g)
    return model


def all_models() -> dict:
    return {"pre": make(), "post": make(norm_placement="post"), "relu": make(ffn_type="relu"),
            "deep": make(1, n_layers=5, d_model=32, n_heads=4, head_dim=8, d_ff=64, vocab_size=120),
            "other": make(7)}


@pytest.fixture(scope="module")
def models():
    return all_models()


def recordings(models) -> dict:
    return {"pre": record(models["pre"], A_IDS), "pre_b": record(models["pre"], B_IDS),
            "post": record(models["post"], A_IDS), "relu": record(models["relu"], A_IDS),
            "deep": record(models["deep"], A_IDS), "other": record(models["other"], A_IDS)}


@pytest.fixture(scope="module")
def recs(models):
    return recordings(models)


def t(x):
    return x[0].double().numpy()


def block_outputs(model, ids):
    """The stream after k blocks via torch's own module hooks (not the recording): [L + 1, pos, d]."""
    seen = []
    handles = [model.embed.register_forward_hook(lambda m, i, o: seen.append(o))]
    handles += [b.register_forward_hook(lambda m, i, o: seen.append(o)) for b in model.blocks]
    with torch.no_grad():
        model(torch.tensor([ids]))
    for h in handles:
        h.remove()
    return np.stack([s[0].double().numpy() for s in seen])


def numpy_pattern(rec, layer):
    """softmax(q·k / √d) with the causal mask, from the recorded rotated Q and K; KV head = head // n_rep."""
    q, k = t(rec[f"blocks.{layer}.attn.hook_rot_q"]), t(rec[f"blocks.{layer}.attn.hook_rot_k"])
    n_rep = q.shape[1] // k.shape[1]
    k = np.repeat(k, n_rep, axis=1)
    s = np.einsum("qhd,khd->hqk", q, k) / math.sqrt(q.shape[-1])
    s = np.where(np.tril(np.ones(s.shape[1:], bool)), s, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def js_loop(p, q):
    """Jensen–Shannon of two dicts outcome -> probability."""
    total = 0.0
    for o in set(p) | set(q):
        x, y = p.get(o, 0.0), q.get(o, 0.0)
        m = (x + y) / 2
        total += (0.5 * x * math.log(x / m) if x > 0 else 0) + (0.5 * y * math.log(y / m) if y > 0 else 0)
    return total


# --------------------------------------------------------------------------- comparability and alignment
def test_comparable_levels(recs):
    c = comparable(recs["pre"], recs["post"])  # the twins: same shape, same tokens
    assert (c.level, c.reason, c.tensors, c.positions) == ("tensors", "same_shape", True, True)
    c = comparable(recs["pre"], recs["pre_b"])
    assert (c.level, c.reason, c.tensors, c.positions) == ("aligned", "token_count", False, True)
    c = comparable(recs["pre"], recs["deep"])
    assert (c.level, c.reason, c.positions) == ("curves", "model_shape", False)
    assert c.differing == ("n_layers", "d_model", "n_heads", "d_ff", "vocab_size")
    assert comparable(recs["pre"], recs["relu"]).differing == ("ffn_type",)


def test_minimal_pair_alignment():
    al = align_minimal_pair(A_IDS, torch.tensor([B_IDS]))
    assert (al.prefix, al.suffix, al.n_a, al.n_b) == (3, 6, 11, 12)
    assert al.pairs == ((0, 0), (1, 1), (2, 2), (5, 6), (6, 7), (7, 8), (8, 9), (9, 10), (10, 11))
    assert (al.changed_a, al.changed_b) == ((3, 4), (3, 4, 5))
    for i, j in al.pairs:
        assert A_IDS[i] == B_IDS[j]
    # the suffix never reaches into the prefix; identical and disjoint lists
    al = align_minimal_pair([1, 2], [1, 2, 2])
    assert (al.prefix, al.suffix, al.pairs, al.changed_b) == (2, 0, ((0, 0), (1, 1)), (2,))
    al = align_minimal_pair([5, 6, 7], [5, 6, 7])
    assert (al.prefix, al.suffix, al.changed_a) == (3, 0, ())
    al = align_minimal_pair([1, 2, 3], [4, 5])
    assert (al.pairs, al.changed_a, al.changed_b) == ((), (0, 1, 2), (0, 1))
    al = align_minimal_pair([9, 1, 2], [8, 1, 2])  # a swapped token: its slot is paired and marked
    assert (al.prefix, al.suffix, al.pairs, al.substituted) == (0, 2, ((0, 0), (1, 1), (2, 2)), ((0, 0),))
    assert (al.changed_a, al.changed_b) == ((0,), (0,))
    al = align_minimal_pair([9, 1, 2], [8, 1, 2], substitutions=False)
    assert (al.pairs, al.substituted, al.changed_a) == (((1, 1), (2, 2)), (), (0,))
    al = align_minimal_pair([1, 5, 6, 2], [1, 7, 8, 2])
    assert (al.pairs, al.substituted, al.changed_b) == (((0, 0), (1, 1), (2, 2), (3, 3)), ((1, 1), (2, 2)), (1, 2))


def test_user_alignment_and_bad_pairs():
    al = alignment_from_pairs([(4, 0), [1, 2]], 5, 3)
    assert al.pairs == ((1, 2), (4, 0)) and al.changed_a == (0, 2, 3) and al.changed_b == (1,)
    al = alignment_from_pairs([(4, 0), (1, 2)], 5, 3, ids_a=[0, 7, 0, 0, 9], ids_b=[9, 0, 8])
    assert al.substituted == ((1, 2),) and al.changed_a == (0, 1, 2, 3) and al.changed_b == (1, 2)
    with pytest.raises(CompareError, match="id lists have 2 and 3"):
        alignment_from_pairs([(0, 0)], 5, 3, ids_a=[1, 2], ids_b=[1, 2, 3])
    for bad, msg in [([(5, 0)], "outside"), ([(0, 0), (0, 1)], "twice"), ([(0, 0), (1, 0)], "twice"),
                     ([], "at least one"), ([(0,)], "two positions"), (["ab"], "two positions")]:
        with pytest.raises(CompareError, match=msg):
            alignment_from_pairs(bad, 5, 3)


# --------------------------------------------------------------------------- per-layer curves
def test_relative_depth():
    assert relative_depth(6).tolist() == pytest.approx([0, 0.2, 0.4, 0.6, 0.8, 1.0])
    d30 = relative_depth(30)
    assert (d30[0], d30[29], len(d30)) == (0.0, 1.0, 30) and d30[3] == pytest.approx(3 / 29)
    assert relative_depth(1).tolist() == [0.0]


@pytest.mark.parametrize("kind", ["pre", "post"])
def test_residual_curve_pre_and_post(models, recs, kind):
    model, rec = models[kind], recs[kind]
    c = layer_curves(rec)
    x = block_outputs(model, A_IDS)  # [L + 1, pos, d]
    norm = np.sqrt((x ** 2).sum(-1)).mean(1)
    rms = np.sqrt((x ** 2).mean(-1)).mean(1)
    np.testing.assert_allclose(c.stream_norm, norm, rtol=1e-5)
    np.testing.assert_allclose(c.stream_rms, rms, rtol=1e-5)
    np.testing.assert_allclose(stream(rec), x, rtol=1e-5, atol=1e-6)
    assert c.stream_depth.tolist() == pytest.approx([0, 1 / 3, 2 / 3, 1]) and c.norm_placement == kind
    if kind == "post":  # after every block: unit RMS times that block's ln2 gamma
        np.testing.assert_allclose(c.stream_rms[1:], POST_GAMMA, rtol=1e-4)
    else:  # a running sum, not renormalized: nowhere near the gammas
        assert not np.allclose(c.stream_rms[1:], POST_GAMMA, rtol=0.1)


@pytest.mark.parametrize("kind", ["pre", "post"])
def test_rms_divisors(recs, kind):
    rec, c = recs[kind], layer_curves(recs[kind])
    for l in range(3):
        x = t(rec[f"blocks.{l}.hook_resid_pre"])
        ln1_in = x if kind == "pre" else x + t(rec[f"blocks.{l}.hook_attn_out"])
        h = t(rec[f"blocks.{l}.hook_resid_mid"])
        ln2_in = h if kind == "pre" else h + t(rec[f"blocks.{l}.hook_mlp_out"])
        assert c.ln1_scale[l] == pytest.approx(np.sqrt((ln1_in ** 2).mean(-1) + EPS).mean(), rel=1e-5)
        assert c.ln2_scale[l] == pytest.approx(np.sqrt((ln2_in ** 2).mean(-1) + EPS).mean(), rel=1e-5)


def test_attention_entropy_and_sink(recs):
    rec, c = recs["pre"], layer_curves(recs["pre"])
    for l in range(3):
        p = numpy_pattern(rec, l)
        ent, sink = [], []
        for h in range(p.shape[0]):
            for q in range(1, p.shape[1]):
                ent.append(-sum(v * math.log(v) for v in p[h, q, :q + 1]))
                sink.append(p[h, q, 0])
        assert c.attn_entropy[l] == pytest.approx(np.mean(ent), rel=1e-5)
        assert c.sink_share[l] == pytest.approx(np.mean(sink), rel=1e-5)
        assert 0 < c.attn_entropy[l] < math.log(len(A_IDS))
    one = layer_curves(record(make(), [5]))
    assert np.isnan(one.attn_entropy).all() and np.isnan(one.sink_share).all()
    cheap = layer_curves(rec, attention=False)
    assert np.isnan(cheap.attn_entropy).all() and np.isnan(cheap.sink_share).all()
    np.testing.assert_array_equal(cheap.stream_rms, c.stream_rms)
    np.testing.assert_array_equal(cheap.gate_sparsity, c.gate_sparsity)


@pytest.mark.parametrize("kind", ["pre", "relu"])
def test_gate_sparsity(recs, kind):
    rec = recs[kind]
    for thr in (0.01, 0.1):
        c = layer_curves(rec, threshold=thr)
        for l in range(3):
            pre = t(rec[f"blocks.{l}.mlp.hook_pre"])
            act = pre / (1 + np.exp(-pre)) if kind == "pre" else np.maximum(pre, 0)  # SiLU / ReLU
            assert c.gate_sparsity[l] == pytest.approx((np.abs(act) < thr).mean(), abs=1e-9)
    if kind == "relu":  # ReLU zeros at least every negative pre-activation
        neg = np.mean([(t(rec[f"blocks.{l}.mlp.hook_pre"]) < 0).mean() for l in range(3)])
        assert c.gate_sparsity.mean() >= neg > 0.3


def test_curve_hooks_are_enough(models, recs):
    small = record(models["post"], A_IDS, names=CURVE_HOOKS)
    assert len(small) < len(recs["post"]) / 2
    full, part = layer_curves(recs["post"]), layer_curves(small)
    for f in ("ln1_scale", "ln2_scale", "attn_entropy", "sink_share", "gate_sparsity", "stream_rms"):
        np.testing.assert_array_equal(getattr(part, f), getattr(full, f))


def test_bfloat16_recordings(models, recs):
    half = record(models["pre"], A_IDS, dtype=torch.bfloat16)
    full, part = layer_curves(recs["pre"]), layer_curves(half)
    for f in ("ln1_scale", "attn_entropy", "sink_share", "stream_rms"):
        np.testing.assert_allclose(getattr(part, f), getattr(full, f), rtol=0.02)
    d = hook_difference(recs["pre"], half, "blocks.1.hook_resid_post")
    assert d.dtype == np.float32
    np.testing.assert_array_equal(d, half["blocks.1.hook_resid_post"][0].float().numpy()
                                  - recs["pre"]["blocks.1.hook_resid_post"][0].numpy())


def test_curves_of_two_depths_share_the_axis(recs):
    shallow, deep = layer_curves(recs["pre"]), layer_curves(recs["deep"])
    assert len(shallow.depth) == 3 and len(deep.depth) == 5
    assert shallow.depth[[0, -1]].tolist() == deep.depth[[0, -1]].tolist() == [0.0, 1.0]
    assert len(deep.stream_rms) == 6 and deep.stream_depth[-1] == 1.0


# --------------------------------------------------------------------------- differences
def test_hook_difference_is_b_minus_a(recs):
    a, b = recs["pre"], recs["post"]
    for name in ("hook_embed", "blocks.1.hook_resid_post", "blocks.2.attn.hook_pattern", "blocks.0.mlp.hook_act",
                 "blocks.1.ln2.hook_scale", "logits"):
        np.testing.assert_array_equal(hook_difference(a, b, name), b[name][0].numpy() - a[name][0].numpy())
    d = hook_difference(a, b, "blocks.0.attn.hook_attn_scores")
    assert np.isnan(d[:, 0, 1]).all() and np.isfinite(d[:, 1, :2]).all()


def test_hook_difference_on_aligned_positions(recs):
    a, b = recs["pre"], recs["pre_b"]
    al = align_minimal_pair(A_IDS, B_IDS)
    d = hook_difference(a, b, "blocks.2.hook_resid_mid", al)
    ra, rb = t(a["blocks.2.hook_resid_mid"]), t(b["blocks.2.hook_resid_mid"])
    assert d.shape == (9, 48)
    for r, (i, j) in enumerate(al.pairs):
        np.testing.assert_allclose(d[r], rb[j] - ra[i])
    np.testing.assert_allclose(d[:3], 0, atol=1e-6)  # same model, same prefix: causal, so nothing changed yet
    assert np.abs(d[3:]).max() > 1e-3  # after the changed tokens everything downstream moves
    pairs = [(0, 0), (2, 3), (10, 11)]
    p = hook_difference(a, b, "blocks.1.attn.hook_pattern", pairs)
    pa, pb = t(a.pattern(1)), t(b.pattern(1))
    assert p.shape == (6, 3, 3)
    for r, (qi, qj) in enumerate(pairs):  # the aligned sub-matrix: query pairs by key pairs
        for c, (ki, kj) in enumerate(pairs):
            np.testing.assert_allclose(p[:, r, c], pb[:, qj, kj] - pa[:, qi, ki])
    with pytest.raises(CompareError, match="11 tokens and B has 12"):
        hook_difference(a, b, "hook_embed")
    with pytest.raises(CompareError, match="shape"):
        hook_difference(a, recs["deep"], "hook_embed")


def test_resid_change_map(recs):
    a, b = recs["pre"], recs["pre_b"]
    al = align_minimal_pair(A_IDS, B_IDS)
    m = resid_change_map(a, b, al)
    sa, sb = stream(a), stream(b)
    assert m["ratio"].shape == (4, 9) and m["depth"].tolist() == pytest.approx([0, 1 / 3, 2 / 3, 1])
    for k in range(4):
        for r, (i, j) in enumerate(al.pairs):
            diff = math.sqrt(sum((y - x) ** 2 for x, y in zip(sa[k, i], sb[k, j])))
            want = diff / math.sqrt(sum(x * x for x in sa[k, i]))
            assert m["ratio"][k, r] == pytest.approx(want, rel=1e-6, abs=1e-12)
    assert (m["ratio"][0] < 1e-12).all()  # embeddings of the same tokens: no change before block 1
    assert (m["ratio"][1:, 3:] > 1e-4).all()
    assert resid_change_map(a, recs["post"])["ratio"].shape == (4, 11)
    with pytest.raises(CompareError, match="d_model 48 vs 32"):
        resid_change_map(a, recs["deep"])


def test_resid_change_map_shows_a_swapped_token(models, recs):
    ids = list(A_IDS)
    ids[4] = 50  # one token swapped: its slot is paired, the change starts there in the embeddings
    swapped = record(models["pre"], ids)
    m = resid_change_map(recs["pre"], swapped, align_minimal_pair(A_IDS, ids))
    assert m["pos_a"].tolist() == list(range(11))
    assert (m["ratio"][:, :4] < 1e-6).all() and (m["ratio"][:, 4] > 0.1).all()
    assert (m["ratio"][0, 5:] < 1e-12).all() and (m["ratio"][1:, 5:] > 1e-4).all()


def test_attention_js_same_length(recs):
    a, b = recs["pre"], recs["post"]
    js = attention_js(a, b)["js"]
    assert js.shape == (3, 6, 11)
    for l in (0, 2):
        pa, pb = t(a.pattern(l)), t(b.pattern(l))  # the recorded rows; the formula is what is checked here
        for h in range(6):
            for q in range(11):
                want = js_loop(dict(enumerate(pa[h, q, :q + 1])), dict(enumerate(pb[h, q, :q + 1])))
                assert js[l, h, q] == pytest.approx(want, rel=1e-6, abs=1e-12)
    assert np.all(js[:, :, 0] < 1e-12) and js.max() <= math.log(2) and js.max() > 0.01
    one = attention_js(a, b, layers=[2])
    assert one["layers"].tolist() == [2] and np.array_equal(one["js"], js[2:3])
    with pytest.raises(CompareError, match="layers must lie in 0…2"):
        attention_js(a, b, layers=[3])
    np.testing.assert_allclose(attention_js(a, a)["js"], 0, atol=1e-12)


def test_attention_js_aligned(recs):
    a, b = recs["pre"], recs["pre_b"]
    al = alignment_from_pairs([(0, 0), (2, 2), (4, 3), (9, 10), (10, 11)], 11, 12)
    out = attention_js(a, b, al)
    assert out["pos_a"].tolist() == [0, 2, 4, 9, 10] and out["pos_b"].tolist() == [0, 2, 3, 10, 11]
    partner_b = dict(al.pairs)
    for l in range(3):
        pa, pb = t(a.pattern(l)), t(b.pattern(l))
        for h in range(6):
            for r, (i, j) in enumerate(al.pairs):
                # outcomes: an aligned key pair is one outcome; any other key is its side's own outcome
                p = {("pair", k) if k in partner_b else ("a", k): pa[h, i, k] for k in range(i + 1)}
                q = {}
                for k in range(j + 1):
                    mate = [ka for ka, kb in al.pairs if kb == k]
                    q[("pair", mate[0]) if mate else ("b", k)] = pb[h, j, k]
                assert out["js"][l, h, r] == pytest.approx(js_loop(p, q), rel=1e-6, abs=1e-12)


# --------------------------------------------------------------------------- the shipped twins
@pytest.mark.slow
def test_twins_pre_grows_post_held_at_gamma():
    from explorer_model.lab.corpus import HELDOUT_LINE
    from explorer_model.loaders import load

    curves = {}
    for name in ("tiny-pre", "tiny-post"):
        lm = load(name)
        ids = lm.tokenizer.encode(HELDOUT_LINE, add_bos=True)
        rec = record(lm.model, ids)
        c = curves[name] = layer_curves(rec)
        x = block_outputs(lm.model, ids)  # independent of the recording
        np.testing.assert_allclose(c.stream_rms, np.sqrt((x ** 2).mean(-1)).mean(1), rtol=1e-5)
        gammas = [float(b.ln2.weight.double().pow(2).mean().sqrt()) for b in lm.model.blocks]
        if name == "tiny-post":  # normalized output times gamma after every block
            np.testing.assert_allclose(c.stream_rms[1:], gammas, rtol=0.03)
    pre, post = curves["tiny-pre"].stream_rms, curves["tiny-post"].stream_rms
    assert np.all(np.diff(pre) > 0) and pre[-1] > 2 * pre[1]  # grows with every block
    assert post[1:].max() / post[1:].min() < 1.3 and np.all(np.abs(post[1:] - 1) < 0.25)  # held near 1
