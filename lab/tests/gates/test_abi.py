"""The abi gate on the megakernel row, on a CPU: task lists for batch 1/4/8 built and
validated, admission read from the trace gate's staged result and judged with the row's
stop-implementation condition, the GPU proof PENDING without an sm_90 device, and a
derive that re-validates the sealed bytes rather than trusting the measured report."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from rowgate import compressed
from rowgate.gates.interface import GateContext, run_gate
from rowgate.records.gate_result import GateResult
from rowgate.records.status import Status
from rowgate.rows.row import load_row
from rowgate_lab.abi_gate import Abi
from rowgate_lab.megakernel import abi, proof

LAB = Path(__file__).resolve().parents[2]  # the subject
ROW = load_row(LAB.parent / "rows" / "KERNEL-CUDA-DECODE-MEGAKERNEL.toml").row
SPEC = next(g for g in ROW.gates if g.kind == "abi")


def _stage(tmp_path: Path, trace: GateResult | None) -> tuple[Path, dict[str, GateResult]]:
    """A stage root and the results before abi, as the runner hands them over."""
    root = tmp_path / "bundle"
    root.mkdir(parents=True)
    return root, ({"trace": trace} if trace is not None else {})


def _trace(status: Status, recoverable: float | None, verdict: str | None) -> GateResult:
    metrics = {"valid": 1}
    if recoverable is not None:
        metrics.update(recoverable_idle_fraction=recoverable, capacity_verdict=verdict)
    return GateResult(gate_id="trace", kind="trace", status=status,
                      reason=f"trace {status.value}", metrics=metrics)


def _run(staged: tuple[Path, dict[str, GateResult]]) -> GateResult:
    root, earlier = staged
    ctx = GateContext(repo=LAB, artifact_dir=root / "artifacts" / "abi",
                      subject=None, provenance=None,  # type: ignore[arg-type]  # unused by abi
                      earlier=earlier)
    return run_gate(Abi(), ROW, SPEC, ctx, root)


@pytest.fixture(scope="module")
def admitted(tmp_path_factory) -> tuple[Path, GateResult]:
    staged = _stage(tmp_path_factory.mktemp("admitted"), _trace(Status.PASS, 0.25, "material"))
    return staged[0], _run(staged)


def test_lists_are_built_and_valid_and_the_gpu_part_is_pending(admitted):
    root, r = admitted
    assert r.status is Status.PENDING
    assert re.match(r"3 task list\(s\) valid \(\d+ tasks, batch 1/4/8\); GPU proof pending: "
                    r"needs an sm_90 device", r.reason), r.reason
    # PENDING carries no metrics (the review's contract); the facts are in the artifacts
    assert r.metrics == {} and r.cells == {}
    art = root / "artifacts" / "abi"
    for b in (1, 4, 8):
        tasks = json.loads(compressed.read_text(art / f"b{b}" / "tasks.json.gz"))
        packed = art / f"b{b}" / "tasks.bin.gz"  # sealed gzipped, as the kernel reads it
        assert not (art / f"b{b}" / "tasks.bin").exists()
        assert len(tasks) == len(compressed.read_bytes(packed)) // abi.TASK_BYTES
        assert tasks[0]["op"] == "EMBED" and tasks[-1]["op"] == "LOGITS"
        assert json.loads((art / f"b{b}" / "validation.json").read_text())["ok"] is True
    assert json.loads((art / "admission.json").read_text())["result"]["metrics"][
        "recoverable_idle_fraction"] == 0.25
    assert json.loads((art / "device.json").read_text())["present"] is False


def test_derive_revalidates_the_sealed_bytes(admitted, tmp_path):
    root, _ = admitted
    art = tmp_path / "abi"
    shutil.copytree(root / "artifacts" / "abi", art)
    data = bytearray(compressed.read_bytes(art / "b1" / "tasks.bin.gz"))
    data[5 * abi.TASK_BYTES] = 42  # task 5's opcode (low byte)
    compressed.write_bytes(art / "b1" / "tasks.bin.gz", bytes(data))
    d = Abi().derive(ROW, SPEC, art)
    assert d.status is Status.FAIL
    assert d.reason.startswith("batch 1: task 5 (opcode 42): unknown opcode 42")
    assert d.metrics["validator_problems"] >= 1


def test_a_list_sealed_plain_derives_as_before_and_a_broken_gzip_is_an_error(admitted, tmp_path):
    from rowgate.gates.interface import GateError

    root, result = admitted
    art = tmp_path / "abi"
    shutil.copytree(root / "artifacts" / "abi", art)
    for b in (1, 4, 8):  # a bundle sealed before tasks.bin and plan.json were gzipped
        for name in ("tasks.bin", "plan.json"):
            packed = art / f"b{b}" / f"{name}.gz"
            (art / f"b{b}" / name).write_bytes(compressed.read_bytes(packed))
            packed.unlink()
    d = Abi().derive(ROW, SPEC, art)
    assert (d.status, d.reason) == (result.status, result.reason)
    plain = art / "b1" / "tasks.bin"
    packed = compressed.pack(plain.read_bytes())
    plain.unlink()
    (art / "b1" / "tasks.bin.gz").write_bytes(packed[:len(packed) // 2])  # cut short
    with pytest.raises(GateError, match=r"b1/tasks.bin.gz unreadable"):
        Abi().derive(ROW, SPEC, art)


def test_no_material_idle_capacity_stops_the_implementation(tmp_path):
    r = _run(_stage(tmp_path, _trace(Status.PASS, 0.031, "not material")))
    assert r.status is Status.FAIL
    assert r.reason.startswith("stop-implementation (no-idle-capacity): trace "
                               "recoverable_idle_fraction = 0.031 lt 0.1: stop implementation")
    assert r.metrics["admitted"] == "refused" and r.metrics["gpu_proof"] == "not admitted"
    assert r.metrics["validator_problems"] == 0  # the ABI part still ran


def test_a_pending_trace_leaves_admission_pending(tmp_path):
    r = _run(_stage(tmp_path, _trace(Status.PENDING, None, None)))
    assert r.status is Status.PENDING
    assert "admission pending: trace is PENDING (trace PENDING)" in r.reason
    assert r.metrics == {}


def test_an_invalid_trace_refuses(tmp_path):
    r = _run(_stage(tmp_path, _trace(Status.FAIL, 0.5, "material")))
    assert r.status is Status.FAIL
    assert r.reason.startswith("stop-implementation: trace is FAIL (trace FAIL)")


def test_a_missing_trace_result_refuses(tmp_path):
    r = _run(_stage(tmp_path, None))
    assert r.status is Status.FAIL
    assert "admitting gate 'trace' has no result in this bundle (it must run before abi)" \
        in r.reason


def test_a_result_file_in_the_stage_is_not_an_admission(tmp_path):
    # only the runner's results count: a gate's commands can write into the stage
    root, earlier = _stage(tmp_path, None)
    (root / "gates").mkdir()
    (root / "gates" / "trace.json").write_text(
        _trace(Status.PASS, 0.25, "material").model_dump_json())
    r = _run((root, earlier))
    assert r.status is Status.FAIL and "has no result in this bundle" in r.reason


def _outs(n: int, parted: dict[int, tuple[int, float]] | None = None,
          side: str = "eager") -> list[proof.Out]:
    """`n` requests of 24 greedy tokens; `parted` {request: (position, gap)} parts the
    paths there: each keeps 7 or 8 and has the other's `gap` nats below its own."""
    outs = []
    for r in range(n):
        toks, lps = [10 + r] * 24, [-0.5] * 24
        alts = [((900, -3.0),)] * 24
        if parted and r in parted:
            pos, gap = parted[r]
            mine, other = (7, 8) if side == "eager" else (8, 7)
            toks[pos], alts[pos] = mine, ((900, -0.5 - gap / 2), (other, -0.5 - gap))
            for i in range(pos + 1, 24):  # histories differ after the split
                toks[i] = toks[i] + (0 if side == "eager" else 1)
        outs.append(proof.Out(tuple(toks), tuple(lps), tuple(alts)))
    return outs


