"""What one gate concluded, as sealed in `gates/GATE-ID.json`."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from pipeline.records.status import MetricValue, Status


class GateResult(BaseModel):
    """What one gate concluded; stored as `gates/GATE-ID.json` in a bundle."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gate_id: str
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
    artifacts: list[str] = Field(default_factory=list)
    """Paths of the raw artifacts, relative to the bundle root."""
    duration_s: float = 0.0

    def __bool__(self) -> bool:
        return self.status is Status.PASS
