"""Throughput gate: matched A/B of candidate vs oracle per workload cell.

measure starts both arms once and keeps them alive across cells and repeats.
Per cell: `warmup` untimed rounds, then `repeats` timed passes per arm in an
order that never puts one arm always first — alternating pairs (O C, C O,
O C, …: A B B A) or a seeded coin flip per pair. Every timed pass is written
raw: wall time and output tokens (samples.csv), per-request timings
(requests.jsonl), and GPU clocks / temperature before and after it
(clocks.csv, when a GPU is present).

derive recomputes everything from those files with `pipeline.stats`: output
tok/s per repeat, medians, IQR/median, bootstrap 95 % CI of the
candidate/oracle ratio of medians, Mann-Whitney p, and the per-cell verdict.
Where both arms streamed (TTFT per request), TTFT / TPOT / ITL follow vLLM's
benchmark definitions: TTFT = time to first token; TPOT = (latency - TTFT) /
(output tokens - 1); ITL = the gaps between consecutive tokens.

numpy / scipy (the `stats` extra) are imported where used, so the rest of
rowgate runs without them.
"""

from __future__ import annotations

import csv
import hashlib
import json
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import Field

import pipeline.gates._arms as _arms
from pipeline import device
from pipeline.gates._artifacts import read_json, read_jsonl, write_json
from pipeline.gates.interface import Derived, Gate, GateContext, GateError, gate_arch
from pipeline.gates.registry import register
from pipeline.options import ENGINE_KEYS
from pipeline.records.status import Status
from pipeline.rowspec import GateSpec
from pipeline.workload import WorkloadMismatch, check_same_workload, workload_digest

if TYPE_CHECKING:
    from pipeline.rows import Row

META = "meta.json"
SAMPLES = "samples.csv"
REQUESTS = "requests.jsonl"
CLOCKS = "clocks.csv"
SAMPLE_FIELDS = ["cell", "seq", "repeat", "arm", "wall_s", "output_tokens", "requests"]
CLOCK_FIELDS = ["cell", "seq", "arm", "when", "t", "sm_clock_mhz", "mem_clock_mhz",
                "temperature_c"]
ROLES = ("oracle", "candidate")
LATENCIES = ("ttft", "tpot", "itl")


class ThroughputGate(GateSpec):
    kind: Literal["throughput"]
    repeats: Annotated[int, Field(ge=5)] = 9
    warmup: Annotated[int, Field(ge=0)] = 1
    order: Literal["alternating", "random"] = "alternating"
    min_effect: Annotated[float, Field(ge=0)] = 0.02
    """Smallest relative difference treated as real (e.g. 0.02 = 2 %)."""
    alpha: Annotated[float, Field(gt=0, lt=1)] = 0.05
    bootstrap: Annotated[int, Field(ge=1000)] = 10000
    cells: list[str] = []
    """Subset of the workload matrix; empty means every cell."""
    endpoint: bool = False
    """Drive the arms through their OpenAI endpoints (streamed TTFT/TPOT/ITL)."""
    baseline: str = "oracle"
    """The A side: `oracle`, or the mode of one of the row's fallback arms (e.g.
    `graph`: the persistent candidate against CUDA-graph replay on the same device).
    The artifacts keep calling the A side `oracle`; meta.json names the arm."""


