"""Operator settings (`--option KEY=VALUE`): what each key does, and the check that
refuses a key nothing would read.

A misspelt option used to be accepted and silently ignored (`--option nvc=/opt/nvcc`
built with the default toolchain). Each gate kind declares the keys it reads
(`Gate.options`, in the registry, from the groups below for what its engines and
toolchains read); `check` refuses any other key for the command at hand, naming the
closest known one (difflib).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from rowgate.errors import UsageError

if TYPE_CHECKING:
    from rowgate.rows.row import Row

TOOLCHAIN_KEYS = ("nvcc",)
"""Read by the CUDA toolchains (src/rowgate/cuda/toolchains.py)."""
ENGINE_KEYS = ("seed", "endpoint", "vllm_enforce_eager", "vllm_max_num_seqs",
               "persistent_schedule", "persistent_cubin", "fused_compile", "fused_cubin",
               "fused_chunk",
               "llamacpp_parallel", "llamacpp_threads", *TOOLCHAIN_KEYS)
"""Read by the engines a gate starts (src/rowgate/engines/__init__.py)."""

SAYS = {
    "nvcc": "path of a CUDA nvcc to build with (its version is recorded)",
    "seed": "the vLLM engine's seed (default 0)",
    "endpoint": "drive vLLM through its OpenAI server instead of offline (1/true)",
    "vllm_enforce_eager": "run vLLM without CUDA graphs (1/true)",
    "vllm_max_num_seqs": "vLLM's max_num_seqs (default 16)",
    "persistent_schedule": "the persistent engine's schedule (static-round-robin, "
                           "dynamic-queue)",
    "persistent_cubin": "a prebuilt persistent megakernel cubin",
    "fused_compile": "the graph-fused engine's torch.compile mode (max-autotune-no-cudagraphs "
                     "by default; max-autotune, default, reduce-overhead, none)",
    "llamacpp_parallel": "the llama.cpp server's parallel slots (default 16)",
    "llamacpp_threads": "the llama.cpp server's CPU threads (default 2)",
    "fused_cubin": "a prebuilt cubin of the graph-fused engine's decode attention",
    "fused_chunk": "tokens per split of the graph-fused engine's split_kv attention (a "
                   "multiple of 64 up to 512; default: the operator contract's plan)",
    "candidate_model": "the candidate arm loads this model directory instead of the row's "
                       "(its digest is recorded)",
    "oracle_record_key": "public key PEM the oracle record must be signed with",
}
"""Every key a gate, engine or toolchain reads, and what it does (docs/operators.md)."""


def for_kinds(kinds: Iterable[str]) -> tuple[str, ...]:
    """Every key the registered gate kinds read (a kind not registered reads none)."""
    from rowgate import plugins

    keys: dict[str, None] = {}
    for kind in kinds:
        gate = plugins.load(plugins.GATES, kind)
        keys.update(dict.fromkeys(gate.options if gate is not None else ()))
    return tuple(keys)


def check(options: Mapping[str, str], accepted: Iterable[str], reader: str) -> None:
    """Raise UsageError for the first key that `reader` (`row X's gates`, `rowgate build`)
    does not read, naming the closest accepted key."""
    known = sorted(set(accepted))
    for key in options:
        if key in known:
            continue
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise UsageError(f"--option {key}: not read by {reader}{hint} "
                         f"(accepted: {', '.join(known) or 'none'})")


def check_row(options: Mapping[str, str], row: Row) -> None:
    """`rowgate gate ROW --option …`: keys the row's gates read."""
    check(options, for_kinds(g.kind for g in row.gates), f"row {row.id}'s gates")
