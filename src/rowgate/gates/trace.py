"""Trace gate: one delayed profiler range per arm, mode and model, refused unless valid,
then executing path, launch gaps, idle breakdown, wave tails, bandwidth and recoverable
idle capacity, the CUDA-graph route proof, the row's seams, the capacity verdict, and
the traced tokens matched to the tokens gate's pass of the same requests.

Any arm: rowgate's reference engine is captured in rowgate's process
(`rowgate.trace.capture`); vLLM (offline or its server) and any OpenAI server with
vLLM's profiling endpoints through their own profiler (`rowgate.trace.engine_capture`,
the same procedure counted in the engine's iterations). An arm that cannot be traced
(llama.cpp: no profiling endpoints) is refused before anything starts.

`measure` captures into `[MODEL/]ARM-MODE/` (raw trace, clock samples, capture record
with the copy ceiling and the timed pass's outputs; an engine's phase log) and writes
the reviewer files (`rowgate.trace.captures`). `derive` redoes validity, analysis,
seams, verdict and windows from the raw files alone (and the tokens gate's outputs
beside them in the bundle).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

import rowgate.gates.arms as _arms
from rowgate.errors import Error
from rowgate.gates.interface import Derived, Gate, GateContext, GateError, gate_arch
from rowgate.records.status import MetricValue, Status
from rowgate.rows.options import ENGINE_KEYS
from rowgate.rows.spec import Arm, GateSpec, cell_prefix

if TYPE_CHECKING:
    from rowgate.gates.arms import ModelRun
    from rowgate.models.tiny import ModelInfo
    from rowgate.rows.row import Row
    from rowgate.trace.capture import CapturePlan
    from rowgate.trace.captures import Judging

CELL_METRICS = ("recoverable_idle_fraction", "gap_fraction", "tail_fraction",
                "bandwidth_fraction", "idle_fraction")


class SeamSpec(BaseModel):
    """A part of an arm's executing path its trace must show (`rowgate.trace.seams`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    arm: str
    """The arm (by name) whose range must contain it."""
    name: str
    """What the row calls it, e.g. `ModelRegistry::Forward`."""
    kind: Literal["range", "kernel"] = "range"
    """`range`: a host / NVTX range or annotation; `kernel`: device kernels by name."""
    pattern: str = ""
    """Regular expression searched in event names; empty: `name` literally."""


class TraceGate(GateSpec):
    kind: Literal["trace"]
    modes: list[Literal["eager", "graph", "graph-fused", "persistent"]] = ["graph"]
    """Each arm is traced in each of these modes; empty: each arm in its own declared
    mode (for engines that run one mode, e.g. a graph-fused baseline)."""
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
    arms: list[str] = ["oracle", "candidate"]
    """The arms traced, by name: `oracle`, `candidate` or a fallback's name."""
    seams: list[SeamSpec] = []
    """Ranges and kernels each arm's range must contain; a missing one fails the gate."""


def judging(spec: TraceGate) -> Judging:
    from rowgate.trace.captures import Judging
    from rowgate.trace.seams import Seam

    seams = tuple((arm, tuple(Seam(s.name, s.kind, s.pattern) for s in spec.seams
                              if s.arm == arm))
                  for arm in dict.fromkeys(s.arm for s in spec.seams))
    return Judging(arm_delay=spec.arm_delay, steps=spec.steps,
                   clock_tolerance=spec.clock_tolerance,
                   material_idle_fraction=spec.material_idle_fraction,
                   graph_route_proof=spec.graph_route_proof, seams=seams)


def _prefixes(row: Row) -> list[str]:
    ids = [m.id for m in row.models]
    return [cell_prefix(i, ids) for i in ids] or [""]


def traced_arms(row: Row, spec: TraceGate) -> list[tuple[str, Arm]]:
    """(arm name, the arm in the mode it is traced in) of every capture of one model, in
    capture order: each arm in each of the gate's `modes`, or in its own. GateError for
    an arm the row lacks."""
    from rowgate.trace import captures

    arms = {name: _arms.resolve_arm(row, name) for name in spec.arms}
    pairs = (captures.pairs(spec.arms, spec.modes) if spec.modes
             else [(name, arm.mode) for name, arm in arms.items()])
    return [(name, arms[name].model_copy(update={"mode": mode})) for name, mode in pairs]


