"""The report's view of a sequential throughput result (format 2): per cell the power
verdict, the repeated CI reached, the rounds it took and those an underpowered cell
would need, the smallest slowdown the budget detects; per arm the vLLM-bench
metrics; the matched timed window. A figure per ratio (the decision metric's speed
ratio, and each metric's candidate/baseline ratio) with the row's ±min_effect band.

Reads only the result's metric names (those `rowgate.gates.throughput.derive` writes), so it renders
without scipy; docs/gates.md documents the raw records for plotting distributions.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rowgate.records.gate_result import GateResult
from rowgate.records.status import MetricValue
from rowgate.report.model import Figure, IntervalFigure, Table
from rowgate.report.tables import table

RATIOS = ("ratio", "ratio_ci_low", "ratio_ci_high")
SECONDARY = ("itl_", "tpot_", "ttft_", "e2el_", "output_throughput_")
POWER = ("verdict", "ratio", "ratio_ci_low", "ratio_ci_high", "confidence", "rounds",
         "rounds_needed", "detectable_effect", "stop", "rounds_discarded", "warmup_rounds",
         "warning")
LATENCY = ("ttft", "tpot", "itl", "e2el")
ARMS = ("baseline", "candidate")


def is_sequential(result: GateResult) -> bool:
    return any("rounds_needed" in m for m in result.cells.values())


def _num(value: MetricValue) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _f(metrics: Mapping[str, MetricValue], key: str) -> float:
    return _num(metrics.get(key)) or 0.0


def _figure(result: GateResult, prefix: str, band: tuple[float, float] | None
            ) -> IntervalFigure | None:
    rows = [(c, m) for c, m in result.cells.items()
            if all(_num(m.get(prefix + k)) is not None for k in RATIOS)]
    if not rows:
        return None
    metric = next((str(m.get("metric")) for _, m in rows), "")
    name = prefix.rstrip("_")
    # the decision's ratio is of speeds (1 / latency for a latency metric): higher is
    # better; an informational ratio of a latency is lower-is-better
    better = "higher" if not prefix or name == "output_throughput" else "lower"
    what = (f"candidate / baseline speed ({metric}; higher is better), repeated CI"
            if not prefix else f"candidate / baseline {name} (informational; {better} is "
                               f"better), CI at the same level")
    return IntervalFigure(title=f"{result.gate_id}: {what}", ylabel="candidate / baseline",
                          better=better,
                          labels=tuple(c for c, _ in rows),
                          values=tuple(_f(m, prefix + "ratio") for _, m in rows),
                          lows=tuple(_f(m, prefix + "ratio_ci_low") for _, m in rows),
                          highs=tuple(_f(m, prefix + "ratio_ci_high") for _, m in rows),
                          band=band if not prefix else None)


def _arm_rows(cells: Mapping[str, Mapping[str, MetricValue]]) -> tuple[list[str], list[list[Any]]]:
    names = [f"{s}_{lat}_ms" for lat in LATENCY for s in ("mean", "median", "p90", "p99")]
    names += ["output_throughput", "request_throughput", "request_goodput"]
    present = [n for n in names if any(f"{a}_{n}" in m for m in cells.values() for a in ARMS)]
    rows = [[cell, arm, *(m.get(f"{arm}_{n}") for n in present)]
            for cell, m in cells.items() for arm in ARMS if f"{arm}_completed" in m]
    return present, rows


def view(result: GateResult, spec: object | None) -> tuple[list[Table], list[Figure], list[str]]:
    """Tables, figures and notes of a format-2 throughput result."""
    min_effect = _num(result.metrics.get("min_effect"))
    if min_effect is None:
        min_effect = _num(getattr(spec, "min_effect", None))
    band = (1 - min_effect, 1 + min_effect) if min_effect is not None else None
    figures = [f for f in (_figure(result, p, band) for p in ("", *SECONDARY)) if f]
    power = [k for k in POWER if any(k in m for m in result.cells.values())]
    tables = [table(f"{result.gate_id}: power per cell (verdict, CI reached, rounds)",
                    ("cell", *power), ([c, *(m.get(k) for k in power)]
                                       for c, m in result.cells.items()), None)]
    present, rows = _arm_rows(result.cells)
    if rows:
        tables.append(table(f"{result.gate_id}: vLLM-bench metrics per arm (ms, tok/s, req/s)",
                            ("cell", "arm", *present), rows))
    notes = []
    window = result.metrics.get("timed_window")
    if window is not None:
        notes.append(f"timed window: {window} ({result.metrics.get('timed_requests_compared')} "
                     f"requests compared with the tokens gate's pass)")
    if result.metrics.get("timed_window_unchecked"):
        notes.append(f"not compared: {result.metrics['timed_window_unchecked']}")
    return tables, list(figures), notes


CLAIM_RULES = {
    "narrow": "a better / worse claim needed a CI no wider than the ±min_effect band",
    "narrow-or-clear": "a better / worse claim needed a CI no wider than the ±min_effect "
                       "band, or one wholly beyond the band at any width",
}
"""What each claim rule of the sealed plans meant (src/rowgate/stats/paired.py, docs/gates.md)."""


def claim_notes(rules: dict[str, str]) -> list[str]:
    """One note per claim rule the cells' sealed plans name."""
    by_rule: dict[str, list[str]] = {}
    for cell, rule in rules.items():
        by_rule.setdefault(rule, []).append(cell)
    return [f"claim rule {rule} ({', '.join(cells)}): "
            f"{CLAIM_RULES.get(rule, 'not a rule this rowgate knows')}"
            for rule, cells in by_rule.items()]
