"""Every state is a link (app/url_state.py): each choice a view offers, changed with its widget, goes into the page's
link and comes back when the link is opened in another session — the same values, the same figures. The lesson's
sentence and the section come back too; a bad value falls back with one line. "Back to my prompt" gives the whole
state back; presenter mode keeps the presets and the selection in the main area, and a shared server's addresses
carry the lecture and the language."""
from __future__ import annotations

import pytest

from apptest_util import all_text, figures, run_app
from app.presets import PRESETS
from explorer_model import view_choices as VC

pytestmark = pytest.mark.real  # the pages open SmolLM2, the app's default model

SHORT = "The capital of France is Paris."
LONG = "The capital of France is Paris, and the capital of Italy is Rome. The capital of Spain is"  # > 16 tokens
WIDGETS = ("radio", "selectbox", "select_slider", "slider", "number_input", "text_input", "toggle", "multiselect")
# a button whose result stays on the page, and the choice it sets
BUTTON_FLAGS = {"tokens_bos_go": "tokens_bos_compare", "whatif_sweep_run": "whatif_sweep_shown",
                "lab_init_run": "lab_init_go", "swiglu_pw_run": "swiglu_pw_go"}
WHATIF = ("whatif", SHORT)
# (view, prompt, what the visitor does: (widget key, value), or (button key, None)), in order
SCENARIOS = {
    "tokens": ("tokens", SHORT, [("tokens_family", "Llama-2 7B"), ("tokens_embed_dims", 32), ("tokens_bos_go", None)]),
    "attention": ("attention", SHORT, [("attn_kind", "scores"), ("attn_window", 8), ("attn_link_q", 4),
                                       ("attn_link_k", 1), ("big_overview_layers", (2, 9)),
                                       ("big_link_layers", (0, 5))]),
    "norm": ("norm", SHORT, [("norm_which", "ln2")]),
    "rope": ("rope", SHORT, [("rope_pairs", [1, 5]), ("rope_key_token", 2), ("rope_decay_src", "ones"),
                             ("rope_clock_pos", 100)]),
    "swiglu": ("swiglu", SHORT, [("swiglu_quantity", "act"), ("swiglu_topk", 16), ("swiglu_threshold", 0.5),
                                 ("swiglu_pw_run", None), ("swiglu_pw_pos", 1), ("swiglu_pw_word", " cat"),
                                 ("swiglu_prompt_a", "The bank was closed."), ("swiglu_prompt_b", "A wet river bank."),
                                 ("swiglu_word", "nowhere"), ("swiglu_tok_a", 1), ("swiglu_tok_b", 2)]),
    "residual": ("residual", LONG, [("residual_log", True), ("lens_positions", 20)]),
    "predict": ("predict", SHORT, [("pred_temperature", 0.7), ("pred_top_k", 10), ("pred_top_p", 0.5),
                                   ("pred_seed", 3), ("pred_continue_n", 5)]),
    "whatif-norm": (*WHATIF, [("whatif_kind", "norm-eps"), ("whatif_norm", "ln2"), ("whatif_eps", 0.1)]),
    "whatif-scale": (*WHATIF, [("whatif_kind", "scale"), ("whatif_branch", "hook_mlp_out"), ("whatif_factor", 2.0)]),
    "whatif-patch": (*WHATIF, [("whatif_kind", "patch"), ("whatif_patch_hook", "hook_attn_out"),
                               ("whatif_patch_pos", -2)]),
    "whatif-ablate": (*WHATIF, [("whatif_kind", "ablate-layer"), ("whatif_mean", True)]),
    "whatif-scope": (*WHATIF, [("whatif_kind", "no-rope"), ("whatif_scope", False)]),
    "whatif-sweep": (*WHATIF, [("big_sweep_first", 27), ("whatif_sweep_layers", 2), ("whatif_sweep_mode", True),
                               ("whatif_sweep_run", None)]),
    "normlab": ("normlab", SHORT, [("lab_ffn", "swiglu"), ("lab_init", "llama"), ("lab_norm", "rms"), ("lab_depth", 8),
                                   ("lab_race_depth", 4), ("lab_race_lr", 1e-3), ("lab_race_steps", 40)]),
}


def widget(at, key: str):
    found = [w for kind in WIDGETS for w in at.get(kind) if w.key == key]
    assert found, f"no widget {key} on the page"
    return found[0]


def chosen(actions) -> dict:
    """{choice key: its value} after the actions."""
    return {BUTTON_FLAGS.get(key, key): True if value is None else value for key, value in actions}


LAB_RUN = ("normlab", SHORT, [("lab_init_run", None)])  # the lab's experiment shown (a test of its own, below)


def test_the_scenarios_change_every_choice_of_every_view():
    covered = {k for _, _, actions in [*SCENARIOS.values(), LAB_RUN] for k in chosen(actions)}
    assert covered == set(VC.CHOICES)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_every_choice_goes_into_the_link_and_comes_back(name):
    round_trip(*SCENARIOS[name])


