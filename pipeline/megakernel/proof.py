"""The GPU part of the abi gate: the persistent engine's greedy tokens against the eager
engine's, per workload cell and schedule, with the route each batch size took.

Imports torch and the engines only when called: the gate's CPU part never needs them.
"""

from __future__ import annotations

from pathlib import Path


def first_divergence(want: list[tuple[int, ...]], got: list[tuple[int, ...]]) -> dict | None:
    for r, (a, b) in enumerate(zip(want, got)):
        if a != b:
            pos = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            return {"request": r, "position": pos,
                    "eager": a[pos] if pos < len(a) else None,
                    "persistent": b[pos] if pos < len(b) else None}
    return None


def run(model_dir: Path, passes: list, schedules: list[str], device: str, dtype: str,
        options: dict[str, str]) -> dict:
    """{cell: {schedule: {requests, mismatched_requests, first_divergence, routes}}}."""
    import json

    from pipeline import engines
    from pipeline.rows import Arm

    def tokens(arm: Arm, opts: dict[str, str]):
        with engines.create(arm, model_dir, device=device, options=opts) as engine:
            outs = [[o.token_ids for o in engine.generate(p).outputs] for p in passes]
            return outs, engine.describe()

    eager, _ = tokens(Arm(engine="reference", mode="eager", dtype=dtype), {})
    doc: dict = {p.cell: {} for p in passes}
    for schedule in schedules:
        got, described = tokens(Arm(engine="reference", mode="persistent", dtype=dtype),
                                {**options, "persistent_schedule": schedule})
        routes = json.loads(described.get("persistent_routes", "{}"))
        for p, want, have in zip(passes, eager, got):
            doc[p.cell][schedule] = {
                "requests": len(want),
                "mismatched_requests": sum(1 for a, b in zip(want, have) if a != b),
                "first_divergence": first_divergence(want, have), "routes": routes}
    return doc
