"""The architecture contract, checked on the source with `ast`:

- panels (app/panels/*.py) see data, not the model: no torch, no explorer_model.model / .loaders, no app.state,
  nothing of the gateway (app.explorer) but its public API (`__all__`);
- in the app, only the gateway (app/explorer.py and the parts it imports and re-exports, app/gateway_*.py) imports
  explorer_model.loaders or runs `record`/`recorder`.
The checker itself is tested on snippets, so a broken checker cannot pass silently.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PANEL_FORBIDDEN = ("torch", "explorer_model.model", "explorer_model.loaders", "app.state", "app.result_cache")
GATEWAY = "app.explorer"
RECORDERS = {"record", "recorder"}


def gateway_api() -> set[str]:
    """Names in app/explorer.py's __all__, read from its source (importing it would load streamlit and torch)."""
    tree = ast.parse((ROOT / "app" / "explorer.py").read_text(encoding="utf-8"))
    api = None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            api = set(ast.literal_eval(node.value))
        elif isinstance(node, ast.AugAssign) and getattr(node.target, "id", None) == "__all__" and api is not None:
            api |= set(ast.literal_eval(node.value))  # `__all__ += [...]` after a block added at the end
    if api is None:
        raise AssertionError("app/explorer.py has no __all__")
    return api


def _hits(module: str, banned) -> bool:
    return any(module == b or module.startswith(b + ".") for b in banned)


def imported(tree: ast.AST) -> list[tuple[str, list[str], int]]:
    """(module, names imported from it, line) for every import; `from app import explorer` gives ('app.explorer', [])."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ("." * node.level) + (node.module or "")
            out.append((base, [a.name for a in node.names], node.lineno))
            out += [(f"{base}.{a.name}", [], node.lineno) for a in node.names]  # `from app import state`
    return out


def panel_violations(source: str, api: set[str]) -> list[str]:
    tree = ast.parse(source)
    bad = []
    gateway_aliases = set()
    for module, names, line in imported(tree):
        if _hits(module, PANEL_FORBIDDEN):
            bad.append(f"line {line}: imports {module}")
        if module == GATEWAY:
            bad += [f"line {line}: imports {n} from the gateway (not in its __all__)" for n in names if n not in api]
        if module.startswith(GATEWAY + ".") and module.split(".")[2] not in api:
            bad.append(f"line {line}: imports {module}")
    for node in ast.walk(tree):  # `from app import explorer [as x]` then x._private
        if isinstance(node, ast.ImportFrom) and node.module == "app":
            gateway_aliases |= {a.asname or a.name for a in node.names if a.name == "explorer"}
        if isinstance(node, ast.Import):
            gateway_aliases |= {a.asname for a in node.names if a.name == GATEWAY and a.asname}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in gateway_aliases
                and node.attr not in api):
            bad.append(f"line {node.lineno}: uses {node.value.id}.{node.attr} (not in the gateway's __all__)")
    return bad + app_violations(source)


def app_violations(source: str) -> list[str]:
    """For every app module but the gateway: no loaders, no recording of its own."""
    tree = ast.parse(source)
    bad = [f"line {line}: imports {module}" for module, _, line in imported(tree)
           if _hits(module, ("explorer_model.loaders",))]
    bad += [f"line {line}: imports {module}" for module, _, line in imported(tree)
            if module in {f"explorer_model.recording.{r}" for r in RECORDERS}]
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            if name in RECORDERS:
                bad.append(f"line {node.lineno}: calls {name}()")
    return bad


def app_files() -> list[Path]:
    return sorted((ROOT / "app").rglob("*.py"))


@pytest.mark.parametrize("path", sorted((ROOT / "app" / "panels").glob("*.py")), ids=lambda p: p.name)
def test_panels_see_data_not_the_model(path):
    assert panel_violations(path.read_text(encoding="utf-8"), gateway_api()) == []


def is_gateway(path: Path) -> bool:
    return path.name == "explorer.py" or path.name.startswith("gateway_")


@pytest.mark.parametrize("path", [p for p in app_files() if not is_gateway(p)], ids=lambda p: str(p.relative_to(ROOT)))
def test_only_the_gateway_loads_and_records(path):
    assert app_violations(path.read_text(encoding="utf-8")) == []


def test_gateway_parts_are_imported_and_re_exported_by_the_gateway():
    parts = sorted(p.stem for p in (ROOT / "app").glob("gateway_*.py"))
    assert parts  # the cost and compare parts exist
    tree = ast.parse((ROOT / "app" / "explorer.py").read_text(encoding="utf-8"))
    imported_from = {node.module: [a.name for a in node.names] for node in ast.walk(tree)
                     if isinstance(node, ast.ImportFrom) and node.module}
    api = gateway_api()
    for part in parts:
        names = imported_from.get(f"app.{part}")
        assert names, f"app/explorer.py does not import app/{part}.py"
        assert {n for n in names if not n.startswith("_")} <= api, part


def test_the_gateway_is_the_one_that_does():
    text = (ROOT / "app" / "explorer.py").read_text(encoding="utf-8")
    assert app_violations(text)  # it loads and records: the checker sees it
    assert not (ROOT / "app" / "state.py").exists()


@pytest.mark.parametrize("snippet, found", [
    ("import torch", "imports torch"),
    ("import torch.nn.functional as F", "imports torch.nn.functional"),
    ("from torch import nn", "imports torch"),
    ("from explorer_model.model import attention_pattern", "imports explorer_model.model"),
    ("from explorer_model import model", "imports explorer_model.model"),
    ("from explorer_model.loaders import load", "imports explorer_model.loaders"),
    ("from app import state", "imports app.state"),
    ("from app.explorer import _model", "imports _model from the gateway"),
    ("from app import explorer\nexplorer._FORWARD.acquire()", "uses explorer._FORWARD"),
    ("from app import explorer as g\nm = g._model('x')", "uses g._model"),
    ("from explorer_model.recording import record", "imports explorer_model.recording.record"),
    ("from explorer_model import recording\nrecording.record(m, [1])", "calls record()"),
])
def test_the_checker_fails_on_forbidden_code(snippet, found):
    bad = panel_violations(snippet, {"recording", "facts"})
    assert any(found in b for b in bad), bad


def test_the_checker_passes_allowed_code():
    ok = ("import numpy as np\nfrom app import explorer, plots\nfrom explorer_model.analysis import views_data as V\n"
          "x = explorer.recording('smollm2', [1])\ny = V.stack_norms(x, 'hook_attn_out')\n")
    assert panel_violations(ok, {"recording"}) == []
