"""The throughput gate's raw artifacts (format 2) and the gate-level verdict.

    meta.json       format, the plan each cell followed, each cell's record (stop,
                    warm-up and timed round counts, discarded rounds, elapsed s),
                    both engines, the workload digest, the device
    passes.csv      one row per pass, warm-up and timed, both arms, in run order:
                    cell, phase, round, arm, start_s, end_s (from the cell's start),
                    wall_s, output_tokens, requests
    requests.jsonl  one line per request per pass: output_tokens, ttft_s, latency_s,
                    itl_s (every inter-token gap), tokens_sha256, and token_ids for
                    the first timed pass of each request and arm (and any that differ)
    clocks.csv      SM / memory clock and temperature before and after every pass
                    (GPU rows only; meta says `clocks_sampled`)

docs/gates.md documents the columns for anyone plotting distributions from them.
"""

from __future__ import annotations

import csv
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pipeline.engines.interface import Engine, WorkloadPass
from pipeline.gates import _ab, _timed
from pipeline.gates._artifacts import read_json, read_jsonl, write_json
from pipeline.gates.interface import Derived, GateError, Progress, Status

FORMAT = 2
META, PASSES, REQUESTS, CLOCKS = "meta.json", "passes.csv", "requests.jsonl", "clocks.csv"


def plan_json(plan: _timed.Plan) -> dict[str, Any]:
    return {**asdict(plan), "design": asdict(plan.design)}


def measure_cells(engines: Mapping[str, Engine], passes: Sequence[WorkloadPass],
                  plans: Mapping[str, _timed.Plan], out: Path, progress: Progress,
                  clocks: _timed.ClockFn | None = None, meta: Mapping[str, Any] | None = None,
                  now: Callable[[], float] = time.monotonic) -> None:
    """Run every cell's rounds on started engines ({'baseline', 'candidate'}) and write
    the four artifacts into `out`."""
    records = {}
    with open(out / PASSES, "w", newline="") as p_file, open(out / REQUESTS, "w") as r_file, \
            open(out / CLOCKS, "w", newline="") if clocks else _Null() as c_file:
        sink = _timed.Sink(p_file, r_file, c_file if clocks else None)
        for work in passes:
            records[work.cell] = _timed.run_cell(engines, work, plans[work.cell], sink,
                                                 progress, clocks, now)
    write_json(out / META, {**(meta or {}), "format": FORMAT,
                            "cells": [p.cell for p in passes], "records": records,
                            "plans": {c: plan_json(plans[c]) for c in records},
                            "clocks_sampled": clocks is not None})


class _Null:
    def __enter__(self):
        return None

    def __exit__(self, *exc) -> None:
        pass


def _csv(path: Path) -> list[dict]:
    try:
        with open(path, newline="") as f:
            return list(csv.DictReader(f))
    except OSError as exc:
        raise GateError(f"artifact {path.name} unreadable in {path.parent}: {exc}") from exc


def read_raw(artifact_dir: Path) -> tuple[dict, list[dict], list[dict], list[dict]]:
    meta = read_json(artifact_dir / META)
    clocks = _csv(artifact_dir / CLOCKS) if meta.get("clocks_sampled") else []
    return meta, _csv(artifact_dir / PASSES), read_jsonl(artifact_dir / REQUESTS), clocks


def derive_cells(plans: Mapping[str, _timed.Plan], meta: Mapping, passes: list[dict],
                 requests: list[dict], clocks: list[dict],
                 slo_ms: Mapping[str, float] | None = None) -> dict[str, dict[str, Any]]:
    """Every cell's metrics, re-taking every decision; the plan of each cell must be
    the one the row asks for now (the meta's copy is only compared, never used)."""
    out = {}
    for cell in meta["cells"]:
        if cell not in plans:
            raise GateError(f"cell {cell}: measured, but not a cell of this gate")
        if meta["plans"].get(cell) != json.loads(json.dumps(plan_json(plans[cell]))):
            raise GateError(f"cell {cell}: measured under another plan than the row's "
                            f"({meta['plans'].get(cell)})")
        mine = [p for p in passes if p["cell"] == cell]
        try:
            out[cell] = _ab.analyse_cell(plans[cell], meta["records"][cell], mine,
                                         [r for r in requests if r["cell"] == cell],
                                         [c for c in clocks if c["cell"] == cell], slo_ms)
        except _ab.RecordError as exc:
            raise GateError(f"cell {cell}: the records do not follow the plan: {exc}") from exc
    return out


