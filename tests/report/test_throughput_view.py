"""The report's sequential throughput view on a real derived result (synthetic engines
through the gate's rounds and derive, tests/gates/test_timed_rounds.py's harness)."""

from __future__ import annotations

import numpy as np

from rowgate.gates.throughput import artifacts as art
from rowgate.records.gate_result import GateResult
from rowgate.report.model import IntervalFigure
from rowgate.report.sections import section_for
from tests.gates.test_timed_rounds import PASSES, cal


def _result(tmp_path, slowdown: float, **plan) -> GateResult:
    m = cal.Machine(np.random.default_rng(1), pass_noise=0.03 if plan else 0.002)
    engines = {"baseline": cal.SyntheticEngine(m, 0.0006, 0.002),
               "candidate": cal.SyntheticEngine(m, 0.0006, 0.002, slowdown=slowdown)}
    _, cells = cal.gate_run(engines, PASSES, cal.default_plans(PASSES, **plan), tmp_path,
                            now=m.now)
    window = art.Window(8, (), ("baseline: the oracle arm is not the baseline",))
    d = art.gate_verdict(cells, "graph", True, window, 0.02)
    return GateResult(gate_id="tp", kind="throughput", status=d.status, reason=d.reason,
                      metrics=d.metrics, cells=d.cells)


def test_the_view_shows_power_ci_rounds_and_bench_metrics(tmp_path):
    section = section_for(_result(tmp_path / "a", 0.05), tmp_path)
    titles = [t.title for t in section.tables]
    power = next(t for t in section.tables if "power per cell" in t.title)
    assert power.columns[:4] == ("cell", "verdict", "ratio", "ratio_ci_low")
    assert {"rounds", "rounds_needed", "detectable_effect", "stop"} <= set(power.columns)
    assert [r[1] for r in power.rows] == ["worse", "worse"]
    bench = next(t for t in section.tables if "vLLM-bench" in t.title)
    assert {"median_itl_ms", "p99_tpot_ms", "output_throughput"} <= set(bench.columns)
    assert [r[1] for r in bench.rows] == ["baseline", "candidate"] * 2
    main = next(f for f in section.figures if isinstance(f, IntervalFigure))
    assert "speed (itl; higher is better), repeated CI" in main.title
    assert main.band == (0.98, 1.02) and main.better == "higher"
    assert any(n.startswith("timed window: matched (8 requests") for n in section.notes)
    assert any("not compared: baseline" in n for n in section.notes)
    assert "metrics" in titles


def test_an_underpowered_cell_shows_the_rounds_it_would_need(tmp_path):
    section = section_for(_result(tmp_path / "b", 0.0, max_seconds=0.8), tmp_path)
    power = next(t for t in section.tables if "power per cell" in t.title)
    col = power.columns.index("rounds_needed")
    assert all(r[1] == "underpowered" and int(r[col]) > 0 for r in power.rows)
