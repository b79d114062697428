"""The throughput gate's format-1 derive: bundles sealed before the sequential design
(samples.csv: one wall time per repeat and arm; no `format` in meta.json) re-derive
with the statistics they were sealed under (`rowgate.stats.compat_v1`: bootstrap CI of the
ratio of medians, Mann-Whitney, parity / better / worse / inconclusive). New runs
never write this format.
"""

from __future__ import annotations

import csv
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rowgate.gates.artifacts import read_json, read_jsonl
from rowgate.gates.interface import Derived, GateError
from rowgate.records.status import Status
from rowgate.rows.workload import WorkloadMismatch, check_same_workload

if TYPE_CHECKING:
    from rowgate.rows.row import Row

META = "meta.json"
SAMPLES = "samples.csv"
REQUESTS = "requests.jsonl"
CLOCKS = "clocks.csv"
ROLES = ("oracle", "candidate")
LATENCIES = ("ttft", "tpot", "itl")


def derive(row: Row, spec: Any, artifact_dir: Path) -> Derived:
    meta = read_json(artifact_dir / META)
    try:
        check_same_workload(meta["oracle"]["workload_digest"],
                            meta["candidate"]["workload_digest"])
    except WorkloadMismatch as exc:
        return Derived(Status.ERROR, str(exc))
    samples = _read_samples(artifact_dir / SAMPLES)
    requests = read_jsonl(artifact_dir / REQUESTS)
    clocks = _read_clocks(artifact_dir / CLOCKS) if meta.get("clocks_sampled") else []
    cells = {}
    for cell in meta["cells"]:
        cells[cell] = _cell_metrics(row, spec, cell, samples, requests)
        cells[cell].update(_clock_metrics(clocks, cell))
    return _gate_verdict(cells, meta.get("baseline", "oracle"))


# ---------------------------------------------------------------- reading


def _rows(path: Path) -> list[dict[str, Any]]:
    try:
        with open(path, newline="") as f:
            return list(csv.DictReader(f))
    except OSError as exc:
        raise GateError(f"artifact {path.name} unreadable in {path.parent}: {exc}") from exc


def _read_samples(path: Path) -> list[dict[str, Any]]:
    try:
        return [{**r, "wall_s": float(r["wall_s"]), "output_tokens": int(r["output_tokens"])}
                for r in _rows(path)]
    except (KeyError, ValueError) as exc:
        raise GateError(f"artifact {path.name}: malformed sample row ({exc})") from exc


def _read_clocks(path: Path) -> list[dict[str, Any]]:
    try:
        return [{**r, "sm_clock_mhz": int(r["sm_clock_mhz"]),
                 "temperature_c": int(r["temperature_c"])} for r in _rows(path)]
    except (KeyError, ValueError) as exc:
        raise GateError(f"artifact {path.name}: malformed clock row ({exc})") from exc


# ------------------------------------------------------------- arithmetic


def tok_per_s(sample: dict[str, Any]) -> float:
    if sample["wall_s"] <= 0:
        raise GateError(f"samples.csv: cell {sample['cell']} seq {sample['seq']}: wall_s "
                        f"{sample['wall_s']} is not positive")
    return float(sample["output_tokens"] / sample["wall_s"])


def request_latencies(req: dict[str, Any]) -> dict[str, list[float]]:
    """TTFT, TPOT and ITL of one streamed request, as vLLM's benchmark defines them."""
    out = {"ttft": [req["ttft_s"]], "tpot": [], "itl": list(req["itl_s"])}
    if req["output_tokens"] > 1:
        out["tpot"] = [(req["latency_s"] - req["ttft_s"]) / (req["output_tokens"] - 1)]
    return out


def _repeat_latencies(requests: list[dict[str, Any]], cell: str, role: str) -> dict[str, list[float]]:
    """Per repeat, the median over its requests (all gaps for ITL): one value per repeat."""
    per_repeat: dict[int, dict[str, list[float]]] = {}
    for req in requests:
        if req["cell"] == cell and req["arm"] == role:
            acc = per_repeat.setdefault(req["repeat"], {k: [] for k in LATENCIES})
            for k, values in request_latencies(req).items():
                acc[k] += values
    return {k: [statistics.median(v[k]) for _, v in sorted(per_repeat.items()) if v[k]]
            for k in LATENCIES}


