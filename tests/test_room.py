"""The room of a shared server: its SQLite store (explorer_model/room.py) and the pages that drive and follow it
(app/room_follow.py), the presenter's key checked on the server."""
from __future__ import annotations

import sqlite3
import subprocess
import sys

import pytest
from apptest_util import all_text, edit_box, figures, run_app

from app.i18n import t
from explorer_model.room import ROOM_DB_ENV, ROOM_KEY_ENV, Room


def test_the_store_is_shared_between_processes_in_wal_mode_and_survives_a_restart(tmp_path):
    path = tmp_path / "room.sqlite3"
    room = Room(path)
    assert room.version() == 0 and room.current() is None
    assert room.publish("lecture text", "tutorial-000", 3) == 1
    assert room.publish("lecture text", "tutorial-000", 3) == 1  # nothing changed: same version
    code = (f"from explorer_model.room import Room; r = Room({str(path)!r}); "
            "print(r.current()['step'], r.publish('lecture text', 'tutorial-000', 4))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["3", "2"]  # another process read the step and moved it
    assert room.current() == {"version": 2, "lecture": "lecture text", "name": "tutorial-000", "step": 4}
    again = Room(path)  # a restarted server process
    assert again.version() == 2
    assert sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_the_threads_of_a_process_share_one_connection_that_sees_every_commit(tmp_path, monkeypatch):
    """Every page run is a thread of its own: they read through one connection, opened once, and each read sees
    what another process (here another Room) committed before it."""
    import threading

    opened, connect = [], sqlite3.connect
    monkeypatch.setattr(sqlite3, "connect", lambda *a, **k: opened.append(a) or connect(*a, **k))
    path = tmp_path / "room.sqlite3"
    reader, writer = Room(path), Room(path)
    writer.publish("lecture text", "tutorial-000", 1)
    seen: list = []
    for step in (2, 3):
        writer.publish("lecture text", "tutorial-000", step)
        threads = [threading.Thread(target=lambda: seen.append((reader.version(), reader.current()["step"])))
                   for _ in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(5)
    assert seen == [(2, 2)] * 8 + [(3, 3)] * 8
    assert len(opened) == 2  # the reader's one connection and the writer's


@pytest.fixture
def shared_room(tmp_path, monkeypatch):
    monkeypatch.setenv("LLAMA_EXPLORER_SHARE", "1")
    monkeypatch.setenv(ROOM_DB_ENV, str(tmp_path / "room.sqlite3"))
    monkeypatch.setenv(ROOM_KEY_ENV, "the-secret-key")
    return Room(tmp_path / "room.sqlite3")


def step_of(at) -> int:
    return at.session_state["lecture_step"]


def test_the_presenter_drives_followers_who_may_detach_and_rejoin(shared_room):
    presenter = run_app(lecture="tutorial-000", step=2, room_key="the-secret-key")
    assert not presenter.exception and "room_key" not in presenter.query_params  # the key leaves the address bar
    assert shared_room.current()["step"] == 1 and shared_room.current()["name"] == "tutorial-000"
    student = run_app()
    assert step_of(student) == 1 and student.session_state["view"] == "block"
    assert not student.button(key="room_detach").disabled
    assert [b.key for b in student.button if b.key in ("lecture_next", "lecture_prev")] == []  # no way to move
    presenter.button(key="lecture_next").click().run()
    assert shared_room.current()["step"] == 2
    student.run()  # what the poll's rerun does
    assert step_of(student) == 2
    landing = student.session_state["_landing"]
    student.button(key="room_detach").click().run()
    # the whole view is drawn now, the parts above the step's too: the page lands on the step's part again (it
    # slid under the player)
    assert student.session_state["_landing"] == landing + 1 and student.session_state["section"] == "code"
    student.segmented_control(key="view").set_value("rope").run()
    presenter.button(key="lecture_next").click().run()
    student.run()
    assert step_of(student) == 2 and student.session_state["view"] == "rope"  # exploring on their own
    # the way back names where the room is now, not where the student left it
    assert student.button(key="room_rejoin").label == "Back to the lecture (now step 4 / 21)"
    student.button(key="room_rejoin").click().run()
    assert step_of(student) == 3 and student.session_state["active_model"] == "tiny-pre"  # the current step: the twins


def test_a_student_with_a_wrong_key_or_a_lecture_link_never_moves_the_room(shared_room):
    run_app(lecture="tutorial-000", step=5, room_key="the-secret-key")
    assert shared_room.current()["step"] == 4
    version = shared_room.version()
    for query in ({"room_key": "guess"}, {"room_key": "the-secret-ke"}, {"lecture": "tutorial-001", "step": 9},
                  {"room_key": ""}):
        at = run_app(**query)
        assert not at.exception
        for key in ("lecture_next", "lecture_add", "lecture_delete"):
            found = [b for b in at.button if b.key == key]
            if found:
                found[0].click().run()
    assert shared_room.version() == version and shared_room.current()["step"] == 4


def test_the_watcher_reruns_the_following_pages_when_the_room_changes(tmp_path):
    from app.room_push import Watcher

    room = Room(tmp_path / "room.sqlite3")
    room.publish("lecture text", "tutorial-000", 1)
    asked: list[tuple[str, str]] = []

    def ask(session_id: str, query: str) -> bool:
        asked.append((session_id, query))
        return session_id != "closed-tab"  # that page is gone: it is asked once and then forgotten

    w = Watcher(room, ask, every=3600)  # ticked by hand here; the thread would wait an hour
    try:
        w.follow("student-1", "step=1&view=predict")
        w.follow("closed-tab", "step=1")
        w.follow("explorer", "step=1")
        w.leave("explorer")  # explores on their own: not rerun
        w.tick()
        assert asked == []  # nothing moved: nobody is asked
        room.publish("lecture text", "tutorial-000", 2)
        w.tick()
        assert sorted(asked) == [("closed-tab", "step=1"), ("student-1", "step=1&view=predict")]
        assert set(w.pages) == {"student-1"}
        w.tick()
        assert len(asked) == 2  # once per change
        Room(tmp_path / "room.sqlite3").publish("lecture text", "tutorial-000", 3)  # another process's presenter
        w.tick()
        assert asked[2:] == [("student-1", "step=1&view=predict")]
    finally:
        w.stop()


def test_a_following_page_has_no_lecture_box_and_gets_it_back_when_it_explores(shared_room):
    run_app(lecture="tutorial-000", step=2, room_key="the-secret-key")
    student = run_app()
    assert student.session_state["room_following"]
    assert [b for b in student.button if b.key == "lecture_add"] == []  # the room's lecture is the presenter's
    student.button(key="room_detach").click().run()
    assert [b.key for b in student.button if b.key == "lecture_add"] == ["lecture_add"]


def test_the_room_s_address_is_on_the_presenter_s_page_not_on_a_following_one(shared_room, monkeypatch):
    from explorer_model.cli import serve as launch

    monkeypatch.setattr(launch, "lan_addresses", lambda: ["192.168.1.20"])
    presenter = run_app(lecture="tutorial-000", step=2, room_key="the-secret-key")
    assert "192.168.1.20" in presenter.get("image")[0].proto.imgs[0].caption  # the QR code for the projector
    student = run_app()
    assert student.session_state["room_following"] and student.get("image") == []  # in the room already
    student.button(key="room_detach").click().run()
    assert "192.168.1.20" in student.get("image")[0].proto.imgs[0].caption  # exploring: the address to pass on


def test_the_presenter_s_edit_reaches_the_room(shared_room):
    presenter = run_app(lecture="tutorial-000", step=2, room_key="the-secret-key")
    before = shared_room.version()
    edit_box(presenter, "title_en").set_value("A title of my own")
    presenter.button(key="lecture_save").click().run()
    assert shared_room.version() == before + 1 and "A title of my own" in shared_room.current()["lecture"]


def test_a_follower_whose_run_was_cut_short_takes_the_whole_step_on_its_next_run(shared_room, monkeypatch):
    """A follower's run that takes a new step and stops before drawing its view (overtaken, its server process
    killed, a run refused for now) has not shown the step: the next run, the push's or the page's own catch-up,
    takes it again, even when the browser reports what it showed before."""
    from app import room_follow

    presenter = run_app(timeout=600, lecture="tutorial-000", step=6, room_key="the-secret-key")
    student = run_app(timeout=600)
    assert step_of(student) == step_of(presenter) == 5
    seen = student.session_state["room_seen"]
    old_view = student.session_state["view"]
    presenter.button(key="lecture_next").click().run()
    with monkeypatch.context() as m:
        m.setattr(room_follow, "step_drawn", lambda: None)  # the run stops before its view is drawn
        student.run()
    assert step_of(student) == 6 and student.session_state["room_seen"] == seen  # taken, not yet seen
    student.segmented_control(key="view").set_value(old_view)  # the browser shows the step before
    student.run()
    assert not student.exception
    shown = {k: student.session_state[k] for k in ("view", "layer", "head")}
    assert shown == {k: presenter.session_state[k] for k in ("view", "layer", "head")} and shown["view"] != old_view
    assert student.session_state["room_seen"] == shared_room.version()


def test_a_run_the_browser_asked_for_before_the_step_reached_it_takes_the_step_again(shared_room):
    """The server's rerun for a step and a run the browser asked for earlier (its catch-up, a reconnecting page)
    cross: the browser's run carries the previous step's URL and widget values. The page takes the room's step
    again instead of keeping them."""
    presenter = run_app(timeout=600, lecture="tutorial-000", step=6, room_key="the-secret-key")
    student = run_app(timeout=600)
    assert step_of(student) == step_of(presenter) == 5
    before = dict(student.query_params)  # the URL the browser had before the step
    old_view = student.session_state["view"]
    presenter.button(key="lecture_next").click().run()
    student.run()  # the server's rerun: the new step, drawn and seen
    assert step_of(student) == 6 and student.session_state["room_seen"] == shared_room.version()
    assert student.session_state["view"] != old_view
    student.query_params = before  # then the run the browser asked for before that step reached it
    student.segmented_control(key="view").set_value(old_view)
    student.run()
    assert not student.exception
    shown = {k: student.session_state[k] for k in ("view", "layer", "head")}
    assert shown == {k: presenter.session_state[k] for k in ("view", "layer", "head")}
    assert dict(student.query_params)["view"] == shown["view"]  # and the URL it then writes is the step's


def figure_ids(at) -> list[str]:
    return [(f["layout"].get("meta") or {}).get("id") for f in figures(at)]


def test_a_following_page_shows_only_the_step_s_part_of_the_view_until_asked_for_whole_views(shared_room,
                                                                                               monkeypatch):
    """Step 8 of tutorial-000 is about the attention view's fifth part (the scale study), step 10 about its first (one
    head's map): a follower's page shows that part's figures alone, not the parts above or below it, builds no
    figure for them (the projector's figures, in presenter mode, do not serve it), and says so. "Show
    whole views" shows every part and stays on at the next step; "Only each step's part" goes back. The
    presenter's page shows the whole view."""
    from app import gateway, plots

    presenter = run_app(lecture="tutorial-000", step=8, room_key="the-secret-key", presenter=1)
    assert presenter.session_state["view"] == "attention"
    assert {"attn_head", "attn_grid", "attn_scale", "attn_entropy"} <= set(figure_ids(presenter))
    built, finish = [], plots.finish
    for kind in ("figure", "figure_spec"):  # none from an earlier test of this process either
        gateway.result_cache().discard(kind)
    monkeypatch.setattr(plots, "finish",  # handed the figure's spec (app/gateway/figures.py)
                        lambda fig, *a, **k: built.append(fig["layout"]["meta"]["id"]) or finish(fig, *a, **k))
    student = run_app()
    assert student.session_state["room_following"] and student.session_state["view"] == "attention"
    assert figure_ids(student) == ["attn_scale"]
    assert built == ["attn_scale"]
    assert t("room.part_only", "en") in all_text(student)
    for _ in range(2):  # step 10 (step 9 is a lesson on another prompt)
        presenter.button(key="lecture_next").click().run()
    student.run()
    assert step_of(student) == 9 and figure_ids(student) == ["attn_head"]
    landing = student.session_state["_landing"]
    student.button(key="room_rest").click().run()
    # the parts drawn above the step's push it down the page: the page lands on it again (app/sections.py)
    assert student.session_state["_landing"] == landing + 1 and student.session_state["section"] == "head"
    assert figure_ids(student) == figure_ids(presenter) and student.session_state["room_following"]
    assert [b.key for b in student.button if b.key == "room_rest"] == []
    presenter.button(key="lecture_next").click().run()  # step 11: What-if
    student.run()
    assert student.session_state["view"] == "whatif" and [b for b in student.button if b.key == "room_rest"] == []
    landing = student.session_state["_landing"]
    student.button(key="room_part").click().run()
    assert student.session_state["_landing"] == landing + 1
    assert [b.key for b in student.button if b.key == "room_rest"] == ["room_rest"]
    assert t("room.part_only", "en") in all_text(student)


def test_the_block_s_code_and_diagram_stand_together_on_a_follower_s_page(shared_room):
    """Steps 2 and 3 of tutorial-000 land on the block's diagram and on its code, which stand side by side on a wide
    screen (stacked on a phone, where each step then shows its own part): a follower's page shows the two together,
    the part above neither of them, and nothing under them."""
    presenter = run_app(lecture="tutorial-000", step=2, room_key="the-secret-key", presenter=1)
    assert presenter.session_state["section"] == "diagram"
    student = run_app()
    code_buttons = lambda at: [b.key for b in at.button if b.key.startswith("block_code_")]  # noqa: E731
    for section in ("diagram", "code"):
        assert (student.session_state["view"], student.session_state["section"]) == ("block", section)
        assert chart_keys(student) == ["block_diagram"], section  # not the whole model's diagram under them
        assert len(code_buttons(student)) == len(code_buttons(presenter)) > 5, section
        presenter.button(key="lecture_next").click().run()
        student.run()


def chart_keys(at) -> list[str]:
    """The key each figure of the page was drawn under (its element id ends with it)."""
    return [el.proto.id.rsplit("-", 1)[-1] for el in at.get("plotly_chart")]


def test_a_page_opened_before_the_presenter_s_is_rerun_when_the_lecture_starts(shared_room, monkeypatch):
    """A student who opens the room's address before the lecturer has opened the presenter's link sees an empty
    room: the page follows nothing yet, but the server must still rerun it (or it ask) when the first step is
    written; nothing else would ever run it again."""
    from app import room_follow, room_push

    asked: list[str] = []
    w = room_push.Watcher(shared_room, lambda session_id, query: asked.append(session_id) or True, every=3600)
    monkeypatch.setattr(room_push, "available", lambda: True)  # as on a server (AppTest has none)
    monkeypatch.setattr(room_push, "watcher", lambda r: w)
    try:
        student = run_app()
        assert not student.session_state["room_following"] and shared_room.version() == 0
        assert len(w.pages) == 1  # its session waits for the room
        run_app(lecture="tutorial-000", step=3, room_key="the-secret-key")
        w.tick()
        assert asked == list(w.pages)  # the server reruns it...
        student.run()
        assert student.session_state["room_following"] and step_of(student) == 2  # ...and it follows
    finally:
        w.stop()
    # where the server cannot rerun a page, the page asks: it has something to ask for once the room started
    monkeypatch.setattr(room_push, "available", lambda: False)
    shared_room.clear()
    waiting = run_app()
    assert not waiting.session_state["room_following"]
    run_app(lecture="tutorial-000", step=2, room_key="the-secret-key")
    with monkeypatch.context() as m:
        m.setattr(room_follow.st, "session_state", waiting.session_state)
        assert room_follow.listening() and room_follow._moved()
