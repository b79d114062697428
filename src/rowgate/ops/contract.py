"""`paged-decode-attention/1`, host side: what an operator declares and what a call derives.

docs/contracts.md is the specification. This module holds the parts of it that are
arithmetic: the kernel parameter list, the entry point of a role for one (KV dtype,
head dim, group), the split plan (chunk, splits), each entry point's dynamic shared
memory and the launch geometry (block size and cluster rule per entry point). Plain
dataclasses, no torch and no pydantic: the build layer's kernels.toml parser
(validating) and bare device images (benchmarks) both build `Operator`s, and neither
has to import the other's dependencies.
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import asdict, dataclass, field
from typing import Any

CONTRACT = "paged-decode-attention/1"
HARNESS = "harness/1"
"""The harness rule (docs/contracts.md): the subject's harness function launches its own
kernels in their own signature and layout; rowgate makes the inputs and judges the output."""
KV_DTYPES = ("bf16", "e5m2")
KV_BYTES = {"bf16": 2, "e5m2": 1}
HEAD_DIM_RANGE = (16, 256)
"""head_dim: a multiple of 16 in this range (both ends included)."""
GROUP_RANGE = (1, 16)
PAGE_RANGE = (1, 4096)
"""page_size: a power of two in this range."""
CTAS_PER_SM = 2
"""The plan sizes chunks so that about this many CTAs run per SM."""
PORTABLE_DYNAMIC_SMEM = 48 * 1024 - 256
"""Chunks shrink until every entry point's dynamic shared memory fits this (room
for a little static shared memory under the 48 KiB every device grants)."""
DEFAULT_SMEM_LIMIT = 48 * 1024
"""Static + dynamic shared memory beyond this needs the function's opt-in attribute."""
LOG2E = 1.4426950408889634
WORKSPACE_POISON = 0x7FBADBAD
"""A float NaN: ws_acc and ws_ml hold it before every correctness launch."""
ROLES = ("baseline", "candidate")
PORTABLE_CLUSTER = 8
"""The largest cluster every device of compute capability 9.0+ launches."""


@dataclass(frozen=True)
class Param:
    name: str
    kind: str
    """`pointer`, `int32` or `float32`."""


PARAMETERS: tuple[Param, ...] = (
    Param("q", "pointer"), Param("k_cache", "pointer"), Param("v_cache", "pointer"),
    Param("block_table", "pointer"), Param("seq_lens", "pointer"), Param("out", "pointer"),
    Param("ws_acc", "pointer"), Param("ws_ml", "pointer"), Param("counters", "pointer"),
    Param("bt_stride", "int32"), Param("num_kv_heads", "int32"), Param("page_shift", "int32"),
    Param("chunk", "int32"), Param("qk_scale_log2", "float32"), Param("v_scale", "float32"),
)
"""The kernel's parameters, in order (docs/contracts.md, "Kernel parameters")."""
POINTERS = sum(1 for p in PARAMETERS if p.kind == "pointer")


class ContractError(ValueError):
    """An operator or a call the contract cannot express: one line saying what and where."""


@dataclass(frozen=True)
class SharedMemory:
    """Dynamic shared memory of the entry points matching `entry_points`, in bytes:
    max(chunk_heads * chunk * group + head_dim * D + fixed, heads_dim * group * D).
    `opt_in`: sized for the device's opt-in maximum, past the 48 KiB every device
    grants, so it does not shrink the chunk (a launch beyond the device's opt-in
    maximum is still refused)."""

    entry_points: tuple[str, ...] = ("*",)
    chunk_heads: int = 0
    head_dim: int = 0
    fixed: int = 0
    heads_dim: int = 0
    opt_in: bool = False

    def matches(self, entry: str) -> bool:
        return any(fnmatch.fnmatchcase(entry, p) for p in self.entry_points)

    def bytes(self, chunk: int, group: int, dim: int) -> int:
        return max(self.chunk_heads * chunk * group + self.head_dim * dim + self.fixed,
                   self.heads_dim * group * dim)


