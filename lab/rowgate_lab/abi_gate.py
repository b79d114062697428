"""ABI gate: the persistent decode task ABI, checked here, and the persistent-kernel
proof, run only where the trace admitted it and an sm_90 device is present.

`measure` writes, per workload concurrency, the decode step's task list as the
kernel reads it (`bN/tasks.bin.gz`, gzipped; `tasks.bin` in bundles sealed before
2026-12-02), as JSON for reviewers (`bN/tasks.json.gz`, sealed
gzipped: 1.7 MB of text a list on the probe model, ~0.1 MB gzipped), the shape and buffer
table it was validated against (`bN/plan.json.gz`) and the validator's report
(`bN/validation.json`); the admitting gate's result, copied from this bundle's
stage (`admission.json`); the device found (`device.json`); and, when it runs,
the GPU proof (`proof.json`: persistent vs eager greedy tokens per cell and
schedule, with each batch's route).

`derive` re-validates every list from `tasks.bin[.gz]` + `plan.json[.gz]`, judges the
admission with the row's stop-implementation conditions on the admitting gate,
and reads the proof. FAIL: a list refused, an admission refused, a token
mismatch. PENDING: the admitting gate is PENDING, the model is not here, or no
sm_90 device; the ABI part still runs, its lists are sealed and its counts are in the
reason (a PENDING result carries no metrics: the review reads PENDING as "not run").

The abi kind is not a device kind: its ABI part runs on any machine; the
device question is the gate's own (docs/task-abi.md, "The abi gate").
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field

import rowgate.gates.arms as _arms
from rowgate import compressed
from rowgate.errors import Error
from rowgate.gates.artifacts import admission_record, read_json, write_json
from rowgate.gates.interface import Derived, Gate, GateContext, GateError, gate_arch
from rowgate.records.criteria import StopAction
from rowgate.records.status import MetricValue, Status
from rowgate.rows.options import ENGINE_KEYS
from rowgate.rows.spec import Arm, GateSpec
from rowgate.seal.device import Inventory
from rowgate_lab.engines import DEFAULT_SCHEDULE

if TYPE_CHECKING:
    from rowgate.engines.interface import Engine
    from rowgate.models.tiny import ModelInfo
    from rowgate.records.provenance import Gpu
    from rowgate.rows.row import Row
    from rowgate_lab.megakernel.builder import ModelDims

ADMISSION = "admission.json"
MODEL = "model.json"
DEVICE = "device.json"
PROOF = "proof.json"
PERSISTENT = "lab-persistent"
"""The engine whose schedules the proof runs."""
TASKS, PLAN = "tasks.bin", "plan.json"
"""Both sealed gzipped (`compressed.gzipped`) since 2026-12-02; derive reads either form."""


class AbiGate(GateSpec):
    kind: Literal["abi"]
    abi_version: Annotated[int, Field(ge=1)] = 1
    schedules: list[Literal["static-round-robin", "dynamic-queue"]] = [
        "static-round-robin", "dynamic-queue"]
    admitted_by: str = ""
    """Trace gate whose capacity verdict must admit this work."""
    sm_count: Annotated[int, Field(gt=0)] = 132
    """SMs the task lists are sized to where no device is here (H100/H200 SXM: 132)."""
    tie_margin: Annotated[float, Field(ge=0)] = 0.0
    """Largest log-probability gap (nats) between each path's choice and the other's, at
    the first divergence, for persistent and eager parting to count as a near-tie kept
    the other way, not a mismatch (lab/rowgate_lab/megakernel/proof.py); 0 holds the tokens
    exactly equal. The row says why its value."""


def batch_dir(batch: int) -> str:
    return f"b{batch}"


class Abi(Gate[AbiGate]):
    kind = "abi"
    drives_arms = True
    shares_engines = True
    """The proof's persistent engine for the candidate's own schedule is the row run's
    candidate engine (engine_pool): started here or by a gate before, it serves the
    tokens and throughput gates after."""
    spec_model = AbiGate
    options = ENGINE_KEYS

    def arch(self, row: Row, spec: AbiGate, ctx: GateContext) -> tuple[str, bool]:
        return gate_arch(row, ctx.gpu)

    def measure(self, row: Row, spec: AbiGate, ctx: GateContext) -> None:
        out = ctx.artifact_dir
        write_json(out / ADMISSION, admission_record(spec.admitted_by, ctx.earlier))
        gpu, why_not = _device(row, spec, ctx.devices)
        write_json(out / DEVICE, {"present": gpu is not None, "why_not": why_not,
                                        **({"name": gpu.name, "arch": gpu.arch,
                                            "index": gpu.index} if gpu else {})})
        dims, info = self._model(row, out)
        if dims is None:
            return
        sm_count = _sm_count(gpu) if gpu else spec.sm_count
        for batch in row.workload.concurrency:
            ctx.progress.update(f"abi: task list for batch {batch}")
            _write_list(out / batch_dir(batch), dims, batch, sm_count, row)
        if gpu is not None and _admitted(row, spec, out)[0] == "admitted":
            self._prove(row, spec, ctx, info or _build_named(row), gpu)

    def pooled_arms(self, row: Row, spec: AbiGate) -> list[Arm]:
        return [row.arms.candidate] if _candidate_is_persistent(row) else []

    def _model(self, row: Row, out: Path) -> tuple[ModelDims | None, ModelInfo | None]:
        """(dims, model info or None): a named local spec gives dims without weights."""
        from rowgate_lab.megakernel import models

        ref = _arms.row_model(row)
        spec = None if ref.weights else models.spec_of(ref)
        if spec is not None:  # shapes are all the lists need: build nothing here
            dims = models.dims(spec)
            write_json(out / MODEL, {"resolved": True, "source": "spec",
                                           "name": ref.name, "dims": asdict(dims)})
            return dims, None
        reason = _arms.model_requirement(row)
        if reason:
            write_json(out / MODEL, {"resolved": False, "why_not": reason})
            return None, None
        info = _arms.resolve_model(row)
        dims = _dims(info.path)
        write_json(out / MODEL, {"resolved": True, "source": str(info.path),
                                       "digest": info.digest, "dims": asdict(dims)})
        return dims, info

    def _prove(self, row: Row, spec: AbiGate, ctx: GateContext, info: ModelInfo,
               gpu: Gpu) -> None:
        from rowgate_lab.megakernel import proof

        first = row.workload.input_lens[0]
        passes = [p for p in _arms.workload_passes(row, info) if p.cell.startswith(f"i{first}-")]
        ctx.progress.update(f"abi: persistent vs eager tokens on {gpu.name}")
        if ctx.engines is not None:  # its eager engine is its own: free the device first
            ctx.engines.keep_only(set())

        @contextlib.contextmanager
        def candidate() -> Iterator[Engine]:
            with _arms.started({"candidate": (row.arms.candidate, info)}, row, ctx) as up:
                yield up["candidate"]

        own = ctx.options.get("persistent_schedule", DEFAULT_SCHEDULE)
        try:
            with ctx.phase("generate"):  # the proof's passes are the evidence; its engines'
                # starts count in their own phase (nested phases count innermost)
                doc = proof.run(info.path, passes, list(spec.schedules), f"cuda:{gpu.index}",
                                row.arms.candidate.dtype, dict(ctx.options), spec.tie_margin,
                                shared=(own, candidate) if _candidate_is_persistent(row)
                                else None, starting=lambda: ctx.phase("engine start"))
        except Error as exc:
            raise GateError(f"abi: GPU proof: {exc.diagnostics()}") from exc
        write_json(ctx.artifact_dir / PROOF, doc)

    def derive(self, row: Row, spec: AbiGate, artifact_dir: Path) -> Derived:
        from rowgate_lab.megakernel.abi import ABI_VERSION

        metrics: dict[str, MetricValue] = {"abi_version": ABI_VERSION}
        fails, pending = [], []
        if spec.abi_version != ABI_VERSION:
            fails.append(f"row asks for task ABI v{spec.abi_version}; this rowgate speaks "
                         f"v{ABI_VERSION}")
        state, why = _admitted(row, spec, artifact_dir)
        metrics.update(_admission_metrics(artifact_dir), admitted=state)
        if state == "refused":
            fails.append(why)
        elif state == "pending":
            pending.append(why)
        model = read_json(artifact_dir / MODEL)
        cells: dict[str, dict[str, Any]] = {}
        if not model["resolved"]:
            pending.append(f"task lists not built: {model['why_not']}")
        else:
            cells, problems = _lists(row, artifact_dir)
            metrics.update(task_lists=len(cells), tasks=sum(c["tasks"] for c in cells.values()),
                           validator_problems=len(problems))
            fails += problems[:3] + ([f"(+{len(problems) - 3} more)"] if len(problems) > 3 else [])
        proof_state, proof_why, counts, proof_cells = _proof(artifact_dir, state)
        metrics.update(gpu_proof=proof_state, **counts)
        for cell, per_cell in proof_cells.items():
            cells.setdefault(cell, {}).update(per_cell)
        if proof_state == "mismatch":
            fails.append(proof_why)
        elif proof_state == "pending":
            pending.append(proof_why)
        if fails:
            return Derived(Status.FAIL, "; ".join(fails), metrics, cells)
        if pending:
            # A PENDING result carries no metrics (the review treats PENDING as "did not
            # run"): what the ABI part found is in the reason and the sealed artifacts.
            done = (f"{len(cells)} task list(s) valid ({metrics['tasks']} tasks, batch "
                    f"{'/'.join(str(b) for b in row.workload.concurrency)}); ") if cells else ""
            return Derived(Status.PENDING, done + "; ".join(pending))
        return Derived(Status.PASS, f"{len(cells)} task list(s) valid ({metrics['tasks']} tasks), "
                                    f"admitted by {spec.admitted_by or 'no gate'}: {why}; "
                                    f"{proof_why}", metrics, cells)


# ------------------------------------------------------------------- measure


def _candidate_is_persistent(row: Row) -> bool:
    """The row's candidate is the engine the proof runs: the proof shares its engine."""
    return row.arms.candidate.engine == PERSISTENT


