"""The import rules of docs/architecture.md, read from the source with `ast` (nothing
is imported to build the graph): no import cycle in pipeline/, records/ at the bottom,
evidence and signing above records only, no gate importing the signing code, no module
over 450 lines, no private name imported from another module."""

from __future__ import annotations

import ast
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "pipeline"
MAX_LINES = 450


@cache
def modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package (packages by
    their __init__.py)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _is_package(name: str) -> bool:
    return modules()[name].name == "__init__.py"


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the import nodes inside `if TYPE_CHECKING:` blocks (never executed)."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for stmt in node.body:
                skipped.update(id(sub) for sub in ast.walk(stmt))
    return skipped


def _absolute(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if _is_package(module) else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


@cache
def imports(module: str) -> tuple[tuple[str, str], ...]:
    """(imported module, imported name or "") for every import the module executes:
    module level and inside functions alike; TYPE_CHECKING blocks excluded. A
    `from PKG import NAME` counts as importing PKG, and PKG.NAME too when that is a
    module."""
    tree = ast.parse(modules()[module].read_text())
    skipped = _type_checking_only(tree)
    out: list[tuple[str, str]] = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            out += [(alias.name, "") for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, node)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                out.append((sub, "") if sub in modules() else (base, alias.name))
                if sub in modules():
                    out.append((base, ""))
    return tuple(out)


def graph() -> dict[str, set[str]]:
    known = modules()
    return {m: {dep for dep, _ in imports(m) if dep in known and dep != m} for m in known}


def strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative (the graph is small, but recursion depth is not
    the test's business)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                out.append(sorted(component))
    return out


def loaded(names: list[str]) -> set[str]:
    """pipeline modules a fresh interpreter has loaded after importing `names`."""
    code = "import sys\n" + "".join(f"import {n}\n" for n in names) + \
        "print('\\n'.join(m for m in sys.modules if m.startswith('pipeline')))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    return set(out.split())


# ----------------------------------------------------------------------- the rules


def test_the_graph_sees_known_edges():
    """The checker itself: a graph that missed imports would pass every rule below."""
    g = graph()
    assert "pipeline.records.status" in g["pipeline.records.gate_result"]
    assert "pipeline.evidence" in g["pipeline.runner"]
    assert strongly_connected({"a": {"b"}, "b": {"a", "c"}, "c": set()}) == [["c"], ["a", "b"]]


def test_no_import_cycle():
    # A package importing its own children (an __init__ re-exporting them) is the one
    # allowed loop: it is not a cycle between modules.
    cycles = [c for c in strongly_connected(graph())
              if sum(not _is_package(m) for m in c) > 1]
    assert cycles == [], "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def _reaches(start: str) -> set[str]:
    g, seen, todo = graph(), set(), [start]
    while todo:
        for dep in g[todo.pop()]:
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


def test_records_import_nothing_of_rowgate_but_errors():
    for module in (m for m in modules() if m.startswith("pipeline.records")):
        outside = {d for d in _reaches(module)
                   if not d.startswith("pipeline.records") and d not in ("pipeline", "pipeline.errors")}
        assert outside == set(), f"{module} imports {sorted(outside)}"
        assert "pipeline" not in {d for d, _ in imports(module)}, \
            f"{module} imports pipeline/__init__ (records compute their own paths)"


@pytest.mark.parametrize("module", ["pipeline.evidence", "pipeline.signing"])
def test_evidence_and_signing_stand_on_records_only(module):
    above = {d for d in _reaches(module)
             if d.startswith(("pipeline.gates", "pipeline.engines", "pipeline.decision",
                              "pipeline.rows", "pipeline.runner"))}
    assert above == set(), f"{module} reaches {sorted(above)}"


def test_importing_the_sealer_loads_no_gate_engine_or_decision_module():
    found = loaded(["pipeline.evidence", "pipeline.signing", "pipeline.records"])
    above = sorted(m for m in found
                   if m.startswith(("pipeline.gates", "pipeline.engines", "pipeline.decision")))
    assert "pipeline.evidence" in found and above == []


def test_no_gate_reaches_the_signing_code():
    for module in (m for m in modules() if m.startswith("pipeline.gates")):
        assert "pipeline.signing" not in _reaches(module), f"{module} reaches pipeline.signing"


def test_no_module_is_over_the_line_limit():
    long = {str(p.relative_to(ROOT)): n for p in modules().values()
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}, f"modules over {MAX_LINES} lines: {long}"


def test_no_private_name_crosses_modules():
    crossing = [f"{m} imports {dep}.{name}" for m in modules() for dep, name in imports(m)
                if name.startswith("_") and not name.startswith("__") and dep.startswith("pipeline")]
    assert crossing == []
