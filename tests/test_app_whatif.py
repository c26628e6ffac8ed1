"""The What-if view: its figures show exactly what the intervention functions compute on the real model."""
import json

import numpy as np
import pytest
import torch

from apptest_util import all_text, decode, deferred_downloads, fig_with, figures, run_app, title

import app.gateway as app_explorer
from app.context import display_piece, plain
from app.i18n import t
from app.panels.whatif.bank import BANK_SOURCE, BANK_TARGET, MIN_KL
from explorer_model.analysis import measures as M
from explorer_model.recording import record

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]
PROMPT = "The cat sat on the mat. The cat sat on the mat."


def runs(loaded, text, specs, source=None):
    ids = loaded.tokenizer.encode(text)
    src = loaded.tokenizer.encode(source) if source else None
    return ids, record(loaded.model, ids), record(loaded.model, ids, interventions=specs, source_tokens=src)


def bar_ids(labels):
    return [int(x.rsplit("(", 1)[1].rstrip(")")) for x in labels]


@pytest.fixture(scope="module")
def no_mask_page():
    return run_app(view="whatif", whatif="no-mask", prompt=PROMPT, layer=2, head=3)


def test_no_mask_figures_equal_the_functions(no_mask_page, loaded):
    at = no_mask_page
    assert not at.exception
    ids, clean, changed = runs(loaded, PROMPT, ["no-mask"])
    p, q = (torch.softmax(r.logits[0, -1], -1).numpy() for r in (clean, changed))

    dist = fig_with(at, "Next-token probabilities at the last position")["data"]
    shown = bar_ids(dist[0]["y"])  # a row per candidate
    np.testing.assert_allclose(decode(dist[0]["x"]), p[shown], atol=1e-5)
    np.testing.assert_allclose(decode(dist[1]["x"]), q[shown], atol=1e-5)
    assert set(np.argsort(-p)[:10]) <= set(shown) and set(np.argsort(-q)[:10]) <= set(shown)

    moved = fig_with(at, "moved most")["data"][0]
    expected = np.argsort(-np.abs(q - p))[:10]
    assert bar_ids(moved["y"]) == expected.tolist()
    np.testing.assert_allclose(decode(moved["x"]), (q - p)[expected], atol=1e-5)

    kl = decode(fig_with(at, "KL(unchanged ‖ changed)")["data"][0]["y"])
    assert kl.shape == (30,) and kl[-1] > 0.1
    for layer in (0, 12, 29):  # written out: final norm + unembedding of each run's resid_post, KL, mean over positions
        name = f"blocks.{layer}.hook_resid_post"
        lp, lq = (torch.log_softmax(loaded.model.unembed(loaded.model.ln_final(r[name][0])), -1) for r in (clean, changed))
        assert kl[layer] == pytest.approx(float((lp.exp() * (lp - lq)).sum(-1).mean()), rel=1e-3, abs=1e-5)

    own = fig_with(at, "prompt's own next token")["data"]
    np.testing.assert_allclose(decode(own[0]["y"]), M.next_token_logprobs(clean.logits, ids).exp().numpy(), atol=1e-5)
    np.testing.assert_allclose(decode(own[1]["y"]), M.next_token_logprobs(changed.logits, ids).exp().numpy(), atol=1e-5)
    # seeing the future, the model predicts its prompt far better: the loss collapses
    metrics = {m.label: m.value for m in at.metric}
    loss0, loss1 = M.prompt_loss(clean.logits, ids), M.prompt_loss(changed.logits, ids)
    assert metrics[t("whatif.loss_on_the_prompt_unchanged", "en")] == f"{loss0:.3f}"
    assert metrics[t("whatif.loss_on_the_prompt_changed", "en")] == f"{loss1:.3f}"
    assert loss1 < 0.5 * loss0

    pair = fig_with(at, "Attention of layer 2, head 3")
    attn = pair["data"]
    assert len(attn) == 2
    # the panels say what was changed (a subplot's title is an annotation)
    assert [a["text"] for a in pair["layout"]["annotations"][:2]] == ["unchanged", "changed · no-mask"]
    before, after = decode(attn[0]["z"]), decode(attn[1]["z"])
    upper = np.triu(np.ones_like(before, dtype=bool), 1)
    assert np.isnan(before[upper]).all() and (after[upper] > 0).all()  # the changed head reads the future
    np.testing.assert_allclose(before[~upper], clean.pattern(2)[0, 3].numpy()[~upper], atol=1e-6)
    np.testing.assert_allclose(after, changed.pattern(2)[0, 3].numpy(), atol=1e-6)
    assert at.query_params["whatif"] == "no-mask"  # the link reproduces the experiment


