"""The lab-persistent engine on a CPU: the persistent kernel cannot run, so every step
takes the fallback route (no CUDA: eager), recorded with the reasons, and the tokens are
the reference engine's eager ones. (On a GPU: lab/tests/megakernel/test_persistent_gpu.py.)"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from rowgate import engines  # noqa: E402
from rowgate.engines.interface import EngineError  # noqa: E402
from rowgate.rows.spec import Arm

ENGINE = {"eager": "reference", "persistent": "lab-persistent"}


def _run(tiny_model, work, mode: str, options: dict | None = None):
    arm = Arm(engine=ENGINE[mode], mode=mode, dtype="float32")
    with engines.create(arm, tiny_model.path, device="cpu", options=options) as engine:
        out = engine.generate(work)
        return [o.token_ids for o in out.outputs], engine.describe()


def test_cpu_steps_fall_back_to_eager_and_record_why(tiny_model, demo_passes):
    work = next(p for p in demo_passes if p.concurrency == 4)
    eager, _ = _run(tiny_model, work, "eager")
    tokens, described = _run(tiny_model, work, "persistent",
                             {"persistent_schedule": "static-round-robin"})
    assert tokens == eager
    assert described["mode"] == "persistent" and described["schedule"] == "static-round-robin"
    routes = json.loads(described["persistent_routes"])
    assert set(routes) <= {"1", "2", "3", "4"} and "4" in routes
    assert routes["4"] == {
        "requested": "persistent", "mode": "eager", "fell_back": True,
        "reasons": ["persistent: dtype float32 (persistent kernel: bfloat16); arch none "
                    "(persistent kernel built for sm_90)",
                    "graph: needs a CUDA device, not 'cpu'"]}


def test_an_unknown_schedule_is_refused(tiny_model):
    arm = Arm(engine="lab-persistent", mode="persistent", dtype="float32")
    with pytest.raises(EngineError, match="schedule 'round-robin' is not static-round-robin"):
        engines.create(arm, tiny_model.path, options={"persistent_schedule": "round-robin"})


def test_the_abi_gates_proof_runs_the_lab_persistent_engine(tiny_model, demo_passes):
    """proof.run, the abi gate's GPU part, on a CPU: each schedule runs on the
    lab-persistent engine (every step falls back to eager here), so every request is exact
    and the schedules agree."""
    from rowgate_lab.megakernel import proof

    work = [p for p in demo_passes if p.concurrency == 4][:1]
    doc = proof.run(tiny_model.path, work, ["static-round-robin", "dynamic-queue"], "cpu",
                    "float32", {}, 0.5)
    cell = doc[work[0].cell]
    assert cell["schedules_identical"] is True
    for schedule in ("static-round-robin", "dynamic-queue"):
        assert cell[schedule]["mismatched_requests"] == 0
        assert cell[schedule]["routes"]["4"]["requested"] == "persistent"