def timed_window(requests: list[dict], correctness: Mapping[str, Mapping[str, list[int]]]
                 ) -> tuple[int, list[str]]:
    """Compare the timed passes' token ids with the correctness pass of the same
    requests (`correctness`: arm -> request id -> ids; arms without one are skipped).
    Returns (requests compared, one line per disagreement)."""
    ids, bad = _ab.timed_tokens(requests)
    compared = 0
    for (arm, rid), timed in sorted(ids.items()):
        want = correctness.get(arm, {}).get(rid)
        if want is None:
            continue
        compared += 1
        if list(want) != timed:
            pos = next((i for i, (a, b) in enumerate(zip(want, timed)) if a != b),
                       min(len(want), len(timed)))
            bad.append(f"{arm} {rid}: timed tokens part from the correctness pass at "
                       f"position {pos}")
    return compared, bad


def gate_verdict(cells: Mapping[str, Mapping[str, Any]], baseline: str,
                 underpowered_blocks: bool, window: tuple[int, list[str]] | None) -> Derived:
    counts = {v: sum(m["verdict"] == v for m in cells.values())
              for v in ("better", "worse", "equivalent", "underpowered")}
    metrics: dict[str, Any] = {"cells": len(cells), **{f"cells_{k}": n for k, n in counts.items()},
                               "underpowered_blocks": underpowered_blocks}
    lows = [m["ratio_ci_low"] for m in cells.values() if m["ratio_ci_low"] is not None]
    highs = [m["ratio_ci_high"] for m in cells.values() if m["ratio_ci_high"] is not None]
    metrics.update(ratio_ci_low_min=min(lows) if lows else None,
                   ratio_ci_high_max=max(highs) if highs else None)
    if window is not None:
        metrics.update(timed_requests_matched=window[0], timed_tokens_mismatched=len(window[1]))
    text = f"candidate/{baseline} speed ({_metric(cells)}), ratio [CI]: " + "; ".join(
        _cell_text(c, m) for c, m in cells.items())
    if window is not None and window[1]:
        return Derived(Status.FAIL, f"timed window refused: {len(window[1])} request(s) whose "
                                    f"timed tokens differ ({window[1][0]}); {text}",
                       metrics, dict(cells))
    blocking = counts["worse"] + (counts["underpowered"] if underpowered_blocks else 0)
    if blocking:
        return Derived(Status.FAIL, f"{counts['worse']} cell(s) worse, {counts['underpowered']} "
                                    f"underpowered: {text}", metrics, dict(cells))
    note = (f" ({counts['underpowered']} underpowered, not blocking per the row)"
            if counts["underpowered"] else "")
    return Derived(Status.PASS, f"equivalent or better in every decided cell{note}: {text}",
                   metrics, dict(cells))


def _metric(cells: Mapping[str, Mapping[str, Any]]) -> str:
    return next((str(m["metric"]) for m in cells.values()), "")


def _cell_text(cell: str, m: Mapping[str, Any]) -> str:
    if m["ratio"] is None:
        return f"{cell} no CI ({m['rounds']} rounds) {m['verdict']}"
    text = (f"{cell} {m['ratio']:.4f} [{m['ratio_ci_low']:.4f}, {m['ratio_ci_high']:.4f}] "
            f"{m['verdict']} after {m['rounds']} rounds")
    if m["verdict"] == "underpowered" and m.get("rounds_needed"):
        text += f" (would need ~{m['rounds_needed']})"
    return text
