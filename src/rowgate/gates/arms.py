"""What the engine-driven gates (tokens, throughput, trace, accuracy) share.

The row's models (the tiny model is built here, real weights must already be on
the machine) — every one of them: the workload matrix is models x input lengths x
concurrency —, the workload passes of each (prompts from the row's pinned dataset
or random ids) and their digest, the arms by name (`resolve_arm`: a baseline or a
traced arm may be any declared arm), and the arms started once per model and gate
run, bound to the subject checkout, stopped on every way out.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rowgate.engines.interface import Engine, EngineError, WorkloadPass
from rowgate.errors import Error
from rowgate.gates.artifacts import read_json, write_json
from rowgate.gates.engine_pool import SHARING_FILE, engine_key
from rowgate.gates.interface import GateContext, GateError
from rowgate.models.tiny import ModelInfo, model_info, why_unavailable
from rowgate.models.tiny import resolve_model as model_resolve
from rowgate.rows.spec import Arm, ModelRef, cell_prefix

if TYPE_CHECKING:
    from rowgate.rows.row import Row
    from rowgate.rows.workload import DatasetPrompts

CANDIDATE_MODEL_OPTION = "candidate_model"
"""`--option candidate_model=DIR`: the candidate arm loads this model directory
instead of the row's (e.g. a quantized checkpoint); its digest is recorded."""


def row_models(row: Row) -> list[ModelRef]:
    if not row.models:
        raise GateError(f"row {row.id}: declares no [[models]]; the engine gates need one")
    return list(row.models)


def row_model(row: Row) -> ModelRef:
    return row_models(row)[0]


def model_requirement(row: Row) -> str | None:
    """PENDING reason when one of the row's models is neither buildable nor on this
    machine, or its prompt file is not."""
    if not row.models:
        return None  # measure raises: a row without a model is an ERROR, not PENDING
    for ref in row.models:
        why = why_unavailable(ref)
        if why:
            return why
    return dataset_requirement(row)


def dataset_requirement(row: Row) -> str | None:
    from rowgate.rows.datasets import DatasetRef
    from rowgate.rows.datasets import why_unavailable as dataset_missing

    ds = row.workload.dataset
    return dataset_missing(ds, Path.cwd()) if isinstance(ds, DatasetRef) else None


def resolve_arm(row: Row, name: str) -> Arm:
    """The arm a gate names: `oracle`, `candidate`, or a fallback by its `name` (or, for
    rows that named baselines by mode, its mode): what a throughput gate's `baseline`
    and a trace gate's `arms` mean."""
    named = row.arms.named()
    if name not in named:
        raise GateError(f"no arm named {name!r} in row {row.id} (arms: {', '.join(named)})")
    return named[name]


def arms_requirement(row: Row, arms: dict[str, Arm]) -> str | None:
    """PENDING reason when the model or one of `arms` ({role: arm}) cannot run here."""
    from rowgate import engines

    reason = model_requirement(row)
    if reason:
        return reason
    for role, arm in arms.items():
        why = engines.why_unavailable(arm)
        if why:
            return f"{role}: {why}"
    return None


def baseline_arm(row: Row, baseline: str) -> Arm:
    """The arm a candidate is measured against (`resolve_arm`): the oracle, the accepted
    kernel's fallback by name, or a fallback by mode (`graph`: a persistent kernel
    against CUDA-graph replay)."""
    return resolve_arm(row, baseline)


def resolve_model(row: Row, ref: ModelRef | None = None) -> ModelInfo:
    """Build the tiny model, or read the row's local weights directory (`ref`, else
    the row's first model)."""
    ref = ref or row_model(row)
    try:
        return model_resolve(ref)
    except Error as exc:
        raise GateError(f"model {ref.id}: {exc.diagnostics()}") from exc


@dataclass(frozen=True)
class ModelRun:
    """One model of the row and its share of the workload matrix."""

    ref: ModelRef
    info: ModelInfo
    passes: list[WorkloadPass]


def model_runs(row: Row, cells: list[str] | None = None) -> list[ModelRun]:
    """Every model of the row with its passes (cells `<model id>/i…-c…` when the row has
    several), restricted to `cells` when given (names outside the matrix refused)."""
    runs = []
    for ref in row_models(row):
        info = resolve_model(row, ref)
        runs.append(ModelRun(ref, info, workload_passes(row, info, ref)))
    if cells:
        known = {p.cell for r in runs for p in r.passes}
        unknown = [c for c in cells if c not in known]
        if unknown:
            raise GateError(f"cells {unknown}: not in the workload matrix "
                            f"({', '.join(sorted(known))})")
        runs = [ModelRun(r.ref, r.info, [p for p in r.passes if p.cell in cells]) for r in runs]
    return [r for r in runs if r.passes]