def arm_modes(row: Row, spec: TraceGate) -> list[tuple[str, str]]:
    """(arm name, mode) of every capture of one model, in capture order."""
    return [(name, arm.mode) for name, arm in traced_arms(row, spec)]


def captured(row: Row, spec: TraceGate) -> list[tuple[str, str]]:
    """(label, mode) of every capture: the label is `[MODEL/]ARM`."""
    return [(prefix + arm, mode) for prefix in _prefixes(row)
            for arm, mode in arm_modes(row, spec)]


def traced_cell(row: Row, spec: TraceGate, prefix: str = "") -> str:
    return f"{prefix}i{row.workload.input_lens[0]}-c{spec.warm_concurrency}"


class Trace(Gate[TraceGate]):
    kind = "trace"
    drives_arms = True
    shares_engines = True
    """An in-process engine is traced as started (its profiler and markers come off
    after), so it comes from the row run's pool and stays for the gates after; an engine
    whose profiler is set before start (a server, vLLM) is started here and stopped."""
    spec_model = TraceGate
    needs_device = True
    workload_matrix = True
    arm_fields = ("arms",)
    report_view = "trace"
    options = ENGINE_KEYS

    def requirements(self, row: Row, spec: TraceGate, ctx: GateContext) -> str | None:
        try:
            arms = {name: _arms.resolve_arm(row, name) for name in spec.arms}
        except GateError:
            return None  # measure raises: a row naming a missing arm is an ERROR
        return _arms.arms_requirement(row, arms)

    def arch(self, row: Row, spec: TraceGate, ctx: GateContext) -> tuple[str, bool]:
        return gate_arch(row, ctx.gpu)

    def pooled_arms(self, row: Row, spec: TraceGate) -> list[Arm]:
        from rowgate import engines

        return [arm for _, arm in traced_arms(row, spec) if engines.plugin(arm.engine).in_process]

    def measure(self, row: Row, spec: TraceGate, ctx: GateContext) -> None:
        from rowgate import engines
        from rowgate.trace import captures
        from rowgate.trace.capture import CapturePlan

        arms = traced_arms(row, spec)
        for name, arm in arms:  # before any engine starts or any GPU time is spent
            why = engines.why_untraceable(arm) or engines.why_not_mode(arm)
            if why:
                raise GateError(f"trace: arm {name} cannot be traced: {why} (mode {arm.mode})")
        plan = CapturePlan(concurrency=spec.warm_concurrency, primer_steps=spec.primer_steps,
                           primer_concurrency=spec.primer_concurrency,
                           arm_delay=spec.arm_delay, steps=spec.steps)
        with ctx.phase("model"):  # resolved, or built from its seed on a fresh machine
            runs = _arms.model_runs(row)
        for run, prefix in zip(runs, _prefixes(row)):
            prompts, sources = self._prompts(row, run, spec)
            for name, arm in arms:
                self._capture(row, ctx, prefix + name, arm, run.info, plan, prompts, sources)
        ctx.progress.update("trace: analysis and reviewer files")
        try:
            with ctx.phase("analysis"):
                results = captures.analyse(judging(spec), ctx.artifact_dir, captured(row, spec))
                captures.write_reviewer_files(results, ctx.artifact_dir, row.id)
        except Error as exc:
            raise GateError(f"trace: {exc.diagnostics()}") from exc

    def _capture(self, row: Row, ctx: GateContext, label: str, arm: Arm, model: ModelInfo,
                 plan: CapturePlan, prompts: list[tuple[int, ...]], sources: list[str]) -> None:
        from rowgate import engines
        from rowgate.trace.capture import capture
        from rowgate.trace.engine_capture import capture_engine

        device, gpu = _arms.device_name(row, ctx), _arms.gpu_index(row, ctx)
        out = ctx.artifact_dir / f"{label}-{arm.mode}"
        ctx.progress.update(f"trace: {label} {arm.mode} ({arm.engine}) on {device}")
        try:
            if engines.plugin(arm.engine).in_process:  # stepped in this process, as started
                with _arms.started({f"{label}-{arm.mode}": (arm, model)}, row,
                                   ctx) as started:
                    with ctx.phase("capture"):
                        capture(next(iter(started.values())), prompts, plan, out, device,
                                gpu, sources)
                return
            if ctx.engines is not None:  # its own engine: free the device of unused ones
                ctx.engines.keep_only(set())
            with ctx.phase("engine start"):
                engine = engines.create(arm, model.path, device=device,
                                        options=dict(ctx.options), subject=ctx.repo)
            with ctx.phase("capture"):  # traced by its own profiler, which writes the trace
                capture_engine(engine, prompts, plan, out, device, gpu, sources)
        except Error as exc:
            raise GateError(f"trace: {label} {arm.mode}: {exc.diagnostics()}") from exc

    def _prompts(self, row: Row, run: ModelRun, spec: TraceGate
                 ) -> tuple[list[tuple[int, ...]], list[str]]:
        """The distinct prompts of the first input length, and the workload request each
        first came from (the traced tokens are matched to that request's)."""
        need = max(spec.warm_concurrency, spec.primer_concurrency)
        first = traced_cell(row, spec).split("-")[0] + "-"
        seen: dict[tuple[int, ...], str] = {}
        for p in run.passes:
            if p.cell.split("/")[-1].startswith(first):
                for r in p.requests:
                    seen.setdefault(r.prompt_ids, r.id)
        if len(seen) < need:
            raise GateError(f"trace: the workload gives {len(seen)} distinct "
                            f"{first.rstrip('-')} prompt(s); concurrency {need} needs {need} "
                            f"(raise workload.requests_per_cell)")
        return list(seen), list(seen.values())

    def derive(self, row: Row, spec: TraceGate, artifact_dir: Path) -> Derived:
        from rowgate.trace import captures, windows

        which = captured(row, spec)
        try:
            results = captures.analyse(judging(spec), artifact_dir, which)
            records = {f"{r.role} {r.mode}": captures.read_record(artifact_dir / r.name)
                       for r in results}
        except Error as exc:
            raise GateError(f"trace artifacts in {artifact_dir}: {exc.diagnostics()}") from exc
        s = captures.summarize(results, judging(spec))
        metrics: dict[str, Any] = dict(s.metrics)
        refused: list[str] = []
        docs: dict[str, dict[str, Any]] = {}
        # Captures sealed before format 2 keep the verdict they had: no windows, no route
        # count (their records cannot support them).
        if all(rec.get("format", 1) >= 2 for rec in records.values()):
            docs = {name: windows.check(row, rec, name.split()[0].split("/")[-1], artifact_dir,
                                        spec.id)
                    for name, rec in records.items()}
            window_metrics, refused = windows.summary(docs)
            metrics.update(window_metrics, eager_launches_in_range=captures.eager_launches(
                results))
        cells: dict[str, dict[str, MetricValue]] = {}
        for prefix in _prefixes(row):
            chosen = captures.verdict_from([r for r in results if r.role.startswith(prefix)])
            if chosen is not None:
                p = f"{chosen.role}.{chosen.mode}."
                cells[traced_cell(row, spec, prefix)] = {k: s.metrics[p + k]
                                                         for k in CELL_METRICS}
        if refused:
            reason = "; ".join(refused) + ("" if s.ok else f"; {s.reason}")
            return Derived(Status.FAIL, reason, metrics, cells)
        unchecked = sorted({d["why"] for d in docs.values() if not d["checked"]})
        reason = s.reason + ("" if not docs else
                             f"; traced tokens not matched: {'; '.join(unchecked)}" if unchecked
                             else "; traced tokens match the tokens gate's")
        return Derived(Status.PASS if s.ok else Status.FAIL, reason, metrics, cells)
