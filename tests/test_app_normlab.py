"""The Pre vs Post-Norm lab view: the twins' figures equal their recordings, the init-gradient figures
equal the lab functions, a shortened race runs from its button, nothing reruns a model when the
selection changes, and the Chinese page renders."""
import numpy as np
import pytest

from apptest_util import all_text, by_id, decode, figures, forwards, run_app, trace
from explorer_model.lab import normlab as lab

PROMPT = "To be, or not to be: that is"
LAYER, HEAD = 4, 3
RACE_STEPS = 4


def twins_available() -> bool:
    return all((lab.ASSETS / name / "explorer_config.json").is_file() for name in lab.TWINS)


@pytest.fixture(scope="module")
def page():
    at = run_app(view="normlab", prompt=PROMPT, layer=LAYER, head=HEAD)
    assert not at.exception
    at.button(key="lab_init_run").click().run()
    assert not at.exception
    at.number_input(key="lab_race_steps").set_value(RACE_STEPS).run()
    at.button(key="lab_race_start").click().run()
    assert not at.exception
    return at


@pytest.fixture(scope="module")
def twin_recordings():
    if not twins_available():
        pytest.skip("the twins are not built yet")
    from explorer_model.lab.corpus import HELDOUT_LINE
    from explorer_model.loaders import load
    from explorer_model.recording import record

    out = {}
    for v, name in zip(("pre", "post"), lab.TWINS):
        loaded = load(name)
        ids = loaded.tokenizer.encode(PROMPT, add_bos=getattr(loaded.tokenizer, "add_bos", False))
        line = loaded.tokenizer.encode(HELDOUT_LINE, add_bos=True)
        out[v] = (loaded, ids, record(loaded.model, ids), record(loaded.model, line))
    return out


def test_twin_figures_equal_recordings(page, twin_recordings):
    resid = by_id(page, "normlab_resid")
    scales = by_id(page, "normlab_scales")
    for v, (loaded, ids, rec, line_rec) in twin_recordings.items():
        np.testing.assert_allclose(decode(trace(resid, v)["y"]), lab.residual_norms(rec), rtol=1e-5)
        np.testing.assert_allclose(decode(trace(scales, f"{v}_ln2")["y"]), lab.norm_scales(rec, "ln2"), rtol=1e-5)
        layer, head = min(LAYER, rec.cfg.n_layers - 1), min(HEAD, rec.cfg.n_heads - 1)
        z = decode(by_id(page, f"normlab_attn_{v}")["data"][0]["z"])
        expected = rec.pattern(layer)[0, head].double().numpy()
        mask = np.triu(np.ones_like(expected, dtype=bool), 1)
        assert z.shape == (len(ids), len(ids)) and np.isnan(z[mask]).all()
        np.testing.assert_allclose(z[~mask], expected[~mask], rtol=1e-5, atol=1e-7)
        top, probs = lab.top_predictions(rec)
        np.testing.assert_allclose(decode(by_id(page, f"normlab_top_{v}")["data"][0]["x"]), probs, rtol=1e-5)
        assert f"{lab.sequence_loss(line_rec):.3f}" in [m.value for m in page.get("metric")]
    log = lab.log_curves(lab.train_log("tiny-post"))
    grads = by_id(page, "normlab_train_grads_post")
    np.testing.assert_allclose(decode(trace(grads, "L0")["y"]), [g[0] for g in log["grad_down"]], rtol=1e-6)


def test_init_figures_equal_lab_functions(page):
    with lab.threads(1):  # one thread, as the app uses: fast for models this small
        _check_init_figures(page)


def _check_init_figures(page):
    opts = lab.LabOptions()  # the widgets' defaults: ReLU, Xavier, LayerNorm, depth 12
    prof = by_id(page, "normlab_init_profile")
    for v in lab.VARIANTS:
        runs = [lab.probe(v, 12, opts, s)["grad_down"] for s in range(opts.seeds)]
        np.testing.assert_allclose(decode(trace(prof, v)["y"]), np.mean(runs, axis=0), rtol=1e-6)
    depth = by_id(page, "normlab_init_depth")
    np.testing.assert_allclose(decode(trace(depth, "post")["x"]), lab.SWEEP_DEPTHS)
    two = [lab.probe("post", 2, opts, s) for s in range(2)]
    assert decode(trace(depth, "post")["y"])[0] == pytest.approx(np.mean([r["grad_down"][-1] for r in two]), rel=1e-6)
    update = by_id(page, "normlab_init_update")
    assert decode(trace(update, "deepnorm")["y"])[0] == pytest.approx(
        np.mean([lab.probe("deepnorm", 2, opts, s)["output_change"] for s in range(2)]), rel=1e-6)
    assert "Last/first layer ratio" in all_text(page)
    assert not any("{" in c.value for c in page.get("caption"))  # every f-string was formatted


def test_race_from_button(page):
    fig = by_id(page, "normlab_race_live")
    expected = lab.race(lab.RaceConfig(depth=6, lr=1e-3, steps=RACE_STEPS, log_every=1))  # race() uses one thread
    for key in lab.RUN_KEYS:
        t = trace(fig, key)
        np.testing.assert_allclose(decode(t["x"]), expected["steps"])
        np.testing.assert_allclose(decode(t["y"]), expected["curves"][key], rtol=1e-6)
    line = [s for s in fig["layout"]["shapes"] if s.get("type") == "line"]
    assert line and line[0]["y0"] == pytest.approx(expected["unigram_entropy"])
    if lab.load_race_curves():
        shipped = by_id(page, "normlab_race_shipped")
        assert len(shipped["data"]) == 3 * len(lab.RUN_KEYS)


def test_selection_change_runs_no_model(page):
    n = forwards()
    page.sidebar.slider(key="layer").set_value(1).run()
    page.sidebar.slider(key="head").set_value(0).run()
    assert not page.exception
    assert forwards() == n
    if twins_available():
        assert by_id(page, "normlab_attn_pre")["layout"]["title"]["text"].endswith("0")


def test_chinese_page():
    at = run_app(view="normlab", prompt=PROMPT, lang="zh")
    assert not at.exception
    at.button(key="lab_init_run").click().run()  # probes are cached by now
    assert not at.exception and by_id(at, "normlab_init_profile")["layout"]["title"]["text"].startswith("初始化时")
    text = all_text(at)
    assert "初始化时的梯度" in text and "训练赛跑" in text
    assert not any("{" in c.value for c in at.get("caption"))
    assert any("一元熵" in f["layout"]["title"]["text"] or "训练损失" in f["layout"]["title"]["text"]
               for f in figures(at)) or not lab.load_race_curves()