def schedule(order: str, repeats: int, seed: int) -> list[str]:
    """Arm order of the timed passes of one cell: `repeats` pairs, each arm once
    per pair; alternating pairs flip, random pairs are a seeded coin flip."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out: list[str] = []
    for k in range(repeats):
        flip = bool(rng.integers(2)) if order == "random" else k % 2 == 1
        out += list(reversed(ROLES)) if flip else list(ROLES)
    return out


def cell_seed(row: Row, spec: ThroughputGate, cell: str) -> int:
    """A stable seed per (row, gate, cell): same schedule on every run and machine."""
    h = hashlib.sha256(f"{row.id}/{spec.id}/{cell}".encode()).digest()
    return int.from_bytes(h[:8], "big")


@register
class Throughput(Gate[ThroughputGate]):
    kind = "throughput"
    spec_model = ThroughputGate
    needs_device = True
    workload_matrix = True
    report_view = "throughput"
    options = (*ENGINE_KEYS, _arms.CANDIDATE_MODEL_OPTION)

    def requirements(self, row: Row, spec: ThroughputGate, ctx: GateContext) -> str | None:
        try:
            base = _arms.baseline_arm(row, spec.baseline)
        except GateError:
            return None  # measure raises it: a row naming a missing arm is an ERROR
        return _arms.arms_requirement(row, {"oracle": base, "candidate": row.arms.candidate})

    def arch(self, row: Row, spec, ctx: GateContext) -> tuple[str, bool]:
        return gate_arch(row, ctx.gpu)

    # ------------------------------------------------------------- measure

    def measure(self, row: Row, spec: ThroughputGate, ctx: GateContext) -> None:
        model = _arms.resolve_model(row)
        passes = _arms.select_cells(_arms.workload_passes(row, model), spec.cells)
        cand_model = _arms.candidate_model(model, ctx)
        gpu = _arms.gpu_index(row, ctx)
        out = ctx.artifact_dir
        base = _arms.baseline_arm(row, spec.baseline)
        arms = {"oracle": (base, model), "candidate": (row.arms.candidate, cand_model)}
        endpoint = {"endpoint": "true"} if spec.endpoint else {}
        with _arms.started(arms, row, ctx, endpoint) as engines, \
                open(out / SAMPLES, "w", newline="") as s_file, \
                open(out / REQUESTS, "w") as r_file, \
                open(out / CLOCKS, "w", newline="") as c_file:
            samples = csv.DictWriter(s_file, SAMPLE_FIELDS)
            clocks = csv.DictWriter(c_file, CLOCK_FIELDS)
            samples.writeheader()
            clocks.writeheader()
            for work in passes:
                self._cell(row, spec, ctx, engines, work, gpu, samples, r_file, clocks)
            descriptions = {role: engines[role].describe() for role in ROLES}
        if gpu is None:
            (out / CLOCKS).unlink()  # no GPU: nothing to sample, and no empty file to misread
        write_json(out / META, {
            "model_digest": model.digest, "cells": [p.cell for p in passes],
            "order": spec.order, "repeats": spec.repeats, "warmup": spec.warmup,
            "device": _arms.device_name(row, ctx), "clocks_sampled": gpu is not None,
            "baseline": spec.baseline,
            "schedules": {p.cell: schedule(spec.order, spec.repeats, cell_seed(row, spec, p.cell))
                          for p in passes},
            **{role: {"engine": descriptions[role], "workload_digest": workload_digest(passes)}
               for role in ROLES}})

    def _cell(self, row, spec, ctx, engines, work, gpu, samples, r_file, clocks) -> None:
        for w in range(spec.warmup):
            for role in (ROLES if w % 2 == 0 else tuple(reversed(ROLES))):
                ctx.progress.update(f"throughput {work.cell}: warm-up {w + 1}/{spec.warmup} "
                                    f"{role}")
                _arms.generate(engines[role], role, work)
        order = schedule(spec.order, spec.repeats, cell_seed(row, spec, work.cell))
        for seq, role in enumerate(order):
            repeat = seq // 2
            ctx.progress.update(f"throughput {work.cell}: repeat {repeat + 1}/{spec.repeats} "
                                f"{role}")
            _sample_clocks(clocks, gpu, work.cell, seq, role, "before")
            result = _arms.generate(engines[role], role, work)
            _sample_clocks(clocks, gpu, work.cell, seq, role, "after")
            samples.writerow({"cell": work.cell, "seq": seq, "repeat": repeat, "arm": role,
                              "wall_s": repr(result.wall_s),
                              "output_tokens": result.output_tokens,
                              "requests": len(result.outputs)})
            for o in result.outputs:
                r_file.write(json.dumps({
                    "cell": work.cell, "repeat": repeat, "arm": role, "id": o.id,
                    "output_tokens": len(o.token_ids), "ttft_s": o.ttft_s,
                    "latency_s": o.latency_s, "itl_s": list(o.itl_s)}) + "\n")

    # -------------------------------------------------------------- derive

    def derive(self, row: Row, spec: ThroughputGate, artifact_dir: Path) -> Derived:
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


# ---------------------------------------------------------------- sampling


def _sample_clocks(writer, gpu: int | None, cell: str, seq: int, role: str, when: str) -> None:
    if gpu is None:
        return
    s = device.sample_clocks(gpu, time.time())
    writer.writerow({"cell": cell, "seq": seq, "arm": role, "when": when, "t": repr(s.t),
                     "sm_clock_mhz": s.sm_clock_mhz, "mem_clock_mhz": s.mem_clock_mhz,
                     "temperature_c": s.temperature_c})


# ---------------------------------------------------------------- reading


def _rows(path: Path) -> list[dict]:
    try:
        with open(path, newline="") as f:
            return list(csv.DictReader(f))
    except OSError as exc:
        raise GateError(f"artifact {path.name} unreadable in {path.parent}: {exc}") from exc


def _read_samples(path: Path) -> list[dict]:
    try:
        return [{**r, "wall_s": float(r["wall_s"]), "output_tokens": int(r["output_tokens"])}
                for r in _rows(path)]
    except (KeyError, ValueError) as exc:
        raise GateError(f"artifact {path.name}: malformed sample row ({exc})") from exc


def _read_clocks(path: Path) -> list[dict]:
    try:
        return [{**r, "sm_clock_mhz": int(r["sm_clock_mhz"]),
                 "temperature_c": int(r["temperature_c"])} for r in _rows(path)]
    except (KeyError, ValueError) as exc:
        raise GateError(f"artifact {path.name}: malformed clock row ({exc})") from exc


# ------------------------------------------------------------- arithmetic


def tok_per_s(sample: dict) -> float:
    if sample["wall_s"] <= 0:
        raise GateError(f"samples.csv: cell {sample['cell']} seq {sample['seq']}: wall_s "
                        f"{sample['wall_s']} is not positive")
    return sample["output_tokens"] / sample["wall_s"]


def request_latencies(req: dict) -> dict[str, list[float]]:
    """TTFT, TPOT and ITL of one streamed request, as vLLM's benchmark defines them."""
    out = {"ttft": [req["ttft_s"]], "tpot": [], "itl": list(req["itl_s"])}
    if req["output_tokens"] > 1:
        out["tpot"] = [(req["latency_s"] - req["ttft_s"]) / (req["output_tokens"] - 1)]
    return out


