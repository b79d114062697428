"""Phase gate: shape parsing, attribution arithmetic on the H200's measured
medians, derive over real artifacts, the variant build with the real toolchain."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline import gates
from pipeline.gates.phase import PHASE, Phase
from pipeline.ops import phase
from pipeline.records.status import Status
from pipeline.rows import resolve_row

ROOT = Path(__file__).resolve().parents[2]
H200 = ROOT / "benchmarks" / "results" / "h200-2026-11-29" / "final" / "results.json"


def _row():
    row = resolve_row("SM70-XQA-E5M2-DECODE").row
    return row, row.gate("phase")


def test_phase_kind_is_registered():
    assert gates.IMPLEMENTED["phase"] is Phase


def test_shape_of_the_sm70_row():
    case = phase.parse_shape(_row()[1].shape)
    assert (case.batch, case.layout, case.kv, case.hq, case.hkv, case.dim, case.page) == (
        16, "ragged", "e5m2", 32, 8, 128, 64)
    assert max(case.lens) == 18227 and len(set(case.lens)) > 1
    assert phase.parse_shape("B4-uniform-page+1-e5m2-h8x2-d128-p16").lens == [17] * 4
    with pytest.raises(ValueError, match="^shape: phase variants are built for e5m2"):
        phase.parse_shape("B16-ragged-17.8K-bf16")
    with pytest.raises(ValueError, match="^shape: expected B<batch>"):
        phase.parse_shape("16-ragged")


def test_attribution_matches_the_benchmark_on_h200_medians():
    bench = json.loads(H200.read_text())["phase"]
    costs = phase.attribute(bench["medians_us"], _row()[1].phases)
    for role in ("baseline", "pipelined"):
        att = bench["attribution_us"][role]
        assert costs[role]["full"] == att["full"]
        assert costs[role]["k_load_e5m2_convert"] == pytest.approx(
            att["k_load_exposed (full - no_k_load)"])
        assert costs[role]["pv"] == pytest.approx(att["pv (pv_x2 - full)"])
        assert costs[role]["sync"] == pytest.approx(att["sync (full - no_sync)"])
    with pytest.raises(KeyError, match="phase 'tensor_cores'"):
        phase.attribute(bench["medians_us"], ["tensor_cores"])


def test_derive_over_artifacts(tmp_path):
    row, spec = _row()
    bench = json.loads(H200.read_text())["phase"]
    builds = [{"variant": v, "command": [], "returncode": 0, "log": ""}
              for v in phase.VARIANTS.values()]
    record = {"shape": spec.shape, "arch": "sm_90", "builds": builds,
              "medians_us": bench["medians_us"], "samples_us": bench["samples_us"]}
    (tmp_path / PHASE).write_text(json.dumps(record))
    derived = Phase().derive(row, spec, tmp_path)
    assert derived.status is Status.PASS, derived.reason
    assert derived.metrics["dominant_phase_baseline"] in spec.phases
    assert derived.metrics["full_us_baseline"] == round(bench["medians_us"]["baseline:full"], 3)

    builds[3]["returncode"] = 2
    (tmp_path / PHASE).write_text(json.dumps(record))
    failed = Phase().derive(row, spec, tmp_path)
    assert failed.status is Status.FAIL and "'qk_x2'" in failed.reason


def test_pending_without_a_cuda_device():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this host has a CUDA device")
    row, spec = _row()
    assert "CUDA" in Phase().requirements(row, spec, None)


@pytest.mark.slow
def test_every_variant_builds_with_the_sm90_toolchain(tmp_path):
    from pipeline.build import toolchains

    chain = toolchains.for_arch("sm_90")
    built = phase.build(chain.compiler.path, "sm_90",
                        ROOT / "kernels" / "decode_attention" / "split_kv.cu",
                        ROOT / "kernels" / "include", tmp_path)
    assert [b["returncode"] for b in built["builds"]] == [0] * len(phase.VARIANTS), [
        b["log"][-500:] for b in built["builds"] if b["returncode"]]
    assert sorted(built["cubins"]) == sorted(phase.VARIANTS.values())
    assert all(Path(p).stat().st_size > 0 for p in built["cubins"].values())
