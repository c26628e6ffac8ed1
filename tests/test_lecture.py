"""Lecture files (explorer_model/lecture.py): the format, its validator on good and hostile files, the writer."""
from __future__ import annotations

from pathlib import Path

import pytest

from explorer_model import lecture as L

VIEWS = ["tokens", "attention", "norm", "rope", "swiglu", "residual", "predict", "block", "whatif", "normlab"]
LESSONS = {"coref": "link", "sink": "sink", "fact": "lens", "compare_twins": "compare"}
ROOT = Path(__file__).resolve().parents[1]
TEXT = '{ en = "a", zh = "甲" }'


def lecture_text(*steps: str, head: str = "") -> str:
    body = "".join(f"[[step]]\ntitle = {TEXT}\n{s}\n" for s in steps)
    return f"format = 1\ntitle = {TEXT}\n{head}\n{body}"


def problems(text) -> list[str]:
    lecture, found = L.parse(text, VIEWS, LESSONS)
    assert (lecture is None) == bool(found)
    return [p.english() for p in found]


def test_a_good_lecture_parses_to_its_steps():
    lec, found = L.parse(lecture_text('view = "attention"\nlayer = 3\n[step.choices]\nattn_kind = "scores"',
                                      'lesson = "coref"'), VIEWS, LESSONS)
    assert found == []
    assert lec.title == {"en": "a", "zh": "甲"}
    assert lec.steps[0]["layer"] == 3 and lec.steps[0]["choices"] == {"attn_kind": "scores"}
    assert lec.steps[1]["lesson"] == "coref"


def test_each_mistake_is_one_line_naming_step_field_and_what_is_allowed():
    lines = problems(lecture_text('view = "attention"', 'layer = "three"\nview = "nowhere"\ncolour = 1',
                                  'lesson = "coref"\nhead = 2\n[step.choices]\nattn_kind = "both"'))
    assert "step 2, layer: must be a whole number ≥ 0" in lines
    assert any(l.startswith("step 2, view: must be one of: tokens, attention") for l in lines)
    assert any(l.startswith("step 2, colour: unknown field; allowed: title, caption") for l in lines)
    assert "step 3, head: comes from the lesson; leave it out" in lines
    assert "step 3, choices.attn_kind: must be one of: pattern, scores" in lines
    assert len(lines) == 5


@pytest.mark.parametrize("text, expected", [
    ("", "title: is required"),
    ("format = 2\n" + lecture_text('view = "tokens"').split("\n", 1)[1], "format: must be 1"),
    ('format = 1\ntitle = "plain"\n[[step]]\ntitle = { en = "a", zh = "b" }', "title: must be a table { en, zh }"),
    (lecture_text('prompt = 3'), "step 1, prompt: must be a string"),
    (lecture_text('bos = "yes"'), "step 1, bos: must be true or false"),
    (lecture_text('ids = [1, -2]'), "step 1, ids: must be a list of token ids ≥ 0"),
    (lecture_text('ids = [1]\nprompt = "x"'), "step 1, ids: give prompt or ids, not both"),
    (lecture_text('layer = true'), "step 1, layer: must be a whole number ≥ 0"),
    (lecture_text('model = "../../etc/passwd"'), "step 1, model: must be a name (letters, digits, . _ -), not a path"),
    (lecture_text('model = "/home/x/model.gguf"'), "step 1, model: must be a name (letters, digits, . _ -), not a path"),
    (lecture_text('cmp_model = "a/b"'), "step 1, cmp_model: must be a name (letters, digits, . _ -), not a path"),
    (lecture_text('view = "attention"\n[step.choices]\nrm_rf = "/"'),
     "step 1, choices.rm_rf: unknown field; allowed: attn_kind, attn_window"),
    (lecture_text('view = "norm"\n[step.choices]\nattn_kind = "scores"'),
     "step 1, choices.attn_kind: unknown field; allowed: norm_which"),  # a choice of another view
    (lecture_text('view = "swiglu"\n[step.choices]\nswiglu_topk = 0'), "step 1, choices.swiglu_topk: must be between 1 and 256"),
    (lecture_text('[step.choices]\npred_temperature = "hot"'), "step 1, choices.pred_temperature: must be a number"),
    (lecture_text('[step.choices]\nbig_link_layers = [5, 2]'),
     "step 1, choices.big_link_layers: must be two whole numbers [first, last]"),
    (lecture_text('[step.choices]\nresidual_log = "true"'), "step 1, choices.residual_log: must be one of: false, true"),
    (lecture_text('lesson = "nope"'), "step 1, lesson: must be one of: coref, sink, fact, compare_twins"),
    ("format = 1\ntitle = { en = 'a', zh = 'b' }\nstep = []", "the lecture has no [[step]]"),
    ("format = 1\ntitle = { en = 'a', zh = 'b' }\nstep = 5", "step: must be a list of [[step]] tables"),
    ("title = = 1", "not valid TOML"),
])
def test_wrong_types_and_unknown_fields_are_refused(text, expected):
    assert any(l.startswith(expected) for l in problems(text)), problems(text)


