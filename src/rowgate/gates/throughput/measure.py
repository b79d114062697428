"""The timed rounds of one throughput cell: warm-up until stable, interleaved rounds
of k passes per arm (the sample length, `sample_passes`), clocks around every pass,
a look every `min_rounds` valid rounds, stop at a verdict or at the budget.
Everything is written raw as it happens (`Sink`); the decisions taken here are the
ones `_ab.analyse_cell` re-takes from those records.

The loop is engine-agnostic: it drives anything implementing `Engine.generate`,
so the calibration benchmark runs this very code on engines it loaded once.
Decisions are taken from the values written (times relative to the cell's start,
as floats that round-trip through CSV/JSON exactly), never from fresh readings,
so a re-derivation reaches the same stop at the same round.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any, cast

import rowgate.gates.arms as _arms
from rowgate.engines.interface import Engine, PassResult, WorkloadPass
from rowgate.gates.engine_pool import EarlierPass, PassJournal
from rowgate.gates.interface import GateError, Progress
from rowgate.stats import latency, noise
from rowgate.stats import paired as stats

ROLES = ("baseline", "candidate")
PASS_FIELDS = ["cell", "phase", "round", "arm", "pass", "start_s", "end_s", "wall_s",
               "output_tokens", "requests", "carried_from"]
"""`carried_from`: the earlier gate that ran the pass (warm-up round 0 only: `carry`),
empty for the gate's own passes."""
CLOCK_FIELDS = ["cell", "phase", "round", "arm", "when", "t", "sm_clock_mhz",
                "mem_clock_mhz", "temperature_c"]
MAX_SAMPLE_PASSES = 16
"""The most passes per arm per round (a 1 ms pass still makes 16 ms samples; the round
budget stays a budget of rounds, not of thousands of passes)."""
STOPS = ("decided", "rounds", "time", "discards")
"""Why a cell stopped: a verdict at a look; max_rounds valid rounds; the time budget
(`max_seconds`, warm-up included); more than `max_discarded` rounds discarded."""


@dataclass(frozen=True)
class Plan:
    """What a cell's rounds follow (from the row's gate spec)."""

    design: stats.Design
    metric: str
    order: str = "alternating"
    seed: int = 0
    warmup: int = 1
    max_warmup: int = 6
    warmup_tolerance: float = 0.05
    clock_tolerance: float = 0.02
    max_seconds: float = 600.0
    max_discarded: int = 8
    warmup_until: str = "no-gain"
    """The warm-up's end (`noise.settled`): `no-gain`, no arm still getting faster by more
    than the tolerance; `agree` (plans sealed before it), the last two speeds agreeing."""
    warmup_carry: bool = True
    """The warm-up starts from the engines' latest pass of this cell in an earlier gate of
    the row run, as its round 0, when both arms have one (`_Cell._carry`)."""
    min_sample_s: float = 0.1
    """Each arm's sample in a timed round spans passes lasting at least this long
    (`sample_passes`)."""
    schedule: str = "interleaved"
    """How a timed round's 2k passes are ordered (`pass_order`): `interleaved` (pairs
    A B, B A, …) or `blocked` (k of one arm, then k of the other: bundles sealed before
    the interleaved schedule)."""

    @property
    def sample_statistic(self) -> str:
        """How an arm's k passes of a round make its sample (`latency.sample_speed`)."""
        return latency.schedule_statistic(self.schedule)


def round_order(order: str, k: int, seed: int) -> tuple[str, str]:
    """The arm order of timed round k: alternating flips every round (A B, B A: a
    linear drift cancels over each pair); random flips a coin derived from
    (seed, k), so the schedule is the same on every run and machine."""
    if order == "random":
        flip = hashlib.sha256(f"{seed}/{k}".encode()).digest()[0] & 1
    else:
        flip = k % 2
    return (ROLES[1], ROLES[0]) if flip else ROLES


SCHEDULES = ("interleaved", "blocked")


def sealed_schedule(sealed_plan: Mapping[str, Any]) -> str:
    """The schedule a cell's sealed plan ran: its `schedule`, or `blocked` for a plan
    sealed before the key existed (the k passes per arm then ran back to back)."""
    return str(sealed_plan.get("schedule", "blocked"))


