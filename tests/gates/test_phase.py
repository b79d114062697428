"""Phase gate: shapes, the variants a subject's operator declares, attribution arithmetic
on the H200's measured medians, derive over real artifacts (costs, counters from a real
ncu CSV, failed builds), PENDING without ncu. Variant builds with the real toolchain:
test_subject.py and test_stand_ins.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rowgate import gates
from rowgate.cuda import kernels
from rowgate.gates.interface import Status
from rowgate.gates.phase import PHASE, Phase, _ncu_missing, derive_phase
from rowgate.ops import phase
from rowgate.rows.row import resolve_row
from tests.support import LAB

ROOT = Path(__file__).resolve().parents[2]
H200 = ROOT / "tests" / "data" / "phase-h200"
# the benchmark's variant names -> the phases rowgate's kernels.toml declares
BENCH = {"full": "full", "no_k_load": "k_load_e5m2_convert", "no_v_load": "v_load_e5m2_convert",
         "qk_x2": "qk", "pv_x2": "pv", "convert_x2": "convert", "no_sync": "sync",
         "no_smem_publish": "smem_publish"}


def _row():
    row = resolve_row("SM70-XQA-E5M2-DECODE").row
    return row, row.gate("phase")


def _medians() -> dict[str, float]:
    bench = json.loads((H200 / "results.json").read_text())["phase"]["medians_us"]
    roles = {"baseline": "baseline", "pipelined": "candidate"}
    return {f"{roles[k.split(':')[0]]}:{BENCH[k.split(':')[1]]}": v for k, v in bench.items()}


def _effects() -> dict[str, str]:
    decl = kernels.load(LAB).operators["split_kv"]
    return {p: decl.phases[p].effect for p in _row()[1].phases}


def test_phase_kind_is_registered():
    assert gates.registry.lookup("phase") is Phase


def test_shapes():
    case = phase.parse_shape(_row()[1].shape)
    assert (case.batch, case.layout, case.kv, case.hq, case.hkv, case.dim, case.page) == (
        16, "ragged", "e5m2", 32, 8, 128, 64)
    assert max(case.lens) == 18227 and len(set(case.lens)) > 1
    assert phase.parse_shape("B4-uniform-page+1-bf16-h8x2-d64-p16").lens == [17] * 4
    with pytest.raises(ValueError, match="^shape: expected B<batch>"):
        phase.parse_shape("16-ragged")
    with pytest.raises(ValueError, match="^shape: 30 query heads are not a multiple of 8"):
        phase.parse_shape("B4-uniform-1-e5m2-h30x8")


def test_variants_of_rowgates_own_operator():
    decl = kernels.load(LAB).operators["split_kv"]
    v = phase.variants(decl.phase_build.defines, decl.phases, ["qk", "sync"])
    assert v == {"full": ["RG_ONLY_E5M2_D128_G4"], "qk": ["RG_ONLY_E5M2_D128_G4", "RG_PHASE=3"],
                 "sync": ["RG_ONLY_E5M2_D128_G4", "RG_PHASE=6"]}
    with pytest.raises(KeyError, match="phase 'tensor_cores' is not declared by the operator"):
        phase.variants([], decl.phases, ["tensor_cores"])


def test_attribution_matches_the_benchmark_on_h200_medians():
    bench = json.loads((H200 / "results.json").read_text())["phase"]
    costs = phase.attribute(_medians(), _effects())
    for role, bench_role in (("baseline", "baseline"), ("candidate", "pipelined")):
        att = bench["attribution_us"][bench_role]
        assert costs[role]["full"] == att["full"]
        assert costs[role]["k_load_e5m2_convert"] == pytest.approx(
            att["k_load_exposed (full - no_k_load)"])
        assert costs[role]["pv"] == pytest.approx(att["pv (pv_x2 - full)"])
        assert costs[role]["sync"] == pytest.approx(att["sync (full - no_sync)"])


def _artifacts(tmp_path: Path, *, counters: bool) -> tuple[dict, Path]:
    """phase.json as measure writes it, over the H200's medians and a real ncu CSV."""
    cubin = tmp_path / "builds" / "full" / "k.cubin"
    cubin.parent.mkdir(parents=True)
    cubin.write_bytes(b"\x7fELF not a real cubin")
    import hashlib

    digest = hashlib.sha256(cubin.read_bytes()).hexdigest()
    builds = {v: {"defines": [], "dir": "builds/full", "cubin": "k.cubin", "sha256": digest,
                  "problems": [], "entry_points": []} for v in ["full", *_effects()]}
    record = {"shape": _row()[1].shape, "arch": "sm_90", "builds": builds,
              "effects": _effects(), "medians_us": _medians()}
    if counters:
        for role, entry in (("baseline", "split_kv_e5m2_d128_g4_base"),
                            ("candidate", "split_kv_e5m2_d128_g4_pipe")):
            shutil.copyfile(H200 / "ncu.csv", tmp_path / f"ncu-{role}.csv")
            (tmp_path / f"ncu-{role}.log").write_text("")
            record.setdefault("counters", {})[role] = {
                "csv": f"ncu-{role}.csv", "log": f"ncu-{role}.log", "entry": entry,
                "returncode": 0}
    (tmp_path / PHASE).write_text(json.dumps(record))
    return record, tmp_path