@dataclass(frozen=True)
class Launch:
    """How the entry points matching `entry_points` launch, where they differ from the
    operator's: their block size (`threads`; 0: the operator's) and, with
    `cluster_splits`, a cluster entry point (`cluster_entry`, `{entry}` the role's
    entry point) launched instead when a call has at most `cluster_splits` splits, on
    a grid of exactly `cluster_splits` splits that form one cluster per (sequence, KV
    head): the entry point is compiled with that static cluster shape
    (`__cluster_dims__(cluster_splits, 1, 1)`), and its splits past the call's own
    attend to no token."""

    entry_points: tuple[str, ...] = ("*",)
    threads: int = 0
    cluster_entry: str = ""
    cluster_splits: int = 0

    def matches(self, entry: str) -> bool:
        return any(fnmatch.fnmatchcase(entry, p) for p in self.entry_points)

    def problem(self) -> str | None:
        if self.threads and (self.threads % 32 or not 32 <= self.threads <= 1024):
            return f"launch.threads: expected a multiple of 32 in 32..1024, got {self.threads}"
        if not 0 <= self.cluster_splits <= PORTABLE_CLUSTER:
            return (f"launch.cluster_splits: expected 0..{PORTABLE_CLUSTER} (a portable "
                    f"cluster), got {self.cluster_splits}")
        if bool(self.cluster_splits) != bool(self.cluster_entry) or (
                self.cluster_entry and "{entry}" not in self.cluster_entry):
            return ("launch.cluster_entry/cluster_splits: expected both or neither, the "
                    "entry pattern holding {entry}")
        return None


@dataclass(frozen=True)
class Geometry:
    """What one launch of a role's entry point is, for one plan."""

    entry: str
    """The entry point launched (a cluster entry point where a launch rule says so)."""
    grid_x: int
    threads: int
    cluster: int
    """Splits per cluster; 0: no cluster."""