def test_switching_layer_and_head_runs_nothing(no_mask_page):
    n = app_explorer.FORWARDS["count"]
    no_mask_page.sidebar.slider(key="head").set_value(5).run()
    no_mask_page.sidebar.slider(key="layer").set_value(7).run()
    assert not no_mask_page.exception
    assert fig_with(no_mask_page, "Attention of layer 7, head 5")
    assert app_explorer.FORWARDS["count"] == n


def test_shortened_sweep(no_mask_page, loaded):
    at = no_mask_page
    ids, clean, _ = runs(loaded, PROMPT, [])
    at.number_input(key="whatif_sweep_layers").set_value(2).run()
    n = app_explorer.FORWARDS["count"]
    at.button(key="whatif_sweep_run").click().run()
    assert not at.exception and app_explorer.FORWARDS["count"] == n + 1
    heat = fig_with(at, "Which heads matter")["data"][0]
    z = decode(heat["z"])
    assert z.shape == (2, 9)
    np.testing.assert_allclose(z, M.head_sweep(loaded.model, clean, range(2))["delta"].numpy(), atol=1e-4)
    at.sidebar.slider(key="head").set_value(1).run()  # cached: shown again without a forward
    assert fig_with(at, "Which heads matter") and app_explorer.FORWARDS["count"] == n + 1


def test_no_rope_shuffle(loaded):
    at = run_app(view="whatif", whatif="no-rope", prompt=PROMPT, layer=1, head=0)
    assert not at.exception
    attn = fig_with(at, "Attention of layer 1, head 0")["data"]
    assert len(attn) == 3  # unchanged, changed, changed on the shuffled words
    ids, _, changed = runs(loaded, PROMPT, ["no-rope"])
    np.testing.assert_allclose(np.nan_to_num(decode(attn[1]["z"])), changed.pattern(1)[0, 0].numpy(), atol=1e-6)
    table = at.dataframe[0].value
    gap = dict(zip(table.iloc[:, 0], table.iloc[:, 3]))
    assert gap["unchanged"] > 1 and gap["no-rope"] > 1e-2  # the causal mask still reveals order ...
    assert gap["no-rope,no-mask"] < 1e-3  # ... without it the last prediction ignores the order
    perm = M.shuffle_keep_last(len(ids))
    assert "Shuffled: " + " ".join(display_piece(loaded.tokenizer.piece(ids[i])) for i in perm) in all_text(at)
    # each matrix's rows are named by its own tokens: the shuffled one's by the shuffled prompt's (its rows were
    # read against the first matrix's labels, the prompt in order)
    layout = fig_with(at, "Attention of layer 1, head 0")["layout"]
    shuffled = [f"{i}:{display_piece(loaded.tokenizer.piece(ids[j]))}" for i, j in enumerate(perm)]
    assert list(attn[2]["y"]) == list(attn[2]["x"]) == shuffled != list(attn[0]["y"])
    shown = [layout[name].get("showticklabels", True) for name in ("yaxis", "yaxis2", "yaxis3")]
    assert shown == [True, False, True]


