"""Server limits a visitor cannot get around: prompt size in characters (checked before tokenizing) and the
share-mode switch that turns the lab's experiments off."""
from __future__ import annotations

import pytest
from apptest_util import all_text, forwards, run_app

from app import gateway
from explorer_model import cli
from explorer_model.lab import normlab as lab


@pytest.mark.parametrize("lang, lead", [("en", "longer than this server takes"), ("zh", "超过了本服务器的上限")])
def test_an_oversized_prompt_is_refused_before_tokenizing(monkeypatch, lang, lead):
    monkeypatch.setenv("LLAMA_EXPLORER_MAX_TOKENS", "64")  # limit = 32 characters per token of the cap
    limit = gateway.prompt_char_limit()
    assert limit == 32 * 64
    calls = []
    monkeypatch.setattr("explorer_model.tokenizer.frontend.Tokenizer.encode",
                        lambda self, *a, **k: calls.append(1) or [1])
    before = forwards()
    at = run_app(view="tokens", lang=lang, prompt="x" * (limit + 1))
    assert not at.exception
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and lead in errors[0] and f"{limit + 1:,}" in errors[0]
    assert calls == [] and forwards() == before  # nothing tokenized, nothing run


def test_a_prompt_at_the_limit_still_runs(monkeypatch):
    monkeypatch.setenv("LLAMA_EXPLORER_MAX_TOKENS", "64")
    at = run_app(view="tokens", prompt="ab " * (gateway.prompt_char_limit() // 3))
    assert not at.exception and [e.value for e in at.error] == []
    assert "only the first 64" in all_text(at)  # the token cap then applies as before


def test_no_lab_refuses_new_experiments_and_keeps_computed_ones(monkeypatch):
    rc = lab.RaceConfig(depth=2, steps=4, log_every=2, seq=8, batch=2, seed=99)
    done = gateway.lab_race(rc, None).result(timeout=300)  # computed while the lab is on
    monkeypatch.setenv("LLAMA_EXPLORER_LAB", "0")
    assert gateway.lab_race(rc, None).result() == done  # already computed: still shown
    with pytest.raises(gateway.LabDisabled):
        gateway.lab_race(lab.RaceConfig(depth=2, steps=4, log_every=2, seq=8, batch=2, seed=100), None)
    with pytest.raises(gateway.LabDisabled):
        gateway.lab_init_gradients(lab.LabOptions(), 3)


def test_serve_no_lab_sets_the_switch_for_the_server(monkeypatch, tmp_path):
    seen = {}
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))  # the shared server's room folder: not in the user's /tmp
    monkeypatch.setattr("explorer_model.cli.serve.supervise", lambda commands, envs, restart: seen.update(env=envs[0]))
    assert cli.main(["serve", "--share", "--no-lab", "--port", "8599"]) in (0, None)
    assert seen["env"]["LLAMA_EXPLORER_LAB"] == "0" and seen["env"]["LLAMA_EXPLORER_SHARE"] == "1"


def test_the_lab_view_says_when_experiments_are_off(monkeypatch):
    monkeypatch.setenv("LLAMA_EXPLORER_LAB", "0")
    gateway.result_cache().clear()  # no race of these settings computed before in this process
    at = run_app(view="normlab", prompt="To be, or not to be")
    at.button(key="lab_race_start").click().run(timeout=300)
    assert not at.exception
    assert any("--no-lab" in i.value for i in at.info)
