"""Every step of the shipped lectures lands on the real default model (SmolLM2, DEFAULT_SOURCE) and the twins: the
view opens without an error, a lesson's target is found and the page is on it, and the numbers of the caption are
the ones the lesson computes on the model."""
from __future__ import annotations

import pytest
from apptest_util import run_app

from app import gateway
from app import lecture_player as P
from app.presets import BY_KEY
from explorer_model import lecture as L


def caption_markdown(at, template: str) -> str:
    first = L.PLACEHOLDER.split(template)[0][:20]  # the caption's text before its first placeholder
    found = [m.value for m in at.markdown if P._plain_lines(first) in m.value]
    assert found, f"caption not shown: {template[:60]}"
    return found[0]


def check_lesson(at, step: dict) -> None:
    preset = BY_KEY[step["lesson"]]
    ss = at.session_state
    source = ss["active_model"]
    body, _ = gateway.encode_prompt(source, preset.prompt, 10_000)
    if preset.kind == "compare":
        target = gateway.compare_lesson(source, preset.key, tuple(body))
    else:
        target = gateway.lesson_target(source, preset.key, tuple(body))
    assert (ss["view"], ss["layer"], ss["head"]) == (target["view"], target["layer"], target["head"])
    template = step["caption"][ss["lang"] if "lang" in ss else "en"]
    shown = caption_markdown(at, template)
    for m in L.PLACEHOLDER.finditer(template):
        name = m.group(1)
        if name in target["values"]:  # the model's own number, formatted as the caption asks
            assert P._plain_lines(format(target["values"][name], m.group(2) or "")) in shown, (name, shown)
    assert "{" not in shown


@pytest.mark.parametrize("name", ["tutorial-000", "tutorial-001"])
def test_every_step_of_a_shipped_lecture_lands(name):
    lecture, found = L.parse((P.SHIPPED / f"{name}.toml").read_bytes(), P.view_keys(), P.lessons())
    assert found == []
    at = run_app(timeout=600, lecture=name, step=1, presenter=1)
    for i, step in enumerate(lecture.steps, 1):
        if i > 1:
            at.button(key="lecture_next").click().run(timeout=600)
        where = f"{name} step {i}"
        assert not at.exception, (where, at.exception)
        assert [e.value for e in at.error] == [], where
        assert not at.warning or all("truncated" not in w.value for w in at.warning), where
        ss = at.session_state
        assert ss["lecture_step"] == i - 1 and "lecture_missing" not in ss, where
        expected_view = BY_KEY[step["lesson"]].view if "lesson" in step else step["view"]
        assert ss["view"] == expected_view, where
        assert ss["active_model"] == (step.get("model") or ss["active_model"]), where
        if "lesson" in step:
            check_lesson(at, step)
        else:
            shown = caption_markdown(at, step["caption"]["en"])
            assert shown == P._plain_lines(step["caption"]["en"]), where
            for k in ("layer", "head", "token"):
                if k in step:
                    assert ss[k] == step[k], where
        for k, v in step.get("choices", {}).items():
            assert ss[k] == v, where


def test_a_server_prepares_every_steps_recording_in_the_background(monkeypatch):
    import threading

    from apptest_util import forwards

    gateway.result_cache().clear()
    monkeypatch.setenv("LLAMA_EXPLORER_WARM_UP", "1")
    data = (P.SHIPPED / "tutorial-001.toml").read_bytes() + b"\n# prepared by the test\n"
    lecture, _ = L.parse(data, P.view_keys(), P.lessons())
    P.prepare(data, lecture.steps)
    for t in threading.enumerate():
        if t.name == "lecture-prepare":
            t.join(600)
    monkeypatch.setenv("LLAMA_EXPLORER_WARM_UP", "0")
    before = forwards()
    for step in (1, 7):  # the pipeline's shapes; BOS then 深度学习很, each on its own tokens view
        at = run_app(timeout=600, lecture="tutorial-001", step=step)
        assert not at.exception and at.session_state["view"] == "tokens"
    assert forwards() == before  # both opened from the recordings prepared in the background
