"""The RMSNorm and RoPE views show exactly the recorded tensors, and their own RoPE checks hold."""
import math

import numpy as np
import pytest
import torch

from apptest_util import all_text, by_id, decode, forwards, record_prompt, run_app, select, trace, title

PROMPT = "The animal didn't cross the street because it was too tired."
LAYER, HEAD, TOKEN = 7, 5, 9


@pytest.fixture(scope="module")
def reference(loaded):
    return (loaded, *record_prompt(loaded, PROMPT))


# --------------------------------------------------------------------------- RMSNorm
@pytest.fixture(scope="module")
def norm_page():
    return run_app(view="norm", prompt=PROMPT, layer=LAYER, head=HEAD, token=TOKEN)


def test_divisor_heatmaps_equal_recording(norm_page, reference):
    _, ids, rec = reference
    assert not norm_page.exception
    z = decode(by_id(norm_page, "norm_divisors")["data"][0]["z"])
    expected = rec.stack("ln1.hook_scale")[:, 0, :, 0].double().numpy()
    assert z.shape == (rec.cfg.n_layers, len(ids))
    np.testing.assert_allclose(z, expected, rtol=1e-6)
    final = decode(by_id(norm_page, "norm_final")["data"][0]["y"])
    np.testing.assert_allclose(final, rec["ln_final.hook_scale"][0, :, 0].double().numpy(), rtol=1e-6)


