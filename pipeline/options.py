"""Operator settings (`--option KEY=VALUE`): which keys exist, who reads them, and the
check that refuses a key nothing would read.

A misspelt option used to be accepted and silently ignored (`--option nvc=/opt/nvcc`
built with the default toolchain). Every key a gate, engine or toolchain reads from
`ctx.options` is listed here with the kinds that read it; `check` refuses any other
key for the command at hand, naming the closest known one (difflib).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pipeline.errors import UsageError


@dataclass(frozen=True)
class Option:
    key: str
    says: str


TOOLCHAIN = (Option("nvcc", "path of a CUDA nvcc to build with (its version is recorded)"),)
ENGINE = (
    Option("seed", "the vLLM engine's seed (default 0)"),
    Option("endpoint", "drive vLLM through its OpenAI server instead of offline (1/true)"),
    Option("vllm_enforce_eager", "run vLLM without CUDA graphs (1/true)"),
    Option("vllm_max_num_seqs", "vLLM's max_num_seqs (default 16)"),
    Option("persistent_schedule", "the persistent engine's schedule (static-round-robin, "
                                  "dynamic-queue)"),
    Option("persistent_cubin", "a prebuilt persistent megakernel cubin"),
    *TOOLCHAIN,
)
CANDIDATE_MODEL = Option("candidate_model", "the candidate arm loads this model directory "
                                            "instead of the row's (its digest is recorded)")
RECORD_KEY = Option("oracle_record_key", "public key PEM the oracle record must be signed with")
CUBIN = Option("cubin", "a prebuilt cubin for the operator gate instead of building one")

BY_KIND: dict[str, tuple[Option, ...]] = {
    "host": (),
    "build": TOOLCHAIN,
    "audit": TOOLCHAIN,
    "phase": TOOLCHAIN,
    "operator": (*TOOLCHAIN, CUBIN),
    "tokens": (*ENGINE, CANDIDATE_MODEL, RECORD_KEY),
    "throughput": (*ENGINE, CANDIDATE_MODEL),
    "trace": ENGINE,
    "accuracy": ENGINE,
    "abi": ENGINE,
}
"""What each gate kind reads from `ctx.options` (directly or through the engines and
toolchains it starts). A kind not listed reads nothing."""


def for_kinds(kinds: Iterable[str]) -> dict[str, Option]:
    """Every option the gate kinds read, by key."""
    return {o.key: o for kind in kinds for o in BY_KIND.get(kind, ())}


def check(options: Mapping[str, str], accepted: Mapping[str, Option], reader: str) -> None:
    """Raise UsageError for the first key that `reader` (`row X's gates`, `rowgate build`)
    does not read, naming the closest accepted key."""
    for key in options:
        if key in accepted:
            continue
        close = difflib.get_close_matches(key, list(accepted), n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        known = ", ".join(sorted(accepted)) or "none"
        raise UsageError(f"--option {key}: not read by {reader}{hint} (accepted: {known})")


def check_row(options: Mapping[str, str], row) -> None:
    """`rowgate gate ROW --option …`: keys the row's gates read."""
    check(options, for_kinds(g.kind for g in row.gates), f"row {row.id}'s gates")
