"""`serve --lecture FILE`: the file checked by the page's own rules (app/lecture_rules.py: its views and their parts,
its lessons, the What-if view's changes) before the server starts, so a file the server starts with is one every
visitor's page opens."""
from __future__ import annotations

from app.lecture_rules import parse

from .. import lecture


def lecture_refusals(path: str, models_dir: str | None = None) -> list[str]:
    """What is wrong with the lecture file at `path`, one line per mistake naming the file, as the page lists them
    (the server refuses to start with any: every visitor would see them); [] when nothing is. Also a model this
    server will not offer (the page says so when the step opens, in front of the class)."""
    from app.gateway.settings import offered_models

    try:
        with open(path, "rb") as f:
            data = f.read(lecture.MAX_BYTES + 1)
    except OSError as e:
        return [f"--lecture {path}: {e.strerror or e}"]
    read, problems = parse(data)
    lines = [f"--lecture {path}: {p.english()}" for p in problems]
    offered = offered_models(models_dir)
    for i, step in enumerate(read.steps if read else [], 1):
        for field in ("model", "cmp_model"):
            if step.get(field, offered[0]) not in offered:
                lines.append(f"--lecture {path}: step {i}, {field}: {step[field]!r} is not a model this server offers "
                             f"({', '.join(offered)}{'' if models_dir else '; --models-dir adds a folder of yours'})")
    return lines
