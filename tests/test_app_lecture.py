"""The lecture player and editor in the page (app/lecture_player.py, app/lecture_editor.py), driven by AppTest."""
from __future__ import annotations

import pytest
from apptest_util import edit_box, offered_files, run_app
from streamlit.testing.v1 import AppTest

from app import lecture_player as P
from app.context import plain
from app.i18n import t
from app.presets import BY_KEY
from explorer_model import lecture as L

SHIPPED_000 = L.parse((P.SHIPPED / "tutorial-000.toml").read_bytes(), P.view_keys(), P.lessons())[0]


def counter(at) -> str:
    return next(m.value for m in at.markdown if m.value.startswith(("**Step", "**第")))


def test_a_lecture_link_opens_its_step_and_next_previous_move_through_it():
    at = run_app(lecture="tutorial-000", step=2)
    assert not at.exception and not at.error
    n = len(SHIPPED_000.steps)
    assert counter(at) == f"**Step 2 / {n}** · Inside one LLaMA block"
    assert at.session_state["view"] == "block"
    assert at.subheader[0].value == plain(SHIPPED_000.steps[1]["title"]["en"])  # shown as typed
    at.button(key="lecture_next").click().run()
    assert counter(at).startswith(f"**Step 3 / {n}**") and at.query_params["step"] in ("3", ["3"])
    at.button(key="lecture_next").click().run()  # step 4: the twins, compared
    assert at.session_state["active_model"] == "tiny-pre" and at.session_state["cmp_model"] == "tiny-post"
    at.button(key="lecture_prev").click().run()
    at.button(key="lecture_prev").click().run()
    assert counter(at).startswith(f"**Step 2 / {n}**") and at.session_state["active_model"] == "smollm2"
    assert not at.session_state["cmp"]  # the twins' comparison did not stay
    assert at.button(key="lecture_prev").disabled is False
    at.button(key="lecture_prev").click().run()
    assert at.button(key="lecture_prev").disabled is True


def test_a_step_without_a_layer_or_head_opens_on_the_first_whatever_the_page_showed():
    """A student who explored (layer 3, head 2) and rejoins the room at such a step sees what the projector shows."""
    step = next(i for i, s in enumerate(SHIPPED_000.steps) if i > 0 and s.get("view") and "layer" not in s
                and "head" not in s and "lesson" not in s)
    at = run_app(lecture="tutorial-000", step=step + 1)
    assert not at.exception
    at.slider(key="layer").set_value(3).run()
    at.slider(key="head").set_value(2).run()
    assert (at.session_state["layer"], at.session_state["head"]) == (3, 2)
    at.button(key="lecture_prev").click().run()
    at.button(key="lecture_next").click().run()
    assert (at.session_state["lecture_step"], at.session_state["layer"], at.session_state["head"]) == (step, 0, 0)


def test_a_lesson_step_shows_its_caption_with_the_models_numbers():
    at = run_app(lecture="tutorial-000", step=7, lang="zh")
    assert not at.exception and not at.error
    values = at.session_state["lesson_values"]
    caption = next(m.value for m in at.markdown if "“it”的查询向量" in m.value)
    assert f"第 {values['layer']} 层第 {values['head']} 个头" in caption and f"{values['weight']:.0%}" in caption
    assert at.session_state["layer"] == values["layer"] and at.session_state["attn_kind"] == "scores"
    assert "{" not in caption


def test_an_unknown_lecture_name_says_so():
    at = run_app(lecture="../../etc/passwd")
    assert "no shipped lecture" in at.error[0].value and "tutorial-000" in at.error[0].value
    assert not at.exception


