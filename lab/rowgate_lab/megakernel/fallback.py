"""Which decode shapes the persistent kernel supports, and where the others go.

The route is persistent -> CUDA graph -> eager: a shape the persistent kernel
does not support runs as a CUDA graph replay on a CUDA device, and eagerly
otherwise. Every decision is data (`Route.to_json`) so the bundle records
which path ran and why the faster one was not taken.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rowgate_lab.megakernel.builder import ModelDims

MAX_BATCH = 8
"""GEMV tiles keep one fp32 accumulator per sequence in registers."""
HEAD_DIMS = (64, 128)
"""Attention-split kernels are instantiated for these head sizes."""
MAX_GROUP = 8
"""Query heads per kv head held in registers by one attention split."""
ARCHES = ("sm_90",)
"""Arches kernels.toml builds the persistent kernel for."""
DTYPES = ("bfloat16",)


@dataclass(frozen=True)
class Route:
    mode: str
    """`persistent`, `graph` or `eager`."""
    requested: str
    reasons: tuple[str, ...]
    """Why each faster mode was not taken (empty when the requested mode runs)."""

    @property
    def fell_back(self) -> bool:
        return self.mode != self.requested

    def to_json(self) -> dict[str, Any]:
        return {"requested": self.requested, "mode": self.mode, "fell_back": self.fell_back,
                "reasons": list(self.reasons)}


def persistent_unsupported(dims: ModelDims, batch: int, dtype: str, arch: str) -> list[str]:
    """Why the persistent kernel cannot run this shape ([] when it can)."""
    out = []
    if dtype not in DTYPES:
        out.append(f"dtype {dtype} (persistent kernel: {', '.join(DTYPES)})")
    if arch not in ARCHES:
        out.append(f"arch {arch or 'none'} (persistent kernel built for {', '.join(ARCHES)})")
    if not 1 <= batch <= MAX_BATCH:
        out.append(f"batch {batch} (persistent kernel: 1..{MAX_BATCH})")
    if dims.head_dim not in HEAD_DIMS:
        out.append(f"head_dim {dims.head_dim} (persistent kernel: {HEAD_DIMS})")
    if dims.kv_heads == 0 or dims.heads % dims.kv_heads:
        out.append(f"{dims.heads} heads not a multiple of {dims.kv_heads} kv heads")
    elif dims.heads // dims.kv_heads > MAX_GROUP:
        out.append(f"GQA group {dims.heads // dims.kv_heads} (persistent kernel: <= {MAX_GROUP})")
    for name, k in (("hidden", dims.hidden), ("intermediate", dims.intermediate),
                    ("heads*head_dim", dims.heads * dims.head_dim)):
        if k % 8:
            out.append(f"{name} {k} not a multiple of 8 (16-byte weight loads)")
    return out


def route(dims: ModelDims, batch: int, dtype: str, device: str, arch: str,
          requested: str = "persistent") -> Route:
    """The mode that runs for `requested` on `device` (`cpu` / `cuda:N`) of `arch`."""
    reasons = []
    if requested == "persistent":
        why = persistent_unsupported(dims, batch, dtype, arch)
        if not why:
            return Route("persistent", requested, ())
        reasons.append("persistent: " + "; ".join(why))
        requested_next = "graph"
    else:
        requested_next = requested
    if requested_next == "graph":
        if device.startswith("cuda"):
            return Route("graph", requested, tuple(reasons))
        reasons.append(f"graph: needs a CUDA device, not {device!r}")
    return Route("eager", requested, tuple(reasons))
