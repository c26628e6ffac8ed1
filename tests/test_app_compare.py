"""Compare mode: every view draws A and B side by side, and B − A where they line up; the figures show
what the two recordings hold, computed here independently with torch from recordings made in this process.
(The link, the switches, presets and downloads: test_app_compare_state.py.)"""
from __future__ import annotations

import csv
import io

import numpy as np
import pytest
import torch

from apptest_util import all_text, by_id, decode, figures, run_app, title, trace
from compare_util import BANK_A, BANK_B, LINE, TWINS, ids_of, js_rows, load, record, recorded, stream_rms, twins  # noqa: F401
from test_app_attention import capture_downloads

from app.panels import VIEWS
from app.i18n import t

pytestmark = pytest.mark.usefixtures("one_thread")
VIEW_FIGURES = {  # the figures each view draws for the twins (same shape and length: B − A everywhere)
    "tokens": set(), "attention": {"compare_attention", "compare_attention_js", "compare_attention_curves"},
    "norm": {"compare_norm_stream", "compare_norm", "compare_norm_curves"}, "rope": {"compare_rope"},
    "swiglu": {"compare_swiglu", "compare_swiglu_change", "compare_swiglu_curves"},
    "residual": {"compare_residual_stream", "compare_change_map"}, "predict": {"compare_next"},
    "block": {"compare_block"},
    "whatif": {"compare_next", "compare_heads"}, "normlab": {"compare_normlab_stream", "compare_normlab_curves"},
}


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
    # orange marks positions holding another token: the twins read the same tokens, so the caption names none
    assert t("compare.js_caption", "en") in all_text(at) and "Orange" not in all_text(at)
    minimal_pair = run_app(view="attention", prompt="The bank of the river", cmp="prompt",
                           cmp_prompt="The bank approved the loan")
    assert t("compare.js_caption_changed", "en") in all_text(minimal_pair)
    files = capture_downloads(at, ["compare_attention.csv"])
    rows = list(csv.DictReader(io.StringIO(files["compare_attention.csv"])))
    for side, p in (("A", pa), ("B", pb)):
        got = {(int(r["query"]), int(r["key"])): float(r["weight"]) for r in rows if r["side"] == side}
        assert len(got) == low.sum() and got[(5, 2)] == pytest.approx(p[5, 2], abs=1e-5)


def test_pre_vs_post_residual_curves_match_the_recordings(twins):
    """The Pre vs Post check: the residual RMS per layer of both twins, computed here from the tensors."""
    (_, ra), (_, rb) = twins
    rms_a, rms_b = stream_rms(ra), stream_rms(rb)
    for view, fig_id in (("norm", "compare_norm_stream"), ("normlab", "compare_normlab_stream")):
        at = run_app(view=view, **TWINS)
        fig = by_id(at, fig_id)
        np.testing.assert_allclose(decode(trace(fig, "A")["y"]), rms_a, rtol=1e-9)
        np.testing.assert_allclose(decode(trace(fig, "B")["y"]), rms_b, rtol=1e-9)
        np.testing.assert_allclose(decode(trace(fig, "A")["x"]), np.arange(7) / 6)
        assert [tr["name"] for tr in fig["data"]] == ["A · tiny-pre (Pre-Norm)", "B · tiny-post (Post-Norm)"]
    assert rms_a[-1] > 5 * rms_a[0] and (np.diff(rms_a) > 0).all()  # Pre-Norm: the sum grows block by block
    assert (np.abs(rms_b[1:] - 1) < 0.3).all()  # Post-Norm: held near unit RMS after every block
    text = all_text(at)
    assert f"from {rms_a[0]:.2f} (the embeddings) to {rms_a[-1]:.2f}" in text
    assert f"between {rms_b[1:].min():.2f} and {rms_b[1:].max():.2f}" in text
    zh = all_text(run_app(view="residual", lang="zh", **TWINS))
    assert f"{rms_a[-1]:.2f}" in zh and "\u6bcf\u4e2a\u6a21\u5757\u90fd\u4ee5 Norm \u7ed3\u675f" in zh
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
    at = run_app(view="predict", **TWINS)
    (ids, ra), (_, rb) = twins
    p, q = (torch.softmax(r.logits[0, -1].double(), -1).numpy() for r in (ra, rb))
    fig = by_id(at, "compare_next")
    tok = load("tiny-pre").tokenizer
    top = set(np.argsort(-p)[:10]) | set(np.argsort(-q)[:10])
    shown_a = decode(trace(fig, "A")["x"])  # a row per candidate
    assert len(shown_a) == len({tok.piece(int(i)) for i in top})  # one bar per piece in either top 10
    assert shown_a.max() == pytest.approx(p.max(), rel=1e-6) and decode(trace(fig, "B")["x"]).max() == pytest.approx(q.max(), rel=1e-6)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Jensen–Shannon (nats)"] == f"{js_rows(p, q):.4f}"
    assert metrics["KL(A ‖ B) (nats)"] == f"{float((p * np.log(p / q)).sum()):.4f}"


