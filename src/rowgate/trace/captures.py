"""A set of captures (arm × mode) judged together: validity, analysis, verdict, files.

Each capture lives in `DIR/<role>-<mode>/` (trace, clocks, capture record).
Eager is analysed before graph so a graph trace, whose replayed kernels have
no launching op and so no shapes, can take the bytes of the eager forward
when both ran the same kernels. The verdict is about capacity after graph
replay: it comes from the graph capture when there is one.

Used by the trace gate and by `benchmarks/trace_capture.py`; imports nothing
of the gate framework, so it runs wherever torch and this package do.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rowgate import compressed
from rowgate.trace import analysis, engine_trace, events, seams, validity
from rowgate.trace.analysis import Analysis
from rowgate.trace.capture import CAPTURE_FILE, CLOCKS_FILE, TRACE_FILE
from rowgate.trace.seams import Seam
from rowgate.trace.validity import Check, Validity

ANALYSIS_FILE = "analysis.json.gz"
KERNELS_FILE = "kernels.csv.gz"
"""Reviewer files, sealed gzipped (src/rowgate/compressed.py): on the probe model an eager
capture's analysis is 24 MB and its per-kernel table 27 MB of text, 0.6 / 2.6 MB gzipped
(the evidence budget). Nothing derives from them: derive reads the trace itself."""
TIMELINE_FILE = "timeline.png"
HTA_FILE = "hta.json"
IDLE_FILE = "idle-breakdown.png"
MODE_ORDER = {"eager": 0, "graph": 1, "graph-fused": 2, "persistent": 3}
GRAPH_MODES = ("graph-fused", "graph")
"""Modes replayed from a CUDA graph, the verdict's first choice first: the strong fused
graph, when a row traces it, is the one whose recoverable idle admits the work."""


class CaptureSetError(events.TraceError):
    """A capture directory is missing or incomplete."""


@dataclass(frozen=True)
class Judging:
    """What a row declares about its captures."""

    arm_delay: int
    steps: int
    clock_tolerance: float
    material_idle_fraction: float
    graph_route_proof: bool = False
    seams: tuple[tuple[str, tuple[Seam, ...]], ...] = ()
    """(role, its required seams): what each arm's range must run through."""

    def seams_of(self, role: str) -> tuple[Seam, ...]:
        """The seams of a capture's arm (its role may start with `<model id>/`)."""
        arm = role.rsplit("/", 1)[-1]
        return next((s for r, s in self.seams if r == arm), ())


@dataclass(frozen=True)
class Result:
    role: str
    mode: str
    analysis: Analysis | None
    """None when the trace has no range to analyse (it is refused anyway)."""
    validity: Validity
    seams: tuple[dict[str, Any], ...] = ()
    """Per required seam: found in the range, steps with it, share of step time."""

    @property
    def name(self) -> str:
        return f"{self.role}-{self.mode}"


def pairs(roles: Sequence[str], modes: Sequence[str]) -> list[tuple[str, str]]:
    return [(r, m) for r in roles for m in sorted(modes, key=lambda m: MODE_ORDER.get(m, 9))]


def _read_json(path: Path) -> Any:
    """A JSON file's document (a capture's phase log is a list, the rest are objects)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CaptureSetError(f"{path}: missing or unreadable") from exc


def read_record(d: Path) -> dict[str, Any]:
    """A capture directory's `capture.json`."""
    record: dict[str, Any] = _read_json(d / CAPTURE_FILE)
    return record


def _load(d: Path, record: dict[str, Any], judging: Judging
          ) -> tuple[events.Trace, tuple[Check, int | None] | None]:
    """The capture's trace, and for a trace the engine wrote itself its delayed-start
    check; rowgate's markers are added to such a trace here, in memory (engine_trace)."""
    if not engine_trace.is_engine_capture(record):
        return events.load(d / TRACE_FILE), None
    doc = events.read_doc(d / TRACE_FILE)
    phases = _read_json(d / engine_trace.PHASES_FILE)
    if not isinstance(phases, list):
        raise CaptureSetError(f"{d / engine_trace.PHASES_FILE}: not a list of phases")
    delay = engine_trace.delay_check(doc, phases, record.get("delay_iterations"),
                                     judging.arm_delay)
    normalized = engine_trace.normalize(doc, phases, judging.steps)
    return events.from_dict(normalized, str(d / TRACE_FILE)), delay


