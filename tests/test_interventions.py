"""What-if interventions: each one changes exactly what it names, and nothing before it."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from explorer_model import LlamaModel, ModelConfig
from explorer_model import interventions as I
from explorer_model.analysis import measures as M
from explorer_model.interventions import intervene, parse
from explorer_model.recording import record

TOKENS = [3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46]
SOURCE = [5, 7, 11, 13, 17, 19, 23, 29, 31]


def tiny(**kw) -> LlamaModel:
    cfg = dict(vocab_size=97, d_model=48, n_layers=3, n_heads=6, n_kv_heads=2, head_dim=8, d_ff=80,
               norm_eps=1e-5, rope_theta=10000.0, max_seq_len=64, tie_embeddings=False)
    torch.manual_seed(0)
    model = LlamaModel(ModelConfig(**{**cfg, **kw})).eval().requires_grad_(False)
    for name, p in model.named_parameters():  # weights large enough that every part changes the output
        if name.endswith("norm.weight") or ".ln" in name or name == "ln_final.weight":
            p.copy_(1 + 0.3 * torch.randn_like(p))
        elif p.dim() == 2 and "embed" not in name:
            p.mul_(3.0)
    return model


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model():
    return tiny()


@pytest.fixture(scope="module")
def clean(model):
    return record(model, TOKENS)


def changed(model, *specs, **kw):
    return record(model, TOKENS, interventions=list(specs), **kw)


def same(a, b, names):
    for n in names:
        assert torch.equal(a[n], b[n]), n


def layer_names(rec, layer):
    return [n for n in rec.names if n.startswith(f"blocks.{layer}.")]


def no_hooks_left(model):
    return all(not hp.fns for hp in model.hook_dict.values())


# ----------------------------------------------------------------------------- string forms
CANONICAL = ["ablate:blocks.2.attn.head5", "ablate-mean:blocks.2.attn.head5", "ablate:blocks.1.attn",
             "ablate:blocks.0.attn.head1+4", "skip:blocks.1.mlp", "skip:blocks.0.attn", "no-mask", "no-mask:blocks.1",
             "no-rope", "no-rope:blocks.2", "norm-identity:blocks.1.ln1", "norm-identity:ln_final",
             "norm-eps:blocks.1.ln2=0.01", "scale:blocks.1.hook_attn_out=0.5", "scale:blocks.0.hook_mlp_out=-2",
             "gate-off", "gate-off:blocks.1", "relu:blocks.0", "patch:blocks.2.hook_resid_pre@4",
             "patch:blocks.1.hook_mlp_out@-1"]


@pytest.mark.parametrize("spec", CANONICAL)
def test_string_forms_round_trip(spec, model):
    iv = parse(spec)
    assert str(iv) == spec
    assert parse(str(iv)) == iv and hash(parse(spec)) == hash(iv)
    iv.check(model)  # every canonical example fits the tiny model


def test_equivalent_spellings_and_lists():
    assert str(parse(" norm-eps:blocks.3.ln2=1e-2 ")) == "norm-eps:blocks.3.ln2=0.01"
    assert str(parse("ablate:blocks.3.attn.head7+2+7")) == "ablate:blocks.3.attn.head2+7"
    assert str(parse("scale:blocks.3.hook_attn_out=2.0")) == "scale:blocks.3.hook_attn_out=2"
    ivs = I.parse_list("no-mask, ,ablate:blocks.3.attn.head5,")
    assert ivs == [I.NoMask(), I.AblateHeads(3, (5,))]
    assert I.format_list(ivs) == "no-mask,ablate:blocks.3.attn.head5"
    assert I.parse_list("") == []


@pytest.mark.parametrize("bad", ["", "nope", "ablate", "ablate:blocks.x.attn", "ablate:blocks.3.mlp.head1",
                                 "skip:blocks.3.ln1", "no-mask:3", "norm-eps:blocks.1.ln2", "norm-eps:blocks.1.ln2=abc",
                                 "norm-eps:blocks.1.ln2=-1", "scale:blocks.1.hook_attn_out=inf",
                                 "patch:blocks.1.hook_resid_pre", "patch:blocks.1.hook_resid_pre@x"])
def test_parse_errors_are_clear(bad):
    with pytest.raises(ValueError, match="intervention|number|finite|epsilon|forms"):
        parse(bad)


@pytest.mark.parametrize("spec, needle", [("ablate:blocks.3.attn", "layer 3"), ("ablate:blocks.1.attn.head6", "head 6"),
                                          ("scale:blocks.1.hook_nothing=2", "no hook point"),
                                          ("patch:blocks.1.attn.hook_pattern@0", "not attention"),
                                          ("no-rope:blocks.9", "layer 9")])
def test_checks_against_the_model(model, spec, needle):
    with pytest.raises(ValueError, match=needle):
        with intervene(model, [spec]):
            pass
    assert no_hooks_left(model)


def test_a_refusal_names_its_case_and_values():
    with pytest.raises(I.SpecError) as e:
        parse("foo")
    assert (e.value.key, e.value.values["spec"], str(e.value)) == (
        "interventions.unknown", "foo", f"unknown intervention 'foo'; the forms are: {I.FORMS}")


def test_gate_interventions_need_a_gated_ffn():
    relu_model = tiny(ffn_type="relu")
    for spec in ("gate-off", "relu:blocks.0"):
        with pytest.raises(ValueError, match="no gate"):
            parse(spec).check(relu_model)


# ----------------------------------------------------------------------------- plain path unchanged
def test_empty_list_is_bit_identical(model, clean):
    rec = changed(model)
    assert rec.names == clean.names
    same(rec, clean, clean.names)
    with intervene(model, []):
        logits = model(torch.tensor([TOKENS]))
    assert torch.equal(logits, clean.logits)


def test_hooks_removed_even_on_error_and_model_untouched(model):
    eps = model.blocks[1].ln2.eps
    with pytest.raises(RuntimeError):
        with intervene(model, ["no-mask", "relu", "norm-eps:blocks.1.ln2=0.5", "ablate:blocks.0.attn.head1"]):
            assert model.blocks[1].ln2.eps == eps  # only hooks: another thread's runs stay unchanged
            raise RuntimeError("boom")
    assert no_hooks_left(model) and model.blocks[1].ln2.eps == eps


def test_other_threads_do_not_see_the_change(model, clean):
    import threading
    out = {}
    with intervene(model, ["no-mask", "norm-eps:blocks.1.ln2=0.5", "skip:blocks.0.mlp"]):
        t = threading.Thread(target=lambda: out.setdefault("logits", record(model, TOKENS).logits))
        t.start()
        t.join()
    assert torch.equal(out["logits"], clean.logits)


# ----------------------------------------------------------------------------- each intervention
def test_ablate_one_head(model, clean):
    rec = changed(model, "ablate:blocks.1.attn.head4")
    z, z0 = rec["blocks.1.attn.hook_z"], clean["blocks.1.attn.hook_z"]
    assert torch.count_nonzero(z[:, :, 4]) == 0
    others = [h for h in range(6) if h != 4]
    assert torch.equal(z[:, :, others], z0[:, :, others])
    same(rec, clean, layer_names(clean, 0) + ["hook_embed", "blocks.1.attn.hook_q", "blocks.1.attn.hook_pattern"])
    assert not torch.allclose(rec["blocks.1.hook_attn_out"], clean["blocks.1.hook_attn_out"])
    assert not torch.allclose(rec.logits, clean.logits)


def test_ablate_mean_and_sets_and_layers(model, clean):
    rec = changed(model, "ablate-mean:blocks.2.attn.head0+3")
    z, z0 = rec["blocks.2.attn.hook_z"], clean["blocks.2.attn.hook_z"]
    for h in (0, 3):
        expected = z0[:, :, h].mean(1, keepdim=True).expand_as(z0[:, :, h])
        assert torch.allclose(z[:, :, h], expected, atol=1e-6)
        assert not torch.allclose(z0[:, :, h], expected)
    assert torch.equal(z[:, :, [1, 2, 4, 5]], z0[:, :, [1, 2, 4, 5]])
    whole = changed(model, "ablate:blocks.2.attn")
    assert torch.count_nonzero(whole["blocks.2.attn.hook_z"]) == 0
    assert torch.count_nonzero(whole["blocks.2.hook_attn_out"]) == 0
    same(whole, clean, layer_names(clean, 0) + layer_names(clean, 1))


@pytest.mark.parametrize("part", ["attn", "mlp"])
def test_skip(model, clean, part):
    rec = changed(model, f"skip:blocks.1.{part}")
    assert torch.count_nonzero(rec[f"blocks.1.hook_{part}_out"]) == 0
    if part == "attn":
        assert torch.equal(rec["blocks.1.hook_resid_mid"], rec["blocks.1.hook_resid_pre"])
    else:
        assert torch.equal(rec["blocks.1.hook_resid_post"], rec["blocks.1.hook_resid_mid"])
        same(rec, clean, ["blocks.1.hook_attn_out", "blocks.1.hook_resid_mid"])
    same(rec, clean, layer_names(clean, 0))


def test_no_mask_everywhere(model, clean):
    rec = changed(model, "no-mask")  # derived attention would rebuild the mask: record() stores it instead
    upper = torch.ones(len(TOKENS), len(TOKENS), dtype=torch.bool).triu(1)
    for layer in range(3):
        p = rec.pattern(layer)[0]
        assert (p[:, upper] > 0).all()
        assert torch.allclose(p.sum(-1), torch.ones(6, len(TOKENS)))
        q = rec[f"blocks.{layer}.attn.hook_rot_q"][0].transpose(0, 1)  # written out: softmax(q k^T / sqrt d)
        k = rec[f"blocks.{layer}.attn.hook_rot_k"][0].repeat_interleave(3, dim=1).transpose(0, 1)
        assert torch.allclose(p, torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(8), -1), atol=1e-6)
    assert (clean.pattern(0)[0][:, upper] == 0).all()
    assert not torch.allclose(rec["blocks.0.hook_attn_out"][0, 0], clean["blocks.0.hook_attn_out"][0, 0])
    same(rec, clean, ["hook_embed", "blocks.0.attn.hook_rot_q", "blocks.0.attn.hook_v"])


def test_no_mask_one_layer(model, clean):
    rec = changed(model, "no-mask:blocks.1")
    upper = torch.ones(len(TOKENS), len(TOKENS), dtype=torch.bool).triu(1)
    assert torch.equal(rec.pattern(0), clean.pattern(0))
    assert (rec.pattern(1)[0][:, upper] > 0).all()
    assert (rec.pattern(2)[0][:, upper] == 0).all()


def test_no_rope(model, clean):
    rec = changed(model, "no-rope")
    for layer in range(3):
        a = f"blocks.{layer}.attn.hook_"
        assert torch.equal(rec[a + "rot_q"], rec[a + "q"]) and torch.equal(rec[a + "rot_k"], rec[a + "k"])
        assert not torch.equal(clean[a + "rot_q"], clean[a + "q"])
    one = changed(model, "no-rope:blocks.1")
    same(one, clean, layer_names(clean, 0))
    assert torch.equal(one["blocks.1.attn.hook_rot_k"], one["blocks.1.attn.hook_k"])
    assert not torch.equal(one["blocks.2.attn.hook_rot_k"], one["blocks.2.attn.hook_k"])


def test_no_rope_sees_through_a_patch_on_q(model):
    # readers run after replacements, whatever the list order: rot_q is the patched q
    rec = record(model, TOKENS, interventions=["no-rope:blocks.1", "patch:blocks.1.attn.hook_q@2"], source_tokens=SOURCE)
    assert torch.equal(rec["blocks.1.attn.hook_rot_q"], rec["blocks.1.attn.hook_q"])


def test_gate_off_and_relu(model, clean):
    rec = changed(model, "gate-off:blocks.1")
    m = "blocks.1.mlp.hook_"
    assert torch.equal(rec[m + "post"], rec[m + "pre_linear"])
    assert torch.equal(rec[m + "act"], torch.ones_like(rec[m + "act"]))
    same(rec, clean, [m + "pre", m + "pre_linear"] + layer_names(clean, 0))
    relu = changed(model, "relu")
    for layer in range(3):
        m = f"blocks.{layer}.mlp.hook_"
        assert torch.equal(relu[m + "act"], F.relu(relu[m + "pre"]))
        assert (relu[m + "act"] == 0).any() and not (clean[m + "act"] == 0).any()


def test_norm_identity_keeps_gamma(model, clean):
    rec = changed(model, "norm-identity:blocks.1.ln1")
    x = rec["blocks.1.hook_resid_pre"]
    assert torch.equal(rec["blocks.1.ln1.hook_scale"], torch.ones_like(rec["blocks.1.ln1.hook_scale"]))
    assert torch.equal(rec["blocks.1.ln1.hook_normalized"], x)
    attn = model.blocks[1].attn  # the attention now reads x * gamma
    q = attn.q_proj(x * model.blocks[1].ln1.weight).view(*x.shape[:2], 6, 8)
    assert torch.allclose(rec["blocks.1.attn.hook_q"], q, atol=1e-5)
    same(rec, clean, layer_names(clean, 0) + ["blocks.1.hook_resid_pre"])
    fin = changed(model, "norm-identity:ln_final")
    assert torch.allclose(fin.logits, model.unembed(clean["blocks.2.hook_resid_post"] * model.ln_final.weight), atol=1e-5)


def test_norm_eps(model, clean):
    rec = changed(model, "norm-eps:blocks.2.ln2=0.5")
    h = rec["blocks.2.hook_resid_mid"]
    assert torch.allclose(rec["blocks.2.ln2.hook_scale"], (h.pow(2).mean(-1, keepdim=True) + 0.5).sqrt(), rtol=1e-6)
    zero = changed(model, "norm-eps:blocks.1.ln1=0")
    h = zero["blocks.1.hook_resid_pre"]
    assert torch.allclose(zero["blocks.1.ln1.hook_scale"], h.pow(2).mean(-1, keepdim=True).sqrt(), rtol=1e-6)
    assert not torch.allclose(rec["blocks.2.ln2.hook_scale"], clean["blocks.2.ln2.hook_scale"])
    same(rec, clean, ["blocks.2.hook_resid_mid", "blocks.2.ln1.hook_scale"])
    assert model.blocks[2].ln2.eps == 1e-5


def test_scale_branch(model, clean):
    rec = changed(model, "scale:blocks.1.hook_mlp_out=0.25")
    assert torch.equal(rec["blocks.1.hook_mlp_out"], clean["blocks.1.hook_mlp_out"] * 0.25)
    same(rec, clean, ["blocks.1.hook_resid_mid", "blocks.1.mlp.hook_post"])


@pytest.mark.parametrize("spec, weights", [
    ("scale:blocks.1.attn.hook_attn_scores=0.5", lambda s: torch.softmax(s * 0.5, -1)),
    ("scale:blocks.1.attn.hook_attn_scores=0", lambda s: torch.softmax(torch.where(torch.isinf(s), s, 0.0), -1)),
    ("scale:blocks.1.attn.hook_pattern=2", lambda s: 2 * torch.softmax(s, -1)),
])
def test_scaled_attention_is_what_the_recording_shows(model, clean, spec, weights):
    """A scaled score or weight is recorded as it flowed (not rebuilt from Q and K, which would undo it): the
    recorded weights are the equation's on the unchanged scores, and each head's z is its weights times V. Factor
    0 makes attention uniform over the keys the mask lets through (0 × -inf would be NaN everywhere)."""
    rec = changed(model, spec)
    assert torch.isfinite(rec.logits).all()
    scores = clean["blocks.1.attn.hook_attn_scores"][0]  # layer 1's input is unchanged
    p = rec.pattern(1)[0]
    assert torch.allclose(p, weights(scores), atol=1e-6)
    v = rec["blocks.1.attn.hook_v"][0].repeat_interleave(3, dim=1).transpose(0, 1)  # [head, pos, d]
    assert torch.allclose(rec["blocks.1.attn.hook_z"][0].transpose(0, 1), p @ v, atol=1e-5)
    assert not torch.allclose(rec["blocks.1.hook_attn_out"], clean["blocks.1.hook_attn_out"])
    for name in layer_names(clean, 0):  # (the explicit attention path the recording takes: equal within rounding)
        assert torch.allclose(rec[name], clean[name], atol=1e-5), name


@pytest.mark.parametrize("hook, pos", [("blocks.1.hook_resid_pre", 4), ("blocks.2.hook_attn_out", -1),
                                       ("blocks.0.mlp.hook_post", 0)])
def test_patch(model, clean, hook, pos):
    src = record(model, SOURCE)
    rec = record(model, TOKENS, interventions=[f"patch:{hook}@{pos}"], source_tokens=SOURCE)
    p_dst, p_src = pos % len(TOKENS), pos % len(SOURCE)
    assert torch.equal(rec[hook][:, p_dst], src[hook][:, p_src])
    assert not torch.equal(clean[hook][:, p_dst], src[hook][:, p_src])
    assert torch.equal(rec[hook][:, :p_dst], clean[hook][:, :p_dst])
    assert torch.equal(rec[hook][:, p_dst + 1:], clean[hook][:, p_dst + 1:])  # the hook itself: only p changes
    # causal: every later tensor is unchanged before p
    for name in ("blocks.2.hook_resid_post", "logits"):
        assert torch.equal(rec[name][:, :p_dst], clean[name][:, :p_dst])
    if p_dst < len(TOKENS) - 1:
        assert not torch.allclose(rec.logits[:, p_dst + 1:], clean.logits[:, p_dst + 1:])


@pytest.mark.parametrize("hook, pos", [("hook_resid_post", -1), ("hook_resid_pre", 4), ("attn.hook_v", 0)])
def test_the_patch_sweep_is_one_patched_run_per_layer(model, hook, pos):
    """The what-if lesson's sweep (one batched run: a row patched at each layer, the positions before the patch
    run once for all rows) against the what-if's own patch, one ordinary run per layer."""
    from explorer_model.analysis.patch_lesson import patch_layer_sweep

    sweep = patch_layer_sweep(model, TOKENS, SOURCE, hook, pos)
    clean = F.log_softmax(model(torch.tensor([TOKENS]))[0, -1].double(), -1)
    assert sweep["top_clean"] == int(clean.argmax())
    for layer in range(model.cfg.n_layers):
        with intervene(model, [f"patch:blocks.{layer}.{hook}@{pos}"], SOURCE):
            lp = F.log_softmax(model(torch.tensor([TOKENS]))[0, -1].double(), -1)
        kl = float(M.kl_divergence(clean, lp))
        assert kl > 1e-5  # the patch changes the prediction: the comparison below means something
        assert sweep["kl"][layer] == pytest.approx(kl, rel=1e-4)
        assert sweep["top"][layer] == int(lp.argmax())
        assert sweep["p_top_clean"][layer] == pytest.approx(float(lp[sweep["top_clean"]].exp()), rel=1e-4)
    assert no_hooks_left(model)


