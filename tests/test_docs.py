"""The reviewer, operator and author docs stay true to the code.

Every row key is documented; every `rowgate` and `nox -s` command in a code block
parses or exists; the third-party verification the reviewer doc describes works (and
misses what it says it misses) on a real sealed bundle.
"""

from __future__ import annotations

import ast
import re
import shlex
import shutil
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from rowgate.cli.main import _parser
from rowgate.gates.throughput import ThroughputGate
from rowgate.rows.spec import Tolerance
from tests.support import thaw

ROOT = Path(__file__).resolve().parent.parent
DOCS = {name: (ROOT / "docs" / name).read_text()
        for name in ("reviewers.md", "operators.md", "authors.md")}


def _models(model: type[BaseModel], seen: set) -> None:
    if model in seen:
        return
    seen.add(model)
    for f in model.model_fields.values():
        stack = [f.annotation]
        while stack:
            t = stack.pop()
            if isinstance(t, type) and issubclass(t, BaseModel):
                _models(t, seen)
            stack.extend(typing.get_args(t))


def test_every_row_key_is_documented_for_authors():
    from rowgate.cli.schemas import row_model

    seen: set = set()
    _models(row_model(), seen)  # the row with rowgate's own kinds' gate tables
    assert ThroughputGate in seen and Tolerance in seen
    # a key is what a row file says: a field's alias where it has one
    missing = sorted(f"{m.__name__}.{f.alias or name}" for m in seen
                     for name, f in m.model_fields.items()
                     if f"`{f.alias or name}`" not in DOCS["authors.md"])
    assert not missing, f"docs/authors.md does not document: {', '.join(missing)}"


def _code_lines(text: str) -> list[str]:
    blocks = re.findall(r"```[a-z]*\n(.*?)```", text, re.DOTALL)
    joined = [re.sub(r"\\\n\s*", " ", b) for b in blocks]
    return [line.strip() for b in joined for line in b.splitlines() if line.strip()]


def test_the_operator_doc_lists_the_device_kinds():
    from rowgate.gates import device_kinds

    text = re.sub(r"\s+", " ", DOCS["operators.md"])
    listed = re.search(r"the kinds in `device_kinds\(\)`: (.*?)\):", text).group(1)
    assert set(re.findall(r"`([a-z]+)`", listed)) == device_kinds()


def test_every_rowgate_command_in_the_docs_parses():
    commands = [shlex.split(line)[1:] for text in DOCS.values() for line in _code_lines(text)
                if line.startswith("rowgate ")]
    assert {c[0] for c in commands} >= {"report", "verify", "gate", "attest-operator", "rows"}
    for argv in commands:
        _parser().parse_args(argv)


def _nox_sessions() -> set[str]:
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    names = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)
             and any("session" in ast.unparse(d) for d in n.decorator_list)}
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "ROW_SESSIONS":
            names |= set(ast.literal_eval(node.value))
    return names


def test_every_nox_session_in_the_docs_exists():
    named = {m for text in DOCS.values() for m in re.findall(r"nox -s ([a-z0-9-]+)", text)}
    assert named and named <= _nox_sessions(), named - _nox_sessions()


def _model_signing() -> str:
    found = shutil.which("model_signing", path=str(Path(sys.executable).parent)) or \
        shutil.which("model_signing")
    if not found:
        pytest.skip("model_signing's CLI is not installed")
    return found


def _verify_key(bundle: Path, pub: Path) -> subprocess.CompletedProcess:
    """The reviewer doc's key-signed command, word for word."""
    line = next(ln for ln in _code_lines(DOCS["reviewers.md"])
                if ln.startswith("model_signing verify key"))
    argv = [a.replace("BUNDLE", str(bundle)).replace("gate.pub.pem", str(pub))
            for a in shlex.split(line)]
    return subprocess.run([_model_signing(), "--log-level", "ERROR", *argv[1:]],
                          capture_output=True, text=True, timeout=120, cwd=bundle.parent)


def test_model_signing_cli_verifies_a_real_bundle_as_documented(sealed):
    bundle, signer = sealed
    pub = signer.public_key_file()
    ok = _verify_key(bundle, pub)
    assert ok.returncode == 0, ok.stdout + ok.stderr

    thaw(bundle)
    (bundle / "artifacts/host/status.txt").write_text("M edited\n")
    assert _verify_key(bundle, pub).returncode != 0


def test_model_signing_misses_an_added_github_dir_and_rowgate_does_not(sealed):
    """What docs/reviewers.md warns about: git paths are ignored by model-signing."""
    from rowgate.errors import VerificationError
    from rowgate.seal.bundle import Bundle

    bundle, signer = sealed
    thaw(bundle)
    (bundle / ".github").mkdir()
    (bundle / ".github" / "extra").write_text("added after sealing\n")
    assert _verify_key(bundle, signer.public_key_file()).returncode == 0
    with pytest.raises(VerificationError, match=r"\.github/extra: file added after sealing"):
        Bundle.open(bundle).verify(signer.verifier())


def test_the_kernel_only_row_in_the_contract_doc_loads(tmp_path):
    from rowgate.rows.row import load_row

    text = (ROOT / "docs" / "contracts.md").read_text()
    section = text[text.index("## A complete kernel-only row"):]
    block = section.split("```toml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "MY-DECODE-SM90.toml"
    path.write_text(block)
    row = load_row(path).row
    assert row.arms_declared is None and row.workload_declared is None
    assert [g.kind for g in row.gates] == ["host", "build", "audit", "operator"]
