"""The Pre/Post-Norm lab's experiments: deterministic, DeepNorm really is Norm(αx + F(x)), the known
gradient ordering at small scale holds for several groups of seeds, and the race returns its curves."""
import math

import pytest
import torch

from explorer_model.lab import normlab as lab
from explorer_model.recording import record

SMALL = lab.LabOptions(seeds=2)


def _strip(r: dict) -> dict:
    return {k: v for k, v in r.items() if k != "seconds"}


@pytest.mark.trains
def test_init_gradients_deterministic_and_shaped():
    a = lab.init_gradients(SMALL, depth=4, depths=(2, 4), sweep_seeds=1)
    b = lab.init_gradients(SMALL, depth=4, depths=(2, 4), sweep_seeds=1)
    assert _strip(a) == _strip(b)
    assert torch.get_num_threads() >= 1
    for v in lab.VARIANTS:
        assert len(a["profile"][v]["grad_down"]) == 4 and len(a["profile"][v]["grad_down_seeds"]) == 2
        assert len(a["sweep"][v]["last_grad"]) == 2
        assert all(math.isfinite(x) and x > 0 for x in a["sweep"][v]["output_change"])
    # the sweep at depth 4 reuses the profile's seed 0
    assert a["sweep"]["pre"]["last_grad"][1] == a["profile"]["pre"]["grad_down_seeds"][0][-1]


@pytest.mark.trains
def test_the_workers_kept_probes_serve_a_new_depth_without_running_the_sweep_again(monkeypatch):
    """The lab's worker keeps each probe: the experiment at another depth runs only the probes it has not run (its
    own profile's), and its result is the one computed from scratch."""
    from dataclasses import asdict

    from explorer_model.lab import worker

    worker.kept_probe.cache_clear()
    ran, probe = [], lab.probe
    monkeypatch.setattr(lab, "probe", lambda v, d, opts, s: ran.append((v, d, s)) or probe(v, d, opts, s))
    with lab.threads(1):
        lab.init_gradients(SMALL, depth=2, depths=(2, 4), sweep_seeds=1, probe_fn=worker.kept_probe)
        assert sorted(ran) == sorted((v, d, s) for v in lab.VARIANTS for d, s in ((2, 0), (2, 1), (4, 0)))
        ran.clear()
        again = lab.init_gradients(SMALL, depth=4, depths=(2, 4), sweep_seeds=1, probe_fn=worker.kept_probe)
        assert sorted(ran) == sorted((v, 4, 1) for v in lab.VARIANTS)  # depth 4's second seed: new; the rest kept
        fresh = lab.init_gradients(SMALL, depth=4, depths=(2, 4), sweep_seeds=1)
    assert _strip(again) == _strip(fresh)
    worker.kept_probe.cache_clear()
    seen = {}
    monkeypatch.setattr(lab, "init_gradients", lambda opts, **kw: seen.update(kw) or {})
    worker.run_init_gradients(0, asdict(SMALL), 3)
    assert seen["probe_fn"] is worker.kept_probe and seen["depth"] == 3


@pytest.mark.trains
def test_thread_count_restored():
    before = torch.get_num_threads()
    lab.init_gradients(SMALL, depth=2, depths=(2,), sweep_seeds=1)
    assert torch.get_num_threads() == before
    with lab.threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


@pytest.mark.trains
@pytest.mark.parametrize("norm,seed0", [("layer", 0), ("layer", 10), ("rms", 5), ("rms", 15)])
def test_post_gradients_grow_toward_output_pre_shrink(norm, seed0):
    """Xiong et al. 2020, Fig. 3 at small scale: 12 layers, ReLU, Xavier; averaged over 5 inits."""
    opts = lab.LabOptions(ffn="relu", init="xavier", norm=norm, seed0=seed0)
    r = lab.init_gradients(opts, depth=12, depths=(12,), variants=("pre", "post"), sweep_seeds=1)
    assert lab.profile_ratio(r, "post") > 1.05
    assert lab.profile_ratio(r, "pre") < 0.6
    # Pre-Norm's residual grows with depth; Post-Norm's is pinned by the norm (γ = 1, so RMS ≈ 1)
    pre, post = r["profile"]["pre"]["resid_rms"], r["profile"]["post"]["resid_rms"]
    assert pre[-1] > 2 * pre[0]
    assert all(abs(x - 1) < 0.01 for x in post)


def test_deepnorm_is_scaled_post_norm():
    opts = lab.LabOptions(init="llama", norm="layer")
    with lab.threads(1), lab.variant_model("deepnorm", 3, opts, seed=0) as m:
        x = torch.randint(0, opts.vocab, (1, 9))
        rec = record(m, x)
        alpha = lab.deepnorm_alpha(3)
        b0 = m.blocks[0]
        resid = rec["blocks.0.hook_resid_pre"]
        from explorer_model.rope import cos_sin

        cos, sin = cos_sin(m.inv_freq, torch.arange(9))
        with torch.no_grad():
            attn = b0.attn(resid, cos, sin)
            expected = b0.ln1(alpha * resid + attn)
        torch.testing.assert_close(rec["blocks.0.hook_resid_mid"], expected, rtol=1e-5, atol=1e-5)
        beta = lab.deepnorm_beta(3)
        std_v, std_q = b0.attn.v_proj.weight.std().item(), b0.attn.q_proj.weight.std().item()
        assert std_v / std_q == pytest.approx(beta, rel=0.05)
    # hooks are gone afterwards: with α = 1 the same model is plain Post-Norm
    assert not any(hp.fns for hp in m.hook_dict.values())
    with lab.variant_model("post", 3, opts, seed=0) as post, torch.no_grad():
        with lab.deepnorm_residual(post, 1.0):
            a = post(x)
        torch.testing.assert_close(a, post(x))


