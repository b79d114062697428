"""Format-1 throughput statistics (bundles sealed before the paired sequential design):
one median per repeat and arm. Kept so such bundles still re-derive; `rowgate.stats.paired`
holds the statistics new bundles use.

One cell of a throughput matrix gives two samples, one value per repeat per arm
(e.g. output tok/s). `compare` summarises them the way the gate and the review
need: medians, relative spread (IQR / median), a bootstrap 95 % CI of the
candidate/oracle ratio of medians, and a two-sided Mann-Whitney U p-value — the
unpaired comparison of `rowgate.stats.unpaired` (which says why unpaired, and why the
percentile bootstrap, seeded), under this format's metric names. `verdict` turns
that into parity / better / worse / inconclusive, the row's parity bounds included.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

import numpy as np

from rowgate.stats import unpaired
from rowgate.stats.unpaired import DEFAULT_SEED, median, relative_spread

__all__ = ["DEFAULT_SEED", "RATIO_METRICS", "ABComparison", "ParityBound", "Verdict",
           "compare", "mann_whitney_p", "median", "ratio_ci", "relative_spread", "verdict"]

RATIO_METRICS = ("ratio_median", "ratio_ci_low", "ratio_ci_high")
"""Per-cell metrics a parity criterion may be written against."""
NAMES = ("candidate", "oracle")


class Verdict(StrEnum):
    PARITY = "parity"
    """No difference larger than the minimum effect, or one the row tolerates."""
    BETTER = "better"
    """The candidate is significantly better by more than the minimum effect."""
    WORSE = "worse"
    """The candidate is significantly worse, beyond what the row tolerates."""
    INCONCLUSIVE = "inconclusive"
    """No significant difference, but the CI is too wide to claim parity."""


@dataclass(frozen=True)
class ABComparison:
    """Summary of candidate vs oracle samples of one metric in one cell."""

    n_candidate: int
    n_oracle: int
    median_candidate: float
    median_oracle: float
    spread_candidate: float
    """IQR / median of the candidate's samples."""
    spread_oracle: float
    ratio_median: float
    """median(candidate) / median(oracle)."""
    ratio_ci_low: float
    ratio_ci_high: float
    confidence: float
    p_value: float
    """Two-sided Mann-Whitney U."""

    def metrics(self) -> dict[str, float | int]:
        return {k: (round(v, 9) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def mann_whitney_p(candidate: Sequence[float] | np.ndarray,
                   oracle: Sequence[float] | np.ndarray) -> float:
    """Two-sided Mann-Whitney U p-value (scipy picks exact or asymptotic)."""
    return unpaired.mann_whitney_p(candidate, oracle, NAMES)


def ratio_ci(candidate: Sequence[float] | np.ndarray, oracle: Sequence[float] | np.ndarray, *,
             confidence: float = 0.95,
             n_resamples: int = 10000, seed: int = DEFAULT_SEED) -> tuple[float, float]:
    """Bootstrap CI of median(candidate) / median(oracle); independent resampling."""
    return unpaired.ratio_ci(candidate, oracle, confidence=confidence,
                             n_resamples=n_resamples, seed=seed, names=NAMES)


def compare(candidate: Sequence[float], oracle: Sequence[float], *, confidence: float = 0.95,
            n_resamples: int = 10000, seed: int = DEFAULT_SEED) -> ABComparison:
    """Everything the gate reports about one metric of one cell."""
    u = unpaired.compare(candidate, oracle, confidence=confidence, n_resamples=n_resamples,
                         seed=seed, names=NAMES)
    return ABComparison(
        n_candidate=u.n_x, n_oracle=u.n_y, median_candidate=u.median_x,
        median_oracle=u.median_y, spread_candidate=u.spread_x, spread_oracle=u.spread_y,
        ratio_median=u.ratio, ratio_ci_low=u.ci_low, ratio_ci_high=u.ci_high,
        confidence=u.confidence, p_value=u.p_value)


@dataclass(frozen=True)
class ParityBound:
    """A row's parity threshold on one ratio metric, e.g. `ratio_ci_low >= 0.95`.

    Built from a `rows.spec.Criterion`; kept as a plain value here so this module
    stays free of row parsing.
    """

    metric: str
    holds: Callable[[float], bool]

    @classmethod
    def from_criterion(cls, criterion: Any) -> "ParityBound":
        if criterion.metric not in RATIO_METRICS:
            raise ValueError(f"criterion {criterion.id!r}: metric {criterion.metric!r} is not a "
                             f"ratio metric ({', '.join(RATIO_METRICS)})")
        return cls(metric=criterion.metric, holds=criterion.holds)


def verdict(cmp: ABComparison, *, min_effect: float, alpha: float,
            parity: Sequence[ParityBound] = (), higher_is_better: bool = True) -> Verdict:
    """Parity / better / worse / inconclusive for one cell.

    A difference counts only when it is significant (p < alpha) AND the CI
    excludes the band [1 - min_effect, 1 + min_effect]. A significant
    difference in the candidate's favour is BETTER. One against it is WORSE
    unless every parity bound of the row still holds (the row tolerates that
    much). Without a significant difference it is PARITY when the parity
    bounds hold (or the row gives none and the CI lies inside the band), and
    INCONCLUSIVE otherwise: too noisy to claim anything.
    """
    # e.g. latency: express as "candidate speed / oracle speed"
    values = dict(zip(RATIO_METRICS, unpaired.as_speed(
        cmp.ratio_median, cmp.ratio_ci_low, cmp.ratio_ci_high, higher_is_better)))
    low, high = values["ratio_ci_low"], values["ratio_ci_high"]
    significant = unpaired.significant(cmp.p_value, low, high, min_effect, alpha)
    tolerated = all(b.holds(values[b.metric]) for b in parity)
    if significant and low > 1:
        return Verdict.BETTER
    if significant:
        return Verdict.PARITY if parity and tolerated else Verdict.WORSE
    if parity:
        return Verdict.PARITY if tolerated else Verdict.INCONCLUSIVE
    inside = low >= 1 - min_effect and high <= 1 + min_effect
    return Verdict.PARITY if inside else Verdict.INCONCLUSIVE
