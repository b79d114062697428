"""Rows as data: every shipped row loads; malformed rows give one line per problem, exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from rowgate.cli.main import main
from rowgate.records.criteria import Comparison
from rowgate.rows.row import load_row
from tests.support import BUILD_AUDIT_GATES, DEMOS, HOST_GATE, ROWS, write_row

SHIPPED = sorted([*ROWS.glob("*.toml"), *DEMOS.glob("*.toml")])


def test_the_rows_ship():
    assert {p.stem for p in SHIPPED} == {"DEMO-CPU-DECODE", "DEMO-GPU-DECODE",
                                         "PERF-THOR-DECODE-PARITY", "SM70-XQA-E5M2-DECODE",
                                         "KERNEL-CUDA-DECODE-MEGAKERNEL",
                                         "REFERENCE-COHERE-MEGAKERNEL"}


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_shipped_rows_load(path):
    loaded = load_row(path)
    assert loaded.row.id == path.stem
    assert loaded.row.gates[0].kind == "host"


def test_thor_row_encodes_its_requirements():
    row = load_row(ROWS / "PERF-THOR-DECODE-PARITY.toml").row
    assert row.target.arch == "sm_110" and row.target.launcher == ["rc", "--"]
    assert sorted(row.workload.cells()) == sorted(
        f"i{i}-c{c}" for i in (16, 1024) for c in (1, 4, 8))
    trace = row.gate("trace")
    assert (trace.primer_steps, trace.primer_concurrency, trace.arm_delay) == (256, 1, 257)
    assert {c.gate for c in row.criteria} >= {"host", "build", "audit", "tokens", "trace", "throughput"}
    assert row.review.require_operator_attestation and row.review.push_authorised is False


def test_sm70_row_encodes_operator_matrix_and_history():
    row = load_row(ROWS / "SM70-XQA-E5M2-DECODE.toml").row
    op = row.gate("operator")
    assert op.batches == [4, 8, 12, 16] and set(op.layouts) == {"uniform", "ragged"}
    assert {"page-1", "page", "page+1", "17.8K"} <= set(op.contexts)
    assert row.gate("gsm8k").sampling.top_k == 20
    endpoint = row.gate("endpoint")  # the seed's five repeats: the first look
    assert (endpoint.min_rounds, endpoint.metric, endpoint.endpoint) == (5, "itl", True)
    assert any("identical to its base" in h.finding for h in row.history)


def test_megakernel_row_stops_without_idle_capacity():
    row = load_row(ROWS / "KERNEL-CUDA-DECODE-MEGAKERNEL.toml").row
    stop = next(s for s in row.stop_conditions if s.id == "no-idle-capacity")
    assert stop.action.value == "stop-implementation"
    assert stop.comparison is Comparison.LT and stop.threshold == pytest.approx(0.10)
    assert row.gate("abi").admitted_by == "trace"


def _check(path: Path, capsys) -> tuple[int, list[str]]:
    with pytest.raises(SystemExit) as exc:
        main(["rows", "check", str(path)])
    err = capsys.readouterr().err.strip().splitlines()
    return exc.value.code, err


def test_unknown_key_is_named(tmp_path, capsys):
    path = write_row(tmp_path, "BAD-KEY", HOST_GATE.replace('kind = "host"', 'kind = "host"\ncomand = 1'))
    code, err = _check(path, capsys)
    assert code == 2
    assert err == [f"{path}: gates[0].comand: unknown key"]


def test_several_problems_one_line_each(tmp_path, capsys):
    body = HOST_GATE + '''
        [[criteria]]
        id = "c"
        gate = "nope"
        metric = "m"
        comparison = "about"
        threshold = 1
    '''
    path = write_row(tmp_path, "BAD-MANY", body)
    code, err = _check(path, capsys)
    assert code == 2
    assert len(err) == 1 and err[0].startswith(f"{path}: criteria[0].comparison:")
    # once the comparison is fixed, the dangling gate reference is reported
    path.write_text(path.read_text().replace('"about"', '"eq"'))
    code, err = _check(path, capsys)
    assert err == [f"{path}: criteria[0].gate: no gate with id 'nope' (gates: host)"]


def test_cell_outside_matrix(tmp_path, capsys):
    body = HOST_GATE + '''
        [[gates]]
        id = "tp"
        kind = "throughput"

        [[criteria]]
        id = "c"
        gate = "tp"
        metric = "ratio_ci_low"
        comparison = "ge"
        threshold = 0.98
        cells = ["i99-c1"]
    '''
    code, err = _check(write_row(tmp_path, "BAD-CELL", body), capsys)
    assert code == 2 and "criteria[0].cells: 'i99-c1' is not a cell of the workload matrix" in err[0]


def test_toml_syntax_error(tmp_path, capsys):
    path = tmp_path / "BROKEN.toml"
    path.write_text('id = "BROKEN"\n[target\n')
    code, err = _check(path, capsys)
    assert code == 2 and len(err) == 1 and err[0].startswith(f"{path}: (toml):")


def test_id_must_match_file_name(tmp_path, capsys):
    path = write_row(tmp_path, "RIGHT", HOST_GATE)
    path.rename(tmp_path / "WRONG.toml")
    code, err = _check(tmp_path / "WRONG.toml", capsys)
    assert code == 2 and "does not match the file name" in err[0]


def test_unpinned_oracle_refused(tmp_path, capsys):
    path = write_row(tmp_path, "UNPINNED", HOST_GATE)
    path.write_text(path.read_text().replace('version = "0.32.0"', 'version = ""'))
    code, err = _check(path, capsys)
    assert code == 2 and "oracle must be pinned" in err[0]


def test_push_can_never_be_authorised(tmp_path, capsys):
    path = write_row(tmp_path, "PUSHY", HOST_GATE + "\n[review]\npush_authorised = true\n")
    code, err = _check(path, capsys)
    assert code == 2 and "review.push_authorised" in err[0]


def test_rows_lists_gates_and_availability(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["rows"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "PERF-THOR-DECODE-PARITY" in out and "PENDING" in out


KERNEL_GATES = HOST_GATE + BUILD_AUDIT_GATES


def test_a_kernel_only_row_needs_no_arms_and_no_workload(tmp_path):
    row = load_row(write_row(tmp_path, "KERNELS-ONLY", KERNEL_GATES, arch="sm_90",
                             kind="kernel-pr", engines=False)).row
    assert row.arms_declared is None and row.workload_declared is None and row.cells() == []


def test_a_gate_that_drives_engines_needs_both_sections(tmp_path, capsys):
    path = write_row(tmp_path, "NO-ARMS", KERNEL_GATES + '''
        [[gates]]
        id = "tokens"
        kind = "tokens"
    ''', arch="sm_90", kind="kernel-pr", engines=False)
    with pytest.raises(SystemExit) as exc:
        main(["gate", str(path), "--plan"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("gates[3] (tokens): a tokens gate drives the row's engines on its "
                        "workload, and the row declares no [arms] and no [workload]"), err