def test_add_edit_reorder_delete_and_download(tmp_path):
    at = run_app(view="norm", layer=2, prompt="Hello there")
    at.button(key="lecture_add").click().run()
    assert counter(at) == "**Step 1 / 1** · My lecture"
    step = at.session_state["lecture"]["steps"][0]
    assert step["view"] == "norm" and step["layer"] == 2 and step["prompt"] == "Hello there"
    assert step["title"] == {"en": "RMSNorm", "zh": "RMSNorm"}  # the view's name in each language
    edit_box(at, "caption_en").input("<b>not bold</b> [x](http://e)")
    edit_box(at, "title_zh").input("第一步")
    at.button(key="lecture_save").click().run()
    assert at.session_state["lecture"]["steps"][0]["caption"]["en"] == "<b>not bold</b> [x](http://e)"
    assert "\\<b\\>not bold\\</b\\> \\[x\\](http\\://e)" in [m.value for m in at.markdown]  # shown as typed
    at.segmented_control(key="view").set_value("attention").run()
    at.button(key="lecture_add").click().run()
    steps = at.session_state["lecture"]["steps"]
    assert [s["view"] for s in steps] == ["norm", "attention"] and at.session_state["lecture_step"] == 1
    at.button(key="lecture_up").click().run()
    assert [s["view"] for s in at.session_state["lecture"]["steps"]] == ["attention", "norm"]
    assert at.session_state["lecture_step"] == 0
    box = [w for w in at.sidebar.text_input if str(w.key).startswith("lecture_title_en_")]
    assert [w.value for w in box] == ["My lecture"]
    box[0].input("Norms, then attention!")
    at.button(key="lecture_save").click().run()
    files = offered_files(at)
    lec, found = L.parse(files["norms-then-attention.toml"])
    assert found == [] and [s["view"] for s in lec.steps] == ["attention", "norm"]
    assert lec.title == {"en": "Norms, then attention!", "zh": "我的讲座"}
    assert counter(at) == f"**Step 1 / 2** · {plain('Norms, then attention!')}"  # shown as typed
    at.button(key="lecture_delete").click().run()
    assert [s["view"] for s in at.session_state["lecture"]["steps"]] == ["norm"]
    assert counter(at) == f"**Step 1 / 1** · {plain('Norms, then attention!')}"
    at.button(key="lecture_delete").click().run()
    assert "lecture" not in at.session_state and not at.exception


def test_a_step_added_after_leaving_a_presets_view_holds_the_view_on_screen():
    """The preset "Coreference", then RMSNorm chosen: the step is the RMSNorm view on the preset's sentence (no
    lesson, which would reopen the heatmap), as the link says; added on the preset's own view, it is the lesson."""
    at = run_app()
    at.sidebar.selectbox(key="preset").set_value("coref").run()
    found = {k: at.session_state[k] for k in ("layer", "head", "token")}
    at.button(key="lecture_add").click().run()
    assert at.session_state["lecture"]["steps"][0]["lesson"] == "coref"
    at.segmented_control(key="view").set_value("norm").run()
    assert "lesson" not in at.query_params
    at.button(key="lecture_add").click().run()
    step = at.session_state["lecture"]["steps"][1]
    assert "lesson" not in step and step["view"] == "norm" and step["prompt"] == BY_KEY["coref"].prompt
    assert {k: step[k] for k in found} == found
    lec, found_problems = L.parse(offered_files(at)["my-lecture.toml"], P.view_keys(), P.lessons())
    assert found_problems == [] and lec.steps[1] == step
    at.button(key="lecture_prev").click().run()
    at.button(key="lecture_next").click().run()
    assert at.session_state["view"] == "norm" and "lesson" not in at.query_params and not at.exception
    assert all("of its attention on" not in i.value for i in at.info)


@pytest.mark.parametrize("lang, titles, label", [
    ("en", ["Inside one LLaMA block (tutorial-000)", "LLaMA from prompt to logits (tutorial-001)"],
     "Open a lecture file (.toml, at most 256 KB)"),
    ("zh", ["拆开一个 LLaMA 模块（tutorial-000）", "LLaMA：从提示到 logits（tutorial-001）"], "打开讲座文件（.toml，最大 256 KB）")])