def test_patch_needs_a_source_and_valid_positions(model):
    with pytest.raises(I.SpecError, match=r"patching needs a source prompt \(source_tokens\)"):  # docs/python.md
        record(model, TOKENS, interventions=["patch:blocks.1.hook_resid_pre@2"])
    with pytest.raises(I.SpecError, match="position 9"):
        record(model, TOKENS, interventions=["patch:blocks.1.hook_resid_pre@9"], source_tokens=SOURCE)
    assert no_hooks_left(model)


# ----------------------------------------------------------------------------- the shuffle property
def test_without_rope_and_mask_order_is_invisible(model):
    perm = M.shuffle_keep_last(len(TOKENS), seed=1)
    assert perm[-1] == len(TOKENS) - 1 and perm != list(range(len(TOKENS)))
    shuffled = [TOKENS[i] for i in perm]

    def last(ids, specs, name="logits"):
        return record(model, ids, interventions=specs)[name][0, -1]
    # the unchanged model tells the orders apart
    assert (last(TOKENS, []) - last(shuffled, [])).abs().max() > 1e-2
    # without RoPE, layer 0's last position already sees only a set of tokens ...
    assert torch.allclose(last(TOKENS, ["no-rope"], "blocks.0.hook_resid_post"),
                          last(shuffled, ["no-rope"], "blocks.0.hook_resid_post"), atol=1e-5)
    # ... but later layers still read order from the causal mask (each position sees a different prefix)
    assert (last(TOKENS, ["no-rope"]) - last(shuffled, ["no-rope"])).abs().max() > 1e-2
    # without RoPE and without the mask the prediction at the kept last position is the same
    assert torch.allclose(last(TOKENS, ["no-rope", "no-mask"]), last(shuffled, ["no-rope", "no-mask"]), atol=1e-5)
    a = record(model, TOKENS, interventions=["no-rope", "no-mask"]).logits[0]
    b = record(model, shuffled, interventions=["no-rope", "no-mask"]).logits[0]
    assert torch.allclose(a[perm], b, atol=1e-5)  # every position just moves with its token


