"""Bad traces planted by editing real ones (each edit is the defect it names)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from rowgate.trace import events

DATA = Path(__file__).resolve().parents[1] / "data" / "traces"


def scenario(name: str) -> tuple[dict, dict, dict]:
    """(trace document, clocks, scenario record) of a checked-in capture."""
    d = DATA / name
    return (events.read_doc(d / "trace.json.gz"), json.loads((d / "clocks.json").read_text()),
            json.loads((d / "scenario.json").read_text()))


def scenarios() -> list[str]:
    return sorted(p.name for p in DATA.iterdir() if (p / "trace.json.gz").is_file())


def _range(doc: dict) -> dict:
    return next(e for e in doc["traceEvents"] if e.get("name") == events.RANGE_MARKER)


def two_ranges(doc: dict) -> dict:
    """A second window: every event of the range copied after it, profiler steps renumbered
    as a repeating schedule would (what `schedule(repeat=2)` or a second start writes)."""
    doc = copy.deepcopy(doc)
    rng = _range(doc)
    shift = rng["dur"] + 1000.0
    inside = [e for e in doc["traceEvents"] if e.get("ph") == "X"
              and rng["ts"] <= e["ts"] <= rng["ts"] + rng["dur"]]
    steps = [e for e in inside if events.PROFILER_STEP.match(e["name"])]
    for e in inside:
        twin = copy.deepcopy(e)
        twin["ts"] = e["ts"] + shift
        m = events.PROFILER_STEP.match(e["name"])
        if m:
            twin["name"] = f"ProfilerStep#{int(m.group(1)) + len(steps) + 10}"
        doc["traceEvents"].append(twin)
    return doc


def clocks_over_range(doc: dict, mhz: list[int]) -> dict:
    """NVML-style samples spread evenly across the range, with the given SM clocks."""
    t = events.from_dict(doc)
    rng = t.named(events.RANGE_MARKER)[0]
    lo, hi = t.unix_s(rng.ts), t.unix_s(rng.end)
    n = len(mhz)
    return {"gpu_index": 0, "period_s": 0.005, "error": "", "max_sm_clock_mhz": 1980,
            "samples": [{"t": lo + (hi - lo) * k / max(n - 1, 1), "sm_clock_mhz": f,
                         "mem_clock_mhz": 3201, "temperature_c": 45}
                        for k, f in enumerate(mhz)]}


def strip_kernel_arg(doc: dict, arg: str) -> dict:
    doc = copy.deepcopy(doc)
    for e in doc["traceEvents"]:
        if e.get("cat") == "kernel":
            e["args"].pop(arg, None)
            break
    return doc
