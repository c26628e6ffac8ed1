"""The Pre vs Post-Norm lab view: the twins' figures equal their recordings, the init-gradient figures
equal the lab functions, a shortened race runs from its button, nothing reruns a model when the
selection changes, and the Chinese page renders."""
import numpy as np
import pytest

from apptest_util import all_text, by_id, decode, figures, forwards, run_app, trace, title
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
    """The live race is drawn OVER the shipped curves: one figure holds the shipped seeds and the live run."""
    from app.panels.normlab.race import DEFAULT_DEPTH, DEFAULT_LR
    assert (DEFAULT_DEPTH, DEFAULT_LR) == (6, 3e-3)
    fig = by_id(page, "normlab_race")
    expected = lab.race(lab.RaceConfig(depth=DEFAULT_DEPTH, lr=DEFAULT_LR, steps=RACE_STEPS, log_every=1))
    for key in lab.RUN_KEYS:
        t = trace(fig, key)
        np.testing.assert_allclose(decode(t["x"]), expected["steps"])
        np.testing.assert_allclose(decode(t["y"]), expected["curves"][key], rtol=1e-6)
    line = [s for s in fig["layout"]["shapes"] if s.get("type") == "line"]
    assert line and line[0]["y0"] == pytest.approx(expected["unigram_entropy"])
    shipped = lab.load_race_curves()["runs"][lab.race_grid_key(DEFAULT_DEPTH, DEFAULT_LR)]
    for seed, runs in shipped["seeds"].items():
        for key in lab.RUN_KEYS:
            np.testing.assert_allclose(decode(trace(fig, f"shipped_{key}_{seed}")["y"]), runs[key])
    assert len(fig["data"]) == len(shipped["seeds"]) * len(lab.RUN_KEYS) + len(lab.RUN_KEYS)
    assert sum(1 for f in figures(page) if "Training loss" in str(f["layout"].get("title"))) == 1


def test_defaults_show_the_difference():
    """At the race's defaults every shipped Pre run leaves the unigram line within the default steps, no Post run does."""
    from app.panels.normlab.race import DEFAULT_DEPTH, DEFAULT_LR, DEFAULT_STEPS
    curves = lab.load_race_curves()
    entry = curves["runs"][lab.race_grid_key(DEFAULT_DEPTH, DEFAULT_LR)]
    steps = [s for s in entry["steps"] if s <= DEFAULT_STEPS]
    for runs in entry["seeds"].values():
        for key in lab.RUN_KEYS:
            esc = lab.escape_step(steps, runs[key][:len(steps)], curves["unigram_entropy"])
            assert (esc is not None) == key.startswith("pre_"), key


def test_lab_prose_numbers_come_from_the_data(page):
    """Every number the lessons quote equals the data file's (or the shipped curves') value."""
    from explorer_model.lab import lesson_numbers
    from explorer_model.lab.race import race_lesson_numbers
    nums = lesson_numbers.load()
    text = all_text(page)
    u = nums["unigram"]
    assert f"{u['entropy']:.2f} nats per token" in text and f"{u['tokens']} tokens" in text
    assert u["entropy"] == pytest.approx(lab.load_race_curves()["unigram_entropy"])
    # one unigram number only: the twins' training-mix entropy and held-out cross-entropy are not shown
    logs = lab.train_log(lab.TWINS[0])
    for other in (logs["unigram_entropy_train"], logs["unigram_cross_entropy_heldout"]):
        assert f"{other:.2f}" not in text and f"{other:.3f}" not in text
    # the init lesson for the page's options (ReLU, Xavier)
    r = nums["init_ratio"]["relu_xavier"]
    assert f"ratio {r['pre']['lo']:.2f}–{r['pre']['hi']:.2f}" in text
    assert f"ratio {r['post']['lo']:.2f}–{r['post']['hi']:.2f}" in text
    # the race lesson, measured from the shipped curves, checked here by counting them independently
    curves = lab.load_race_curves()
    h = curves["unigram_entropy"]
    pre = [lab.escape_step(e["steps"], runs[k], h) for e in curves["runs"].values() for runs in e["seeds"].values()
           for k in lab.RUN_KEYS if k.startswith("pre_")]
    n = race_lesson_numbers(curves)
    assert (n["pre_off"], n["pre_all"], n["pre_lo"], n["pre_hi"]) == (
        sum(x is not None for x in pre), len(pre), min(x for x in pre if x), max(x for x in pre if x))
    assert f"Pre-Norm leaves the unigram plateau in {n['pre_off']} of {n['pre_all']} runs" in text
    assert f"between steps {n['pre_lo']} and {n['pre_hi']}" in text
    assert f"stays on the unigram line in {n['post_hard_stuck']} of {n['post_hard_all']} runs" in text


def test_selection_change_runs_no_model(page):
    n = forwards()
    page.sidebar.slider(key="layer").set_value(1).run()
    page.sidebar.slider(key="head").set_value(0).run()
    assert not page.exception
    assert forwards() == n
    if twins_available():
        assert title(by_id(page, "normlab_attn_pre")).endswith("0")


def test_chinese_page():
    at = run_app(view="normlab", prompt=PROMPT, lang="zh")
    assert not at.exception
    at.button(key="lab_init_run").click().run()  # probes are cached by now
    assert not at.exception and title(by_id(at, "normlab_init_profile")).startswith("初始化时")
    text = all_text(at)
    assert "初始化时的梯度" in text and "训练赛跑" in text
    assert not any("{" in c.value for c in at.get("caption"))
    assert any("训练损失" in title(f) for f in figures(at))
    assert "一元熵" in text and "nats" in text
