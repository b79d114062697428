"""Tables any gate result can be shown as: its metrics, and its cells × metrics."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from rowgate.records.gate_result import GateResult
from rowgate.records.status import MetricValue
from rowgate.report.model import Table
from rowgate.report.units import metric

MAX_ROWS = 200
"""Rows shown per table; the sealed artifacts hold every row."""
WIDE_ROWS = 12
WIDE_COLUMNS = 10
"""A table with more rows or columns than this is collapsed in the page (`<details>`):
the audit's 22 kernels, a 35-column cell table."""


def is_wide(t: Table) -> bool:
    return len(t.rows) > WIDE_ROWS or len(t.columns) > WIDE_COLUMNS


def natural_key(name: str) -> tuple[tuple[int, int, str], ...]:
    """`i16-c4` before `i1024-c1`: numbers compare as numbers (bundles store keys sorted)."""
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p)
                 for p in re.split(r"(\d+)", name) if p)


def fmt(value: MetricValue | object) -> str:
    """One cell of text: 4 significant digits for floats, `—` for missing."""
    if value is None or value == "":
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def table(title: str, columns: Sequence[str], rows: Iterable[Sequence[object]],
          status_column: int | None = None) -> Table:
    text = [tuple(fmt(v) for v in r) for r in rows]
    shown = text[:MAX_ROWS]
    return Table(title=title, columns=tuple(columns), rows=tuple(shown),
                 status_column=status_column, truncated=len(text) - len(shown))


def metric_columns(cells: Iterable[dict[str, MetricValue]]) -> list[str]:
    """Union of the metric names, in order of first appearance."""
    seen: dict[str, None] = {}
    for metrics in cells:
        for key in metrics:
            seen.setdefault(key, None)
    return list(seen)


def metrics_table(result: GateResult) -> Table | None:
    if not result.metrics:
        return None
    return table("metrics", ("metric", "value"),
                 ((k, metric(k, v)) for k, v in result.metrics.items()))


def cells_table(title: str, cells: dict[str, dict[str, MetricValue]],
                first_column: str = "cell") -> Table | None:
    if not cells:
        return None
    columns = metric_columns(cells.values())
    status = columns.index("status") + 1 if "status" in columns else None
    return table(title, (first_column, *columns),
                 ([name, *(metric(c, m.get(c)) for c in columns)] for name, m in cells.items()),
                 status)


INFORMATIONAL = " (informational)"
"""Suffix of an informational gate's status cell: renderers style it as no alarm."""


def status_cell(status: str, required: bool) -> str:
    return status if required else status + INFORMATIONAL


def gates_table(results: Sequence[GateResult], required: dict[str, bool]) -> Table:
    """One row per gate; `required` (sealed in the manifest) says which gates count in
    the overall status: the others' status reads `FAIL (informational)`."""
    def where(r: GateResult) -> str:
        return f"{r.arch} (stand-in)" if r.stand_in else r.arch

    def counts(r: GateResult) -> bool:
        return required.get(r.gate_id, True)

    return table("gates", ("gate", "kind", "arch", "status", "required", "reason"),
                 ((r.gate_id, r.kind, where(r), status_cell(r.status.value, counts(r)),
                   "yes" if counts(r) else "no", r.reason)
                  for r in results), status_column=3)