def _with_proof(admitted, tmp_path, parted: dict | None = None, racy: bool = False) -> Path:
    """The admitted artifacts as an sm_90 machine would leave them: a device and a proof,
    made by the proof's own comparison of eager and persistent outputs."""
    root, _ = admitted
    art = tmp_path / "abi"
    shutil.copytree(root / "artifacts" / "abi", art)
    (art / "device.json").write_text(json.dumps({"present": True, "why_not": "",
                                                 "name": "NVIDIA H200", "arch": "sm_90"}))
    route = {"requested": "persistent", "mode": "persistent", "fell_back": False, "reasons": []}
    fell = {"requested": "persistent", "mode": "graph", "fell_back": True,
            "reasons": ["persistent: batch 12 (persistent kernel: 1..8)"]}
    doc = {}
    for cell in ("i128-c1", "i128-c4", "i128-c8"):
        doc[cell] = {}
        for s in SPEC.schedules:
            hit = parted if cell == "i128-c4" and s == "dynamic-queue" else None
            doc[cell][s] = {**proof.compare(_outs(8, hit), _outs(8, hit, "persistent"), 0.5),
                            "routes": {"1": route, "12": fell}}
        doc[cell]["schedules_identical"] = not (racy and cell == "i128-c8")
    (art / "proof.json").write_text(json.dumps(doc))
    return art