def _device(row: Row, spec: AbiGate, devices: Inventory) -> tuple[Gpu | None, str]:
    """The sm_90 GPU the proof runs on: the gate's own selector or the row's device,
    never a stand-in (the proof is a property of the arch it ran on)."""
    from rowgate_lab.megakernel import fallback

    built_for = ", ".join(fallback.ARCHES)
    if row.target.arch not in fallback.ARCHES:  # a CPU row asks for no GPU at all
        return None, f"the persistent kernel is built for {built_for}, this row's target " \
                     f"is {row.target.arch}"
    gpu, _, why_not = devices.select(row.target.arch, spec.device or row.target.device, [])
    if gpu is not None and gpu.arch not in fallback.ARCHES:
        return None, f"the persistent kernel is built for {built_for}, this GPU is {gpu.arch}"
    return gpu, why_not


def _build_named(row: Row) -> ModelInfo:
    from rowgate_lab.megakernel import models

    try:
        if _arms.model_requirement(row) is None:  # the engines' own resolution, when it has one
            return _arms.resolve_model(row)
        spec = models.spec_of(_arms.row_model(row))
        if spec is None:  # unreachable: _model found this spec before the proof runs
            raise GateError("no local spec of that name")  # worded by the except below
        return models.build(spec)
    except Error as exc:
        raise GateError(f"abi: model {_arms.row_model(row).name}: {exc.diagnostics()}") from exc


