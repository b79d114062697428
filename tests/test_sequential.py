"""Group-sequential boundaries against published values and a Monte-Carlo check."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as st

from rowgate.stats import sequential


def test_pocock_type_bounds_match_gsdesign_for_five_equal_looks():
    # gsDesign sfLDPocock, k = 5, two-sided alpha 0.05 (test.type = 2)
    c = sequential.boundaries((8, 16, 24, 32, 40), 40, 0.05, "pocock")
    assert c == pytest.approx((2.438, 2.427, 2.410, 2.397, 2.386), abs=1e-3)


def test_obrien_fleming_type_first_bound_is_the_spending_function_inverted():
    c = sequential.boundaries((8, 16, 24, 32, 40), 40, 0.05, "obrien-fleming")
    assert c[0] == pytest.approx(st.norm.isf(0.025) / np.sqrt(0.2), rel=1e-9)
    assert c[0] > c[1] > c[2] > c[3] > c[4] > st.norm.isf(0.025)


def test_one_look_is_the_fixed_sample_interval():
    assert sequential.boundaries((40,), 40, 0.05) == pytest.approx((st.norm.isf(0.025),))


@pytest.mark.parametrize("spending", sequential.SPENDING)
@pytest.mark.parametrize("looks,max_rounds", [((8, 16, 24, 32, 40), 40), ((8, 16, 21), 40)])
def test_overall_error_rate_is_alpha_under_the_null(spending, looks, max_rounds):
    """Brownian motion observed at the looks crosses some boundary with probability
    alpha(t_last): alpha at full information, less when a budget cut the design short."""
    c = np.asarray(sequential.boundaries(looks, max_rounds, 0.05, spending))
    t = np.asarray(looks) / max_rounds
    rng = np.random.default_rng(11)
    s = np.cumsum(rng.normal(size=(200_000, len(t))) * np.sqrt(np.diff(np.r_[0, t])), axis=1)
    rate = float((np.abs(s / np.sqrt(t)) >= c).any(axis=1).mean())
    assert rate == pytest.approx(sequential.spent(t[-1], 0.05, spending), abs=0.0015)


def test_nominal_levels_are_the_boundaries_two_sided_tails():
    levels = sequential.nominal_levels((8, 16), 16, 0.05)
    c = sequential.boundaries((8, 16), 16, 0.05)
    assert levels == pytest.approx(tuple(2 * st.norm.sf(x) for x in c))
    assert all(0 < a < 0.05 for a in levels)


@pytest.mark.parametrize("looks,max_rounds,alpha,spending,match", [
    ((), 40, 0.05, "pocock", "looks"),
    ((16, 8), 40, 0.05, "pocock", "looks"),
    ((8, 48), 40, 0.05, "pocock", "past max_rounds"),
    ((8,), 40, 1.5, "pocock", "alpha"),
    ((8,), 40, 0.05, "haybittle", "spending"),
])
def test_bad_designs_are_refused_with_the_argument_named(looks, max_rounds, alpha, spending,
                                                         match):
    with pytest.raises(ValueError, match=match):
        sequential.boundaries(looks, max_rounds, alpha, spending)