def test_the_lecture_box_names_shipped_lectures_by_title_and_the_files_real_limit(lang, titles, label):
    """The shipped list showed file names, the picker Streamlit's "200MB per file": the titles (with the name a link
    uses) and the lecture file's 256 KB, while Streamlit's own line, which can name whole megabytes only, is hidden
    and the browser and the server refuse a file over 1 MB."""
    from explorer_model.cli.serve import streamlit_command

    at = run_app(lang=lang)
    assert at.sidebar.selectbox(key="lecture_shipped").options == titles
    picker = at.get("file_uploader")[0].proto
    assert picker.label == label and picker.max_upload_size_mb == 1
    from app.page_style import UPLOAD_LIMIT

    assert any(UPLOAD_LIMIT in h.proto.body for h in at.get("html"))
    command = streamlit_command(8650)
    assert command[command.index("--server.maxUploadSize") + 1] == "1"
    at.sidebar.selectbox(key="lecture_shipped").select_index(1).run()
    assert at.session_state["lecture_name"] == "tutorial-001" and not at.exception


@pytest.mark.parametrize("title,name", [("Inside one LLaMA block", "inside-one-llama-block.toml"),
                                        ("拆开一个块", "lecture.toml"), ("  RoPE: (2) turns ", "rope-2-turns.toml")])
def test_the_lecture_file_is_named_after_its_english_title(title, name):
    from app.lecture_editor import file_name

    assert file_name({"title": {"en": title, "zh": "讲"}}, None) == name
    assert file_name({"title": {"en": title, "zh": "讲"}}, "tutorial-000") == "tutorial-000.toml"


def test_a_step_whose_model_is_missing_says_so_and_the_others_open(tmp_path, monkeypatch):
    text = ('format = 1\ntitle = { en = "t", zh = "讲" }\n'
            '[[step]]\ntitle = { en = "one", zh = "一" }\nmodel = "no-such-model"\nview = "rope"\n'
            '[[step]]\ntitle = { en = "two", zh = "二" }\nmodel = "smollm2"\nview = "norm"\n')
    path = tmp_path / "l.toml"
    path.write_text(text, encoding="utf-8")
    monkeypatch.setenv("LLAMA_EXPLORER_LECTURE", str(path))
    at = run_app()
    assert "no-such-model" in at.warning[0].value and at.session_state["view"] != "rope"
    at.button(key="lecture_next").click().run()
    assert at.session_state["view"] == "norm" and not at.warning and not at.exception


def test_a_file_with_mistakes_lists_them_one_line_each(tmp_path, monkeypatch):
    path = tmp_path / "bad.toml"
    path.write_text('format = 1\ntitle = { en = "t", zh = "讲" }\n[[step]]\ntitle = { en = "a", zh = "甲" }\n'
                    'layer = "x"\nview = "nowhere"\n', encoding="utf-8")
    monkeypatch.setenv("LLAMA_EXPLORER_LECTURE", str(path))
    at = run_app(lang="zh")
    lines = [e.value for e in at.error]
    assert lines[0].startswith("第 1 步，layer：类型应为") and lines[1].startswith("第 1 步，view：应为以下之一")
    assert "lecture" not in at.session_state and not at.exception


def test_the_layer_a_steps_lesson_found_stays_on_the_next_run(tmp_path, monkeypatch):
    """Next sets a step's layer and head to 0 and its lesson puts them back where the browser's sliders already
    stand (two steps on one lesson); the page's next run (any click, a file picked that is refused) keeps them."""
    step = '[[step]]\ntitle = { en = "%s", zh = "步" }\nlesson = "coref"\n'
    path = tmp_path / "two.toml"
    path.write_text('format = 1\ntitle = { en = "t", zh = "讲" }\n' + step % "one" + step % "two", encoding="utf-8")
    monkeypatch.setenv("LLAMA_EXPLORER_LECTURE", str(path))
    at = run_app()
    found = (at.session_state["layer"], at.session_state["head"])
    assert found != (0, 0) and not at.exception
    at.button(key="lecture_next").click().run()
    assert (at.session_state["layer"], at.session_state["head"]) == found
    at.run()
    assert (at.session_state["layer"], at.session_state["head"]) == found
    assert (at.query_params["layer"], at.query_params["head"]) == tuple(str(v) for v in found)
    assert "attn_link_k" not in at.query_params


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_presenter_mode_keeps_the_player_in_the_main_area(lang):
    at = run_app(lecture="tutorial-001", step=1, presenter=1, lang=lang)
    assert not at.exception
    assert at.main.button(key="lecture_next") is not None and at.main.button(key="lecture_prev") is not None
    assert isinstance(at, AppTest)