@pytest.mark.trains
def test_race_short_curves_and_time_limit():
    rc = lab.RaceConfig(depth=2, steps=6, log_every=2, seq=16, batch=2)
    r = lab.race(rc)
    assert r["steps"] == [2, 4, 6] and r["completed"]
    assert set(r["curves"]) == set(lab.RUN_KEYS)
    for ys in r["curves"].values():
        assert len(ys) == 3 and all(math.isfinite(y) for y in ys)
    assert 4 < r["unigram_entropy"] < 8
    # warmup starts slower: its first step uses lr / (0.25 * steps)
    assert rc.lr_at(0, True) == pytest.approx(rc.lr / 1.5) and rc.lr_at(0, False) == rc.lr
    assert lab.race(rc)["curves"] == r["curves"]  # deterministic
    cut = lab.race(lab.RaceConfig(depth=2, steps=50, log_every=2, seq=16, batch=2), time_limit=0.0)
    assert cut["steps"] == [2] and not cut["completed"]
    assert all(len(ys) == 1 for ys in cut["curves"].values())


def test_shipped_race_curves():
    shipped = lab.load_race_curves()
    if shipped is None:
        pytest.skip("assets/lab/race_curves.json not built yet")
    assert lab.RACE_CURVES_PATH.stat().st_size < 100_000
    assert shipped["unigram_entropy"] == pytest.approx(lab.race_data()["unigram_entropy"], abs=1e-3)
    for depth in lab.RACE_GRID["depth"]:
        for lr in lab.RACE_GRID["lr"]:
            entry = shipped["runs"][lab.race_grid_key(depth, lr)]
            assert len(entry["seeds"]) == 3
            for runs in entry["seeds"].values():
                assert set(runs) == set(lab.RUN_KEYS)
                assert all(len(ys) == len(entry["steps"]) for ys in runs.values())


@pytest.mark.slow  # training the race's seeds again
def test_shipped_curves_are_what_race_produces():
    shipped = lab.load_race_curves()
    if shipped is None:
        pytest.skip("assets/lab/race_curves.json not built yet")
    live = lab.race(lab.RaceConfig(depth=6, lr=1e-3, seed=1), time_limit=0.0)  # first log point only
    first = {k: ys[0] for k, ys in shipped["runs"][lab.race_grid_key(6, 1e-3)]["seeds"]["1"].items()}
    assert live["steps"] == [10]
    assert {k: round(ys[0], 4) for k, ys in live["curves"].items()} == first


def test_race_lesson_matches_shipped_curves():
    """The view's RACE_LESSON text states these facts about the shipped runs; keep them true."""
    shipped = lab.load_race_curves()
    if shipped is None:
        pytest.skip("assets/lab/race_curves.json not built yet")
    h = shipped["unigram_entropy"]

    def escapes(depth, lr, key):
        e = shipped["runs"][lab.race_grid_key(depth, lr)]
        return [lab.escape_step(e["steps"], runs[key], h) for runs in e["seeds"].values()]

    pre = [s for d in (6, 12) for lr in (1e-3, 3e-3) for k in ("pre_warmup", "pre_nowarmup") for s in escapes(d, lr, k)]
    assert None not in pre and min(pre) >= 60 and max(pre) <= 150
    post_6 = escapes(6, 1e-3, "post_warmup") + escapes(6, 1e-3, "post_nowarmup")
    assert None not in post_6 and min(post_6) >= 140 and max(post_6) <= 280
    spread = lambda xs: max(xs) - min(xs)  # noqa: E731
    assert spread(escapes(6, 1e-3, "post_nowarmup")) > spread(escapes(6, 1e-3, "post_warmup"))
    for depth, lr in ((6, 3e-3), (12, 1e-3), (12, 3e-3)):
        for key in ("post_warmup", "post_nowarmup"):
            assert escapes(depth, lr, key) == [None] * 3
            finals = [runs[key][-1] for runs in shipped["runs"][lab.race_grid_key(depth, lr)]["seeds"].values()]
            assert all(abs(f - h) < 0.15 for f in finals)  # sitting on the unigram line


def test_twin_helpers_on_a_small_model():
    opts = lab.LabOptions(init="llama")
    with lab.variant_model("pre", 2, opts, seed=0) as m:
        m.eval()
        ids = [1, 5, 9, 2, 7]
        rec = record(m, ids)
    norms = lab.residual_norms(rec)
    assert len(norms) == 3
    assert norms[-1] == pytest.approx(rec["blocks.1.hook_resid_post"][0].norm(dim=-1).mean().item())
    assert lab.norm_scales(rec, "ln2")[0] == pytest.approx(rec["blocks.0.ln2.hook_scale"][0, :, 0].mean().item())
    top, probs = lab.top_predictions(rec, k=3)
    p = torch.softmax(rec.logits[0, -1], -1)
    assert top[0] == int(p.argmax()) and probs[0] == pytest.approx(p.max().item())
    expected = torch.nn.functional.cross_entropy(rec.logits[0, :-1], torch.tensor(ids[1:])).item()
    assert lab.sequence_loss(rec) == pytest.approx(expected)
