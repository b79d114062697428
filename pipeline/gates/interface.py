"""The one interface every gate kind implements.

A gate is split in two so the review can redo its arithmetic:

* `measure(row, spec, ctx)` runs things and writes raw artifacts (logs, samples,
  traces) under `ctx.artifact_dir`. It may be slow, it may need hardware.
* `derive(row, spec, artifact_dir) -> Derived` is pure: it reads only the raw
  artifacts and computes status, reason and metrics. `rowgate review` calls it
  again on the sealed bundle and compares with the recorded summary.

`requirements(row, spec, ctx)` says, before anything runs, why the gate cannot
run here (PENDING with the exact reason) — a gate never silently passes.
"""

from __future__ import annotations

import abc
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from pydantic import BaseModel, ConfigDict, Field

from pipeline.errors import Error

if TYPE_CHECKING:
    from pipeline.provenance import Provenance, Subject
    from pipeline.rows import Row


class Status(str, Enum):
    """One status enum everywhere."""

    PASS = "PASS"
    FAIL = "FAIL"
    PENDING = "PENDING"
    """Cannot run here (missing hardware, weights, credentials): with the reason."""
    ERROR = "ERROR"
    """The gate itself broke, or its kind is not implemented yet."""


MetricValue = float | int | str | bool | None


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


@dataclass(frozen=True)
class Derived:
    """The pure part of a result: what `derive` computes from the raw artifacts."""

    status: Status
    reason: str
    metrics: dict[str, MetricValue] = field(default_factory=dict)
    cells: dict[str, dict[str, MetricValue]] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        return {"status": self.status.value, "reason": self.reason,
                "metrics": self.metrics, "cells": self.cells}


class Progress(Protocol):
    """Progress is passed in so gates never print (cf. pip-audit's AuditState).

    `pipeline.progress` implements it (rich bars on a terminal, plain lines in
    CI, nothing with --quiet). Long loops open a sub-task with a total::

        with ctx.progress.task(f"build {arch}", total=len(kernels)) as t:
            for k in kernels:
                t.update(f"nvcc {k}")
                ...
                t.advance()
    """

    def update(self, message: str) -> None:
        """Say what is happening now (one short line)."""

    def advance(self, total: int | None = None) -> None:
        """One step done; `total`, when given, (re)sets how many steps there are."""

    def task(self, label: str, total: int | None = None) -> AbstractContextManager["Progress"]:
        """A sub-task (builds per arch, repeats per cell, oracle runs) shown until
        the `with` block ends; the yielded `Progress` counts its own steps."""


class _SilentProgress:
    def update(self, message: str) -> None:
        pass

    def advance(self, total: int | None = None) -> None:
        pass

    def task(self, label: str, total: int | None = None) -> AbstractContextManager[Progress]:
        return nullcontext(self)


@dataclass
class GateContext:
    """What a gate gets besides its row and spec."""

    repo: Path
    """The subject repository (the commit under review)."""
    artifact_dir: Path
    """Where this gate writes its raw artifacts (`artifacts/GATE-ID/` in the stage)."""
    subject: "Subject"
    provenance: "Provenance"
    progress: Progress = field(default_factory=_SilentProgress)
    options: dict[str, str] = field(default_factory=dict)
    """Operator-given settings (e.g. an explicit nvcc path on a device machine)."""


class GateError(Error):
    """Raised by a gate's measure when the gate itself broke: becomes ERROR."""


class Gate(abc.ABC):
    """Base of every gate kind. Subclasses set `kind` and implement the three steps."""

    kind: ClassVar[str]

    def requirements(self, row: "Row", spec: Any, ctx: GateContext) -> str | None:
        """Return why this gate cannot run here (-> PENDING), or None. Must not raise."""
        return None

    @abc.abstractmethod
    def measure(self, row: "Row", spec: Any, ctx: GateContext) -> None:
        """Run and write raw artifacts under `ctx.artifact_dir`.

        Raises `GateError` when the gate itself cannot complete (-> ERROR).
        A measured failure (a warning, a mismatch) is not an exception: it is
        data that `derive` turns into FAIL.
        """

    @abc.abstractmethod
    def derive(self, row: "Row", spec: Any, artifact_dir: Path) -> Derived:
        """Compute status, reason and metrics from the raw artifacts alone. Pure.

        Raises `GateError` when the artifacts are missing or unreadable.
        """

    def arch(self, row: "Row", spec: Any, ctx: GateContext) -> tuple[str, bool]:
        """(arch measured on, is it a stand-in). Host-only gates measure no arch."""
        return "", False


def gate_device(row: "Row", spec: Any):
    """The GPU a gate runs on, as `device.select` gives it (gpu, stand_in, why_not): the
    gate's own `device` selector (e.g. `name:H100`, no stand-in allowed), else the row's
    target with its stand-in arches. The one place a gate's GPU is chosen: the
    requirement check, the arch recorded and the engines' device all ask it."""
    from pipeline import device

    own = getattr(spec, "device", "") if spec is not None else ""
    return device.select(row.target.arch, own or row.target.device,
                         [] if own else row.target.stand_in_arches)


def gate_arch(row: "Row", spec: Any) -> tuple[str, bool]:
    """`Gate.arch` of a gate that runs on the row's device: (arch of the GPU
    `gate_device` picks, whether it is a stand-in); `cpu` for a CPU row."""
    if row.target.arch == "cpu":
        return "cpu", False
    gpu, stand_in, _ = gate_device(row, spec)
    return (gpu.arch, stand_in) if gpu else ("", False)


def run_gate(gate: Gate, row: "Row", spec: Any, ctx: GateContext, bundle_root: Path,
             pending: str | None = None) -> GateResult:
    """The template every kind shares: requirements → measure → derive."""
    start = time.monotonic()
    ctx.artifact_dir.mkdir(parents=True, exist_ok=True)
    arch, stand_in = gate.arch(row, spec, ctx)

    def result(derived: Derived) -> GateResult:
        artifacts = sorted(str(p.relative_to(bundle_root)) for p in ctx.artifact_dir.rglob("*")
                           if p.is_file())
        return GateResult(gate_id=spec.id, kind=spec.kind, status=derived.status,
                          reason=derived.reason, metrics=derived.metrics, cells=derived.cells,
                          arch=arch, stand_in=stand_in, artifacts=artifacts,
                          duration_s=round(time.monotonic() - start, 3))

    why_not = pending or gate.requirements(row, spec, ctx)
    if why_not is not None:
        return result(Derived(Status.PENDING, why_not))
    try:
        gate.measure(row, spec, ctx)
        derived = gate.derive(row, spec, ctx.artifact_dir)
    except GateError as exc:
        derived = Derived(Status.ERROR, exc.diagnostics())
    return result(derived)
