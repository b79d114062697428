"""Gate kinds: one interface (`interface.Gate`), one module per kind, each registered
where it is defined (`registry`). Importing this package registers rowgate's own kinds.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.device import GpuChoice, Inventory
from pipeline.gates import registry
from pipeline.gates.abi import Abi
from pipeline.gates.accuracy import Accuracy
from pipeline.gates.aot import Aot
from pipeline.gates.audit import Audit
from pipeline.gates.build import Build
from pipeline.gates.host import Host
from pipeline.gates.interface import Derived, Gate, GateContext, GateError, gate_device, run_gate
from pipeline.gates.operator import Operator
from pipeline.gates.phase import Phase
from pipeline.gates.throughput import Throughput
from pipeline.gates.tokens import Tokens
from pipeline.gates.trace import Trace
from pipeline.records.gate_result import GateResult
from pipeline.records.status import Status
from pipeline.rowspec import GateSpec

if TYPE_CHECKING:
    from pipeline.rows import Row

__all__ = ["BUILTIN", "DEVICE_KINDS", "IMPLEMENTED", "Derived", "Gate", "GateContext",
           "GateError", "availability", "device_requirement", "gate_for", "run"]

BUILTIN: tuple[type[Gate[Any]], ...] = (Host, Build, Audit, Operator, Phase, Tokens, Throughput,
                                        Trace, Accuracy, Abi, Aot)
"""rowgate's own kinds, in the data flow's order (the order the row schema lists them)."""

IMPLEMENTED = registry.KINDS
"""Every registered kind: the registry's own mapping (a view, never a copy)."""

DEVICE_KINDS = frozenset(g.kind for g in BUILTIN if g.needs_device)
"""rowgate's own kinds that run on the row's device (docs/operators.md lists them).
Derived from the classes; at run time the runner asks each class (`needs_device`)."""


class NotImplementedGate(Gate[GateSpec]):
    """A kind the row declares that this rowgate cannot run: ERROR, never PENDING."""

    def __init__(self, kind: str):
        self.kind = kind  # type: ignore[misc]  # per instance: the kind it stands for

    def measure(self, row: Row, spec: GateSpec, ctx: GateContext) -> None:
        pass

    def derive(self, row: Row, spec: GateSpec, artifact_dir: Path) -> Derived:
        return Derived(Status.ERROR, f"not implemented: gate kind {self.kind!r} is not built "
                                     f"in this version of rowgate")


def device_requirement(row: Row, spec: GateSpec, gpu: GpuChoice) -> str | None:
    """PENDING reason when the gate needs the row's device and `gpu` (the runner's
    choice for it) is none."""
    gate = registry.lookup(spec.kind)
    if gate is None or not gate.needs_device or not gpu.why_not:
        return None
    why_not = gpu.why_not
    declared = [p for p in row.pending if p.gate == spec.id]
    if declared:  # the row's own words on why, and what unblocks it
        why_not += f"; {declared[0].reason}; until {declared[0].until}"
    return why_not


def gate_for(kind: str) -> Gate[Any]:
    cls = registry.lookup(kind)
    return cls() if cls else NotImplementedGate(kind)


def run(row: Row, spec: GateSpec, ctx: GateContext, bundle_root: Path) -> GateResult:
    """`run(row, spec, ctx) -> GateResult` for any kind: device check first, so a
    gate that needs an absent device is PENDING saying so, whatever its kind."""
    return run_gate(gate_for(spec.kind), row, spec, ctx, bundle_root,
                    pending=device_requirement(row, spec, ctx.gpu))


def availability(row: Row, spec: GateSpec, devices: Inventory) -> tuple[str, str]:
    """What `rowgate rows` shows: ("runs" | "PENDING" | "ERROR", why)."""
    why_not = device_requirement(row, spec, gate_device(row, spec, devices))
    if why_not:
        return "PENDING", why_not
    if registry.lookup(spec.kind) is None:
        return "ERROR", f"not implemented: gate kind {spec.kind!r}"
    return "runs", ""
