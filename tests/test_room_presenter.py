"""The presenter's page of a shared server's room: reloaded it presents again (its tab kept the key,
app/room_key.py), the presenter's link opened again resumes the room's lecture at its step, a key that no longer
holds (a restarted server) is said, and the presenter moves the room to any step."""
from __future__ import annotations

import streamlit as st
from apptest_util import all_text, run_app
from test_room import shared_room, step_of  # noqa: F401  (the fixture)

from app import lecture_player, room_key
from app.i18n import t
from explorer_model.room import ROOM_KEY_ENV

KEY = "the-secret-key"


class Tab:
    """One browser tab as app/room_key.js sees it: its sessionStorage, and the kept key it gives back to a page
    that does not present, from the page's second run on (the component reports once the first run has drawn it)."""

    def __init__(self):
        self.stored: str | None = None

    def keeper(self, key: str, data: dict, **_) -> None:
        ss = st.session_state
        if data["keep"]:
            self.stored = data["keep"]
        elif self.stored and self.stored != data["checked"] and ss.get("_tab_drawn"):
            ss[key] = {"kept": self.stored}
        ss["_tab_drawn"] = True


def reload(at, **query):
    """The same tab opened again at the address its page shows (the key is not in it)."""
    return run_app(**{**{k: v for k, v in at.query_params.items()}, **query})


def test_a_reloaded_projector_page_presents_again_and_the_presenter_s_link_resumes_the_room(shared_room,
                                                                                                monkeypatch):
    tab = Tab()
    monkeypatch.setattr(room_key, "_KEEPER", tab.keeper)
    presenter = run_app(lecture="tutorial-000", step=3, room_key=KEY, presenter=1)
    assert tab.stored == KEY and "room_key" not in presenter.query_params
    presenter.button(key="lecture_next").click().run()
    student = run_app()
    assert step_of(student) == 3
    version = shared_room.version()

    reloaded = reload(presenter)  # F5 on the projector
    assert "room_key" not in reloaded.query_params and step_of(reloaded) == 3
    reloaded.run()  # the tab gave the key back
    assert reloaded.session_state["room_presenter"] and not reloaded.session_state["room_following"]
    assert step_of(reloaded) == 3 and shared_room.version() == version  # where it was: nobody moved
    reloaded.button(key="lecture_next").click().run()
    student.run()
    assert shared_room.current()["step"] == 4 and step_of(student) == 4

    # the presenter's link, opened again in another tab (here with `serve --lecture`'s file, which a new page
    # opens at its first step): the room's lecture at the room's step, not step 1, not the plain view
    monkeypatch.setenv(lecture_player.LECTURE_ENV, str(lecture_player.SHIPPED / "tutorial-001.toml"))
    version = shared_room.version()
    again = run_app(room_key=KEY, presenter=1)
    assert again.session_state["room_presenter"] and step_of(again) == 4
    assert again.session_state["lecture_name"] == "tutorial-000" and shared_room.version() == version
    again.button(key="lecture_next").click().run()
    assert shared_room.current()["step"] == 5


def test_a_projector_page_whose_key_no_longer_holds_says_so_in_its_language(shared_room, monkeypatch):
    tab = Tab()
    monkeypatch.setattr(room_key, "_KEEPER", tab.keeper)
    presenter = run_app(lecture="tutorial-000", step=3, room_key=KEY, presenter=1, lang="zh")
    version = shared_room.version()
    monkeypatch.setenv(ROOM_KEY_ENV, "the-key-after-a-restart")  # the server restarted: a new key
    stale = reload(presenter)
    stale.run()
    assert not stale.session_state["room_presenter"] and stale.session_state["room_following"]
    assert t("room.key_stale", "zh") in all_text(stale) and t("room.presenting", "zh") not in all_text(stale)
    assert [b for b in stale.button if b.key == "lecture_next"] == [] and shared_room.version() == version
    stale.run()
    assert t("room.key_stale", "zh") in all_text(stale)  # it stays said until the new link is opened
    fresh = run_app(room_key="the-key-after-a-restart")
    assert fresh.session_state["room_presenter"] and tab.stored == "the-key-after-a-restart"
    assert step_of(fresh) == 2 and shared_room.version() == version  # it resumes the room where it was


def test_the_presenter_moves_the_room_to_any_step_from_the_player_or_with_a_link(shared_room):
    presenter = run_app(lecture="tutorial-000", step=2, room_key=KEY, presenter=1)
    student = run_app()
    assert [b for b in student.button if b.key.startswith("lecture_go_")] == []  # a follower moves nothing
    presenter.button(key="lecture_go_11").click().run()
    assert step_of(presenter) == 11 and shared_room.current()["step"] == 11
    student.run()
    assert step_of(student) == 11 and student.session_state["view"] == presenter.session_state["view"]
    presenter.button(key="lecture_prev").click().run()
    assert [b.key for b in presenter.button if b.key.startswith("lecture_go_") and b.disabled] == ["lecture_go_10"]
    # (the step on screen is the one the picker does not offer)
    # the presenter's link with a lecture and a step (docs/lectures.md) opens the room there
    run_app(room_key=KEY, presenter=1, lecture="tutorial-000", step=7)
    assert shared_room.current()["step"] == 6
