"""Each preset is a lesson: choosing it puts view, layer, head and token where its point is visible. The checks
recompute the point from the recording (or the model) here, independently of explorer_model.analysis.lesson."""
import re

import numpy as np
import pytest
import torch

from apptest_util import all_text, decode, figures, run_app
from app import gateway
from app.presets import BY_KEY


def choose(key: str, **query):
    at = run_app(**query)
    at.sidebar.selectbox(key="preset").set_value(key).run()
    assert not at.exception
    return at


def selection(at):
    s = at.session_state
    return s["view"], int(s["layer"]), int(s["head"]), int(s["token"])


def patterns(ids) -> np.ndarray:
    """[layer, head, q, k] attention weights of the app's recording."""
    rec = gateway.recording("smollm2", tuple(ids))
    return np.stack([rec.pattern(l)[0].double().numpy() for l in range(rec.cfg.n_layers)])


def app_ids(at) -> list[int]:
    tok = gateway._model("smollm2").tokenizer
    return tok.encode(at.session_state["prompt"])


def last_word_position(ids, word: str) -> int:
    """First token of the last whole-word occurrence of `word`, found from each token's decoded text."""
    tok = gateway._model("smollm2").tokenizer
    texts = [tok.decode([i]).strip().lower() for i in ids]
    return max(i for i, s in enumerate(texts) if s == word)


@pytest.mark.parametrize("key", ["coref", "bank_money", "bank_river"])
def test_link_lessons_land_on_the_strongest_head(key):
    at = choose(key, prompt="my own words")
    view, layer, head, token = selection(at)
    ids = app_ids(at)
    q_word, k_word = BY_KEY[key].args
    q, k = last_word_position(ids, q_word), last_word_position(ids, k_word)
    p = patterns(ids)[:, :, q, k]
    assert (view, token) == ("attention", q)
    assert (layer, head) == np.unravel_index(np.argmax(p), p.shape)
    if key == "coref":
        assert p[layer, head] >= 0.5  # SmolLM2: one head links "it" to "animal" with ~0.75
    # the attention view's heatmap is that head: its row `token` gives the same weight to the key
    z = decode(figures(at)[0]["data"][0]["z"])
    assert z[token, k] == pytest.approx(p[layer, head], abs=1e-4)
    assert f"{p[layer, head]:.0%}" in all_text(at)


def test_sink_lesson_finds_the_head_that_reads_the_first_token_most():
    at = choose("sink")
    view, layer, head, token = selection(at)
    ids = app_ids(at)
    share = patterns(ids)[:, :, 1:, 0].mean(-1)
    assert view == "attention" and token == len(ids) - 1
    assert (layer, head) == np.unravel_index(np.argmax(share), share.shape)
    assert share[layer, head] > 0.5
    z = decode(figures(at)[0]["data"][0]["z"])  # the view shows that head
    np.testing.assert_allclose(np.nan_to_num(z), patterns(ids)[layer, head], atol=1e-4)


def test_induction_lesson_finds_a_head_reading_the_next_token_of_the_first_copy():
    at = choose("induction")
    view, layer, head, token = selection(at)
    ids = app_ids(at)
    n, period = len(ids), 8  # eight words, each one token with its leading space
    assert ids[n - 2 * period:n - period] == ids[n - period:]
    p = patterns(ids)
    qs = np.arange(n - period, n)
    score = p[:, :, qs, qs - period + 1].mean(-1)
    assert view == "attention" and token == n - 1
    assert (layer, head) == np.unravel_index(np.argmax(score), score.shape)
    assert score[layer, head] > 0.5
    z = decode(figures(at)[0]["data"][0]["z"])  # the last token's row reads the token after its first copy
    assert z[token, n - period] == pytest.approx(p[layer, head, token, n - period], abs=1e-4)


