"""The GPU part of the abi gate: the persistent engine's greedy tokens against the eager
engine's, per workload cell and schedule, with the route each batch size took.

Two bf16 paths that sum in different orders cannot be held to identical tokens over a
long greedy run on a random-weight model: their logits differ by a few bf16 ulps
(measured on the H200: persistent vs eager max |d logit| 0.57-0.63, eager bf16 vs
fp32 0.63-0.70, docs/perf.md), and where the top two logits tie within that, each
path may keep a different one -- rowgate's own CPU interpreter of the ABI parts from
eager the same way, at an exact bf16 tie. So each request is exact, a near-tie within
the row's `tie_margin` nats, or a mismatch, which fails the gate
(`src/rowgate/engines/divergence.py`; the reference engine keeps four alternatives per token,
bf16 logits tie three ways too).

The two schedules must agree exactly (tokens and logprobs): the same tasks run the
same arithmetic whichever block claims them, so any difference is a race.

Imports torch and the engines only when called: the gate's CPU part never needs them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rowgate.engines.divergence import Out
from rowgate.engines.divergence import compare as _compare
from rowgate.engines.divergence import divergence as _divergence

if TYPE_CHECKING:
    from rowgate.engines.interface import Engine, WorkloadPass

NAMES = ("eager", "persistent")


def divergence(want: Out, got: Out, tie_margin: float) -> dict[str, Any] | None:
    return _divergence(want, got, tie_margin, NAMES)


def compare(want: list[Out], got: list[Out], tie_margin: float) -> dict[str, Any]:
    return _compare(want, got, tie_margin, NAMES)


Shared = tuple[str, Callable[[], AbstractContextManager["Engine"]]]
"""(schedule, opener): the row run's started candidate engine runs that schedule; the
opener yields it started and leaves it running for the gates after (engine_pool)."""


def run(model_dir: Path, passes: list[WorkloadPass], schedules: list[str], device: str,
        dtype: str, options: dict[str, str], tie_margin: float,
        shared: Shared | None = None,
        starting: Callable[[], AbstractContextManager[None]] = contextlib.nullcontext
        ) -> dict[str, Any]:
    """{cell: {schedule: compare(...) + routes, "schedules_identical": bool}}.
    `starting`: the context each engine of the proof's own starts in (the gate's
    "engine start" phase)."""
    import json

    from rowgate import engines
    from rowgate.rows.spec import Arm

    @contextlib.contextmanager
    def own(arm: Arm, opts: dict[str, str]) -> Iterator[Engine]:
        engine = engines.create(arm, model_dir, device=device, options=opts)
        with starting():
            engine.start()
        try:
            yield engine
        finally:
            engine.stop()

    def outputs(arm: Arm, opts: dict[str, str]) -> tuple[list[list[Out]], dict[str, str]]:
        schedule = opts.get("persistent_schedule")
        opened = (shared[1]() if shared is not None and schedule == shared[0]
                  else own(arm, opts))
        with opened as engine:
            outs = [[Out.of(o) for o in engine.generate(p).outputs] for p in passes]
            return outs, engine.describe()

    eager, _ = outputs(Arm(engine="reference", mode="eager", dtype=dtype), {})
    doc: dict[str, dict[str, Any]] = {p.cell: {} for p in passes}
    by_schedule: dict[str, list[list[Out]]] = {}
    for schedule in schedules:
        got, described = outputs(Arm(engine="lab-persistent", mode="persistent", dtype=dtype),
                                 {**options, "persistent_schedule": schedule})
        by_schedule[schedule] = got
        routes = json.loads(described.get("persistent_routes", "{}"))
        for p, want, have in zip(passes, eager, got):
            doc[p.cell][schedule] = {**compare(want, have, tie_margin), "routes": routes}
    runs = list(by_schedule.values())
    for i, p in enumerate(passes):
        doc[p.cell]["schedules_identical"] = all(r[i] == runs[0][i] for r in runs[1:])
    return doc
