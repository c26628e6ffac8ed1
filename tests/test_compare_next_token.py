"""Compare mode's next-token comparisons and lesson key against loops written out here (the models, recordings and
js_loop are test_compare.py's)."""
import math
from collections import defaultdict

import pytest

from explorer_model.analysis.compare import (CompareError, compare_next_token, lesson_key, next_token_distances,
                                             shares_vocabulary, top_k_side_by_side)
from test_compare import all_models, recordings


@pytest.fixture(scope="module")
def models():
    return all_models()


@pytest.fixture(scope="module")
def recs(models):
    return recordings(models)


# --------------------------------------------------------------------------- next token
def softmax_list(logits):
    m = max(logits)
    e = [math.exp(x - m) for x in logits]
    s = sum(e)
    return [x / s for x in e]


def test_next_token_distances(recs):
    a, b = recs["pre"], recs["other"]
    d = next_token_distances(a, b, pos_a=-1, pos_b=4)
    p = softmax_list(a.logits[0, -1].double().tolist())
    q = softmax_list(b.logits[0, 4].double().tolist())
    m = [(x + y) / 2 for x, y in zip(p, q)]
    assert d["kl_ab"] == pytest.approx(sum(x * math.log(x / y) for x, y in zip(p, q)), rel=1e-9)
    assert d["kl_ba"] == pytest.approx(sum(y * math.log(y / x) for x, y in zip(p, q)), rel=1e-9)
    assert d["js"] == pytest.approx(0.5 * sum(x * math.log(x / z) + y * math.log(y / z) for x, y, z in zip(p, q, m)))
    assert d["tv"] == pytest.approx(0.5 * sum(abs(x - y) for x, y in zip(p, q)))
    assert next_token_distances(a, a) == pytest.approx({"kl_ab": 0, "kl_ba": 0, "js": 0, "tv": 0}, abs=1e-12)
    with pytest.raises(CompareError, match="vocabularies differ"):
        next_token_distances(a, recs["deep"])


def test_top_k_side_by_side_by_text(recs):
    a, b = recs["pre"], recs["deep"]  # 97 vs 120 ids
    piece_a = lambda i: f"w{i % 40}"  # several ids spell one text: their probabilities add up
    piece_b = lambda i: f"w{i}"
    out = top_k_side_by_side(a, b, piece_a, piece_b, k=5)
    pa, pb = defaultdict(float), defaultdict(float)
    for i, x in enumerate(softmax_list(a.logits[0, -1].double().tolist())):
        pa[piece_a(i)] += x
    for i, x in enumerate(softmax_list(b.logits[0, -1].double().tolist())):
        pb[piece_b(i)] += x
    top_a = sorted(pa, key=lambda s: -pa[s])[:5]
    top_b = sorted(pb, key=lambda s: -pb[s])[:5]
    assert [s for s, _ in out["a"]] == top_a and [s for s, _ in out["b"]] == top_b
    assert [p for _, p in out["a"]] == pytest.approx([pa[s] for s in top_a])
    texts = set(top_a) | set(top_b)
    assert {r["text"] for r in out["rows"]} == texts
    for r in out["rows"]:
        assert r["p_a"] == pytest.approx(pa.get(r["text"], 0.0)) and r["p_b"] == pytest.approx(pb.get(r["text"], 0.0))
        assert r["rank_a"] == (top_a.index(r["text"]) + 1 if r["text"] in top_a else None)
        assert r["rank_b"] == (top_b.index(r["text"]) + 1 if r["text"] in top_b else None)
    keys = [max(r["p_a"], r["p_b"]) for r in out["rows"]]
    assert keys == sorted(keys, reverse=True)
    with pytest.raises(CompareError, match="k must be"):
        top_k_side_by_side(a, b, piece_a, piece_b, k=0)


def test_compare_next_token_picks_the_view(recs):
    piece = lambda i: f"p{i}"
    shared = compare_next_token(recs["pre"], recs["post"], same_tokenizer=True, piece_a=piece, piece_b=piece)
    assert shared["kind"] == "shared_vocab" and shared["distances"] == next_token_distances(recs["pre"], recs["post"])
    other = compare_next_token(recs["pre"], recs["deep"], same_tokenizer=False, piece_a=piece, piece_b=piece, k=3)
    assert other["kind"] == "top_k" and other["distances"] is None and len(other["top_k"]["a"]) == 3
    assert shares_vocabulary(piece, lambda i: f"p{i}", 97, 97)
    assert not shares_vocabulary(piece, lambda i: "x" if i == 50 else f"p{i}", 97, 97)
    assert not shares_vocabulary(piece, piece, 97, 120)


# --------------------------------------------------------------------------- lesson key
def test_lesson_keys(recs):
    pre, post = recs["pre"], recs["post"]
    assert lesson_key(pre, post) == "pre_vs_post"
    assert lesson_key(pre, recs["pre_b"]) == "two_prompts"
    assert lesson_key(pre, pre, interventions_b=["ablate:1.2"]) == "intervention"
    assert lesson_key(pre, pre) == "identical"
    assert lesson_key(pre, recs["deep"]) == "two_models"
    assert lesson_key(pre, recs["relu"]) == "two_models"
    assert lesson_key(pre, recs["other"], source_a="ckpt-1", source_b="ckpt-2") == "two_models"  # same config
    assert lesson_key(pre, recs["pre_b"], interventions_b=["ablate:1.2"]) == "mixed"
    assert lesson_key(pre, recs["deep"], prompt_a="x", prompt_b="x") == "two_models"  # other tokenizer, same text
