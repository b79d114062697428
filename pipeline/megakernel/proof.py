"""The GPU part of the abi gate: the persistent engine's greedy tokens against the eager
engine's, per workload cell and schedule, with the route each batch size took.

Two bf16 paths that sum in different orders cannot be held to identical tokens over a
long greedy run on a random-weight model: their logits differ by a few bf16 ulps
(measured on the H200: persistent vs eager max |d logit| 0.57-0.63, eager bf16 vs
fp32 0.63-0.70, docs/perf.md), and where the top two logits tie within that, each
path may keep a different one -- rowgate's own CPU interpreter of the ABI parts from
eager the same way, at an exact bf16 tie. So each request is one of:

* exact: every token equal;
* tie: at the first divergence each path's choice is among the other's most likely
  alternatives (the reference engine keeps four per token; bf16 logits tie three
  ways too), within the row's `tie_margin` (nats) of that path's own choice; tokens
  after it are not compared, their histories differ (the rule of vLLM's
  `check_logprobs_close`);
* mismatch: anything else, which fails the gate.

The two schedules must agree exactly (tokens and logprobs): the same tasks run the
same arithmetic whichever block claims them, so any difference is a race.

Imports torch and the engines only when called: the gate's CPU part never needs them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Out:
    """One request's greedy output as the proof compares it."""

    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]
    alternatives: tuple[tuple[tuple[int, float], ...], ...]

    @classmethod
    def of(cls, o) -> "Out":
        return cls(tuple(o.token_ids), tuple(o.logprobs),
                   tuple(tuple((int(i), float(lp)) for i, lp in alt) for alt in o.alternatives))

    def gap_to(self, pos: int, token: int) -> float | None:
        """How many nats below this path's own choice `token` was at `pos` (None: not
        among the alternatives kept)."""
        if pos >= len(self.alternatives):
            return None
        return next((self.logprobs[pos] - lp for i, lp in self.alternatives[pos] if i == token),
                    None)


def divergence(want: Out, got: Out, tie_margin: float) -> dict | None:
    """None when the tokens are equal; else where they part and whether it is a tie."""
    pos = next((i for i, (x, y) in enumerate(zip(want.tokens, got.tokens)) if x != y), None)
    if pos is None:
        if len(want.tokens) == len(got.tokens):
            return None
        pos = min(len(want.tokens), len(got.tokens))
    a = want.tokens[pos] if pos < len(want.tokens) else None
    b = got.tokens[pos] if pos < len(got.tokens) else None
    doc = {"position": pos, "eager": a, "persistent": b, "tie": False}
    if a is None or b is None:
        return doc
    gap_want, gap_got = want.gap_to(pos, b), got.gap_to(pos, a)
    doc.update(eager_gap=None if gap_want is None else round(gap_want, 6),
               persistent_gap=None if gap_got is None else round(gap_got, 6))
    doc["tie"] = (gap_want is not None and gap_got is not None
                  and gap_want <= tie_margin and gap_got <= tie_margin)
    return doc


def compare(want: list[Out], got: list[Out], tie_margin: float) -> dict:
    """Per-pass summary: counts, every divergence, the first real mismatch."""
    parted = [(r, d) for r, d in enumerate(divergence(w, g, tie_margin)
                                           for w, g in zip(want, got)) if d]
    mismatches = [{"request": r, **d} for r, d in parted if not d["tie"]]
    return {"requests": len(want), "exact_requests": len(want) - len(parted),
            "tie_requests": len(parted) - len(mismatches),
            "mismatched_requests": len(mismatches) + abs(len(want) - len(got)),
            "divergences": [{"request": r, **d} for r, d in parted],
            "first_divergence": mismatches[0] if mismatches else None}


def run(model_dir: Path, passes: list, schedules: list[str], device: str, dtype: str,
        options: dict[str, str], tie_margin: float) -> dict:
    """{cell: {schedule: compare(...) + routes, "schedules_identical": bool}}."""
    import json

    from pipeline import engines
    from pipeline.rows import Arm

    def outputs(arm: Arm, opts: dict[str, str]):
        with engines.create(arm, model_dir, device=device, options=opts) as engine:
            outs = [[Out.of(o) for o in engine.generate(p).outputs] for p in passes]
            return outs, engine.describe()

    eager, _ = outputs(Arm(engine="reference", mode="eager", dtype=dtype), {})
    doc: dict = {p.cell: {} for p in passes}
    by_schedule = {}
    for schedule in schedules:
        got, described = outputs(Arm(engine="reference", mode="persistent", dtype=dtype),
                                 {**options, "persistent_schedule": schedule})
        by_schedule[schedule] = got
        routes = json.loads(described.get("persistent_routes", "{}"))
        for p, want, have in zip(passes, eager, got):
            doc[p.cell][schedule] = {**compare(want, have, tie_margin), "routes": routes}
    runs = list(by_schedule.values())
    for i, p in enumerate(passes):
        doc[p.cell]["schedules_identical"] = all(r[i] == runs[0][i] for r in runs[1:])
    return doc