# ----------------------------------------------------------------------------- measures and the sweep
def test_prompt_loss_and_next_token_logprobs(clean):
    logits = clean.logits[0]
    manual = -np.mean([float(torch.log_softmax(logits[t], -1)[TOKENS[t + 1]]) for t in range(len(TOKENS) - 1)])
    assert M.prompt_loss(clean.logits, TOKENS) == pytest.approx(manual, rel=1e-5)
    assert float(-M.next_token_logprobs(clean.logits, TOKENS).mean()) == pytest.approx(manual, rel=1e-5)
    assert math.isnan(M.prompt_loss(clean.logits[:, :1], TOKENS[:1]))


def test_lens_kl(model, clean):
    assert torch.allclose(M.lens_kl(model, clean, clean), torch.zeros(3), atol=1e-6)
    rec = changed(model, "skip:blocks.1.mlp")
    kl = M.lens_kl(model, clean, rec, chunk=5)
    assert kl[0] == pytest.approx(0, abs=1e-6) and kl[1] > 1e-3
    lp, lq = torch.log_softmax(clean.logits[0], -1), torch.log_softmax(rec.logits[0], -1)
    assert float(kl[2]) == pytest.approx(float((lp.exp() * (lp - lq)).sum(-1).mean()), rel=1e-4)
    start = M.lens_kl(model, clean, rec, start=7)
    assert float(start[2]) == pytest.approx(float((lp.exp() * (lp - lq)).sum(-1)[7:].mean()), rel=1e-4)