def test_token_vectors_equal_recording_and_gamma(norm_page, reference):
    loaded, _, rec = reference
    fig = by_id(norm_page, "norm_vectors")
    x = rec[f"blocks.{LAYER}.hook_resid_pre"][0, TOKEN].double().numpy()
    normalized = rec[f"blocks.{LAYER}.ln1.hook_normalized"][0, TOKEN].double().numpy()
    gamma = loaded.model.blocks[LAYER].ln1.weight.double().numpy()
    np.testing.assert_allclose(decode(trace(fig, "x")["y"]), x, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(decode(trace(fig, "normalized")["y"]), normalized, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(decode(trace(fig, "out")["y"]), normalized * gamma, rtol=1e-5, atol=1e-6)
    # the highlighted dims are the largest |x|
    top = decode(trace(fig, "x_outliers")["x"]).astype(int)
    assert set(top) == set(np.argsort(-np.abs(x))[: len(top)])
    np.testing.assert_allclose(decode(by_id(norm_page, "norm_gamma")["data"][0]["x"]), gamma, rtol=1e-6)
    ln = decode(trace(by_id(norm_page, "norm_layernorm"), "layernorm")["y"])
    np.testing.assert_allclose(ln, (x - x.mean()) / np.sqrt(x.var() + rec.cfg.norm_eps), rtol=1e-5, atol=1e-6)


def test_ln2_switch_reads_resid_mid(norm_page, reference):
    _, _, rec = reference
    norm_page.radio(key="norm_which").set_value("ln2").run()
    assert not norm_page.exception
    z = decode(by_id(norm_page, "norm_divisors")["data"][0]["z"])
    np.testing.assert_allclose(z, rec.stack("ln2.hook_scale")[:, 0, :, 0].double().numpy(), rtol=1e-6)
    x = decode(trace(by_id(norm_page, "norm_vectors"), "x")["y"])
    np.testing.assert_allclose(x, rec[f"blocks.{LAYER}.hook_resid_mid"][0, TOKEN].double().numpy(), rtol=1e-6,
                               atol=1e-7)
    norm_page.radio(key="norm_which").set_value("ln1").run()


def test_norm_switching_selection_runs_no_forward(norm_page):
    before = forwards()
    select(norm_page, layer=2, token=1, head=0)
    assert not norm_page.exception
    assert forwards() == before


def test_norm_chinese():
    at = run_app(view="norm", prompt=PROMPT, lang="zh", layer=3, token=2)
    assert not at.exception and not at.error
    text = all_text(at)
    assert "可学习的增益" in text and "均方根" in text
    assert "一个 token 经过归一化" in title(by_id(at, "norm_vectors"))


# --------------------------------------------------------------------------- RoPE
@pytest.fixture(scope="module")
def rope_page():
    return run_app(view="rope", prompt=PROMPT, layer=LAYER, head=HEAD, token=TOKEN)


def test_theta_and_angles(rope_page, reference):
    from explorer_model.rope import model_inverse_frequencies

    _, ids, rec = reference
    assert not rope_page.exception
    theta = model_inverse_frequencies(rec.cfg).double().numpy()
    np.testing.assert_allclose(decode(trace(by_id(rope_page, "rope_theta"), "theta_model")["y"]), theta, rtol=1e-7)
    y_axis = by_id(rope_page, "rope_theta")["layout"]["yaxis"]
    assert y_axis["type"] == "log" and y_axis["dtick"] == 1  # labels at powers of ten only
    heat = by_id(rope_page, "rope_angles")["data"][0]
    exact = decode(heat["customdata"])
    np.testing.assert_allclose(exact, np.arange(len(ids))[:, None] * theta[None, :], rtol=1e-9)
    np.testing.assert_allclose(decode(heat["z"]), np.mod(exact, 2 * math.pi), atol=1e-9)


def test_arrows_equal_recorded_q_and_k_pairs(rope_page, reference):
    _, _, rec = reference
    fig = by_id(rope_page, "rope_arrows")
    a, kv = f"blocks.{LAYER}.attn", rec.kv_head(HEAD)
    sources = {("q", "before"): rec[f"{a}.hook_q"][0, TOKEN, HEAD], ("q", "after"): rec[f"{a}.hook_rot_q"][0, TOKEN, HEAD],
               ("k", "before"): rec[f"{a}.hook_k"][0, TOKEN, kv], ("k", "after"): rec[f"{a}.hook_rot_k"][0, TOKEN, kv]}
    pairs = sorted({t["meta"]["pair"] for t in fig["data"] if isinstance(t.get("meta"), dict)})
    n = rec.cfg.head_dim // 2
    assert pairs == [0, 1, 2, n - 3, n - 2, n - 1]  # default: fast and slow pairs
    for (kind, stage), vec in sources.items():
        for i in pairs:
            t = trace(fig, {"kind": kind, "stage": stage, "pair": i})
            assert t["x"][0] == 0 and t["y"][0] == 0
            np.testing.assert_allclose([t["x"][1], t["y"][1]], vec[2 * i: 2 * i + 2].double().numpy(), rtol=1e-6)
    rope_page.multiselect(key="rope_pairs").set_value([4, 20]).run()
    fig = by_id(rope_page, "rope_arrows")
    assert sorted({t["meta"]["pair"] for t in fig["data"] if isinstance(t.get("meta"), dict)}) == [4, 20]


def shift_df(at):
    tables = [d.value for d in at.dataframe if "diff vs s=0" in d.value.columns]
    assert len(tables) == 1
    return tables[0]


@pytest.mark.parametrize("key_token", [0, 4, TOKEN])
def test_shift_invariance_and_recorded_score(rope_page, reference, key_token):
    _, _, rec = reference
    rope_page.number_input(key="rope_key_token").set_value(key_token).run()
    assert not rope_page.exception
    df = shift_df(rope_page)
    assert len(df) >= 5 and df["shift s"].max() >= 1000
    scores = df["score q·k/√d"].to_numpy()
    assert np.abs(scores - scores[0]).max() < 1e-3
    assert (df["query pos m+s"] - df["key pos n+s"] == TOKEN - key_token).all()
    recorded = float(rec.scores(LAYER)[0, HEAD, TOKEN, key_token])
    assert abs(scores[0] - recorded) < 1e-4
    # q·k itself is √d times the (scaled) attention score
    np.testing.assert_allclose(df["q·k"].to_numpy()[0], recorded * math.sqrt(rec.cfg.head_dim), rtol=1e-5)


def test_decay_curve_hits_recorded_pair(rope_page, reference):
    _, _, rec = reference
    rope_page.number_input(key="rope_key_token").set_value(2).run()
    fig = by_id(rope_page, "rope_decay")
    delta, y = decode(trace(fig, "score")["x"]), decode(trace(fig, "score")["y"])
    assert delta[-1] >= 512
    recorded = float(rec.scores(LAYER)[0, HEAD, TOKEN, 2]) * math.sqrt(rec.cfg.head_dim)
    assert abs(y[TOKEN - 2] - recorded) < 1e-3 * max(1.0, abs(recorded))
    rope_page.radio(key="rope_decay_src").set_value("ones").run()
    y = decode(trace(by_id(rope_page, "rope_decay"), "score")["y"])
    assert y[0] == pytest.approx(rec.cfg.head_dim)  # all-ones q = k: every pair contributes |q_i|² = 2


def test_rope_switching_selection_runs_no_forward(rope_page):
    before = forwards()
    select(rope_page, head=1, layer=0, token=3)
    rope_page.slider(key="rope_clock_pos").set_value(5000).run()
    assert not rope_page.exception
    assert forwards() == before
    hands = [t for t in by_id(rope_page, "rope_clock")["data"] if isinstance(t.get("meta"), dict)]
    assert hands and all(t["meta"]["angle"] == pytest.approx(5000 * _theta(rope_page)[t["meta"]["pair"]],
                                                             rel=1e-9) for t in hands)


def _theta(at):
    return decode(trace(by_id(at, "rope_theta"), "theta_model")["y"])


def test_rope_chinese():
    at = run_app(view="rope", prompt=PROMPT, lang="zh", layer=1, head=2, token=5)
    assert not at.exception and not at.error
    text = all_text(at)
    assert "旋转" in text and "相邻" in text
    assert "每一对的旋转速度" in title(by_id(at, "rope_theta"))


# --------------------------------------------------------------------------- pure functions, other model kinds
def test_post_norm_layernorm_model_with_llama3_scaling():
    """Variants the default model doesn't exercise: post-norm (no final norm), LayerNorm, scaled RoPE."""
    from app.panels import norm, rope
    from explorer_model import LlamaModel, ModelConfig
    from explorer_model.config import RopeScaling
    from explorer_model.recording import record

    cfg = ModelConfig(vocab_size=50, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=48,
                      norm_eps=1e-5, rope_theta=500000.0, max_seq_len=64, tie_embeddings=False,
                      rope_scaling=RopeScaling("llama3", 8.0, 1.0, 4.0, 64), norm_placement="post", norm_type="layer")
    torch.manual_seed(0)
    model = LlamaModel(cfg).eval().requires_grad_(False)
    rec = record(model, [3, 1, 4, 1, 5, 9, 2])
    assert norm.final_divisors(rec) is None
    v = norm.norm_vectors(rec, cfg, model.blocks[1].ln2.weight.numpy(), 1, 3, "ln2")
    x = (rec["blocks.1.hook_resid_mid"] + rec["blocks.1.hook_mlp_out"])[0, 3].numpy()
    np.testing.assert_allclose(v["x"], x, rtol=1e-6)
    np.testing.assert_allclose(v["scale"], np.sqrt(x.var() + cfg.norm_eps), rtol=1e-5)  # LayerNorm: σ, not RMS
    plain, used = rope.theta_data(cfg)
    assert not np.allclose(plain, used) and np.allclose(plain[0], used[0])  # slow pairs stretched, fast kept
    fig = rope.theta_figure(plain, used, lambda key, **values: key, True)
    assert [t.meta for t in fig.data] == ["theta_unscaled", "theta_model"]
    df = rope.shift_table(rec, used, 1, 3, 6, 2)
    assert np.abs(df["diff vs s=0"]).max() < 1e-9
    assert abs(df["score q·k/√d"].iloc[0] - float(rec.scores(1)[0, 3, 6, 2])) < 1e-5


# --------------------------------------------------------------------------- RoPE vs the absolute encoding
def test_sinusoidal_encoding_beside_rope(rope_page, reference):
    """PE written out from the 2017 formula; sizes from hook_embed; V's position part from the layer-0 W_v;
    RoPE's change of Q and K from the recorded tensors, and V untouched."""
    loaded, ids, rec = reference
    T, d = len(ids), rec.cfg.d_model
    pe = np.zeros((T, d))
    for pos in range(T):
        for i in range(0, d, 2):
            pe[pos, i] = math.sin(pos / 10000 ** (i / d))
            pe[pos, i + 1] = math.cos(pos / 10000 ** (i / d))
    heat = by_id(rope_page, "rope_pe")["data"][0]
    shown = decode(heat["z"])
    assert shown.shape == (T, min(d, 128))
    np.testing.assert_allclose(shown, pe[:, : shown.shape[1]], atol=1e-12)
    fig = by_id(rope_page, "rope_vs_absolute")
    layer = rope_page.session_state["layer"]
    embed = rec["hook_embed"][0].double().numpy()
    np.testing.assert_allclose(decode(trace(fig, "embed_norm")["y"]), np.linalg.norm(embed, axis=-1), rtol=1e-9)
    np.testing.assert_allclose(decode(trace(fig, "pe_norm")["y"]), math.sqrt(d / 2), rtol=1e-12)
    w_v = loaded.model.blocks[0].attn.v_proj.weight.double().numpy()
    np.testing.assert_allclose(decode(trace(fig, "v_position")["y"]), np.linalg.norm(pe @ w_v.T, axis=-1), rtol=1e-5)
    a = f"blocks.{layer}.attn"
    for name in ("q", "k"):
        before, after = rec[f"{a}.hook_{name}"][0].double(), rec[f"{a}.hook_rot_{name}"][0].double()
        expected = ((after - before).norm(dim=-1) / before.norm(dim=-1)).mean(-1).numpy()
        np.testing.assert_allclose(decode(trace(fig, f"{name}_change")["y"]), expected, rtol=1e-6, atol=1e-12)
    assert decode(trace(fig, "q_change")["y"])[0] == 0  # position 0 turns by zero
    # V is not rotated: z = pattern · V with the recorded V, head by head
    z = torch.einsum("hqk,khd->qhd", rec.pattern(layer)[0].double(),
                     rec[f"{a}.hook_v"][0].double().repeat_interleave(rec.cfg.n_rep, dim=1))
    assert (z - rec[f"{a}.hook_z"][0].double()).abs().max() < 1e-4
    assert np.all(decode(trace(fig, "v_change")["y"]) == 0)


def test_rope_links_to_the_no_rope_whatif():
    at = run_app(view="rope", prompt=PROMPT, layer=2, head=1, token=4)
    at.button(key="rope_to_whatif").click().run()
    assert not at.exception and not at.error
    assert at.session_state["view"] == "whatif" and at.session_state["whatif"] == "no-rope"
    assert at.text_input(key="whatif_specs").value == "no-rope"  # the What-if view is drawn with it


def test_rope_subplot_titles_are_short():
    """Every subplot title line fits its column at 768 px wide (12 px text: ≤ 7 px per character),
    and the two rows of arrows leave room for the lower row's titles."""
    at = run_app(view="rope", prompt=PROMPT, layer=2, head=1, token=4)
    at.multiselect(key="rope_pairs").set_value(list(range(8))).run()
    for fig_id in ("rope_arrows", "rope_clock"):
        layout = by_id(at, fig_id)["layout"]
        width = 768 - 20  # the page is narrower still; the plot's own margins are 10 + 10
        column = min(v["domain"][1] - v["domain"][0] for k, v in layout.items() if k.startswith("xaxis"))
        titles = [a["text"] for a in layout["annotations"]]
        assert titles and max(len(line) for s in titles for line in s.split("<br>")) * 7 <= column * width
    rows = sorted({tuple(v["domain"]) for k, v in by_id(at, "rope_arrows")["layout"].items() if k.startswith("yaxis")})
    assert len(rows) == 2 and (rows[1][0] - rows[0][1]) * (460 - 90 - 10) >= 60  # plot area: height − margins


@pytest.mark.parametrize("view", ["norm", "rope", "swiglu"])
def test_presenter_mode_folds_explanations(view):
    """Main figure first; in presenter mode the explanations start folded, otherwise open."""
    from apptest_util import figures

    at = run_app(view=view, prompt=PROMPT, layer=2, head=1, token=4)
    assert not at.exception and not at.error
    assert at.main.expander and all(e.proto.expanded for e in at.main.expander)
    first = figures(at)[0]["layout"].get("meta") or {}
    assert first.get("id") == {"norm": "norm_divisors", "rope": "rope_angles", "swiglu": "swiglu_heatmap"}[view]
    at.sidebar.toggle(key="presenter").set_value(True).run()
    assert not at.exception and not at.error
    assert at.main.expander and not any(e.proto.expanded for e in at.main.expander)


def test_the_norms_kind_and_place_are_named_as_in_both_languages():
    """The formula's note names this model's norm by its proper name in either language, not by the config's
    codes ("rms", "pre")."""
    for lang, line in (("en", "**RMSNorm**, **Pre-Norm**."), ("zh", "**RMSNorm**，**Pre-Norm**。")):
        at = run_app(view="norm", lang=lang)
        assert not at.exception and line in all_text(at), lang


def test_one_tokens_rows_leave_room_for_the_largest_values_labels():
    """The labels of the largest |x| stand above (below) their bars inside the row, not on its title."""
    from app.panels.norm import vectors_figure

    x = np.array([0.1, -0.5, 0.8, 0.2, -0.1])
    fig = vectors_figure({"x": x, "normalized": x / 0.4, "out": x * 0.3}, lambda key, **v: key)
    for r, scale in ((1, 1.0), (2, 2.5), (3, 0.3)):
        lo, hi = fig.layout["yaxis" + ("" if r == 1 else str(r))].range
        assert hi >= 0.8 * scale * 1.15 and lo <= -0.5 * scale * 1.15
