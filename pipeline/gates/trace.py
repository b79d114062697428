"""Trace gate: one delayed profiler range per arm and mode, refused unless valid, then
executing path, launch gaps, idle breakdown, wave tails, bandwidth and recoverable
idle capacity, the CUDA-graph route proof, and the capacity verdict.

`measure` captures (`pipeline.trace.capture`) into `ROLE-MODE/` (raw trace,
clock samples, capture record with the copy ceiling) and writes the reviewer
files (`pipeline.trace.captures`). `derive` redoes validity, analysis and the
verdict from the raw files alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import Field

import pipeline.gates._arms as _arms
from pipeline.errors import Error
from pipeline.gates.interface import Derived, Gate, GateContext, GateError, gate_arch
from pipeline.gates.registry import register
from pipeline.options import ENGINE_KEYS
from pipeline.records.status import Status
from pipeline.rowspec import EngineKind, GateSpec

if TYPE_CHECKING:
    from pipeline.rows import Row

CELL_METRICS = ("recoverable_idle_fraction", "gap_fraction", "tail_fraction",
                "bandwidth_fraction", "idle_fraction")


class TraceGate(GateSpec):
    kind: Literal["trace"]
    modes: list[Literal["eager", "graph", "graph-fused", "persistent"]] = ["graph"]
    warm_concurrency: Annotated[int, Field(gt=0)] = 1
    primer_steps: Annotated[int, Field(ge=0)] = 256
    primer_concurrency: Annotated[int, Field(gt=0)] = 1
    arm_delay: Annotated[int, Field(ge=0)] = 257
    """Step at which the profiler arms; activation follows immediately before
    the timed execution, so exactly one range is captured."""
    steps: Annotated[int, Field(gt=0)] = 32
    clock_tolerance: Annotated[float, Field(ge=0)] = 0.02
    """Max relative SM-clock spread inside the range."""
    graph_route_proof: bool = False
    material_idle_fraction: Annotated[float, Field(ge=0, le=1)] = 0.10
    """Recoverable idle capacity at or above this fraction of step time is material."""
    arms: list[Literal["oracle", "candidate"]] = ["oracle", "candidate"]


def judging(spec: TraceGate):
    from pipeline.trace.captures import Judging

    return Judging(arm_delay=spec.arm_delay, steps=spec.steps,
                   clock_tolerance=spec.clock_tolerance,
                   material_idle_fraction=spec.material_idle_fraction,
                   graph_route_proof=spec.graph_route_proof)


def traced_cell(row: Row, spec: TraceGate) -> str:
    return f"i{row.workload.input_lens[0]}-c{spec.warm_concurrency}"


@register
class Trace(Gate[TraceGate]):
    kind = "trace"
    spec_model = TraceGate
    needs_device = True
    workload_matrix = True
    report_view = "trace"
    options = ENGINE_KEYS

    def requirements(self, row: Row, spec: TraceGate, ctx: GateContext) -> str | None:
        return _arms.model_requirement(row)

    def arch(self, row: Row, spec, ctx: GateContext) -> tuple[str, bool]:
        return gate_arch(row, ctx.gpu)

    def measure(self, row: Row, spec: TraceGate, ctx: GateContext) -> None:
        from pipeline import engines
        from pipeline.trace import captures
        from pipeline.trace.capture import CapturePlan, capture

        for role in spec.arms:
            arm = getattr(row.arms, role)
            if arm.engine is not EngineKind.REFERENCE:
                raise GateError(f"trace: arm {role} is engine {arm.engine.value!r}; the capture "
                                f"steps the reference engine only (another engine's decode loop "
                                f"is out of this profiler's reach)")
        model = _arms.resolve_model(row)
        device, gpu = _arms.device_name(row, ctx), _arms.gpu_index(row, ctx)
        prompts = self._prompts(row, model, spec)
        plan = CapturePlan(concurrency=spec.warm_concurrency, primer_steps=spec.primer_steps,
                           primer_concurrency=spec.primer_concurrency,
                           arm_delay=spec.arm_delay, steps=spec.steps)
        which = captures.pairs(spec.arms, spec.modes)
        for role, mode in which:
            arm = getattr(row.arms, role).model_copy(update={"mode": mode})
            ctx.progress.update(f"trace: {role} {mode} on {device}")
            try:
                with engines.create(arm, model.path, device=device,
                                    options=dict(ctx.options)) as engine:
                    capture(engine, prompts, plan, ctx.artifact_dir / f"{role}-{mode}",
                            device, gpu)
            except Error as exc:
                raise GateError(f"trace: {role} {mode}: {exc.diagnostics()}") from exc
        ctx.progress.update("trace: analysis and reviewer files")
        try:
            results = captures.analyse(judging(spec), ctx.artifact_dir, which)
            captures.write_reviewer_files(results, ctx.artifact_dir, row.id)
        except Error as exc:
            raise GateError(f"trace: {exc.diagnostics()}") from exc

    def _prompts(self, row: Row, model, spec: TraceGate) -> list[tuple[int, ...]]:
        need = max(spec.warm_concurrency, spec.primer_concurrency)
        first = row.workload.input_lens[0]
        prompts = [r.prompt_ids for p in _arms.workload_passes(row, model)
                   if p.cell.startswith(f"i{first}-") for r in p.requests]
        unique = list(dict.fromkeys(prompts))
        if len(unique) < need:
            raise GateError(f"trace: the workload gives {len(unique)} distinct i{first} "
                            f"prompt(s); concurrency {need} needs {need} "
                            f"(raise workload.requests_per_cell)")
        return unique

    def derive(self, row: Row, spec: TraceGate, artifact_dir: Path) -> Derived:
        from pipeline.trace import captures

        try:
            results = captures.analyse(judging(spec), artifact_dir,
                                       captures.pairs(spec.arms, spec.modes))
        except Error as exc:
            raise GateError(f"trace artifacts in {artifact_dir}: {exc.diagnostics()}") from exc
        s = captures.summarize(results, judging(spec))
        cells = {}
        if s.verdict is not None:
            p = f"{s.verdict.role}.{s.verdict.mode}."
            cells[traced_cell(row, spec)] = {k: s.metrics[p + k] for k in CELL_METRICS}
        return Derived(Status.PASS if s.ok else Status.FAIL, s.reason, s.metrics, cells)