def test_lens_kl_unembeds_only_the_rows_a_change_reached(model, clean, monkeypatch):
    """Skipping block 1's MLP leaves layer 0's rows equal in both runs: their KL is 0 without going through the
    output matrix; every other layer's KL is the one of all rows unembedded."""
    rec = changed(model, "skip:blocks.1.mlp")
    n_pos = clean["blocks.0.hook_resid_post"].shape[1]
    unembedded, lens = [], M.lens_logprobs
    monkeypatch.setattr(M, "lens_logprobs", lambda m, x: unembedded.append(x.shape[0]) or lens(m, x))
    kl = M.lens_kl(model, clean, rec)
    assert sum(unembedded) == 2 * 2 * n_pos  # layers 1 and 2, both runs
    assert float(kl[0]) == 0.0
    for layer in (1, 2):
        lp = lens(model, clean[f"blocks.{layer}.hook_resid_post"][0])
        lq = lens(model, rec[f"blocks.{layer}.hook_resid_post"][0])
        assert float(kl[layer]) == pytest.approx(float(M.kl_divergence(lp, lq).mean()), rel=1e-5)
    unembedded.clear()
    assert torch.equal(M.lens_kl(model, clean, clean), torch.zeros(3)) and unembedded == []


def test_lens_top_of_the_last_layer_is_the_models_own_prediction(model, clean):
    arg, prob = M.lens_top(model, clean.stack("hook_resid_post")[:, 0])  # [layer, pos] each
    probs = torch.softmax(clean.logits[0], -1)  # the model's forward: the last layer's lens must match it
    assert torch.equal(arg[-1], probs.argmax(-1))
    torch.testing.assert_close(prob[-1], probs.max(-1).values, rtol=1e-5, atol=1e-7)
    x = model.ln_final(clean["blocks.0.hook_resid_post"][0])  # layer 0, written out
    by_hand = torch.softmax(x @ model.unembed.weight.T, -1)
    assert torch.equal(arg[0], by_hand.argmax(-1))
    torch.testing.assert_close(prob[0], by_hand.max(-1).values, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("mean", [False, True])
def test_head_sweep_equals_one_ablation_at_a_time(model, clean, mean):
    res = M.head_sweep(model, clean, mean=mean)
    target = int(clean.logits[0, -1].argmax())
    assert res["target"] == target and res["layers"] == [0, 1, 2]
    p0 = float(torch.softmax(clean.logits[0, -1], -1)[target])
    kind = "ablate-mean" if mean else "ablate"
    for layer in range(3):
        for head in range(6):
            with intervene(model, [f"{kind}:blocks.{layer}.attn.head{head}"]):
                p = torch.softmax(model(torch.tensor([TOKENS]))[0, -1], -1)[target]
            assert float(res["delta"][layer, head]) == pytest.approx(float(p) - p0, abs=2e-5)
    assert res["delta"].abs().max() > 1e-3
    calls = []
    short = M.head_sweep(model, clean, layers=[1], mean=mean, progress=lambda d, t: calls.append((d, t)))
    assert short["delta"].shape == (1, 6) and torch.allclose(short["delta"][0], res["delta"][1], atol=1e-6)
    assert calls == [(1, 2), (2, 2)]  # blocks 1 and 2 only: layer 0 is reused from the recording
    grouped = M.head_sweep(model, clean, mean=mean, max_rows=len(TOKENS) * 6)  # one layer per pass
    assert torch.allclose(grouped["delta"], res["delta"], atol=1e-6)


# ----------------------------------------------------------------------------- real model, end to end
@pytest.mark.slow
def test_real_model_end_to_end(tmp_path, capsys):
    from explorer_model import cli
    from explorer_model.loaders import load

    loaded = load("smollm2")
    ids = loaded.tokenizer.encode("The cat sat on the mat. The cat sat on the mat.")
    clean = record(loaded.model, ids, names=["blocks.3.attn.hook_z"])
    blind = record(loaded.model, ids, names=["blocks.3.attn.hook_z"], interventions=["no-mask"])
    # seeing the future, the model copies the next token: its loss on the prompt collapses
    assert M.prompt_loss(blind.logits, ids) < 0.5 * M.prompt_loss(clean.logits, ids)

    out = tmp_path / "ablated.npz"
    assert cli.main(["record", "smollm2", "--token-ids", ",".join(map(str, ids)), "--out", str(out),
                     "--names", "blocks.3.attn.hook_z", "--ablate", "blocks.3.attn.head5"]) == 0
    assert "ablate:blocks.3.attn.head5" in capsys.readouterr().out
    z = np.load(out)["blocks.3.attn.hook_z"]
    assert (z[:, :, 5] == 0).all()
    np.testing.assert_array_equal(np.delete(z, 5, axis=2), np.delete(clean["blocks.3.attn.hook_z"].numpy(), 5, axis=2))
    assert cli.main(["record", "smollm2", "--prompt", "hi", "--out", str(out), "--intervene", "patch:blocks.1.hook_z@0"]) == 2
    assert "no hook point" in capsys.readouterr().err