def _sm_count(gpu: Gpu) -> int:
    import torch

    count: int = torch.cuda.get_device_properties(gpu.index).multi_processor_count
    return count


def _dims(model_dir: Path) -> ModelDims:
    from rowgate_lab.megakernel.builder import ModelDims

    try:
        return ModelDims.load(model_dir)
    except Error as exc:
        raise GateError(f"abi: {exc.diagnostics()}") from exc


def _write_list(d: Path, dims: ModelDims, batch: int, sm_count: int, row: Row) -> None:
    from rowgate_lab.megakernel import abi, builder
    from rowgate_lab.megakernel.validate import validate

    max_context = max(row.workload.input_lens) + row.workload.output_len
    if max_context > dims.max_position:
        raise GateError(f"abi: workload context {max_context} exceeds the model's "
                        f"max_position {dims.max_position}")
    blocks = batch * math.ceil(max_context / builder.PAGE_SIZE)
    plan = builder.build_step(dims, batch, sm_count, num_blocks=blocks, max_context=max_context)
    d.mkdir(parents=True, exist_ok=True)
    # Sealed gzipped: ~1.5 MB a list as the kernel reads it, 30-50 KB gzipped (the
    # descriptors are mostly zero words); `derive` reads either form.
    compressed.write_bytes(compressed.gzipped(d / TASKS), abi.pack(plan.tasks))
    # One task per line, compact: ~20k tasks per list (indented JSON is 10x slower).
    compressed.write_text(d / "tasks.json.gz", "[\n" + ",\n".join(
        json.dumps(abi.to_json(t), separators=(",", ":")) for t in plan.tasks) + "\n]\n")
    shape = {k: v for k, v in asdict(plan.shape).items() if k != "extra"}
    # gzipped too: the labels of ~10-14k tasks are 0.2-0.3 MB a list on the probe model
    write_json(compressed.gzipped(d / PLAN), {
        "summary": plan.summary(), "shape": shape, "num_counters": plan.num_counters,
        "buffers": [asdict(b) for b in plan.buffers], "labels": [t.label for t in plan.tasks]})
    write_json(d / "validation.json", validate(plan.tasks, plan.shape, plan.buffers,
                                                     plan.num_counters).to_json())


