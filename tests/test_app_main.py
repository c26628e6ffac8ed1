"""The page around the views: URL state, language, prompt limits, presets, failed model loads."""
import json
import re

import numpy as np
import pytest
import torch

from apptest_util import all_text, decode, figures, run_app


def test_url_round_trip_reopens_the_same_picture():
    at = run_app(view="attention", prompt="I love machine learning.", layer=2, head=7, token=3)
    assert not at.exception
    at.sidebar.radio(key="lang").set_value("zh").run()
    at.segmented_control(key="view").set_value("attention").run()
    at.sidebar.slider(key="layer").set_value(5).run()
    qp = dict(at.query_params)
    assert qp["lang"] == "zh" and qp["view"] == "attention" and qp["layer"] == "5"
    assert qp["head"] == "7" and qp["token"] == "3" and qp["model"] == "smollm2"
    assert qp["prompt"] == "I love machine learning."
    copy = run_app(**qp)  # what a copied link opens
    assert not copy.exception
    a, b = figures(at)[0], figures(copy)[0]
    assert a["layout"]["title"]["text"] == b["layout"]["title"]["text"]
    np.testing.assert_array_equal(decode(a["data"][0]["z"]), decode(b["data"][0]["z"]))


def test_language_switch():
    at = run_app(view="tokens", prompt="深度学习很")
    assert "LLaMA Explorer" in all_text(at)
    at.sidebar.radio(key="lang").set_value("zh").run()
    assert "LLaMA 探索器" in all_text(at)
    assert not at.exception


def test_empty_and_whitespace_prompts_show_a_hint():
    for text in ("", "   \n\t "):
        at = run_app(view="attention", prompt=text if text else " ")
        assert not at.exception
        assert "Type a prompt" in all_text(at)
        assert figures(at) == []


def test_overlong_prompt_is_cut_with_a_notice():
    from app import gateway as state

    at = run_app(view="attention", prompt="word " * 400)
    assert not at.exception
    assert f"only the first {state.DEFAULT_MAX_TOKENS} are used" in all_text(at)
    z = decode(figures(at)[0]["data"][0]["z"])
    assert z.shape == (49, 49)  # the attention view shows ±24 tokens around the selected one of a long prompt
    assert f"of {state.DEFAULT_MAX_TOKENS}, around the selected token" in all_text(at)
    at.sidebar.number_input(key="max_tokens").set_value(16).run()
    assert "only the first 16 are used" in all_text(at)
    assert decode(figures(at)[0]["data"][0]["z"]).shape == (16, 16)


def test_failed_model_load_keeps_the_previous_model(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 40)
    at = run_app(view="attention", prompt="I love machine learning.")
    at.sidebar.selectbox(key="model_pick").set_value("__other__").run()
    at.sidebar.text_input(key="model_input").set_value(str(bad)).run()
    assert not at.exception
    errors = " ".join(e.value for e in at.sidebar.error)
    assert "broken.gguf" in errors and "Still using smollm2" in errors
    assert figures(at), "the previous model keeps working"
    assert at.query_params["model"] == "smollm2"
    at.sidebar.text_input(key="model_input").set_value(str(tmp_path / "missing")).run()
    assert "no such file" in " ".join(e.value for e in at.sidebar.error)


def test_bad_url_values_are_clamped_not_fatal():
    at = run_app(view="nonsense", prompt="Hi there", layer=999, head=-4, token="abc", lang="fr")
    assert not at.exception
    assert at.session_state["layer"] == 29 and at.session_state["head"] == 0 and at.session_state["token"] == 0
    assert at.session_state["view"] == "tokens" and at.session_state["lang"] == "en"


def test_preset_fills_the_prompt_and_presenter_mode_enlarges_fonts():
    at = run_app(view="attention")
    at.sidebar.selectbox(key="preset").set_value("zh_split").run()
    assert at.session_state["prompt"] == "\u6df1\u5ea6\u5b66\u4e60\u5f88"
    assert at.query_params["prompt"] == "\u6df1\u5ea6\u5b66\u4e60\u5f88"
    at.segmented_control(key="view").set_value("attention").run()
    at.sidebar.toggle(key="presenter").set_value(True).run()
    assert at.query_params["presenter"] == "1"
    fig = figures(at)[0]
    assert fig["layout"]["xaxis"]["tickfont"]["size"] >= 14 and fig["layout"]["yaxis"]["tickfont"]["size"] >= 14
    assert fig["layout"]["font"]["size"] >= 16
    copy = run_app(**dict(at.query_params))
    assert copy.session_state["presenter"] is True
    assert figures(copy)[0]["layout"]["xaxis"]["tickfont"]["size"] >= 14