def test_a_section_must_be_one_of_its_views_parts():
    views = {"attention": ("head", "link"), "residual": ("norms", "lens")}
    lessons, lesson_views = {"fact": "lens"}, {"fact": "residual"}

    def lines(*steps):
        return [p.english() for p in L.parse(lecture_text(*steps), views, lessons, lesson_views)[1]]
    assert lines('view = "attention"\nsection = "link"', 'lesson = "fact"\nsection = "lens"') == []
    assert lines('view = "attention"\nsection = "lens"', 'lesson = "fact"\nsection = "head"', 'section = 3') == [
        "step 1, section: must be one of: head, link", "step 2, section: must be one of: norms, lens",
        "step 3, section: must be a string"]
    assert lines('section = "nowhere"') == ["step 1, section: must be one of: head, lens, link, norms"]


def test_a_caption_placeholder_must_be_a_value_of_the_steps_lesson():
    ok = lecture_text('lesson = "coref"\ncaption = { en = "layer {layer}: {weight:.0%} {{x}}", zh = "第 {layer} 层" }')
    assert problems(ok) == []
    lines = problems(lecture_text('lesson = "coref"\ncaption = { en = "{share}", zh = "x" }',
                                  'caption = { en = "{layer}", zh = "x" }',
                                  'caption = { en = "{0.__class__}", zh = "x" }'))
    assert lines[0].startswith("step 1, caption.en: {share} is not a value of this step's lesson (allowed: layer")
    assert lines[1] == ("step 2, caption.en: {layer} quotes a value a lesson computes, and this step has no lesson "
                        "(braces as text: {{ / }})")
    assert lines[2].startswith("step 3, caption.en: has a brace that is not a {name} placeholder")


def test_what_is_allowed_is_said_in_words_when_nothing_is():
    """A step without a lesson, a lesson that computes no value and a view without choices allow nothing: each
    line says so, never an empty list ("allowed: -")."""
    lines = problems(lecture_text('caption = { en = "{nope}", zh = "x" }',
                                  'lesson = "compare_twins"\ncaption = { en = "{layer}", zh = "x" }',
                                  'view = "block"\n[step.choices]\nattn_kind = "scores"'))
    assert lines == ["step 1, caption.en: {nope} quotes a value a lesson computes, and this step has no lesson "
                     "(braces as text: {{ / }})",
                     "step 2, caption.en: {layer} quotes a value, and this step's lesson computes none "
                     "(braces as text: {{ / }})",
                     "step 3, choices.attn_kind: the view block has no choices of its own"]
    assert not any("-)" in line or line.endswith(": -") for line in lines)


def test_fill_formats_only_named_values():
    assert L.fill("L{layer} {weight:.0%} {w:.2f} {{x}} {missing}", {"layer": 3, "weight": 0.456, "w": 1.0}) == \
        "L3 46% 1.00 {x} {missing}"


def test_hostile_files_are_refused_with_one_line():
    assert problems(b"x" * (L.MAX_BYTES + 1)) == [f"the file has {L.MAX_BYTES + 1} bytes; a lecture file may have "
                                                  f"at most {L.MAX_BYTES}"]
    assert problems(b"\xff\xfe title") == ["the file is not UTF-8 text"]
    assert problems("a = " + "[" * 50000) == ["nested deeper than a lecture file is (5 levels)"]
    assert problems("a = { b = { c = { d = { e = { f = 1 } } } } }") == ["nested deeper than a lecture file is (5 levels)"]
    many = lecture_text(*['view = "tokens"'] * (L.MAX_STEPS + 1))
    assert problems(many) == [f"{L.MAX_STEPS + 1} steps; a lecture may have at most {L.MAX_STEPS}"]
    long = lecture_text('caption = { en = "%s", zh = "x" }' % ("y" * (L.MAX_TEXT + 1)))
    assert problems(long) == [f"step 1, caption.en: longer than {L.MAX_TEXT} characters"]


def test_markup_in_captions_is_kept_as_text_for_the_page_to_escape():
    hostile = '<img src=x onerror=alert(1)> [link](http://evil) **bold** $x$'
    lec, found = L.parse(lecture_text(f"caption = {{ en = '{hostile}', zh = '<b>粗</b>' }}"), VIEWS, LESSONS)
    assert found == [] and lec.steps[0]["caption"]["en"] == hostile