def pass_order(order: tuple[str, str], n: int, schedule: str) -> list[tuple[str, int]]:
    """(arm, its pass index) of a timed round's 2n passes, in run order. `interleaved`
    runs the arms' passes in pairs, each pair the reverse of the last (A B, B A, A B …:
    an ABBA design inside the round). Measured on the H200's host (docs/perf.md, issue
    17): a host-bound step switches between a fast and a ~25 % slower host state that
    lasts from one pass to seconds; blocked samples (A A A A A, B B B B B) put a switch
    inside one arm's sample and lift the per-round spread of the paired ratio to 4 %,
    interleaved samples see each state on both arms (1.5 % on the same recorded passes).
    `blocked`: n passes of the first arm, then n of the second."""
    if schedule == "blocked":
        return [(arm, i) for arm in order for i in range(n)]
    if schedule != "interleaved":
        raise ValueError(f"schedule {schedule!r}: expected one of {', '.join(SCHEDULES)}")
    return [(arm, i) for i in range(n) for arm in (order if i % 2 == 0 else order[::-1])]


def warmup_order(w: int) -> tuple[str, str]:
    return (ROLES[1], ROLES[0]) if w % 2 else ROLES


def sample_passes(min_sample_s: float, last_warmup_walls: Sequence[float]) -> int:
    """k, the passes per arm in every timed round: the fewest whose summed
    wall time reaches `min_sample_s`, judged by the last (settled) warm-up round's passes
    (the faster arm's, so both arms' samples last that long), at most
    MAX_SAMPLE_PASSES; 1 without warm-up passes or with `min_sample_s` 0.

    pyperf does the same for the same reason: it calibrates the loops of a benchmark so
    that each value lasts at least `--min-time`, 100 ms by default (pyperf docs, "Runner
    CLI", https://pyperf.readthedocs.io/en/latest/runner.html): shorter values are
    dominated by the timer's and the scheduler's noise. Here a 20 ms pass of a host-bound engine
    slowed as a whole by the host (a preemption, a frequency step) moves one round's
    ratio by several percent; k passes together dilute such a pass k-fold (the sample's
    speed: `Plan.sample_statistic`)."""
    walls = [w for w in last_warmup_walls if w > 0]
    if min_sample_s <= 0 or not last_warmup_walls:
        return 1
    if len(walls) < len(last_warmup_walls):
        return MAX_SAMPLE_PASSES
    return max(1, min(MAX_SAMPLE_PASSES, math.ceil(min_sample_s / min(walls))))


def tokens_digest(ids: Sequence[int]) -> str:
    return hashlib.sha256(json.dumps(list(ids)).encode()).hexdigest()


class Sink:
    """The raw artifacts of the gate, appended pass by pass."""

    def __init__(self, passes: IO[str], requests: IO[str], clocks: IO[str] | None):
        self._passes = csv.DictWriter(passes, PASS_FIELDS)
        self._passes.writeheader()
        self._clocks = csv.DictWriter(clocks, CLOCK_FIELDS) if clocks else None
        if self._clocks:
            self._clocks.writeheader()
        self._requests = requests
        self._first: dict[tuple[str, str, str], str] = {}
        self._kept: set[tuple[str, str, str]] = set()

    def request_rows(self, cell: str, phase: str, k: int, arm: str,
                     result: PassResult, index: int = 0) -> list[dict[str, Any]]:
        """Per-request records of a pass; token ids kept for the first timed pass of
        each request and arm, and again wherever they differ from it (a digest always)."""
        rows = []
        for o in result.outputs:
            row: dict[str, Any] = {"cell": cell, "phase": phase, "round": k, "arm": arm,
                                   "pass": index, "id": o.id,
                   "output_tokens": len(o.token_ids), "ttft_s": o.ttft_s,
                   "latency_s": o.latency_s, "itl_s": list(o.itl_s),
                   "tokens_sha256": tokens_digest(o.token_ids)}
            key = (cell, arm, o.id)
            if phase == "timed":
                first = self._first.setdefault(key, row["tokens_sha256"])
                if key not in self._kept or first != row["tokens_sha256"]:
                    self._kept.add(key)
                    row.update(token_ids=list(o.token_ids), logprobs=list(o.logprobs),
                               alternatives=[[list(a) for a in alt] for alt in o.alternatives])
            rows.append(row)
        return rows

    def write(self, pass_row: dict[str, Any], request_rows: list[dict[str, Any]]) -> None:
        self._passes.writerow({k: repr(v) if isinstance(v, float) else v
                               for k, v in pass_row.items()})
        for row in request_rows:
            self._requests.write(json.dumps(row) + "\n")

    def clock(self, row: dict[str, Any]) -> None:
        if self._clocks:
            self._clocks.writerow({k: repr(v) if isinstance(v, float) else v
                                   for k, v in row.items()})


