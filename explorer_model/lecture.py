"""Lecture files: an ordered list of steps, each an app state (the state a link holds) plus a title and a caption in
English and Chinese. Parsing, validation and writing; pure (no Streamlit, no model), so the CLI and the tests use it
as the app does (app/lecture_player.py). The format is documented in docs/lectures.md, whose field table is
`schema_markdown()` of SCHEMA below.

A file is TOML:

    format = 1
    title = { en = "One LLaMA block", zh = "一个 LLaMA 块" }

    [[step]]
    title = { en = "The first-token sink", zh = "首词汇聚" }
    caption = { en = "Most heads park attention on position {key}.", zh = "…" }
    lesson = "sink"            # a preset: its prompt, and where to look found on the loaded model
    [step.choices]
    attn_kind = "scores"

Validation never raises on a file's content: `parse` returns (lecture or None, problems), one Problem per mistake,
naming the step (1-based), the field and what is allowed. The page and the CLI turn a Problem into one line in the
reader's language (catalog keys `lecture.err.{code}`).
"""
from __future__ import annotations

import dataclasses
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from . import view_choices as VC
from .view_choices import CHOICES

FORMAT = 1
MAX_BYTES = 256 * 1024  # a lecture of 200 steps with long captions is ~100 KB
MAX_STEPS = 200
MAX_TEXT = 2000  # a title or caption
MAX_PROMPT = 8000
MAX_IDS = 2048
MAX_DEPTH = 5  # file > steps > step > choices > a choice's list > value: anything deeper is not a lecture
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")  # a model or shipped-lecture name: never a path
PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]*)(?::(\.\d[f%]|\d?%|d))?\}")
LANGS = ("en", "zh")

# The values each kind of lesson computes on the model (app/gateway/lessons.py), usable as {name} in a caption.
LESSON_VALUES: dict[str, tuple] = {
    "link": ("layer", "head", "weight", "query", "other"),
    "sink": ("layer", "head", "share"),
    "induction": ("layer", "head", "score", "period"),
    "lens": ("layer", "n_layers", "piece", "top", "rank0"),
    "split": ("chars", "tokens", "split", "example"),
    "special": ("special", "tokens"),
    "compare": (),
}

# field: (kind, what it holds). Kinds: text (en/zh table), str, name, int, bool, ids, choices, plus the step's URL
# names: each step field except title/caption/lesson/choices is the query parameter of the same name.
SCHEMA: dict[str, dict[str, tuple]] = {
    "lecture": {
        "format": ("int", "format version, 1"),
        "title": ("text", "the lecture's title: { en = \"…\", zh = \"…\" }"),
        "step": ("steps", "the steps, in order: one [[step]] table each"),
    },
    "step": {
        "title": ("text", "the step's title, English and Chinese (required)"),
        "caption": ("text", "what to say, English and Chinese; {name} is a value the lesson computed"),
        "model": ("name", "a model the server offers (smollm2, tiny-pre, tiny-post, the model `serve` was started "
                           "with, a --models-dir entry)"),
        "prompt": ("prompt", "the prompt text"),
        "ids": ("ids", "the prompt as token ids, instead of prompt"),
        "bos": ("bool", "prepend the model's BOS token"),
        "view": ("view", "the view to open"),
        "section": ("section", "the part of the view to scroll to (the link's section=), e.g. \"lens\""),
        "layer": ("int", "layer (clamped to the model; omitted: 0, unless the lesson finds it)"),
        "head": ("int", "head (clamped to the model; omitted: 0, unless the lesson finds it)"),
        "token": ("int", "token position (clamped to the prompt; omitted: the last)"),
        "lesson": ("lesson", "a preset whose target is found on the loaded model; gives prompt, view, layer, head, token "
                             "and its section (unless the step names one)"),
        "whatif": ("str", "What-if interventions, as in the What-if view, e.g. \"no-mask\""),
        "whatif_source": ("prompt", "the source prompt of a patch intervention"),
        "cmp": ("cmp", "compare mode: prompt, model or whatif"),
        "cmp_prompt": ("prompt", "B's prompt (cmp = \"prompt\")"),
        "cmp_model": ("name", "B's model (cmp = \"model\")"),
        "cmp_iv": ("str", "B's interventions (cmp = \"whatif\")"),
        "cmp_align": ("str", "positions paired by hand, \"i-j, …\""),
        "presenter": ("bool", "presenter mode on or off"),
        "choices": ("choices", "the view's own choices, each the link's parameter of the same name (table below)"),
    },
}
FROM_LESSON = ("prompt", "ids", "view", "layer", "head", "token")  # a lesson step takes these from its preset
URL_FIELDS = tuple(k for k in SCHEMA["step"] if k not in ("title", "caption", "lesson", "choices"))


