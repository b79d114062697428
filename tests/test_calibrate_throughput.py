"""benchmarks/calibrate_throughput.py runs and reports (its figures belong in
docs/perf.md, never in a test: here only that each mode works end to end)."""

from __future__ import annotations

import json

import pytest

from tests.gates.test_timed_rounds import cal


def test_the_sim_mode_reports_every_rate_per_scenario_and_effect(tmp_path):
    assert cal.main(["sim", "--trials", "2", "--scenarios", "graph-quiet",
                     "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "calibration.json").read_text())
    results = doc["results"]
    assert set(results) == {f"graph-quiet/{e:g}" for e in cal.EFFECTS}
    aa = results["graph-quiet/0"]
    assert aa["runs"] == 2 and sum(aa["cells"].values()) == 6
    assert {"false_difference_rate", "false_fail_rate"} <= set(aa)
    assert "detection_rate" in results["graph-quiet/0.05"]
    assert len(aa["per_run"]) == 2 and set(aa["per_run"][0]["cells"]) == {
        "i16-c1", "i16-c4", "i16-c8"}
    assert set(doc["mde_vs_budget"]["graph-quiet/0"]) == {"8", "16", "24", "40", "80"}
    # ~20 ms synthetic passes: samples of 5 passes per arm (min_sample_s 0.1)
    ks = {c["passes_per_sample"] for run in aa["per_run"] for c in run["cells"].values()}
    assert min(ks) > 1, ks
    assert "graph-quiet/0.02" in (tmp_path / "calibration.txt").read_text()


@pytest.mark.slow
def test_the_cpu_smoke_runs_the_gate_on_the_reference_engine(tmp_path):
    assert cal.main(["cpu", "--runs", "1", "--budget-s", "60", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "calibration.json").read_text())
    aa = doc["results"]["tiny-qwen3/0"]
    # One A/A run on a loaded 2-core machine may call a cell different by chance (the
    # gate's false-difference rate is a calibration figure, docs/perf.md): the smoke
    # checks the rate is the one its cells give, not that chance spared this run.
    assert aa["runs"] == 1 and sum(aa["cells"].values()) == 2
    differ = aa["cells"].get("better", 0) + aa["cells"].get("worse", 0)
    assert aa["false_difference_rate"] == differ / 2
    assert aa["false_fail_rate"] == (0.0 if aa["per_run"][0]["status"] == "PASS" else 1.0)
    assert aa["legacy_c1_cell_s"] > 0 and aa["c1_vs_legacy"] > 0
    raw = tmp_path / "runs" / "tiny-qwen3-0-0"
    assert {p.name for p in raw.iterdir()} == {"meta.json", "passes.csv", "requests.jsonl.gz"}
    assert doc["phases"] == ["tiny-qwen3/0", "tiny-qwen3/0.05", "tiny-qwen3/0/two-loads"]
    meta = json.loads((raw / "meta.json").read_text())
    assert meta["candidate"]["engine"]["same_object_as_baseline"] == "true"
    two = doc["results"].get("tiny-qwen3/0/two-loads")
    assert two is None or "instance difference" in two["note"]
