"""How many weight rows one GEMV task takes: shared by the unfused builder and the fused
list (lab/rowgate_lab/megakernel/builder.py, fused_list.py), so both cut a weight alike."""

from __future__ import annotations

import math

WARPS = 8
"""Warps per block of the persistent kernel (kernels/persistent/task_abi.cuh, kWarps)."""


def up(x: int, m: int) -> int:
    """x rounded up to a multiple of m."""
    return (x + m - 1) // m * m


def gemv_rows(n: int, sm_count: int, scale: int = 1) -> int:
    """Rows per GEMV tile: about `scale` tiles' worth per SM, a whole number of warps."""
    return min(up(n, WARPS), max(WARPS, up(math.ceil(n / sm_count), WARPS) * scale))