def _streamed(requests: list[dict[str, Any]], cell: str) -> bool:
    mine = [r for r in requests if r["cell"] == cell]
    return bool(mine) and all(r["ttft_s"] is not None for r in mine)


def _parity_bounds(row: Row, spec: Any, cell: str) -> list[Any]:
    from rowgate.stats import compat_v1 as stats

    return [stats.ParityBound.from_criterion(c) for c in row.criteria
            if c.gate == spec.id and c.metric in stats.RATIO_METRICS
            and (c.cells == ["*"] or cell in c.cells)]


def _cell_metrics(row: Row, spec: Any, cell: str, samples: list[dict[str, Any]],
                  requests: list[dict[str, Any]]) -> dict[str, Any]:
    from rowgate.stats import compat_v1 as stats

    tps = {role: [tok_per_s(s) for s in samples if s["cell"] == cell and s["arm"] == role]
           for role in ROLES}
    if not tps["oracle"] or not tps["candidate"]:
        raise GateError(f"samples.csv: cell {cell} has no samples for "
                        f"{'oracle' if not tps['oracle'] else 'candidate'}")
    cmp = stats.compare(tps["candidate"], tps["oracle"], n_resamples=spec.bootstrap)
    verdict = stats.verdict(cmp, min_effect=spec.min_effect, alpha=spec.alpha,
                            parity=_parity_bounds(row, spec, cell))
    m = cmp.metrics()
    metrics = {"repeats_candidate": m.pop("n_candidate"), "repeats_oracle": m.pop("n_oracle"),
               "tok_s_median_candidate": m.pop("median_candidate"),
               "tok_s_median_oracle": m.pop("median_oracle"), **m, "verdict": verdict.value}
    if _streamed(requests, cell):
        lat = {role: _repeat_latencies(requests, cell, role) for role in ROLES}
        for k in LATENCIES:
            if lat["candidate"][k] and lat["oracle"][k]:
                c = stats.compare(lat["candidate"][k], lat["oracle"][k],
                                  n_resamples=spec.bootstrap)
                metrics.update({f"{k}_median_candidate_s": round(c.median_candidate, 9),
                                f"{k}_median_oracle_s": round(c.median_oracle, 9),
                                f"{k}_ratio_median": round(c.ratio_median, 9),
                                f"{k}_ratio_ci_low": round(c.ratio_ci_low, 9),
                                f"{k}_ratio_ci_high": round(c.ratio_ci_high, 9),
                                f"{k}_p_value": round(c.p_value, 9)})
    return metrics


def _clock_metrics(clocks: list[dict[str, Any]], cell: str) -> dict[str, Any]:
    mine = [c for c in clocks if c["cell"] == cell]
    if not mine:
        return {}
    sm = [c["sm_clock_mhz"] for c in mine]
    return {"sm_clock_min_mhz": min(sm), "sm_clock_max_mhz": max(sm),
            "sm_clock_spread": round((max(sm) - min(sm)) / max(sm), 6) if max(sm) else 0.0,
            "temperature_max_c": max(c["temperature_c"] for c in mine)}


def _gate_verdict(cells: dict[str, dict[str, Any]], baseline: str = "oracle") -> Derived:
    from rowgate.stats import compat_v1 as stats

    counts = {v.value: sum(m["verdict"] == v.value for m in cells.values())
              for v in stats.Verdict}
    metrics = {"cells": len(cells), **{f"cells_{k}": n for k, n in counts.items()},
               "ratio_median_min": min(m["ratio_median"] for m in cells.values()),
               "ratio_ci_low_min": min(m["ratio_ci_low"] for m in cells.values()),
               "ratio_ci_high_max": max(m["ratio_ci_high"] for m in cells.values())}
    parts = [f"{cell} {m['ratio_median']:.3f} [{m['ratio_ci_low']:.3f}, "
             f"{m['ratio_ci_high']:.3f}] p={m['p_value']:.3g} {m['verdict']}"
             for cell, m in cells.items()]
    text = f"candidate/{baseline} output tok/s, median [95% CI]: " + "; ".join(parts)
    blocking = counts["worse"] + counts["inconclusive"]
    if blocking:
        return Derived(Status.FAIL, f"{counts['worse']} cell(s) worse, {counts['inconclusive']} "
                                    f"inconclusive: {text}", metrics, cells)
    return Derived(Status.PASS, f"parity or better in all {len(cells)} cells: {text}",
                   metrics, cells)
