"""The throughput gate's raw artifacts (format 2) and the gate-level verdict.

    meta.json       format, the plan each cell followed, each cell's record (stop,
                    warm-up and timed round counts, discarded rounds, passes per
                    sample k, elapsed s),
                    both engines, the workload digest, the device
    passes.csv      one row per pass, warm-up and timed, both arms, in run order:
                    cell, phase, round, arm, pass (0..k-1 within the arm's sample of
                    the round), start_s, end_s (from the cell's start),
                    wall_s, output_tokens, requests, carried_from (the earlier gate
                    that ran a carried warm-up round 0's pass; empty otherwise)
    requests.jsonl.gz  (`requests.jsonl` in bundles sealed before 2026-12-02)
                    one line per request per pass (its round, arm, pass): output_tokens, ttft_s, latency_s,
                    itl_s (every inter-token gap), tokens_sha256, and token_ids for
                    the first timed pass of each request and arm (and any that differ)
    clocks.csv      SM / memory clock and temperature before and after every pass
                    (GPU rows only; meta says `clocks_sampled`)

docs/gates.md documents the columns for anyone plotting distributions from them.
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import time
from collections.abc import Callable, Hashable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import rowgate.gates.throughput.derive as _ab
import rowgate.gates.throughput.measure as _timed
from rowgate import compressed
from rowgate.engines.divergence import Out, matched_windows
from rowgate.engines.interface import Engine, WorkloadPass
from rowgate.gates.artifacts import read_json, read_jsonl, write_json
from rowgate.gates.engine_pool import PassJournal
from rowgate.gates.interface import Derived, GateError, Progress
from rowgate.records.status import Status
from rowgate.stats import paired as stats

FORMAT = 2
META, PASSES, REQUESTS, CLOCKS = "meta.json", "passes.csv", "requests.jsonl", "clocks.csv"
"""REQUESTS is sealed gzipped (`compressed.gzipped`): every inter-token gap of every pass
is most of a throughput bundle (4.7 MB for the megakernel row's three cells, 1.0 MB
gzipped); readers take either form (`compressed.either`)."""


def plan_json(plan: _timed.Plan) -> dict[str, Any]:
    return {**asdict(plan), "design": asdict(plan.design)}


@contextlib.contextmanager
def open_sink(out: Path, clocks: bool) -> Iterator[_timed.Sink]:
    """The raw files of a gate run, open for appending pass by pass."""
    with contextlib.ExitStack() as stack:
        p_file = stack.enter_context(open(out / PASSES, "w", newline=""))
        r_file = stack.enter_context(open(out / REQUESTS, "w"))
        c_file = stack.enter_context(open(out / CLOCKS, "w", newline="")) if clocks else None
        yield _timed.Sink(p_file, r_file, c_file)
    # Appended plain while the cells run, packed whole once they are done: the sealed
    # bytes are `compressed.pack`'s, the same for the same content. A run that raised
    # leaves it plain; its staging directory is discarded anyway.
    compressed.compress_in_place(out / REQUESTS)


def measure_cells(engines: Mapping[str, Engine], passes: Sequence[WorkloadPass],
                  plans: MutableMapping[str, _timed.Plan], sink: _timed.Sink, progress: Progress,
                  clocks: _timed.ClockFn | None = None,
                  now: Callable[[], float] = time.monotonic,
                  time_left: Callable[[], float | None] = lambda: None, later: int = 0,
                  journal: PassJournal | None = None) -> dict[str, dict[str, Any]]:
    """Run every cell's rounds on started engines ({'baseline', 'candidate'}); return
    each cell's record for meta.json. Under a row wall budget (`time_left`) each cell's
    plan is first cut to its share of what is left (`budgeted`), in `plans` too: the
    plan each cell ran under is the one sealed. `later`: cells of the gate's other models
    still to run after these (they share the time left too). `journal`: the row run's
    engine pool (`run_cell`)."""
    records = {}
    for i, work in enumerate(passes):
        plans[work.cell] = budgeted(plans[work.cell], time_left(), len(passes) - i + later)
        records[work.cell] = _timed.run_cell(engines, work, plans[work.cell], sink, progress,
                                             clocks, now, journal)
    return records


def budgeted(plan: _timed.Plan, left: float | None, cells: int) -> _timed.Plan:
    """The plan with its time budget cut to an equal share of the row's time left among
    the `cells` still to run (a cell that decides early leaves its rest to the next);
    unchanged without a row budget or when its own budget is the smaller."""
    if left is None:
        return plan
    share = math.floor(10 * left / max(cells, 1)) / 10  # 0.1 s steps: a readable sealed plan
    return plan if share >= plan.max_seconds else replace(plan, max_seconds=max(share, 0.1))


def write_meta(out: Path, records: Mapping[str, Mapping[str, Any]],
               plans: Mapping[str, _timed.Plan], clocks: bool,
               extra: Mapping[str, Any] | None = None) -> None:
    write_json(out / META, {**(extra or {}), "format": FORMAT, "cells": list(records),
                            "records": dict(records),
                            "plans": {c: plan_json(plans[c]) for c in records},
                            "clocks_sampled": clocks})


def read_csv(path: Path) -> list[dict[str, Any]]:
    try:
        with open(path, newline="") as f:
            return list(csv.DictReader(f))
    except OSError as exc:
        raise GateError(f"artifact {path.name} unreadable in {path.parent}: {exc}") from exc


Rows = list[dict[str, Any]]


def read_raw(artifact_dir: Path) -> tuple[dict[str, Any], Rows, Rows, Rows]:
    meta = read_json(artifact_dir / META)
    clocks = read_csv(artifact_dir / CLOCKS) if meta.get("clocks_sampled") else []
    requests = read_jsonl(compressed.either(artifact_dir / REQUESTS))
    return meta, read_csv(artifact_dir / PASSES), requests, clocks


def derive_cells(plans: Mapping[str, _timed.Plan], meta: Mapping[str, Any], passes: list[dict[str, Any]],
                 requests: list[dict[str, Any]], clocks: list[dict[str, Any]],
                 slo_ms: Mapping[str, float] | None = None,
                 row_budget: bool = False) -> dict[str, dict[str, Any]]:
    """Every cell's metrics, re-taking every decision; the plan of each cell must be
    the one the row asks for now (the meta's copy is only compared, never used), except
    a time budget cut to the cell's share of a row wall budget (`row_budget`: the row
    has `[budget]`)."""
    out = {}
    for cell in meta["cells"]:
        if cell not in plans:
            raise GateError(f"cell {cell}: measured, but not a cell of this gate")
        sealed, want = meta["plans"].get(cell), json.loads(json.dumps(plan_json(plans[cell])))
        # sealed before the sample length: no min_sample_s, one pass per arm per round
        sample = not isinstance(sealed, dict) or "min_sample_s" in sealed
        if not sample:
            want.pop("min_sample_s")
        # sealed before the interleaved schedule: its k passes per arm ran blocked
        plan = plans[cell]
        if isinstance(sealed, dict) and "schedule" not in sealed:
            want.pop("schedule")
            plan = replace(plan, schedule=_timed.sealed_schedule(sealed))
        # sealed before the claim rule: its looks stopped under the narrow rule (a design
        # that is not an object is compared as it is, and differs)
        design = sealed.get("design") if isinstance(sealed, dict) else None
        if isinstance(design, dict) and "claim_rule" not in design:
            want["design"].pop("claim_rule")
            plan = replace(plan, design=replace(plan.design,
                                                claim_rule=stats.SEALED_CLAIM_RULE))
        # sealed before carried warm-ups and the no-gain rule: every warm-up round was
        # the gate's own, and it ended when the last two speeds agreed
        if isinstance(sealed, dict) and "warmup_carry" not in sealed:
            want.pop("warmup_carry")
            plan = replace(plan, warmup_carry=False)
        if isinstance(sealed, dict) and "warmup_until" not in sealed:
            want.pop("warmup_until")
            plan = replace(plan, warmup_until="agree")
        cut = _budget_cut(sealed, want) if row_budget else None
        if cut is not None:
            want["max_seconds"] = cut
            plan = replace(plan, max_seconds=cut)
        if sealed != want:
            raise GateError(f"cell {cell}: measured under another plan than the row's "
                            f"({sealed})")
        mine = [p for p in passes if p["cell"] == cell]
        try:
            out[cell] = _ab.analyse_cell(plan, meta["records"][cell], mine,
                                         [r for r in requests if r["cell"] == cell],
                                         [c for c in clocks if c["cell"] == cell], slo_ms,
                                         sample)
        except _ab.RecordError as exc:
            raise GateError(f"cell {cell}: the records do not follow the plan: {exc}") from exc
    return out


def _budget_cut(sealed: Any, want: Mapping[str, Any]) -> float | None:
    """The smaller time budget a cell ran under as its share of a row wall budget
    (sealed in its plan); None when it ran under the row's own (never a larger one)."""
    cut = sealed.get("max_seconds") if isinstance(sealed, dict) else None
    return cut if isinstance(cut, float) and 0 < cut < want["max_seconds"] else None


