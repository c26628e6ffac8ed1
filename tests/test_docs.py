"""The docs describe the product as it is: no text speaks of the project's own development, every link resolves,
every code block runs as written, and the hook table is the model's own list.

Each checker is also run on planted examples, so a checker that matches nothing cannot pass silently.
"""
from __future__ import annotations

import ast
import importlib.util
import io
import os
import re
import shlex
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC_PAGES = sorted([ROOT / "README.md", ROOT / "README.zh.md", *(ROOT / "docs").glob("*.md")])
SKIP_DIRS = {".git", ".venv", "node_modules", "artifacts", "__pycache__", ".pytest_cache"}
PY_DIRS = ("app", "explorer_model", "tests", "bench")

# --------------------------------------------------------------------------- no history in the product
# Phrases that speak of the project's development. A visitor's Streamlit session is a product term, so "session"
# alone never matches: only the ones that place a session in the project's past do.
_NOT_PASSIVE = r"(?<!\bis )(?<!\bare )(?<!\bbe )(?<!\bbeen )(?<!\bbeing )(?<!\bwas )(?<!\bwere )(?<!\bget )(?<!\bgets )"
HISTORY = [
    (re.compile(r"\bissues?\s*#?\d+", re.I), "an issue number"),
    (re.compile(r"(?<![\w&#/])#\d{2,5}\b(?![0-9a-fA-F])"), "an issue number (#NN)"),
    # "this session's selection" is a visitor's; a session before or after this one is the project's.
    (re.compile(r"\b(last|previous|earlier|next) (session|round|commit)\b|\b(this|that) (session|round|commit)\b"
                r"(?!_)(?!'s)", re.I), "a development session, round or commit"),
    (re.compile(r"\bsessions? ago\b|\bearlier (rounds?|sessions?|commits?|runs? of work)\b", re.I),
     "earlier work"),
    (re.compile(r"\bprevious(ly)? (commit|session|round|version of (this|the) (code|project|app))\b", re.I),
     "a previous commit or session"),
    (re.compile(r"\b(before|after|since|with|without) this change\b", re.I), "this change"),
    (re.compile(_NOT_PASSIVE + r"\bused to\b(?! be (called|named) by)", re.I), "'used to' (what the code once did)"),
    (re.compile(r"\bthe issue (measured|asks|says|found|wants)\b|\bfinding \d+\b", re.I), "the issue's words"),
    (re.compile(r"\bcommit `?[0-9a-f]{7,40}\b", re.I), "a commit hash"),
    (re.compile(r"(?<![\w./-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![\w-])"), "a commit hash"),
]


def history_hits(text: str) -> list[str]:
    """The development phrases in `text`, each with its reason."""
    return [f"{why}: {m.group(0)!r}" for pattern, why in HISTORY for m in pattern.finditer(text)]


def python_prose(source: str) -> list[tuple[int, str]]:
    """(line, text) of every comment (tokenize) and docstring (ast) of a Python source."""
    out = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(source).readline)
           if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                out.append((node.body[0].lineno, doc))
    return out


def _files(pattern: str, dirs=None):
    roots = [ROOT / d for d in dirs] if dirs else [ROOT]
    for root in roots:
        for path in sorted(root.rglob(pattern)):
            if not SKIP_DIRS & set(path.relative_to(ROOT).parts):
                yield path


def test_the_history_scanner_catches_planted_phrases():
    planted = [
        "# Short titles (issue 12): six clocks side by side",
        "see #24 for the numbers",
        "as the last session measured",
        "the previous commit drew it twice",
        "before this change the cache thrashed",
        "the lens used to show 40 positions",
        "in an earlier round of work",
        "run at c858489 from its own worktree",
        "the issue measured 2.7 s",
    ]
    for text in planted:
        assert history_hits(text), text
    source = 'def f():\n    """Rebuilt on access."""\n    return 1  # issue 12: the rebuilt hooks\n'
    assert [line for line, text in python_prose(source) if history_hits(text)] == [3]
    docstring = 'def f():\n    """Faster than in the previous session."""\n'
    assert [line for line, text in python_prose(docstring) if history_hits(text)] == [2]


def test_the_history_scanner_leaves_product_text_alone():
    product = [
        "Each visitor's Streamlit session has its own prompt, view and selection.",
        "the session's downloads live in the process that served its first page",
        "a cookie pins each browser to its process (its session and its downloads live there)",
        "st.session_state holds this session's selection",
        "The sum is used to compute the RMS; a cache file is used to skip the dequantization.",
        "colour #1f77b4, the head #3 of the grid is not an issue",
        "SHA-256 of the file's content; 49152 tokens; blocks.3.attn.head5",
        "The gate keeps, weakens or closes a feature.",
    ]
    for text in product:
        assert not history_hits(text), (text, history_hits(text))


