"""The views' choices (explorer_model/view_choices.py): every value a view offers goes into a link and back
unchanged, what no view offers is refused, and the table agrees with the views and the docs."""
from __future__ import annotations

from pathlib import Path

import pytest

from explorer_model import view_choices as VC

ROOT = Path(__file__).resolve().parents[1]


def offered_values(key: str) -> list:
    c = VC.CHOICES[key]
    if c.kind == "one_of":
        return list(c.values)
    if c.kind == "bool":
        return [False, True]
    if c.kind == "text":
        return ["", "The bank & the river: 100% = ok?", "深度学习很"]
    if c.kind == "ints":
        return [[], [int(c.lo)], [int(c.lo), int(c.lo) + 3]]
    if c.kind == "pair":
        return [(int(c.lo), int(c.lo)), (int(c.lo) + 1, int(c.lo) + 7)]
    lo, hi = c.lo, min(c.hi, 10_000)
    return [lo, hi, (lo + hi) / 2 if c.kind == "float" else int((lo + hi) // 2)]


@pytest.mark.parametrize("key", list(VC.CHOICES))
def test_every_offered_value_goes_through_a_link_unchanged(key):
    c = VC.CHOICES[key]
    values = offered_values(key) + ([] if c.default is None else [c.default])
    for value in values:
        assert VC.check(key, value), (key, value)
        text = VC.to_text(key, value)
        back = VC.from_text(key, text)
        assert back == VC.native(key, value) and type(back) is type(VC.native(key, value)), (key, value, text, back)


@pytest.mark.parametrize("key, text", [
    ("attn_kind", "both"), ("attn_kind", ""), ("attn_window", "5"), ("attn_window", "x"), ("norm_which", "LN1"),
    ("residual_log", "yes"), ("residual_log", "2"), ("swiglu_topk", "0"), ("swiglu_topk", "257"),
    ("swiglu_topk", "3.5"), ("pred_temperature", "nan"), ("pred_temperature", "inf"), ("pred_temperature", "-1"),
    ("pred_top_p", "hot"), ("big_link_layers", "5,2"), ("big_link_layers", "1,2,3"), ("big_link_layers", "-1,2"),
    ("rope_pairs", "1,x"), ("rope_pairs", ",".join(["1"] * (VC.MAX_INTS + 1))), ("swiglu_word", "x" * (VC.MAX_TEXT + 1)),
    ("lab_race_lr", "0.5"), ("whatif_scope", "true"), ("no_such_choice", "1"),
])
def test_what_no_view_offers_is_refused(key, text):
    assert VC.from_text(key, text) is None


def test_lecture_values_of_the_wrong_type_are_refused():
    assert not VC.check("attn_window", "24") and not VC.check("attn_window", 24.0) and VC.check("attn_window", 24)
    assert not VC.check("residual_log", 1) and not VC.check("swiglu_topk", True) and not VC.check("swiglu_word", 3)
    assert VC.check("pred_temperature", 1) and VC.native("pred_temperature", 1) == 1.0  # TOML's 1 for a number


def test_the_table_is_the_views_own():
    """The choices name the views' widgets' options; where a view keeps its own list (it needs torch, which this
    table must not import), the two agree."""
    from app.panels import VIEWS
    from app.panels.whatif import KINDS
    from explorer_model import families
    from explorer_model.lab import variants

    views = [v[0] for v in VIEWS]
    assert {c.view for c in VC.CHOICES.values()} <= set(views)
    assert list(VC.FAMILY_NAMES) == list(families.FAMILIES)
    assert VC.LAB_DEPTHS == tuple(variants.DEPTHS)
    assert tuple(KINDS) == VC.WHATIF_KINDS
    assert VC.of_view("norm") == ["norm_which"] and VC.of_view("block") == []


def test_the_docs_list_every_choice():
    assert VC.markdown() in (ROOT / "docs" / "lectures.md").read_text(encoding="utf-8")
