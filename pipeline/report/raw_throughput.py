"""A throughput gate's sealed raw samples, read back, and the plots drawn from them.

The gate's result holds summaries (medians, the ratio and its CI); the bundle holds
every sample they came from. `read_samples` reads them back — each timed pass's wall
time and tokens (`samples.csv`), each request's timings (`requests.jsonl`) — with the
throughput gate's own definitions (`request_latencies`, `tok_per_s`; vLLM's benchmark
names) into one shape: per metric, per cell, per arm, (pass, value) pairs. The report
draws each cell's distribution of both arms from it (`distributions`), `rowgate
compare` compares two bundles' samples with it. A sample file that is not sealed (or
does not parse) is reported as missing, never silently skipped.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.records.gate_result import GateResult
from pipeline.report.model import DistributionFigure, Figure, Panel
from pipeline.report.tables import natural_key

SAMPLES = "samples.csv"
REQUESTS = "requests.jsonl"
ROLES = ("oracle", "candidate")
MAX_BYTES = 64 << 20
Record = dict[str, Any]
"""One line of requests.jsonl, or one row of samples.csv."""


@dataclass(frozen=True)
class Metric:
    name: str
    label: str
    unit: str
    better: str
    """"lower" or "higher"."""
    per: str
    """What one value is: "pass" or "request"."""


METRICS = {
    "tok_s": Metric("tok_s", "output tok/s", "tok/s", "higher", "pass"),
    "ttft": Metric("ttft", "TTFT (time to first token)", "ms", "lower", "request"),
    "tpot": Metric("tpot", "TPOT (time per output token)", "ms", "lower", "request"),
    "itl": Metric("itl", "ITL (inter-token latency)", "ms", "lower", "request"),
    "e2el": Metric("e2el", "E2EL (request latency)", "ms", "lower", "request"),
}

Values = dict[str, dict[str, list[tuple[int, float]]]]
"""cell -> arm -> [(pass, value)] in the order sealed."""


@dataclass
class Samples:
    """Every raw sample of one throughput gate, by metric (keys of METRICS)."""

    values: dict[str, Values] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)


def _artifact(result: GateResult, bundle_root: Path, name: str) -> Path | None:
    for rel in result.artifacts:
        if Path(rel).name == name:
            path = (bundle_root / rel).resolve()
            if path.is_relative_to(bundle_root.resolve()) and path.is_file():
                return path
    return None


def _by_cell(records: list[Record], value: Callable[[Record], list[float]]) -> Values:
    out: Values = {}
    for r in records:
        if r.get("arm") in ROLES:
            arms = out.setdefault(str(r["cell"]), {k: [] for k in ROLES})
            arms[r["arm"]] += [(int(r["repeat"]), v) for v in value(r)]
    return dict(sorted(out.items(), key=lambda kv: natural_key(kv[0])))


def _latency(kind: str) -> Callable[[Record], list[float]]:
    from pipeline.gates.throughput import request_latencies

    def get(r: Record) -> list[float]:
        if kind == "e2el":
            return [1e3 * r["latency_s"]] if r.get("latency_s") is not None else []
        if r.get("ttft_s") is None:
            return []  # not streamed: only the request latency is known
        return [1e3 * x for x in request_latencies(r)[kind]]
    return get


def _read_passes(path: Path) -> Values:
    from pipeline.gates.throughput import tok_per_s

    with open(path, newline="") as f:
        rows = [{**r, "wall_s": float(r["wall_s"]), "output_tokens": int(r["output_tokens"])}
                for r in csv.DictReader(f)]
    return _by_cell(rows, lambda r: [tok_per_s(r)])


def _read_requests(path: Path) -> dict[str, Values]:
    if path.stat().st_size > MAX_BYTES:
        raise ValueError(f"larger than {MAX_BYTES >> 20} MiB")
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    out = {kind: _by_cell(records, _latency(kind)) for kind in ("ttft", "tpot", "itl", "e2el")}
    return {k: v for k, v in out.items() if any(any(arms.values()) for arms in v.values())}


def read_samples(result: GateResult, bundle_root: Path) -> Samples:
    """The gate's raw samples; what is not sealed or does not parse, in `missing`."""
    got = Samples()
    where = f"artifacts/{result.gate_id}/"
    samples = _artifact(result, bundle_root, SAMPLES)
    if samples is None:
        got.missing.append(f"{where}{SAMPLES} is not sealed: no per-pass output tok/s")
    else:
        try:
            got.values["tok_s"] = _read_passes(samples)
        except (OSError, ValueError, KeyError) as exc:
            got.missing.append(f"{where}{SAMPLES} does not parse ({exc}): no output tok/s")
    requests = _artifact(result, bundle_root, REQUESTS)
    if requests is None:
        got.missing.append(f"{where}{REQUESTS} is not sealed: no per-request latencies")
    else:
        try:
            got.values.update(_read_requests(requests))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            got.missing.append(f"{where}{REQUESTS} does not parse ({exc}): no latencies")
    return got


def distributions(result: GateResult, bundle_root: Path) -> tuple[list[Figure], list[str]]:
    """(figures, missing): per cell, the distribution of both arms, from the raw samples."""
    got = read_samples(result, bundle_root)
    figures: list[Figure] = []
    for name, cells in got.values.items():
        m = METRICS[name]
        panels = tuple(Panel(title=cell, series=tuple(
            (role, tuple(v for _, v in arms[role])) for role in ROLES))
            for cell, arms in cells.items() if any(arms.values()))
        per = "timed pass" if m.per == "pass" else "request"
        if panels:
            figures.append(DistributionFigure(
                title=f"{result.gate_id}: {m.label} per {per}, both arms", unit=m.unit,
                better=m.better, panels=panels))
    return figures, got.missing