@dataclass(frozen=True)
class Problem:
    code: str  # catalog key lecture.err.{code}
    step: int | None = None  # 1-based; None: the file or its title
    field: str = ""
    detail: dict = dataclasses.field(default_factory=dict)

    def english(self) -> str:
        where = f"step {self.step}, " if self.step else ""
        what = f"{self.field}: " if self.field else ""
        return f"{where}{what}{ENGLISH[self.code].format(**self.detail)}"


ENGLISH = {  # the CLI's lines (the app reads the catalogs)
    "too_big": "the file has {size} bytes; a lecture file may have at most {limit}",
    "not_text": "the file is not UTF-8 text",
    "syntax": "not valid TOML: {error}",
    "too_deep": "nested deeper than a lecture file is ({limit} levels)",
    "unknown": "unknown field; allowed: {allowed}",
    "type": "must be {kind}",
    "required": "is required",
    "format": "must be {format}",
    "no_steps": "the lecture has no [[step]]",
    "too_many": "{n} steps; a lecture may have at most {limit}",
    "too_long": "longer than {limit} characters",
    "name": "must be a name (letters, digits, . _ -), not a path",
    "choice": "must be one of: {allowed}",
    "range": "must be between {lo} and {hi}",
    "both": "give prompt or ids, not both",
    "from_lesson": "comes from the lesson; leave it out",
    "placeholder": "{{{name}}} is not a value of this step's lesson (allowed: {allowed})",
    "braces": "has a brace that is not a {mark} placeholder (write {escape})",
    "no_lesson": "{{{name}}} quotes a value a lesson computes, and this step has no lesson (braces as text: {escape})",
    "no_values": "{{{name}}} quotes a value, and this step's lesson computes none (braces as text: {escape})",
    "no_choices": "the view {view} has no choices of its own",
    "missing_lang": "is missing (a text is given in each language: {langs})",
    "spec": "not a change the What-if view makes: {error}",
}

KIND_WORDS = {"int": "a whole number ≥ 0", "bool": "true or false", "str": "a string", "text": "a table { en, zh }",
              "ids": "a list of token ids ≥ 0", "table": "a table", "steps": "a list of [[step]] tables",
              "float": "a number", "ints": "a list of whole numbers", "pair": "two whole numbers [first, last]"}


@dataclass
class Lecture:
    title: dict  # {"en": …, "zh": …}
    steps: list[dict]  # validated step tables (plain TOML values)


def _depth(v, d: int = 0) -> int:
    if isinstance(v, dict):
        return max([_depth(x, d + 1) for x in v.values()], default=d + 1)
    if isinstance(v, list):
        return max([_depth(x, d + 1) for x in v], default=d + 1)
    return d