def test_bank_patch_and_chinese(loaded):
    spec = "patch:blocks.20.hook_resid_post@-1"
    at = run_app(view="whatif", whatif=spec, prompt=BANK_TARGET, lang="zh")
    assert not at.exception
    assert "哪些头重要" in all_text(at) and "施加" in all_text(at)
    assert at.text_input(key="whatif_source_text").value == BANK_SOURCE  # the other bank sentence by default
    _, clean, changed = runs(loaded, BANK_TARGET, [spec], BANK_SOURCE)
    dist = figures(at)[0]
    assert "修改前后" in title(dist)
    # the page's heading and the figure's legend name the prompt the patch copied from: a saved figure says it too
    assert f"施加 {plain(spec)} 之后（激活取自“{BANK_SOURCE}”）" in [h.value for h in at.subheader]  # (as markdown)
    changed_legend = dist["data"][1]["name"]  # the change, then (a second line) the source, cut with an ellipsis
    assert changed_legend.startswith(t("whatif.changed", "zh") + " · patch:blocks.20.hook_resid_post@-1<br>← “")
    assert changed_legend.endswith("…”") and BANK_SOURCE.startswith(changed_legend.split("“")[1][:-2])
    assert len(changed_legend.split("“")[1]) >= 40  # enough of the source to tell it from another
    # one series, no legend: the title says what was changed (the narrow figure without the source prompt)
    assert title(fig_with(at, "两次运行从哪里开始分开")).endswith(")" + changed_legend.replace("<br>", " "))
    assert title(fig_with(at, "变化最大的token")).endswith("原模型" + changed_legend.split("<br>")[0])
    shown = bar_ids(dist["data"][0]["y"])
    np.testing.assert_allclose(decode(dist["data"][1]["x"]), torch.softmax(changed.logits[0, -1], -1).numpy()[shown],
                               atol=1e-5)
    # the changed run whole, beside the sidebar's unchanged one: named so a saved file says what it holds, its
    # patched point holding the source prompt's value there (what a patch is), its logits this test's patched run's
    files = deferred_downloads(at)
    assert {"recording.npz", "recording_changed.npz"} <= set(files)
    with np.load(files["recording_changed.npz"]()) as z:
        about = json.loads(z["about"].item())
        assert about == {"model": "SmolLM2-135M-Instruct", "text": BANK_TARGET, "changes": [spec],
                         "patch_source": BANK_SOURCE, "dtype": "float32"}
        source_run = record(loaded.model, loaded.tokenizer.encode(BANK_SOURCE), names=["blocks.20.hook_resid_post"])
        np.testing.assert_allclose(z["blocks.20.hook_resid_post"][0, -1],
                                   source_run["blocks.20.hook_resid_post"][0, -1].numpy(), atol=1e-5)
        np.testing.assert_allclose(z["logits"], changed.logits.numpy(), atol=1e-4)
        np.testing.assert_allclose(z["blocks.19.hook_resid_post"], clean["blocks.19.hook_resid_post"].numpy(), atol=1e-5)


def test_bank_preset_changes_the_prediction_and_keeps_the_prompt(loaded):
    mine = "My own prompt, typed by hand."
    at = run_app(view="whatif", prompt=mine)
    assert not at.exception
    at.button(key="whatif_q_bank").click().run()
    assert not at.exception
    assert at.session_state["prompt"] == BANK_TARGET and at.session_state["my_state"]["prompt"] == mine
    spec = at.session_state["whatif"]
    layer = int(spec.split(".")[1])
    assert spec == f"patch:blocks.{layer}.hook_resid_post@-1" and at.session_state["layer"] == layer
    # measured here from two independent runs: the unchanged model and the patched one
    _, clean, changed = runs(loaded, BANK_TARGET, [spec], BANK_SOURCE)
    p, q = (torch.log_softmax(r.logits[0, -1].double(), -1) for r in (clean, changed))
    kl = float((p.exp() * (p - q)).sum())
    assert int(p.argmax()) != int(q.argmax()) and kl >= MIN_KL
    # one layer earlier the same patch does not flip it (the layer is the earliest that does)
    if layer:
        _, _, before = runs(loaded, BANK_TARGET, [f"patch:blocks.{layer - 1}.hook_resid_post@-1"], BANK_SOURCE)
        q0 = torch.log_softmax(before.logits[0, -1].double(), -1)
        flipped, kl0 = int(q0.argmax()) != int(p.argmax()), float((p.exp() * (p - q0)).sum())
        assert not (flipped and kl0 >= MIN_KL)
    text = all_text(at)
    assert f"KL {kl:.2f}" in text and display_piece(loaded.tokenizer.piece(int(q.argmax()))) in text
    # the tiles: the new top token with the old one under it, the loss unmoved (the patch is of the last position,
    # which the prompt's loss never scores) shown without an arrow, and the KL named for what it is, a mean over positions
    tiles = {m.label: m for m in at.metric}
    top = tiles["Top next token"]
    before, after = (display_piece(loaded.tokenizer.piece(int(d.argmax()))) for d in (p, q))
    # in quotes: a token such as "-" or "." alone would read as no value
    assert (top.value, top.delta) == (f"“{after}”", f"unchanged model: “{before}”")
    changed_loss = tiles[t("whatif.loss_on_the_prompt_changed", "en")]
    from streamlit.proto.Metric_pb2 import Metric

    assert changed_loss.delta == "±0.000" and changed_loss.proto.direction == Metric.MetricDirection.NONE
    assert top.proto.direction == Metric.MetricDirection.NONE  # (a token is no quantity: no arrow either)
    assert "Mean KL at the output" in tiles
    # the way back: the prompt, and the layer and interventions the lesson had set
    at.button(key="whatif_back").click().run()
    assert at.session_state["prompt"] == mine and "my_state" not in at.session_state
    assert at.session_state["layer"] == 0 and not at.session_state.get("whatif") and at.query_params["view"] == "whatif"