def test_the_writer_escapes_strings_and_reads_back_the_same_lecture():
    nasty = 'quote " backslash \\ newline \n tab \t bell \x07 del \x7f """ \'\'\' 中文 {layer}'
    lec = L.Lecture({"en": nasty, "zh": "讲"}, [
        {"title": {"en": nasty, "zh": "一"}, "caption": {"en": "c", "zh": "说明"}, "prompt": nasty, "bos": True,
         "view": "attention", "section": "link", "layer": 3,
         "choices": {"attn_kind": "scores", "attn_window": 8, "big_link_layers": [2, 5]}},
        {"title": {"en": "p", "zh": "预"}, "view": "predict", "choices": {"pred_temperature": 0.7, "pred_top_p": 1e-2}},
        {"title": {"en": "b", "zh": "二"}, "ids": [1, 2, 3], "view": "norm"}, {"title": {"en": "c", "zh": "三"}, "lesson": "coref"}])
    text = L.dumps(lec)
    again, found = L.parse(text, VIEWS, LESSONS)
    assert found == [] and again == lec


def test_a_step_maps_onto_the_links_query_parameters():
    step = {"title": {"en": "a", "zh": "b"}, "model": "smollm2", "ids": [5, 6], "bos": True, "view": "norm",
            "section": "gamma", "layer": 2, "cmp": "whatif", "cmp_iv": "no-rope", "choices": {"norm_which": "ln2"}}
    assert L.step_params(step) == {"model": "smollm2", "ids": "5,6", "bos": "1", "view": "norm", "section": "gamma",
                                   "layer": "2", "cmp": "whatif", "cmp_iv": "no-rope", "norm_which": "ln2"}
    assert L.step_params({"title": step["title"], "lesson": "fact", "choices": {"residual_log": True}}) == {
        "lesson": "fact", "residual_log": "1"}


def test_the_docs_page_holds_the_schema_table():
    assert L.schema_markdown() in (ROOT / "docs" / "lectures.md").read_text(encoding="utf-8")


def test_shipped_lectures_are_valid_and_their_captions_hold_no_typed_numbers():
    from app.panels import VIEWS as APP_VIEWS
    from app.presets import PRESETS

    names = sorted((ROOT / "assets" / "lectures").glob("*.toml"))
    assert [p.stem for p in names] == ["tutorial-000", "tutorial-001"]
    for path in names:
        lec, found = L.parse(path.read_bytes(), [v[0] for v in APP_VIEWS], {p.key: p.kind for p in PRESETS})
        assert found == [], (path.name, [p.english() for p in found])
        for i, step in enumerate(lec.steps, 1):
            for lang in L.LANGS:  # a number in a caption comes from the model, through a placeholder
                text = L.PLACEHOLDER.sub("", step["caption"][lang])
                assert not any(c.isdigit() for c in text), (path.name, i, lang)


def test_serve_lecture_passes_the_file_to_the_server(monkeypatch, tmp_path):
    from explorer_model import cli

    seen = {}
    monkeypatch.setattr("explorer_model.cli.serve.supervise", lambda commands, envs, restart: seen.update(env=envs[0]))
    shipped = ROOT / "assets" / "lectures" / "tutorial-000.toml"
    assert cli.main(["serve", "--port", "8599", "--lecture", str(shipped)]) in (0, None)
    assert seen["env"]["LLAMA_EXPLORER_LECTURE"] == str(shipped.resolve())


