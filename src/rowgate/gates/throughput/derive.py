"""One throughput cell re-derived from its raw records: the warm-up, the sample length
(k passes per arm per round), the discarded rounds, the looks and the stop are re-taken
exactly as `_timed` took them (a record
that does not follow the design is an error, not a verdict), then the verdict, the
CI reached, what more rounds would need, the vLLM-bench metrics of both arms and the
clocks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from rowgate.gates.throughput.measure import (
    ROLES,
    Plan,
    pass_order,
    round_order,
    sample_passes,
    tokens_digest,
    warmup_order,
)
from rowgate.stats import latency, noise
from rowgate.stats import paired as stats


class RecordError(ValueError):
    """The raw records do not follow the design (or are incomplete)."""


Round = dict[str, list[Mapping[str, Any]]]
"""One round's passes per arm, in run order."""


def _rounds(passes: Sequence[Mapping[str, Any]], phase: str, count: int,
            order: Callable[[int], tuple[str, str]], n: int = 1,
            schedule: str = "blocked") -> list[Round]:
    """{arm: its n pass rows} per round 0..count-1 of `phase`, checking the passes ran
    in `pass_order` (passes.csv sealed before the sample length has no `pass` column:
    one pass each)."""
    mine = [p for p in passes if p["phase"] == phase]
    out = []
    for k in range(count):
        rows = [p for p in mine if int(p["round"]) == k]
        want = pass_order(order(k), n, schedule)
        got = [(p["arm"], int(p.get("pass") or 0)) for p in rows]
        if got != want:
            raise RecordError(f"{phase} round {k}: passes {got}, the schedule says {want}")
        out.append({arm: [p for p in rows if p["arm"] == arm] for arm in ROLES})
    if len(mine) != 2 * n * count:
        raise RecordError(f"{len(mine)} {phase} passes recorded for {count} rounds of "
                          f"{n} pass(es) per arm")
    return out