# -------------------------------------------------------------------- derive


def _admitted(row: Row, spec: AbiGate, artifact_dir: Path) -> tuple[str, str]:
    """("admitted" | "refused" | "pending", why) from the copied admitting result and the
    row's stop-implementation conditions on that gate."""
    rec = read_json(artifact_dir / ADMISSION)
    gate = spec.admitted_by
    if not gate:
        return "admitted", "no admitting gate declared"
    if not rec.get("found"):
        return "refused", (f"stop-implementation: admitting gate {gate!r} has no result in this "
                           f"bundle (it must run before {spec.id})")
    result = rec["result"]
    status, metrics = result["status"], result.get("metrics", {})
    if status == Status.PENDING.value:
        return "pending", f"admission pending: {gate} is PENDING ({result['reason']})"
    if status != Status.PASS.value:
        return "refused", (f"stop-implementation: {gate} is {status} ({result['reason']}); "
                           f"an implementation needs a valid trace verdict")
    stops = [s for s in row.stop_conditions
             if s.gate == gate and s.action is StopAction.STOP_IMPLEMENTATION]
    for s in stops:
        value = metrics.get(s.metric)
        if value is None:
            return "refused", f"stop-implementation: {gate} reports no {s.metric} ({s.id})"
        if s.comparison.holds(value, s.threshold):
            return "refused", (f"stop-implementation ({s.id}): {gate} {s.metric} = {value:.3g} "
                               f"{s.comparison.value} {s.threshold:g}: {s.says}")
    verdict = metrics.get("capacity_verdict")
    if verdict is not None and verdict != "material":
        return "refused", f"stop-implementation: {gate} capacity verdict {verdict!r}"
    shown = metrics.get("recoverable_idle_fraction")
    return "admitted", (f"{gate} verdict {verdict or 'n/a'}"
                        + (f", recoverable idle {shown:.1%}" if isinstance(shown, float) else ""))


def _admission_metrics(artifact_dir: Path) -> dict[str, Any]:
    rec = read_json(artifact_dir / ADMISSION)
    m = rec.get("result", {}).get("metrics", {}) if rec.get("found") else {}
    return {"admission_gate_status": rec["result"]["status"] if rec.get("found") else None,
            "recoverable_idle_fraction": m.get("recoverable_idle_fraction"),
            "capacity_verdict": m.get("capacity_verdict")}


