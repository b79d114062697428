"""Format-1 throughput statistics (bundles sealed before the paired sequential design):
one median per repeat and arm. Kept so such bundles still re-derive; `pipeline.stats`
holds the statistics new bundles use.

One cell of a throughput matrix gives two samples, one value per repeat per arm
(e.g. output tok/s). `compare` summarises them the way the gate and the review
need: medians, relative spread (IQR / median), a bootstrap 95 % CI of the
candidate/oracle ratio of medians, and a two-sided Mann-Whitney U p-value.
`verdict` turns that into parity / better / worse / inconclusive.

Choices, and why:

* The bootstrap resamples the two arms **independently** (`paired=False`). The
  statistic is a ratio of two medians, not a median of per-repeat ratios, and
  repeat *i* of one arm is not a measurement of the same unit as repeat *i* of
  the other: interleaving (A B B A …) is what removes drift, not pairing. It is
  also the resampling that matches Mann-Whitney, which treats the samples as
  independent.
* The CI uses the percentile method. With 5-15 repeats the median of a
  resample takes only a handful of distinct values; BCa's jackknife
  acceleration degenerates on such data (scipy warns and may return NaN),
  while the percentile interval stays defined.
* The generator is seeded (`numpy.random.default_rng(seed)`), so `derive` on a
  sealed bundle reproduces the recorded CI to the last digit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

import numpy as np
from scipy import stats as _st

DEFAULT_SEED = 20240917
"""Seed of the bootstrap generator: fixed, so a re-derivation is bit-identical."""

RATIO_METRICS = ("ratio_median", "ratio_ci_low", "ratio_ci_high")
"""Per-cell metrics a parity criterion may be written against."""


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


def _array(values: Sequence[float] | np.ndarray, name: str) -> np.ndarray:
    arr = np.asarray(values, dtype=float)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name}: expected a non-empty list of numbers, got {len(arr)} values")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name}: every value must be finite, got {values!r}")
    return arr


def median(values: Sequence[float] | np.ndarray) -> float:
    return float(np.median(_array(values, "values")))


def relative_spread(values: Sequence[float] | np.ndarray) -> float:
    """Interquartile range divided by the median (0 when the median is 0)."""
    arr = _array(values, "values")
    q1, med, q3 = np.percentile(arr, [25, 50, 75])
    return float((q3 - q1) / med) if med else 0.0


def mann_whitney_p(candidate: Sequence[float] | np.ndarray,
                   oracle: Sequence[float] | np.ndarray) -> float:
    """Two-sided Mann-Whitney U p-value (scipy picks exact or asymptotic)."""
    c, o = _array(candidate, "candidate"), _array(oracle, "oracle")
    if np.ptp(np.concatenate([c, o])) == 0:
        return 1.0  # every value identical: no evidence of any difference
    return float(_st.mannwhitneyu(c, o, alternative="two-sided").pvalue)


def _ratio_of_medians(c: np.ndarray, o: np.ndarray, axis: int = -1) -> np.ndarray:
    out: np.ndarray = np.median(c, axis=axis) / np.median(o, axis=axis)
    return out


def ratio_ci(candidate: Sequence[float] | np.ndarray, oracle: Sequence[float] | np.ndarray, *,
             confidence: float = 0.95,
             n_resamples: int = 10000, seed: int = DEFAULT_SEED) -> tuple[float, float]:
    """Bootstrap CI of median(candidate) / median(oracle); independent resampling."""
    c, o = _array(candidate, "candidate"), _array(oracle, "oracle")
    if np.median(o) <= 0:
        raise ValueError(f"oracle: the median must be positive for a ratio, got {np.median(o)}")
    if np.ptp(c) == 0 and np.ptp(o) == 0:
        r = float(c[0] / o[0])
        return r, r  # constant samples: every resample gives the same ratio
    res = _st.bootstrap((c, o), _ratio_of_medians, n_resamples=n_resamples, vectorized=True,
                        paired=False, confidence_level=confidence, method="percentile",
                        rng=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def compare(candidate: Sequence[float], oracle: Sequence[float], *, confidence: float = 0.95,
            n_resamples: int = 10000, seed: int = DEFAULT_SEED) -> ABComparison:
    """Everything the gate reports about one metric of one cell."""
    c, o = _array(candidate, "candidate"), _array(oracle, "oracle")
    low, high = ratio_ci(c, o, confidence=confidence, n_resamples=n_resamples, seed=seed)
    return ABComparison(
        n_candidate=int(c.size), n_oracle=int(o.size),
        median_candidate=median(c), median_oracle=median(o),
        spread_candidate=relative_spread(c), spread_oracle=relative_spread(o),
        ratio_median=median(c) / median(o), ratio_ci_low=low, ratio_ci_high=high,
        confidence=confidence, p_value=mann_whitney_p(c, o))


@dataclass(frozen=True)
class ParityBound:
    """A row's parity threshold on one ratio metric, e.g. `ratio_ci_low >= 0.95`.

    Built from a `rowspec.Criterion`; kept as a plain value here so this module
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
    if min_effect < 0 or not 0 < alpha < 1:
        raise ValueError(f"min_effect must be >= 0 and alpha in (0, 1), got {min_effect}, {alpha}")
    values = {m: getattr(cmp, m) for m in RATIO_METRICS}
    if not higher_is_better:  # e.g. latency: express as "candidate speed / oracle speed"
        values = {"ratio_median": 1 / values["ratio_median"],
                  "ratio_ci_low": 1 / values["ratio_ci_high"],
                  "ratio_ci_high": 1 / values["ratio_ci_low"]}
    low, high = values["ratio_ci_low"], values["ratio_ci_high"]
    significant = cmp.p_value < alpha and (low > 1 + min_effect or high < 1 - min_effect)
    tolerated = all(b.holds(values[b.metric]) for b in parity)
    if significant and low > 1:
        return Verdict.BETTER
    if significant:
        return Verdict.PARITY if parity and tolerated else Verdict.WORSE
    if parity:
        return Verdict.PARITY if tolerated else Verdict.INCONCLUSIVE
    inside = low >= 1 - min_effect and high <= 1 + min_effect
    return Verdict.PARITY if inside else Verdict.INCONCLUSIVE