def test_fact_lesson_points_at_the_layer_where_the_lens_settles():
    at = choose("fact")
    view, layer, head, token = selection(at)
    ids = app_ids(at)
    model = gateway._model("smollm2").model
    rec = gateway.recording("smollm2", tuple(ids))
    with torch.no_grad():  # the lens by hand: final norm and output matrix on each layer's last residual
        logits = torch.stack([model.unembed(model.ln_final(rec[f"blocks.{l}.hook_resid_post"][0, -1].float()))
                              for l in range(model.cfg.n_layers)])
    answer = int(logits[-1].argmax())
    assert gateway._model("smollm2").tokenizer.piece(answer) == " Paris"
    rank = [int((row > row[answer]).sum()) for row in logits]
    settled = min(l for l in range(len(rank)) if max(rank[l:]) < 10)
    assert (view, layer, token) == ("residual", settled, len(ids) - 1)
    assert 0 < settled < model.cfg.n_layers - 1  # a point worth showing: not the first, not only the last
    assert f"ranks {rank[0] + 1} after layer 0" in all_text(at)


def test_chinese_split_lesson_selects_a_fragment_named_by_its_character():
    at = choose("zh_split")
    view, _, _, token = selection(at)
    ids = app_ids(at)
    tok = gateway._model("smollm2").tokenizer
    first_fragment = next(i for i, t in enumerate(ids) if len(tok.token_bytes(t).decode("utf-8", "ignore"))
                          < len(tok.token_bytes(t)) or not tok.token_bytes(t).decode("utf-8", "ignore"))
    assert (view, token) == ("tokens", first_fragment)
    text = all_text(at) + " ".join(str(c.value) for c in at.sidebar.caption)
    assert "\u6df1\u00b71/3" in text
    assert not re.search(r"\\x[0-9a-f]{2}", text)  # no byte escape (LaTeX's \xrightarrow is not one)


@pytest.mark.parametrize("bos", [False, True])
def test_chinese_split_lesson_counts_the_typed_characters_and_their_tokens(bos):
    at = choose("zh_split")
    if bos:
        at.sidebar.toggle(key="bos").set_value(True).run()
    tok = gateway._model("smollm2").tokenizer
    assert bool(at.session_state["bos"]) == bos and tok.is_special(tok.bos_id)  # BOS on: a marker before the text
    typed = app_ids(at)
    assert not any(tok.is_special(i) for i in typed)
    assert f"5 characters became {len(typed)} tokens" in all_text(at)  # the marker is neither a character nor counted


def test_chat_lesson_selects_the_first_special_token():
    at = choose("chat")
    view, _, _, token = selection(at)
    tok = gateway._model("smollm2").tokenizer
    ids = app_ids(at)
    assert view == "tokens" and tok.is_special(ids[token]) and not any(tok.is_special(i) for i in ids[:token])


def test_a_preset_keeps_the_visitors_prompt_for_the_way_back():
    at = choose("bank_river", prompt="my own words")
    assert at.session_state["prompt"] == BY_KEY["bank_river"].prompt
    at.sidebar.button(key="back_to_mine").click().run()
    assert at.session_state["prompt"] == "my own words"
    assert at.query_params["prompt"] == "my own words"
    assert not [b for b in at.sidebar.button if b.key == "back_to_mine"]


def test_editing_the_presets_prompt_makes_it_the_visitors_own():
    at = choose("coref", prompt="my own words")
    assert [b for b in at.sidebar.button if b.key == "back_to_mine"]
    at.sidebar.text_area(key="prompt").set_value("The animal slept.").run()
    assert not [b for b in at.sidebar.button if b.key == "back_to_mine"]
    assert all("of its attention on" not in i.value for i in at.info)  # the lesson no longer applies


def test_another_view_chosen_ends_the_lesson_in_the_page_and_the_link():
    """The sentence is about its view's figure ("the row of 'it' in the heatmap"): another view chosen by hand
    ends the lesson, so the link no longer names it (a link naming it would reopen the lesson's view) and the
    lesson's view chosen again is the visitor's own, without the sentence; the preset chosen again brings it."""
    at = choose("coref")
    said = [i.value for i in at.info if "of its attention on" in i.value]
    assert len(said) == 1 and at.session_state["view"] == "attention" and at.query_params["lesson"] == "coref"
    at.segmented_control(key="view").set_value("rope").run()
    assert not at.exception and all("of its attention on" not in i.value for i in at.info)
    assert "lesson" not in at.query_params and at.query_params["view"] == "rope"
    at.segmented_control(key="view").set_value("attention").run()
    assert all("of its attention on" not in i.value for i in at.info) and "lesson" not in at.query_params
    at.sidebar.selectbox(key="preset").set_value("coref").run()
    assert [i.value for i in at.info if "of its attention on" in i.value] == said
