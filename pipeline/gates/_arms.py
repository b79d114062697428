"""What the engine-driven gates (tokens, throughput, accuracy) share.

The row's model (the tiny model is built here, real weights must already be on
the machine), the workload passes and their digest, and the arms started once
per gate run and stopped on every way out.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.engines.interface import Engine, EngineError, WorkloadPass
from pipeline.errors import Error
from pipeline.gates.interface import GateContext, GateError
from pipeline.model import ModelInfo, model_info, why_unavailable
from pipeline.model import resolve_model as model_resolve
from pipeline.rowspec import Arm, ModelRef

if TYPE_CHECKING:
    from pipeline.rows import Row

CANDIDATE_MODEL_OPTION = "candidate_model"
"""`--option candidate_model=DIR`: the candidate arm loads this model directory
instead of the row's (e.g. a quantized checkpoint); its digest is recorded."""


def row_model(row: Row) -> ModelRef:
    if not row.models:
        raise GateError(f"row {row.id}: declares no [[models]]; the engine gates need one")
    return row.models[0]


def model_requirement(row: Row) -> str | None:
    """PENDING reason when the row's model is neither buildable nor on this machine."""
    if not row.models:
        return None  # measure raises: a row without a model is an ERROR, not PENDING
    return why_unavailable(row.models[0])


def arms_requirement(row: Row, arms: dict[str, Arm]) -> str | None:
    """PENDING reason when the model or one of `arms` ({role: arm}) cannot run here."""
    from pipeline import engines

    reason = model_requirement(row)
    if reason:
        return reason
    for role, arm in arms.items():
        why = engines.why_unavailable(arm)
        if why:
            return f"{role}: {why}"
    return None


def baseline_arm(row: Row, baseline: str) -> Arm:
    """The arm a candidate is measured against: the oracle, or the fallback whose mode
    is `baseline` (e.g. `graph`: a persistent kernel against CUDA-graph replay)."""
    if baseline == "oracle":
        return row.arms.oracle
    for arm in row.arms.fallbacks:
        if arm.mode == baseline:
            return arm
    modes = ", ".join(a.mode for a in row.arms.fallbacks) or "none"
    raise GateError(f"baseline {baseline!r}: the row has no fallback arm in that mode "
                    f"(fallback modes: {modes})")


def resolve_model(row: Row) -> ModelInfo:
    """Build the tiny model, or read the row's local weights directory."""
    ref = row_model(row)
    try:
        return model_resolve(ref)
    except Error as exc:
        raise GateError(f"model {ref.id}: {exc.diagnostics()}") from exc


def candidate_model(model: ModelInfo, ctx: GateContext) -> ModelInfo:
    path = ctx.options.get(CANDIDATE_MODEL_OPTION)
    if not path:
        return model
    try:
        return model_info(Path(path))
    except Error as exc:
        raise GateError(f"--option {CANDIDATE_MODEL_OPTION}={path}: {exc.diagnostics()}") from exc


def workload_passes(row: Row, model: ModelInfo) -> list[WorkloadPass]:
    from pipeline.workload import build_passes

    try:
        return build_passes(row.workload, model.vocab_size, model.special_ids)
    except Error as exc:
        raise GateError(f"workload: {exc.diagnostics()}") from exc


def select_cells(passes: list[WorkloadPass], cells: list[str]) -> list[WorkloadPass]:
    """The passes of `cells` (all when empty), refusing names not in the matrix."""
    if not cells:
        return passes
    known = {p.cell for p in passes}
    unknown = [c for c in cells if c not in known]
    if unknown:
        raise GateError(f"cells {unknown}: not in the workload matrix ({', '.join(sorted(known))})")
    return [p for p in passes if p.cell in cells]


def device_name(row: Row, ctx: GateContext) -> str:
    """`cpu` for a CPU row, else `cuda:N` for the GPU the runner chose for the gate
    (`ctx.gpu`)."""
    if row.target.arch == "cpu":
        return "cpu"
    gpu, _, why_not = ctx.gpu
    if gpu is None:
        raise GateError(f"no device: {why_not}")
    return f"cuda:{gpu.index}"


def gpu_index(row: Row, ctx: GateContext) -> int | None:
    name = device_name(row, ctx)
    return int(name.split(":")[1]) if name.startswith("cuda:") else None


@contextlib.contextmanager
def started(arms: dict[str, tuple[Arm, ModelInfo]], row: Row, ctx: GateContext,
            options: dict[str, str] | None = None) -> Iterator[dict[str, Engine]]:
    """Start each arm once; stop every started arm however the block exits.
    `options` (the gate's own, e.g. `endpoint`) override the operator's."""
    from pipeline import engines

    dev = device_name(row, ctx)
    opts = {**ctx.options, **(options or {})}
    with contextlib.ExitStack() as stack:
        out: dict[str, Engine] = {}
        for role, (arm, model) in arms.items():
            ctx.progress.update(f"starting {role} ({arm.engine.value}) on {dev}")
            try:
                engine = engines.create(arm, model.path, device=dev, options=opts)
                stack.enter_context(engine)
            except Error as exc:
                raise GateError(f"{role} arm ({arm.engine.value}) did not start: "
                                f"{exc.diagnostics()}") from exc
            out[role] = engine
        yield out


def generate(engine: Engine, role: str, work: WorkloadPass) -> object:
    try:
        return engine.generate(work)
    except EngineError as exc:
        raise GateError(f"{role} arm failed on cell {work.cell}: {exc.diagnostics()}") from exc
