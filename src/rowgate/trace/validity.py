"""Is a captured trace evidence? Each check is a pure function of the saved trace.

A trace is refused (with the reason) when it holds more than one range, when
the range did not start at the declared delay (a synchronous start records the
idle device and its clock ramp), when primer work lies inside the range, when
the SM clock moved or idled inside the range, or when kernel records lack the
launch arguments the analysis needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rowgate.trace import events
from rowgate.trace.events import Span, Trace

KERNEL_ARGS = ("grid", "block", "registers per thread", "shared memory")
DEVICE_PROPS = ("numSms", "regsPerMultiprocessor", "sharedMemPerMultiprocessor",
                "maxThreadsPerMultiprocessor")
IDLE_CLOCK_FRACTION = 0.5
"""An SM clock below half the maximum inside the range is an idle / downclocked state."""


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool | None
    """None: not applicable to this trace (e.g. clocks on a CPU capture), with why."""
    detail: str


@dataclass(frozen=True)
class Validity:
    checks: tuple[Check, ...]
    metrics: dict[str, Any] = field(default_factory=dict)

    @property
    def valid(self) -> bool:
        return all(c.ok is not False for c in self.checks)

    def reason(self) -> str:
        bad = [f"{c.name}: {c.detail}" for c in self.checks if c.ok is False]
        return "; ".join(bad) if bad else "valid: " + "; ".join(
            c.detail for c in self.checks if c.ok)


@dataclass(frozen=True)
class Expect:
    """What the row declared for this capture."""

    arm_delay: int
    steps: int
    clock_tolerance: float


def the_range(trace: Trace) -> Span | None:
    ranges = trace.named(events.RANGE_MARKER)
    return ranges[0] if ranges else None


def check_ranges(trace: Trace) -> tuple[Check, int]:
    markers = len(trace.named(events.RANGE_MARKER))
    written = int(trace.raw.get("rowgateRanges", 1))
    n = max(markers, written) if markers else 0
    if n == 1:
        return Check("ranges", True, "exactly one range"), 1
    if n == 0:
        return Check("ranges", False, f"no {events.RANGE_MARKER!r} marker: no range"), 0
    return Check("ranges", False, f"{n} ranges ({markers} range markers, {written} profiler "
                                  f"window(s) written); exactly one is evidence"), n


def check_delay(trace: Trace, expect: Expect) -> tuple[Check, int | None]:
    steps = trace.profiler_steps()
    if not steps:
        return Check("delayed_start", False, "no ProfilerStep markers: the profiler was started "
                     "synchronously, without a delayed schedule"), None
    first = steps[0][0]
    if first != expect.arm_delay - 1:
        return Check("delayed_start", False, f"recording began at decode step {first + 1}, not "
                     f"at the declared delay {expect.arm_delay}"), first
    return Check("delayed_start", True, f"armed, active from decode step {expect.arm_delay}"), first


def check_steps(trace: Trace, rng: Span, expect: Expect) -> tuple[Check, int]:
    timed = [s for _, _, s in trace.steps("timed") if rng.contains(s.ts)]
    if len(timed) != expect.steps:
        return Check("steps", False, f"{len(timed)} timed step(s) in the range, the row declares "
                     f"{expect.steps}"), len(timed)
    return Check("steps", True, f"{len(timed)} timed steps"), len(timed)


def _inside_any(t: float, spans: list[Span]) -> bool:
    return any(s.contains(t) for s in spans)


def primer_work_in_range(trace: Trace, rng: Span) -> tuple[int, str]:
    """(count, first example) of primer/warm work inside the range.

    GPU: device activities whose launching runtime call sits inside a primer
    or warm step, whose launch is not in the trace at all (launched before
    recording began), or which started before the range opened. CPU: ops
    inside a primer or warm step that overlaps the range.
    """
    foreign = [s for phase, _, s in trace.steps() if phase not in events.OWN_PHASES]
    if not trace.has_gpu:
        ops = [o for o in trace.cpu_ops if rng.contains(o.ts) and _inside_any(o.ts, foreign)]
        return len(ops), (f"{ops[0].name} at {ops[0].ts:.0f} us" if ops else "")
    launches = trace.runtime_by_correlation()
    hits = []
    for k in trace.device:
        if k.end < rng.ts or k.ts > rng.end:
            continue
        launch = launches.get(k.correlation) if k.correlation is not None else None
        if k.ts < rng.ts:
            hits.append((k, "started before the range opened"))
        elif launch is None:
            hits.append((k, "its launch precedes the recording"))
        elif _inside_any(launch.ts, foreign):
            hits.append((k, "launched by a primer/warm step"))
    if not hits:
        return 0, ""
    k, why = hits[0]
    return len(hits), f"{k.name[:60]!r} ({why})"


def check_primer(trace: Trace, rng: Span) -> tuple[Check, int]:
    n, example = primer_work_in_range(trace, rng)
    what = "kernel(s)" if trace.has_gpu else "op(s)"
    if n:
        return Check("primer", False, f"{n} primer {what} inside the range, first {example}"), n
    return Check("primer", True, f"no primer {what} in the range"), 0


def clock_samples_in(trace: Trace, rng: Span, clocks: dict[str, Any]) -> list[dict[str, Any]]:
    """Samples inside the range plus the last one before and the first one after it:
    a range shorter than the sampling period still has its clock bracketed."""
    lo, hi = trace.unix_s(rng.ts), trace.unix_s(rng.end)
    samples = sorted(clocks.get("samples", []), key=lambda s: s["t"])
    before = [s for s in samples if s["t"] < lo][-1:]
    after = [s for s in samples if s["t"] > hi][:1]
    return before + [s for s in samples if lo <= s["t"] <= hi] + after


def check_clocks(trace: Trace, rng: Span, clocks: dict[str, Any], expect: Expect
                 ) -> tuple[Check, float | None]:
    if clocks.get("skipped"):
        return Check("clocks", None, clocks["skipped"]), None
    inside = clock_samples_in(trace, rng, clocks)
    if not inside:
        return Check("clocks", False, "no SM clock sample in or around the range"), None
    sm = [s["sm_clock_mhz"] for s in inside]
    spread = (max(sm) - min(sm)) / max(sm)
    top = clocks.get("max_sm_clock_mhz") or max(sm)
    if min(sm) < IDLE_CLOCK_FRACTION * top:
        return Check("clocks", False, f"SM clock at an idle level inside the range: {min(sm)} MHz "
                     f"(max {top} MHz)"), spread
    if spread > expect.clock_tolerance:
        return Check("clocks", False, f"SM clock moved {spread:.1%} inside the range "
                     f"({min(sm)}-{max(sm)} MHz), over the tolerance "
                     f"{expect.clock_tolerance:.1%}"), spread
    return Check("clocks", True, f"SM clock {min(sm)}-{max(sm)} MHz over {len(sm)} samples "
                 f"(spread {spread:.2%})"), spread


def check_kernel_args(trace: Trace, rng: Span) -> Check:
    if not trace.has_gpu:
        return Check("kernel_args", None, "CPU trace: no kernel launch records to check")
    props = trace.device_properties[0] if trace.device_properties else {}
    missing_props = [p for p in DEVICE_PROPS if p not in props]
    if missing_props:
        return Check("kernel_args", False, f"deviceProperties lacks {', '.join(missing_props)}")
    for k in trace.kernels:
        if rng.contains(k.ts):
            missing = [a for a in KERNEL_ARGS if a not in k.args]
            if missing:
                return Check("kernel_args", False, f"kernel {k.name[:60]!r} lacks "
                             f"{', '.join(missing)}")
    return Check("kernel_args", True, "every kernel carries grid, block, registers, shared memory")


def validate(trace: Trace, clocks: dict[str, Any], expect: Expect,
             delay: tuple[Check, int | None] | None = None) -> Validity:
    """All checks; the metric names are the ones rows' criteria use. `delay`: the
    delayed-start check already made for a trace the engine wrote itself
    (`engine_trace.delay_check`: it has no profiler-schedule steps)."""
    ranges_check, ranges = check_ranges(trace)
    delay_check, first = delay or check_delay(trace, expect)
    checks = [ranges_check, delay_check]
    metrics: dict[str, Any] = {"ranges": ranges, "first_profiler_step": first}
    rng = the_range(trace)
    if rng is None:
        metrics.update(primer_kernels_in_range=None, sm_clock_spread=None, steps_in_range=0)
    else:
        steps_check, n_steps = check_steps(trace, rng, expect)
        primer_check, primer = check_primer(trace, rng)
        clock_check, spread = check_clocks(trace, rng, clocks, expect)
        checks += [steps_check, primer_check, clock_check, check_kernel_args(trace, rng)]
        metrics.update(primer_kernels_in_range=primer, sm_clock_spread=spread,
                       steps_in_range=n_steps)
    v = Validity(tuple(checks), metrics)
    metrics["valid"] = int(v.valid)
    return v
