"""Criteria, stop conditions and implementation admission, judged on (re-derived) gate
results, and the verdict their reasons give. Criteria are typed records: nothing here
evaluates a string."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from rowgate.records.criteria import Comparison, StopAction
from rowgate.records.gate_result import GateResult
from rowgate.records.review import Admission, CriterionRow, GateCheck, Outcome, PendingItem, StopRow, Verdict
from rowgate.records.status import MetricValue, Status
from rowgate.rows.row import Row
from rowgate.rows.spec import Criterion, StopCondition

GATE_LEVEL = "(gate)"
"""Key of the gate-level value in a criterion's `measured` table."""


@dataclass
class Evaluation:
    gates: list[GateCheck] = field(default_factory=list)
    criteria: list[CriterionRow] = field(default_factory=list)
    stops: list[StopRow] = field(default_factory=list)
    admissions: list[Admission] = field(default_factory=list)
    pending: list[PendingItem] = field(default_factory=list)
    rejects: list[str] = field(default_factory=list)
    pendings: list[str] = field(default_factory=list)


def _values(result: GateResult, metric: str, cells: list[str], models: list[str] | tuple[str, ...] = ()
            ) -> tuple[dict[str, MetricValue], str]:
    """Measured values a criterion or stop looks at, and what is missing ("" if nothing).
    `models`: only the cells of those models (a model's cells start `<id>/`)."""
    if not cells:
        if metric not in result.metrics:
            return {}, f"gate {result.gate_id} has no gate-level metric {metric!r}"
        return {GATE_LEVEL: result.metrics[metric]}, ""
    names = sorted(result.cells) if cells == ["*"] else cells
    if models:
        names = [n for n in names if n.split("/", 1)[0] in models]
    if not names:
        scope = f" of model(s) {', '.join(models)}" if models else ""
        return {}, f"gate {result.gate_id} recorded no cells{scope}"
    out: dict[str, MetricValue] = {}
    for cell in names:
        if metric not in result.cells.get(cell, {}):
            return out, f"gate {result.gate_id} has no {metric!r} in cell {cell!r}"
        out[cell] = result.cells[cell][metric]
    return out, ""


def _number(value: MetricValue) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None


def _holding(comparison: Comparison, threshold: float, values: dict[str, MetricValue]
             ) -> tuple[list[str], list[str], str]:
    """(cells that hold, cells that do not, a non-number problem or "")."""
    holds: list[str] = []
    fails: list[str] = []
    for cell, value in values.items():
        number = _number(value)
        if number is None:
            return holds, fails, f"cell {cell}: {value!r} is not a number"
        (holds if not math.isnan(number) and comparison.holds(number, threshold)
         else fails).append(cell)
    return holds, fails, ""


def _on_a_device(kind: str) -> bool:
    """Whether a kind measures on the row's device (an unknown kind: assumed so)."""
    from rowgate.gates import registry

    gate = registry.lookup(kind)
    return gate is None or bool(gate.needs_device)


def _arch_problem(c: Criterion, row: Row, result: GateResult) -> str:
    """Why a result cannot satisfy a criterion bound to an arch ("" if it can).

    The binding is the criterion's `arch`, else the row's target arch. A result
    that recorded no arch (host checks) is bound only by an explicit `arch`; so is one
    of a gate that runs on the host (a build or audit records every arch it built,
    comma-separated, and a criterion without `arch` holds for all of them)."""
    arch = c.arch or row.target.arch
    if result.stand_in:
        return f"measured on stand-in {result.arch or '?'}; criterion is bound to {arch}"
    bound = bool(c.arch) or _on_a_device(result.kind)
    if bound and result.arch and arch not in result.arch.split(", "):
        return f"measured on {result.arch}; criterion is bound to {arch}"
    if c.arch and not result.arch:
        return f"gate {result.gate_id} recorded no arch; criterion is bound to {arch}"
    return ""


def evaluate_criterion(c: Criterion, row: Row, result: GateResult | None) -> CriterionRow:
    def row_(outcome: Outcome, detail: str = "",
             measured: dict[str, MetricValue] | None = None) -> CriterionRow:
        return CriterionRow(id=c.id, gate=c.gate, metric=c.metric, comparison=c.comparison,
                            threshold=c.threshold, cells=c.cells, arch=c.arch or row.target.arch,
                            measured=measured or {}, outcome=outcome, detail=detail)

    if result is None:
        return row_(Outcome.MISSING, f"no result for gate {c.gate}")
    if result.status is Status.PENDING:
        return row_(Outcome.PENDING, f"gate {c.gate} PENDING: {result.reason}")
    if result.status is Status.ERROR:
        return row_(Outcome.ERROR, f"gate {c.gate} ERROR: {result.reason}")
    if why := _arch_problem(c, row, result):
        return row_(Outcome.NOT_SATISFIABLE, why)
    values, missing = _values(result, c.metric, c.cells, c.models)
    if missing:
        return row_(Outcome.MISSING, missing, values)
    _, fails, bad = _holding(c.comparison, c.threshold, values)
    if bad:
        return row_(Outcome.MISSING, bad, values)
    if fails:
        shown = ", ".join(f"{cell}={values[cell]}" for cell in fails[:4])
        return row_(Outcome.FAIL, f"{c.metric} {c.comparison.symbol} {c.threshold:g} does not "
                                  f"hold: {shown}", values)
    return row_(Outcome.PASS, "", values)


