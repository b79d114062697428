"""The lab's split-KV decode attention kernels as `paged-decode-attention/1` operators.

The lab is a subject like any other: its operators are read from its own
`kernels/kernels.toml`, and it launches them through rowgate's contract launcher
(`rowgate.ops.decode_attention`). Here live only the lab's own names: the three
operators, the variant words its benchmarks use (`bulk`, `deep`) and where its
benchmark builds go.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from rowgate.ops import contract
from rowgate.ops import decode_attention as _launcher
from rowgate.ops.contract import Operator
from rowgate.ops.decode_attention import check_cluster, check_shared_memory, kernel, role_of
from rowgate_lab import LAB

REPO = LAB
INCLUDE = LAB / "kernels" / "include"

OWN = contract.operators_in((LAB / "kernels" / "kernels.toml").read_text(), "kernels/kernels.toml")
SPLIT_KV, SPLIT_KV_BULK, SPLIT_KV_DEEP = OWN["split_kv"], OWN["split_kv_bulk"], OWN["split_kv_deep"]
OWN_VARIANTS = {"bulk": SPLIT_KV_BULK, "deep": SPLIT_KV_DEEP}
"""Variant names that pick the lab's other operators: `bulk` (or `e5m2_bulk`) is
split_kv_bulk's candidate and `deep` split_kv_deep's, run with SPLIT_KV's default."""


def cubin_path(arch: str, build_dir: Path | None = None) -> Path:
    """Where lab/benchmarks/decode_attention.py puts its own builds (phase variants beside)."""
    return (build_dir or LAB / "build") / "ops" / arch / "split_kv.cubin"


def build_cubin(repo: Path, arch: str, nvcc: str | None = None, name: str = "split_kv") -> Path:
    """Kernel `name`'s cubin for `arch`, built (or found in rowgate's cache) exactly as the
    build gate builds it."""
    from rowgate.cuda import cudabuild

    return cudabuild.cubin(repo, name, arch, nvcc)


def operator_of(variant: str, operator: Operator) -> Operator:
    """The operator a variant name runs: split_kv_bulk for `bulk` (split_kv_deep for
    `deep`) when the caller left the default operator, else `operator`."""
    own = OWN_VARIANTS.get(variant.rsplit("_", 1)[-1])
    return own if own is not None and operator is SPLIT_KV else operator


def DecodeAttention(*args: Any, variant: str = "baseline", operator: Operator = SPLIT_KV,  # noqa: N802
                    **kwargs: Any) -> _launcher.DecodeAttention:
    """rowgate's launcher with the lab's defaults: SPLIT_KV, and its variant words."""
    return _launcher.DecodeAttention(*args, variant=variant,
                                     operator=operator_of(variant, operator), **kwargs)


def decode_attention(*args: Any, variant: str = "baseline", operator: Operator = SPLIT_KV,
                     **kwargs: Any) -> torch.Tensor:
    return _launcher.decode_attention(*args, variant=variant,
                                      operator=operator_of(variant, operator), **kwargs)


__all__ = ["DecodeAttention", "INCLUDE", "OWN", "OWN_VARIANTS", "REPO", "SPLIT_KV", "SPLIT_KV_BULK",
           "SPLIT_KV_DEEP", "build_cubin", "check_cluster", "check_shared_memory", "cubin_path",
           "decode_attention", "kernel", "operator_of", "role_of"]
