"""The architecture contract, checked on the source with `ast`:

- panels (app/panels/*.py) see data, not the model: no torch, no explorer_model.model / .loaders, no app.state,
  nothing of the gateway (app.gateway) but its public API (`__all__`);
- in the app, only the gateway (the package app/gateway/: its parts, whose API __init__.py re-exports) imports
  explorer_model.loaders or runs `record`/`recorder`;
- no import cycles in app/ and explorer_model/, and the core imports nothing of the app.
The checker itself is tested on snippets, so a broken checker cannot pass silently.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PANEL_FORBIDDEN = ("torch", "explorer_model.model", "explorer_model.loaders", "app.state", "app.gateway.result_cache")
GATEWAY = "app.gateway"
GATEWAY_DIR = ROOT / "app" / "gateway"
RECORDERS = {"record", "recorder"}


def gateway_api() -> set[str]:
    """Names in app/gateway/__init__.py's __all__, read from its source (importing it would load streamlit and torch)."""
    tree = ast.parse((GATEWAY_DIR / "__init__.py").read_text(encoding="utf-8"))
    api = None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            api = set(ast.literal_eval(node.value))
        elif isinstance(node, ast.AugAssign) and getattr(node.target, "id", None) == "__all__" and api is not None:
            api |= set(ast.literal_eval(node.value))  # `__all__ += [...]` after a block added at the end
    if api is None:
        raise AssertionError("app/gateway/__init__.py has no __all__")
    return api


def _hits(module: str, banned) -> bool:
    return any(module == b or module.startswith(b + ".") for b in banned)


def imported(tree: ast.AST) -> list[tuple[str, list[str], int]]:
    """(module, names imported from it, line) for every import; `from app import gateway` gives ('app.gateway', [])."""
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
    for node in ast.walk(tree):  # `from app import gateway [as x]` then x._private
        if isinstance(node, ast.ImportFrom) and node.module == "app":
            gateway_aliases |= {a.asname or a.name for a in node.names if a.name == "gateway"}
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


@pytest.mark.parametrize("path", sorted((ROOT / "app" / "panels").rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_panels_see_data_not_the_model(path):
    assert panel_violations(path.read_text(encoding="utf-8"), gateway_api()) == []


def is_gateway(path: Path) -> bool:
    return path.parent == GATEWAY_DIR


@pytest.mark.parametrize("path", [p for p in app_files() if not is_gateway(p)], ids=lambda p: str(p.relative_to(ROOT)))
def test_only_the_gateway_loads_and_records(path):
    assert app_violations(path.read_text(encoding="utf-8")) == []


def test_gateway_parts_are_imported_and_re_exported_by_the_gateway():
    """What the package's __init__ imports from a part is its API; every part is used by the package."""
    parts = sorted(p.stem for p in GATEWAY_DIR.glob("*.py") if p.name != "__init__.py")
    assert {"state", "costs", "runs", "compare"} <= set(parts)
    def imports(path):
        out: dict[str, list[str]] = {}
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:  # a name imported as _x is kept private
                out.setdefault(node.module, []).extend(a.asname or a.name for a in node.names)
        return out
    init, api = imports(GATEWAY_DIR / "__init__.py"), gateway_api()
    for module, names in init.items():
        if module.startswith(GATEWAY + "."):
            assert {n for n in names if not n.startswith("_")} <= api, module
    used = set(init) | {m for p in GATEWAY_DIR.glob("*.py") for m in imports(p)}
    assert [p for p in parts if f"{GATEWAY}.{p}" not in used] == []


def test_the_gateway_is_the_one_that_does():
    # its parts load (state) and record (runs): the checker sees it
    for part in ("state", "runs"):
        assert app_violations((GATEWAY_DIR / f"{part}.py").read_text(encoding="utf-8")), part
    assert not (ROOT / "app" / "state.py").exists()


@pytest.mark.parametrize("snippet, found", [
    ("import torch", "imports torch"),
    ("import torch.nn.functional as F", "imports torch.nn.functional"),
    ("from torch import nn", "imports torch"),
    ("from explorer_model.model import attention_pattern", "imports explorer_model.model"),
    ("from explorer_model import model", "imports explorer_model.model"),
    ("from explorer_model.loaders import load", "imports explorer_model.loaders"),
    ("from app import state", "imports app.state"),
    ("from app.gateway import _model", "imports _model from the gateway"),
    ("from app import gateway\ngateway._FORWARD.acquire()", "uses gateway._FORWARD"),
    ("from app import gateway as g\nm = g._model('x')", "uses g._model"),
    ("from explorer_model.recording import record", "imports explorer_model.recording.record"),
    ("from explorer_model import recording\nrecording.record(m, [1])", "calls record()"),
])
def test_the_checker_fails_on_forbidden_code(snippet, found):
    bad = panel_violations(snippet, {"recording", "facts"})
    assert any(found in b for b in bad), bad


def test_the_checker_passes_allowed_code():
    ok = ("import numpy as np\nfrom app import gateway, plots\nfrom explorer_model.analysis import views_data as V\n"
          "x = gateway.recording('smollm2', [1])\ny = V.stack_norms(x, 'hook_attn_out')\n")
    assert panel_violations(ok, {"recording"}) == []


# --------------------------------------------------------------------------- no import cycles
def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports, at the top or inside a function (both make a cycle)."""
    files = [p for d in ("app", "explorer_model") for p in (ROOT / d).rglob("*.py")]
    known = {module_name(p): p for p in files}
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            edges |= {t for t in targets if t in known and t != name}
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    # a package's __init__ re-exporting its modules is the package, not a cycle
    graph = {m: {t for t in ts if not (m.startswith(t + ".") and t + "." in m)} for m, ts in import_graph().items()}
    assert cycles(graph) == []


def test_the_cycle_finder_finds_one():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# The tools that drive a running app as its visitors do (the load bench, classroom-check) name its views and speak
# its catalogs, and `serve --lecture` checks its file by the page's rules; everything else in explorer_model knows
# nothing of the app.
APP_CLIENTS = {"explorer_model.cli.loadtest", "explorer_model.cli.classroom_check", "explorer_model.cli.lecture_check"}


def test_the_core_does_not_import_the_app():
    graph = import_graph()
    assert [(m, t) for m, ts in graph.items() if m.startswith("explorer_model") and m not in APP_CLIENTS
            for t in ts if t.startswith("app")] == []


def package_graph() -> dict[str, set[str]]:
    """The import graph between packages (a module at a package's top counts as its own node)."""
    graph = import_graph()
    packages = {m for m in graph if (ROOT.joinpath(*m.split(".")) / "__init__.py").exists()}

    def node(m: str) -> str:
        return max((p for p in packages if m == p or m.startswith(p + ".")), key=len, default=m) \
            if m in packages or m.rpartition(".")[0] in packages and m.rpartition(".")[0] != m.split(".")[0] else m
    out: dict[str, set[str]] = {}
    for m, ts in graph.items():
        out.setdefault(node(m), set()).update(node(t) for t in ts if node(t) != node(m))
    return out


if __name__ == "__main__":  # python tests/test_architecture.py: the package graph, then the cycles (none)
    for name, targets in sorted(package_graph().items()):
        print(f"{name:40} -> {', '.join(sorted(targets)) or '-'}")
    found = cycles({m: {t for t in ts if not (m.startswith(t + ".") and t + "." in m)} for m, ts in import_graph().items()})
    print(f"import cycles among {len(import_graph())} modules: {len(found)}")
    for c in found:
        print("  cycle:", " <-> ".join(c))
