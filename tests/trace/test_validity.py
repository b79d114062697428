"""Validity on real captures (checked in) and on bad ones planted by editing them."""

from __future__ import annotations

import copy

import pytest

from rowgate.trace import events, validity
from tests.trace import gpu_shaped as gs
from tests.trace import planted

EXPECT = validity.Expect(arm_delay=17, steps=4, clock_tolerance=0.02)


def judge(doc, clocks, expect=EXPECT):
    return validity.validate(events.from_dict(doc), clocks, expect)


def failed(v: validity.Validity) -> set[str]:
    return {c.name for c in v.checks if c.ok is False}


@pytest.mark.parametrize("name", planted.scenarios())
def test_checked_in_scenarios_judged_as_captured(name):
    """Every real capture: valid exactly when it was taken with the delayed procedure."""
    doc, clocks, record = planted.scenario(name)
    d = record["declared"]
    v = judge(doc, clocks, validity.Expect(d["arm_delay"], d["steps"], 0.02))
    if name.endswith("-delayed"):
        assert v.valid, v.reason()
        assert v.metrics == {**v.metrics, "ranges": 1, "primer_kernels_in_range": 0, "valid": 1,
                             "steps_in_range": d["steps"], "first_profiler_step": 16}
    elif name.endswith("-synchronous-start"):
        assert not v.valid
        assert "delayed_start" in failed(v)
        assert "synchronously" in v.reason()
    elif name.endswith("-primer-in-range"):
        assert "primer" in failed(v), v.reason()
        assert v.metrics["primer_kernels_in_range"] > 0
    else:
        pytest.fail(f"scenario {name}: no expectation for this name")


def test_cpu_valid_capture_passes_with_clocks_not_applicable():
    doc, clocks, _ = planted.scenario("cpu-eager-delayed")
    v = judge(doc, clocks)
    assert v.valid, v.reason()
    clock = next(c for c in v.checks if c.name == "clocks")
    assert clock.ok is None and "cpu" in clock.detail
    assert v.metrics["sm_clock_spread"] is None


def test_declared_delay_other_than_the_capture_is_refused():
    doc, clocks, _ = planted.scenario("cpu-eager-delayed")
    v = judge(doc, clocks, validity.Expect(arm_delay=257, steps=4, clock_tolerance=0.02))
    assert failed(v) == {"delayed_start"}
    assert "decode step 17, not at the declared delay 257" in v.reason()


def test_two_ranges_planted_in_a_real_trace_are_refused():
    doc, clocks, _ = planted.scenario("cpu-eager-delayed")
    v = judge(planted.two_ranges(doc), clocks)
    assert "ranges" in failed(v)
    assert v.metrics["ranges"] == 2
    assert "2 ranges" in v.reason()


def test_two_profiler_windows_written_are_refused_even_with_one_marker():
    doc, clocks, _ = planted.scenario("cpu-eager-delayed")
    doc = copy.deepcopy(doc)
    doc["rowgateRanges"] = 2  # what capture.merge_ranges records for two written windows
    assert "ranges" in failed(judge(doc, clocks))


def test_missing_range_marker_is_refused():
    doc, clocks, _ = planted.scenario("cpu-eager-delayed")
    doc = copy.deepcopy(doc)
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("name") != events.RANGE_MARKER]
    v = judge(doc, clocks)
    assert not v.valid and v.metrics["ranges"] == 0


def test_primer_step_moved_into_the_range_is_refused():
    doc, clocks, _ = planted.scenario("cpu-eager-delayed")
    doc = copy.deepcopy(doc)
    for e in doc["traceEvents"]:
        if e.get("name") == "rowgate.step#timed:1":
            e["name"] = "rowgate.step#primer:255"  # its ops now belong to a primer step
    v = judge(doc, clocks)
    assert {"primer", "steps"} <= failed(v)
    assert v.metrics["primer_kernels_in_range"] > 0


# ------------------------------------------------------------------- clocks


def test_stable_clocks_inside_the_range_pass():
    doc, _, _ = planted.scenario("cpu-eager-delayed")
    v = judge(doc, planted.clocks_over_range(doc, [1980, 1980, 1965, 1980, 1980]))
    assert v.valid, v.reason()
    assert v.metrics["sm_clock_spread"] == pytest.approx(15 / 1980)


