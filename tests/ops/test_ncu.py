"""The phase gate's ncu command and the parser of ncu's raw CSV page, on a CSV the
H200 produced (tests/data/phase-h200/ncu.csv, measured 2026-11-29)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rowgate.ops import ncu
from tests.support import LAB

CSV = Path(__file__).resolve().parents[2] / "tests" / "data" / "phase-h200" / "ncu.csv"


def test_raw_page_of_a_real_run():
    rows = ncu.parse(CSV.read_text())
    assert len(rows) == 8 and rows[0]["kernel"] == "split_kv_e5m2_d128_g4_base"
    m, units = rows[0]["metrics"], rows[0]["units"]
    assert m["gpu__time_duration.sum"] == 185952.0 and units["gpu__time_duration.sum"] == "ns"
    assert m["smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio"] == 5.28
    assert m["launch__grid_dim_x"] == 32.0 and m["launch__cluster_scheduling_policy"] == "PolicySpread"


def test_messages_thousands_separators_and_a_missing_header():
    text = ('==PROF== Connected to process 7\n==ERROR== Failed to find metric x__y\n'
            '"ID","Kernel Name","a__b.sum"\n"","","byte"\n"0","k","1,234,567"\n')
    assert ncu.messages(text) == ["==PROF== Connected to process 7",
                                  "==ERROR== Failed to find metric x__y"]
    [row] = ncu.parse(text)
    assert row == {"kernel": "k", "metrics": {"a__b.sum": 1234567.0}, "units": {"a__b.sum": "byte"}}
    with pytest.raises(ValueError, match="no CSV header row"):
        ncu.parse("==ERROR== The application returned an error code (1).\n")


def test_command_selects_the_entry_by_exact_name_after_the_warmup():
    argv = ncu.command("/usr/bin/ncu", ["a__b.sum", "c__d.avg"], "pm_decode_e5m2_h128_g4_ref",
                       2, 1, ["python", "-m", "x"])
    assert argv[:6] == ["/usr/bin/ncu", "--csv", "--page", "raw", "--metrics", "a__b.sum,c__d.avg"]
    assert argv[argv.index("--kernel-name") + 1] == "regex:^pm_decode_e5m2_h128_g4_ref$"
    assert argv[argv.index("--launch-skip") + 1] == "2" and argv[-3:] == ["python", "-m", "x"]


def test_the_phase_gates_request_is_what_the_profiled_process_reads(tmp_path):
    """collect_counters writes the request; profile_launch (in ncu's process) reads it."""
    import json

    from rowgate.cuda import kernels
    from rowgate.ops import profile_launch
    from rowgate.ops.phase import parse_shape

    decl = kernels.load(LAB).operators["split_kv"]
    case = parse_shape("B16-ragged-17.8K-e5m2")
    req = {"cubin": "x.cubin", "operator": "split_kv",
           "table": decl.model_dump(exclude={"phase_build", "phases"}),
           "entry": "split_kv_e5m2_d128_g4_base", "case": case.as_dict(), "warmup": 2,
           "launches": 1}
    operator, again = profile_launch.parse_request(json.loads(json.dumps(req)))
    assert again == case and operator == decl.to_contract("split_kv")
