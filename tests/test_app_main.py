"""The page around the views: URL state, language, prompt limits, presets, failed model loads."""
import numpy as np

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
    from app import explorer as state

    at = run_app(view="attention", prompt="word " * 400)
    assert not at.exception
    assert f"only the first {state.DEFAULT_MAX_TOKENS} are used" in all_text(at)
    z = decode(figures(at)[0]["data"][0]["z"])
    assert z.shape == (49, 49)  # the attention view shows ±24 tokens around the selected one of a long prompt
    assert f"of {state.DEFAULT_MAX_TOKENS} (a window" in all_text(at)
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
    from app.presets import PRESETS

    idx = next(i for i, p in enumerate(PRESETS) if p[2] == "深度学习很")
    at.sidebar.selectbox(key="preset").set_value(idx).run()
    assert at.session_state["prompt"] == "深度学习很"
    assert at.query_params["prompt"] == "深度学习很"
    at.sidebar.toggle(key="presenter").set_value(True).run()
    assert figures(at)[0]["layout"]["font"]["size"] == 18


def test_recording_download_offered():
    at = run_app(view="tokens", prompt="I love machine learning.")
    labels = [b.label for b in at.sidebar.get("download_button")] if hasattr(at.sidebar, "get") else []
    assert any(".npz" in l for l in labels) or any(".npz" in str(e.proto) for e in at.get("download_button"))


def test_recording_npz_holds_every_hook():
    import io

    from app import explorer as state

    ids = tuple(state._model("smollm2").tokenizer.encode("I love machine learning."))
    data = np.load(io.BytesIO(state.recording_npz("smollm2", ids)))
    assert "blocks.29.attn.hook_pattern" in data.files and "token_ids" in data.files
    assert data["blocks.0.mlp.hook_post"].shape == (1, len(ids), 1536)