def test_next_token_candidates_are_named_as_the_app_reads_them(loaded):
    """A Chinese minimal pair on SmolLM2: candidates that are pieces of a character are named as the app names them
    (generation.candidate_label), never as U+FFFD."""
    from app.facts import facts_of
    from app.panels.generation import candidate_label

    text_a, text_b = "\u6df1\u5ea6\u5b66\u4e60\u5f88", "\u6df1\u5ea6\u5b66\u4e60\u4e0d"
    ids = loaded.tokenizer.encode(text_a)
    top = record(loaded.model, ids).logits[0, -1].topk(10).indices.tolist()
    facts = facts_of("smollm2", loaded)

    def fragment(i):
        try:
            facts.token_bytes(i).decode("utf-8")
            return False
        except UnicodeDecodeError:
            return True
    pieces = [i for i in top if fragment(i)]
    y = trace(by_id(run_app(view="predict", prompt=text_a, cmp="prompt", cmp_prompt=text_b), "compare_next"), "A")["y"]
    assert pieces and all(candidate_label(facts, ids, i) in y for i in pieces)
    assert not any("\ufffd" in label for label in y)


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


def test_a_post_norm_side_s_flat_first_layer_scores_are_explained(twins):
    """The twins at layer 0: B (Post-Norm) reads its embeddings with no norm before its first attention, so its
    scores are almost flat; the caption says so with the embeddings' RMS, written out from B's recording. At another
    layer, or for the Pre-Norm side, it says nothing of the kind."""
    (_, ra), (_, rb) = twins
    embed = rb["hook_embed"][0].double()
    rms = float((torch.linalg.vector_norm(embed, dim=-1) / embed.shape[-1] ** 0.5).mean())
    assert rms < 0.1
    first = all_text(run_app(view="rope", **dict(TWINS, layer=0)))
    assert f"B is Post-Norm: no norm stands before its first attention, so layer 0 reads the embeddings as they are, " \
           f"of RMS {rms:.2f}" in first and "A is Post-Norm" not in first
    sb = rb.scores(0)[0, TWINS["head"]].double().numpy()
    sa = ra.scores(0)[0, TWINS["head"]].double().numpy()
    low = np.tril(np.ones_like(sb, dtype=bool))
    assert np.ptp(sb[low]) < 0.1 * np.ptp(sa[low])  # what the sentence explains: B's map is nearly flat
    assert "is Post-Norm" not in all_text(run_app(view="rope", **TWINS))  # layer 2


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
    assert title(fig).startswith("Minimal pair:")


