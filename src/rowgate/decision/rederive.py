"""Re-derivation: every sealed gate's pure `derive` again on its raw artifacts, compared
with the sealed summary; the review trusts nothing it can recompute."""

from __future__ import annotations

import json
import math
from typing import Any

from rowgate.decision.criteria import Evaluation
from rowgate.gates import gate_for
from rowgate.gates.interface import GateError
from rowgate.records.gate_result import GateResult
from rowgate.records.review import GateCheck, PendingItem
from rowgate.records.status import Status
from rowgate.rows.row import Row
from rowgate.seal.bundle import Bundle


def _normal(result: GateResult) -> dict[str, Any]:
    """The comparable part of a result, as it round-trips through JSON."""
    data = json.loads(result.model_dump_json())
    return {k: data[k] for k in ("status", "reason", "metrics", "cells")}


FLOAT_REL_TOL = 1e-9
"""How far a re-derived float may sit from the sealed one. A gate's derive is the same
code on the same bytes, but not always the same arithmetic: the sealing machine's Python
may sum floats another way (3.12's `sum` is compensated, 3.11's is not) and its libm may
round `exp`/`log` otherwise, a few units in the last place. Any real change to a sample
moves a metric by far more than one part in 10^9."""


def _same(a: Any, b: Any) -> bool:
    """Equal, floats to within FLOAT_REL_TOL (booleans and strings exactly)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, float) or isinstance(b, float):
        return (isinstance(a, (int, float)) and isinstance(b, (int, float))
                and math.isclose(a, b, rel_tol=FLOAT_REL_TOL, abs_tol=1e-15))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return bool(a == b)


def _first_difference(sealed: dict[str, Any], derived: dict[str, Any]) -> str:
    for key in ("status", "reason"):
        if sealed[key] != derived[key]:
            return f"{key}: sealed {sealed[key]!r}, re-derived {derived[key]!r}"
    for key in ("metrics", "cells"):
        names = sorted(set(sealed[key]) | set(derived[key]))
        for name in names:
            a, b = sealed[key].get(name, "(absent)"), derived[key].get(name, "(absent)")
            if not _same(a, b):
                return f"{key}.{name}: sealed {a!r}, re-derived {b!r}"
    return "differs"


def rederive(row: Row, bundle: Bundle, sealed: GateResult) -> tuple[GateResult, str, str]:
    """(result to evaluate, consistency, detail) for one sealed PASS/FAIL gate."""
    spec = row.gate(sealed.gate_id)
    artifacts = bundle.path / "artifacts" / sealed.gate_id
    try:
        derived = gate_for(spec.kind).derive(row, spec, artifacts)
    except GateError as exc:
        why = f"cannot be re-derived from its artifacts: {exc.diagnostics()}"
        return sealed, "inconsistent", why
    except (ValueError, KeyError, TypeError, IndexError, OSError) as exc:
        # Signed artifacts can still be malformed (a buggy or hostile producer); a
        # derive that trips on them yields no evidence, not a crashed review.
        why = f"cannot be re-derived from its artifacts: {type(exc).__name__}: {exc}"
        return sealed, "inconsistent", why
    again = sealed.model_copy(update={"status": derived.status, "reason": derived.reason,
                                      "metrics": derived.metrics, "cells": derived.cells})
    again = GateResult.model_validate_json(again.model_dump_json())
    a, b = _normal(sealed), _normal(again)
    if not _same(a, b):
        return again, "inconsistent", _first_difference(a, b)
    return again, "consistent", ""


def check_gates(row: Row, bundle: Bundle, ev: Evaluation) -> dict[str, GateResult]:
    """Re-derive each sealed gate; returns the results to evaluate criteria on."""
    sealed_ids = [g.gate_id for g in bundle.manifest.gates]
    for spec in row.gates:
        if spec.id not in sealed_ids:
            ev.rejects.append(f"inconsistent: row gate {spec.id} has no result in the bundle")
    results: dict[str, GateResult] = {}
    pending_notes = {p.gate: p.until for p in row.pending}
    for summary in bundle.manifest.gates:
        sealed = bundle.gate_result(summary.gate_id)
        try:
            spec = row.gate(sealed.gate_id)
        except KeyError:
            ev.rejects.append(f"inconsistent: bundle gate {sealed.gate_id} is not in the row")
            continue
        if spec.kind != sealed.kind:
            ev.rejects.append(f"inconsistent: gate {spec.id} is kind {spec.kind} in the row, "
                              f"{sealed.kind} in the bundle")
            continue
        result, state, detail = gate_state(row, bundle, sealed)
        results[sealed.gate_id] = result
        ev.gates.append(GateCheck(gate_id=result.gate_id, kind=result.kind, status=result.status,
                                  reason=result.reason, required=spec.required, arch=result.arch,
                                  stand_in=result.stand_in, rederived=state, detail=detail))
        if state == "inconsistent":
            ev.rejects.append(f"inconsistent: gate {sealed.gate_id}: {detail}")
        if result.status is Status.ERROR:
            ev.rejects.append(f"gate {result.gate_id} ERROR: {result.reason}")
        elif result.status is Status.FAIL and spec.required:
            ev.rejects.append(f"gate {result.gate_id} FAIL: {result.reason}")
        elif result.status is Status.PENDING:
            ev.pending.append(PendingItem(gate=result.gate_id, reason=result.reason,
                                          until=pending_notes.get(result.gate_id, "")))
            ev.pendings.append(f"gate {result.gate_id} PENDING: {result.reason}")
    return results


def gate_state(row: Row, bundle: Bundle, sealed: GateResult) -> tuple[GateResult, str, str]:
    # PENDING gates never ran and ERROR gates broke: there is nothing to re-derive,
    # but a summary that carries numbers anyway did not come from run_gate.
    if sealed.status in (Status.PENDING, Status.ERROR):
        if sealed.metrics or sealed.cells:
            return sealed, "inconsistent", f"a {sealed.status.value} gate carries metrics"
        return sealed, "not re-derivable", f"{sealed.status.value}: nothing was measured"
    return rederive(row, bundle, sealed)