def candidate_model(model: ModelInfo, ctx: GateContext) -> ModelInfo:
    path = ctx.options.get(CANDIDATE_MODEL_OPTION)
    if not path:
        return model
    try:
        return model_info(Path(path))
    except Error as exc:
        raise GateError(f"--option {CANDIDATE_MODEL_OPTION}={path}: {exc.diagnostics()}") from exc


def workload_passes(row: Row, model: ModelInfo, ref: ModelRef | None = None
                    ) -> list[WorkloadPass]:
    """The passes of one model: its cells prefixed when the row has several models,
    prompts from the row's dataset tokenized with this model's tokenizer."""
    from rowgate.rows.workload import build_passes

    ids = [m.id for m in row.models]
    prefix = cell_prefix((ref or row_model(row)).id, ids) if row.models else ""
    try:
        return build_passes(row.workload, model.vocab_size, model.special_ids,
                            dataset_prompts(row, model), prefix)
    except Error as exc:
        raise GateError(f"workload: {exc.diagnostics()}") from exc


def dataset_prompts(row: Row, model: ModelInfo) -> DatasetPrompts | None:
    """The row's prompt file tokenized for `model`, or None for random-id prompts."""
    from rowgate.rows import datasets
    from rowgate.rows.workload import DatasetPrompts

    ref = row.workload.dataset
    if not isinstance(ref, datasets.DatasetRef):
        return None
    texts = datasets.load(ref, Path.cwd())
    ids = datasets.tokenize(texts, model.path / "tokenizer.json", set(model.special_ids))
    return DatasetPrompts(tuple(ref.describe().items()), tuple(tuple(i) for i in ids))


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
    """Each arm started once, or taken from the row run's engine pool (`ctx.engines`,
    `rowgate.gates.engine_pool`) when an earlier gate started the same engine; engines
    this gate started stay in the pool for the next, every other is stopped however the
    block exits. `options` (the gate's own, e.g. `endpoint`) override the operator's."""
    dev = device_name(row, ctx)
    opts = {**ctx.options, **(options or {})}
    pool = ctx.engines
    keys = {role: engine_key(arm.model_dump(mode="json"), model.path, model.digest, dev, opts,
                             ctx.repo) for role, (arm, model) in arms.items()}
    if pool is not None and pool.left_over(set(keys.values())):
        with ctx.phase("engine stop"):  # the runner could not name this gate's arms
            pool.keep_only(set(keys.values()))
    sharing: dict[str, dict[str, object]] = {}
    with contextlib.ExitStack() as stack:
        out: dict[str, Engine] = {}
        for role, (arm, model) in arms.items():
            taken = pool.take(keys[role], {id(e) for e in out.values()}) \
                if pool is not None else None
            if taken is not None:
                out[role], first = taken
                ctx.progress.update(f"{role} ({arm.engine}) on {dev}: the engine gate "
                                    f"{first} started")
                sharing[role] = {"started_by": first, "reused": True}
                continue
            out[role] = _start(role, arm, model, dev, opts, ctx)
            if pool is not None:
                pool.add(keys[role], out[role], ctx.gate_id, arm.model_dump(mode="json"))
            if pool is None or not pool.holds(out[role]):
                stack.callback(out[role].stop)
            sharing[role] = {"started_by": ctx.gate_id, "reused": False}
        if pool is not None:  # a gate that asks more than once (trace: per capture) adds
            path = ctx.artifact_dir / SHARING_FILE
            write_json(path, {**(read_json(path) if path.is_file() else {}), **sharing})
        try:
            yield out
        except BaseException:
            if pool is not None:  # its state is unknown: no later gate gets it
                pool.drop(list(out.values()))
            raise


def _start(role: str, arm: Arm, model: ModelInfo, dev: str, opts: dict[str, str],
           ctx: GateContext) -> Engine:
    from rowgate import engines

    ctx.progress.update(f"starting {role} ({arm.engine}) on {dev}")
    try:
        with ctx.phase("engine start"):
            engine = engines.create(arm, model.path, device=dev, options=opts,
                                    subject=ctx.repo)
            engine.start()
    except Error as exc:
        raise GateError(f"{role} arm ({arm.engine}) did not start: "
                        f"{exc.diagnostics()}") from exc
    return engine


def generate(engine: Engine, role: str, work: WorkloadPass) -> object:
    try:
        return engine.generate(work)
    except EngineError as exc:
        raise GateError(f"{role} arm failed on cell {work.cell}: {exc.diagnostics()}") from exc
