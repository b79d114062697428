"""Kernels.toml format version 2: the `[operators.*]` and `[triton.*]` tables.

Validating models for what a subject declares beyond its kernels (docs/contracts.md):
the operators its entry points implement (contract, roles, shapes, launch-geometry
constants, phase variants) and the Triton kernels it wants compiled ahead of time.
`rowgate.kernels` reads them into its manifest; the ops layer gets plain
`rowgate.ops.contract.Operator`s from `OperatorDecl.to_contract`.
"""

from __future__ import annotations

import string
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rowgate.ops import contract as pda  # the class field `contract` shadows the name

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"
"""Names that become path components (build and artifact directories): no dots,
no separators. (`rowgate.confine` owns the rule.)"""
IDENTIFIER = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
PLACEHOLDERS = {"kv_dtype", "head_dim", "group"}
HARNESS = pda.HARNESS
HARNESS_REF = r"^[A-Za-z0-9_][A-Za-z0-9_./-]{0,255}\.py:[A-Za-z_][A-Za-z0-9_]{0,127}$"
DEFINE = r"^[A-Za-z_][A-Za-z0-9_]*(=[A-Za-z0-9_.+-]*)?$"
Name = Annotated[str, Field(pattern=NAME_PATTERN)]
Identifier = Annotated[str, Field(pattern=IDENTIFIER)]
Define = Annotated[str, Field(pattern=DEFINE)]
Bytes = Annotated[int, Field(ge=0)]
TRITON_TYPES = ("*fp32", "*fp16", "*bf16", "*fp8e5", "*i8", "*u8", "*i32", "*i64", "i32", "i64",
                "u32", "fp32", "fp64", "i1", "constexpr")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SharedMemoryRule(_Model):
    """Dynamic shared memory (bytes) of the entry points matching `entry_points`:
    max(chunk_heads * chunk * group + head_dim * D + fixed, heads_dim * group * D)."""

    entry_points: Annotated[list[str], Field(min_length=1)] = ["*"]
    chunk_heads: Bytes = 0
    head_dim: Bytes = 0
    fixed: Bytes = 0
    heads_dim: Bytes = 0
    opt_in: bool = False
    """Sized past 48 KiB for the device's opt-in maximum: does not shrink the chunk."""


class LaunchRule(_Model):
    """Block size and cluster rule of the entry points matching `entry_points`
    (rowgate.ops.contract.Launch; docs/contracts.md, "Launch geometry")."""

    entry_points: Annotated[list[str], Field(min_length=1)] = ["*"]
    threads: Annotated[int, Field(ge=0)] = 0
    cluster_entry: str = ""
    cluster_splits: Annotated[int, Field(ge=0)] = 0


class PhaseVariant(_Model):
    """One phase's timing variant: built with these defines; `removes` the phase
    (cost = full - variant) or `doubles` it (cost = variant - full)."""

    defines: Annotated[list[Define], Field(min_length=1)]
    effect: Literal["removes", "doubles"]


class PhaseBuild(_Model):
    defines: list[Define] = []
    """Added to every phase build (and the full one), e.g. to build one shape only."""


def _placeholders(pattern: str) -> set[str]:
    return {f for _, f, _, _ in string.Formatter().parse(pattern) if f is not None}


