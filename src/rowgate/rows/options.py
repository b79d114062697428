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

TOOLCHAIN_KEYS = ("nvcc", "nvcc_sm70")
"""Read by the CUDA toolchains (src/rowgate/cuda/toolchains.py)."""
ENGINE_KEYS = ("seed", "endpoint", "standing", "vllm_enforce_eager", "vllm_max_num_seqs",
               "llamacpp_parallel", "llamacpp_threads", *TOOLCHAIN_KEYS)
"""Read by rowgate's own engines (src/rowgate/engines/__init__.py); an engine plugin
declares its own (`EnginePlugin.options`)."""

SAYS = {
    "nvcc": "path of a CUDA 13 nvcc to build sm_75 and newer with (its version is recorded)",
    "nvcc_sm70": "path of a CUDA 10-12 nvcc to build sm_70/sm_72 with (its version is "
                 "recorded), or `nvrtc` for the wheels' NVRTC even where `rowgate toolchain "
                 "fetch cuda-11.8` put an nvcc",
    "seed": "the vLLM engine's seed (default 0)",
    "endpoint": "drive vLLM through its OpenAI server instead of offline (1/true)",
    "standing": "attach the offline vLLM arm to the standing worker `rowgate oracle serve` "
                "keeps for it, when one is alive (1/true)",
    "vllm_enforce_eager": "run vLLM without CUDA graphs (1/true)",
    "vllm_max_num_seqs": "vLLM's max_num_seqs (default 16)",
    "llamacpp_parallel": "the llama.cpp server's parallel slots (default 16)",
    "llamacpp_threads": "the llama.cpp server's CPU threads (default 2)",
    "candidate_model": "the candidate arm loads this model directory instead of the row's "
                       "(its digest is recorded)",
    "oracle_record_key": "public key PEM the oracle record must be signed with",
}
"""Every key a gate, engine or toolchain reads, and what it does (docs/operators.md)."""


def plugin_says() -> dict[str, str]:
    """The keys the installed engine plugins read, and what each does."""
    from rowgate import plugins

    out: dict[str, str] = {}
    for name in plugins.names(plugins.ENGINES):
        out.update(getattr(plugins.load(plugins.ENGINES, name), "options", {}))
    return out


def says() -> dict[str, str]:
    """Every key rowgate and its installed plugins read, and what it does."""
    return {**SAYS, **plugin_says()}


def engine_keys() -> tuple[str, ...]:
    """What the engines a gate may start read: rowgate's own and the plugins'."""
    return (*ENGINE_KEYS, *plugin_says())


def for_kinds(kinds: Iterable[str]) -> tuple[str, ...]:
    """Every key the registered gate kinds read (a kind not registered reads none); a
    kind that starts engines reads every installed engine's keys too."""
    from rowgate import plugins

    keys: dict[str, None] = {}
    for kind in kinds:
        gate = plugins.load(plugins.GATES, kind)
        declared = tuple(gate.options) if gate is not None else ()
        keys.update(dict.fromkeys(declared))
        if set(ENGINE_KEYS) <= set(declared):
            keys.update(dict.fromkeys(plugin_says()))
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