def test_serve_refuses_a_lecture_with_one_line_per_mistake(monkeypatch, tmp_path, capsys):
    """Every mistake on its own line naming the file, as the page lists them: a count of the others after the
    first ("(and 6 more)") read like six more allowed fields."""
    from explorer_model import cli

    monkeypatch.setattr("explorer_model.cli.serve.supervise", lambda *a, **k: pytest.fail("server started"))
    bad = tmp_path / "bad.toml"
    bad.write_text(lecture_text('layer = "x"\nmodel = "/etc/passwd"\ncolour = "red"'), encoding="utf-8")
    assert cli.main(["serve", "--lecture", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    start = f"llama-explorer: error: --lecture {bad}: step 1, "
    assert err == [start + "colour: unknown field; allowed: " + ", ".join(L.SCHEMA["step"]),
                   start + "layer: must be a whole number ≥ 0",
                   start + "model: must be a name (letters, digits, . _ -), not a path"]
    assert cli.main(["serve", "--lecture", str(tmp_path / "none.toml")]) == 2
    assert "No such file" in capsys.readouterr().err


@pytest.mark.filterwarnings("ignore:--models-dir:UserWarning")  # its empty .gguf will not open: said, as it should be
def test_serve_refuses_what_the_page_would_refuse(monkeypatch, tmp_path, capsys):
    """The server starts only with a file every visitor's page opens: a view, a part of a view, a choice of another
    view and a What-if change are checked as the page checks them (the page listed them to the class instead)."""
    from explorer_model import cli

    monkeypatch.setattr("explorer_model.cli.serve.supervise", lambda *a, **k: pytest.fail("server started"))
    bad = tmp_path / "bad.toml"
    bad.write_text(lecture_text('view = "rotary"', 'view = "rope"\nsection = "clocks"',
                                'view = "rope"\n[step.choices]\nattn_kind = "scores"', 'view = "whatif"\nwhatif = "nomask"',
                                'cmp = "whatif"\ncmp_iv = "no-rope,skip:blocks.x.mlp"'), encoding="utf-8")
    assert cli.main(["serve", "--lecture", str(bad)]) == 2
    err = [line.split(f"--lecture {bad}: ")[1] for line in capsys.readouterr().err.strip().splitlines()]
    assert [line.split(":")[0] for line in err] == ["step 1, view", "step 2, section", "step 3, choices.attn_kind",
                                                   "step 4, whatif", "step 5, cmp_iv"]
    assert err[1] == "step 2, section: must be one of: angles, theta, pairs, shift, decay, clock, sinusoidal"
    assert err[3].startswith("step 4, whatif: not a change the What-if view makes: unknown intervention 'nomask'")
    assert err[4].startswith("step 5, cmp_iv: not a change the What-if view makes: cannot read 'skip:blocks.x.mlp'")
    # a model this server does not offer (the page says so only when the step opens): its --models-dir counts
    models = tmp_path / "models"
    models.mkdir()
    (models / "mine.gguf").write_bytes(b"GGUF")
    bad.write_text(lecture_text('model = "smollm3"', 'model = "mine.gguf"\ncmp = "model"\ncmp_model = "tiny-pre"'),
                   encoding="utf-8")
    assert cli.main(["serve", "--lecture", str(bad), "--models-dir", str(models)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"llama-explorer: error: --lecture {bad}: step 1, model: 'smollm3' is not a model this server offers "
        "(smollm2, tiny-post, tiny-pre, mine.gguf)"]


def test_the_pages_rules_name_every_view_and_say_a_changes_mistake_in_the_readers_language():
    from app import lecture_rules
    from app.i18n import t
    from app.lecture_player import view_keys
    from explorer_model.interventions import FORMS

    assert list(lecture_rules.view_sections()) == view_keys()  # the selector's views, in its order
    [p] = lecture_rules.parse(lecture_text('whatif = "no-mask,relu:blocks.x"'), "zh")[1]
    assert p.detail["error"] == t("interventions.unreadable", "zh", spec="relu:blocks.x", kind="relu", forms=FORMS)


def test_a_text_in_one_language_names_the_other_and_a_prompt_comparison_needs_b_s_prompt():
    lines = problems(lecture_text('caption = { en = "only English" }', 'cmp = "prompt"', 'cmp = "model"'))
    assert lines == ["step 1, caption.zh: is missing (a text is given in each language: en, zh)",
                     "step 2, cmp_prompt: is required"]  # B would be A's own prompt; a model comparison picks B


def test_serve_share_prints_a_presenter_link_with_the_rooms_secret_key(monkeypatch, capsys, tmp_path):
    from explorer_model import cli

    seen = {}
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.setattr("explorer_model.cli.serve.supervise", lambda commands, envs, restart: seen.update(env=envs[0]))
    assert cli.main(["serve", "--share", "--port", "8598"]) in (0, None)
    key = seen["env"]["LLAMA_EXPLORER_ROOM_KEY"]
    assert len(key) >= 20 and f"?room_key={key}&presenter=1" in capsys.readouterr().out
    assert seen["env"]["LLAMA_EXPLORER_ROOM_DB"].startswith(str(tmp_path))
    cli.main(["serve", "--share", "--port", "8598"])
    assert seen["env"]["LLAMA_EXPLORER_ROOM_KEY"] != key  # a new key for every start; the room's file stays


def test_every_mistake_has_its_line_in_both_catalogs():
    from app import i18n

    for lang in L.LANGS:
        assert [c for c in L.ENGLISH if f"lecture.err.{c}" not in i18n.catalog(lang)] == []


def test_the_docs_state_the_validators_limits():
    text = " ".join((ROOT / "docs" / "lectures.md").read_text(encoding="utf-8").split())
    for said in (f"over the size limit ({L.MAX_BYTES // 1024} KB)", f"deeper than a lecture ({L.MAX_DEPTH} levels)",
                 f"texts over {L.MAX_TEXT:,} characters", f"prompts over {L.MAX_PROMPT:,}",
                 f"more than {L.MAX_STEPS} steps or {L.MAX_IDS:,} token ids"):
        assert said in text, said