def test_attention_heatmaps_label_tokens(loaded):
    at = run_app(view="whatif", whatif="no-mask", prompt="I love machine learning.", layer=1, head=0)
    assert not at.exception
    ids = loaded.tokenizer.encode("I love machine learning.")
    heat = [f for f in figures(at) if f["data"] and f["data"][0]["type"] == "heatmap" and len(f["data"]) == 2][0]
    labels = [f"{i}:{display_piece(loaded.tokenizer.piece(t))}" for i, t in enumerate(ids)]
    for tr in heat["data"]:
        assert list(tr["x"]) == labels and list(tr["y"]) == labels
    assert all(heat["layout"][k].get("showticklabels", True) for k in heat["layout"] if k.startswith("xaxis"))


def test_builder_and_bad_input():
    at = run_app(view="whatif", prompt="I love machine learning.", layer=3, head=5)
    assert not at.exception and not any("Next-token" in str(f["layout"].get("title")) for f in figures(at))
    at.selectbox(key="whatif_kind").set_value("ablate-head").run()
    at.button(key="whatif_add").click().run()
    at.selectbox(key="whatif_kind").set_value("skip-mlp").run()
    at.button(key="whatif_add").click().run()
    assert not at.exception
    assert at.query_params["whatif"] == "ablate:blocks.3.attn.head5,skip:blocks.3.mlp"
    assert at.text_input(key="whatif_specs").value == "ablate:blocks.3.attn.head5,skip:blocks.3.mlp"
    assert fig_with(at, "Next-token probabilities")
    at.segmented_control(key="view").set_value("attention").run()  # the experiment survives a visit elsewhere
    assert at.query_params["whatif"] == "ablate:blocks.3.attn.head5,skip:blocks.3.mlp"
    at.segmented_control(key="view").set_value("whatif").run()
    assert at.text_input(key="whatif_specs").value == "ablate:blocks.3.attn.head5,skip:blocks.3.mlp"
    at.text_input(key="whatif_specs").set_value("ablate:blocks.99.attn").run()
    assert not at.exception and "layer 99 does not exist" in " ".join(e.value for e in at.error)
    at.text_input(key="whatif_specs").set_value("nonsense").run()
    assert "unknown intervention" in " ".join(e.value for e in at.error)
    # the Chinese page says them in Chinese (the core's refusals carry their case and values)
    zh = run_app(view="whatif", prompt="I love machine learning.", lang="zh", whatif="ablate:blocks.99.attn.head3")
    assert not zh.exception and [e.value for e in zh.error] == ["第 99 层不存在：这个模型的层是 0…29"]
    zh.text_input(key="whatif_specs").set_value("no-mask, foo").run()
    assert [e.value.split("；")[0] for e in zh.error] == ["未知的干预 'foo'"]


def test_chinese_candidates_are_readable():
    """A candidate that is part of a character is named by what it completes: no byte escapes, no U+FFFD."""
    at = run_app(view="whatif", whatif="no-mask", prompt="深度学习很", lang="zh")
    assert not at.exception
    dist = figures(at)[0]
    labels = list(dist["data"][0]["x"]) + list(figures(at)[1]["data"][0]["y"])
    assert labels and not any("\\x" in x or "\ufffd" in x for x in labels), labels
    assert any("‹" in x and "…›" in x for x in labels)  # candidates that start a character: its first bytes