ClockFn = Callable[[], Any]
"""Returns a sample with t, sm_clock_mhz, mem_clock_mhz, temperature_c (device.ClockSample)."""


class _Cell:
    """One cell's run; `run()` returns the cell's record for meta.json."""

    def __init__(self, engines: Mapping[str, Engine], work: WorkloadPass, plan: Plan,
                 sink: Sink, clocks: ClockFn | None, progress: Progress,
                 now: Callable[[], float], journal: PassJournal | None = None):
        self.engines, self.work, self.plan, self.sink = engines, work, plan, sink
        self.clocks, self.progress, self.now = clocks, progress, now
        self.journal = journal
        self.t0 = now()
        self.n = 1
        """Passes per arm per timed round, fixed after the warm-up (`sample_passes`)."""

    def _clock(self, phase: str, k: int, arm: str, when: str) -> dict[str, Any] | None:
        if self.clocks is None:
            return None
        s = self.clocks()
        row = {"cell": self.work.cell, "phase": phase, "round": k, "arm": arm, "when": when,
               "t": float(s.t), "sm_clock_mhz": int(s.sm_clock_mhz),
               "mem_clock_mhz": int(s.mem_clock_mhz), "temperature_c": int(s.temperature_c)}
        self.sink.clock(row)
        return row

    def _pass(self, phase: str, k: int, arm: str, index: int = 0
              ) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
        """One pass of `arm` (the `index`th of its sample): (pass row, request rows,
        clock rows)."""
        seen = [c for c in [self._clock(phase, k, arm, "before")] if c]
        start = self.now()
        result = cast(PassResult, _arms.generate(self.engines[arm], arm, self.work))
        end = self.now()
        seen += [c for c in [self._clock(phase, k, arm, "after")] if c]
        if self.journal is not None:
            self.journal.note(self.engines[arm], self.work, start, end, result)
        row, requests = self._write(phase, k, arm, index, EarlierPass("", start, end, result))
        return row, requests, seen

    def _write(self, phase: str, k: int, arm: str, index: int, ran: EarlierPass
               ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """A pass's row and request rows, written (`ran.gate`: the earlier gate that ran
        it, empty for this gate's own)."""
        result = ran.result
        row = {"cell": self.work.cell, "phase": phase, "round": k, "arm": arm, "pass": index,
               "start_s": ran.start - self.t0, "end_s": ran.end - self.t0,
               "wall_s": float(result.wall_s), "output_tokens": result.output_tokens,
               "requests": len(result.outputs), "carried_from": ran.gate}
        requests = self.sink.request_rows(self.work.cell, phase, k, arm, result, index)
        self.sink.write(row, requests)
        return row, requests

    def _carry(self, warm: dict[str, list[float]]) -> int:
        """Warm-up round 0 from the engines' latest pass of this cell in an earlier gate
        of the row run (`Plan.warmup_carry`; the tokens gate ran every cell on the oracle
        and the candidate), written as it ran with that gate's name: an engine that has
        run the cell's very requests is past its first pass of them, so the warm-up rule
        compares the cell's first own round with that pass instead of paying for another.
        The rule is unchanged: it still needs two rounds' speeds to end. 1 when carried
        (its speeds appended to `warm`, k judged by its walls), else 0."""
        if not (self.plan.warmup_carry and self.plan.warmup > 0 and self.journal):
            return 0
        found = {arm: self.journal.earlier(self.engines[arm], self.work) for arm in ROLES}
        ran = {arm: f for arm, f in found.items() if f is not None}
        if len(ran) < len(ROLES):
            return 0
        for arm in warmup_order(0):
            row, requests = self._write("warmup", 0, arm, 0, ran[arm])
            warm[arm].append(self._speed(arm, [row], requests))
        self.n = sample_passes(self.plan.min_sample_s, [ran[a].result.wall_s for a in ROLES])
        return 1

    def _speed(self, arm: str, rows: list[dict[str, Any]],
               requests: list[dict[str, Any]]) -> float:
        """The arm's sample: its passes of the round (`Plan.sample_statistic`)."""
        try:
            return latency.sample_speed(self.plan.metric, requests,
                                        [float(r["wall_s"]) for r in rows],
                                        [int(r["output_tokens"]) for r in rows],
                                        self.plan.sample_statistic)
        except latency.LatencyError as exc:
            raise GateError(f"cell {self.work.cell}, {arm} arm: {exc}") from exc

    def _round(self, phase: str, k: int, order: tuple[str, str], n: int = 1
               ) -> tuple[dict[str, float], list[dict[str, Any]], float, dict[str, float]]:
        """The round's passes in `pass_order`: (speed per arm, clock rows, projected end
        of a next round, last pass's wall per arm)."""
        rows: dict[str, list[dict[str, Any]]] = {arm: [] for arm in order}
        reqs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in order}
        seen: list[dict[str, Any]] = []
        runs = []
        for arm, i in pass_order(order, n, self.plan.schedule):
            row, requests, clocks = self._pass(phase, k, arm, i)
            rows[arm].append(row)
            reqs[arm] += requests
            seen += clocks
            runs.append(row)
        return ({arm: self._speed(arm, rows[arm], reqs[arm]) for arm in order}, seen,
                runs[-1]["end_s"] + (runs[-1]["end_s"] - runs[0]["start_s"]),
                {arm: float(rows[arm][-1]["wall_s"]) for arm in order})

    def _out_of_time(self, projected_end: float) -> bool:
        return projected_end > self.plan.max_seconds

    def run(self) -> dict[str, Any]:
        p, cell = self.plan, self.work.cell
        warm: dict[str, list[float]] = {arm: [] for arm in ROLES}
        w = self._carry(warm)
        projected = 0.0  # a carried round took none of this cell's time

        def done() -> bool:
            return noise.warmup_done(warm, p.warmup, p.max_warmup, p.warmup_tolerance,
                                     p.warmup_until)

        while p.warmup > 0 and not done():  # warmup = 0: the row asks for none at all
            self.progress.update(f"throughput {cell}: warm-up {w + 1}")
            speeds, _, projected, walls = self._round("warmup", w, warmup_order(w))
            for arm, v in speeds.items():
                warm[arm].append(v)
            w += 1
            self.n = sample_passes(p.min_sample_s, [walls[arm] for arm in ROLES])
            if not done() and self._out_of_time(projected):
                return self._record("time", w, 0, 0)
        if self._out_of_time(projected):
            return self._record("time", w, 0, 0)
        got: dict[str, list[float]] = {arm: [] for arm in ROLES}
        d: list[float] = []
        k = discarded = 0
        looks = p.design.planned_looks()
        while True:
            self.progress.update(f"throughput {cell}: round {k + 1} ({len(d)} valid, looks "
                                 f"at {', '.join(map(str, looks))})")
            speeds, clocks, projected, _ = self._round("timed", k,
                                                       round_order(p.order, k, p.seed), self.n)
            k += 1
            if clocks and noise.clock_move(clocks, p.clock_tolerance):
                discarded += 1
                if discarded > p.max_discarded:
                    return self._record("discards", w, k, discarded)
            else:
                for arm in ROLES:
                    got[arm].append(speeds[arm])
                d = stats.paired_log_ratios(got["candidate"], got["baseline"])
                if len(d) in looks and stats.look(p.design, d, p.design.looks_for(
                        len(d), extra=False)).verdict is not None:
                    return self._record("decided", w, k, discarded)
                if len(d) == p.design.max_rounds:
                    return self._record("rounds", w, k, discarded)
            if self._out_of_time(projected):
                return self._record("time", w, k, discarded)

    def _record(self, stop: str, warmup: int, rounds: int, discarded: int) -> dict[str, Any]:
        return {"stop": stop, "warmup_rounds": warmup, "rounds": rounds,
                "discarded": discarded, "passes_per_sample": self.n,
                "elapsed_s": round(self.now() - self.t0, 6)}


def run_cell(engines: Mapping[str, Engine], work: WorkloadPass, plan: Plan, sink: Sink,
             progress: Progress, clocks: ClockFn | None = None,
             now: Callable[[], float] = time.monotonic,
             journal: PassJournal | None = None) -> dict[str, Any]:
    """Run one cell's warm-up and timed rounds on started engines ({'baseline',
    'candidate'}); return its record (stop reason, round counts, elapsed time).
    `journal`: the row run's engine pool, for earlier gates' passes of the cell and for
    later gates to find this one's."""
    return _Cell(engines, work, plan, sink, clocks, progress, now, journal).run()
