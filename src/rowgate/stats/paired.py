"""The throughput gate's A/B statistics: paired rounds, repeated confidence intervals,
four verdicts. Pure functions over lists of floats.

The unit of replication is the **round**: one timed pass of each arm, back to
back, in an order that alternates (A B, B A, …). Each pass gives the arm's
*speed* on the gate's metric (e.g. 1 / median inter-token latency of the pass,
from its hundreds of per-step samples, or output tok/s). A round's datum is the
paired log-ratio d = ln(speed_candidate / speed_baseline). Pairing is what
cancels drift (clock, thermal, host load moving slowly cancel within a round; a
linear drift cancels exactly over the two orders of a pair of rounds), and the
round, not the request, is the unit because requests of one pass share the
batch, the clocks and the host's state: treating them as independent samples
would understate the variance (Kalibera & Jones, "Rigorous benchmarking in
reasonable time", ISMM 2013: the highest level of repetition that varies sets
the uncertainty).

Inference is the one-sample t interval of the mean of d (the interval of
`scipy.stats.ttest_1samp`, Student's t quantile from `scipy.stats.t`), exponentiated
into a CI of the candidate/baseline speed ratio (the geometric mean over rounds). The gate looks after every
`min_rounds` rounds; each look's level comes from the Lan-DeMets error-spending
recursion in `rowgate.stats.sequential`, so the intervals are repeated confidence
intervals: all looks cover the true ratio at once with probability >= 1 - alpha,
whatever made the gate stop.

Verdicts, with m = `min_effect` (ratios are candidate speed / baseline speed):

* worse: the CI lies entirely below 1 - m/2, i.e. the candidate is slower by
  more than a negligible amount (half the minimum effect), with confidence.
  This is a minimum-effect test (Murphy & Myors, J. Appl. Psych. 84:234, 1999)
  rather than a test of "no difference at all": two engine instances are never
  bit-identical in speed, and a 0.3 % difference between them is not a finding;
* better: the CI lies entirely above 1 + m/2;
* how precise a claim's CI must be is the design's `claim_rule`:
  - `narrow` (every bundle sealed before 2026-12-03): both claims also need a CI no
    wider than the equivalence band (half-width at most ~m). On a machine so noisy
    that its CI spans several minimum effects, the gate says underpowered rather than
    stake a claim on the alpha tail (simulated, it takes a heavily loaded CPU's false
    differences from ~alpha to none) -- but it also refuses a CI that lies far beyond
    the band: a 25 % speed-up measured at 7 % per-round noise is called better in 8 %
    of simulated runs, underpowered in the rest (docs/gates.md);
  - `narrow-or-clear` (the default now): as `narrow`, or a CI of any width that lies
    wholly beyond the equivalence band (above 1 + m, below 1 - m) claims too. A CI
    that covers the truth and lies wholly beyond 1 + m makes no false claim, so this
    rule's false-claim rate is bounded by the intervals' non-coverage, alpha, whatever
    the noise; what the extra margin (m, not m/2) buys back of the narrow rule's guard
    is against rounds whose tails break the t interval's coverage: on t(4) noise, A/A
    false claims stay at 0.1 % at 10 % per-round noise and 2.1 % at 30 %, against
    alpha = 5 % (tests/test_stats.py).
* equivalent: the CI lies inside [1 - m, 1 + m] (equivalence by CI inclusion,
  as in TOST; with the two-sided interval it is the conservative form): parity;
* underpowered: the budget ended before any of the three: the CI reached and
  the rounds the design would need are reported.

Under CI coverage no verdict can be wrong by more than its margin: a candidate
truly within ±m/2 is never called worse or better, one truly outside ±m never
equivalent. Once the CI's half-width (log scale) is at most `target_half_width`
(about m/4) one of the three always holds, so rounds beyond that are never needed.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

import numpy as np
from scipy import stats as _st

from rowgate.stats import sequential
from rowgate.stats.compat_v1 import (  # format-1 bundles (one median per repeat)
    RATIO_METRICS,
    ABComparison,
    ParityBound,
    compare,
    mann_whitney_p,
    median,
    ratio_ci,
    relative_spread,
    verdict,
)

__all__ = ["CLAIM_RULES", "RATIO_METRICS", "SEALED_CLAIM_RULE", "ABComparison", "ClaimRule",
           "Design", "Look", "Outcome", "ParityBound", "Verdict", "compare", "decide",
           "detectable_effect", "look", "mann_whitney_p", "median", "paired_log_ratios",
           "ratio_ci", "relative_spread", "replay", "rounds_needed", "t_interval", "verdict"]

MIN_LOOK_ROUNDS = 3
"""Fewest rounds a CI is computed from (two degrees of freedom)."""
POWER = 0.8
"""Power at which a detectable effect is quoted."""
ClaimRule = Literal["narrow", "narrow-or-clear"]
CLAIM_RULES: tuple[ClaimRule, ...] = ("narrow", "narrow-or-clear")
SEALED_CLAIM_RULE: ClaimRule = "narrow"
"""The rule of designs sealed without one (every bundle before `claim_rule` existed)."""


class Verdict(StrEnum):
    BETTER = "better"
    WORSE = "worse"
    EQUIVALENT = "equivalent"
    UNDERPOWERED = "underpowered"


@dataclass(frozen=True)
class Design:
    """A row's sequential design: looks every `min_rounds` rounds up to `max_rounds`."""

    min_effect: float
    alpha: float = 0.05
    min_rounds: int = 8
    max_rounds: int = 40
    spending: str = "pocock"
    claim_rule: ClaimRule = "narrow-or-clear"

    def __post_init__(self) -> None:
        if not 0 < self.min_effect < 1:
            raise ValueError(f"min_effect: expected 0 < min_effect < 1, got {self.min_effect}")
        if not 0 < self.alpha < 1:
            raise ValueError(f"alpha: expected 0 < alpha < 1, got {self.alpha}")
        if not MIN_LOOK_ROUNDS <= self.min_rounds <= self.max_rounds:
            raise ValueError(f"rounds: expected {MIN_LOOK_ROUNDS} <= min_rounds <= max_rounds, "
                             f"got {self.min_rounds} and {self.max_rounds}")
        if self.spending not in sequential.SPENDING:
            raise ValueError(f"spending: expected one of {', '.join(sequential.SPENDING)}, "
                             f"got {self.spending!r}")
        if self.claim_rule not in CLAIM_RULES:
            raise ValueError(f"claim_rule: expected one of {', '.join(CLAIM_RULES)}, "
                             f"got {self.claim_rule!r}")

    def planned_looks(self) -> tuple[int, ...]:
        looks = list(range(self.min_rounds, self.max_rounds + 1, self.min_rounds))
        return tuple(looks if looks[-1] == self.max_rounds else looks + [self.max_rounds])

    @property
    def negligible(self) -> tuple[float, float]:
        """Log-ratio bounds of a negligible difference (±m/2)."""
        return math.log(1 - self.min_effect / 2), math.log(1 + self.min_effect / 2)

    @property
    def band(self) -> tuple[float, float]:
        """Log-ratio bounds of equivalence (±m)."""
        return math.log(1 - self.min_effect), math.log(1 + self.min_effect)

    @property
    def target_half_width(self) -> float:
        """Log-scale half-width at which a verdict is certain (≈ m/4)."""
        (lo, hi), (nlo, nhi) = self.band, self.negligible
        return min(hi - nhi, nlo - lo) / 2

    def confidence(self, looks: Sequence[int]) -> float:
        """Nominal confidence of the last of `looks` (the spending recursion over all)."""
        return 1 - sequential.nominal_levels(tuple(looks), self.max_rounds, self.alpha,
                                             self.spending)[-1]

    def looks_for(self, rounds: int, extra: bool) -> tuple[int, ...]:
        """The looks a cell that ran `rounds` valid rounds has made: the planned ones so
        far, plus one at `rounds` when a budget (`extra`) ended it between looks."""
        made = [n for n in self.planned_looks() if n <= rounds]
        if extra and rounds >= MIN_LOOK_ROUNDS and (not made or made[-1] != rounds):
            made.append(rounds)
        return tuple(made)


