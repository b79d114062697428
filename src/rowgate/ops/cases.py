"""The operator gate's cases: the grid a row's operator gate asks for (seeds, cache
dtypes, heads, head dims, pages, layouts, batches, contexts), each combination's seeded
sequence lengths, and the values of a grid that make no case. Pure Python: the plan counts
a row's cases where torch is not installed (rowgate.ops.paged_inputs makes their inputs)."""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

K = 1024


def context_tokens(label: str, page: int) -> int:
    """`1`, `page-1`, `page`, `page+1`, `1024`, `17.8K` (K = 1024, rounded) -> tokens."""
    if label == "page":
        return page
    if label in ("page-1", "page+1"):
        return page - 1 if label == "page-1" else page + 1
    if label.endswith("K"):
        return round(float(label[:-1]) * K)
    return int(label)


def seq_lengths(layout: str, context: int, batch: int, seed: int) -> list[int]:
    """Uniform: every sequence `context` long. Ragged: one sequence `context`
    long, the others drawn from 1..context, in a seeded shuffled order."""
    if layout == "uniform" or batch == 1:
        return [context] * batch
    rng = random.Random(seed * 1_000_003 + context * 31 + batch)
    lens = [context] + [rng.randint(1, context) for _ in range(batch - 1)]
    rng.shuffle(lens)
    return lens


@dataclass(frozen=True)
class Case:
    """One operator-gate case; everything needed to rebuild its inputs."""

    seed: int
    batch: int
    layout: str
    context: str
    page: int
    kv: str
    hq: int
    hkv: int
    dim: int
    lens: list[int] = field(default_factory=list)

    @property
    def name(self) -> str:
        return (f"{self.kv}-h{self.hq}x{self.hkv}-d{self.dim}-p{self.page}-B{self.batch}-"
                f"{self.layout}-{self.context}-s{self.seed}")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"name": self.name}


class CaseGrid(Protocol):
    """What `cases` reads of a spec (the operator gate's): the values to combine."""

    @property
    def seeds(self) -> Sequence[int]: ...
    @property
    def kv_dtypes(self) -> Sequence[str]: ...
    @property
    def heads(self) -> Sequence[Sequence[int]]: ...
    @property
    def head_dims(self) -> Sequence[int]: ...
    @property
    def page_sizes(self) -> Sequence[int]: ...
    @property
    def layouts(self) -> Sequence[str]: ...
    @property
    def batches(self) -> Sequence[int]: ...
    @property
    def contexts(self) -> Sequence[str]: ...


def cases(spec: CaseGrid) -> list[Case]:
    """Every combination the spec asks for, lengths fixed by the seed."""
    out = []
    for seed, kv, (hq, hkv), dim, page, layout, batch, ctx in itertools.product(
            spec.seeds, spec.kv_dtypes, spec.heads, spec.head_dims, spec.page_sizes,
            spec.layouts, spec.batches, spec.contexts):
        if layout == "ragged" and batch == 1:
            continue  # one sequence is uniform by definition
        tokens = context_tokens(ctx, page)
        out.append(Case(seed, batch, layout, ctx, page, kv, hq, hkv, dim,
                        seq_lengths(layout, tokens, batch, seed)))
    return out


def unused(spec: CaseGrid) -> list[str]:
    """`batch 1`, `layout ragged`: each value of the grid that makes no case (a ragged
    layout needs two sequences), so a plan can say the row asks for less than it reads."""
    made = cases(spec)
    out = []
    for name, values in (("batch", spec.batches), ("layout", spec.layouts)):
        have = {getattr(c, name) for c in made}
        out += [f"{name} {v}" for v in values if v not in have]
    return out
