"""Phase attribution by compile-time variants: a subject's operator declares, per phase,
the defines of a variant that removes the phase or does it twice (kernels.toml
`[operators.NAME.phases]`); differences of medians against the full kernel give each
phase's cost. Shared by the phase gate; the benchmark (benchmarks/decode_attention.py)
runs rowgate's own variants the same way."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rowgate.ops.cases import Case, context_tokens, seq_lengths
from rowgate.ops.contract import Operator

if TYPE_CHECKING:
    from rowgate.ops.sandboxed import Launcher

FULL = "full"
_SHAPE = re.compile(r"^B(?P<batch>\d+)-(?P<layout>uniform|ragged)-(?P<context>[0-9.]+K?|page[+-]1|page)"
                    r"-(?P<kv>e5m2|bf16)(?:-h(?P<hq>\d+)x(?P<hkv>\d+))?(?:-d(?P<dim>\d+))?"
                    r"(?:-p(?P<page>\d+))?$")


def parse_shape(shape: str, seed: int = 0) -> Case:
    """`B16-ragged-17.8K-e5m2[-h32x8][-d128][-p64]` -> the case it names (GQA 32/8, head
    dim 128 and page 64 unless given; lengths from `seed`)."""
    m = _SHAPE.match(shape)
    if not m:
        raise ValueError(f"shape: expected B<batch>-<uniform|ragged>-<context>-<e5m2|bf16>"
                         f"[-h<Hq>x<Hkv>][-d<dim>][-p<page>], got {shape!r}")
    page = int(m["page"] or 64)
    batch, context = int(m["batch"]), m["context"]
    hq, hkv, dim = int(m["hq"] or 32), int(m["hkv"] or 8), int(m["dim"] or 128)
    if hkv < 1 or hq % hkv:
        raise ValueError(f"shape: {hq} query heads are not a multiple of {hkv} KV heads")
    lens = seq_lengths(m["layout"], context_tokens(context, page), batch, seed)
    return Case(seed, batch, m["layout"], context, page, m["kv"], hq, hkv, dim, lens)


def variants(common: list[str], phases: dict[str, Any], wanted: list[str]) -> dict[str, list[str]]:
    """{variant: defines}: the full kernel (the common defines) and one variant per
    wanted phase (its defines added). KeyError names an undeclared phase."""
    out = {FULL: list(common)}
    for name in wanted:
        if name not in phases:
            raise KeyError(f"phase {name!r} is not declared by the operator (phases: "
                           f"{', '.join(phases) or 'none'})")
        out[name] = [*common, *phases[name].defines]
    return out


def time_variants(case: Case, cubins: dict[str, str], entries: dict[str, str], operator: Operator,
                  repeats: int, *, child: Launcher) -> dict[str, Any]:
    """Every variant of every role on `case`, launched by `child` (the sandboxed kernel
    process), interleaved in rotated order, L2 flushed: raw samples and medians per
    `role:variant`."""
    import statistics

    from rowgate.ops.operator_ab import time_case

    record = time_case(case, {v: Path(p) for v, p in cubins.items()}, entries, operator,
                       repeats, child=child)
    samples = record["samples_us"]
    return {**record, "medians_us": {k: statistics.median(v) for k, v in samples.items()}}


def attribute(medians: dict[str, float], effects: dict[str, str],
              roles: tuple[str, ...] = ("baseline", "candidate")) -> dict[str, dict[str, float]]:
    """{role: {phase: µs}} from `role:variant` medians: a variant that `removes` its
    phase costs full - variant, one that `doubles` it variant - full. KeyError names a
    measurement that is missing."""
    out = {}
    for role in roles:
        full = medians[f"{role}:{FULL}"]
        costs = {FULL: full}
        for phase, effect in effects.items():
            value = medians[f"{role}:{phase}"]
            costs[phase] = full - value if effect == "removes" else value - full
        out[role] = costs
    return out
