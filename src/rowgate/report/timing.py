"""Where a bundle's wall time went: per gate, its total, its phases (sealed in each
result, `rowgate.gates.clock`) and its overhead (every phase but the evidence being made,
`clock.WORK`), as a table and a bar chart, with the bundle's totals."""

from __future__ import annotations

from collections.abc import Sequence

from rowgate.gates.clock import WORK, overhead_s
from rowgate.records.gate_result import GateResult
from rowgate.report.model import BarFigure, Table
from rowgate.report.tables import table

NBSP = "\u00a0"
"""Between a number and its unit: `1.4 s (69 %)` never breaks across lines in a cell."""


def _phases(r: GateResult) -> str:
    if not r.phases:
        return "—"  # sealed before rowgate recorded phases, or nothing ran
    total = r.duration_s or sum(r.phases.values()) or 1.0
    return ", ".join(f"{name} {s:.1f}{NBSP}s{NBSP}({100 * s / total:.0f}{NBSP}%)"
                     for name, s in sorted(r.phases.items(), key=lambda kv: -kv[1]))


def _overhead(seconds: float, total: float) -> str:
    if total <= 0:
        return "—"
    return f"{seconds:.1f}{NBSP}s{NBSP}({100 * seconds / total:.0f}{NBSP}%)"


def overhead_share(results: Sequence[GateResult]) -> tuple[float, float] | None:
    """(overhead seconds, all gates' seconds) over the gates that recorded phases; None
    when none did (sealed before rowgate recorded them)."""
    timed = [r for r in results if r.phases]
    if not timed:
        return None
    return (sum(overhead_s(r.phases, r.duration_s) for r in timed),
            sum(r.duration_s for r in timed))


def time_table(results: Sequence[GateResult]) -> Table:
    """One row per gate: its wall time, its overhead and its phases, largest first; then
    the totals."""
    total = sum(r.duration_s for r in results)
    rows = [(r.gate_id, f"{r.duration_s:.1f}",
             _overhead(overhead_s(r.phases, r.duration_s), r.duration_s) if r.phases else "—",
             _phases(r)) for r in results]
    share = overhead_share(results)
    rows.append(("all gates", f"{total:.1f}", _overhead(*share) if share else "—", ""))
    return table("time", ("gate", "seconds", "overhead", "phases"), rows)


def time_figure(results: Sequence[GateResult]) -> BarFigure | None:
    """A bar per gate phase (`gate: phase`, overhead phases marked), seconds; None when no
    gate recorded any."""
    bars = [(f"{r.gate_id}: {name}" + ("" if name in WORK else " (overhead)"), s)
            for r in results
            for name, s in sorted(r.phases.items(), key=lambda kv: -kv[1]) if s > 0]
    if not bars:
        return None
    total = sum(r.duration_s for r in results)
    share = overhead_share(results)
    said = f"; overhead {100 * share[0] / share[1]:.0f} %" if share and share[1] > 0 else ""
    return BarFigure(title=f"where the gates' {total:.0f} s went (seconds per gate and "
                           f"phase{said})",
                     unit="seconds", labels=tuple(b[0] for b in bars),
                     values=tuple(round(b[1], 2) for b in bars))
