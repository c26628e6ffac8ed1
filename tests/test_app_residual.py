"""The Next token view (per-position loss, next-token steps, generation by ids) and the Residual stream view (norms,
contributions, the logit lens), each compared with the recording or an independent computation."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from streamlit.testing.v1 import AppTest

from apptest_util import all_text, by_id, decode, fig_with, figures, record_prompt, run_app, select, title

import app.gateway as app_explorer
from explorer_model.generate.sampling import filter_steps

pytestmark = pytest.mark.slow
PROMPT = "The animal didn't cross the street because it was too tired."


def test_loss_strip_is_the_cross_entropy(loaded):
    ids, rec = record_prompt(loaded, PROMPT)
    at = run_app(view="predict", prompt=PROMPT)
    assert not at.exception
    strip = by_id(at, "residual_loss_strip")
    z = decode(strip["data"][0]["z"])[0]
    # independent: torch's cross-entropy of the logits against the ids shifted by one
    ce = F.cross_entropy(rec.logits[0, :-1].double(), torch.tensor(ids[1:]), reduction="none").numpy()
    np.testing.assert_allclose(z, ce, rtol=0, atol=1e-4)  # float32 log-softmax over 49k logits
    assert f"{ce.mean():.3f}" in title(strip)
    assert len(strip["data"][0]["x"]) == len(ids) - 1
    # the caption's hardest position is the strip's column whose cell is darkest, named by that column's label and
    # the token written in that cell (it named the next column's label)
    worst = int(np.argmax(ce))
    column, cell = strip["data"][0]["x"][worst], strip["data"][0]["text"][0][worst]
    assert f"the hardest was at “{column}”, which had to guess “{cell}” ({ce[worst]:.2f} nats)" in all_text(at)
    # the main figure comes first on the page
    assert (figures(at)[0]["layout"].get("meta") or {}).get("id") == "residual_loss_strip"


def test_residual_matches_recording(loaded):
    ids, rec = record_prompt(loaded, PROMPT)
    at = run_app(view="residual", prompt=PROMPT, layer=3, token=2)
    assert not at.exception
    n = rec.cfg.n_layers

    norms = decode(fig_with(at, "per layer and token")["data"][0]["z"])
    pre = np.stack([rec[f"blocks.{l}.hook_resid_pre"][0].numpy() for l in range(n)]
                   + [rec[f"blocks.{n - 1}.hook_resid_post"][0].numpy()])
    np.testing.assert_allclose(norms, np.linalg.norm(pre, axis=-1), rtol=1e-5)

    contrib = fig_with(at, "How much each sub-layer adds")["data"]
    attn = np.stack([np.linalg.norm(rec[f"blocks.{l}.hook_attn_out"][0].numpy(), axis=-1) for l in range(n)])
    np.testing.assert_allclose(decode(contrib[0]["y"]), attn.mean(1), rtol=1e-5)
    np.testing.assert_allclose(decode(contrib[2]["y"]), attn[:, 2], rtol=1e-5)

    from app.context import display_piece
    from app.panels.residual import LENS_POS
    lens = fig_with(at, "Logit lens")["data"][0]
    shown = min(len(ids), LENS_POS)  # the last positions
    assert len(lens["text"]) == n and len(lens["text"][-1]) == shown
    real = rec.logits[0, -shown:].argmax(-1)
    assert lens["text"][-1] == [display_piece(loaded.tokenizer.piece(int(i))) for i in real]
    np.testing.assert_allclose(decode(lens["z"])[-1], torch.softmax(rec.logits[0, -shown:], -1).max(-1).values.numpy(),
                               rtol=1e-4)
    # the model's own prediction (the last layer's row) is drawn on top, where the caption says it is
    lens_fig = fig_with(at, "Logit lens")
    assert lens["y"][-1] == f"L{n - 1}" and lens_fig["layout"]["yaxis"].get("autorange") is True
    assert "The top row, the last layer's, is the model's real prediction." in all_text(at)

    at = run_app(view="predict", prompt=PROMPT, layer=3, token=2)
    assert not at.exception

    def check_steps(temp, k, p):
        bars = by_id(at, "residual_steps")["data"]
        s = filter_steps(rec.logits[0, -1], temp, k, p)
        top = [int(i) for i in decode(bars[0]["customdata"])]
        assert top == torch.argsort(rec.logits[0, -1], descending=True)[:15].tolist()
        for trace, probs in zip(bars, (s.raw, s.tempered, s.top_k, s.top_p)):
            np.testing.assert_allclose(decode(trace["y"]), probs[top].numpy(), rtol=1e-5, atol=1e-7)
            assert trace["name"].endswith(f"({int((probs > 0).sum())})")

    check_steps(1.0, 50, 0.9)
    at.slider(key="pred_temperature").set_value(0.7).run()
    at.number_input(key="pred_top_k").set_value(5).run()
    at.slider(key="pred_top_p").set_value(0.5).run()
    check_steps(0.7, 5, 0.5)

    before = app_explorer.FORWARDS["count"]
    select(at, layer=9, token=5, head=1)
    assert not at.exception
    assert app_explorer.FORWARDS["count"] == before


def test_take_top_token_and_undo_through_text(loaded):
    """The shell without id callables: a whole-word token goes through the prompt text."""
    prompt = "The capital of France is"
    at = run_app(view="predict", prompt=prompt)
    assert not at.exception
    at.button(key="pred_greedy").click().run()
    assert not at.exception
    assert at.session_state["prompt"] == prompt + " Paris"
    tok = loaded.tokenizer
    hist = at.session_state["pred_history"]
    assert [h["id"] for h in hist] == tok.encode(" Paris") and 0 < hist[0]["p_raw"] <= 1
    assert len(by_id(at, "residual_loss_strip")["data"][0]["x"]) == len(tok.encode(prompt))  # T - 1 positions
    at.button(key="pred_undo").click().run()
    assert at.session_state["prompt"] == prompt and not at.session_state["pred_history"]
    # sampling is reproducible: the same seed and prompt give the same token
    at.button(key="pred_sample").click().run()
    first = at.session_state["prompt"]
    at.button(key="pred_undo").click().run()
    at.button(key="pred_sample").click().run()
    assert at.session_state["prompt"] == first != prompt


# A shell that keeps the prompt as token ids and hands the view the contract's two callables.
IDS_SHELL = '''
import streamlit as st
from app import gateway
from app.context import ViewContext, display_piece
from app.panels import predict
from explorer_model.tokenizer.labels import fragment_labels

SOURCE = gateway.DEFAULT_SOURCE
facts = gateway.facts(SOURCE)
if "ids" not in st.session_state:
    st.session_state.ids = gateway.encode_prompt(SOURCE, "深度学习很", 64)[0]
    st.session_state.undo_stack = []

def append_token(i):
    st.session_state.undo_stack.append(list(st.session_state.ids))
    st.session_state.ids = list(st.session_state.ids) + [int(i)]

def undo():
    if st.session_state.undo_stack:
        st.session_state.ids = st.session_state.undo_stack.pop()

ids = list(st.session_state.ids)
rec = gateway.recording(SOURCE, tuple(ids))
ctx = ViewContext(facts=facts, rec=rec, ids=ids, pieces=[display_piece(p) for p in fragment_labels([facts.token_bytes(i) for i in ids])], layer=0, head=0,
                  token=len(ids) - 1, lang="zh", extras={"source": SOURCE, "append_token": append_token, "undo": undo})
predict.draw(ctx)
'''


def test_generation_by_ids_keeps_fragments_and_undo_restores(loaded):
    at = AppTest.from_string(IDS_SHELL, default_timeout=180).run()
    assert not at.exception
    start = list(at.session_state["ids"])
    tok = loaded.tokenizer
    for _ in range(3):  # Chinese continuations: at least one step appends part of a character
        expected = int(app_explorer.recording(app_explorer.DEFAULT_SOURCE, tuple(at.session_state["ids"])).logits[0, -1]
                       .argmax())
        at.button(key="pred_greedy").click().run()
        assert not at.exception
        assert at.session_state["ids"][-1] == expected
    ids = at.session_state["ids"]
    assert ids[:len(start)] == start and len(ids) == len(start) + 3

    def fragment(i):
        try:
            tok.token_bytes(i).decode("utf-8")
        except UnicodeDecodeError:
            return True
        return False
    assert any(fragment(i) for i in ids[len(start):])  # (有 用 + the first two bytes of a character, on SmolLM2)
    page = all_text(at) + " ".join(str(b.label) for b in at.button)
    assert "\ufffd" not in page and "\\x" not in page, page
    assert "\ufffd" not in " ".join(str(v) for v in at.dataframe[-1].value.iloc[:, 1])
    for k in range(3):
        at.button(key="pred_undo").click().run()
        assert at.session_state["ids"] == ids[:len(ids) - 1 - k]
    assert at.session_state["ids"] == start and not at.session_state["pred_history"]


def test_fragment_never_reaches_the_prompt_text():
    """Without id callables, a token that is half a character cannot be appended as text."""
    at = run_app(view="predict", prompt="深度学习很", lang="zh")
    assert not at.exception
    for _ in range(3):
        b = at.button(key="pred_greedy")
        if b.disabled:
            break
        b.click().run()
        assert "\ufffd" not in at.session_state["prompt"]
    assert "\ufffd" not in at.session_state["prompt"] and "\ufffd" not in all_text(at)


def test_residual_and_predict_chinese():
    at = run_app(view="residual", prompt="深度学习很", lang="zh")
    assert not at.exception
    assert "残差流" in all_text(at)
    assert fig_with(at, "每一层会预测")
    at = run_app(view="predict", prompt="深度学习很", lang="zh")
    assert not at.exception
    text = all_text(at)
    assert "下一个 token" in text and "除以" in text and "去除" not in text
    assert any(b.label == "撤销" for b in at.button)


def test_candidate_label_names_fragments():
    """Written by hand from UTF-8: 很 = E5 BE 88, 深 = E6 B7 B1."""
    from types import SimpleNamespace
    from app.panels.generation import candidate_label
    from explorer_model.tokenizer.labels import readable
    table = {1: b"\xe5\xbe", 2: b"\x88", 3: b"\xe6\xb7", 4: b" cat", 5: b"\x88\xe6"}
    facts = SimpleNamespace(token_bytes=table.__getitem__, piece=lambda i: readable(table[i]))  # as the tokenizer's
    assert candidate_label(facts, [1], 2) == "→很"  # completes the prompt's half character
    assert candidate_label(facts, [4], 3) == "‹E6\u00a0B7…›"  # starts a character the next token must finish
    assert candidate_label(facts, [4], 4) == "␣cat"
    assert candidate_label(facts, [1], 5) == "→很"  # completes 很, and starts another character
    table[6] = b"\xb1"  # the model's continuation after 3 finishes 深: 3 is named as the first of its two tokens
    assert candidate_label(facts, [4], 3, after=[6]) == "深·1/2"
    assert candidate_label(facts, [4], 3, after=[4]) == "‹E6\u00a0B7…›"  # a continuation that does not finish it


def test_a_candidate_that_starts_a_character_is_named_by_the_models_own_continuation():
    """深度学习很 on SmolLM2: most candidates are a character's first bytes; each is named by the character the
    model's greedy continuation writes (the tutorial's 很 → 重要 shows as 重·1/2), checked against that continuation."""
    from app import gateway
    from explorer_model.tokenizer.labels import missing_bytes

    at = run_app(view="predict", prompt="深度学习很", lang="zh")
    assert not at.exception
    fig = next(f for f in figures(at) if f["layout"]["meta"]["id"] == "residual_steps")
    labels, ids = [x.split(":", 1)[1] for x in fig["data"][0]["x"]], [int(i) for i in decode(fig["data"][0]["customdata"])]
    assert not any(v.endswith("…›") for v in labels), labels
    facts, body = gateway.facts("smollm2"), list(gateway.encode_prompt("smollm2", "深度学习很", 256)[0])
    named = [(v, c) for v, c in zip(labels, ids) if "·1/" in v]
    assert len(named) >= 5 and any(v.startswith("重") for v, _ in named), labels
    for label, c in named:
        after = gateway.continuation("smollm2", body + [c], missing_bytes(facts.token_bytes(c)))
        text = b"".join(facts.token_bytes(i) for i in [c, *after]).decode("utf-8", errors="ignore")
        assert text.startswith(label.split("·")[0]), (label, text)


def test_lens_window_shows_the_last_positions_and_widens_on_request(loaded):
    """A prompt longer than the default window: the last LENS_POS positions, then 24 when asked, each cell the top token
    and probability of final norm + unembedding applied here to the recorded resid_post (on a screen wide enough to
    show 24 cells with their text: test_app_layout.py shows a narrower one's window)."""
    from app.screen import Screen
    from app.panels.residual import LENS_POS
    text = ("One two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen"
            " eighteen nineteen twenty twenty-one twenty-two")
    ids, rec = record_prompt(loaded, text)
    assert len(ids) > 24
    m = loaded.model
    with torch.no_grad():
        resid = torch.stack([rec[f"blocks.{l}.hook_resid_post"][0] for l in range(m.cfg.n_layers)])
        probs = torch.softmax(F.linear(m.ln_final(resid), m.unembed.weight), -1).max(-1).values.numpy()
    at = run_app(view="residual", prompt=text)
    at.session_state["_screen"] = Screen(main=1600, window=1920)
    at.run()
    assert not at.exception
    for n in (LENS_POS, 24):
        if n != LENS_POS:
            at.slider(key="lens_positions").set_value(n).run()
            assert not at.exception
        lens = fig_with(at, "Logit lens")["data"][0]
        assert len(lens["x"]) == n
        np.testing.assert_allclose(decode(lens["z"]), probs[:, -n:], rtol=1e-4, atol=1e-6)


def test_continue_adds_the_greedy_tokens_as_one_step_and_undo_removes_them(loaded):
    """"Top token × n": the ids greedy decoding gives (sampling.generate, the hooked model's own forward is the
    oracle here: argmax of recording the prompt again after each token), appended as one step, one undo back."""
    prompt = "The capital of France is"
    at = run_app(view="predict", prompt=prompt)
    assert not at.exception
    start = list(at.session_state["ids"]) if "ids" in at.session_state else None
    at.number_input(key="pred_continue_n").set_value(4).run()
    at.button(key="pred_continue_greedy").click().run()
    assert not at.exception
    tok = loaded.tokenizer
    ids = tok.encode(prompt)
    for _ in range(4):  # independent: a fresh full forward per token
        with torch.no_grad():
            ids.append(int(loaded.model(torch.tensor([ids]))[0, -1].argmax()))
    assert at.session_state["prompt"] == tok.decode(ids)
    hist = at.session_state["pred_history"]
    assert len(hist) == 1 and hist[0]["n"] == 4 and hist[0]["how"] == "greedy"
    assert "× 4" in " ".join(str(v) for v in at.dataframe[-1].value.iloc[:, 2])
    at.button(key="pred_undo").click().run()
    assert at.session_state["prompt"] == prompt and not at.session_state["pred_history"]
    if start is not None:
        assert list(at.session_state["ids"]) == start


def test_a_continuation_reads_as_its_text_in_the_history(loaded):
    """A continuation of several tokens is one row of the history: the text the tokens add (a character split over
    tokens shown once, as written), and no single probability ("–", not Python's None)."""
    prompt = "深度学习很"
    at = run_app(view="predict", prompt=prompt, lang="zh")
    at.number_input(key="pred_continue_n").set_value(8).run()
    at.button(key="pred_continue_greedy").click().run()
    assert not at.exception
    tok, ids = loaded.tokenizer, loaded.tokenizer.encode(prompt)
    for _ in range(8):  # independent: a fresh full forward per token
        with torch.no_grad():
            ids.append(int(loaded.model(torch.tensor([ids]))[0, -1].argmax()))
    added = b"".join(tok.token_bytes(i) for i in ids[-8:]).decode("utf-8")  # these 8 end on a whole character
    row = at.dataframe[-1].value.iloc[-1].tolist()
    assert row[1] == added and "·" not in row[1] and row[3:] == ["–", "–"], row


def test_continue_by_sampling_is_reproducible_and_draws_with_the_views_settings(loaded):
    """The sampled run is the one generate() draws with the view's temperature, top-k, top-p and seed (the
    plumbing under test: the page's settings reach the decoder), and the same click gives the same tokens."""
    from explorer_model.generate.sampling import generate
    prompt = "Once upon a time"
    at = run_app(view="predict", prompt=prompt)
    at.number_input(key="pred_continue_n").set_value(6).run()
    at.slider(key="pred_temperature").set_value(1.5).run()
    at.number_input(key="pred_top_k").set_value(40).run()
    at.button(key="pred_continue_sampled").click().run()
    first = at.session_state["prompt"]
    ids = loaded.tokenizer.encode(prompt)
    new = generate(loaded.model, ids, 6, 1.5, 40, 0.9, 0 * 7919 + len(ids), stop_ids={loaded.tokenizer.eos_id})
    assert first == loaded.tokenizer.decode(ids + new)
    at.button(key="pred_undo").click().run()
    at.button(key="pred_continue_sampled").click().run()
    assert at.session_state["prompt"] == first != prompt
    assert at.session_state["pred_history"][-1]["how"] == "sampled"


def test_a_page_run_that_only_redraws_shows_no_spinner(loaded, monkeypatch):
    """A spinner costs a thread and two messages per page run: only work that will take time shows one (the model's
    load, the prompt's forward, the lens), so a redraw of what is cached shows none."""
    import streamlit as st

    at = run_app(prompt="The capital of France is", view="residual")
    assert not at.exception
    shown, real = [], st.spinner

    def counted(text, *args, **kwargs):
        shown.append(text)
        return real(text, *args, **kwargs)
    monkeypatch.setattr(st, "spinner", counted)
    at.run()
    assert not at.exception
    assert shown == []
    at.query_params["prompt"] = "The capital of Italy is"  # a new prompt: its forward and its lens say so
    at.session_state["prompt"] = "The capital of Italy is"
    at.run()
    assert len(shown) == 2


def test_a_step_whose_kv_cache_step_fails_still_adds_the_token(monkeypatch):
    """The step's KV-cache extension only saves the next run a forward: when it fails, the page takes the token
    and records the longer prompt whole (the log keeps the traceback), instead of showing a traceback."""
    def broken(*args):
        raise RuntimeError("a kernel refused")
    at = run_app(view="predict", model="tiny-pre", prompt="The cat sat on the")
    monkeypatch.setattr(app_explorer, "extend", broken)
    at.button(key="pred_greedy").click().run()
    assert not at.exception and len(at.session_state["pred_history"]) == 1
    assert at.session_state["prompt"] != "The cat sat on the" and by_id(at, "residual_loss_strip")