def test_the_labs_experiment_on_screen_is_in_the_link(monkeypatch):
    """The experiment the lab's button shows comes back from the link; here on two depths of its sweep (the
    lab's own test, test_app_normlab.py, runs the whole one)."""
    import functools

    from app.panels.normlab import initialization
    from explorer_model.lab import normlab as lab

    @functools.lru_cache(maxsize=None)
    def short(ffn, init, norm, depth, *_):
        return lab.init_gradients(lab.LabOptions(ffn=ffn, init=init, norm=norm), depth, depths=(2, 4), sweep_seeds=1)
    monkeypatch.setattr(initialization, "init_gradients", lambda ffn, init, norm, depth, t=None, box=None:
                        short(ffn, init, norm, depth))
    again = round_trip(*LAB_RUN)
    assert "normlab_init_profile" in [(f["layout"].get("meta") or {}).get("id") for f in figures(again)]


def round_trip(view: str, prompt: str, actions):
    """The actions done in one session; the link they leave opened in another: the same choices and figures."""
    at = run_app(timeout=600, view=view, prompt=prompt)
    for key, value in actions:
        if value is None:
            at.button(key=key).click()
        elif isinstance(value, tuple):  # a layer range
            widget(at, key).set_range(*value)
        else:
            widget(at, key).set_value(value)
        at.run(timeout=600)
        assert not at.exception, (key, at.exception)
    link = dict(at.query_params)
    for key, value in chosen(actions).items():
        assert VC.from_text(key, link.get(key, "")) == VC.native(key, value), (key, link)
    again = run_app(timeout=600, **link)  # another session opens the copied link
    assert not again.exception and dict(again.query_params) == link
    for key, value in chosen(actions).items():
        assert again.session_state[key] == at.session_state[key], key
    assert figures(again) == figures(at)
    assert "set back to their defaults" not in all_text(again)
    return again


def test_the_token_limit_and_the_full_view_of_a_comparison_are_in_the_link():
    at = run_app(view="norm", prompt=LONG, cmp="prompt", cmp_prompt="The capital of Spain is Madrid.")
    at.sidebar.number_input(key="max_tokens").set_value(8).run()
    at.sidebar.toggle(key="cmp_full").set_value(True).run()
    link = dict(at.query_params)
    assert link["max_tokens"] == "8" and link["cmp_full"] == "1"
    again = run_app(**link)
    assert again.session_state["max_tokens"] == 8 and again.session_state["cmp_full"] is True
    assert figures(again) == figures(at) and dict(again.query_params) == link


def test_a_preset_link_brings_back_its_sentence_and_its_section():
    at = run_app(view="tokens", prompt="Hello there")
    at.sidebar.selectbox(key="preset").set_value("fact").run()
    link = dict(at.query_params)
    assert link["lesson"] == "fact" and link["section"] == "lens" and link["view"] == "residual"
    assert at.session_state["_landing"] == 1  # the page scrolls to the lens (app/sections.py)
    sentence = [i.value for i in at.info]
    assert sentence and "logit lens" in sentence[0]
    again = run_app(**link)
    assert [i.value for i in again.info] == sentence and figures(again) == figures(at)
    assert again.session_state["_landing"] == 1 and dict(again.query_params) == link
    short = run_app(lesson="fact")  # the preset's own link: its prompt, view, section and lesson
    assert dict(short.query_params) == link and [i.value for i in short.info] == sentence


def test_bad_link_values_fall_back_to_their_defaults_with_one_line():
    at = run_app(view="attention", prompt=SHORT, attn_kind="both", attn_window="5", big_link_layers="9,2",
                 section="lens", lesson="nope", swiglu_topk="x", norm_which="ln2")
    assert not at.exception and not at.error
    assert [i.value for i in at.info].count(
        "Some settings of this page had values it cannot use; they were set back to their defaults.") == 1
    assert at.session_state["attn_kind"] == "pattern" and at.session_state["attn_window"] == 24
    link = dict(at.query_params)
    assert not {"attn_kind", "attn_window", "big_link_layers", "section", "lesson", "swiglu_topk"} & set(link)
    assert "norm_which" not in link  # a choice of another view: not what this page shows


@pytest.mark.parametrize("bad", [{"view": "rmsnorm"}, {"lang": "fr"}])
def test_a_view_or_a_language_the_page_has_not_falls_back_with_the_line_too(bad):
    at = run_app(**{"view": "norm", "lang": "en", **bad}, prompt=SHORT)
    assert not at.exception and not at.error
    assert at.session_state["view"] == ("tokens" if "view" in bad else "norm") and at.session_state["lang"] == "en"
    assert [i.value for i in at.info].count(
        "Some settings of this page had values it cannot use; they were set back to their defaults.") == 1