@dataclass(frozen=True)
class Window:
    """The timed passes' tokens against the correctness pass (the matched window)."""

    compared: int
    problems: tuple[str, ...]
    unchecked: tuple[str, ...]
    """Arms whose timed tokens had nothing to be compared with, and why."""

    @property
    def state(self) -> str:
        return "refused" if self.problems else "matched" if self.compared else "unchecked"


def timed_window(requests: list[dict[str, Any]], correct: Mapping[str, Mapping[str, Out]],
                 margin: float, unchecked: Mapping[str, str]) -> Window:
    """Every timed pass must repeat its arm's first timed pass, and that one must match
    the correctness pass of the same requests (`correct`: arm -> request id -> output;
    `unchecked`: arm -> why it has none), exactly or at a near-tie within `margin`."""
    kept, problems = _ab.timed_tokens(requests)
    compared = 0
    for arm, outputs in correct.items():
        window: dict[Hashable, Out] = {rid: Out.from_json(dict(r))
                                       for (a, rid), r in kept.items() if a == arm}
        reference: dict[Hashable, Out] = {rid: out for rid, out in outputs.items()}
        result = matched_windows(reference, window, margin)
        compared += result["compared"]
        if not result["matched"]:
            f = result["first_mismatch"] or {}
            where = (f"request {f['request']} position {f['position']}: correctness token "
                     f"{f['correctness']}, timed token {f['window']}" if "position" in f
                     else f"request {f.get('request')} has no correctness pass")
            problems.append(f"{arm}: {result['mismatched_requests']} request(s) whose timed "
                            f"tokens differ from the correctness pass; first {where}")
    return Window(compared, tuple(problems), tuple(f"{a}: {why}" for a, why in unchecked.items()))