def _lists(row: Row, artifact_dir: Path) -> tuple[dict[str, dict[str, Any]], list[str]]:
    from rowgate_lab.megakernel import abi
    from rowgate_lab.megakernel.abi import Opcode
    from rowgate_lab.megakernel.validate import Buffer, validate

    cells: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    first = row.workload.input_lens[0]
    for batch in row.workload.concurrency:
        d = artifact_dir / batch_dir(batch)
        sealed = compressed.either(d / TASKS)
        try:
            tasks = abi.unpack(compressed.read_bytes(sealed))
        except (OSError, EOFError) as exc:
            raise GateError(f"abi artifacts: {d}/{sealed.name} unreadable: {exc}") from exc
        except Error as exc:
            raise GateError(f"abi artifacts: {d}/{sealed.name}: {exc.diagnostics()}") from exc
        plan = read_json(compressed.either(d / PLAN))
        shape = abi.StepShape(**plan["shape"])
        buffers = [Buffer(**b) for b in plan["buffers"]]
        report = validate(tasks, shape, buffers, plan["num_counters"])
        problems += [f"batch {batch}: {p}" for p in report.problems]
        ops = abi.covered(tasks)  # fused lists run RMS_NORM etc. as flags of their consumers
        cells[f"i{first}-c{batch}"] = {
            "tasks": len(tasks), "counters": plan["num_counters"],
            "problems": len(report.problems), "max_splits": shape.max_splits,
            "ops_missing": len(set(Opcode) - abi.OPTIONAL - ops)}
        missing = sorted(o.name for o in set(Opcode) - abi.OPTIONAL - ops)
        if missing:
            problems.append(f"batch {batch}: the step has no {', '.join(missing)} task")
    return cells, problems


def _proof_cells(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per cell, the proof's request counts by schedule (the report's per-cell table)."""
    out: dict[str, dict[str, Any]] = {}
    for cell, by in doc.items():
        row = out.setdefault(cell, {"schedules_identical": by.get("schedules_identical", True)})
        for sched, r in by.items():
            if isinstance(r, dict):
                short = "static" if sched.startswith("static") else "dynamic"
                row.update({f"{short}_exact": r["exact_requests"], f"{short}_ties": r["tie_requests"],
                            f"{short}_mismatched": r["mismatched_requests"]})
    return out


def _proof(artifact_dir: Path, admitted: str
           ) -> tuple[str, str, dict[str, Any], dict[str, dict[str, Any]]]:
    """("passed" | "mismatch" | "pending" | "not admitted", why, request counts, per-cell
    counts)."""
    dev = read_json(artifact_dir / DEVICE)
    none = {"mismatched_requests": None}
    if admitted == "refused":
        return "not admitted", "GPU proof not run: not admitted", none, {}
    if not dev["present"]:
        return "pending", f"GPU proof pending: {dev['why_not']}", none, {}
    if admitted == "pending" or not (artifact_dir / PROOF).is_file():
        return "pending", "GPU proof pending: not admitted yet", none, {}
    doc = read_json(artifact_dir / PROOF)
    runs = [(cell, sched, r) for cell, by in doc.items() for sched, r in by.items()
            if isinstance(r, dict)]
    racy = sorted(cell for cell, by in doc.items() if not by.get("schedules_identical", True))
    counts = {k: sum(r[k] for _, _, r in runs)
              for k in ("requests", "exact_requests", "tie_requests", "mismatched_requests")}
    fell_back = sorted({b for _, _, r in runs for b, route in r["routes"].items()
                        if route["fell_back"]})
    problems = []
    bad = [(c, s, r) for c, s, r in runs if r["mismatched_requests"]]
    if bad:
        c, s, r = bad[0]
        problems.append(f"persistent tokens differ from eager: {counts['mismatched_requests']} "
                        f"request(s), first {c} {s} {r['first_divergence']}")
    if racy:
        problems.append(f"the schedules disagree (a race) in {', '.join(racy)}")
    if problems:
        return "mismatch", "; ".join(problems), counts, _proof_cells(doc)
    ties = (f", {counts['tie_requests']} parting at a near-tie within the row's tie margin"
            if counts["tie_requests"] else "")
    note = f"; fallback taken at batch {', '.join(fell_back)}" if fell_back else ""
    return "passed", (f"persistent tokens equal eager in {len(runs)} run(s): "
                      f"{counts['exact_requests']}/{counts['requests']} requests exact{ties}; "
                      f"schedules identical{note}"), counts, _proof_cells(doc)
