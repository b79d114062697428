"""Trace plots computed at report time from the sealed raw trace of each capture.

The trace gate seals, per capture (`artifacts/GATE/ROLE-MODE/`), the profiler's own
trace (`trace.json.gz`), the clock samples and the capture record. This section redoes
the gate's analysis on them (`rowgate.trace.captures.analyse`: the same validity,
the same breakdown a review re-derives) and draws, per capture, the timed range's
first steps (device work per step, ms from the step's start) and the idle breakdown
(busy vs idle by cause, and the recoverable parts: launch gaps, wave tails,
bandwidth shortfall). It draws nothing from the PNGs the gate sealed (those are
listed as artifacts): what is shown is what the raw trace says. A capture whose
trace is missing or does not parse is said, in red.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rowgate.errors import Error
from rowgate.records.gate_result import GateResult
from rowgate.report.model import BACKGROUND, BarFigure, Figure, Span, TimelineFigure

if TYPE_CHECKING:
    from rowgate.trace.analysis import Analysis
    from rowgate.trace.captures import Judging

TIMELINE_STEPS = 4
MAX_SPANS = 4000
CAUSES = (("busy", "busy"), ("host_wait", "idle: host wait"), ("kernel_wait", "idle: kernel wait"),
          ("other", "idle: other"), ("host", "idle: host"))
RECOVERABLE = (("gap_fraction", "recoverable: launch gaps"),
               ("tail_fraction", "recoverable: wave tails"),
               ("bandwidth_fraction", "recoverable: bandwidth shortfall"),
               ("recoverable_idle_fraction", "recoverable: total"))


def capture_dirs(result: GateResult, bundle_root: Path) -> list[tuple[str, str]]:
    """(role, mode) of every capture the gate sealed (a `ROLE-MODE/capture.json`)."""
    from rowgate.trace.capture import CAPTURE_FILE

    found = set()
    for rel in result.artifacts:
        parts = Path(rel).parts
        if len(parts) == 4 and parts[3] == CAPTURE_FILE and "-" in parts[2]:
            role, _, mode = parts[2].partition("-")
            found.add((role, mode))
    from rowgate.trace.captures import pairs

    roles = sorted({r for r, _ in found})
    return [p for p in pairs(roles, sorted({m for _, m in found})) if p in found]


def _judging(spec: object | None) -> Judging:
    """The row's trace settings, or the row format's defaults when the row is not here
    (they only set what counts as valid and as material; the plots do not depend on them)."""
    from rowgate.gates.trace import TraceGate
    from rowgate.trace.captures import Judging

    def get(name: str) -> Any:
        value = getattr(spec, name, None)
        return value if value is not None else TraceGate.model_fields[name].default

    return Judging(arm_delay=get("arm_delay"), steps=get("steps"),
                   clock_tolerance=get("clock_tolerance"),
                   material_idle_fraction=get("material_idle_fraction"),
                   graph_route_proof=get("graph_route_proof"))


def _timeline(gate_id: str, name: str, a: Analysis) -> TimelineFigure:
    """The range's first steps (up to TIMELINE_STEPS, fewer when their work would pass
    MAX_SPANS), each on its own lane from its start; grey: the whole step."""
    spans: list[Span] = []
    shown = 0
    for j, s in enumerate(a.steps[:TIMELINE_STEPS]):
        work = [w for w in a.items if w.step == j]
        if shown and len(spans) + len(work) + 1 > MAX_SPANS:
            break
        lane = f"step {s.index}"
        spans.append(Span(lane=lane, start=0.0, duration=s.dur / 1e3, name=BACKGROUND))
        spans += [Span(lane=lane, start=(w.ts - s.ts) / 1e3, duration=max(w.dur, 0.05) / 1e3,
                       name=w.name) for w in work[:MAX_SPANS]]
        shown += 1
    what = "top-level CPU ops" if all(w.kind == "cpu_op" for w in a.items) else "device work"
    return TimelineFigure(title=f"{gate_id} {name}: {what} in the first {shown} timed "
                                f"step(s) of the range",
                          unit="ms from each step's start; grey: the whole step",
                          spans=tuple(spans))


def _idle(gate_id: str, name: str, a: Analysis) -> BarFigure:
    t, c = a.temporal["summary"], a.capacity
    items = [(label, t[f"{key}_fraction"]) for key, label in CAUSES
             if t.get(f"{key}_fraction") is not None]
    items += [(label, c[key]) for key, label in RECOVERABLE if c.get(key) is not None]
    return BarFigure(title=f"{gate_id} {name}: share of step time (material from "
                           f"{c['material_idle_fraction']:.0%} recoverable: {c['verdict']})",
                     unit="fraction of step time", labels=tuple(k for k, _ in items),
                     values=tuple(float(v) for _, v in items))


def figures(result: GateResult, bundle_root: Path,
            spec: object | None) -> tuple[list[Figure], list[str], list[str]]:
    """(figures, notes, missing) for the captures the gate sealed; ([], [], []) when it
    sealed none in the trace gate's layout."""
    from rowgate.trace import captures
    from rowgate.trace.capture import TRACE_FILE

    which = capture_dirs(result, bundle_root)
    if not which:
        return [], [], []
    gate_dir = bundle_root / "artifacts" / result.gate_id
    missing = [f"artifacts/{result.gate_id}/{r}-{m}/{TRACE_FILE} is not sealed: no timeline or "
               f"idle breakdown for {r} {m}" for r, m in which
               if not (gate_dir / f"{r}-{m}" / TRACE_FILE).is_file()]
    which = [(r, m) for r, m in which if (gate_dir / f"{r}-{m}" / TRACE_FILE).is_file()]
    if not which:
        return [], [], missing
    try:
        results = captures.analyse(_judging(spec), gate_dir, which)
    except (Error, OSError, ValueError, KeyError) as exc:
        detail = exc.diagnostics() if isinstance(exc, Error) else str(exc)
        return [], [], missing + [f"the sealed traces do not analyse ({detail}): no timeline "
                                  f"or idle breakdown"]
    out: list[Figure] = []
    notes = []
    for r in results:
        if r.analysis is None:
            missing.append(f"{r.role} {r.mode}: the trace has no delayed range to draw "
                           f"({r.validity.reason()})")
            continue
        if not r.validity.valid:
            notes.append(f"{r.role} {r.mode} trace refused by the gate: {r.validity.reason()} "
                         f"(drawn anyway, to show why)")
        out += [_timeline(result.gate_id, f"{r.role} {r.mode}", r.analysis),
                _idle(result.gate_id, f"{r.role} {r.mode}", r.analysis)]
    return out, notes, missing
