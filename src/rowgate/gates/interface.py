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
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

from rowgate.confine import scan_artifacts
from rowgate.errors import Error
from rowgate.gates.clock import OTHER, Phases
from rowgate.records.gate_result import GateResult, SandboxRecord
from rowgate.records.status import MetricValue, Status
from rowgate.rows.spec import Arm, GateSpec, SandboxPolicy
from rowgate.sandbox import Result as StepResult
from rowgate.sandbox import Step, describe, policy
from rowgate.sandbox import run as run_sandboxed
from rowgate.seal.device import GpuChoice, Inventory

if TYPE_CHECKING:
    from rowgate.cuda.kernels import KernelManifest
    from rowgate.gates.engine_pool import EnginePool
    from rowgate.records.provenance import Provenance, Subject
    from rowgate.rows.row import Row
    from rowgate.seal.oracle import OracleRecord

S = TypeVar("S", bound=GateSpec)


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

    `rowgate.cli.progress` implements it (rich bars on a terminal, plain lines in
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


class SignedRecords(Protocol):
    """Signed documents a gate reads but may not verify itself: signatures are the
    runner's business (`rowgate.run.runner.RecordOpener`), never a gate's."""

    def oracle_record(self, path: Path, key: Path | None) -> "OracleRecord":
        """The oracle record at `path` (a directory or its record.json), verified with
        the public key `key`, or with None the key `rowgate verify` would use here.

        Raises `Error` (unsigned, edited, renamed, another signer, malformed).
        """


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
    gpu: GpuChoice = GpuChoice(None, False, "")
    """The GPU this gate runs on, chosen once by the runner (`gate_device`) from the run's
    one enumeration: the device requirement, the arch recorded and the engines' device
    all read it; no gate enumerates NVML. The default is a CPU row's choice."""
    devices: Inventory = field(default_factory=Inventory)
    """The run's GPUs, for a gate that chooses by a rule of its own (abi: no stand-in)."""
    records: SignedRecords | None = None
    """Opens the signed records a gate reads (the tokens gate's oracle record)."""
    earlier: dict[str, GateResult] = field(default_factory=dict)
    """The results of the row's gates run before this one in this bundle, by gate id (a
    copy: the stage keeps its own). The abi and aot gates read their admitting gate's
    here; nothing on disk stands in for it (a gate's commands could write there)."""
    sandbox: SandboxPolicy = field(default_factory=SandboxPolicy)
    """How the row's subject steps run (`[sandbox]`): every one goes through `run_step`."""
    phase: Phases = field(default_factory=Phases)
    """`with ctx.phase("compile"):` — where the gate's wall time goes (sealed)."""
    gate_id: str = ""
    """The row's id for this gate (what the engine pool records as an engine's starter)."""
    engines: "EnginePool | None" = None
    """The row run's started engines (`rowgate.gates.engine_pool`): a sharing gate takes
    an arm an earlier gate started instead of starting it again. None: start and stop
    its own (plans, benchmarks, a gate run alone)."""

    deadline: float | None = None
    """`time.monotonic()` by which the row's run must end (`[budget] wall_s`); None:
    unbounded. Gates that plan rounds plan them inside `time_left()`."""

    def time_left(self) -> float | None:
        """Seconds left of the row's wall budget (never below 0); None: no budget."""
        return None if self.deadline is None else max(self.deadline - time.monotonic(), 0.0)

    def run_step(self, step: Step, *, merged: bool = False) -> StepResult:
        """Run one subject step the way the row's sandbox policy says."""
        return run_sandboxed(step, merged=merged)  # the policy `run_gate` set for the gate

    def sandbox_record(self) -> SandboxRecord:
        if not self.sandbox.confined:
            return SandboxRecord(mode="off", reason=self.sandbox.reason)
        facts = describe(gpu=self.gpu.gpu is not None)
        return SandboxRecord(mode="bubblewrap", tool=facts["tool"], version=facts["version"],
                             profile_sha256=facts["profile_sha256"])


class GateError(Error):
    """Raised by a gate's measure when the gate itself broke: becomes ERROR."""


class Gate(abc.ABC, Generic[S]):
    """Base of every gate kind: one module per kind defines its spec model and its Gate
    subclass, and its distribution names the class in the `rowgate.gates` entry points
    (`registry`). What else in rowgate needs to know about a kind reads these class facts:

    * `kind`: the `kind = "…"` of the row's [[gates]] tables (the spec's `kind` literal);
    * `spec_model`: the pydantic model a row's table of this kind validates as;
    * `needs_device`: runs on the row's target device, so the runner checks the device
      first (PENDING with the exact reason where it is absent);
    * `workload_matrix`: its cells are the workload matrix's (`i<len>-c<conc>`), so a
      criterion naming a cell must name one of the matrix;
    * `arm_fields`: its spec keys that name arms of the row (checked when a row loads);
    * `report_view`: the report's richer view of its results (`rowgate.report.sections`
      `VIEWS`), "" for the generic view alone;
    * `options`: the `--option` keys it reads from `ctx.options`, itself or through the
      engines and toolchains it starts (`rowgate.rows.options` says what each does; a key
      no gate of a row reads is refused).
    """

    kind: ClassVar[str]
    spec_model: ClassVar[type[GateSpec]]
    needs_device: ClassVar[bool] = False
    workload_matrix: ClassVar[bool] = False
    drives_arms: ClassVar[bool] = False
    """It starts the row's arms (engines): a row with such a gate must declare [arms]
    and [workload]."""
    shares_engines: ClassVar[bool] = False
    """Its arms come from the row run's engine pool (`gates.arms.started`). A gate that
    drives arms without it starts its own (the trace gate: the profiler is set before
    start); the runner empties the pool before such a gate, freeing the device."""
    arm_fields: ClassVar[tuple[str, ...]] = ()
    """Spec keys that name arms of the row (a throughput `baseline`, a trace's `arms`):
    the row checks each names one (`Arms.named`)."""
    report_view: ClassVar[str] = ""
    options: ClassVar[tuple[str, ...]] = ()
    subject_steps: ClassVar[bool] = False
    """Runs or compiles the subject's code (through `ctx.run_step`): its result records
    the sandbox it ran in."""

    def requirements(self, row: "Row", spec: S, ctx: GateContext) -> str | None:
        """Return why this gate cannot run here (-> PENDING), or None. Must not raise."""
        return None

    def pooled_arms(self, row: "Row", spec: S) -> list[Arm]:
        """The arms it will ask the row run's engine pool for (`shares_engines`), as it
        will start them: the runner keeps their engines up through the gates before it
        (`EnginePool.expect`). May raise GateError for an arm the row lacks."""
        return []

    @abc.abstractmethod
    def measure(self, row: "Row", spec: S, ctx: GateContext) -> None:
        """Run and write raw artifacts under `ctx.artifact_dir`.

        Raises `GateError` when the gate itself cannot complete (-> ERROR).
        A measured failure (a warning, a mismatch) is not an exception: it is
        data that `derive` turns into FAIL.
        """

    @abc.abstractmethod
    def derive(self, row: "Row", spec: S, artifact_dir: Path) -> Derived:
        """Compute status, reason and metrics from the raw artifacts alone. Pure.

        Raises `GateError` when the artifacts are missing or unreadable.
        """

    def arch(self, row: "Row", spec: S, ctx: GateContext) -> tuple[str, bool]:
        """(arch measured on, is it a stand-in). Host-only gates measure no arch."""
        return "", False

    reads_kernels: ClassVar[bool] = False
    """Whether the gate reads the subject's kernels.toml (`--plan` then parses it)."""

    def check_declarations(self, row: "Row", spec: S, manifest: "KernelManifest") -> list[str]:
        """Resolve and check everything this gate will read of the subject's kernels.toml
        (`rowgate gate --plan`): GateError (one line) for a declaration that does not
        hold; else what it resolved, one line each. Default: nothing to check."""
        return []

    def estimate(self, row: "Row", spec: S) -> list[str]:
        """What the row alone says of the gate's work and time (`rowgate gate --plan`),
        one line each, such as a throughput gate's time budgets. Default: nothing."""
        return []


def gate_device(row: "Row", spec: GateSpec, devices: Inventory) -> GpuChoice:
    """The GPU a gate runs on: the gate's own `device` selector (e.g. `name:H100`, no
    stand-in allowed), else the row's target with its stand-in arches. The one rule
    of a gate's GPU; the runner applies it once per gate (`GateContext.gpu`)."""
    own = spec.device
    return devices.select(row.target.arch, own or row.target.device,
                          [] if own else row.target.stand_in_arches)


def gate_arch(row: "Row", gpu: GpuChoice) -> tuple[str, bool]:
    """`Gate.arch` of a gate that runs on the row's device: (arch of the GPU chosen for
    it, whether it is a stand-in); `cpu` for a CPU row."""
    if row.target.arch == "cpu":
        return "cpu", False
    return (gpu.gpu.arch, gpu.stand_in) if gpu.gpu else ("", False)


def run_gate(gate: Gate[Any], row: "Row", spec: GateSpec, ctx: GateContext, bundle_root: Path,
             pending: str | None = None, refused: str | None = None) -> GateResult:
    """The template every kind shares: requirements → measure → derive. `refused`: why
    the gate is not run at all (the row's wall budget is spent): ERROR saying so."""
    start = time.monotonic()
    ctx.artifact_dir.mkdir(parents=True, exist_ok=True)
    arch, stand_in = gate.arch(row, spec, ctx)

    def result(derived: Derived) -> GateResult:
        # What the gate's commands left is scanned, links never followed: an entry that
        # cannot be sealed (a link, FIFO, socket, device, a name that is not UTF-8) makes
        # the gate ERROR naming it, and only regular files are listed for the seal.
        prefix = ctx.artifact_dir.relative_to(bundle_root).as_posix()
        artifacts, problems = scan_artifacts(ctx.artifact_dir, prefix)
        if problems:
            more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
            derived = Derived(Status.ERROR, problems[0] + more)
        return GateResult(gate_id=spec.id, kind=spec.kind, status=derived.status,
                          reason=derived.reason, metrics=derived.metrics, cells=derived.cells,
                          arch=arch, stand_in=stand_in, artifacts=artifacts,
                          duration_s=round(time.monotonic() - start, 3),
                          phases=ctx.phase.rounded(),
                          sandbox=ctx.sandbox_record() if gate.subject_steps else None)

    if refused:
        return result(Derived(Status.ERROR, refused))
    # a PENDING reason names everything missing: the device and what the gate itself needs
    with ctx.phase("requirements"):  # imports, engine and model checks: not free
        needs = gate.requirements(row, spec, ctx)
    missing = list(dict.fromkeys(r for r in (pending, needs) if r))
    if missing:
        return result(Derived(Status.PENDING, "; ".join(missing)))
    try:
        measuring = time.monotonic()
        try:
            with policy(ctx.sandbox.confined):  # every subject step of the gate obeys the row
                gate.measure(row, spec, ctx)
        finally:
            other = time.monotonic() - measuring - ctx.phase.named()
            if other > 0:
                ctx.phase.seconds[OTHER] = ctx.phase.seconds.get(OTHER, 0.0) + other
        with ctx.phase("derive"):
            derived = gate.derive(row, spec, ctx.artifact_dir)
    except GateError as exc:
        derived = Derived(Status.ERROR, exc.diagnostics())
    return result(derived)
