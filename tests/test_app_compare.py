"""Compare mode (issue 13): every view draws A and B side by side, and B − A where they line up; the figures show
what the two recordings hold, computed here independently with torch from recordings made in this process;
the URL holds B; switching view, layer, head or token runs no forward pass."""
from __future__ import annotations

import csv
import io
import math

import numpy as np
import pytest
import torch

from apptest_util import all_text, by_id, decode, figures, forwards, run_app, select, trace
from test_app_attention import capture_downloads

from app.panels import VIEWS
from explorer_model.loaders import load
from explorer_model.recording import record

pytestmark = pytest.mark.usefixtures("one_thread")
LINE = "Shall I compare thee to a summer's day?"
TWINS = dict(model="tiny-pre", prompt=LINE, cmp="model", cmp_model="tiny-post", layer=2, head=3)
BANK_A, BANK_B = "The bank of the river", "The bank approved the loan"
VIEW_FIGURES = {  # the figures each view draws for the twins (same shape and length: B − A everywhere)
    "tokens": set(), "attention": {"compare_attention", "compare_attention_js", "compare_attention_curves"},
    "norm": {"compare_norm_stream", "compare_norm", "compare_norm_curves"}, "rope": {"compare_rope"},
    "swiglu": {"compare_swiglu", "compare_swiglu_change", "compare_swiglu_curves"},
    "residual": {"compare_residual_stream", "compare_next", "compare_change_map"}, "block": {"compare_block"},
    "whatif": {"compare_next", "compare_heads"}, "normlab": {"compare_normlab_stream", "compare_normlab_curves"},
}


def recorded(source: str, text: str, interventions=None):
    """(ids, full recording) of a prompt as the app encodes it (BOS where the tokenizer wants one)."""
    m = load(source)
    ids = m.tokenizer.encode(text, add_bos=m.tokenizer.add_bos)
    return ids, record(m.model, ids, interventions=interventions)


@pytest.fixture(scope="module")
def twins():
    return recorded("tiny-pre", LINE), recorded("tiny-post", LINE)


def ids_of(fig) -> set:
    return {(f["layout"].get("meta") or {}).get("id") for f in fig}