def parse(data: bytes | str, views=(), lessons: dict | None = None,
          lesson_views: dict | None = None, spec_problem: Callable[[str], str | None] | None = None
          ) -> tuple[Lecture | None, list[Problem]]:
    """(the lecture, []) or (None or the lecture with the good steps, problems). views: the view keys the app has,
    or {view key: its section keys}; lessons: {preset key: preset kind}; lesson_views: {preset key: its view};
    spec_problem(text): what is wrong with a What-if list (whatif, cmp_iv), None when nothing. Without them only
    what the file itself shows is checked (app/lecture_rules.py gives the page's). A lecture is returned only
    without problems."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    if len(data) > MAX_BYTES:
        return None, [Problem("too_big", detail={"size": len(data), "limit": MAX_BYTES})]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None, [Problem("not_text")]
    if max((len(m) for m in re.findall(r"[\[{]+", text)), default=0) > 2 * MAX_DEPTH:
        return None, [Problem("too_deep", detail={"limit": MAX_DEPTH})]  # before tomllib recurses into it
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        return None, [Problem("syntax", detail={"error": str(e)[:200]})]
    except RecursionError:
        return None, [Problem("too_deep", detail={"limit": MAX_DEPTH})]
    if _depth(raw) > MAX_DEPTH:
        return None, [Problem("too_deep", detail={"limit": MAX_DEPTH})]
    return check(raw, views, lessons, lesson_views, spec_problem)


def check(raw: dict, views=(), lessons: dict | None = None, lesson_views: dict | None = None,
          spec_problem: Callable[[str], str | None] | None = None) -> tuple[Lecture | None, list[Problem]]:
    problems: list[Problem] = []
    for k in raw:
        if k not in SCHEMA["lecture"]:
            problems.append(Problem("unknown", field=str(k)[:40], detail={"allowed": ", ".join(SCHEMA["lecture"])}))
    if raw.get("format", FORMAT) != FORMAT or isinstance(raw.get("format"), bool):
        problems.append(Problem("format", field="format", detail={"format": FORMAT}))
    title = _text(raw.get("title"), None, "title", problems)
    steps = raw.get("step")
    if steps is None:
        problems.append(Problem("no_steps"))
        steps = []
    elif not isinstance(steps, list) or not all(isinstance(s, dict) for s in steps):
        problems.append(Problem("type", field="step", detail={"kind": KIND_WORDS["steps"]}))
        steps = []
    elif len(steps) > MAX_STEPS:
        problems.append(Problem("too_many", detail={"n": len(steps), "limit": MAX_STEPS}))
        steps = []
    elif not steps:
        problems.append(Problem("no_steps"))
    good = [check_step(s, i, views, lessons, problems, lesson_views, spec_problem) for i, s in enumerate(steps, 1)]
    if problems:
        return None, problems
    return Lecture(title=title, steps=good), []


def _text(v, step, name, problems) -> dict:
    if isinstance(v, dict) and set(v) < set(LANGS) and all(isinstance(x, str) for x in v.values()):
        for k in LANGS:  # a table with one language: the other is named
            if k not in v:
                problems.append(Problem("missing_lang", step, f"{name}.{k}", {"langs": ", ".join(LANGS)}))
        return {k: v.get(k, "") for k in LANGS}
    if not isinstance(v, dict) or set(v) != set(LANGS) or not all(isinstance(v[k], str) for k in LANGS):
        problems.append(Problem("type" if v is not None else "required", step, name, {"kind": KIND_WORDS["text"]}))
        return {k: "" for k in LANGS}
    for k in LANGS:
        if len(v[k]) > MAX_TEXT:
            problems.append(Problem("too_long", step, f"{name}.{k}", {"limit": MAX_TEXT}))
    return {k: v[k] for k in LANGS}


def check_step(s: dict, i: int, views, lessons, problems: list[Problem], lesson_views: dict | None = None,
               spec_problem: Callable[[str], str | None] | None = None) -> dict:
    """The step table as given when right; each mistake appended to problems."""
    allowed = SCHEMA["step"]
    start = len(problems)

    def bad(code, name, **detail):
        problems.append(Problem(code, i, name, detail))

    for k in s:
        if k not in allowed:
            bad("unknown", str(k)[:40], allowed=", ".join(allowed))
    _text(s.get("title"), i, "title", problems)
    if "caption" in s:
        _text(s["caption"], i, "caption", problems)
    lesson = s.get("lesson")
    view = (lesson_views or {}).get(lesson) if isinstance(lesson, str) else s.get("view")
    view = view if isinstance(view, str) and view in views else None  # the step's view, when known here
    for k, v in s.items():
        kind = allowed.get(k, ("",))[0]
        if kind in ("str", "prompt", "name", "cmp", "view", "lesson", "section"):
            limit = MAX_PROMPT if kind == "prompt" else MAX_TEXT
            if not isinstance(v, str):
                bad("type", k, kind=KIND_WORDS["str"])
            elif len(v) > limit:
                bad("too_long", k, limit=limit)
            elif kind == "name" and not NAME.match(v):
                bad("name", k)
            elif kind == "cmp" and v not in ("", "prompt", "model", "whatif"):
                bad("choice", k, allowed="prompt, model, whatif")
            elif kind == "view" and views and v not in views:
                bad("choice", k, allowed=", ".join(views))
            elif kind == "lesson" and lessons is not None and v not in lessons:
                bad("choice", k, allowed=", ".join(lessons))
            elif k in ("whatif", "cmp_iv") and spec_problem and (wrong := spec_problem(v)):
                bad("spec", k, error=wrong)
            elif kind == "section" and isinstance(views, Mapping):
                offered = views[view] if view else sorted({x for keys in views.values() for x in keys})
                if v not in offered:
                    bad("choice", k, allowed=", ".join(offered) or "-")
        elif kind == "int" and (not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= 100_000):
            bad("type", k, kind=KIND_WORDS["int"])
        elif kind == "bool" and not isinstance(v, bool):
            bad("type", k, kind=KIND_WORDS["bool"])
        elif kind == "ids":
            if not isinstance(v, list) or not v or not all(isinstance(x, int) and not isinstance(x, bool)
                                                           and 0 <= x < 2**31 for x in v):
                bad("type", k, kind=KIND_WORDS["ids"])
            elif len(v) > MAX_IDS:
                bad("too_long", k, limit=MAX_IDS)
        elif kind == "choices":
            if not isinstance(v, dict):
                bad("type", k, kind=KIND_WORDS["table"])
                continue
            offered = VC.of_view(view) if view else list(CHOICES)
            for ck, cv in v.items():
                if ck not in offered:
                    if offered:
                        bad("unknown", f"choices.{str(ck)[:40]}", allowed=", ".join(offered))
                    else:  # (an empty list of what is allowed read as "-", which says nothing)
                        bad("no_choices", f"choices.{str(ck)[:40]}", view=view)
                elif not VC.check(ck, cv):
                    _bad_choice(ck, cv, bad)
    if "prompt" in s and "ids" in s:
        bad("both", "ids")
    if s.get("cmp") == "prompt" and "cmp_prompt" not in s:  # B would be A's own prompt: nothing to compare
        bad("required", "cmp_prompt")
    if isinstance(lesson, str):
        for k in FROM_LESSON:
            if k in s:
                bad("from_lesson", k)
    kind = (lessons or {}).get(lesson) if isinstance(lesson, str) else None
    names = LESSON_VALUES.get(kind, ()) if kind else ()
    if lessons is None and isinstance(lesson, str):
        names = None  # the presets are not known here (the CLI): only the braces are checked
    caption = s.get("caption")
    if isinstance(caption, dict):
        for lang in LANGS:
            if isinstance(caption.get(lang), str):
                _check_placeholders(caption[lang], names, i, f"caption.{lang}", problems, isinstance(lesson, str))
    return dict(s) if len(problems) == start else {}


def _bad_choice(key: str, value, bad) -> None:
    """One line for a choice's value the view does not offer: its values, its range or its type."""
    c, name = CHOICES[key], f"choices.{key}"
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    if c.kind in ("one_of", "bool"):
        bad("choice", name, allowed=VC.allowed_words(key) if c.kind == "one_of" else "false, true")
    elif c.kind in ("int", "float") and numeric and (c.kind == "float" or isinstance(value, int)):
        bad("range", name, lo=f"{c.lo:g}", hi=f"{c.hi:g}")
    elif c.kind == "text" and isinstance(value, str):
        bad("too_long", name, limit=VC.MAX_TEXT)
    else:
        bad("type", name, kind=KIND_WORDS["str" if c.kind == "text" else c.kind])


