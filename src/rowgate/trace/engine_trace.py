"""A trace an engine's own profiler wrote, read as rowgate reads its own captures.

vLLM (offline or its server) and any OpenAI server that follows vLLM's profiling
convention write the trace themselves: rowgate cannot put its markers in their
processes. What it has instead is the engine's own annotations and its own
record of when each phase ran:

* every engine iteration is a host annotation in vLLM's form,
  `execute_context_<n>(<tokens>)_generation_<m>(<tokens>)` (n > 0: it prefills);
  the model forward is `gpu_model_runner: forward` (vLLM with
  VLLM_CUSTOM_SCOPES_FOR_PROFILING, and servers that follow the convention);
* `phases.json`: the Unix time span the client sent and received each phase in
  (warm, primer, timed).

`normalize` adds, in memory, the markers validity and analysis read: one
`rowgate.step#<phase>:<i>` per iteration (phase `timed` for the timed pass's
decode iterations, `prefill` for its prefill iterations, `primer` / `warm` /
`other` for the rest), `rowgate.forward` over each forward, and one `rowgate.range`
from the first recorded iteration to the end of the declared number of timed
decode iterations. Pure, so derive and a review redo it from the sealed files.
The delayed start is judged here (`delay_check`): the engine must have been
armed with the row's delay, and no iteration recorded before the timed pass.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any

from rowgate.trace import events
from rowgate.trace.validity import Check

ITERATION = re.compile(r"^execute_context_(\d+)\((\d+)\)_generation_(\d+)\((\d+)\)$")
FORWARD_ANNOTATIONS = ("gpu_model_runner: forward",)
PHASES_FILE = "phases.json"
GAP_US = 0.002
"""Spans that touch would both contain their shared instant: a step ends this much
before the next begins, and the range closes half of it after its last step."""


@dataclass(frozen=True)
class Iteration:
    ts: float
    end: float
    prefill: bool
    phase: str
    """warm, primer, timed (decode), prefill (the timed pass's), other."""


def _phase_at(unix_s: float, phases: list[dict[str, Any]]) -> str:
    for p in phases:
        if p["start_unix"] <= unix_s <= p["end_unix"]:
            return str(p["phase"])
    return "other"


def iterations(doc: dict[str, Any], phases: list[dict[str, Any]]) -> list[Iteration]:
    """The engine's iterations in the trace, each with its span and phase. A span runs
    from its annotation to the next iteration's (host work between iterations is part
    of a step's cost); the last one to the end of its annotation or of the model-runner
    parts that follow it."""
    base = int(doc.get("baseTimeNanoseconds", 0))
    spans = sorted((e for e in doc.get("traceEvents", []) if e.get("ph") == "X"
                    and e.get("cat") == "user_annotation" and "ts" in e),
                   key=lambda e: float(e["ts"]))
    marks = [e for e in spans if ITERATION.match(str(e.get("name", "")))]
    out = []
    for k, e in enumerate(marks):
        ts = float(e["ts"])
        if k + 1 < len(marks):
            end = float(marks[k + 1]["ts"]) - GAP_US  # ends just before the next begins
        else:
            end = max([ts + float(e.get("dur", 0))] + [
                float(p["ts"]) + float(p.get("dur", 0)) for p in spans
                if float(p["ts"]) >= ts and str(p.get("name", "")).startswith("gpu_model_runner:")])
        m = ITERATION.match(e["name"])
        prefill = m is not None and int(m.group(1)) > 0
        phase = _phase_at((ts * 1000.0 + base) / 1e9, phases)
        if phase == "timed" and prefill:
            phase = "prefill"
        out.append(Iteration(ts, end, prefill, phase))
    return out


def _annotation(name: str, ts: float, end: float, like: dict[str, Any]) -> dict[str, Any]:
    return {"ph": "X", "cat": "user_annotation", "name": name, "ts": ts, "dur": end - ts,
            "pid": like.get("pid"), "tid": like.get("tid"), "args": {"rowgate": "normalized"}}


def normalize(doc: dict[str, Any], phases: list[dict[str, Any]], steps: int) -> dict[str, Any]:
    """The document with rowgate's markers over the engine's iterations (a copy)."""
    out = copy.copy(doc)
    raw = list(doc.get("traceEvents", []))
    found = iterations(doc, phases)
    like: dict[str, Any] = next((e for e in raw if ITERATION.match(str(e.get("name", "")))), {})
    added = []
    counters: dict[str, int] = {}
    for it in found:
        i = counters.get(it.phase, 0)
        counters[it.phase] = i + 1
        added.append(_annotation(f"{events.STEP_MARKER}#{it.phase}:{i}", it.ts, it.end, like))
    for e in raw:
        if e.get("cat") == "user_annotation" and e.get("name") in FORWARD_ANNOTATIONS:
            added.append(_annotation(events.FORWARD_MARKER, float(e["ts"]),
                                     float(e["ts"]) + float(e.get("dur", 0)), e))
    timed = [it for it in found if it.phase == "timed"]
    if found:
        last = timed[steps - 1] if len(timed) >= steps else (timed[-1] if timed else found[-1])
        # Starts a hair before the first iteration: its marker must lie inside the range.
        added.append(_annotation(events.RANGE_MARKER, found[0].ts - GAP_US / 2,
                                 last.end + GAP_US / 2, like))
    out["traceEvents"] = raw + added
    return out


def delay_check(doc: dict[str, Any], phases: list[dict[str, Any]], requested_delay: int | None,
                arm_delay: int) -> tuple[Check, int | None]:
    """The engine was armed with the row's delay, and recording began with the timed
    pass: no warm-up or primer iteration, nothing before the pass was sent."""
    found = iterations(doc, phases)
    if requested_delay != arm_delay:
        return Check("delayed_start", False, f"the engine was armed with delay_iterations "
                     f"{requested_delay}, not the declared {arm_delay}"
                     + (" (a synchronous start)" if not requested_delay else "")), None
    if not found:
        return Check("delayed_start", False, "no engine iteration annotated in the trace "
                     "(execute_context_…_generation_…): the engine does not follow vLLM's "
                     "profiling convention, or nothing ran while it recorded"), None
    first = found[0]
    if first.phase not in ("timed", "prefill"):
        early = sum(1 for it in found if it.phase not in ("timed", "prefill"))
        return Check("delayed_start", False, f"recording began in the {first.phase} phase: "
                     f"{early} iteration(s) before the timed execution are in the trace (the "
                     f"delay {arm_delay} is shorter than the engine's warm-up/primer "
                     f"iterations)"), 0
    return Check("delayed_start", True, f"armed with delay_iterations {arm_delay}; recording "
                 f"began at the timed pass's {'prefill' if first.prefill else 'decode'} "
                 f"iteration"), arm_delay - 1


def is_engine_capture(record: dict[str, Any]) -> bool:
    return record.get("kind") == "engine"
