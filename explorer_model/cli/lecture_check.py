"""`serve --lecture FILE`: the file checked by the page's own rules (app/lecture_rules.py: its views and their parts,
its lessons, the What-if view's changes) before the server starts, so a file the server starts with is one every
visitor's page opens."""
from __future__ import annotations

from app.lecture_rules import parse

from .. import lecture


def lecture_refusals(path: str) -> list[str]:
    """What is wrong with the lecture file at `path`, one line per mistake naming the file, as the page lists them
    (the server refuses to start with any: every visitor would see them); [] when nothing is."""
    try:
        with open(path, "rb") as f:
            data = f.read(lecture.MAX_BYTES + 1)
    except OSError as e:
        return [f"--lecture {path}: {e.strerror or e}"]
    return [f"--lecture {path}: {p.english()}" for p in parse(data)[1]]