def _check_placeholders(text: str, names, i, name, problems, has_lesson: bool) -> None:
    """names: the values the step's lesson computes (None: not known here, nothing checked). A step without a
    lesson, or whose lesson computes nothing, is told so in words: there is no list of values to offer."""
    escape = "{{ / }}"
    rest = PLACEHOLDER.sub("", text)
    if "{" in rest or "}" in rest:
        problems.append(Problem("braces", i, name, {"mark": "{name}", "escape": escape}))
    for m in PLACEHOLDER.finditer(text):
        if not m.group(1) or names is None or m.group(1) in names:
            continue
        if names:
            problems.append(Problem("placeholder", i, name, {"name": m.group(1), "allowed": ", ".join(names)}))
        else:
            problems.append(Problem("no_values" if has_lesson else "no_lesson", i, name,
                                    {"name": m.group(1), "escape": escape}))


def fill(text: str, values: dict) -> str:
    """A caption with its {name} / {name:.2f} / {name:.0%} placeholders filled from the lesson's values
    (a missing value stays as typed); {{ and }} are literal braces. No attribute or index access."""
    def one(m):
        if m.group(0) in ("{{", "}}"):
            return m.group(0)[0]
        if m.group(1) not in values:
            return m.group(0)
        v = values[m.group(1)]
        try:
            return format(v, m.group(2) or "")
        except (TypeError, ValueError):
            return str(v)
    return PLACEHOLDER.sub(one, text)


