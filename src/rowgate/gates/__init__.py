"""Gate kinds: one interface (`interface.Gate`), one module or subpackage per kind,
each an entry point of group `rowgate.gates` (`registry`), loaded when a row names it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rowgate import plugins
from rowgate.errors import UsageError
from rowgate.gates import registry
from rowgate.gates.interface import Derived, Gate, GateContext, GateError, gate_device, run_gate
from rowgate.records.gate_result import GateResult
from rowgate.rows.spec import GateSpec
from rowgate.seal.device import GpuChoice, Inventory

if TYPE_CHECKING:
    from rowgate.rows.row import Row

__all__ = ["Derived", "Gate", "GateContext", "GateError", "availability", "device_kinds",
           "device_requirement", "gate_for", "run"]


def device_kinds() -> frozenset[str]:
    """The installed kinds that run on the row's device (docs/operators.md lists
    rowgate's own); at run time the runner asks each class (`needs_device`)."""
    return frozenset(k for k in registry.kinds() if (g := registry.lookup(k)) and g.needs_device)


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
    """An instance of the installed kind (a row names only installed kinds: it is
    validated through the same registry)."""
    cls = registry.lookup(kind)
    if cls is None:
        raise UsageError(plugins.unknown(plugins.GATES, kind, "gate kind"))
    return cls()


def run(row: Row, spec: GateSpec, ctx: GateContext, bundle_root: Path,
        refused: str | None = None) -> GateResult:
    """`run(row, spec, ctx) -> GateResult` for any kind: device check first, so a
    gate that needs an absent device is PENDING saying so, whatever its kind.
    `refused`: why it is not run at all (ERROR: the row's wall budget is spent)."""
    return run_gate(gate_for(spec.kind), row, spec, ctx, bundle_root,
                    pending=device_requirement(row, spec, ctx.gpu), refused=refused)


def availability(row: Row, spec: GateSpec, devices: Inventory) -> tuple[str, str]:
    """What `rowgate rows` shows: ("runs" | "PENDING" | "ERROR", why)."""
    why_not = device_requirement(row, spec, gate_device(row, spec, devices))
    if why_not:
        return "PENDING", why_not
    return "runs", ""