def analyse(judging: Judging, out: Path, which: list[tuple[str, str]]) -> list[Result]:
    """Validity and analysis of every capture, from its raw files alone."""
    expect = validity.Expect(arm_delay=judging.arm_delay, steps=judging.steps,
                             clock_tolerance=judging.clock_tolerance)
    reference: dict[str, list[tuple[str, int | None]]] = {}
    results: list[Result] = []
    for role, mode in which:
        d = out / f"{role}-{mode}"
        record = read_record(d)
        trace, delay = _load(d, record, judging)
        clocks: dict[str, Any] = _read_json(d / CLOCKS_FILE)
        v = validity.validate(trace, clocks, expect, delay)
        a: Analysis | None = None
        if validity.the_range(trace) is not None:
            a = analysis.analyze(trace, mode, record["copy_ceiling"]["bytes_per_s"],
                                 judging.material_idle_fraction, reference.get(role))
            if mode == "eager":
                reference[role] = analysis.bytes_reference(a.items)
        rng = validity.the_range(trace)
        found = tuple(seams.coverage(trace, rng, s) for s in judging.seams_of(role)) \
            if rng is not None else tuple(seams.absent(s) for s in judging.seams_of(role))
        results.append(Result(role, mode, a, v, found))
    return results


def headline(a: Analysis) -> dict[str, Any]:
    t, c = a.temporal["summary"], a.capacity
    return {"step_us": t["step_us_median"], "idle_fraction": t["idle_fraction"],
            "gap_fraction": c["gap_fraction"], "tail_fraction": c["tail_fraction"],
            "bandwidth_fraction": c["bandwidth_fraction"],
            "recoverable_idle_fraction": c["recoverable_idle_fraction"],
            "launch_delay_us_median": a.launches.get("launch_delay_us_median"),
            "distinct_paths": a.path["distinct_paths"],
            "work_per_step": a.path["work_per_step"][0] if a.path["work_per_step"] else 0,
            "graph_route_proved": a.graph["proved"]}


def verdict_from(results: list[Result]) -> Result | None:
    usable = [r for r in results if r.analysis is not None and r.validity.valid]
    for mode in GRAPH_MODES:
        for r in usable:
            if r.mode == mode:
                return r
    return usable[-1] if usable else None


def eager_launches(results: list[Result]) -> int | None:
    """Kernels launched from the eager forward inside the graph captures' ranges (0: the
    full CUDA-graph route); None where no graph capture supports the question."""
    routes = [r.analysis.graph for r in results if r.analysis is not None
              and r.mode == "graph" and r.analysis.graph.get("supported")]
    return sum(g["eager_forward_kernels"] for g in routes) if routes else None


def route_detail(g: dict[str, Any]) -> str:
    if not g.get("supported"):
        return str(g.get("why", ""))
    return (f"{g['graph_kernels']} graph kernel(s) over {g['steps_replayed']}/{g['steps']} "
            f"step(s), {g['eager_forward_kernels']} eager forward kernel(s)"
            + (f", first {g['first_eager'][:60]!r}" if g.get("first_eager") else ""))


@dataclass(frozen=True)
class Summary:
    ok: bool
    reason: str
    metrics: dict[str, Any]
    verdict: Result | None