def step_params(step: dict) -> dict[str, str]:
    """The step's state as the link's query parameters (app/url_state.py reads the same names): its fields, its
    lesson and each of its view's choices."""
    out = {}
    for k in URL_FIELDS:
        if k in step:
            v = step[k]
            out[k] = ",".join(str(i) for i in v) if k == "ids" else ("1" if v else "0") if isinstance(v, bool) else str(v)
    if "lesson" in step:
        out["lesson"] = step["lesson"]
    out.update({k: VC.to_text(k, v) for k, v in step.get("choices", {}).items()})
    return out


# --------------------------------------------------------------------------- writing
def _quote(s: str) -> str:
    """A TOML basic string: backslash, quote and every control character escaped."""
    out = []
    for c in s:
        if c == "\\":
            out.append("\\\\")
        elif c == '"':
            out.append('\\"')
        elif c == "\n":
            out.append("\\n")
        elif c == "\t":
            out.append("\\t")
        elif ord(c) < 0x20 or ord(c) == 0x7F:
            out.append(f"\\u{ord(c):04X}")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v)  # finite (the choices' check): Python's shortest form reads back as the same TOML float
    if isinstance(v, str):
        return _quote(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"a lecture holds no {type(v).__name__}")


def _key(k: str) -> str:
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else _quote(k)


def dumps(lecture: Lecture) -> str:
    """The lecture as TOML text that parse() reads back to the same lecture."""
    lines = ["# LLaMA Explorer lecture (docs/lectures.md describes every field)", f"format = {FORMAT}",
             f"title = {_value(lecture.title)}", ""]
    for step in lecture.steps:
        lines.append("[[step]]")
        for k in SCHEMA["step"]:
            if k in step:
                lines.append(f"{k} = {_value(step[k])}")
        lines.append("")
    return "\n".join(lines)


def schema_markdown() -> str:
    """The field table of docs/lectures.md (a test checks the page holds it)."""
    rows = ["| where | field | kind | what it holds |", "|---|---|---|---|"]
    for where, fields in SCHEMA.items():
        for k, (kind, what) in fields.items():
            rows.append(f"| {where} | `{k}` | {kind} | {what.replace('|', '/')} |")
    return "\n".join(rows)
