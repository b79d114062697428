"""Capture end to end: the reference engine on the tiny model, a real torch.profiler range."""

from __future__ import annotations

import json

import pytest

from rowgate.engines.reference import ReferenceEngine
from rowgate.models.tiny import build_tiny_model
from rowgate.trace import analysis, events, validity
from rowgate.trace.capture import CapturePlan, ClockSampler, capture, merge_ranges

SMALL = dict(concurrency=2, primer_steps=4, primer_concurrency=1, arm_delay=5, steps=2)


@pytest.fixture(scope="module")
def tiny():
    return build_tiny_model()


def prompts(n=2):
    return [tuple(range(2 + 20 * i, 18 + 20 * i)) for i in range(n)]


def run(tiny, tmp_path, plan, device="cpu", mode="eager"):
    with ReferenceEngine(tiny.path, device=device, mode=mode) as engine:
        record = capture(engine, prompts(), plan, tmp_path, device,
                         0 if device.startswith("cuda") else None)
    trace = events.load(tmp_path / "trace.json.gz")
    clocks = json.loads((tmp_path / "clocks.json").read_text())
    return record, trace, clocks


def test_schedule_arms_at_the_declared_delay():
    plan = CapturePlan(concurrency=1, primer_steps=256, primer_concurrency=1, arm_delay=257,
                       steps=32)
    assert plan.schedule() == (255, 1, 32)
    assert plan.timed_steps() == 32
    late = CapturePlan(concurrency=1, primer_steps=4, primer_concurrency=1, arm_delay=8, steps=2)
    assert late.timed_steps() == 5  # the 3 steps between primer and delay are timed, unrecorded


def test_delayed_capture_on_cpu_is_one_valid_range(tiny, tmp_path):
    record, trace, clocks = run(tiny, tmp_path, CapturePlan(**SMALL))
    assert record["ranges_written"] == 1
    assert record["copy_ceiling"]["bytes_per_s"] > 0
    assert clocks["skipped"].startswith("cpu")
    v = validity.validate(trace, clocks, validity.Expect(5, 2, 0.02))
    assert v.valid, v.reason()
    assert [n for n, _ in trace.profiler_steps()] == [4, 5]
    assert {p for p, _, _ in trace.steps()} == {"timed"}
    a = analysis.analyze(trace, "eager", record["copy_ceiling"]["bytes_per_s"], 0.1)
    assert a.path["distinct_paths"] == 1 and len(a.steps) == 2
    assert all(w.origin in ("forward", "other") for w in a.items)
    assert any(w.origin == "forward" for w in a.items)


def test_a_traced_engine_is_left_as_it_was_started(tiny, tmp_path):
    # The engine serves the row's later gates (engine_pool): its markers and the
    # stepper's per-step synchronization must come off, and it must generate the same.
    from rowgate.engines.interface import Request, WorkloadPass

    work = WorkloadPass(cell="c", concurrency=2, requests=tuple(
        Request(id=f"r{i}", cell="c", prompt_ids=p, max_tokens=4, seed=0)
        for i, p in enumerate(prompts())))
    with ReferenceEngine(tiny.path, device="cpu", mode="eager") as engine:
        before = [o.token_ids for o in engine.generate(work).outputs]
        step, decode = engine._decode_step, engine.model.decode
        capture(engine, prompts(), CapturePlan(**SMALL), tmp_path, "cpu")
        assert "_decode_step" not in vars(engine) and "decode" not in vars(engine.model)
        assert engine._decode_step == step and engine.model.decode == decode
        assert [o.token_ids for o in engine.generate(work).outputs] == before


def test_synchronous_start_on_cpu_is_refused(tiny, tmp_path):
    _, trace, clocks = run(tiny, tmp_path, CapturePlan(**SMALL, synchronous=True))
    v = validity.validate(trace, clocks, validity.Expect(5, 2, 0.02))
    assert not v.valid and "synchronously" in v.reason()


def test_primer_longer_than_the_delay_lands_in_the_range(tiny, tmp_path):
    _, trace, clocks = run(tiny, tmp_path, CapturePlan(**{**SMALL, "primer_steps": 8}))
    v = validity.validate(trace, clocks, validity.Expect(5, 2, 0.02))
    assert "primer" in {c.name for c in v.checks if c.ok is False}


def test_a_capture_without_any_range_is_an_error():
    from rowgate.trace.capture import CaptureError

    with pytest.raises(CaptureError, match="no trace"):
        merge_ranges([])


def test_clock_sampler_on_cpu_records_why_it_is_empty():
    with ClockSampler(None) as s:
        pass
    assert s.record() == {"skipped": "cpu: no NVML clocks on a CPU capture", "samples": []}


@pytest.mark.gpu
def test_gpu_capture_eager_and_graph(tiny, tmp_path):
    """On a GPU: both modes give one valid range with kernel records and stable clocks;
    the graph capture proves the route, the eager one does not."""
    plan = CapturePlan(**SMALL)
    found = {}
    for mode in ("eager", "graph"):
        record, trace, clocks = run(tiny, tmp_path / mode, plan, "cuda:0", mode)
        v = validity.validate(trace, clocks, validity.Expect(5, 2, 0.05))
        assert v.valid, v.reason()
        assert trace.kernels and clocks["samples"]
        found[mode] = analysis.analyze(trace, mode, record["copy_ceiling"]["bytes_per_s"], 0.1)
    assert found["graph"].graph["proved"] is True
    assert found["eager"].graph["proved"] is False
    assert found["eager"].waves["supported"] and found["graph"].waves["supported"]