def test_moving_clocks_are_refused():
    doc, _, _ = planted.scenario("cpu-eager-delayed")
    v = judge(doc, planted.clocks_over_range(doc, [1980, 1900, 1800, 1755, 1980]))
    assert failed(v) == {"clocks"}
    assert "moved 11.4%" in v.reason()


def test_idle_clock_in_the_range_is_refused():
    """The Thor trace's defect: the range saw the device at its idle clock, ramping up."""
    doc, _, _ = planted.scenario("cpu-eager-delayed")
    v = judge(doc, planted.clocks_over_range(doc, [345, 345, 1980, 1980, 1980]))
    assert failed(v) == {"clocks"}
    assert "idle level" in v.reason()


def test_clock_samples_only_around_a_short_range_bracket_it():
    doc, _, _ = planted.scenario("cpu-eager-delayed")
    t = events.from_dict(doc)
    rng = t.named(events.RANGE_MARKER)[0]
    around = {"max_sm_clock_mhz": 1980, "samples": [
        {"t": t.unix_s(rng.ts) - 0.004, "sm_clock_mhz": 1980, "mem_clock_mhz": 1,
         "temperature_c": 1},
        {"t": t.unix_s(rng.end) + 0.004, "sm_clock_mhz": 1980, "mem_clock_mhz": 1,
         "temperature_c": 1}]}
    assert judge(doc, around).valid
    assert "no SM clock sample" in judge(doc, {"samples": []}).reason()


# ------------------------------------------------------- GPU kernel records


def _gpu_doc(mode="eager"):
    b = gs.Builder(mode=mode)
    return b.doc([[gs.Kernel("gemv", 10.0), gs.Kernel("norm", 3.0)] for _ in range(4)])


def test_gpu_shaped_trace_with_all_args_and_stable_clocks_passes():
    doc = _gpu_doc()
    v = judge(doc, gs.stable_clocks(doc))
    assert v.valid, v.reason()


def test_kernel_without_grid_is_refused():
    doc = _gpu_doc()
    v = judge(planted.strip_kernel_arg(doc, "grid"), gs.stable_clocks(doc))
    assert failed(v) == {"kernel_args"}
    assert "lacks grid" in v.reason()


def test_device_properties_missing_are_refused():
    doc = _gpu_doc()
    doc["deviceProperties"] = []
    assert "kernel_args" in failed(judge(doc, gs.stable_clocks(doc)))


def test_kernel_launched_by_a_primer_step_is_refused():
    doc = _gpu_doc()
    for e in doc["traceEvents"]:
        if e["name"] == "rowgate.step#timed:0":
            e["name"] = "rowgate.step#primer:255"
    v = judge(doc, gs.stable_clocks(doc))
    assert "primer" in failed(v)
    assert "launched by a primer/warm step" in v.reason()


def test_kernel_whose_launch_precedes_the_recording_is_refused():
    """A primer kernel still running when recording began: its launch is not in the trace."""
    doc = _gpu_doc()
    first = next(e for e in doc["traceEvents"] if e.get("cat") == "cuda_runtime")
    doc["traceEvents"].remove(first)
    v = judge(doc, gs.stable_clocks(doc))
    assert "its launch precedes the recording" in v.reason()


def test_kernel_started_before_the_range_is_refused():
    doc = _gpu_doc()
    rng = next(e for e in doc["traceEvents"] if e["name"] == events.RANGE_MARKER)
    k = next(e for e in doc["traceEvents"] if e.get("cat") == "kernel")
    k["ts"] = rng["ts"] - 5.0
    v = judge(doc, gs.stable_clocks(doc))
    assert "started before the range opened" in v.reason()


def test_gpu_mirror_of_the_markers_is_not_a_second_range():
    """Kineto copies each record_function onto the GPU timeline (`gpu_user_annotation`)."""
    doc = _gpu_doc()
    mirrors = [dict(e, cat="gpu_user_annotation", tid=7) for e in doc["traceEvents"]
               if e.get("cat") == "user_annotation"]
    doc["traceEvents"] += mirrors
    v = judge(doc, gs.stable_clocks(doc))
    assert v.valid, v.reason()
    assert v.metrics["ranges"] == 1 and v.metrics["steps_in_range"] == 4