class _Cell:
    def __init__(self, plan: Plan, record: Mapping[str, Any], passes: Sequence[Mapping[str, Any]],
                 requests: Sequence[Mapping[str, Any]], clocks: Sequence[Mapping[str, Any]],
                 sealed_sample: bool = True):
        self.plan, self.record = plan, record
        self.requests: dict[tuple[str, int, str], list[Mapping[str, Any]]] = {}
        for r in requests:
            self.requests.setdefault((r["phase"], int(r["round"]), r["arm"]), []).append(r)
        self.clocks: dict[tuple[str, int], list[Mapping[str, Any]]] = {}
        for c in clocks:
            self.clocks.setdefault((c["phase"], int(c["round"])), []).append(c)
        self.warm = _rounds(passes, "warmup", int(record["warmup_rounds"]), warmup_order)
        self.check_carried(passes)
        self.n = self.sample_length(sealed_sample)
        self.timed = _rounds(passes, "timed", int(record["rounds"]),
                             lambda k: round_order(plan.order, k, plan.seed), self.n,
                             plan.schedule)

    def sample_length(self, sealed: bool) -> int:
        """k re-derived from the last warm-up round's walls; it must be the record's.
        Bundles sealed before the sample length (`sealed` False: their plan has no
        `min_sample_s`) ran one pass per arm per round."""
        if not sealed:
            return 1
        walls = [float(p["wall_s"]) for arm in ROLES for p in self.warm[-1][arm]] \
            if self.warm else []
        want = sample_passes(self.plan.min_sample_s, walls)
        got = self.record.get("passes_per_sample")
        if got != want:
            raise RecordError(f"passes per sample: {got} recorded, the warm-up's walls "
                              f"{walls} give {want} (min_sample_s {self.plan.min_sample_s})")
        return want

    def check_carried(self, passes: Sequence[Mapping[str, Any]]) -> None:
        """Passes an earlier gate ran (`carried_from`) may only make up warm-up round 0,
        both of its arms, under a plan that carries (`Plan.warmup_carry`)."""
        carried = [p for p in passes if p.get("carried_from")]
        if not carried:
            return
        if not self.plan.warmup_carry:
            raise RecordError("a warm-up round carried from an earlier gate; the plan "
                              "carries none (warmup_carry = false)")
        round0 = [p for ps in (self.warm[0].values() if self.warm else []) for p in ps]
        if sorted(map(id, carried)) != sorted(map(id, round0)):
            raise RecordError("passes carried from an earlier gate are not exactly warm-up "
                              "round 0")

    def reqs(self, phase: str, k: int, arm: str) -> list[Mapping[str, Any]]:
        return self.requests.get((phase, k, arm), [])

    def speed(self, phase: str, k: int, arm: str, metric: str | None = None) -> float:
        rows = (self.warm if phase == "warmup" else self.timed)[k][arm]
        try:
            return latency.sample_speed(metric or self.plan.metric, self.reqs(phase, k, arm),
                                        [float(p["wall_s"]) for p in rows],
                                        [int(p["output_tokens"]) for p in rows],
                                        self.plan.sample_statistic)
        except latency.LatencyError as exc:
            raise RecordError(f"{phase} round {k}, {arm}: {exc}") from exc

    @staticmethod
    def projected(rnd: Round) -> float:
        """When a next round would end; -inf for a carried round (it took none of the
        cell's time, as `_Cell._carry` counts it)."""
        rows = sorted((p for ps in rnd.values() for p in ps), key=lambda p: float(p["start_s"]))
        if all(p.get("carried_from") for p in rows):
            return -math.inf
        end = float(rows[-1]["end_s"])
        return end + (end - float(rows[0]["start_s"]))  # as _timed computes it

    def check_warmup(self) -> bool:
        """Re-take the warm-up decision; True when it settled (not cut by max_warmup)."""
        p, n = self.plan, len(self.warm)
        if p.warmup == 0:
            if n:
                raise RecordError(f"warm-up: {n} rounds recorded, the plan asks for none")
            return True
        speeds: dict[str, list[float]] = {arm: [] for arm in ROLES}
        for w in range(n):
            for arm in ROLES:
                speeds[arm].append(self.speed("warmup", w, arm))
            done = noise.warmup_done(speeds, p.warmup, p.max_warmup, p.warmup_tolerance,
                                     p.warmup_until)
            last = w == n - 1
            if done != last and not (last and self.record["stop"] == "time"):
                raise RecordError(f"warm-up: {n} rounds recorded, the rule ends it after {w + 1}")
            if not last and self.projected(self.warm[w]) > p.max_seconds:
                raise RecordError(f"warm-up round {w} ran past the time budget, yet went on")
        return noise.settled(speeds, p.warmup_tolerance, p.warmup_until)

    def valid_rounds(self) -> tuple[list[int], list[str]]:
        valid, discards = [], []
        for k in range(len(self.timed)):
            why = noise.clock_move(self.clocks.get(("timed", k), []), self.plan.clock_tolerance)
            if why:
                discards.append(f"round {k}: {why}")
            else:
                valid.append(k)
        return valid, discards

    def check_stop(self, discards: list[str]) -> bool:
        """The recorded stop against the data; True when a budget ended the cell."""
        p, stop = self.plan, self.record["stop"]
        rounds = list(self.warm) + list(self.timed)
        over = [i for i, r in enumerate(rounds) if self.projected(r) > p.max_seconds]
        if stop == "time":
            if not over or over[0] != len(rounds) - 1:
                raise RecordError("stop 'time': the budget was not reached at the last round "
                                  "only")
        elif over and over[0] < len(rounds) - 1:
            raise RecordError(f"round {over[0]} ran past the time budget, yet rounds went on")
        if stop == "discards" and len(discards) != p.max_discarded + 1:
            raise RecordError(f"stop 'discards' after {len(discards)} discarded rounds "
                              f"(max_discarded {p.max_discarded})")
        if stop not in ("time", "discards", "decided", "rounds"):
            raise RecordError(f"unknown stop {stop!r}")
        return stop in ("time", "discards")

    def paired(self, valid: list[int], metric: str | None = None,
               invert: bool = False) -> list[float]:
        c = [self.speed("timed", k, "candidate", metric) for k in valid]
        b = [self.speed("timed", k, "baseline", metric) for k in valid]
        d = stats.paired_log_ratios(c, b)
        return [-x for x in d] if invert else d