@dataclass(frozen=True)
class Look:
    """One look's repeated confidence interval of the candidate/baseline speed ratio."""

    rounds: int
    confidence: float
    ratio: float
    """exp(mean d): the geometric-mean speed ratio over the rounds."""
    ci_low: float
    ci_high: float
    half_width: float
    """Log scale."""
    sd: float
    """Standard deviation of d over the rounds (log scale, ~ relative)."""
    verdict: Verdict | None
    """None: not decided at this look."""


@dataclass(frozen=True)
class Outcome:
    """A cell's sequential result: the deciding (or last) look and what it would take."""

    verdict: Verdict
    look: Look | None
    """None when the budget ended before MIN_LOOK_ROUNDS valid rounds."""
    looks: tuple[int, ...]
    rounds_needed: int | None
    """For an underpowered cell: rounds for the design's target half-width at this sd."""


def paired_log_ratios(candidate: Sequence[float], baseline: Sequence[float]) -> list[float]:
    """ln(candidate / baseline) of each round's two speeds (both positive)."""
    c, b = _array(candidate, "candidate"), _array(baseline, "baseline")
    if c.size != b.size:
        raise ValueError(f"rounds: {c.size} candidate speeds but {b.size} baseline speeds")
    if np.any(c <= 0) or np.any(b <= 0):
        raise ValueError("speeds: every value must be positive")
    # math.log per value: the same bits whether one round or forty are converted
    # (numpy's vector loops may differ in the last bit from its scalar tail)
    return [math.log(x) - math.log(y) for x, y in zip(c.tolist(), b.tolist())]