def test_default_token_is_the_last_unless_the_link_says():
    at = run_app(view="attention", prompt="I love machine learning.")
    ids = tuple(int(i) for i in __import__("app.gateway", fromlist=["x"]).encode_prompt(
        "smollm2", "I love machine learning.", 256)[0])
    assert at.session_state["token"] == len(ids) - 1
    at.sidebar.text_area(key="prompt").set_value("One two three four five six seven eight nine").run()
    assert at.session_state["token"] == 8  # follows the new prompt's last token until moved by hand
    assert run_app(view="attention", prompt="I love machine learning.", token=1).session_state["token"] == 1


def test_chinese_labels_name_the_character_not_bytes():
    at = run_app(view="attention", prompt="\u6df1\u5ea6\u5b66\u4e60\u5f88")
    fig = figures(at)[0]
    assert "0:\u6df1\u00b71/3" in fig["data"][0]["x"] and "9:\u5f88\u00b72/2" in fig["data"][0]["y"]
    page = all_text(at) + json.dumps([f["data"] for f in figures(at)], ensure_ascii=False)
    assert not re.search(r"\\x[0-9a-f]{2}", page) and "\ufffd" not in page


def test_bos_toggle_prepends_the_models_bos_and_is_kept_in_the_url():
    from app import gateway

    facts = gateway.facts("smollm2")
    assert facts.bos_id is not None and not facts.add_bos  # SmolLM2 does not add one by itself
    at = run_app(view="attention", prompt="I love machine learning.")
    assert "does not put a BOS token" in " ".join(c.value for c in at.sidebar.caption)
    n = len(decode(figures(at)[0]["data"][0]["z"]))
    at.sidebar.toggle(key="bos").set_value(True).run()
    assert at.query_params["bos"] == "1"
    z = decode(figures(at)[0]["data"][0]["z"])
    assert len(z) == n + 1
    rec = gateway.recording("smollm2", (facts.bos_id, *gateway.encode_prompt("smollm2", "I love machine learning.",
                                                                               256)[0]))
    np.testing.assert_allclose(np.nan_to_num(z), rec.pattern(0)[0, 0].numpy(), atol=1e-5)  # masked: empty cells
    assert run_app(**dict(at.query_params)).session_state["bos"] is True


def test_appended_fragment_is_kept_as_ids_in_state_and_url_and_undo_returns(monkeypatch):
    import types

    from app import gateway
    from app import sidebar as side

    start = "\u6df1\u5ea6\u5b66\u4e60"
    at = run_app(view="attention", prompt=start)
    facts = gateway.facts("smollm2")
    body, _ = gateway.encode_prompt("smollm2", start, 256)
    full, _ = gateway.encode_prompt("smollm2", start + "\u5f88", 256)  # the last character is two fragments
    assert full[:-2] == body and len(full) == len(body) + 2

    def click(body_ids, name, *args):  # as a button's on_click would: in the session, then the page reruns
        with monkeypatch.context() as m:
            m.setattr(side, "st", types.SimpleNamespace(session_state=_State(at)))
            api = side.step_api(facts, body_ids)
            api[name](*args)
        at.run()
        return api
    click(body, "append_token", full[-2])
    assert at.session_state["ids"] == full[:-1]
    assert at.session_state["prompt"] == start and "\ufffd" not in at.query_params["prompt"]
    assert at.query_params["ids"] == ",".join(map(str, full[:-1]))  # the text cannot give the ids back
    assert len(decode(figures(at)[0]["data"][0]["z"])) == len(full) - 1
    assert "\ufffd" not in all_text(at)
    # the prompt now ends inside 很: its first bytes read ‹E5 BE…› in the sidebar's caption and on the axes, never
    # as Python's escapes
    shown = all_text(at) + json.dumps(figures(at), ensure_ascii=False)
    assert "\u2039E5\u00a0BE\u2026\u203a" in shown and "\\x" not in shown
    copy = run_app(**dict(at.query_params))  # the link reopens the same token ids
    assert copy.session_state["ids"] == full[:-1] and len(decode(figures(copy)[0]["data"][0]["z"])) == len(full) - 1
    assert click(full[:-1], "append_token", full[-1])["can_undo"]
    assert at.session_state["prompt"] == start + "\u5f88" and "ids" not in at.query_params  # whole again: text is enough
    click(full, "undo")
    assert at.session_state["ids"] == full[:-1]
    click(full[:-1], "undo")
    assert at.session_state["ids"] is None and at.session_state["prompt"] == start and "ids" not in at.query_params
    assert len(decode(figures(at)[0]["data"][0]["z"])) == len(body)


