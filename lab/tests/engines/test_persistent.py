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


def test_the_proof_runs_the_candidates_schedule_on_the_shared_engine(tiny_model, demo_passes):
    """The abi gate hands the proof the row run's candidate engine for the candidate's own
    schedule: that schedule runs on it (started, and left running for the gates after),
    the other on an engine of the proof's own."""
    import contextlib

    from rowgate_lab.megakernel import proof

    arm = Arm(engine="lab-persistent", mode="persistent", dtype="float32")
    shared = engines.create(arm, tiny_model.path, device="cpu",
                            options={"persistent_schedule": "dynamic-queue"})
    shared.start()
    opened = []

    @contextlib.contextmanager
    def pooled():
        opened.append(True)
        yield shared

    try:
        work = [p for p in demo_passes if p.concurrency == 4][:1]
        doc = proof.run(tiny_model.path, work, ["static-round-robin", "dynamic-queue"], "cpu",
                        "float32", {}, 0.5, shared=("dynamic-queue", pooled))
        assert opened == [True]
        cell = doc[work[0].cell]
        assert cell["schedules_identical"] is True
        assert cell["dynamic-queue"]["mismatched_requests"] == 0
        assert shared.generate(work[0]).outputs  # still started: nothing stopped it
    finally:
        shared.stop()


@pytest.mark.parametrize(("engine", "mode"), [("lab-persistent", "graph-fused"),
                                              ("lab-persistent", "graph"),
                                              ("lab-graph-fused", "graph"),
                                              ("reference", "persistent")])
def test_an_engine_refuses_a_mode_it_does_not_run(tiny_model, engine, mode):
    # An engine that ignored the mode would run its own path under another's name: a
    # trace gate asking for the persistent engine "in graph-fused mode" traced the
    # persistent kernel and sealed it as the fused baseline's graph.
    arm = Arm(engine=engine, mode=mode, dtype="bfloat16")
    with pytest.raises(EngineError, match=f"not '{mode}'"):
        engines.create(arm, tiny_model.path, device="cpu")


def test_the_megakernel_rows_trace_captures_the_graph_baselines_in_their_own_modes():
    from rowgate.gates.trace import arm_modes, captured
    from rowgate.rows.row import load_row
    from rowgate_lab import LAB

    row = load_row(LAB.parent / "rows" / "KERNEL-CUDA-DECODE-MEGAKERNEL.toml").row
    spec = next(g for g in row.gates if g.id == "trace")
    named = row.arms.named()
    pairs = arm_modes(row, spec)
    assert pairs == [("graph", "graph"), ("graph-fused", "graph-fused")]
    for name, mode in pairs:
        arm = named[name].model_copy(update={"mode": mode})
        assert engines.why_not_mode(arm) is None
    assert [engines.plugin(named[n].engine).modes for n, _ in pairs] == [
        ("eager", "graph", "default"), ("graph-fused",)]
    assert captured(row, spec) == pairs