def summarize(results: list[Result], judging: Judging) -> Summary:
    """Gate-level metrics (the names rows' criteria use), per-capture metrics prefixed
    `<role>.<mode>.`, and the reason."""
    metrics: dict[str, Any] = {}
    problems: list[str] = []
    for r in results:
        p = f"{r.role}.{r.mode}."
        metrics.update({p + k: r.validity.metrics[k] for k in (
            "valid", "ranges", "primer_kernels_in_range", "sm_clock_spread")})
        if not r.validity.valid:
            problems.append(f"{r.role} {r.mode} trace refused: {r.validity.reason()}")
        gone = seams.missing(list(r.seams))
        if r.seams:
            metrics[p + "seams_missing"] = len(gone)
            metrics.update({f"{p}seam.{s['seam']}.step_share": s["step_share"] for s in r.seams})
        if gone:
            problems.append(f"{r.role} {r.mode}: required seam(s) not in the range: "
                            f"{', '.join(gone)}")
        if r.analysis is not None:
            metrics.update({p + k: v for k, v in headline(r.analysis).items()})
            if judging.graph_route_proof and r.mode in GRAPH_MODES and \
                    not r.analysis.graph["proved"]:
                problems.append(f"{r.role} graph: no CUDA-graph route proof "
                                f"({route_detail(r.analysis.graph)})")
    vs = [r.validity for r in results]
    spreads = [v.metrics["sm_clock_spread"] for v in vs if v.metrics["sm_clock_spread"] is not None]
    if any(r.seams for r in results):
        metrics["seams_missing"] = sum(len(seams.missing(list(r.seams))) for r in results)
    metrics.update(valid=int(all(v.valid for v in vs)),
                   ranges=max((v.metrics["ranges"] for v in vs), default=0),
                   primer_kernels_in_range=sum(v.metrics["primer_kernels_in_range"] or 0
                                               for v in vs),
                   sm_clock_spread=max(spreads) if spreads else None)
    chosen = verdict_from(results)
    if chosen is not None and chosen.analysis is not None:  # a verdict always has one
        c = chosen.analysis.capacity
        metrics.update(recoverable_idle_fraction=c["recoverable_idle_fraction"],
                       capacity_verdict=c["verdict"], verdict_capture=chosen.name)
    if problems:
        return Summary(False, "; ".join(problems), metrics, chosen)
    return Summary(True, _pass_reason(len(results), chosen), metrics, chosen)


def _pass_reason(n: int, chosen: Result | None) -> str:
    if chosen is None or chosen.analysis is None:  # a verdict always has an analysis
        return f"{n} valid trace(s)"
    c = chosen.analysis.capacity
    tails = "n/a on a CPU trace" if c["tail_fraction"] is None else f"{c['tail_fraction']:.1%}"
    return (f"{n} valid single delayed range(s); {chosen.role} {chosen.mode}: recoverable idle "
            f"capacity {c['recoverable_idle_fraction']:.1%} of step time (gaps "
            f"{c['gap_fraction']:.1%}, wave tails {tails}, bandwidth "
            f"{c['bandwidth_fraction']:.1%}): {c['verdict']} "
            f"(threshold {c['material_idle_fraction']:.0%})")


# ------------------------------------------------------------ reviewer files


def write_reviewer_files(results: list[Result], out: Path, title: str) -> None:
    """Per capture: analysis JSON (with the executing path), per-kernel CSV, timeline PNG,
    HTA's breakdown; across captures: the idle-breakdown PNG."""
    from rowgate.trace import holistic, plots

    shown: dict[str, Analysis] = {}
    for r in results:
        d = out / r.name
        doc: dict[str, Any] = {"validity": {
            "valid": r.validity.valid, "reason": r.validity.reason(),
            "checks": [c.__dict__ for c in r.validity.checks], "metrics": r.validity.metrics}}
        if r.seams:
            doc["seams"] = list(r.seams)
        if r.analysis is not None:
            doc.update(r.analysis.summary(), executing_path=r.analysis.path["steps"])
            _write_csv(d / KERNELS_FILE, r.analysis.rows())
            plots.timeline(r.analysis, f"{title} {r.role} {r.mode}", d / TIMELINE_FILE)
            shown[f"{r.role} {r.mode}"] = r.analysis
        compressed.write_text(d / ANALYSIS_FILE, json.dumps(doc, indent=1, default=str) + "\n")
        (d / HTA_FILE).write_text(json.dumps(holistic.breakdown(events.read_doc(d / TRACE_FILE)),
                                             indent=1, default=str) + "\n")
    if shown:
        plots.idle_breakdown(shown, out / IDLE_FILE)


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    text = io.StringIO(newline="")
    if rows:
        w = csv.DictWriter(text, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    compressed.write_text(path, text.getvalue())
