"""Compare mode's state: the link holds B and reopens the same comparison, switching view, layer,
head or token runs no forward pass, a B that cannot run leaves A on the page, presets land on their lesson, and
every download holds both sides."""
from __future__ import annotations

import csv
import io

import numpy as np
import pytest

from apptest_util import all_text, by_id, decode, figures, forwards, run_app, select, trace
from compare_util import BANK_A, BANK_B, LINE, TWINS, ids_of, js_rows, recorded, stream_rms, twins  # noqa: F401
from test_app_attention import capture_downloads
from test_app_compare import VIEW_FIGURES

from app.panels import VIEWS
from app.i18n import t

pytestmark = pytest.mark.usefixtures("one_thread")
VIEW_CSVS = {"tokens": ["tokens"], "attention": ["attention"], "norm": ["norm_stream", "norm"], "rope": ["rope"],
             "swiglu": ["swiglu"], "residual": ["residual_stream", "change_map"], "predict": ["next"],
             "block": ["block"],
             "whatif": ["next", "heads"], "normlab": ["normlab_stream"]}


@pytest.mark.parametrize("view", [v[0] for v in VIEWS])
def test_every_views_csv_holds_both_sides(view):
    at = run_app(view=view, **TWINS)
    files = capture_downloads(at, [f"compare_{name}.csv" for name in VIEW_CSVS[view]])
    for name, text in files.items():
        rows = list(csv.DictReader(io.StringIO(text)))
        sides = {r["side"] for r in rows}
        assert sides == ({"B-A"} if name in ("compare_change_map.csv", "compare_heads.csv") else {"A", "B"}), name


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
    for typed, said in (("0-0, 1-1, 1-2", "有一个位置被配对了两次"), ("0-0, 3", "'3' 不是 i-j 形式的一对位置"),
                        ("0-99", "位置对 (0, 99) 超出了提示词")):  # the Chinese page in Chinese
        zh = run_app(view="attention", **{**q, "cmp_align": typed, "lang": "zh"})
        assert not zh.exception and said in zh.warning[0].value, zh.warning[0].value


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
    # it lands on the comparison's figures (sections.landing), where the page that made it showed them, not on the
    # top of the page; a link without a comparison asks for no landing
    assert again.session_state["_landing"] == 1 and "_landing" not in at.session_state
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
    at = run_app(lang="zh", view="attention", model="tiny-pre", prompt=LINE, cmp="whatif",
                 cmp_iv="patch:blocks.1.hook_resid_pre@2")  # the line in the page's language, the view named as in it
    assert len(at.warning) == 1 and t("view.whatif", "zh") in at.warning[0].value
    assert "source" not in at.warning[0].value, at.warning[0].value
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
    data = capture_downloads(at, ["recording_B.npz"])["recording_B.npz"]  # an open file, built on disk
    with np.load(data) as z:
        np.testing.assert_allclose(z["blocks.1.attn.hook_rot_q"], rb["blocks.1.attn.hook_rot_q"].numpy(), atol=1e-6)
        np.testing.assert_array_equal(z["blocks.1.attn.hook_rot_q"], z["blocks.1.attn.hook_q"])  # not rotated


def test_a_view_of_a_below_keeps_its_downloads(twins):
    at = run_app(view="attention", **TWINS)
    at.sidebar.toggle(key="cmp_full").set_value(True).run()
    files = capture_downloads(at, ["compare_attention.csv", "attention_L2_H3_pattern.csv"])
    rows = list(csv.reader(io.StringIO(files["attention_L2_H3_pattern.csv"])))
    (_, ra), _ = twins
    assert float(rows[6][3]) == pytest.approx(float(ra.pattern(2)[0, 3, 5, 2]), abs=1e-5)


def infos_in(node, key: str, inside: bool = False) -> list[str]:
    """The texts of the info boxes inside the container `key` (a keyed st.container) under `node`."""
    found = []
    for child in getattr(node, "children", {}).values():
        here = inside or str(getattr(getattr(child, "proto", None), "id", "")).endswith(f"-{key}")
        if here and child.type == "info":
            found.append(str(child.value))
        found += infos_in(child, key, here)
    return found


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
    assert infos_in(at.main, "compare_figures")[:1] == [lesson]  # at the top of where the page lands
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
    else:  # the bank pair swaps two of its last three tokens: the prefix reads alike, and of the tokens after it
        # that both prompts hold (" the"), the one its context moved most is named, never a swapped word
        (ia, ra), (ib, rb) = recorded(model, BANK_A), recorded(model, BANK_B)
        prefix = next(i for i, (x, y) in enumerate(zip(ia, ib)) if x != y)
        L = ra.cfg.n_layers
        last = lambda r: r[f"blocks.{L - 1}.hook_resid_post"][0].double()
        ratio = ((last(rb) - last(ra)).norm(dim=-1) / last(ra).norm(dim=-1)).numpy()
        shared = [i for i in range(prefix, len(ia)) if ia[i] == ib[i]]
        top = max(shared, key=lambda i: ratio[i])
        assert shared and int(q["token"]) == top and ia[top] == ib[top] and ratio[:prefix].max() < 1e-6
        assert f"The first {prefix} tokens" in lesson and f"= {ratio[top]:.2f} after the last block" in lesson
        assert "even a token both prompts hold" in lesson
