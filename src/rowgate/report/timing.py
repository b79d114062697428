"""Where a bundle's wall time went: per gate, its total and its phases (sealed in each
result, `rowgate.gates.clock`), as a table and a bar chart, with the bundle's total."""

from __future__ import annotations

from collections.abc import Sequence

from rowgate.records.gate_result import GateResult
from rowgate.report.model import BarFigure, Table
from rowgate.report.tables import table


def _phases(r: GateResult) -> str:
    if not r.phases:
        return "—"  # sealed before rowgate recorded phases, or nothing ran
    total = r.duration_s or sum(r.phases.values()) or 1.0
    return ", ".join(f"{name} {s:.1f} s ({100 * s / total:.0f} %)"
                     for name, s in sorted(r.phases.items(), key=lambda kv: -kv[1]))


def time_table(results: Sequence[GateResult]) -> Table:
    """One row per gate: its wall time and its phases, largest first; then the total."""
    total = sum(r.duration_s for r in results)
    rows = [(r.gate_id, f"{r.duration_s:.1f}", _phases(r)) for r in results]
    rows.append(("all gates", f"{total:.1f}", ""))
    return table("time", ("gate", "seconds", "phases"), rows)


def time_figure(results: Sequence[GateResult]) -> BarFigure | None:
    """A bar per gate phase (`gate: phase`), seconds; None when no gate recorded any."""
    bars = [(f"{r.gate_id}: {name}", s) for r in results
            for name, s in sorted(r.phases.items(), key=lambda kv: -kv[1]) if s > 0]
    if not bars:
        return None
    total = sum(r.duration_s for r in results)
    return BarFigure(title=f"where the gates' {total:.0f} s went (seconds per gate and phase)",
                     unit="seconds", labels=tuple(b[0] for b in bars),
                     values=tuple(round(b[1], 2) for b in bars))