def js_rows(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Jensen–Shannon divergence (nats) of each row pair, written out: ½ KL(p‖m) + ½ KL(q‖m), m = (p + q) / 2."""
    m = (p + q) / 2

    def kl(x):
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(x > 0, x * np.log(x / m), 0.0).sum(-1)
    return 0.5 * kl(p) + 0.5 * kl(q)


def stream_rms(rec) -> np.ndarray:
    """Residual RMS after k = 0 … L blocks, mean over tokens, from the recorded resid_pre / last resid_post."""
    L, d = rec.cfg.n_layers, rec.cfg.d_model
    xs = [rec[f"blocks.{l}.hook_resid_pre"][0] for l in range(L)] + [rec[f"blocks.{L - 1}.hook_resid_post"][0]]
    return np.array([float((x.double().pow(2).sum(-1).sqrt() / math.sqrt(d)).mean()) for x in xs])


# --------------------------------------------------------------------------- every view
VIEW_CSVS = {"tokens": ["tokens"], "attention": ["attention"], "norm": ["norm_stream", "norm"], "rope": ["rope"],
             "swiglu": ["swiglu"], "residual": ["residual_stream", "next", "change_map"], "block": ["block"],
             "whatif": ["next", "heads"], "normlab": ["normlab_stream"]}


@pytest.mark.parametrize("view", [v[0] for v in VIEWS])
def test_every_views_csv_holds_both_sides(view):
    at = run_app(view=view, **TWINS)
    files = capture_downloads(at, [f"compare_{name}.csv" for name in VIEW_CSVS[view]])
    for name, text in files.items():
        rows = list(csv.DictReader(io.StringIO(text)))
        sides = {r["side"] for r in rows}
        assert sides == ({"B-A"} if name in ("compare_change_map.csv", "compare_heads.csv") else {"A", "B"}), name


@pytest.mark.parametrize("view", [v[0] for v in VIEWS])
def test_every_view_draws_a_and_b(view, twins):
    at = run_app(view=view, **TWINS)
    assert not at.exception and not at.error
    assert ids_of(figures(at)) == VIEW_FIGURES[view]
    assert "Compare" in all_text(at) and "tiny-post" in all_text(at)
    if view == "tokens":  # two tables, each the tokens of its side
        (ids_a, _), (ids_b, _) = twins
        assert [list(t.value["id"]) for t in at.dataframe[:2]] == [ids_a, ids_b]


OTHER_PAIRS = {  # two lengths on one model (aligned positions), two model shapes (curves only)
    "aligned": dict(model="tiny-pre", prompt="The bank of the river", cmp="prompt", cmp_prompt="The bank approved the loan"),
    "curves": dict(model="tiny-pre", prompt=LINE, cmp="model", cmp_model="smollm2", layer=5, head=7),
}


@pytest.mark.parametrize("pair", list(OTHER_PAIRS))
@pytest.mark.parametrize("view", [v[0] for v in VIEWS])
def test_every_view_draws_other_kinds_of_pairs(view, pair):
    at = run_app(view=view, **OTHER_PAIRS[pair])
    assert not at.exception and not at.error and not at.warning
    figs = figures(at)
    assert view == "tokens" or {"A", "B"} <= {str(t.get("meta")).split(":")[0] for f in figs for t in f["data"]}
    if pair == "curves":  # nothing per position across two shapes: no B − A anywhere
        assert not any(t.get("meta") == "B-A" for f in figs for t in f["data"])


def test_aligned_difference_is_the_aligned_sub_matrix():
    """Prompts of other lengths: B − A on the positions of the common prefix and suffix (found here by hand)."""
    (ia, ra), (ib, rb) = recorded("tiny-pre", "The bank of the river"), recorded("tiny-pre", "The bank of the long river")
    pre = next(i for i, (x, y) in enumerate(zip(ia, ib)) if x != y)
    suf = next(k for k in range(min(len(ia), len(ib))) if ia[-1 - k] != ib[-1 - k])
    pa = list(range(pre)) + list(range(len(ia) - suf, len(ia)))
    pb = list(range(pre)) + list(range(len(ib) - suf, len(ib)))
    at = run_app(view="attention", model="tiny-pre", prompt="The bank of the river", cmp="prompt",
                 cmp_prompt="The bank of the long river", layer=3, head=1)
    d = decode(trace(by_id(at, "compare_attention"), "B-A")["z"])
    A, B = ra.pattern(3)[0, 1].double().numpy(), rb.pattern(3)[0, 1].double().numpy()
    expected = B[np.ix_(pb, pb)] - A[np.ix_(pa, pa)]
    low = np.tril(np.ones_like(expected, dtype=bool))
    assert len(ia) != len(ib) and suf > 0 and d.shape == expected.shape
    np.testing.assert_allclose(d[low], expected[low], atol=1e-6)


def test_positions_paired_by_hand():
    """A visitor's alignment (in the link): B − A and the change map on exactly those pairs."""
    (ia, ra), (ib, rb) = recorded("tiny-pre", "The bank of the river"), recorded("tiny-pre", "The bank approved the loan")
    pairs = [(0, 0), (1, 1), (2, 2), (3, 3), (5, 7), (7, 9)]  # <s> The ban k, " the" with " the", last with last
    q = dict(model="tiny-pre", prompt="The bank of the river", cmp="prompt", cmp_prompt="The bank approved the loan",
             cmp_align=", ".join(f"{i}-{j}" for i, j in pairs), layer=4, head=6)
    at = run_app(view="attention", **q)
    assert not at.exception and at.query_params["cmp_align"] == q["cmp_align"]
    pa, pb = [i for i, _ in pairs], [j for _, j in pairs]
    A, B = ra.pattern(4)[0, 6].double().numpy(), rb.pattern(4)[0, 6].double().numpy()
    expected = B[np.ix_(pb, pb)] - A[np.ix_(pa, pa)]
    low = np.tril(np.ones_like(expected, dtype=bool))
    np.testing.assert_allclose(decode(trace(by_id(at, "compare_attention"), "B-A")["z"])[low], expected[low], atol=1e-6)
    z = decode(by_id(run_app(view="residual", **q), "compare_change_map")["data"][0]["z"])
    xa, xb = ra["blocks.5.hook_resid_post"][0, pa].double(), rb["blocks.5.hook_resid_post"][0, pb].double()
    np.testing.assert_allclose(z[-1], ((xb - xa).norm(dim=-1) / xa.norm(dim=-1)).numpy(), rtol=1e-6)
    bad = run_app(view="attention", **{**q, "cmp_align": "0-0, 1-1, 1-2"})
    assert not bad.exception and "aligned twice" in bad.warning[0].value


def test_a_long_prompt_shows_a_window_around_the_token():
    text = " ".join([LINE] * 8)
    (ids, ra), (_, rb) = recorded("tiny-pre", text), recorded("tiny-pre", text, ["no-rope"])
    n, token = len(ids), 40
    assert n > 2 * 24 + 1
    at = run_app(view="attention", model="tiny-pre", prompt=text, cmp="whatif", cmp_iv="no-rope", layer=1, head=0,
                 token=token)
    fig = by_id(at, "compare_attention")
    lo, hi = token - 24, token + 25
    A, B = ra.pattern(1)[0, 0].double().numpy()[lo:hi, lo:hi], rb.pattern(1)[0, 0].double().numpy()[lo:hi, lo:hi]
    low = np.tril(np.ones_like(A, dtype=bool))
    for meta, expected in (("A", A), ("B", B), ("B-A", B - A)):
        z = decode(trace(fig, meta)["z"])
        assert z.shape == (49, 49)
        np.testing.assert_allclose(z[low], expected[low], atol=1e-6)
    assert trace(fig, "A")["x"][24].startswith(f"{token}:") and f"{n}-token prompt" in all_text(at)


def test_attention_a_b_and_the_difference_are_the_recordings(twins):
    at = run_app(view="attention", **TWINS)
    (_, ra), (_, rb) = twins
    fig = by_id(at, "compare_attention")
    pa, pb = ra.pattern(2)[0, 3].double().numpy(), rb.pattern(2)[0, 3].double().numpy()
    low = np.tril(np.ones_like(pa, dtype=bool))
    za, zb, zd = (decode(trace(fig, m)["z"]) for m in ("A", "B", "B-A"))
    np.testing.assert_allclose(za[low], pa[low], atol=1e-6)
    np.testing.assert_allclose(zb[low], pb[low], atol=1e-6)
    np.testing.assert_allclose(zd[low], (pb - pa)[low], atol=1e-6)  # B − A from the two recordings
    assert np.isnan(za[~low]).all() and np.isnan(zd[~low]).all()  # the future stays blank
    assert fig["layout"]["coloraxis"]["cmin"] == 0 and fig["layout"]["coloraxis"]["cmax"] == 1  # one scale for A, B
    js = decode(trace(by_id(at, "compare_attention_js"), "js")["y"])
    np.testing.assert_allclose(js, js_rows(pa, pb), atol=1e-9)
    files = capture_downloads(at, ["compare_attention.csv"])
    rows = list(csv.DictReader(io.StringIO(files["compare_attention.csv"])))
    for side, p in (("A", pa), ("B", pb)):
        got = {(int(r["query"]), int(r["key"])): float(r["weight"]) for r in rows if r["side"] == side}
        assert len(got) == low.sum() and got[(5, 2)] == pytest.approx(p[5, 2], abs=1e-5)


def test_pre_vs_post_residual_curves_match_the_recordings(twins):
    """Issue 13's Pre vs Post check: the residual RMS per layer of both twins, computed here from the tensors."""
    (_, ra), (_, rb) = twins
    rms_a, rms_b = stream_rms(ra), stream_rms(rb)
    for view, fig_id in (("norm", "compare_norm_stream"), ("normlab", "compare_normlab_stream")):
        at = run_app(view=view, **TWINS)
        fig = by_id(at, fig_id)
        np.testing.assert_allclose(decode(trace(fig, "A")["y"]), rms_a, rtol=1e-9)
        np.testing.assert_allclose(decode(trace(fig, "B")["y"]), rms_b, rtol=1e-9)
        np.testing.assert_allclose(decode(trace(fig, "A")["x"]), np.arange(7) / 6)
    assert rms_a[-1] > 5 * rms_a[0] and (np.diff(rms_a) > 0).all()  # Pre-Norm: the sum grows block by block
    assert (np.abs(rms_b[1:] - 1) < 0.3).all()  # Post-Norm: held near unit RMS after every block
    text = all_text(at)
    assert f"from {rms_a[0]:.2f} (the embeddings) to {rms_a[-1]:.2f}" in text
    assert f"between {rms_b[1:].min():.2f} and {rms_b[1:].max():.2f}" in text
    zh = all_text(run_app(view="residual", lang="zh", **TWINS))
    assert f"{rms_a[-1]:.2f}" in zh and "\u6bcf\u4e2a\u5757\u90fd\u4ee5 Norm \u7ed3\u675f" in zh
    norm = by_id(run_app(view="residual", **TWINS), "compare_residual_stream")
    np.testing.assert_allclose(decode(trace(norm, "A")["y"]), rms_a * 16, rtol=1e-9)  # ‖x‖ = RMS · √256


def test_norm_divisors_and_difference(twins):
    at = run_app(view="norm", **TWINS)
    (_, ra), (_, rb) = twins
    da, db = (torch.stack([r[f"blocks.{l}.ln1.hook_scale"][0, :, 0] for l in range(6)]).double().numpy() for r in (ra, rb))
    fig = by_id(at, "compare_norm")
    np.testing.assert_allclose(decode(trace(fig, "A")["z"]), da, rtol=1e-6)
    np.testing.assert_allclose(decode(trace(fig, "B")["z"]), db, rtol=1e-6)
    np.testing.assert_allclose(decode(trace(fig, "B-A")["z"]), db - da, atol=1e-5)
    lay = fig["layout"]["coloraxis"]
    assert lay["cmin"] == pytest.approx(min(da.min(), db.min()), rel=1e-6)
    assert lay["cmax"] == pytest.approx(max(da.max(), db.max()), rel=1e-6)


def test_swiglu_and_block_curves(twins):
    (_, ra), (_, rb) = twins
    at = run_app(view="swiglu", **TWINS)
    fig = by_id(at, "compare_swiglu")
    for meta, r in (("A", ra), ("B", rb)):
        closed = (r["blocks.2.mlp.hook_act"][0].abs() < 0.01).double().mean(-1).numpy()
        np.testing.assert_allclose(decode(trace(fig, meta)["y"]), closed, atol=1e-7)
    change = decode(trace(by_id(at, "compare_swiglu_change"), "B-A")["y"])
    pa, pb = ra["blocks.2.mlp.hook_post"][0].double(), rb["blocks.2.mlp.hook_post"][0].double()
    np.testing.assert_allclose(change, ((pb - pa).norm(dim=-1) / pa.norm(dim=-1)).numpy(), rtol=1e-5)
    block = by_id(run_app(view="block", **TWINS), "compare_block")
    for meta, r in (("A", ra), ("B", rb)):  # panel 0: ln1 divisor, mean over tokens; panel 5: residual RMS
        ln1 = [float(r[f"blocks.{l}.ln1.hook_scale"][0].double().mean()) for l in range(6)]
        np.testing.assert_allclose(decode(trace(block, f"{meta}:0")["y"]), ln1, rtol=1e-6)
        np.testing.assert_allclose(decode(trace(block, f"{meta}:5")["y"]), stream_rms(r), rtol=1e-9)
        rows = [r.pattern(l)[0, :, 1:].double() for l in range(6)]  # query rows ≥ 1; 0 · log 0 = 0
        entropy = [float(-(p * torch.where(p > 0, p.log(), torch.zeros_like(p))).sum(-1).mean()) for p in rows]
        np.testing.assert_allclose(decode(trace(block, f"{meta}:2")["y"]), entropy, rtol=1e-5)
        attn = by_id(run_app(view="attention", **TWINS), "compare_attention_curves")
        np.testing.assert_allclose(decode(trace(attn, f"{meta}:0")["y"]), entropy, rtol=1e-5)
        np.testing.assert_allclose(decode(trace(attn, f"{meta}:1")["y"]), [float(p[..., 0].mean()) for p in rows], rtol=1e-5)


def test_next_token_distributions_and_distance(twins):
    at = run_app(view="residual", **TWINS)
    (ids, ra), (_, rb) = twins
    p, q = (torch.softmax(r.logits[0, -1].double(), -1).numpy() for r in (ra, rb))
    fig = by_id(at, "compare_next")
    tok = load("tiny-pre").tokenizer
    top = set(np.argsort(-p)[:10]) | set(np.argsort(-q)[:10])
    shown_a = decode(trace(fig, "A")["y"])
    assert len(shown_a) == len({tok.piece(int(i)) for i in top})  # one bar per piece in either top 10
    assert shown_a.max() == pytest.approx(p.max(), rel=1e-6) and decode(trace(fig, "B")["y"]).max() == pytest.approx(q.max(), rel=1e-6)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Jensen–Shannon (nats)"] == f"{js_rows(p, q):.4f}"
    assert metrics["KL(A ‖ B) (nats)"] == f"{float((p * np.log(p / q)).sum()):.4f}"


def test_rope_off_scores_and_difference():
    """B = the same prompt with no-rope (a what-if run recorded through the gateway): the scores' B − A."""
    text = "on cat the sat The mat."
    (ids, ra), (_, rb) = recorded("tiny-pre", text), recorded("tiny-pre", text, ["no-rope"])
    at = run_app(view="rope", model="tiny-pre", prompt=text, cmp="whatif", cmp_iv="no-rope", layer=1, head=2)
    assert not at.exception and "no-rope" in all_text(at)
    fig = by_id(at, "compare_rope")
    sa, sb = ra.scores(1)[0, 2].double().numpy(), rb.scores(1)[0, 2].double().numpy()
    low = np.tril(np.ones_like(sa, dtype=bool))
    np.testing.assert_allclose(decode(trace(fig, "B")["z"])[low], sb[low], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(decode(trace(fig, "B-A")["z"])[low], sb[low] - sa[low], rtol=1e-5, atol=1e-5)
    assert np.abs(sb[low] - sa[low]).max() > 0.1  # switching RoPE off changes the scores
    heads = by_id(run_app(view="whatif", model="tiny-pre", prompt=text, cmp="whatif", cmp_iv="no-rope"), "compare_heads")
    js = decode(heads["data"][0]["z"])
    expected = js_rows(ra.pattern(1)[0, 2].double().numpy(), rb.pattern(1)[0, 2].double().numpy()).mean()
    assert js[1, 2] == pytest.approx(expected, rel=1e-6)


def test_minimal_pair_map_on_the_bank_pair(loaded):
    """Two prompts on SmolLM2 that swap three tokens: ‖Δ resid‖ / ‖resid‖ per block and aligned position."""
    ids_a, ids_b = (loaded.tokenizer.encode(t) for t in (BANK_A, BANK_B))
    ra, rb = record(loaded.model, ids_a), record(loaded.model, ids_b)
    at = run_app(view="residual", prompt=BANK_A, cmp="prompt", cmp_prompt=BANK_B)
    assert not at.exception
    fig = by_id(at, "compare_change_map")
    z = decode(fig["data"][0]["z"])
    n = min(len(ids_a), len(ids_b))
    L = loaded.model.cfg.n_layers
    xs = lambda r, k: (r[f"blocks.{k}.hook_resid_pre"] if k < L else r[f"blocks.{L - 1}.hook_resid_post"])[0, :n].double()
    expected = np.stack([((xs(rb, k) - xs(ra, k)).norm(dim=-1) / xs(ra, k).norm(dim=-1)).numpy() for k in range(L + 1)])
    assert len(ids_a) == len(ids_b) and z.shape == (L + 1, n)  # the swapped words are one token each: slot by slot
    np.testing.assert_allclose(z, expected, rtol=1e-5, atol=1e-7)
    same = [i for i in range(n) if all(a == b for a, b in zip(ids_a[:i + 1], ids_b[:i + 1]))]
    assert np.abs(z[:, same]).max() < 1e-6  # the common prefix cannot see the change
    assert sorted(fig["layout"]["meta"]["top"]) == sorted(np.argsort(-z.max(0))[:3].tolist())
    assert all(i not in same for i in fig["layout"]["meta"]["top"])


# --------------------------------------------------------------------------- the link and the switches
def test_the_url_holds_b_and_a_link_reopens_it(twins):
    at = run_app(view="attention", model="tiny-pre", prompt=LINE, layer=2, head=3)
    assert "cmp" not in at.query_params
    at.sidebar.selectbox(key="_w_cmp").set_value("model").run()
    at.sidebar.selectbox(key="_w_cmp_model").set_value("tiny-post").run()
    assert not at.exception
    params = {k: at.query_params[k] for k in at.query_params}
    assert params["cmp"] == "model" and params["cmp_model"] == "tiny-post" and "cmp_prompt" not in params
    fig = by_id(at, "compare_attention")
    again = run_app(**params)  # the copied link
    assert by_id(again, "compare_attention")["data"] == fig["data"]
    at.sidebar.selectbox(key="_w_cmp").set_value("prompt").run()
    at.sidebar.text_area(key="_w_cmp_prompt").input("Shall I compare thee to a winter's night?").run()
    assert at.query_params["cmp_prompt"] == "Shall I compare thee to a winter's night?" and "cmp_model" not in at.query_params
    at.sidebar.selectbox(key="_w_cmp").set_value("whatif").run()
    at.sidebar.text_input(key="_w_cmp_iv").input("gate-off").run()
    assert at.query_params["cmp_iv"] == "gate-off" and "gate-off" in all_text(run_app(**dict(at.query_params)))
    at.sidebar.selectbox(key="_w_cmp").set_value(None).run()
    assert not any(k.startswith("cmp") for k in at.query_params)


def test_switches_in_compare_mode_run_no_forward_pass():
    at = run_app(view="attention", **TWINS)
    for view in [v[0] for v in VIEWS]:  # every view once, so what each caches is there
        at.session_state["view"] = view
        at.run()
    n = forwards()
    for view in [v[0] for v in VIEWS]:
        at.session_state["view"] = view
        at.run()
        select(at, layer=4, head=1, token=3)
        select(at, layer=2, head=3, token=5)
        assert not at.exception
    assert forwards() == n


def test_a_bad_b_leaves_a_on_the_page():
    at = run_app(view="attention", model="tiny-pre", prompt=LINE, cmp="whatif", cmp_iv="patch:blocks.1.hook_resid_pre@2")
    assert not at.exception and len(at.warning) == 1 and "What-if" in at.warning[0].value
    assert figures(at) and not ids_of(figures(at)) & set().union(*VIEW_FIGURES.values())  # A's own view only
    at = run_app(view="attention", model="tiny-pre", prompt=LINE, cmp="whatif", cmp_iv="no-such-thing")
    assert not at.exception and "cannot run" in at.warning[0].value
    at = run_app(view="attention", model="tiny-pre", prompt=LINE, cmp="model", cmp_model="/etc/passwd")
    assert not at.exception and "not offered" in at.sidebar.warning[0].value


def test_b_recording_downloads_as_npz():
    """The sidebar's B download: the what-if run's tensors, equal to a recording made here with the intervention."""
    text = "on cat the sat The mat."
    _, rb = recorded("tiny-pre", text, ["no-rope"])
    at = run_app(view="rope", model="tiny-pre", prompt=text, cmp="whatif", cmp_iv="no-rope")
    data = capture_downloads(at, ["recording_B.npz"])["recording_B.npz"]
    with np.load(io.BytesIO(data)) as z:
        np.testing.assert_allclose(z["blocks.1.attn.hook_rot_q"], rb["blocks.1.attn.hook_rot_q"].numpy(), atol=1e-6)
        np.testing.assert_array_equal(z["blocks.1.attn.hook_rot_q"], z["blocks.1.attn.hook_q"])  # not rotated


def test_a_view_of_a_below_keeps_its_downloads(twins):
    at = run_app(view="attention", **TWINS)
    at.sidebar.toggle(key="cmp_full").set_value(True).run()
    files = capture_downloads(at, ["compare_attention.csv", "attention_L2_H3_pattern.csv"])
    rows = list(csv.reader(io.StringIO(files["attention_L2_H3_pattern.csv"])))
    (_, ra), _ = twins
    assert float(rows[6][3]) == pytest.approx(float(ra.pattern(2)[0, 3, 5, 2]), abs=1e-5)


@pytest.mark.parametrize("key, model, view, b", [
    ("compare_bank", "smollm2", "residual", ("cmp_prompt", BANK_B)),
    ("compare_twins", "tiny-pre", "norm", ("cmp_model", "tiny-post")),
    ("compare_rope", "smollm2", "attention", ("cmp_iv", "no-rope")),
])
def test_compare_presets_land_on_their_lesson(key, model, view, b):
    """Each comparison preset sets A, B and the view, and says what to look for with numbers found on the pair,
    checked here against the two recordings."""
    from app.presets import BY_KEY

    at = run_app()
    at.sidebar.selectbox(key="preset").set_value(key).run()
    assert not at.exception and not at.error
    q = at.query_params
    assert q["model"] == model and q["view"] == view and q[b[0]] == b[1] and q["prompt"] == BY_KEY[key].prompt
    assert at.get("plotly_chart") and "Compare" in all_text(at)
    lesson = at.info[0].value
    if key == "compare_rope":  # the head whose rows move most without RoPE, over every layer and head
        (_, ra), (_, rb) = recorded(model, BY_KEY[key].prompt), recorded(model, BY_KEY[key].prompt, ["no-rope"])
        js = np.array([[js_rows(ra.pattern(l)[0, h].double().numpy(), rb.pattern(l)[0, h].double().numpy()).mean()
                        for h in range(ra.cfg.n_heads)] for l in range(ra.cfg.n_layers)])
        layer, head = np.unravel_index(np.argmax(js), js.shape)
        assert (int(q["layer"]), int(q["head"])) == (layer, head)
        assert f"layer {layer}, head {head} (Jensen–Shannon {js[layer, head]:.3f} nats" in lesson
    elif key == "compare_twins":
        rms_a, rms_b = stream_rms(recorded("tiny-pre", LINE)[1]), stream_rms(recorded("tiny-post", LINE)[1])
        assert f"from {rms_a[0]:.2f} to {rms_a[-1]:.2f}" in lesson
        assert f"between {rms_b[1:].min():.2f} and {rms_b[1:].max():.2f}" in lesson
    else:  # the bank pair swaps the last three tokens: the prefix reads alike, the largest change is found
        (ia, ra), (ib, rb) = recorded(model, BANK_A), recorded(model, BANK_B)
        prefix = next(i for i, (x, y) in enumerate(zip(ia, ib)) if x != y)
        L = ra.cfg.n_layers
        last = lambda r: r[f"blocks.{L - 1}.hook_resid_post"][0].double()
        ratio = ((last(rb) - last(ra)).norm(dim=-1) / last(ra).norm(dim=-1)).numpy()
        assert int(q["token"]) == int(np.argmax(ratio)) and ratio[:prefix].max() < 1e-6
        assert f"The first {prefix} tokens" in lesson and f"= {ratio.max():.2f} after the last block" in lesson
