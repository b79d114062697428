"""A/B statistics on seeded generated samples.

Why hand-made samples: the statistics must be checked against a known truth
(same distribution, or a known shift), which only generated data has. The
rates below are measured over many seeded trials, so each test checks the
procedure's error rate rather than one lucky draw.
"""

from __future__ import annotations

import numpy as np
import pytest

from rowgate.rows.spec import Criterion
from rowgate.stats import compat_v1 as stats
from rowgate.stats.compat_v1 import ParityBound, Verdict


def _draw(rng: np.random.Generator, centre: float, noise: float, n: int) -> list[float]:
    """Throughput-like samples: multiplicative log-normal noise around `centre`."""
    return list(centre * np.exp(rng.normal(0.0, noise, n)))


def _bound(metric: str, comparison: str, threshold: float) -> ParityBound:
    return ParityBound.from_criterion(Criterion(id="p", gate="tp", metric=metric,
                                                comparison=comparison, threshold=threshold))


def test_median_and_relative_spread_match_their_definitions():
    values = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert stats.median(values) == 3.0
    # numpy's linear percentiles: q1 = 2, q3 = 4 -> IQR 2 over median 3
    assert stats.relative_spread(values) == pytest.approx(2 / 3)


def test_aa_same_distribution_reports_no_significant_difference():
    rng = np.random.default_rng(1)
    a, b = _draw(rng, 100.0, 0.03, 9), _draw(rng, 100.0, 0.03, 9)
    cmp = stats.compare(a, b)
    assert cmp.p_value >= 0.05
    assert cmp.ratio_ci_low <= 1.0 <= cmp.ratio_ci_high
    assert stats.verdict(cmp, min_effect=0.02, alpha=0.05) in (Verdict.PARITY,
                                                                Verdict.INCONCLUSIVE)


def test_aa_false_positive_rate_stays_near_alpha():
    rng = np.random.default_rng(7)
    trials, flagged = 200, 0
    for _ in range(trials):
        cmp = stats.compare(_draw(rng, 50.0, 0.05, 9), _draw(rng, 50.0, 0.05, 9),
                            n_resamples=2000)
        flagged += stats.verdict(cmp, min_effect=0.0, alpha=0.05) in (Verdict.BETTER,
                                                                      Verdict.WORSE)
    assert flagged / trials <= 0.08


def test_shift_of_ten_percent_is_detected_as_worse_and_better():
    rng = np.random.default_rng(2)
    oracle = _draw(rng, 100.0, 0.02, 9)
    slower = stats.compare(_draw(rng, 90.0, 0.02, 9), oracle)
    assert slower.p_value < 0.05
    assert slower.ratio_ci_high < 0.98
    assert slower.ratio_median == pytest.approx(0.9, abs=0.03)
    assert stats.verdict(slower, min_effect=0.02, alpha=0.05) is Verdict.WORSE
    faster = stats.compare(_draw(rng, 110.0, 0.02, 9), oracle)
    assert stats.verdict(faster, min_effect=0.02, alpha=0.05) is Verdict.BETTER


def test_shift_detection_power_over_trials():
    rng = np.random.default_rng(3)
    trials = 100
    detected = sum(
        stats.verdict(stats.compare(_draw(rng, 92.0, 0.03, 9), _draw(rng, 100.0, 0.03, 9),
                                    n_resamples=2000), min_effect=0.02, alpha=0.05)
        is Verdict.WORSE for _ in range(trials))
    assert detected / trials >= 0.9


def test_small_significant_shift_inside_min_effect_is_not_a_difference():
    rng = np.random.default_rng(4)
    # 1 % slower with 0.2 % noise: significant, but smaller than a 3 % minimum effect
    cmp = stats.compare(_draw(rng, 99.0, 0.002, 12), _draw(rng, 100.0, 0.002, 12))
    assert cmp.p_value < 0.05
    assert stats.verdict(cmp, min_effect=0.03, alpha=0.05) is Verdict.PARITY


def test_parity_bound_tolerates_a_known_slowdown_and_catches_a_larger_one():
    rng = np.random.default_rng(5)
    oracle = _draw(rng, 100.0, 0.02, 9)
    slower = stats.compare(_draw(rng, 90.0, 0.02, 9), oracle)
    assert stats.verdict(slower, min_effect=0.02, alpha=0.05,
                         parity=[_bound("ratio_ci_low", "ge", 0.8)]) is Verdict.PARITY
    assert stats.verdict(slower, min_effect=0.02, alpha=0.05,
                         parity=[_bound("ratio_ci_low", "ge", 0.95)]) is Verdict.WORSE


def test_noisy_samples_without_a_difference_are_inconclusive_not_parity():
    rng = np.random.default_rng(6)
    cmp = stats.compare(_draw(rng, 100.0, 0.3, 5), _draw(rng, 100.0, 0.3, 5))
    assert cmp.p_value >= 0.05
    assert cmp.ratio_ci_high - cmp.ratio_ci_low > 0.2
    assert stats.verdict(cmp, min_effect=0.02, alpha=0.05) is Verdict.INCONCLUSIVE
    assert stats.verdict(cmp, min_effect=0.02, alpha=0.05,
                         parity=[_bound("ratio_ci_low", "ge", 0.95)]) is Verdict.INCONCLUSIVE


def test_latency_direction_lower_is_better():
    rng = np.random.default_rng(8)
    # candidate latency 20 % lower than the oracle's: better, not worse
    cmp = stats.compare(_draw(rng, 8.0, 0.02, 9), _draw(rng, 10.0, 0.02, 9))
    assert stats.verdict(cmp, min_effect=0.02, alpha=0.05,
                         higher_is_better=False) is Verdict.BETTER


def test_ci_is_reproducible_with_the_seed_and_moves_without_it():
    rng = np.random.default_rng(9)
    a, b = _draw(rng, 100.0, 0.05, 9), _draw(rng, 100.0, 0.05, 9)
    assert stats.ratio_ci(a, b) == stats.ratio_ci(a, b)
    assert stats.ratio_ci(a, b, seed=1) != stats.ratio_ci(a, b, seed=2)


def test_constant_samples_give_a_point_ci_and_p_one():
    cmp = stats.compare([10.0] * 5, [10.0] * 5)
    assert (cmp.ratio_ci_low, cmp.ratio_ci_high, cmp.p_value) == (1.0, 1.0, 1.0)
    assert stats.verdict(cmp, min_effect=0.02, alpha=0.05) is Verdict.PARITY


@pytest.mark.parametrize("bad", [[], [1.0, float("nan")], [float("inf")]])
def test_bad_samples_are_refused_with_the_argument_named(bad):
    with pytest.raises(ValueError, match="candidate"):
        stats.compare(bad, [1.0, 2.0])


def test_parity_bound_must_name_a_ratio_metric():
    with pytest.raises(ValueError, match="not a ratio metric"):
        _bound("median_candidate", "ge", 1.0)