class _State:
    """An AppTest session's state seen the way st.session_state is seen inside a run."""

    def __init__(self, at):
        self.at = at

    def get(self, key, default=None):
        return self.at.session_state[key] if key in self.at.session_state else default

    def __getitem__(self, key):
        return self.at.session_state[key]

    def __setitem__(self, key, value):
        self.at.session_state[key] = value


def test_recording_download_works_outside_a_script_run(monkeypatch):
    """The browser fetches a download after the run: its data callable must not need st.session_state."""
    import threading
    from apptest_util import deferred_downloads
    from streamlit.runtime.state import session_state_proxy

    seen = deferred_downloads(run_app(view="tokens", prompt="I love machine learning."))
    data = seen["recording.npz"]

    def refuse(*_a, **_k):
        raise AssertionError("the download read st.session_state")
    for name in ("__getitem__", "__getattr__", "get", "__contains__"):
        monkeypatch.setattr(session_state_proxy.SessionStateProxy, name, refuse)
    out = {}
    t = threading.Thread(target=lambda: out.update(blob=data()))  # a thread with no script-run context
    t.start()
    t.join()
    npz = np.load(out["blob"])  # an open file, built on disk
    from app import gateway

    ids, _ = gateway.encode_prompt("smollm2", "I love machine learning.", 256)
    assert npz["token_ids"].ravel().tolist() == list(ids)


def test_recording_npz_holds_every_hook():
    import io

    from app import gateway as state

    ids = tuple(state._model("smollm2").tokenizer.encode("I love machine learning."))
    data = np.load(state.recording_npz("smollm2", ids))  # an open file, built on disk
    assert "blocks.29.attn.hook_pattern" in data.files and "token_ids" in data.files
    assert data["blocks.0.mlp.hook_post"].shape == (1, len(ids), 1536)
    # the file names what it holds, without the server's paths: the model, the prompt, no change
    assert json.loads(data["about"].item()) == {"model": "SmolLM2-135M-Instruct", "text": "I love machine learning.",
                                                "changes": [], "dtype": "float32"}
    changed = np.load(state.changed_recording_npz("smollm2", ids, "no-mask,ablate:blocks.3.attn.head5"))
    assert json.loads(changed["about"].item())["changes"] == ["no-mask", "ablate:blocks.3.attn.head5"]
    tiny, _ = state.encode_prompt("tiny-pre", "Hello there", 256)  # its BOS first: the text is still the typed one
    assert json.loads(np.load(state.recording_npz("tiny-pre", tiny))["about"].item())["text"] == "Hello there"


def test_share_mode_shows_every_room_address_with_a_qr_code(monkeypatch):
    from explorer_model.cli import serve as launch

    monkeypatch.setenv("LLAMA_EXPLORER_SHARE", "1")
    monkeypatch.setattr(launch, "lan_addresses", lambda: ["192.168.1.20", "10.0.0.7"], raising=False)
    at = run_app(view="tokens", prompt="Hi", presenter=1)
    assert not at.exception
    code = " ".join(c.value for c in at.code)
    assert "http://192.168.1.20:" in code and "http://10.0.0.7:" in code
    images = at.get("image")
    assert len(images) == 1 and "192.168.1.20" in images[0].proto.imgs[0].caption  # the QR code of the first