@dataclass(frozen=True)
class Operator:
    """One `[operators.NAME]` table of a subject's kernels.toml (format version 2)."""

    name: str
    kernel: str
    """The `[kernels.*]` table whose build holds the entry points."""
    baseline: str
    """Entry-point pattern: `{kv_dtype}`, `{head_dim}` and `{group}` are substituted."""
    candidates: tuple[str, ...]
    kv_dtypes: tuple[str, ...]
    head_dims: tuple[int, ...]
    groups: tuple[int, ...]
    page_sizes: tuple[int, ...]
    threads: int = 256
    split_kv: bool = True
    """False: one CTA per (sequence, KV head) walks every token (splits = 1)."""
    chunk_multiple: int = 64
    min_chunk: int = 128
    max_chunk: int = 512
    shared_memory: tuple[SharedMemory, ...] = ()
    """First matching rule wins; an entry point no rule matches uses none."""
    groups_by_kv_dtype: tuple[tuple[str, tuple[int, ...]], ...] = ()
    """A KV dtype's own groups, in place of `groups` (e.g. GQA 2 in bf16 only)."""
    launch: tuple[Launch, ...] = ()
    """First matching rule wins; an entry point no rule matches launches with
    `threads` and no cluster."""
    contract: str = CONTRACT
    harness: str = ""
    """`harness/1`: `FILE.py:FUNCTION`, the file relative to the subject's root."""

    @property
    def is_harness(self) -> bool:
        return self.contract == HARNESS

    def harness_file(self) -> tuple[str, str]:
        """(file relative to the subject's root, function) of a harness."""
        file, _, function = self.harness.rpartition(":")
        return file, function

    @classmethod
    def from_table(cls, name: str, table: dict[str, Any]) -> "Operator":
        """From the raw TOML table. Checks types and ranges only as far as the
        arithmetic needs (kernels.toml's parser validates the file first)."""
        data = dict(table)
        data.pop("phases", None)
        data.pop("phase_build", None)
        data["harness"] = data.get("harness") or ""  # a fixed-contract table says None
        for key in ("candidates", "kv_dtypes", "head_dims", "groups", "page_sizes"):
            if key in data:
                data[key] = tuple(data[key])
        try:
            rules = tuple(SharedMemory(**{**r, "entry_points": tuple(r.get("entry_points", ["*"]))})
                          for r in data.pop("shared_memory", []))
            launch = tuple(Launch(**{**r, "entry_points": tuple(r.get("entry_points", ["*"]))})
                           for r in data.pop("launch", []))
            data["groups_by_kv_dtype"] = tuple(
                (kv, tuple(gs)) for kv, gs in dict(data.get("groups_by_kv_dtype", {})).items())
            op = cls(name=name, shared_memory=rules, launch=launch, **data)
        except TypeError as exc:
            raise ContractError(f"operators.{name}: {exc}") from None
        problem = op.problem()
        if problem:
            raise ContractError(f"operators.{name}: {problem}")
        return op

    def to_table(self) -> dict[str, Any]:
        """The table `from_table` reads back to this operator (JSON-able: what the kernel
        child is sent)."""
        table = asdict(self)
        del table["name"]
        table["groups_by_kv_dtype"] = {kv: list(gs) for kv, gs in self.groups_by_kv_dtype}
        return table

    def problem(self) -> str | None:
        """Why this declaration is outside the contract, or None."""
        if self.contract not in (CONTRACT, HARNESS):
            return (f"contract {self.contract!r}: this rowgate implements {CONTRACT!r} and "
                    f"{HARNESS!r}")
        if self.is_harness and not self.harness:
            return f"harness: {HARNESS} needs `harness = \"FILE.py:FUNCTION\"`"
        if not self.candidates:
            return "candidates: at least one candidate entry point"
        bad = [k for k in self.kv_dtypes if k not in KV_DTYPES]
        if bad or not self.kv_dtypes:
            return f"kv_dtypes: expected some of {list(KV_DTYPES)}, got {list(self.kv_dtypes)}"
        lo, hi = HEAD_DIM_RANGE
        if not self.head_dims or any(d % 16 or not lo <= d <= hi for d in self.head_dims):
            return f"head_dims: expected multiples of 16 in {lo}..{hi}, got {list(self.head_dims)}"
        lo, hi = GROUP_RANGE
        for key, groups in (("groups", self.groups), *((f"groups_by_kv_dtype.{kv}", gs)
                                                       for kv, gs in self.groups_by_kv_dtype)):
            if not groups or any(not lo <= g <= hi for g in groups):
                return f"{key}: expected values in {lo}..{hi}, got {list(groups)}"
        stray = [kv for kv, _ in self.groups_by_kv_dtype if kv not in self.kv_dtypes]
        if stray:
            return f"groups_by_kv_dtype: {', '.join(stray)} not in kv_dtypes {list(self.kv_dtypes)}"
        bad_launch = next((p for p in (r.problem() for r in self.launch) if p), None)
        if bad_launch:
            return bad_launch
        lo, hi = PAGE_RANGE
        if not self.page_sizes or any(not lo <= p <= hi or p & (p - 1) for p in self.page_sizes):
            return f"page_sizes: expected powers of two in {lo}..{hi}, got {list(self.page_sizes)}"
        if self.threads % 32 or not 32 <= self.threads <= 1024:
            return f"threads: expected a multiple of 32 in 32..1024, got {self.threads}"
        m = self.chunk_multiple
        if m < 1 or m & (m - 1):
            return f"chunk_multiple: expected a power of two, got {m}"
        if not 0 < self.min_chunk <= self.max_chunk:
            return f"min_chunk/max_chunk: expected 0 < min_chunk <= max_chunk, got " \
                   f"{self.min_chunk} and {self.max_chunk}"
        return None

    # ------------------------------------------------------------ entry points

    def entry(self, pattern: str, kv: str, dim: int, group: int) -> str:
        return pattern.format(kv_dtype=kv, head_dim=dim, group=group)

    def candidate(self, which: str = "") -> str:
        """The candidate pattern a row names; the only one when `which` is empty."""
        if not which:
            if len(self.candidates) != 1:
                raise ContractError(f"operator {self.name}: declares {len(self.candidates)} "
                                    f"candidates ({', '.join(self.candidates)}); the row must "
                                    f"name one")
            return self.candidates[0]
        if which not in self.candidates:
            raise ContractError(f"operator {self.name}: candidate {which!r} is not declared "
                                f"(candidates: {', '.join(self.candidates)})")
        return which

    def entries(self, kv: str, dim: int, group: int, candidate: str = "") -> dict[str, str]:
        """{role: entry point} for one shape: the baseline and one candidate."""
        return {"baseline": self.entry(self.baseline, kv, dim, group),
                "candidate": self.entry(self.candidate(candidate), kv, dim, group)}

    def groups_for(self, kv: str) -> tuple[int, ...]:
        return dict(self.groups_by_kv_dtype).get(kv, self.groups)

    def all_entries(self) -> list[str]:
        """Every entry point the declaration names, cluster entry points included
        (for the build's check)."""
        out = []
        for kv in self.kv_dtypes:
            for dim in self.head_dims:
                for group in self.groups_for(kv):
                    for pattern in (self.baseline, *self.candidates):
                        names = self.launchable(self.entry(pattern, kv, dim, group))
                        out += [n for n in names if n not in out]
        return out

    def launchable(self, entry: str) -> list[str]:
        """A role's entry point and, where its launch rule has one, its cluster entry point
        (none for a harness: its function chooses what it launches)."""
        if self.is_harness:
            return []
        rule = self.launch_rule(entry)
        if rule and rule.cluster_splits:
            return [entry, rule.cluster_entry.format(entry=entry)]
        return [entry]

    def unsupported(self, kv: str, dim: int, group: int, page: int) -> str | None:
        """Why this operator cannot run a shape (one line), or None."""
        for what, value, allowed in (("KV dtype", kv, self.kv_dtypes),
                                     ("head dim", dim, self.head_dims),
                                     ("group", group, self.groups_for(kv)),
                                     ("page size", page, self.page_sizes)):
            if value not in allowed:
                of = f" for {kv}" if what == "group" and kv in dict(self.groups_by_kv_dtype) else ""
                return (f"operator {self.name} declares no {what} {value}{of} "
                        f"({what}s: {', '.join(map(str, allowed))})")
        return None

    def _smem_rule(self, entry: str) -> SharedMemory | None:
        return next((r for r in self.shared_memory if r.matches(entry)), None)

    def smem(self, entry: str, chunk: int, group: int, dim: int) -> int:
        rule = self._smem_rule(entry)
        return rule.bytes(chunk, group, dim) if rule else 0

    def bounds_chunk(self, entry: str) -> bool:
        """Whether the entry point's shared memory shrinks the plan's chunk (not opt-in)."""
        rule = self._smem_rule(entry)
        return rule is not None and not rule.opt_in

    def launch_rule(self, entry: str) -> Launch | None:
        return next((r for r in self.launch if r.matches(entry)), None)

    def geometry(self, entry: str, splits: int) -> Geometry:
        """How a role's entry point launches for a plan of `splits` splits."""
        rule = self.launch_rule(entry)
        threads = rule.threads if rule and rule.threads else self.threads
        if rule and rule.cluster_splits and splits <= rule.cluster_splits:
            return Geometry(rule.cluster_entry.format(entry=entry), rule.cluster_splits,
                            threads, rule.cluster_splits)
        return Geometry(entry, splits, threads, 0)


