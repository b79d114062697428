"""Throughput plots computed at report time from the sealed raw samples.

The gate's result holds summaries (medians, the ratio and its CI); the bundle holds
every sample they came from. This reads the samples back — each timed pass's wall
time and tokens (`samples.csv`), each request's timings (`requests.jsonl`) — with the
throughput gate's own definitions (`request_latencies`, `tok_per_s`, vLLM's benchmark
names), and draws, per cell, the distribution of both arms in absolute units with
the better direction on the axis. A sample file the section needs that is not
sealed (or does not parse) is reported as missing, never silently skipped.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.records.gate_result import GateResult
from pipeline.report.model import DistributionFigure, Figure, Panel
from pipeline.report.tables import natural_key

SAMPLES = "samples.csv"
REQUESTS = "requests.jsonl"
ROLES = ("oracle", "candidate")
LATENCY_NAMES = {"ttft": "TTFT (time to first token)", "tpot": "TPOT (time per output token)",
                 "itl": "ITL (inter-token latency)", "e2el": "E2EL (request latency)"}
MAX_BYTES = 64 << 20
Record = dict[str, Any]
"""One line of requests.jsonl, or one row of samples.csv."""


def _artifact(result: GateResult, bundle_root: Path, name: str) -> Path | None:
    for rel in result.artifacts:
        if Path(rel).name == name:
            path = (bundle_root / rel).resolve()
            if path.is_relative_to(bundle_root.resolve()) and path.is_file():
                return path
    return None


def _requests(path: Path) -> list[Record]:
    if path.stat().st_size > MAX_BYTES:
        raise ValueError(f"larger than {MAX_BYTES >> 20} MiB")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _by_cell(records: list[Record], value: Callable[[Record], list[float]]
             ) -> dict[str, dict[str, list[float]]]:
    """{cell: {role: [values]}} from `value(record) -> list of floats`."""
    out: dict[str, dict[str, list[float]]] = {}
    for r in records:
        if r.get("arm") in ROLES:
            out.setdefault(r["cell"], {k: [] for k in ROLES})[r["arm"]].extend(value(r))
    return dict(sorted(out.items(), key=lambda kv: natural_key(kv[0])))


def _panels(cells: dict[str, dict[str, list[float]]]) -> tuple[Panel, ...]:
    return tuple(Panel(title=cell, series=tuple((role, tuple(v[role])) for role in ROLES))
                 for cell, v in cells.items() if any(v.values()))


def _latency_figures(gate_id: str, records: list[Record]) -> list[Figure]:
    from pipeline.gates.throughput import request_latencies

    def ms(kind: str) -> Callable[[Record], list[float]]:
        def get(r: Record) -> list[float]:
            if kind == "e2el":
                return [1e3 * r["latency_s"]] if r.get("latency_s") is not None else []
            if r.get("ttft_s") is None:
                return []  # not streamed: only the request latency is known
            return [1e3 * x for x in request_latencies(r)[kind]]
        return get

    figures: list[Figure] = []
    for kind, label in LATENCY_NAMES.items():
        panels = _panels(_by_cell(records, ms(kind)))
        if panels:
            figures.append(DistributionFigure(
                title=f"{gate_id}: {label} per request, both arms", unit="ms", better="lower",
                panels=panels))
    return figures


def _speed_figure(gate_id: str, path: Path) -> Figure | None:
    from pipeline.gates.throughput import tok_per_s

    with open(path, newline="") as f:
        rows = [{**r, "wall_s": float(r["wall_s"]), "output_tokens": int(r["output_tokens"])}
                for r in csv.DictReader(f)]
    panels = _panels(_by_cell(rows, lambda r: [tok_per_s(r)]))
    if not panels:
        return None
    return DistributionFigure(title=f"{gate_id}: output tok/s per timed pass, both arms",
                              unit="tok/s", better="higher", panels=panels)


def distributions(result: GateResult, bundle_root: Path) -> tuple[list[Figure], list[str]]:
    """(figures, missing): per-cell distributions of both arms from the raw samples."""
    figures: list[Figure] = []
    missing: list[str] = []
    samples = _artifact(result, bundle_root, SAMPLES)
    requests = _artifact(result, bundle_root, REQUESTS)
    where = f"artifacts/{result.gate_id}/"
    if samples is None:
        missing.append(f"{where}{SAMPLES} is not sealed: no per-pass output tok/s distribution")
    else:
        try:
            fig = _speed_figure(result.gate_id, samples)
            figures += [fig] if fig else []
        except (OSError, ValueError, KeyError) as exc:
            missing.append(f"{where}{SAMPLES} does not parse ({exc}): no tok/s distribution")
    if requests is None:
        missing.append(f"{where}{REQUESTS} is not sealed: no per-request latency distributions")
    else:
        try:
            figures += _latency_figures(result.gate_id, _requests(requests))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            missing.append(f"{where}{REQUESTS} does not parse ({exc}): no latency "
                           f"distributions")
    return figures, missing