def test_long_prompt_heatmap_fills_its_column_with_labels_thinned_for_that_width():
    from app.figure_layout import HEAT_MAX_H, LABEL_ROOM
    from app.panels.attention import HEAD_SHARE
    from app.screen import DESKTOP

    at = run_app(view="attention", prompt="word " * 300)
    at.select_slider(key="attn_window").set_value(128).run()  # the widest window: 2·128 + 1 > 256 cells
    fig = figures(at)[0]
    lay, x = fig["layout"], fig["data"][0]["x"]
    assert len(x) == 256 and len(set(x)) == 256  # every cell keeps its own label for the hover
    assert "width" not in lay and "scaleanchor" not in lay["yaxis"]  # as wide as its column, on every screen
    assert lay["height"] - lay["margin"]["t"] - lay["margin"]["b"] <= HEAT_MAX_H
    shown = lay["xaxis"]["tickvals"]
    k = x.index(shown[1])
    assert 1 < k and shown == x[::k]  # every k-th label, evenly
    plot_w = DESKTOP.column(HEAD_SHARE) - lay["margin"]["l"] - lay["margin"]["r"]  # the column a desktop gives it
    assert plot_w / len(x) * k >= LABEL_ROOM * lay["xaxis"]["tickfont"]["size"]  # px per shown label, no overlap


def test_the_model_is_described_in_the_visitors_language():
    captions = {lang: run_app(view="tokens", lang=lang, prompt="Hi").sidebar.caption[0].value for lang in ("en", "zh")}
    assert "135M parameters, 30 layers" in captions["en"] and "tied input and output embeddings" in captions["en"]
    assert "135M 个参数，30 层" in captions["zh"] and "parameters" not in captions["zh"]
    twin = run_app(view="tokens", lang="zh", prompt="Hi", model="tiny-post").sidebar.caption[0].value
    assert twin.endswith("本项目的格式：Post-Norm、RMSNorm、SwiGLU · 权重类型 float32") and "native" not in twin, twin


def test_a_folder_whose_tokenizer_is_smaller_than_its_vocabulary_names_the_other_ids(tmp_path):
    """An HF folder with 320 embedding rows and a tokenizer of 300 pieces (rows padded, as many checkpoints have):
    the views that name the model's candidates (the logit lens, the next token, what-if) draw, and an id the
    tokenizer has no piece for reads "[id=N]"."""
    import checkpoints as ck

    hf = ck.hf_model("gqa", seed=0, num_hidden_layers=3, hidden_size=96, num_attention_heads=6, num_key_value_heads=2,
                     intermediate_size=160)
    with torch.no_grad():  # the padded rows' logits dwarf the others: they lead every ranking
        hf.lm_head.weight[:300] *= 0.01
        hf.lm_head.weight[300:] *= 10
    folder = ck.save_hf(hf, tmp_path / "hf")
    named = []
    for view in ("residual", "predict", "whatif"):
        at = run_app(view=view, prompt="the cat sat on the mat", model=str(folder))
        assert not at.exception and not at.error, (view, [e.value for e in list(at.exception) + list(at.error)])
        named += re.findall(r"\[id=(\d+)\]", json.dumps(figures(at), ensure_ascii=False) + all_text(at))
    assert named and all(300 <= int(i) < 320 for i in named), named


@pytest.mark.parametrize("bad, expected", [("/no/such/model.gguf", "没有这个文件或文件夹"),
                                           ("/etc/hostname", "这不是 GGUF 文件"),
                                           ("json", "配置文件（config.json 或 params.json）不是可读的 JSON"),
                                           ("list", "无法读取该模型（技术细节：")])
def test_a_failed_load_is_explained_in_chinese(tmp_path, bad, expected):
    if bad in ("json", "list"):  # a list: a class without its own sentence, the loader's line after a lead-in
        (tmp_path / "config.json").write_text("{not json" if bad == "json" else "[1, 2]")
        bad = str(tmp_path)
    at = run_app(view="tokens", lang="zh", prompt="Hi", model=bad)
    errors = [e.value for e in at.sidebar.error]
    assert len(errors) == 1 and errors[0].startswith("无法加载") and expected in errors[0], errors
