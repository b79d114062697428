"""Seams: the named parts of an arm's executing path a row requires to see in the trace.

A row names, per arm, the code paths its decode step must run through — host or
NVTX ranges (`ModelRegistry::Forward`, `dense_attn::AttnBlock`, vLLM's
`gpu_model_runner: forward`) or device kernels by name pattern (`vt::FusedChain`).
For each seam and capture this reports whether the single range contains it,
in how many timed steps, and what share of the timed steps' time it covers
(the union of its spans clipped to each step, over the steps' total). A seam
that is required and not in the range fails the gate, naming it.

Range seams match complete events of the host and annotation categories
(`user_annotation`, `gpu_user_annotation`, `cpu_op`, `python_function`, and
`nvtx` / `cuda_nvtx` for engines whose profiler records NVTX ranges); kernel
seams match device kernels. Patterns are regular expressions searched in the
event name (a plain name matches itself). Pure: derive and a review redo it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from rowgate.trace.analysis import union
from rowgate.trace.events import Span, Trace, span
from rowgate.trace.work import Step, timed_steps

RANGE_CATS = {"user_annotation", "gpu_user_annotation", "cpu_op", "python_function", "nvtx",
              "cuda_nvtx"}


@dataclass(frozen=True)
class Seam:
    name: str
    kind: str
    """`range` (host / NVTX ranges, annotations, ops) or `kernel` (device kernels)."""
    pattern: str = ""
    """Regular expression searched in event names; empty: the name itself, literally."""

    def regex(self) -> re.Pattern[str]:
        return re.compile(self.pattern or re.escape(self.name))


def _candidates(trace: Trace, seam: Seam) -> list[Span]:
    rx = seam.regex()
    if seam.kind == "kernel":
        return [k for k in trace.kernels if rx.search(k.name)]
    out = []
    for e in trace.raw.get("traceEvents", []):
        if e.get("ph") == "X" and "ts" in e and e.get("cat") in RANGE_CATS \
                and rx.search(str(e.get("name", ""))):
            out.append(span(e))
    return out


def coverage(trace: Trace, rng: Span, seam: Seam) -> dict[str, Any]:
    """Where `seam` is in the capture: found in the range, steps with it, step share."""
    steps: list[Step] = timed_steps(trace, rng)
    spans = _candidates(trace, seam)
    inside = [s for s in spans if s.ts >= rng.ts and s.end <= rng.end]
    total = sum(s.dur for s in steps) or 1.0
    covered, with_seam = 0.0, 0
    for st in steps:
        lo, hi = st.ts, st.ts + st.dur
        parts = union([(max(s.ts, lo), min(s.end, hi)) for s in inside
                        if s.end > lo and s.ts < hi])
        covered += sum(b - a for a, b in parts)
        with_seam += bool(parts)
    return {"seam": seam.name, "kind": seam.kind, "pattern": seam.regex().pattern,
            "in_range": len(inside), "outside_range": len(spans) - len(inside),
            "steps_with": with_seam, "steps": len(steps), "step_share": covered / total,
            "found": bool(inside)}


def missing(report: list[dict[str, Any]]) -> list[str]:
    return [r["seam"] for r in report if not r["found"]]


def absent(seam: Seam) -> dict[str, Any]:
    """A seam of a capture with no range to look in."""
    return {"seam": seam.name, "kind": seam.kind, "pattern": seam.regex().pattern,
            "in_range": 0, "outside_range": 0, "steps_with": 0, "steps": 0,
            "step_share": 0.0, "found": False}
