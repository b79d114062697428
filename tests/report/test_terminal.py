"""What people read in a terminal, captured from the real commands at 100 columns:
text from bundles printed as written (no rich markup eaten), stand-in arches said,
numbers with units, identifiers never broken mid-word."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from rich.console import Console

from rowgate.cli.main import main
from rowgate.gates.interface import GateResult, Status
from rowgate.report import units
from rowgate.rows import row as rows
from rowgate.run import provenance
from rowgate.seal import signing
from rowgate.seal.bundle import Stage
from tests.support import write_row

WIDTH = 100
MARKUP = "pip install 'rowgate[cuda13]'"


def _run(args: list[str], capsys, monkeypatch) -> tuple[int, str, str]:
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    with pytest.raises(SystemExit) as exc:
        main(args)
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def _seal_stand_in(tmp_path: Path, repo: Path, key: Path) -> Path:
    """A real signed bundle of an sm_70 row whose operator gate ran on an sm_90 stand-in,
    with reasons in brackets and raw float metrics (the shapes gates write)."""
    path = write_row(tmp_path, "TERM-SM70", '''
        [[gates]]
        id = "operator-bitwise-ab"
        kind = "operator"
        baseline = "split_kv"
        candidate = "split_kv_pipelined"

        [[gates]]
        id = "build"
        kind = "build"
    ''', arch="sm_70")
    loaded = rows.load_row(path)
    stage = Stage(tmp_path / "evidence", loaded.row.id)
    stage.add_result(GateResult(
        gate_id="operator-bitwise-ab", kind="operator", status=Status.PASS, arch="sm_90",
        stand_in=True, reason="896 cases bitwise equal [B4/B8/B12/B16]",
        metrics={"max_abs_err": 0.006467058726940968, "wall_s": 0.006467058726940968,
                 "bitwise_mismatches": 0, "sm_clock_max_mhz": 1980, "eos_rate": 0.125}))
    stage.add_result(GateResult(gate_id="build", kind="build", status=Status.ERROR, arch="sm_70",
                                reason=f"CUDA 13 nvcc is not installed: {MARKUP}"))
    return stage.seal(row=loaded, row_file=str(path), subject=provenance.subject(repo),
                      provenance=provenance.collect(), signer=signing.KeySigner(key),
                      order=[g.id for g in loaded.row.gates])


def _assert_fits_and_whole(text: str, words: list[str]) -> None:
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= WIDTH
    for word in words:  # each on one line, never folded
        assert any(word in line for line in lines), word


def test_inspect_says_stand_in_prints_brackets_and_formats_numbers(tmp_path, git_repo, make_key,
                                                                  capsys, monkeypatch):
    bundle = _seal_stand_in(tmp_path, Path(git_repo.working_dir), make_key())
    code, out, _ = _run(["inspect", str(bundle)], capsys, monkeypatch)
    assert code == 0
    _assert_fits_and_whole(out, ["operator-bitwise-ab", "operator · sm_90 (stand-in)",
                                 "build · sm_70", "'rowgate[cuda13]'",
                                 "[B4/B8/B12/B16]", "max_abs_err: 0.006467", "wall_s: 6.467 ms",
                                 "sm_clock_max_mhz: 1980 MHz", "eos_rate: 12.5 %"])
    assert "0.006467058726940968" not in out


def test_gate_table_prints_a_reason_with_brackets_intact(tmp_path, git_repo, capsys, monkeypatch):
    row = write_row(tmp_path, "TERM-HOST", f'''
        [[gates]]
        id = "host"
        kind = "host"
        commands = [["python", "-c", "import sys; sys.exit(1)", "{MARKUP}"]]
    ''')
    code, out, _ = _run(["-q", "gate", str(row), "--repo", git_repo.working_dir,
                         "--out", str(tmp_path / "ev")], capsys, monkeypatch)
    assert code == 1
    table = "\n".join(out.splitlines()[:-1])  # the last line is the bundle path
    _assert_fits_and_whole(table, ["TERM-HOST: FAIL", "'rowgate[cuda13]'", "commands_failed: 1"])


def test_review_output_lists_each_gate_with_its_arch_and_stand_in(tmp_path, monkeypatch, capsys):
    from rowgate.decision.review import load_review
    from rowgate.report import review_view
    from tests.review_support import World

    world = World(tmp_path, monkeypatch, capsys)
    row = world.row()
    code, out, _ = world.review(world.gate(row), row)
    assert code == 0
    text = "\n".join(out)
    assert "gates (re-derived)" in text and "consistent" in text and "criteria" in text
    record = load_review(Path(out[-1]))
    check = record.gates[0].model_copy(update={"arch": "sm_90", "stand_in": True,
                                               "reason": MARKUP})
    shown = io.StringIO()
    Console(file=shown, width=WIDTH).print(review_view(record.model_copy(
        update={"gates": [check]})))
    _assert_fits_and_whole(shown.getvalue(), ["sm_90 (stand-in)", "'rowgate[cuda13]'"])


def test_progress_labels_are_not_markup():
    from rowgate.cli.progress import progress

    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=WIDTH)
    with progress(1, "row", console=console) as p, p.task(MARKUP, total=1) as t:
        t.update(f"installing {MARKUP}")
        t.advance()
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())
    assert f"✓ {MARKUP} (1/1," in text


@pytest.mark.parametrize(("name", "value", "shown"), [
    ("wall_s", 0.006467058726940968, "6.467 ms"), ("ttft_median_candidate_s", 2.5e-05, "25 µs"),
    ("duration_s", 12.0, "12 s"), ("tok_s_median_oracle", 1234.5678, "1235 tok/s"),
    ("ratio_ci_low", 0.98765, "0.988×"), ("p_value", 0.000423, "4.2e-04"),
    ("oracle.graph.recoverable_idle_fraction", 0.827, "82.7 %"), ("eos_rate", 1.0, "100 %"),
    ("sm_clock_max_mhz", 1980, "1980 MHz"), ("temperature_max_c", 39, "39 °C"),
    ("bytes_per_s", 2.81e9, "2.81 GB/s"), ("max_logprob_divergence", 4.768e-06, "4.768e-06"),
    ("qk", 0.3, "0.3"), ("tok_s_median_candidate", 98765.4321, "98765 tok/s"),
    ("requests", 16, "16"), ("cells_worse", 0, "0"), ("valid", True, "yes"), ("x", None, "—"),
    ("range_opened_unix_s", 0, "1970-01-01T00:00:00+00:00"), ("mean_output_tokens", 20.375,
                                                                "20.38")])
def test_metric_values_get_units_and_a_sensible_precision(name, value, shown):
    assert units.metric(name, value) == shown

