"""Two independent samples of one metric compared: medians, relative spread, a
bootstrap CI of the ratio of medians, a two-sided Mann-Whitney U p-value, and the
change it supports against a minimum effect, with the smallest change the
comparison could have detected. Pure functions over lists of floats.

Why unpaired. Two things use it: `rowgate compare` (two bundles of one row, i.e.
two runs, possibly days apart, on one device) and the format-1 throughput gate
(`rowgate.stats.compat_v1`, one median per repeat and arm). In both, value *i* of one
sample is not a measurement of the same unit as value *i* of the other: pass 3 of
Monday's run and pass 3 of Tuesday's share no batch, clock or host state, so
there is nothing to pair and the differences of such "pairs" would only add their
variances. (The format-2 gate pairs because its two arms run back to back within
each round: `rowgate.stats.paired`.) Hence the choices:

* The bootstrap resamples the two samples **independently** (`paired=False`). The
  statistic is a ratio of two medians, not a median of per-pass ratios. It is also
  the resampling that matches Mann-Whitney, which treats the samples as independent.
* The CI uses the percentile method. With 5-40 values the median of a resample
  takes only a handful of distinct values; BCa's jackknife acceleration
  degenerates on such data (scipy warns and may return NaN), while the percentile
  interval stays defined.
* The generator is seeded (`numpy.random.default_rng(seed)`), so re-deriving a
  sealed format-1 bundle reproduces its recorded CI to the last digit, and
  `rowgate compare` says the same thing twice.

A change counts only when it is significant (p < alpha) AND its CI clears the band
[1 - min_effect, 1 + min_effect]; without one it is "no change" when the CI lies
inside the band, and inconclusive otherwise. The power of that rule is quoted as
`detectable`: the smallest slowdown it would call with probability `POWER`, were
the spread what it was — the band's edge plus (z_{1-alpha/2} + z_power) standard
errors of the log ratio (the usual minimum-detectable-effect formula, Bloom,
Evaluation Review 19:547, 1995), the standard error read off the bootstrap CI's
width on the log scale. It is an approximation (it ignores the Mann-Whitney
condition, which rarely binds once the CI clears the band), not a simulation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
from scipy import stats as _st

DEFAULT_SEED = 20240917
"""Seed of the bootstrap generator: fixed, so a re-derivation is bit-identical."""
POWER = 0.8
"""Power at which `detectable` is quoted."""

Values = Sequence[float] | np.ndarray


class Change(StrEnum):
    FASTER = "faster"
    """x is significantly better than y, by more than the minimum effect."""
    SLOWER = "slower"
    """x is significantly worse than y, by more than the minimum effect."""
    NONE = "no significant change"
    """No significant difference, and the CI lies inside ±min_effect."""
    INCONCLUSIVE = "inconclusive"
    """No significant difference, but the CI is too wide to rule one out."""


@dataclass(frozen=True)
class Unpaired:
    """Sample x against sample y (ratios are x / y)."""

    n_x: int
    n_y: int
    median_x: float
    median_y: float
    spread_x: float
    """IQR / median of x."""
    spread_y: float
    ratio: float
    """median(x) / median(y)."""
    ci_low: float
    ci_high: float
    confidence: float
    p_value: float
    """Two-sided Mann-Whitney U."""


@dataclass(frozen=True)
class Decision:
    """What an `Unpaired` comparison supports, said as a speed ratio (> 1: x faster)."""

    change: Change
    speedup: float
    low: float
    high: float
    detectable: float
    """Smallest slowdown (fraction) called `slower` with probability POWER at this spread."""


def _array(values: Values, name: str) -> np.ndarray:
    arr = np.asarray(values, dtype=float)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name}: expected a non-empty list of numbers, got {len(arr)} values")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name}: every value must be finite, got {values!r}")
    return arr


def median(values: Values) -> float:
    return float(np.median(_array(values, "values")))


def relative_spread(values: Values) -> float:
    """Interquartile range divided by the median (0 when the median is 0)."""
    arr = _array(values, "values")
    q1, med, q3 = np.percentile(arr, [25, 50, 75])
    return float((q3 - q1) / med) if med else 0.0


def mann_whitney_p(x: Values, y: Values, names: tuple[str, str] = ("x", "y")) -> float:
    """Two-sided Mann-Whitney U p-value (scipy picks exact or asymptotic)."""
    a, b = _array(x, names[0]), _array(y, names[1])
    if np.ptp(np.concatenate([a, b])) == 0:
        return 1.0  # every value identical: no evidence of any difference
    return float(_st.mannwhitneyu(a, b, alternative="two-sided").pvalue)


def _ratio_of_medians(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
    out: np.ndarray = np.median(a, axis=axis) / np.median(b, axis=axis)
    return out


def ratio_ci(x: Values, y: Values, *, confidence: float = 0.95, n_resamples: int = 10000,
             seed: int = DEFAULT_SEED, names: tuple[str, str] = ("x", "y")
             ) -> tuple[float, float]:
    """Bootstrap CI of median(x) / median(y); independent resampling."""
    a, b = _array(x, names[0]), _array(y, names[1])
    if np.median(b) <= 0:
        raise ValueError(f"{names[1]}: the median must be positive for a ratio, got "
                         f"{np.median(b)}")
    if np.ptp(a) == 0 and np.ptp(b) == 0:
        r = float(a[0] / b[0])
        return r, r  # constant samples: every resample gives the same ratio
    res = _st.bootstrap((a, b), _ratio_of_medians, n_resamples=n_resamples, vectorized=True,
                        paired=False, confidence_level=confidence, method="percentile",
                        rng=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def compare(x: Values, y: Values, *, confidence: float = 0.95, n_resamples: int = 10000,
            seed: int = DEFAULT_SEED, names: tuple[str, str] = ("x", "y")) -> Unpaired:
    """Everything one comparison of x against y reports (`names` name them in errors)."""
    a, b = _array(x, names[0]), _array(y, names[1])
    low, high = ratio_ci(a, b, confidence=confidence, n_resamples=n_resamples, seed=seed,
                         names=names)
    return Unpaired(n_x=int(a.size), n_y=int(b.size), median_x=median(a), median_y=median(b),
                    spread_x=relative_spread(a), spread_y=relative_spread(b),
                    ratio=median(a) / median(b), ci_low=low, ci_high=high,
                    confidence=confidence, p_value=mann_whitney_p(a, b, names))


def as_speed(ratio: float, low: float, high: float, higher_is_better: bool
             ) -> tuple[float, float, float]:
    """A ratio and its CI as a speed ratio (> 1 faster): inverted for a latency."""
    return (ratio, low, high) if higher_is_better else (1 / ratio, 1 / high, 1 / low)


def significant(p_value: float, low: float, high: float, min_effect: float,
                alpha: float) -> bool:
    """p < alpha and the CI [low, high] clear of [1 - min_effect, 1 + min_effect]."""
    if min_effect < 0 or not 0 < alpha < 1:
        raise ValueError(f"min_effect must be >= 0 and alpha in (0, 1), got {min_effect}, {alpha}")
    return p_value < alpha and (low > 1 + min_effect or high < 1 - min_effect)


def detectable(low: float, high: float, confidence: float, min_effect: float,
               alpha: float, power: float = POWER) -> float:
    """Smallest slowdown (fraction) the rule calls with probability `power`, at the
    standard error the CI [low, high] shows (see the module docstring)."""
    z = float(_st.norm.ppf((1 + confidence) / 2))
    se = (math.log(high) - math.log(low)) / (2 * z)
    shift = float(_st.norm.ppf(1 - alpha / 2) + _st.norm.ppf(power)) * se
    return 1 - (1 - min_effect) * math.exp(-shift)


def decide(u: Unpaired, *, min_effect: float, alpha: float, higher_is_better: bool = True
           ) -> Decision:
    """The change x -> y supports (x is the later sample in `rowgate compare`)."""
    speedup, low, high = as_speed(u.ratio, u.ci_low, u.ci_high, higher_is_better)
    if significant(u.p_value, low, high, min_effect, alpha):
        change = Change.FASTER if low > 1 else Change.SLOWER
    elif low >= 1 - min_effect and high <= 1 + min_effect:
        change = Change.NONE
    else:
        change = Change.INCONCLUSIVE
    return Decision(change, speedup, low, high,
                    detectable(low, high, u.confidence, min_effect, alpha))