def _array(values: Sequence[float], name: str) -> np.ndarray:
    arr = np.asarray(values, dtype=float)
    if arr.ndim != 1 or not np.all(np.isfinite(arr)):
        raise ValueError(f"{name}: expected a list of finite numbers, got {values!r}")
    return arr


def decide(design: Design, low: float, high: float) -> Verdict | None:
    """The verdict a log-scale CI [low, high] supports, if any (worse / better first:
    a CI can be inside the band and still exclude the negligible zone; a claim needs a
    CI no wider than the band or, under `narrow-or-clear`, one wholly beyond it)."""
    (nlo, nhi), (blo, bhi) = design.negligible, design.band
    precise = high - low <= bhi - blo
    clear = design.claim_rule == "narrow-or-clear"
    if high < nlo and (precise or (clear and high < blo)):
        return Verdict.WORSE
    if low > nhi and (precise or (clear and low > bhi)):
        return Verdict.BETTER
    if low >= blo and high <= bhi:
        return Verdict.EQUIVALENT
    return None


@functools.lru_cache(maxsize=4096)
def _t_isf(tail: float, df: int) -> float:
    return float(_st.t.isf(tail, df))


def t_interval(d: Sequence[float] | np.ndarray, confidence: float) -> tuple[float, float]:
    """The t interval of the mean of d: what `scipy.stats.ttest_1samp(d, 0)
    .confidence_interval(confidence)` returns (a test holds them equal), written out
    with scipy's t quantile to skip that call's overhead, which dominates the
    calibration's many thousands of looks."""
    arr = np.asarray(d, dtype=float)
    mean = float(arr.mean())
    half = _t_isf((1 - confidence) / 2, arr.size - 1) * float(arr.std(ddof=1)) / math.sqrt(
        arr.size)
    return mean - half, mean + half