def _r(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else round(x, 9)


def _secondary(cell: _Cell, valid: list[int], confidence: float) -> dict[str, Any]:
    """candidate/baseline ratio of every metric's per-pass value (latency: its median,
    lower is better; output tok/s: higher is better), paired over the same rounds, with
    its CI at the deciding look's confidence. Informational: the verdict is on `metric`."""
    out: dict[str, Any] = {}
    if len(valid) < stats.MIN_LOOK_ROUNDS:
        return out
    for m in latency.METRICS:
        try:
            # speeds are 1 / median latency: the latency ratio is the inverse
            d = cell.paired(valid, m, invert=m in latency.LATENCIES)
        except RecordError:
            continue  # e.g. no TTFT: the arm did not stream
        low, high = stats.t_interval(d, confidence)
        out.update({f"{m}_ratio": _r(math.exp(float(np.mean(d)))),
                    f"{m}_ratio_ci_low": _r(math.exp(low)), f"{m}_ratio_ci_high": _r(math.exp(high))})
    return out


def _bench(cell: _Cell, valid: list[int], slo_ms: Mapping[str, float]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for arm in ROLES:
        reqs = [r for k in valid for r in cell.reqs("timed", k, arm)]
        wall = sum(float(p["wall_s"]) for k in valid for p in cell.timed[k][arm])
        if reqs and wall > 0:
            out.update({f"{arm}_{k}": _r(v) if isinstance(v, float) else v
                        for k, v in latency.bench_metrics(reqs, wall, slo_ms or None).items()})
    return out


def _clock_metrics(clocks: list[Mapping[str, Any]]) -> dict[str, Any]:
    if not clocks:
        return {}
    sm = [int(c["sm_clock_mhz"]) for c in clocks]
    mem = [int(c["mem_clock_mhz"]) for c in clocks]
    return {"sm_clock_min_mhz": min(sm), "sm_clock_max_mhz": max(sm),
            "sm_clock_spread": round((max(sm) - min(sm)) / max(sm), 6) if max(sm) else 0.0,
            "mem_clock_min_mhz": min(mem), "mem_clock_max_mhz": max(mem),
            "temperature_max_c": max(int(c["temperature_c"]) for c in clocks)}


def timed_tokens(requests: Sequence[Mapping[str, Any]]
                 ) -> tuple[dict[tuple[str, str], Mapping[str, Any]], list[str]]:
    """Per (arm, request id) the record of its first timed pass (token ids, logprobs,
    alternatives), and the requests whose timed passes disagree among themselves or
    whose kept ids do not match their digest."""
    kept: dict[tuple[str, str], Mapping[str, Any]] = {}
    digests: dict[tuple[str, str], set[str]] = {}
    bad: list[str] = []
    for r in sorted((r for r in requests if r["phase"] == "timed"), key=lambda r: int(r["round"])):
        key = (r["arm"], r["id"])
        digests.setdefault(key, set()).add(r["tokens_sha256"])
        if "token_ids" in r:
            if tokens_digest(r["token_ids"]) != r["tokens_sha256"]:
                bad.append(f"{r['arm']} {r['id']} round {r['round']}: token ids do not match "
                           f"their digest")
            kept.setdefault(key, r)
    for key, seen in digests.items():
        if key not in kept:
            bad.append(f"{key[0]} {key[1]}: no token ids kept")
        elif len(seen) > 1:
            bad.append(f"{key[0]} {key[1]}: the timed rounds produced {len(seen)} different "
                       f"token sequences")
    return kept, bad


def analyse_cell(plan: Plan, record: Mapping[str, Any], passes: Sequence[Mapping[str, Any]],
                 requests: Sequence[Mapping[str, Any]], clocks: Sequence[Mapping[str, Any]],
                 slo_ms: Mapping[str, float] | None = None,
                 sealed_sample: bool = True) -> dict[str, Any]:
    """Every metric of one cell (`record`: its entry in meta.json; `sealed_sample`
    False for a bundle sealed before the sample length). RecordError when the records
    do not follow the plan."""
    cell = _Cell(plan, record, passes, requests, clocks, sealed_sample)
    settled = cell.check_warmup()
    valid, discards = cell.valid_rounds()
    budget = cell.check_stop(discards)
    d = cell.paired(valid)
    try:
        outcome = stats.replay(plan.design, d, budget_ended=budget)
    except ValueError as exc:
        raise RecordError(str(exc)) from exc
    undecided = outcome.verdict is stats.Verdict.UNDERPOWERED
    # a planned look that decides stops the cell ("decided"); a budget's last look
    # (time, discards) may decide or not
    if (record["stop"] == "decided" and undecided) or (record["stop"] == "rounds"
                                                        and not undecided):
        raise RecordError(f"stop {record['stop']!r} but the design's verdict is "
                          f"{outcome.verdict.value}")
    lk = outcome.look
    speeds = {arm: [cell.speed("timed", k, arm) for k in valid] for arm in ROLES}
    warnings = [w for w in [noise.spread_warning(d, speeds, plan.design.min_effect)] if w]
    if not settled:
        warnings.append(f"warm-up did not settle within {plan.max_warmup} rounds")
    if discards:
        warnings.append(f"{len(discards)} round(s) discarded: " + "; ".join(discards))
    m: dict[str, Any] = {
        "verdict": outcome.verdict.value, "metric": plan.metric, "stop": record["stop"],
        "rounds": len(valid), "rounds_run": len(cell.timed), "rounds_discarded": len(discards),
        "warmup_rounds": len(cell.warm), "warmup_settled": settled,
        "passes_per_sample": cell.n,
        "looks": ",".join(map(str, outcome.looks)), "elapsed_s": record.get("elapsed_s"),
        "ratio": _r(lk.ratio) if lk else None, "ratio_ci_low": _r(lk.ci_low) if lk else None,
        "ratio_ci_high": _r(lk.ci_high) if lk else None,
        "confidence": _r(lk.confidence) if lk else None,
        "half_width": _r(lk.half_width) if lk else None,
        "target_half_width": _r(plan.design.target_half_width),
        "sd_log_ratio": _r(lk.sd) if lk else None, "rounds_needed": outcome.rounds_needed,
        "detectable_effect": _r(stats.detectable_effect(plan.design, lk.sd,
                                                        plan.design.max_rounds)) if lk else None,
        "warning": " | ".join(warnings) or None}
    if lk:
        m.update(_secondary(cell, valid, lk.confidence))
    m.update(_bench(cell, valid, slo_ms or {}))
    m.update(_clock_metrics([c for k in valid for c in cell.clocks.get(("timed", k), [])]))
    return m