class OperatorDecl(_Model):
    contract: str
    kernel: Name
    baseline: str = ""
    """`paged-decode-attention/1`: the baseline's entry-point pattern."""
    candidates: list[str] = []
    """`paged-decode-attention/1`: the candidates' entry-point patterns."""
    harness: Annotated[str, Field(pattern=HARNESS_REF)] | None = None
    """`harness/1`: `FILE.py:FUNCTION` (the file relative to the subject's root), called
    as `FUNCTION(role, inputs, out, cubins)` in the kernel child."""
    kv_dtypes: Annotated[list[Literal["bf16", "e5m2"]], Field(min_length=1)]
    head_dims: Annotated[list[int], Field(min_length=1)]
    groups: Annotated[list[int], Field(min_length=1)]
    groups_by_kv_dtype: dict[Literal["bf16", "e5m2"], Annotated[list[int], Field(min_length=1)]] = {}
    page_sizes: Annotated[list[int], Field(min_length=1)]
    threads: int = 256
    split_kv: bool = True
    chunk_multiple: int = 64
    min_chunk: int = 128
    max_chunk: int = 512
    shared_memory: list[SharedMemoryRule] = []
    launch: list[LaunchRule] = []
    phase_build: PhaseBuild = PhaseBuild()
    phases: dict[Identifier, PhaseVariant] = {}

    @model_validator(mode="after")
    def _within_the_contract(self) -> "OperatorDecl":
        if self.contract == HARNESS:
            return self._a_harness()
        if not self.baseline or not self.candidates:
            raise ValueError(f"contract {self.contract}: baseline and candidates (entry-point "
                             f"patterns) are required")
        if self.harness is not None:
            raise ValueError(f"harness: only for contract {HARNESS}")
        for pattern in (self.baseline, *self.candidates):
            stray = _placeholders(pattern) - PLACEHOLDERS
            if stray:
                raise ValueError(f"entry-point pattern {pattern!r}: unknown placeholder(s) "
                                 f"{', '.join(sorted(stray))} (known: {', '.join(sorted(PLACEHOLDERS))})")
        for rule in self.launch:
            if rule.cluster_entry and _placeholders(rule.cluster_entry) != {"entry"}:
                raise ValueError(f"launch.cluster_entry {rule.cluster_entry!r}: expected the "
                                 f"placeholder {{entry}} and no other")
        self.to_contract("operator")  # the contract's own checks (ranges, threads, chunks)
        return self

    def _a_harness(self) -> "OperatorDecl":
        """A harness names its function and nothing the fixed contract launches by."""
        if self.harness is None:
            raise ValueError(f"contract {HARNESS}: harness = \"FILE.py:FUNCTION\" is required")
        stray = [k for k in ("baseline", "candidates", "shared_memory", "launch", "phases")
                 if k in self.model_fields_set]
        if stray:
            raise ValueError(f"contract {HARNESS}: {', '.join(stray)} belong to the fixed "
                             f"contract (the harness launches its own kernels)")
        self.to_contract("operator")
        return self

    def to_contract(self, name: str) -> pda.Operator:
        """The ops layer's view. Raises ContractError (a ValueError) outside the contract.
        A harness's roles are its entry points: `baseline` and `candidate`."""
        data = self.model_dump(exclude={"phase_build", "phases"})
        if self.contract == HARNESS:
            data.update(baseline="baseline", candidates=["candidate"])
        else:
            data.pop("harness")
        try:
            return pda.Operator.from_table(name, data)
        except pda.ContractError as exc:
            raise ValueError(str(exc).removeprefix(f"operators.{name}: ")) from None


class TritonDecl(_Model):
    """A Triton kernel the subject wants compiled ahead of time (the AOT gate)."""

    source: str
    """The .py file, relative to kernels/; only its top-level `@triton.jit`
    functions are taken (by their source text: no other code of the file runs)."""
    function: Identifier
    signature: dict[Identifier, Literal[TRITON_TYPES]]  # type: ignore[valid-type]
    constants: dict[Identifier, int | float | bool] = {}
    num_warps: Annotated[int, Field(ge=1, le=32)] = 4
    num_stages: Annotated[int, Field(ge=1, le=8)] = 3

    @model_validator(mode="after")
    def _constants_match(self) -> "TritonDecl":
        constexpr = {k for k, v in self.signature.items() if v == "constexpr"}
        if set(self.constants) != constexpr:
            raise ValueError(f"constants: expected a value for each constexpr parameter "
                             f"({', '.join(sorted(constexpr)) or 'none'}), got "
                             f"{', '.join(sorted(self.constants)) or 'none'}")
        return self


def check_operators(operators: dict[str, OperatorDecl], kernels: dict[str, list[str]]) -> list[str]:
    """Each operator against the kernels it names ({kernel: entry points}): the
    kernel exists and declares every entry point the operator expands to."""
    problems = []
    for name, decl in operators.items():
        if decl.kernel not in kernels:
            problems.append(f"operators.{name}.kernel: {decl.kernel!r} is not a [kernels.*] "
                            f"table (known: {', '.join(sorted(kernels))})")
            continue
        missing = [e for e in decl.to_contract(name).all_entries() if e not in kernels[decl.kernel]]
        if missing:
            more = f" (+{len(missing) - 3} more)" if len(missing) > 3 else ""
            problems.append(f"operators.{name}: entry point(s) {', '.join(missing[:3])}{more} "
                            f"not in kernels.{decl.kernel}.entry_points")
    return problems


__all__ = ["LaunchRule", "NAME_PATTERN", "OperatorDecl", "PhaseBuild", "PhaseVariant",
           "SharedMemoryRule", "TritonDecl", "check_operators"]
