"""The AOT gate's row table and its artifact names (read by its measure and its derive)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from rowgate.rows.spec import ARCH_PATTERN, GateSpec

Arch = Annotated[str, Field(pattern=ARCH_PATTERN)]
INDEX = "aot.json"
ADMISSION = "admission.json"


class AotGate(GateSpec):
    kind: Literal["aot"]
    arches: list[Arch] = []
    """Arches to compile for; empty means the row's `target.build_arches`."""
    kernels: list[str] = []
    """`[triton.*]` names of the subject's kernels.toml; empty means all."""
    enable: list[Arch] = []
    """Arches the subject would ship AOT images for (each decided by the verdict)."""
    admitted_by: str = ""
    """The trace gate whose capacity verdict must be `material` to enable an arch."""
    build: str = ""
    """The build gate whose kernels.toml (the gated commit's) is read."""