def evaluate_stop(s: StopCondition, result: GateResult | None) -> StopRow:
    def row_(triggered: bool | None, detail: str,
             measured: dict[str, MetricValue] | None = None) -> StopRow:
        return StopRow(id=s.id, gate=s.gate, metric=s.metric, comparison=s.comparison,
                       threshold=s.threshold, cells=s.cells, action=s.action, says=s.says,
                       measured=measured or {}, triggered=triggered, detail=detail)

    if result is None:
        return row_(None, f"no result for gate {s.gate}")
    if result.status in (Status.PENDING, Status.ERROR):
        return row_(None, f"gate {s.gate} {result.status.value}: {result.reason}")
    values, missing = _values(result, s.metric, s.cells, s.models)
    if missing:
        return row_(None, f"cannot be evaluated: {missing}", values)
    holds, _, bad = _holding(s.comparison, s.threshold, values)
    if bad:
        return row_(None, f"cannot be evaluated: {bad}", values)
    if holds:
        shown = ", ".join(f"{cell}={values[cell]}" for cell in holds[:4])
        return row_(True, f"{s.metric} {s.comparison.symbol} {s.threshold:g}: {shown}", values)
    return row_(False, "", values)


def _admissions(row: Row, stops: list[StopRow], results: dict[str, GateResult]
                ) -> list[Admission]:
    """Implementation admission per admitting gate (stop-implementation conditions and
    gates whose `admitted_by` names it)."""
    dependents: dict[str, list[str]] = {}
    for spec in row.gates:
        # only some kinds' specs have `admitted_by` (abi, aot): GateSpec does not
        if admitted_by := getattr(spec, "admitted_by", ""):
            dependents.setdefault(admitted_by, []).append(spec.id)
    for s in stops:
        if s.action is StopAction.STOP_IMPLEMENTATION:
            dependents.setdefault(s.gate, [])
    out = []
    for gate, deps in dependents.items():
        conds = [s for s in stops if s.gate == gate and s.action is StopAction.STOP_IMPLEMENTATION]
        result = results.get(gate)
        admitted: bool | None
        if hit := [s for s in conds if s.triggered]:
            admitted, reason = False, f"stop {hit[0].id}: {hit[0].says} ({hit[0].detail})"
        elif result is None or result.status is not Status.PASS:
            state = ("has no result" if result is None
                     else f"is {result.status.value}: {result.reason}")
            admitted = False if result is not None and result.status is Status.FAIL else None
            reason = f"admitting gate {gate} {state}"
        elif undecided := [s for s in conds if s.triggered is None]:
            admitted, reason = None, f"stop {undecided[0].id} {undecided[0].detail}"
        else:
            admitted, reason = True, f"gate {gate} shows no stop-implementation condition"
        out.append(Admission(gate=gate, admitted=admitted, reason=reason, dependents=deps))
    return out


def judge(row: Row, results: dict[str, GateResult], ev: Evaluation) -> None:
    """Criteria, stop conditions and implementation admission; adds to `ev`."""
    for c in row.criteria:
        line = evaluate_criterion(c, row, results.get(c.gate))
        ev.criteria.append(line)
        if line.outcome in (Outcome.FAIL, Outcome.MISSING):
            ev.rejects.append(f"criterion {c.id}: {line.detail}")
        elif line.outcome is Outcome.NOT_SATISFIABLE:
            ev.pendings.append(f"criterion {c.id} not satisfiable here: {line.detail}")
    for s in row.stop_conditions:
        stop = evaluate_stop(s, results.get(s.gate))
        ev.stops.append(stop)
        if s.action is not StopAction.REFUSE:
            continue
        if stop.triggered:
            ev.rejects.append(f"stop {s.id}: {s.says} ({stop.detail})")
        elif stop.triggered is None and results.get(s.gate) is not None and \
                results[s.gate].status in (Status.PASS, Status.FAIL):
            ev.rejects.append(f"stop {s.id} {stop.detail}")
    ev.admissions = _admissions(row, ev.stops, results)
    for adm in ev.admissions:
        for dep in adm.dependents:
            res = results.get(dep)
            if res is not None and res.status in (Status.PASS, Status.FAIL) and not adm.admitted:
                ev.rejects.append(f"implementation not admitted: gate {dep} has results but "
                                  f"{adm.reason}")


def verdict_of(rejects: list[str], pendings: list[str]) -> tuple[Verdict, str]:
    for verdict, reasons in ((Verdict.REJECT, rejects), (Verdict.PENDING, pendings)):
        if reasons:
            more = f" (+{len(reasons) - 1} more)" if len(reasons) > 1 else ""
            return verdict, f"{verdict.value}: {reasons[0]}{more}"
    return Verdict.APPROVE, "APPROVE"
