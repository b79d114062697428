"""Trace gate: real captures on the tiny model (CPU rows), derive redone from the
artifacts, refusals, PENDING on a GPU row without the device, ERROR on an arm it
cannot step."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from rowgate import compressed, gates
from rowgate.gates.trace import Trace
from rowgate.records.status import Status
from rowgate.rows.row import load_row
from rowgate.run import provenance, runner
from rowgate.seal import device
from tests.gates.engine_rows import ROOT, Lines, run_one, tiny_row
from tests.trace import planted

GATE = '''
    [[gates]]
    id = "trace"
    kind = "trace"
    modes = ["eager"]
    arms = ["{arms}"]
    warm_concurrency = 2
    primer_steps = {primer}
    primer_concurrency = 1
    arm_delay = {delay}
    steps = 3
'''


def trace_row(tmp, row_id, primer=6, delay=7, arms="candidate", oracle="reference"):
    return tiny_row(tmp, row_id, GATE.format(primer=primer, delay=delay, arms=arms),
                    oracle=oracle, concurrency="[1, 2]")


@pytest.fixture(scope="module")
def passed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("trace")
    row = trace_row(tmp, "TRACE-CPU")
    return row, run_one(Trace(), row, "trace", tmp / "stage"), tmp / "stage" / "artifacts" / "trace"


def test_cpu_row_captures_a_valid_range_and_gives_a_verdict(passed):
    _, result, _ = passed
    assert result.status is Status.PASS, result.reason
    m = result.metrics
    assert (m["valid"], m["ranges"], m["primer_kernels_in_range"]) == (1, 1, 0)
    assert m["sm_clock_spread"] is None
    assert m["capacity_verdict"] in ("material", "not material")
    assert m["capacity_verdict"] == ("material" if m["recoverable_idle_fraction"] >= 0.10
                                     else "not material")
    assert m["candidate.eager.tail_fraction"] is None
    assert "wave tails n/a on a CPU trace" in result.reason
    assert result.arch == "cpu"
    assert set(result.cells) == {"i16-c2"}


def test_artifacts_for_reviewers(passed):
    _, result, art = passed
    names = {p.split("/", 2)[2] for p in result.artifacts}
    for f in ("trace.json.gz", "clocks.json", "capture.json", "analysis.json.gz",
              "kernels.csv.gz", "timeline.png", "hta.json"):
        assert f"candidate-eager/{f}" in names
    assert "idle-breakdown.png" in names
    assert (art / "idle-breakdown.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    header = compressed.read_text(art / "candidate-eager/kernels.csv.gz").splitlines()[0]
    assert header.startswith("step,index,name,kind,ts,dur,grid,block")


def test_derive_redone_from_the_artifacts_matches(passed):
    row, result, art = passed
    loaded = load_row(row).row
    again = Trace().derive(loaded, loaded.gate("trace"), art)
    assert (again.status, again.reason, again.metrics, again.cells) == (
        result.status, result.reason, result.metrics, result.cells)


def test_derive_refuses_a_swapped_in_synchronous_trace(passed, tmp_path):
    row, _, art = passed
    copy = tmp_path / "trace"
    shutil.copytree(art, copy)
    bad = planted.DATA / "cpu-synchronous-start" / "trace.json.gz"
    shutil.copy(bad, copy / "candidate-eager" / "trace.json.gz")
    loaded = load_row(row).row
    d = Trace().derive(loaded, loaded.gate("trace"), copy)
    assert d.status is Status.FAIL
    assert "candidate eager trace refused" in d.reason and "synchronously" in d.reason
    assert d.metrics["valid"] == 0


def test_primer_longer_than_the_delay_fails_the_gate(tmp_path):
    row = trace_row(tmp_path, "TRACE-PRIMER", primer=8, delay=5)
    result = run_one(Trace(), row, "trace", tmp_path / "stage")
    assert result.status is Status.FAIL
    assert "primer" in result.reason and result.metrics["primer_kernels_in_range"] > 0


def test_gpu_row_without_the_device_is_pending(tmp_path):
    row_path = trace_row(tmp_path, "TRACE-GPU")
    text = row_path.read_text().replace('arch = "cpu"', 'arch = "sm_90"')
    row_path.write_text(text)
    row = load_row(row_path).row
    devices = device.inventory()
    ctx = runner.gate_context(row, row.gate("trace"), repo=ROOT,
                              artifact_dir=tmp_path / "stage/artifacts/trace",
                              subject=provenance.subject(ROOT), provenance=provenance.collect(),
                              devices=devices, progress=Lines())
    result = gates.run(row, row.gate("trace"), ctx, tmp_path / "stage")
    assert result.status is Status.PENDING
    assert "needs an sm_90 device" in result.reason


@pytest.mark.slow
def test_a_vllm_arm_is_traced_through_its_own_profiler(tmp_path):
    # mode eager: vLLM's enforce_eager (no torch.compile: ~50 s less start-up on 2 cores)
    row = trace_row(tmp_path, "TRACE-VLLM", arms="oracle", oracle="vllm")
    result = run_one(Trace(), row, "trace", tmp_path / "stage", {"vllm_max_num_seqs": "4"})
    assert result.status is Status.PASS, result.reason
    assert result.metrics["oracle.eager.valid"] == 1
    assert "traced tokens not matched: the row has no tokens gate" in result.reason
    record = (tmp_path / "stage/artifacts/trace/oracle-eager/capture.json").read_text()
    assert '"kind": "engine"' in record and '"delay_iterations": 7' in record


def test_trace_kind_is_registered():
    assert gates.registry.lookup("trace") is Trace


def test_sealed_bundle_holds_the_trace_and_verifies(tmp_path, git_repo):
    """Through the runner: capture, seal, sign, verify; the raw trace is in the bundle."""
    from rowgate.cli.progress import PlainProgress
    from rowgate.run import runner
    from rowgate.seal import signing
    from rowgate.seal.bundle import Bundle

    row = trace_row(tmp_path, "TRACE-SEAL", primer=2, delay=3)
    signer = signing.default_signer(announce=lambda msg: None)
    run = runner.run_row(load_row(row), Path(git_repo.working_dir), tmp_path / "evidence",
                         signer, PlainProgress(quiet=True))
    result = next(r for r in run.results if r.gate_id == "trace")
    assert result.status is Status.PASS, result.reason
    bundle = Bundle.open(run.bundle)
    bundle.verify(signer.verifier())
    assert "artifacts/trace/candidate-eager/trace.json.gz" in result.artifacts