def test_a_step_s_texts_change_only_by_its_save_button():
    """In presenter mode the folded sidebar's boxes report an empty text when the clicker moves on; a box's value
    is committed by the Save button only, so that wipes no step and keeps the link naming the shipped lecture."""
    at = run_app(lecture="tutorial-000", step=1, presenter=1)
    titles = [s["title"]["en"] for s in at.session_state["lecture"]["steps"][:2]]
    first = edit_box(at, "title_en")
    assert first.value == titles[0]
    for name in ("title_en", "title_zh", "caption_en", "caption_zh"):
        edit_box(at, name).set_value("")
    at.button(key="lecture_next").click().run()
    assert [s["title"]["en"] for s in at.session_state["lecture"]["steps"][:2]] == titles
    assert all(s["caption"]["zh"] for s in at.session_state["lecture"]["steps"][:2])
    assert at.session_state["lecture_name"] == "tutorial-000" and at.query_params["step"] == "2"
    second = edit_box(at, "title_en")
    assert second.key != first.key and second.value == titles[1]
    second.input("Step two, retitled")
    at.button(key="lecture_save").click().run()
    assert [s["title"]["en"] for s in at.session_state["lecture"]["steps"][:2]] == [titles[0], "Step two, retitled"]
    assert at.session_state["lecture_name"] is None


def test_a_lessons_sentence_stands_by_the_figure_it_names_where_the_step_lands_elsewhere():
    """Step 12 of tutorial-000 opens the attention view's heads part (V, z, W_O) with the induction lesson, whose
    sentence ("Look for the diagonal stripe") is about the head's map: it stands at the top of the map's part."""
    at = run_app(lecture="tutorial-000", step=12)
    assert (at.session_state["section"], at.session_state["lesson"]) == ("heads", "induction")
    words = t("preset.lesson.induction", "en").rsplit(". ", 1)[-1]  # "Look for the diagonal stripe."
    assert [part for part, text in infos_by_part(at) if words in text] == ["section_attention_head"]


def test_the_pre_post_norm_step_lands_on_the_gradient_against_depth_its_caption_names():
    at = run_app(lecture="tutorial-000", step=5, timeout=300)
    assert not at.exception and at.session_state["section"] == "depth"
    assert ("section_normlab_depth", "normlab_init_depth_fig") in charts_by_part(at)


def infos_by_part(at) -> list[tuple[str | None, str]]:
    """(the view's part an info box stands in, its text) for every info box of the main area."""
    return [(part, str(el.value)) for part, el in elements_by_part(at) if el.type == "info"]  # st.info


def charts_by_part(at) -> list[tuple[str | None, str]]:
    """(the view's part a figure stands in, the key it was drawn under) for every figure of the main area."""
    return [(part, str(el.proto.id).rsplit("-", 1)[-1]) for part, el in elements_by_part(at) if el.type == "plotly_chart"]


def elements_by_part(at) -> list:
    """(the view's part, as its container's key, or None; the element) for every element of the main area."""
    found = []

    def walk(node, part):
        for child in getattr(node, "children", {}).values():
            key = str(getattr(getattr(child, "proto", None), "id", ""))
            here = key.rsplit("-", 1)[-1] if "-section_" in key else part
            found.append((part, child))
            walk(child, here)
    walk(at.main, None)
    return found
