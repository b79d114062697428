"""What one gate concluded, as sealed in `gates/GATE-ID.json`."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rowgate.records.ids import ARTIFACT_PATH, GATE_ID
from rowgate.records.status import MetricValue, Status


class SandboxRecord(BaseModel):
    """How a gate's subject steps ran: confined (the tool, its version, a digest of its
    base profile) or, where the row turned the sandbox off, unconfined with its reason."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Literal["bubblewrap", "off"]
    tool: str = ""
    version: str = ""
    profile_sha256: str = ""
    reason: str = ""
    """The row's reason for `off`."""

    @property
    def confined(self) -> bool:
        return self.mode != "off"


class GateResult(BaseModel):
    """What one gate concluded; stored as `gates/GATE-ID.json` in a bundle."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gate_id: str = Field(pattern=GATE_ID)
    """The gate's id in the row."""
    kind: str
    """The gate kind (`host`, `build`, …)."""
    status: Status
    reason: str
    """Why this status: one line a reviewer can act on."""
    metrics: dict[str, MetricValue] = Field(default_factory=dict)
    """Gate-level metrics, recomputable from the artifacts by `derive`."""
    cells: dict[str, dict[str, MetricValue]] = Field(default_factory=dict)
    """Per-cell metrics (workload matrix cells or the gate's own cells)."""
    arch: str = ""
    """Arch the measurement came from (`cpu`, `sm_90`, …); empty when none."""
    stand_in: bool = False
    """True when measured on a stand-in arch rather than the row's target arch."""
    artifacts: list[Annotated[str, Field(pattern=ARTIFACT_PATH)]] = Field(default_factory=list)
    """Paths of the raw artifacts, relative to the bundle root, under `artifacts/GATE-ID/`."""
    duration_s: float = 0.0
    phases: dict[str, float] = Field(default_factory=dict)
    """Where `duration_s` went, seconds per phase (`compile`, `engine start`, `warm-up`,
    `measurement`, `derive`, `measure (other)`…; `rowgate.gates.clock`); empty in results
    sealed before rowgate recorded them."""
    sandbox: SandboxRecord | None = None
    """How its subject steps ran; None for a gate that runs none (or sealed before
    rowgate confined them)."""

    @model_validator(mode="after")
    def _artifacts_are_the_gates(self) -> GateResult:
        for i, path in enumerate(self.artifacts):
            if not path.startswith(f"artifacts/{self.gate_id}/"):
                raise ValueError(f"artifacts[{i}] {path!r} is not under artifacts/{self.gate_id}/")
        return self

    def __bool__(self) -> bool:
        return self.status is Status.PASS