def test_the_map_boxes_only_positions_that_changed():
    """A pair whose one swap sits near the end: the unchanged prefix is never named "most changed" (0.00)."""
    at = run_app(view="residual", lang="zh", prompt="小明把钱存进了银行。", cmp="prompt", cmp_prompt="小明把船停在了河岸。")
    fig = by_id(at, "compare_change_map")
    z = decode(fig["data"][0]["z"])
    top = fig["layout"]["meta"]["top"]
    assert top and all(z[:, i].max() >= 0.005 for i in top), [z[:, i].max() for i in top]
    caption = next(c.value for c in at.caption if c.value.startswith("变化最大的位置"))
    assert "(0.00)" not in caption, caption
    from app.panels.compare.common import most_changed
    assert most_changed(np.array([[0.0, 0.3, np.nan, 0.001], [0.0, 0.2, np.nan, 0.004]])) == [1]


def test_texts_say_what_the_pair_is():
    """The twins (one prompt, two models): no "minimal pair" over their residual map, no RoPE "switched off" under
    their scores; B with RoPE switched off says so."""
    stream = run_app(view="residual", **TWINS)
    assert title(by_id(stream, "compare_change_map")).startswith("‖resid of B − resid of A‖ / ‖resid of A‖")
    twins = all_text(run_app(view="rope", **TWINS))
    assert "before softmax, A and B on one colour scale." in twins and "switched off" not in twins
    off = all_text(run_app(view="rope", model="tiny-pre", prompt=LINE, cmp="whatif", cmp_iv="no-rope"))
    assert "With RoPE switched off in B (no-rope), B's scores no longer depend on the distance" in off


# --------------------------------------------------------------------------- the link and the switches


def test_the_stream_names_each_side_by_its_norm_only_when_they_differ():
    """One model against itself with its first norm switched off (a what-if pair): both sides are Pre-Norm, and
    naming B by it would call the model without that norm "Pre-Norm"."""
    at = run_app(view="norm", model="smollm2", prompt="The capital of France is", cmp="whatif",
                 cmp_iv="norm-identity:blocks.0.ln1")
    assert not at.exception
    # each side named by what it is (a legend alone says which line is which), not by a norm placement
    assert [tr["name"] for tr in by_id(at, "compare_norm_stream")["data"]] == ["A · unchanged",
                                                                               "B · norm-identity:blocks.0.ln1"]


def test_a_figure_s_legend_says_what_each_side_is():
    """Two prompts: each line named by its prompt's first words (cut, angle brackets as Plotly cannot misread
    them), so a figure read or saved alone still says which is which."""
    at = run_app(view="norm", model="tiny-pre", prompt="The bank of the river", cmp="prompt",
                 cmp_prompt="<b>The bank approved the loan to the farmer</b>")
    assert not at.exception
    names = [tr["name"] for tr in by_id(at, "compare_norm_stream")["data"]]
    assert names == ["A · “The bank of the river”", "B · “‹b›The bank approved the loan …"]
    # a minimal pair, alike far past a legend line: each named from a few words before where they differ
    at = run_app(view="norm", model="tiny-pre", prompt="The animal did not cross the street because it was too tired.",
                 cmp="prompt", cmp_prompt="The animal did not cross the street because it was too wide.")
    names = [tr["name"] for tr in by_id(at, "compare_norm_stream")["data"]]
    assert names == ["A · …it was too tired.”", "B · …it was too wide.”"]
    # a list of changes longer than a legend line: each kind once, with its count (cut, it named one norm of twelve)
    norms = ",".join(f"norm-identity:blocks.{l}.{n}" for l in range(3) for n in ("ln1", "ln2"))
    at = run_app(view="norm", model="tiny-pre", prompt="The bank of the river", cmp="whatif", cmp_iv=norms + ",no-mask")
    names = [tr["name"] for tr in by_id(at, "compare_norm_stream")["data"]]
    assert names == [f"A · {t('whatif.unchanged', 'en')}", "B · norm-identity ×6, no-mask"]
    at = run_app(view="norm", model="tiny-pre", prompt="The bank of the river", cmp="whatif", cmp_iv="gate-off,no-mask")
    assert [tr["name"] for tr in by_id(at, "compare_norm_stream")["data"]][1] == "B · gate-off,no-mask"
