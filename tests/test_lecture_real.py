"""Every step of the shipped lectures lands on the real default model (SmolLM2, DEFAULT_SOURCE) and the twins: the
view opens without an error, a lesson's target is found and the page is on it, the numbers of the caption are the
ones the lesson computes on the model, the page lands on the step's section, and the step's link (without the
lecture) reopens the same figures and the same lesson sentence.

The steps of a lecture are tests of their own that share one page, moved on with Next as they run in order (a
step run alone opens its lecture there); every recording is cached, so a link reopened draws without a forward
pass of its own."""
from __future__ import annotations

import pytest
from apptest_util import figures, run_app

from app import gateway
from app import lecture_player as P
from app.presets import BY_KEY
from explorer_model import lecture as L

pytestmark = pytest.mark.real  # every test opens SmolLM2, the app's default model


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


LECTURES = {name: P.parse((P.SHIPPED / f"{name}.toml").read_bytes())[0] for name in ("tutorial-000", "tutorial-001")}
STEPS = [(name, i) for name, lecture in LECTURES.items() for i in range(1, len(lecture.steps) + 1)]
_PAGES: dict[str, tuple] = {}  # lecture -> (its page, the step it shows)


def page_at(name: str, i: int):
    """The lecture's page at step i: the shared page moved on with Next, or the lecture opened at i."""
    at, shown = _PAGES.get(name, (None, 0))
    if at is not None and shown == i - 1:
        at.button(key="lecture_next").click().run(timeout=600)
    elif shown != i:
        at = run_app(timeout=600, lecture=name, step=i, presenter=1)
    _PAGES[name] = (at, i)
    return at


@pytest.mark.parametrize("name, i", STEPS, ids=[f"{n}-{i}" for n, i in STEPS])
def test_a_shipped_step_lands_and_its_link_reopens_it(name, i):
    step = LECTURES[name].steps[i - 1]
    at = page_at(name, i)
    where = f"{name} step {i}"
    assert not at.exception, (where, at.exception)
    assert [e.value for e in at.error] == [], where
    assert all("truncated" not in w.value for w in at.warning), where
    ss = at.session_state
    assert ss["lecture_step"] == i - 1 and "lecture_missing" not in ss, where
    preset = BY_KEY.get(step.get("lesson"))
    assert ss["view"] == (preset.view if preset else step["view"]), where
    assert ss["active_model"] == (step.get("model") or ss["active_model"]), where
    if preset:
        check_lesson(at, step)
    else:
        shown = caption_markdown(at, step["caption"]["en"])
        assert shown == P._plain_lines(step["caption"]["en"]), where
        for k in ("layer", "head", "token"):
            if k in step:
                assert ss[k] == step[k], where
    for k, v in step.get("choices", {}).items():
        assert ss[k] == v, where
    section = step.get("section", preset.section if preset else None)
    assert at.query_params.get("section") == section, where  # the page lands on it (app/sections.py)
    link = {k: v for k, v in dict(at.query_params).items() if k not in ("lecture", "step")}
    again = run_app(timeout=600, **link)
    assert not again.exception and dict(again.query_params) == link, where
    assert figures(again) == figures(at), where  # the same figures, sent to the browser the same way
    assert [e.value for e in again.info] == [e.value for e in at.info], where  # the lesson's sentence among them


def _step(name: str, **fields) -> int:
    return next(i for i, s in enumerate(LECTURES[name].steps, 1) if all(s.get(k) == v for k, v in fields.items()))


def test_the_figures_show_what_the_captions_say():
    """Two captions that state what their figure shows without a lesson's numbers: "bank" after a salary and after
    a river opens different units from the second layer on; the first six blocks without their norms let the stream
    run away block after block (to about 10⁷ on this prompt), and it stays there."""
    import numpy as np
    from apptest_util import decode

    def curve(at, title: str, trace: int = 0):
        fig = next(f for f in figures(at)  # (a title wrapped for the screen: its lines read as one)
                   if str(f["layout"].get("title", {}).get("text", "")).replace("<br>", " ").startswith(title))
        return decode(fig["data"][trace]["y"])

    at = page_at("tutorial-000", _step("tutorial-000", view="swiglu", section="bank"))
    similarity = curve(at, "Same word, two contexts")  # cosine of the gate activations of the two "bank"s
    assert similarity[0] > 0.99 and similarity[1:].max() < 0.97 and similarity[1] < 0.9, similarity
    at = page_at("tutorial-001", _step("tutorial-001", view="norm", cmp="whatif"))
    a, b = (curve(at, "Size of the residual stream after each block", k) for k in (0, 1))
    assert a.max() < 1e3 and all(b[k + 1] > 1.5 * b[k] for k in range(1, 6)), b[:8]  # runs away block after block
    assert 1e6 < b[6] < 1e8 and np.allclose(b[6:], b[6], rtol=0.05), b  # about 10⁷, and stays


def test_a_server_prepares_every_steps_recording_in_the_background(monkeypatch):
    import threading

    from apptest_util import forwards

    gateway.result_cache().clear()
    monkeypatch.setenv("LLAMA_EXPLORER_WARM_UP", "1")
    # tutorial-001 whole; of tutorial-000 its step 7, a lesson whose preset has words as its args (coref: "it",
    # "animal"), not a comparison's state pairs
    for name, steps in (("tutorial-001", None), ("tutorial-000", [7])):
        data = (P.SHIPPED / f"{name}.toml").read_bytes() + b"\n# prepared by the test\n"
        lecture, _ = L.parse(data, P.view_keys(), P.lessons())
        P.prepare(data, lecture.steps if steps is None else [lecture.steps[i - 1] for i in steps])
        for t in threading.enumerate():
            if t.name == "lecture-prepare":
                t.join(600)
    monkeypatch.setenv("LLAMA_EXPLORER_WARM_UP", "0")
    before = forwards()
    # the pipeline's shapes; BOS then 深度学习很, each on its own tokens view; the coreference lesson's head
    for name, step, view in (("tutorial-001", 1, "tokens"), ("tutorial-001", 7, "tokens"),
                             ("tutorial-000", 7, "attention")):
        at = run_app(timeout=600, lecture=name, step=step)
        assert not at.exception and at.session_state["view"] == view, (name, step)
        assert forwards() == before, f"{name} step {step} was not prepared in the background"
