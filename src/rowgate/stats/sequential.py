"""Group-sequential boundaries: how much of a test's error rate each look may spend.

The throughput gate looks at its data more than once (after 8, 16, 24 … rounds)
and stops as soon as it can decide. Looking repeatedly at a fixed-level CI
inflates the error rate (five looks at 95 % each miss the truth ~14 % of the time
instead of 5 %). The standard cure, used here, is the *error-spending* approach
of Lan & DeMets (Biometrika 70:659, 1983): a spending function alpha(t) says how
much of the total two-sided alpha may have been used by information fraction
t = rounds / max_rounds; look k gets the boundary c_k with

    P(|Z_1| < c_1, …, |Z_{k-1}| < c_{k-1}, |Z_k| >= c_k) = alpha(t_k) - alpha(t_{k-1})

under the null, where Z_k is the standardised estimate at look k (a Brownian
motion observed at t_1 < t_2 < …). The intervals `estimate ± c_k · SE_k` are then
*repeated confidence intervals* (Jennison & Turnbull, JRSS-B 51:305, 1989;
Group Sequential Methods, 2000, ch. 7 and 9): they cover the true value at every
look simultaneously with probability >= 1 - alpha, whatever rule decides when to
stop (precision reached, a clear verdict, a time budget). Looks need not be
planned exactly: an extra look when a time budget ends is one more information
fraction in the same recursion.

The variance is estimated, so the gate uses Jennison & Turnbull's "significance
level" approach for t statistics (2000): each look's nominal level
2·(1 - Phi(c_k)) is applied with Student's t at that look's degrees of freedom.

Why by hand: scipy has no group-sequential routine; `multivariate_normal.cdf`
integrates by randomised quasi-Monte Carlo, so a review on another machine
could re-derive a boundary differing in the 6th digit. The recursion below is
the deterministic numerical integration of Armitage, McPherson & Rowe (JRSS-A
132:235, 1969) as Jennison & Turnbull (2000, ch. 19) give it, on a Simpson grid;
it reproduces gsDesign's Lan-DeMets Pocock bounds for five equal looks
(2.438, 2.427, 2.410, 2.397, 2.386) to three decimals and a Monte-Carlo check of
the overall error rate (tests/test_sequential.py).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np
from scipy import optimize
from scipy import stats as _st

SPENDING = ("pocock", "obrien-fleming")
"""Lan-DeMets spending functions: Pocock-type alpha·ln(1 + (e-1)t) spends evenly (cheap
early stops: the gate stops at its first look when the data are stable);
O'Brien-Fleming-type 2 - 2·Phi(z_{alpha/2} / sqrt(t)) keeps almost all of alpha for
the last look (cheap when the budget is usually used up)."""

CAP = 12.0
"""Largest boundary used: spending below ~1e-32 at a look (O'Brien-Fleming's first looks
of a long design) cannot be represented, and no round ever lands 12 sd out."""
GRID = 401
"""Simpson points across the continuation region (odd): bounds exact to ~1e-7."""


def spent(t: float, alpha: float, spending: str) -> float:
    """Two-sided alpha spent by information fraction t (0 < t <= 1)."""
    if not 0 < t <= 1:
        raise ValueError(f"information fraction: expected 0 < t <= 1, got {t}")
    if spending == "pocock":
        return alpha * math.log(1 + (math.e - 1) * t)
    if spending == "obrien-fleming":
        return float(2 - 2 * _st.norm.cdf(_st.norm.ppf(1 - alpha / 2) / math.sqrt(t)))
    raise ValueError(f"spending: expected one of {', '.join(SPENDING)}, got {spending!r}")


def _phi(x: np.ndarray) -> np.ndarray:
    out: np.ndarray = np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
    return out


def _simpson_weights(grid: np.ndarray) -> np.ndarray:
    w = np.ones(grid.size)
    w[1:-1:2], w[2:-1:2] = 4, 2
    out: np.ndarray = w * (grid[1] - grid[0]) / 3
    return out


def _excess_crossing(c: float, t: float, sd: float, grid: np.ndarray, mass: np.ndarray,
                     target: float) -> float:
    """P(still inside before, |Z| >= c at information t) - the alpha to spend there."""
    b = c * math.sqrt(t)
    return float(np.sum(mass * (_st.norm.cdf((-b - grid) / sd) + _st.norm.sf((b - grid) / sd)))
                 - target)


def _bounds(fractions: tuple[float, ...], alpha: float, spending: str) -> tuple[float, ...]:
    """Boundaries c_k (on the Z scale) of symmetric two-sided looks at `fractions`."""
    out: list[float] = []
    grid = density = np.empty(0)
    previous, t_prev = 0.0, 0.0
    for t in fractions:
        target = spent(t, alpha, spending) - previous
        if not out:
            c = min(float(_st.norm.isf(target / 2)), CAP)
            b = c * math.sqrt(t)
            grid = np.linspace(-b, b, GRID)  # the score S = Z·sqrt(t), still inside
            density = _phi(grid / math.sqrt(t)) / math.sqrt(t)
        else:
            sd = math.sqrt(t - t_prev)
            mass = _simpson_weights(grid) * density
            # crossing here is no likelier than |Z_k| >= c alone: the marginal
            # bound brackets the root from above
            top = min(float(_st.norm.isf(target / 2)) + 1e-9, CAP)
            args = (t, sd, grid, mass, target)
            c = top if _excess_crossing(top, *args) >= 0 else float(
                optimize.brentq(_excess_crossing, 1e-3, top, xtol=1e-10, args=args))
            b = c * math.sqrt(t)
            nxt = np.linspace(-b, b, GRID)
            density = mass @ (_phi((nxt[None, :] - grid[:, None]) / sd) / sd)
            grid = nxt
        out.append(c)
        previous, t_prev = spent(t, alpha, spending), t
    return tuple(out)


@functools.lru_cache(maxsize=256)
def boundaries(looks: tuple[int, ...], max_rounds: int, alpha: float,
               spending: str = "pocock") -> tuple[float, ...]:
    """Z-scale boundary of each look made at `looks` rounds (increasing), for a
    design whose information is complete at `max_rounds`."""
    if not looks or list(looks) != sorted(set(looks)) or looks[0] < 1:
        raise ValueError(f"looks: expected increasing positive round counts, got {looks}")
    if looks[-1] > max_rounds:
        raise ValueError(f"looks: {looks[-1]} rounds is past max_rounds {max_rounds}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha: expected 0 < alpha < 1, got {alpha}")
    return _bounds(tuple(n / max_rounds for n in looks), alpha, spending)


def nominal_levels(looks: Sequence[int], max_rounds: int, alpha: float,
                   spending: str = "pocock") -> tuple[float, ...]:
    """Two-sided nominal alpha of each look: 2·(1 - Phi(c_k))."""
    return tuple(float(2 * _st.norm.sf(c))
                 for c in boundaries(tuple(looks), max_rounds, alpha, spending))