def gate_verdict(cells: Mapping[str, Mapping[str, Any]], baseline: str,
                 underpowered_blocks: bool, window: Window | None,
                 min_effect: float | None = None) -> Derived:
    counts = {v: sum(m["verdict"] == v for m in cells.values())
              for v in ("better", "worse", "equivalent", "underpowered")}
    metrics: dict[str, Any] = {"cells": len(cells), **{f"cells_{k}": n for k, n in counts.items()},
                               "underpowered_blocks": underpowered_blocks,
                               "min_effect": min_effect}
    lows = [m["ratio_ci_low"] for m in cells.values() if m["ratio_ci_low"] is not None]
    highs = [m["ratio_ci_high"] for m in cells.values() if m["ratio_ci_high"] is not None]
    metrics.update(ratio_ci_low_min=min(lows) if lows else None,
                   ratio_ci_high_max=max(highs) if highs else None)
    if window is not None:
        metrics.update(timed_window=window.state, timed_requests_compared=window.compared,
                       timed_window_problems=len(window.problems),
                       timed_window_unchecked="; ".join(window.unchecked) or None)
    text = f"candidate/{baseline} speed ({_metric(cells)}), ratio [CI]: " + "; ".join(
        _cell_text(c, m) for c, m in cells.items())
    if window is not None and window.problems:
        return Derived(Status.FAIL, f"timed window refused: the timed passes' tokens are not "
                                    f"the correctness pass's ({window.problems[0]}); {text}",
                       metrics, {c: dict(m) for c, m in cells.items()})
    blocking = counts["worse"] + (counts["underpowered"] if underpowered_blocks else 0)
    if blocking:
        return Derived(Status.FAIL, f"{counts['worse']} cell(s) worse, {counts['underpowered']} "
                                    f"underpowered: {text}", metrics, {c: dict(m) for c, m in cells.items()})
    note = (f" ({counts['underpowered']} underpowered, not blocking per the row)"
            if counts["underpowered"] else "")
    return Derived(Status.PASS, f"equivalent or better in every decided cell{note}: {text}",
                   metrics, {c: dict(m) for c, m in cells.items()})


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