@pytest.mark.parametrize("prompt", ["The capital of France is", PROMPT])
def test_the_no_mask_caption_states_what_this_run_did(loaded, prompt):
    # On the repeated sentence the future gives the answer away (the loss falls); on the short fact the model, trained
    # with the mask, is thrown by it (the loss rises). The sentence must say which, with this run's numbers.
    ids, clean, changed = runs(loaded, prompt, ["no-mask"])
    loss0, loss1 = M.prompt_loss(clean.logits, ids), M.prompt_loss(changed.logits, ids)
    own0 = M.next_token_logprobs(clean.logits, ids).exp().numpy().mean()
    own1 = M.next_token_logprobs(changed.logits, ids).exp().numpy().mean()
    text = all_text(run_app(view="whatif", whatif="no-mask", prompt=prompt))
    verb = "falls" if loss1 < loss0 else "rises"
    assert f"the loss {verb} from {loss0:.2f} to {loss1:.2f}" in text
    assert f"from {own0:.2g} to {own1:.2g}" in text  # probabilities to two significant digits
    assert "the loss " + ("rises" if verb == "falls" else "falls") not in text
    if prompt != PROMPT:
        assert verb == "rises"  # the case a fixed sentence would get wrong
    else:
        assert verb == "falls"


def test_the_no_mask_caption_key_follows_the_loss():
    from app.panels.whatif import no_mask_lesson

    assert [k for k, _ in no_mask_lesson(3.0, 1.0, [0.1], [0.9])] == ["whatif.no_mask_loss_falls"]
    [(key, values)] = no_mask_lesson(3.69, 4.89, [0.3, 0.2], [0.01, 0.03])
    assert key == "whatif.no_mask_loss_rises" and values == {"loss0": "3.69", "loss1": "4.89", "p0": "0.25", "p1": "0.02"}
    # a random model: the loss hardly moves, and its tiny probabilities are not written 0.00
    [(key, values)] = no_mask_lesson(8.34, 8.31, [2.1e-4, 2.3e-4], [2.4e-4, 2.6e-4])
    assert key == "whatif.no_mask_loss_same" and (values["p0"], values["p1"]) == ("0.00022", "0.00025")
    # the loss falls while the mean p falls too: no claim that the model reads the answer from the future
    assert [k for k, _ in no_mask_lesson(4.06, 3.21, [0.21], [0.17])] == ["whatif.no_mask_loss_mixed"]
    assert no_mask_lesson(4.06, 3.21, [0.21], [0.17], ["no-rope"])[0] == ("whatif.no_mask_with_others",
                                                                         {"others": "no-rope"})


def test_without_rope_and_mask_the_caption_names_both_and_claims_no_rise_that_did_not_happen(loaded):
    """Both changes lower this prompt's loss but also its mean p(own next token): the caption says the run changes
    more than the mask, and does not say the mean p rose or that the model read the answer from the future."""
    prompt = "The animal didn't cross the street because it was too tired."  # the app's first prompt
    ids, clean, changed = runs(loaded, prompt, ["no-rope", "no-mask"])
    loss0, loss1 = M.prompt_loss(clean.logits, ids), M.prompt_loss(changed.logits, ids)
    own0 = M.next_token_logprobs(clean.logits, ids).exp().numpy().mean()
    own1 = M.next_token_logprobs(changed.logits, ids).exp().numpy().mean()
    assert loss1 < loss0 and own1 < own0  # the case a sentence keyed on the loss alone got wrong
    values = dict(loss0=f"{loss0:.2f}", loss1=f"{loss1:.2f}", p0=f"{own0:.2g}", p1=f"{own1:.2g}")
    for lang in ("en", "zh"):
        text = all_text(run_app(view="whatif", whatif="no-rope,no-mask", prompt=prompt, lang=lang))
        assert t("whatif.no_mask_with_others", lang, others="no-rope") + " " + \
            t("whatif.no_mask_loss_mixed", lang, **values) in text
        assert t("whatif.no_mask_loss_falls", lang, **values) not in text


def test_a_typed_source_survives_a_spec_that_did_not_parse():
    """The source box is hidden while the spec is wrong; fixed, it shows (and the run uses) the source typed before,
    the one the page's link holds, not the bank sentence it was first given."""
    typed = "The bank near the river collapsed."
    at = run_app(view="whatif", prompt=BANK_TARGET)
    at.text_input(key="whatif_specs").set_value("patch:blocks.20.hook_resid_post@-1").run()
    at.text_input(key="whatif_source_text").set_value(typed).run()
    at.text_input(key="whatif_specs").set_value("patch:blocks.40.hook_resid_post@-1").run()
    assert at.error and not [w for w in at.text_input if w.key == "whatif_source_text"]
    at.text_input(key="whatif_specs").set_value("patch:blocks.20.hook_resid_post@-1").run()
    assert not at.exception and not at.error
    assert at.text_input(key="whatif_source_text").value == typed == at.session_state["whatif_source"]
    assert any(typed in h.value for h in at.subheader)
