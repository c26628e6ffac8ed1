"""The app on a deep model (32 layers × 32 heads, tiny width): the prompt's cost stated before it runs and a
refusal instead of a run that cannot fit, per-layer progress coming through the gateway, grids and the head
sweep limited to a layer range, and view switches that run nothing."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from streamlit.delta_generator import DeltaGenerator

from apptest_util import by_id, decode, fig_with, run_app

from app import gateway
from app.gateway import costs as gateway_costs
from app.i18n import t
from explorer_model import memory
from explorer_model.analysis import measures as M
from explorer_model.loaders import load
from explorer_model.recording import record

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]
PROMPT = "The capital of France is Paris, and the capital of Italy is"
DEEP = dict(num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32, hidden_size=128)


@pytest.fixture(scope="module")
def deep(tmp_path_factory):
    """(folder, loaded model) of a random 32 × 32 model saved as an HF folder."""
    from checkpoints import hf_model, save_hf

    folder = save_hf(hf_model("mha", **DEEP), tmp_path_factory.mktemp("deep") / "deep32")
    return str(folder), load(folder, dtype="float32")


def unique_bytes(rec) -> int:
    """Bytes the recording really holds, every storage once (independent of memory.recording_bytes)."""
    seen = {}
    for x in list(rec._store.values()) + [x for qk in rec._rotated.values() for x in qk]:
        seen[x.untyped_storage().data_ptr()] = x.untyped_storage().nbytes()
    return sum(seen.values())


@pytest.fixture
def progress_calls(monkeypatch):
    """Texts of every st.progress bar update during an AppTest run (a bar's own .progress calls)."""
    calls = []
    original = DeltaGenerator.progress

    def spy(self, value, text=None):
        calls.append((float(value), text))
        return original(self, value, text=text)
    monkeypatch.setattr(DeltaGenerator, "progress", spy)
    return calls


def test_the_cost_is_stated_before_running(deep):
    folder, loaded = deep
    prompt = "Tokens become vectors, and vectors become"
    at = run_app(model=folder, prompt=prompt, view="tokens")
    assert not at.exception and not at.error, [e.value for e in at.error]
    for text in (prompt, prompt + " logits"):  # the first prompt, then an edited one: each said before it runs
        ids = loaded.tokenizer.encode(text)
        size = memory.size_text(unique_bytes(record(loaded.model, ids)))
        assert t("big.cost", "en", tokens=len(ids), size=size, when=t("big.time.instant", "en")) in \
            [c.value for c in at.sidebar.caption]
        at.text_area(key="prompt").set_value(prompt + " logits").run()
    at.text_area(key="prompt").set_value(prompt).run()  # back to a recorded prompt: nothing to run
    ids = loaded.tokenizer.encode(prompt)
    size = memory.size_text(unique_bytes(record(loaded.model, ids)))
    assert t("big.cost", "en", tokens=len(ids), size=size, when=t("big.cached", "en")) in \
        [c.value for c in at.sidebar.caption]


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_a_prompt_that_cannot_fit_is_refused_without_running(deep, monkeypatch, lang):
    folder, loaded = deep
    run_app(model=folder, prompt="The capital", view="tokens")  # the model is loaded while memory is plentiful
    monkeypatch.setenv(memory.AVAILABLE_ENV, "1MB")
    before = gateway.FORWARDS["count"]
    prompt = f"Attention is all you need ({lang})"
    at = run_app(model=folder, prompt=prompt, view="tokens", lang=lang)
    assert not at.exception
    ids = loaded.tokenizer.encode(prompt)
    need = memory.size_text(unique_bytes(record(loaded.model, ids)))
    runtime = memory.runtime_bytes(loaded.cfg, len(ids), torch.float32) - memory.OVERHEAD
    assert [e.value for e in at.error] == [t("big.refused", lang, tokens=len(ids), size=need,
                                              budget=memory.size_text(max(2**20 - runtime, 0)))]
    assert gateway.FORWARDS["count"] == before and not at.get("plotly_chart")
    with pytest.raises(gateway.PromptTooBig, match=f"recording these {len(ids)} tokens would need about {need}"):
        gateway.recording(folder, ids)  # the gateway refuses too, whoever asks


def test_recording_progress_comes_through_the_gateway_once_per_layer(deep):
    folder, loaded = deep
    calls = []
    ids = loaded.tokenizer.encode("Tokens become vectors, vectors become")
    gateway.recording(folder, ids, progress=lambda done, total: calls.append((done, total)))
    assert calls == [(i, 32) for i in range(1, 33)]
    assert gateway.recording(folder, ids, progress=lambda *a: calls.append(a)) is not None and len(calls) == 32


def test_a_big_models_recording_shows_a_bar_per_layer(deep, monkeypatch, progress_calls):
    folder, _ = deep
    monkeypatch.setattr(gateway_costs, "BIG_WIDTH", 128)  # this model's width counts as big: the bar must show
    at = run_app(model=folder, prompt="A small model can still show how", view="tokens")
    assert not at.exception
    texts = [text for _, text in progress_calls]
    assert texts == [t("big.progress", "en", done=d, total=32) for d in range(1, 33)]
    assert [v for v, _ in progress_calls] == [d / 32 for d in range(1, 33)]


def overview_reference(rec, layers):
    """Entropy (nats, queries 1…) and attention to position 0, per layer and head, straight from the patterns."""
    ent, sink = [], []
    for layer in layers:
        p = rec.pattern(layer)[0].double().numpy()[:, 1:, :]  # [head, query 1.., key]
        ent.append((-(p * np.log(np.where(p > 0, p, 1.0))).sum(-1)).mean(-1))
        sink.append(p[:, :, 0].mean(-1))
    return np.array(ent), np.array(sink)


def test_grids_and_sweep_take_a_layer_range_and_views_run_nothing(deep, progress_calls):
    folder, loaded = deep
    at = run_app(model=folder, prompt=PROMPT, view="attention")
    assert not at.exception and not at.error
    ids = loaded.tokenizer.encode(PROMPT)
    rec = record(loaded.model, ids)
    ent, sink = overview_reference(rec, range(32))
    np.testing.assert_allclose(decode(by_id(at, "attn_entropy")["data"][0]["z"]), ent, atol=1e-4)
    assert t("big.grid_progress", "en", done=32, total=32) in [text for _, text in progress_calls]
    at.select_slider(key="big_overview_layers").set_value((20, 27)).run()
    ent, sink = overview_reference(rec, range(20, 28))
    np.testing.assert_allclose(decode(by_id(at, "attn_entropy")["data"][0]["z"]), ent, atol=1e-4)
    np.testing.assert_allclose(decode(by_id(at, "attn_sink")["data"][0]["z"]), sink, atol=1e-4)
    assert by_id(at, "attn_entropy")["data"][0]["y"][0].endswith("20")
    at.select_slider(key="big_link_layers").set_value((10, 13)).run()
    link = by_id(at, "attn_link")
    q, k = link["layout"]["meta"]["q"], link["layout"]["meta"]["k"]
    expected = np.stack([rec.pattern(layer)[0, :, q, k].double().numpy() for layer in range(10, 14)])
    np.testing.assert_allclose(decode(link["data"][0]["z"]), expected, atol=1e-5)
    at.button(key="attn_link_go").click().run()  # the strongest cell of the range: its layer, not its row
    layer, head = np.unravel_index(np.argmax(expected), expected.shape)
    assert (at.sidebar.slider(key="layer").value, at.sidebar.slider(key="head").value) == (10 + layer, head)

    views = ("tokens", "attention", "norm", "rope", "swiglu", "block")
    for view in views:  # first visits: the SwiGLU view records its own comparison prompts once
        at.segmented_control(key="view").set_value(view).run()
        assert not at.exception and not at.error, (view, [e.value for e in at.error])
    before = gateway.FORWARDS["count"]
    for view in views + ("attention",):
        at.segmented_control(key="view").set_value(view).run()
        assert not at.exception and not at.error, (view, [e.value for e in at.error])
    at.sidebar.slider(key="layer").set_value(31).run()
    at.sidebar.slider(key="head").set_value(31).run()
    assert gateway.FORWARDS["count"] == before  # switching views, layer and head runs no model
    np.testing.assert_allclose(decode(by_id(at, "attn_sink")["data"][0]["z"]), sink, atol=1e-4)  # range kept

    at.segmented_control(key="view").set_value("whatif").run()
    at.number_input(key="big_sweep_first").set_value(29).run()
    at.number_input(key="whatif_sweep_layers").set_value(3).run()
    progress_calls.clear()
    at.button(key="whatif_sweep_run").click().run()
    assert not at.exception and not at.error
    sweep = fig_with(at, "Which heads matter")
    z = decode(sweep["data"][0]["z"])
    assert z.shape == (3, 32)
    np.testing.assert_allclose(z, M.head_sweep(loaded.model, rec, [29, 30, 31])["delta"].numpy(), atol=1e-4)
    assert [text for _, text in progress_calls][-1] == t("whatif.block_of", "en", d=3, total=3)



def test_a_shared_server_holds_a_recording_to_its_cache_budget(deep, monkeypatch):
    folder, loaded = deep
    ids = loaded.tokenizer.encode("Grouped-query attention shares each key")
    need = unique_bytes(record(loaded.model, ids))
    monkeypatch.setenv("LLAMA_EXPLORER_CACHE_MB", str(need / 2 / 2**20))  # room for half of it
    gateway.result_cache.clear()
    try:
        local = gateway.prompt_cost(folder, ids)
        assert local["recording"] == need and not local["refused"]  # locally only free memory counts
        monkeypatch.setenv("LLAMA_EXPLORER_SHARE", "1")
        shared = gateway.prompt_cost(folder, ids)
        assert shared["budget"] == int(need / 2) and shared["refused"]  # `serve --share --cache-mb` bounds it
        with pytest.raises(gateway.PromptTooBig):
            gateway.recording(folder, ids)
    finally:
        monkeypatch.delenv("LLAMA_EXPLORER_SHARE", raising=False)
        monkeypatch.delenv("LLAMA_EXPLORER_CACHE_MB")
        gateway.result_cache.clear()  # the next test gets the default budget back
