"""What a lecture file is checked against, as the page reads it: the views and their parts (app/sections.py), the
lessons (app/presets.py) and the changes the What-if view makes (explorer_model.interventions). The page's Lecture
box and `llama-explorer serve --lecture`, which refuses a file before the server starts, check with the same rules,
so a file the server starts with is one every visitor's page opens."""
from __future__ import annotations

from collections.abc import Callable

from app.i18n import error_text
from app.presets import PRESETS
from app.sections import SECTIONS
from explorer_model import lecture as L


def lessons() -> dict[str, str]:
    return {p.key: p.kind for p in PRESETS}


def view_sections() -> dict[str, tuple]:
    """Every view and its parts, in the view selector's order (tests/test_lecture.py holds it to app/panels)."""
    return dict(SECTIONS)


def lesson_views() -> dict[str, str]:
    return {p.key: p.view for p in PRESETS}


def spec_problem(lang: str = "en") -> Callable[[str], str | None]:
    """A step's What-if list (whatif, cmp_iv) read as the What-if view reads it: what is wrong with it, in `lang`, or
    None. (Only what the text shows: a layer the model lacks is said when the step opens on its model.)"""
    def problem(text: str) -> str | None:
        from explorer_model import interventions as I

        try:
            I.parse_list(text)
        except ValueError as e:  # SpecError, TooMany
            return error_text(e, lang)
        return None
    return problem


def parse(data: bytes | str, lang: str = "en") -> tuple[L.Lecture | None, list[L.Problem]]:
    """A lecture file checked as the page reads it; a What-if list's mistake is said in `lang`."""
    return L.parse(data, view_sections(), lessons(), lesson_views(), spec_problem(lang))


def check_step(step: dict, i: int, problems: list, lang: str = "en") -> dict:
    """One step checked as the page reads it: its view's sections and choices, its lesson's view, its changes."""
    return L.check_step(step, i, view_sections(), lessons(), problems, lesson_views(), spec_problem(lang))