def _repeat_latencies(requests: list[dict], cell: str, role: str) -> dict[str, list[float]]:
    """Per repeat, the median over its requests (all gaps for ITL): one value per repeat."""
    per_repeat: dict[int, dict[str, list[float]]] = {}
    for req in requests:
        if req["cell"] == cell and req["arm"] == role:
            acc = per_repeat.setdefault(req["repeat"], {k: [] for k in LATENCIES})
            for k, values in request_latencies(req).items():
                acc[k] += values
    return {k: [statistics.median(v[k]) for _, v in sorted(per_repeat.items()) if v[k]]
            for k in LATENCIES}


def _streamed(requests: list[dict], cell: str) -> bool:
    mine = [r for r in requests if r["cell"] == cell]
    return bool(mine) and all(r["ttft_s"] is not None for r in mine)


def _parity_bounds(row: Row, spec: ThroughputGate, cell: str) -> list:
    from pipeline import stats

    return [stats.ParityBound.from_criterion(c) for c in row.criteria
            if c.gate == spec.id and c.metric in stats.RATIO_METRICS
            and (c.cells == ["*"] or cell in c.cells)]


def _cell_metrics(row: Row, spec: ThroughputGate, cell: str, samples: list[dict],
                  requests: list[dict]) -> dict:
    from pipeline import stats

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


def _clock_metrics(clocks: list[dict], cell: str) -> dict:
    mine = [c for c in clocks if c["cell"] == cell]
    if not mine:
        return {}
    sm = [c["sm_clock_mhz"] for c in mine]
    return {"sm_clock_min_mhz": min(sm), "sm_clock_max_mhz": max(sm),
            "sm_clock_spread": round((max(sm) - min(sm)) / max(sm), 6) if max(sm) else 0.0,
            "temperature_max_c": max(c["temperature_c"] for c in mine)}


def _gate_verdict(cells: dict[str, dict], baseline: str = "oracle") -> Derived:
    from pipeline import stats

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