def test_markdown_does_not_speak_of_its_own_development():
    hits = [f"{path.relative_to(ROOT)}:{n}: {hit}" for path in _files("*.md")
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) for hit in history_hits(line)]
    assert not hits, "\n".join(hits)


def test_comments_and_docstrings_do_not_speak_of_development():
    hits = [f"{path.relative_to(ROOT)}:{n}: {hit}" for path in _files("*.py", PY_DIRS)
            if path.name != Path(__file__).name  # this file plants the phrases on purpose, in strings
            for n, text in python_prose(path.read_text(encoding="utf-8")) for hit in history_hits(text)]
    assert not hits, "\n".join(hits)


# --------------------------------------------------------------------------- links
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", text))


def anchors(path: Path) -> set[str]:
    return {slug(m.group(1)) for line in strip_code(path.read_text(encoding="utf-8")).splitlines()
            if (m := HEADING.match(line))}


def strip_code(text: str) -> str:
    """The text outside fenced code blocks (a `#` comment in a bash block is no heading)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def broken_links(path: Path) -> list[str]:
    bad = []
    for target in LINK.findall(strip_code(path.read_text(encoding="utf-8"))):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no heading #{anchor}")
    return bad


def test_the_link_checker_catches_planted_links(tmp_path):
    (tmp_path / "there.md").write_text("# A page\n\n## The decode step\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text("[ok](there.md) [ok](there.md#the-decode-step) [gone](missing.md) [bad](there.md#nowhere)\n"
                    "```bash\n# not a heading\n```\n[self](#not-here)\n", encoding="utf-8")
    assert [b.split(":")[0] for b in broken_links(page)] == ["missing.md", "there.md#nowhere", "#not-here"]
    assert slug("What if…") == "what-if" and slug("The Pre vs Post-Norm lab") == "the-pre-vs-post-norm-lab"


@pytest.mark.parametrize("page", DOC_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves(page):
    assert not broken_links(page)


def test_the_front_page_is_short_and_links_every_docs_page():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 200
    linked = {Path(t.partition("#")[0]).name for t in LINK.findall(readme)}
    assert {p.name for p in (ROOT / "docs").glob("*.md")} <= linked


# --------------------------------------------------------------------------- code blocks
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
# A Python block that loads the default model takes several seconds: marked `real`, out of the fast tier.
LOADS_DEFAULT = re.compile(r"load\(\s*[\"']smoll" r"m2")


def blocks(kind: str) -> list[tuple[str, str]]:
    return [(f"{page.relative_to(ROOT)}#{i}", body) for page in DOC_PAGES
            for i, (lang, body) in enumerate(FENCE.findall(page.read_text(encoding="utf-8"))) if lang == kind]


def test_every_code_block_names_its_language():
    """python and bash blocks are run or checked below, toml blocks parsed; text blocks are diagrams and excerpts."""
    langs = {f"{page.relative_to(ROOT)}: {lang or '(none)'}" for page in DOC_PAGES
             for lang, _ in FENCE.findall(page.read_text(encoding="utf-8")) if lang not in ("python", "bash", "toml", "text")}
    assert not langs


def run_python_block(code: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_WAIT_POLICY": "PASSIVE"}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)


PY_BLOCKS = [pytest.param(body, id=name, marks=[pytest.mark.real] if LOADS_DEFAULT.search(body) else [])
             for name, body in blocks("python")]


@pytest.mark.parametrize("code", PY_BLOCKS)
def test_every_python_block_runs_as_written(code, tmp_path):
    result = run_python_block(code, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]


def test_a_failing_python_block_fails(tmp_path):
    stale = "from explorer_model.interventions import prompt_loss\n"
    assert run_python_block(stale, tmp_path).returncode != 0


def shell_commands(body: str) -> list[list[str]]:
    """The commands of a bash block: continuation lines joined, comments dropped, VAR=value prefixes removed."""
    commands = []
    for line in body.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
            words.pop(0)
        if words:
            commands.append(words)
    return commands


def make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    return {m.group(1) for m in re.finditer(r"^([\w-]+):", text, re.M)}


def cli_parses(args: list[str]) -> str | None:
    from explorer_model.cli import build_parser

    if args in (["--help"], ["-h"]):
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        done = subprocess.run([sys.executable, "-m", "explorer_model.cli", "--help"], env=env, capture_output=True,
                              text=True, timeout=120)
        return None if done.returncode == 0 and "usage" in done.stdout else f"--help failed: {done.stderr[-500:]}"
    try:
        build_parser().parse_args(args)
    except SystemExit:
        return f"the CLI's parser refuses {shlex.join(args)}"
    return None


def check_command(words: list[str]) -> str | None:
    """None when the command names a real Make target, module, script (with its options) or CLI form; else why not.
    Commands that start servers are parsed, never run."""
    head, rest = words[0], words[1:]
    if head == "make":
        missing = set(rest) - make_targets()
        return f"no make target {sorted(missing)}" if missing else None
    if head == "llama-explorer":
        return cli_parses(rest)
    if head == "haproxy":
        return None if rest[:1] == ["-f"] and (ROOT / rest[1]).is_file() else f"no haproxy config {rest}"
    if Path(head).name.startswith("python"):
        if rest[:1] == ["-m"]:
            module, args = rest[1], rest[2:]
            if module == "explorer_model.cli":
                return cli_parses(args)
            if importlib.util.find_spec(module) is None:
                return f"no module {module}"
            missing = [a for a in args if a.startswith("tests/") and not (ROOT / a).exists()]
            return f"no such file {missing}" if missing else None
        script = ROOT / rest[0]
        if not script.is_file():
            return f"no script {rest[0]}"
        source = script.read_text(encoding="utf-8")
        unknown = [a for a in rest[1:] if a.startswith("--") and f'"{a}"' not in source and f"'{a}'" not in source]
        return f"{rest[0]} has no option {unknown}" if unknown else None
    return f"no checker for {head!r}: add one to tests/test_docs.py"


def test_the_command_checker_catches_planted_commands():
    assert shell_commands("OMP_NUM_THREADS=1 llama-explorer serve --share --port 8601  # one\n\\\n") == [
        ["llama-explorer", "serve", "--share", "--port", "8601"]]
    for bad in ("make nosuchtarget", "llama-explorer record tiny-pre --no-such-flag", "python -m no_such_module_x",
                "python bench/no_such_bench.py", "python bench/bench_core.py --no-such-option", "rm -rf /",
                "llama-explorer generate"):
        assert check_command(shlex.split(bad)), bad
    assert check_command(["llama-explorer", "info"]) is None


@pytest.mark.parametrize("body", [pytest.param(b, id=n) for n, b in blocks("bash")])
def test_every_shell_command_exists(body):
    problems = [f"{shlex.join(words)}: {why}" for words in shell_commands(body) if (why := check_command(words))]
    assert not problems, "\n".join(problems)


# --------------------------------------------------------------------------- the pages' facts
def test_the_hook_table_is_the_models_own_list():
    from explorer_model.config import ModelConfig
    from explorer_model.model import LlamaModel

    cfg = ModelConfig(vocab_size=32, d_model=8, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=4, d_ff=16,
                      norm_eps=1e-5, rope_theta=1e4, max_seq_len=16, tie_embeddings=False)
    names = []
    for name in LlamaModel(cfg).hook_names():
        generic = re.sub(r"^blocks\.\d+\.", "blocks.L.", name)
        if generic not in names:
            names.append(generic)
    text = (ROOT / "docs" / "hooks.md").read_text(encoding="utf-8")
    table = re.findall(r"^\| `([\w.]+)` \|", text, re.M)
    assert table == names


def test_the_walkthrough_cites_files_that_exist():
    """docs/architecture.md's walkthrough of adding a view names files to copy from; they must exist (the example
    view's own files, named by its key, are the ones a reader creates)."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    cited = set(re.findall(r"`((?:app|tests|explorer_model)/[\w/.]+\.(?:py|po))`", text))
    assert cited
    missing = sorted(p for p in cited if "rmsdepth" not in p and not (ROOT / p).exists())
    assert not missing


def test_every_view_has_its_name_in_both_catalogs():
    """The walkthrough says a view's name is the catalog message view.{key}: true of every view there is."""
    from app import i18n
    from app.panels import VIEWS

    for lang in ("en", "zh"):
        assert not [key for key, *_ in VIEWS if f"view.{key}" not in i18n.catalog(lang)], lang


def test_every_toml_block_is_a_lecture_the_app_accepts():
    """The lecture examples in the docs parse and validate as the app reads them (explorer_model/lecture.py)."""
    from explorer_model import lecture

    blocks = [(page, body) for page in DOC_PAGES for lang, body in FENCE.findall(page.read_text(encoding="utf-8"))
              if lang == "toml"]
    assert blocks
    for page, body in blocks:
        _, problems = lecture.parse(body.encode())
        assert not problems, f"{page.name}: {[p.english() for p in problems]}"
