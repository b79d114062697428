"""The import rules of docs/architecture.md. The layers are import-linter's contracts
(pyproject.toml [tool.importlinter], run here and in `nox -s lint`); read from the source
with `ast` besides: no import cycle in src/rowgate/ (TYPE_CHECKING imports counted),
records/ at the bottom, the sealer and signer above records only, no gate importing the
signing code, no private module or name imported from another package."""

from __future__ import annotations

import ast
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PACKAGE = SRC / "rowgate"


@cache
def modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package (packages by
    their __init__.py)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
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
def imports(module: str, type_checking: bool = False) -> tuple[tuple[str, str], ...]:
    """(imported module, imported name or "") for every import the module executes:
    module level and inside functions alike; TYPE_CHECKING blocks excluded. A
    `from PKG import NAME` counts as importing PKG, and PKG.NAME too when that is a
    module."""
    tree = ast.parse(modules()[module].read_text())
    skipped = set() if type_checking else _type_checking_only(tree)
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


def graph(type_checking: bool = False) -> dict[str, set[str]]:
    known = modules()
    return {m: {dep for dep, _ in imports(m, type_checking) if dep in known and dep != m}
            for m in known}


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
    """rowgate modules a fresh interpreter has loaded after importing `names`."""
    code = "import sys\n" + "".join(f"import {n}\n" for n in names) + \
        "print('\\n'.join(m for m in sys.modules if m.startswith('rowgate')))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    return set(out.split())


# ----------------------------------------------------------------------- the rules


def test_the_graph_sees_known_edges():
    """The checker itself: a graph that missed imports would pass every rule below."""
    g = graph()
    assert "rowgate.records.status" in g["rowgate.records.gate_result"]
    assert "rowgate.seal.bundle" in g["rowgate.run.runner"]
    assert strongly_connected({"a": {"b"}, "b": {"a", "c"}, "c": set()}) == [["c"], ["a", "b"]]


def test_no_import_cycle():
    # A package importing its own children (an __init__ re-exporting them) is the one
    # allowed loop: it is not a cycle between modules.
    cycles = [c for c in strongly_connected(graph(type_checking=True))
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
    for module in (m for m in modules() if m.startswith("rowgate.records")):
        outside = {d for d in _reaches(module)
                   if not d.startswith("rowgate.records")
                   and d not in ("rowgate", "rowgate.errors", "rowgate.dirs")}
        assert outside == set(), f"{module} imports {sorted(outside)}"


@pytest.mark.parametrize("module", ["rowgate.seal.bundle", "rowgate.seal.signing"])
def test_evidence_and_signing_stand_on_records_only(module):
    above = {d for d in _reaches(module)
             if d.startswith(("rowgate.gates", "rowgate.engines", "rowgate.decision",
                              "rowgate.rows.row", "rowgate.run.runner"))}
    assert above == set(), f"{module} reaches {sorted(above)}"


def test_importing_the_sealer_loads_no_gate_engine_or_decision_module():
    found = loaded(["rowgate.seal.bundle", "rowgate.seal.signing", "rowgate.records"])
    above = sorted(m for m in found
                   if m.startswith(("rowgate.gates", "rowgate.engines", "rowgate.decision")))
    assert "rowgate.seal.bundle" in found and above == []


def test_no_gate_reaches_the_signing_code():
    for module in (m for m in modules() if m.startswith("rowgate.gates")):
        assert "rowgate.seal.signing" not in _reaches(module), f"{module} reaches rowgate.seal.signing"


def test_no_private_name_crosses_modules():
    crossing = [f"{m} imports {dep}.{name}" for m in modules() for dep, name in imports(m)
                if name.startswith("_") and not name.startswith("__") and dep.startswith("rowgate")]
    assert crossing == []


def _package(module: str) -> str:
    return module if _is_package(module) else module.rsplit(".", 1)[0]


def test_no_private_module_is_imported_from_another_package():
    """`rowgate.gates._built` is the gates package's own: another package imports the
    gates' public modules only."""
    crossing = [f"{m} imports {dep}" for m in modules() for dep, _ in imports(m, True)
                if dep in modules() and dep.rsplit(".", 1)[-1].startswith("_")
                and not dep.endswith("__init__")
                and not _package(m).startswith(dep.rsplit(".", 1)[0])]
    assert crossing == []


def test_import_linter_contracts_hold():
    """The layers of docs/architecture.md and the lab's independence, as import-linter
    checks them (its `lint-imports`, installed with the lint extra)."""
    exe = Path(sys.executable).with_name("lint-imports")
    if not exe.exists():
        pytest.skip("import-linter is not installed in this environment (the lint extra)")
    proc = subprocess.run([str(exe), "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]


def test_the_lab_imports_only_rowgates_public_modules():
    """The lab is a subject gated like anyone's: it uses rowgate's public API only."""
    found = []
    for path in sorted((ROOT / "lab").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            found += [f"{path.relative_to(ROOT)}: {n}" for n in names
                      if n.startswith("rowgate.") and any(p.startswith("_") and p != "__init__"
                                                           for p in n.split("."))]
    assert found == []