def test_derive_costs_and_counters_from_the_raw_files(tmp_path):
    row, spec = _row()
    spec = spec.model_copy(update={"counters": [
        "smsp__warps_eligible.avg.per_cycle_active",
        "smsp__average_warp_latency_issue_stalled_long_scoreboard"]})
    _, d = _artifacts(tmp_path, counters=True)
    derived = Phase().derive(row, spec, d)
    assert derived.status is Status.PASS, derived.reason
    assert derived.metrics["dominant_phase_baseline"] in spec.phases
    assert derived.metrics["full_us_baseline"] == round(_medians()["baseline:full"], 3)
    from rowgate.ops import ncu

    launches = [r for r in ncu.parse((H200 / "ncu.csv").read_text())
                if r["kernel"] == "split_kv_e5m2_d128_g4_base"]
    assert derived.metrics["counter_baseline_smsp__warps_eligible.avg.per_cycle_active"] == \
        launches[-1]["metrics"]["smsp__warps_eligible.avg.per_cycle_active"]
    # a base name ncu expands counts with every expansion
    assert derived.metrics[
        "counter_candidate_smsp__average_warp_latency_issue_stalled_long_scoreboard.ratio"] > 0
    assert "2 counter(s) per role from ncu" in derived.reason


def test_a_counter_ncu_did_not_report_fails_quoting_ncu(tmp_path):
    row, spec = _row()
    spec = spec.model_copy(update={"counters": ["smsp__pcsamp_warps_issue_stalled_long_scoreboard"]})
    record, d = _artifacts(tmp_path, counters=True)
    (d / "ncu-baseline.log").write_text("==ERROR== Failed to find metric "
                                        "smsp__pcsamp_warps_issue_stalled_long_scoreboard\n")
    derived = derive_phase(record, spec, d)
    assert derived.status is Status.FAIL
    assert "counters: baseline: smsp__pcsamp_warps_issue_stalled_long_scoreboard is not in " \
           "ncu's output (==ERROR== Failed to find metric smsp__pcsamp_warps_issue_stalled_long_" \
           "scoreboard); candidate: smsp__pcsamp" in derived.reason
    (d / "ncu-candidate.csv").write_text("==ERROR== the device is not supported\n")
    derived = derive_phase(record, spec, d)
    assert "candidate: no profiled launch of split_kv_e5m2_d128_g4_pipe" in derived.reason


def test_a_variant_that_did_not_build_clean_fails_naming_it(tmp_path):
    row, spec = _row()
    record, d = _artifacts(tmp_path, counters=False)
    record["builds"]["qk"]["problems"] = ["split_kv sm_90: nvcc exited 2: error: boom"]
    derived = derive_phase(record, spec, d)
    assert derived.status is Status.FAIL
    assert derived.reason == ("1 phase variant(s) did not build clean; first qk: "
                              "split_kv sm_90: nvcc exited 2: error: boom")
    record["builds"]["qk"]["problems"] = []
    (d / "builds" / "full" / "k.cubin").write_bytes(b"swapped")
    assert "its cubin is not the one built" in derive_phase(record, spec, d).reason


def test_pending_without_a_cuda_device_or_without_ncu(monkeypatch):
    import torch

    row, spec = _row()
    if not torch.cuda.is_available():
        assert "CUDA" in Phase().requirements(row, spec, None)
    monkeypatch.setenv("PATH", "/nonexistent")
    assert _ncu_missing(spec) == (
        "ncu (Nsight Compute) is not on PATH: the row's counters (" + ", ".join(spec.counters)
        + ") are collected with it")
    assert _ncu_missing(spec.model_copy(update={"counters": []})) is None