@dataclass(frozen=True)
class Plan:
    """How one call splits the KV: `chunk` tokens per CTA, `splits` CTAs per
    (sequence, KV head); the dynamic shared memory of each entry point."""

    chunk: int
    splits: int
    smem: dict[str, int] = field(default_factory=dict)

    def grid(self, kv_heads: int, batch: int) -> tuple[int, int, int]:
        return (self.splits, kv_heads, batch)


def plan(op: Operator, entries: list[str], *, batch: int, kv_heads: int, group: int, dim: int,
         page: int, max_seq_len: int, sm_count: int) -> Plan:
    """The contract's plan rule (docs/contracts.md, "Launch geometry").

    The chunk is the same for every entry point of the call (it fixes the order in
    which splits merge, so it must not depend on which variant runs); it shrinks
    until each of `entries` fits PORTABLE_DYNAMIC_SMEM (opt-in sizes aside), never
    below one unit."""
    if max_seq_len < 1:
        raise ContractError(f"max_seq_len: expected at least 1, got {max_seq_len}")
    unit = max(op.chunk_multiple, page)
    covering = math.ceil(max_seq_len / unit) * unit
    if not op.split_kv:
        chunk = covering
    else:
        floor = max(unit, min(op.min_chunk, covering))
        per_cta = math.ceil(max_seq_len * batch * kv_heads / (CTAS_PER_SM * sm_count))
        chunk = min(max(floor, math.ceil(per_cta / unit) * unit), max(op.max_chunk, unit))

        def worst(c: int) -> int:
            return max((op.smem(e, c, group, dim) for e in entries if op.bounds_chunk(e)),
                       default=0)

        while chunk > unit and worst(chunk) > PORTABLE_DYNAMIC_SMEM:
            chunk -= unit
    return Plan(chunk, math.ceil(max_seq_len / chunk),
                {e: op.smem(e, chunk, group, dim) for e in entries})


def scalars(*, bt_stride: int, kv_heads: int, page: int, chunk: int, softmax_scale: float,
            k_scale: float, v_scale: float) -> tuple[int, int, int, int, float, float]:
    """Parameters 9..14 in order (page_shift = log2 page; the key scale and log2(e)
    folded into the softmax scale, so a kernel computes exp2(q.k * qk_scale_log2))."""
    return (bt_stride, kv_heads, page.bit_length() - 1, chunk,
            softmax_scale * k_scale * LOG2E, v_scale)


def workspace_elements(batch: int, kv_heads: int, splits: int, group: int,
                       dim: int) -> tuple[int, int, int]:
    """Elements of ws_acc [B, Hkv, X, G, D] f32, ws_ml [B, Hkv, X, 2, G] f32 and
    counters [B * Hkv] int32."""
    return (batch * kv_heads * splits * group * dim, batch * kv_heads * splits * 2 * group,
            batch * kv_heads)


def operators_in(text: str, where: str) -> dict[str, Operator]:
    """The `[operators.*]` tables of a kernels.toml's text, for callers without the
    validating parser (bare device images); ContractError names `where`."""
    import tomllib

    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ContractError(f"{where}: {exc}") from None
    tables = data.get("operators", {})
    out = {}
    for name, table in tables.items():
        try:
            out[name] = Operator.from_table(name, table)
        except ContractError as exc:
            raise ContractError(f"{where}: {exc}") from None
    return out


__all__ = ["CONTRACT", "ContractError", "Geometry", "KV_DTYPES", "LOG2E", "Launch", "Operator",
           "PARAMETERS", "Param", "Plan", "SharedMemory", "operators_in", "plan", "scalars",
           "workspace_elements"]
