"""Shared (classroom) mode: visitors choose from a list and cannot load paths; recordings are bounded."""
import pytest

from apptest_util import all_text, figures, run_app
from explorer_model.recording import record


@pytest.fixture
def shared_env(monkeypatch, tmp_path):
    monkeypatch.setenv("LLAMA_EXPLORER_SHARE", "1")
    monkeypatch.setenv("LLAMA_EXPLORER_MODELS_DIR", str(tmp_path))
    monkeypatch.setenv("LLAMA_EXPLORER_MAX_TOKENS", "32")
    return tmp_path


def test_shared_mode_offers_a_list_and_refuses_paths(shared_env):
    secret = shared_env / "secret.txt"
    secret.write_text("teacher's notes")
    at = run_app(view="attention", prompt="I love machine learning.", model=str(secret))
    assert not at.exception
    assert "only offers the models in its list" in " ".join(e.value for e in at.sidebar.error)
    assert at.session_state["active_model"] == "smollm2" and figures(at)
    options = at.sidebar.selectbox(key="model_pick").options
    assert "smollm2" in options and not any("Other" in o for o in options)
    assert "model_input" not in [t.key for t in at.sidebar.text_input]  # no box to type a path


def test_shared_mode_caps_prompt_length(shared_env):
    at = run_app(view="attention", prompt="word " * 200)
    assert "only the first 32 are used" in all_text(at)


def test_recording_cache_is_bounded_in_bytes():
    from app import gateway
    from app.gateway.result_cache import ResultCache

    def rec(ids):
        return record(gateway._model("smollm2").model, list(ids))
    cache = ResultCache(budget_bytes=1)  # everything but the newest is evicted
    a = cache.get(("recording", (504, 3575)), lambda: rec((504, 3575)))
    cache.get(("recording", (504, 3575, 282)), lambda: rec((504, 3575, 282)))
    assert len(cache.keys()) == 1 and cache.stored_bytes() > 0 and cache.evictions == 1
    assert cache.get(("recording", (504, 3575)), lambda: rec((504, 3575))) is not a  # it was evicted and recomputed


def test_concurrent_visitors_share_one_forward(monkeypatch):
    import threading

    from app import gateway

    gateway.result_cache().clear()
    before = gateway.FORWARDS["count"]
    out = []
    threads = [threading.Thread(target=lambda: out.append(gateway.recording("smollm2", (1, 2, 3, 4)))) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert gateway.FORWARDS["count"] == before + 1
    assert all(r is out[0] for r in out)


def test_model_file_changed_or_removed_while_serving(ckpt, tmp_path):
    """A rewritten model file is loaded again; a vanished one gives its visitor the loader's message."""
    from app import gateway as state

    path = ckpt.write_gguf(ckpt.hf_model("gqa", seed=1), tmp_path / "m.gguf")
    first = state._model(str(path))
    assert state._model(str(path)) is first  # cached while unchanged
    old = state.recording(str(path), (1, 2, 3)).logits.clone()
    ckpt.write_gguf(ckpt.hf_model("gqa", seed=2), path)
    import os

    os.utime(path, ns=(1, 1))
    second = state._model(str(path))
    assert second is not first
    assert not torch_equal(first.model.embed.weight, second.model.embed.weight)
    new = state.recording(str(path), (1, 2, 3))  # not the old file's cached recording
    assert torch_equal(new.logits, second.model(__import__("torch").tensor([[1, 2, 3]]))) and not torch_equal(new.logits, old)
    path.unlink()
    facts, err = state.try_load(str(path))
    assert facts is None and "no such file" in err
    assert state._model("smollm2") is not None  # everybody else goes on


def torch_equal(a, b) -> bool:
    import torch

    return torch.equal(a, b)


# --------------------------------------------------------------------------- user input is shown as typed
MARKDOWN_LINK = r"(?<!\\)\[[^\]]*(?<!\\)\]\("  # [text]( … not escaped: markdown would make a link (or, after !, an image)


@pytest.mark.parametrize("share", [True, False])
@pytest.mark.parametrize("evil", ["[click here to log in](http://x)", "![i](http://x/a.png)",
                                  "<img src=http://x/a.png>", ":red[alarm] **bold** $x^2$ http://x/y"])
def test_a_rejected_model_is_echoed_as_plain_text(monkeypatch, tmp_path, share, evil):
    import re

    if share:
        monkeypatch.setenv("LLAMA_EXPLORER_SHARE", "1")
        monkeypatch.setenv("LLAMA_EXPLORER_MODELS_DIR", str(tmp_path))
    at = run_app(view="tokens", prompt="Hello.", model=evil)
    assert not at.exception
    shown = [e.value for e in at.sidebar.error]
    assert len(shown) == 1 and at.session_state["active_model"] == "smollm2"
    body = shown[0]
    assert not re.search(MARKDOWN_LINK, body), body
    assert not re.search(r"(?<!\\)[\[\]<>*$`]", body), body  # no link, image, HTML, emphasis, LaTeX, code
    assert not re.search(r"(?<!\\)://", body), body  # a bare URL would be turned into a link
    # what the visitor typed is still all there, character for character, once the escapes are read
    assert evil in re.sub(r"\\(.)", r"\1", body)


def test_shared_list_shows_names_and_refuses_symlinks_out_of_the_folder(ckpt, shared_env, tmp_path_factory):
    outside = tmp_path_factory.mktemp("outside")
    real = ckpt.write_gguf(ckpt.hf_model("gqa", seed=1), shared_env / "class.gguf")
    ckpt.write_gguf(ckpt.hf_model("gqa", seed=2), outside / "private.gguf")
    (shared_env / "escape.gguf").symlink_to(outside / "private.gguf")
    (shared_env / "inside.gguf").symlink_to(real)  # a link that stays in the folder is fine
    at = run_app(view="tokens", prompt="Hello.")
    options = at.sidebar.selectbox(key="model_pick").options
    assert "class.gguf" in options and "inside.gguf" in options and "escape.gguf" not in options
    assert not any("/" in o or "\\" in o for o in options), options  # names only, never a server path
    at = run_app(view="tokens", prompt="Hello.", model="escape.gguf")
    assert at.session_state["active_model"] == "smollm2"
    assert "only offers the models in its list" in " ".join(e.value for e in at.sidebar.error)
    at = run_app(view="tokens", prompt="Hello.", model="class.gguf")
    assert not at.exception and at.session_state["active_model"] == "class.gguf"
    assert str(shared_env) not in " ".join(str(e.value) for e in at.sidebar.get("caption"))


@pytest.mark.parametrize("share", [False, True])
def test_the_served_model_opens_every_new_page_by_its_name(monkeypatch, tmp_path, share):
    """`serve SOURCE`: a page opened at the plain address shows SOURCE, listed first by its folder's name (a
    shared server's visitors never see its path), and the page's link names it so."""
    import shutil

    from explorer_model.loaders import SERVED_ENV
    from explorer_model.paths import ASSETS

    folder = shutil.copytree(ASSETS / "tiny-post", tmp_path / "my-twin")
    monkeypatch.setenv(SERVED_ENV, str(folder))
    if share:
        monkeypatch.setenv("LLAMA_EXPLORER_SHARE", "1")
    at = run_app(view="tokens", prompt="The cat sat")
    assert not at.exception and not at.sidebar.error and at.session_state["active_model"] == "my-twin"
    assert at.sidebar.selectbox(key="model_pick").options[:2] == ["my-twin", "smollm2"]
    assert at.query_params["model"] == "my-twin" and str(tmp_path) not in all_text(at)
    assert "Post-Norm" in all_text(at)  # the twin's own description: the folder's model was loaded
