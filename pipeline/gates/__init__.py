"""Gate kinds: one interface (`interface.Gate`), one module per kind."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.gates.abi import Abi
from pipeline.gates.accuracy import Accuracy
from pipeline.gates.audit import Audit
from pipeline.gates.build import Build
from pipeline.gates.host import Host
from pipeline.gates.interface import (
    Derived,
    Gate,
    GateContext,
    GateError,
    GateResult,
    Status,
    gate_device,
    run_gate,
)
from pipeline.gates.operator import Operator
from pipeline.gates.phase import Phase
from pipeline.gates.throughput import Throughput
from pipeline.gates.tokens import Tokens
from pipeline.gates.trace import Trace
from pipeline.rows import Row

__all__ = ["Derived", "Gate", "GateContext", "GateError", "GateResult", "Status",
           "gate_for", "run", "DEVICE_KINDS", "IMPLEMENTED"]

# Kinds that execute on the row's target device (everything but host/build/audit, and
# abi: its task-ABI part runs anywhere, and it reports its GPU part PENDING itself).
DEVICE_KINDS = {"operator", "phase", "tokens", "throughput", "trace", "accuracy"}

IMPLEMENTED: dict[str, type[Gate]] = {Host.kind: Host, Build.kind: Build, Audit.kind: Audit,
                                      Tokens.kind: Tokens, Throughput.kind: Throughput,
                                      Accuracy.kind: Accuracy, Trace.kind: Trace,
                                      Operator.kind: Operator, Abi.kind: Abi, Phase.kind: Phase}


class NotImplementedGate(Gate):
    """A kind the row declares that this rowgate cannot run yet: ERROR, never PENDING."""

    def __init__(self, kind: str):
        self.kind = kind

    def measure(self, row: Row, spec: Any, ctx: GateContext) -> None:
        pass

    def derive(self, row: Row, spec: Any, artifact_dir: Path) -> Derived:
        return Derived(Status.ERROR, f"not implemented: gate kind {self.kind!r} is not built "
                                     f"in this version of rowgate")


def device_requirement(row: Row, spec: Any) -> str | None:
    """PENDING reason when the gate needs the row's device and none is here."""
    if spec.kind not in DEVICE_KINDS:
        return None
    _, _, why_not = gate_device(row, spec)
    if not why_not:
        return None
    declared = [p for p in row.pending if p.gate == spec.id]
    if declared:  # the row's own words on why, and what unblocks it
        why_not += f"; {declared[0].reason}; until {declared[0].until}"
    return why_not


def gate_for(kind: str) -> Gate:
    cls = IMPLEMENTED.get(kind)
    return cls() if cls else NotImplementedGate(kind)


def run(row: Row, spec: Any, ctx: GateContext, bundle_root: Path) -> GateResult:
    """`run(row, spec, ctx) -> GateResult` for any kind: device check first, so a
    gate that needs an absent device is PENDING saying so, whatever its kind."""
    return run_gate(gate_for(spec.kind), row, spec, ctx, bundle_root,
                    pending=device_requirement(row, spec))


def availability(row: Row, spec: Any) -> tuple[str, str]:
    """What `rowgate rows` shows: ("runs" | "PENDING" | "ERROR", why)."""
    why_not = device_requirement(row, spec)
    if why_not:
        return "PENDING", why_not
    if spec.kind not in IMPLEMENTED:
        return "ERROR", f"not implemented: gate kind {spec.kind!r}"
    return "runs", ""