def look(design: Design, log_ratios: Sequence[float], looks: Sequence[int]) -> Look:
    """The CI at the last of `looks`, which must be len(log_ratios) rounds."""
    d = _array(log_ratios, "log_ratios")
    if d.size < MIN_LOOK_ROUNDS or not looks or looks[-1] != d.size:
        raise ValueError(f"look: {d.size} rounds do not make the look at {list(looks)[-1:]} "
                         f"(at least {MIN_LOOK_ROUNDS})")
    confidence = design.confidence(looks)
    low, high = t_interval(d, confidence)
    half, sd = (high - low) / 2, float(d.std(ddof=1))
    return Look(rounds=int(d.size), confidence=confidence, ratio=math.exp(float(d.mean())),
                ci_low=math.exp(low), ci_high=math.exp(high), half_width=half, sd=sd,
                verdict=decide(design, low, high))


def replay(design: Design, log_ratios: Sequence[float], *, budget_ended: bool) -> Outcome:
    """The verdict of a cell that recorded `log_ratios` (valid rounds, in order).

    The gate stops at the first look with a verdict, so no look before the last
    may have decided (ValueError: the rounds do not follow the design). Without a
    verdict the cell must have reached max_rounds, or `budget_ended` (time, or too
    many discarded rounds) — then the last rounds make one more look."""
    d = list(log_ratios)
    looks = design.looks_for(len(d), extra=budget_ended)
    results = [look(design, d[:n], looks[:i + 1]) for i, n in enumerate(looks)]
    early = next((r for r in results[:-1] if r.verdict is not None), None)
    if early is not None:
        raise ValueError(f"the design decides {early.verdict} at {early.rounds} rounds, yet "
                         f"{len(d)} rounds were recorded")
    last = results[-1] if results else None
    if last is not None and last.verdict is not None:
        if len(d) != last.rounds:
            raise ValueError(f"decided at {last.rounds} rounds, yet {len(d)} were recorded")
        return Outcome(last.verdict, last, looks, None)
    if not budget_ended and len(d) != design.max_rounds:
        raise ValueError(f"{len(d)} rounds without a verdict: the design runs to "
                         f"{design.max_rounds} unless a budget ends it")
    needed = rounds_needed(design, last.sd) if last is not None else None
    return Outcome(Verdict.UNDERPOWERED, last, looks, needed)


def _final_level(design: Design) -> float:
    """Nominal two-sided level of the design's last planned look."""
    return sequential.nominal_levels(design.planned_looks(), design.max_rounds, design.alpha,
                                     design.spending)[-1]


def _final_quantile(design: Design, rounds: int) -> float:
    """t quantile of the last look were the budget `rounds` with the same number of
    looks, spaced alike (the same information fractions, so the same level)."""
    return _t_isf(_final_level(design) / 2, rounds - 1)


def rounds_needed(design: Design, sd: float, limit: int = 100_000) -> int:
    """Rounds at which the last look's half-width would reach the target at this sd,
    were the budget that large with the same number of looks, spaced alike (a
    planning figure: the last look's nominal level barely depends on the budget)."""
    if sd <= 0:
        return design.min_rounds

    def short(n: int) -> bool:
        return _final_quantile(design, n) * sd / math.sqrt(n) > design.target_half_width

    lo, hi = MIN_LOOK_ROUNDS, MIN_LOOK_ROUNDS
    while hi < limit and short(hi):
        lo, hi = hi, hi * 2
    if short(hi):
        return limit
    while lo < hi:  # smallest n that is not short
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if short(mid) else (lo, mid)
    return max(hi, design.min_rounds)


def detectable_effect(design: Design, sd: float, rounds: int, power: float = POWER) -> float:
    """Smallest slowdown (fraction) called worse with probability `power` at the last
    look of the design were its budget `rounds` (looks spaced alike), at per-round
    log-ratio sd `sd`: the negligible margin plus (q + z_power) standard errors. It
    never goes below m/2: smaller differences are negligible by design."""
    if rounds < MIN_LOOK_ROUNDS:
        raise ValueError(f"rounds: a look needs at least {MIN_LOOK_ROUNDS}, got {rounds}")
    shift = -design.negligible[0] + (_final_quantile(design, rounds)
                                     + float(_st.norm.ppf(power))) * sd / math.sqrt(rounds)
    return 1 - math.exp(-shift)
