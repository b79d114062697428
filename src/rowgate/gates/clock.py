"""Where a gate's wall time goes: named phases (compile, engine start, warm-up,
measurement, timing, derive…), accumulated as the gate runs and sealed in its result.

A gate marks its phases with `with ctx.phase("compile"):`; the runner adds `derive` and
files what `measure` spent outside any named phase as `measure (other)`, so the phases
of a result always add up to its `duration_s` (up to rounding). Nested phases count in
the innermost one only.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

OTHER = "measure (other)"

WORK = frozenset({"measurement", "generate", "capture", "cases", "timing", "counters (ncu)",
                  "commands", "compile", "binutils", "AOT reachability"})
"""Phases that are the gate's evidence being made: the timed rounds, the passes whose
outputs are judged, the traced range (with the primer that range needs), kernel
launches and counters, the subject's commands and compiles. Everything else is
overhead: engines starting (torch.compile and CUDA graph capture included), warm-up,
the time between rounds, requirements, analysis, derive."""


def overhead_s(phases: dict[str, float], total: float) -> float:
    """Seconds of `total` not spent in a `WORK` phase (0 for a gate that ran nothing)."""
    return max(total - sum(s for name, s in phases.items() if name in WORK), 0.0)


class Phases:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._inner = 0.0
        """Seconds of the phase now open that nested phases already counted."""

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start, outer_inner = time.monotonic(), self._inner
        self._inner = 0.0
        try:
            yield
        finally:
            spent = time.monotonic() - start
            self.seconds[name] = self.seconds.get(name, 0.0) + spent - self._inner
            self._inner = outer_inner + spent

    def named(self) -> float:
        """Seconds counted in named phases so far."""
        return sum(self.seconds.values())

    def rounded(self) -> dict[str, float]:
        return {k: round(v, 3) for k, v in self.seconds.items()}