def test_equal_tokens_on_the_device_pass_and_name_the_fallback(admitted, tmp_path):
    d = Abi().derive(ROW, SPEC, _with_proof(admitted, tmp_path))
    assert d.status is Status.PASS, d.reason
    assert d.reason.endswith("persistent tokens equal eager in 6 run(s): 48/48 requests exact; "
                             "schedules identical; fallback taken at batch 12")
    assert d.metrics["mismatched_requests"] == 0 and d.metrics["gpu_proof"] == "passed"
    assert d.metrics["admitted"] == "admitted" and d.metrics["task_lists"] == 3


def test_a_top2_swap_within_the_tie_margin_passes_and_is_counted(admitted, tmp_path):
    d = Abi().derive(ROW, SPEC, _with_proof(admitted, tmp_path, {3: (17, 0.125)}))
    assert d.status is Status.PASS, d.reason
    assert "47/48 requests exact, 1 parting at a near-tie within the row's tie margin" \
        in d.reason
    assert d.metrics["tie_requests"] == 1 and d.metrics["mismatched_requests"] == 0
    assert d.cells["i128-c4"]["dynamic_ties"] == 1 and d.cells["i128-c4"]["static_ties"] == 0
    assert d.cells["i128-c4"]["dynamic_exact"] == 7 and d.cells["i128-c4"]["schedules_identical"]
    assert d.cells["i128-c4"]["tasks"] > 0  # the task-list facts stay beside them


def test_a_token_mismatch_on_the_device_fails_naming_the_first(admitted, tmp_path):
    # the same swap, but 2 nats apart: far outside bf16 noise, a real divergence
    d = Abi().derive(ROW, SPEC, _with_proof(admitted, tmp_path, {3: (17, 2.0), 5: (1, 0.0)}))
    assert d.status is Status.FAIL
    assert d.reason == ("persistent tokens differ from eager: 1 request(s), first i128-c4 "
                        "dynamic-queue {'request': 3, 'position': 17, 'eager': 7, "
                        "'persistent': 8, 'tie': False, 'eager_gap': 2.0, "
                        "'persistent_gap': 2.0}")
    assert d.metrics["tie_requests"] == 1 and d.metrics["mismatched_requests"] == 1


def test_schedules_that_disagree_fail_as_a_race(admitted, tmp_path):
    d = Abi().derive(ROW, SPEC, _with_proof(admitted, tmp_path, racy=True))
    assert d.status is Status.FAIL
    assert d.reason == "the schedules disagree (a race) in i128-c8"