def test_back_to_my_prompt_gives_the_whole_state_back():
    mine = dict(view="norm", prompt="My own words, typed here.", bos=1, layer=3, head=2, token=1, cmp="prompt",
                cmp_prompt="Other words, for B.", section="gamma", norm_which="ln2")
    at = run_app(**mine)
    before = dict(at.query_params)
    assert before["section"] == "gamma" and before["bos"] == "1" and before["cmp"] == "prompt"
    at.sidebar.selectbox(key="preset").set_value("compare_twins").run()  # another model, prompt, view and B
    ss = at.session_state
    assert (ss["active_model"], ss["cmp"], ss["cmp_model"], ss["bos"]) == ("tiny-pre", "model", "tiny-post", False)
    at.sidebar.button(key="back_to_mine").click().run()
    assert not at.exception
    after = dict(at.query_params)
    assert {k: v for k, v in after.items() if k != "norm_which"} == {k: v for k, v in before.items()
                                                                      if k != "norm_which"}
    ss = at.session_state
    assert (ss["active_model"], ss["view"], ss["layer"], ss["head"], ss["token"], ss["bos"]) == \
        ("smollm2", "norm", 3, 2, 1, True)
    assert (ss["cmp"], ss["cmp_prompt"], ss["prompt"]) == ("prompt", "Other words, for B.", mine["prompt"])
    assert not [b for b in at.sidebar.button if b.key == "back_to_mine"]


def main_texts(at) -> str:
    """Everything the main area says: its texts, its widgets' labels and their help."""
    parts = []
    for kind in ("markdown", "caption", "info", "warning", "subheader", "title", "text"):
        parts += [str(e.value) for e in at.main.get(kind)]
    for kind in (*WIDGETS, "button"):
        for w in at.main.get(kind):
            parts += [str(getattr(w.proto, "label", "")), str(getattr(w.proto, "help", ""))]
    return "\n".join(parts)


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_presenter_mode_keeps_presets_and_selection_in_the_main_area(lang):
    at = run_app(view="whatif", prompt=LONG, presenter=1, lang=lang, whatif="no-mask")
    for key in ("layer", "head", "token"):
        assert at.main.slider(key=key) is not None and not [s for s in at.sidebar.slider if s.key == key]
    assert [s.key for s in at.main.selectbox if s.key == "preset"] and not [
        s for s in at.sidebar.selectbox if s.key == "preset"]
    texts = [main_texts(at)]
    for view in ("tokens", "attention", "normlab"):  # a window narrower than the prompt says how to move it
        texts.append(main_texts(run_app(view=view, prompt=LONG, presenter=1, lang=lang, attn_window=4)))
    at.main.selectbox(key="preset").select_index([p.key for p in PRESETS].index("coref")).run()
    assert at.main.button(key="back_to_mine") is not None  # the way back stands beside the presets
    texts.append(main_texts(at))
    empty = run_app(prompt=" ", presenter=1, lang=lang)
    texts.append(main_texts(empty))
    said = "\n".join(texts)
    assert "sidebar" not in said.lower() and "侧边栏" not in said and "侧栏" not in said


def test_the_room_addresses_carry_the_lecture_and_the_language(monkeypatch, tmp_path):
    from app import lecture_player as P
    from explorer_model.cli import serve as launch
    from explorer_model.room import ROOM_DB_ENV, Room

    monkeypatch.setenv("LLAMA_EXPLORER_SHARE", "1")
    monkeypatch.setattr(launch, "lan_addresses", lambda: ["192.168.1.20", "10.0.0.7"], raising=False)
    at = run_app(lecture="tutorial-000", step=3, lang="zh", presenter=1)

    def addresses(page) -> list[str]:
        return " ".join(c.value for c in page.code).split()
    urls = addresses(at)
    assert [u.split("/?")[1] for u in urls] == ["lang=zh&lecture=tutorial-000&step=3"] * 2
    assert urls[0] in at.get("image")[0].proto.imgs[0].caption  # the QR code of the first
    assert popover_holding(at.main, "code")  # folded beside the title: it takes no height of the first screen
    at.button(key="lecture_next").click().run()
    assert addresses(at)[0].endswith("?lang=zh&lecture=tutorial-000&step=4")
    room = tmp_path / "room.sqlite"  # a room: what the projector shows, for every page of the server
    monkeypatch.setenv(ROOM_DB_ENV, str(room))
    Room(str(room)).publish((P.SHIPPED / "tutorial-001.toml").read_text(encoding="utf-8"), "tutorial-001", 8)
    student = run_app(lang="en")
    assert addresses(student) == []  # following: the projector shows the address
    student.button(key="room_detach").click().run()  # exploring on their own, to pass the address on
    first = addresses(student)[0]
    assert first.startswith("http://192.168.1.20:") and first.endswith("/?lang=en&lecture=tutorial-001&step=9")


def popover_holding(block, kind: str) -> bool:
    """Whether an element of `kind` stands inside a popover under `block`."""
    for child in getattr(block, "children", {}).values():
        if getattr(child, "type", None) == "popover" and child.get(kind):
            return True
        if popover_holding(child, kind):
            return True
    return False
