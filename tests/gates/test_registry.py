"""A gate kind is one module: its spec model and its Gate class, registered where they
are defined. This module defines a throwaway kind (`echo`) and runs it through the real
`rowgate gate` in-process, with no edit anywhere else in rowgate: the row validates it,
the runner runs it, the bundle verifies, the review re-derives it, `rowgate rows` lists it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import pytest
from pydantic import Field

from rowgate import gates
from rowgate.cli import main as cli
from rowgate.decision.rederive import rederive
from rowgate.errors import RowError
from rowgate.gates import registry
from rowgate.gates.interface import Derived, Gate, GateContext, GateError
from rowgate.records.status import Status
from rowgate.rows import row as rows
from rowgate.rows.spec import GateSpec
from rowgate.seal.bundle import Bundle
from rowgate.seal.device import Inventory
from tests.support import write_row

WORDS = "words.txt"


class EchoGate(GateSpec):
    kind: Literal["echo"]
    words: list[str] = Field(min_length=1)
    expect: int = 0
    """How many words derive must find for PASS (0: any number)."""


@registry.register
class Echo(Gate[EchoGate]):
    """Writes the spec's words as its raw artifact; derive counts them again."""

    kind = "echo"
    spec_model = EchoGate

    def measure(self, row: rows.Row, spec: EchoGate, ctx: GateContext) -> None:
        (ctx.artifact_dir / WORDS).write_text(" ".join(spec.words) + "\n")

    def derive(self, row: rows.Row, spec: EchoGate, artifact_dir: Path) -> Derived:
        try:
            words = (artifact_dir / WORDS).read_text().split()
        except OSError as exc:
            raise GateError(f"echo artifacts unreadable in {artifact_dir}: {exc}") from exc
        ok = not spec.expect or len(words) == spec.expect
        return Derived(Status.PASS if ok else Status.FAIL, f"{len(words)} word(s) echoed",
                       {"words": len(words)})


ROW = '''
    [[gates]]
    id = "echo"
    kind = "echo"
    words = ["one", "two", "three"]
    expect = {expect}

    [[criteria]]
    id = "three-words"
    gate = "echo"
    metric = "words"
    comparison = "eq"
    threshold = 3
'''


def _gate(row: Path, repo: Path, out: Path, capsys) -> tuple[int, list[str]]:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        cli.main(["gate", str(row), "--repo", str(repo), "--out", str(out), "-q"])
    return exc.value.code, capsys.readouterr().out.splitlines()


def test_a_kind_defined_in_a_test_module_runs_through_rowgate_gate(tmp_path, git_repo, capsys):
    row = write_row(tmp_path / "rows", "ECHO-ROW", ROW.format(expect=3))
    code, out = _gate(row, Path(git_repo.working_dir), tmp_path / "evidence", capsys)
    assert code == 0, out
    bundle = Bundle.open(Path(out[-1]))
    result = bundle.gate_result("echo")
    assert (result.kind, result.status, result.metrics) == ("echo", Status.PASS, {"words": 3})
    assert (bundle.path / "artifacts" / "echo" / WORDS).read_text() == "one two three\n"
    loaded = rows.load_row(row)
    assert isinstance(loaded.row.gate("echo"), EchoGate)
    again, state, detail = rederive(loaded.row, bundle, result)
    assert (state, detail, again.status) == ("consistent", "", Status.PASS)


def test_its_derive_decides_the_status_and_the_exit_code(tmp_path, git_repo, capsys):
    row = write_row(tmp_path / "rows", "ECHO-FAIL", ROW.format(expect=4))
    code, out = _gate(row, Path(git_repo.working_dir), tmp_path / "evidence", capsys)
    assert code == 1
    result = json.loads((Path(out[-1]) / "gates" / "echo.json").read_text())
    assert (result["status"], result["reason"]) == ("FAIL", "3 word(s) echoed")


def test_a_table_of_the_kind_is_validated_by_its_spec_model(tmp_path):
    path = write_row(tmp_path, "ECHO-BAD", ROW.format(expect=3).replace(
        'words = ["one", "two", "three"]', 'words = []\nwrods = 1'))
    with pytest.raises(RowError) as exc:
        rows.load_row(path)
    assert exc.value.problems == ["gates[0].words: List should have at least 1 item after "
                                  "validation, not 0", "gates[0].wrods: unknown key"]


def test_rowgate_rows_and_the_runner_read_the_registry(tmp_path):
    loaded = rows.load_row(write_row(tmp_path, "ECHO-ROWS", ROW.format(expect=3)))
    spec = loaded.row.gate("echo")
    assert gates.gate_for("echo").__class__ is Echo and registry.lookup("echo") is Echo
    assert gates.availability(loaded.row, spec, Inventory()) == ("runs", "")
    assert "echo" not in gates.device_kinds() and "operator" in gates.device_kinds()


def test_an_unregistered_kind_is_a_row_error_naming_the_kinds(tmp_path):
    path = write_row(tmp_path, "NO-KIND", ROW.format(expect=3).replace('kind = "echo"',
                                                                       'kind = "ehco"'))
    with pytest.raises(RowError) as exc:
        rows.load_row(path)
    assert exc.value.problems[0].startswith("gates[0]: gate kind 'ehco' is not installed "
                                            "(installed: ")
    assert "echo" in exc.value.problems[0] and "host" in exc.value.problems[0]


def test_a_kind_registers_once_and_agrees_with_its_spec():
    class Other(Gate[EchoGate]):
        kind = "echo"
        spec_model = EchoGate

        def measure(self, row, spec, ctx):
            pass

        def derive(self, row, spec, artifact_dir):
            return Derived(Status.PASS, "")

    with pytest.raises(ValueError, match="gate kind 'echo' is registered twice"):
        registry.register(Other)
    Other.kind = "other"
    with pytest.raises(TypeError, match="spec EchoGate has kind"):
        registry.register(Other)
    assert registry.lookup("echo") is Echo and registry.lookup("other") is None


ABI_AFTER_ECHO = '''
    [[models]]
    id = "tiny"
    name = "tiny-qwen3"

    [[gates]]
    id = "abi"
    kind = "abi"
    abi_version = 2
    admitted_by = "echo"
'''


def test_a_later_gate_reads_an_earlier_gates_result_as_the_runner_holds_it(tmp_path, git_repo,
                                                                           capsys):
    # the abi gate admits on the echo gate's result: the runner hands it over in memory
    # (no gate result is on disk before the seal), as it does the trace's on the GPU rows
    row = write_row(tmp_path / "rows", "ECHO-ABI", ROW.format(expect=3) + ABI_AFTER_ECHO)
    _, out = _gate(row, Path(git_repo.working_dir), tmp_path / "evidence", capsys)
    bundle = Bundle.open(Path(out[-1]))
    admission = json.loads((bundle.path / "artifacts" / "abi" / "admission.json").read_text())
    assert admission["found"] is True and admission["admitted_by"] == "echo"
    assert admission["result"] == json.loads(bundle.gate_result("echo").model_dump_json())
    abi = bundle.gate_result("abi")
    assert abi.status is Status.PENDING, abi.reason  # admitted; no sm_90 device for the proof
    assert abi.reason.endswith("GPU proof pending: the persistent kernel is built for sm_90, "
                               "this row's target is cpu"), abi.reason
