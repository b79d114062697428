"""Operator gate: a subject's candidate kernel against its baseline, bit for bit, on
randomized page tables, and both against rowgate's fp64 reference (docs/contracts.md).

The subject's kernels.toml declares the operator (`[operators.NAME]`: the contract, the
kernel, the baseline and candidate entry points, the shapes); the gate takes the cubin
the row's build gate produced from the gated commit for the device's arch (its digest
recorded and checked, never a rebuild) and drives its entry points through the
contract. measure: refuse, in one line, shapes the operator does not declare and entry
points the build lacks; run every case of the spec in a sandboxed kernel child (seeds
recorded, outputs poisoned and guarded, workspace poisoned, inputs checked after each
launch, roles alternating per case; the reference and the comparison in rowgate's own
process); write `cubin.json`, the
per-case records (`cases.json.gz`, `cases.csv.gz`) and the interleaved timing samples
(`timing.json`). derive: pure arithmetic over those files, the cubin re-hashed where
the bundle holds it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field

from rowgate import compressed
from rowgate.errors import Error
from rowgate.gates._built import build_gate_id, built_cubin, declarations, digest_problem, missing_entries
from rowgate.gates.artifacts import read_json
from rowgate.gates.interface import Derived, Gate, GateContext, GateError, gate_arch
from rowgate.ops import cases, launch
from rowgate.records.status import MetricValue, Status
from rowgate.rows.options import TOOLCHAIN_KEYS
from rowgate.rows.spec import GateSpec, Tolerance

if TYPE_CHECKING:
    from rowgate.cuda.kernels import KernelManifest
    from rowgate.gates._built import BuiltKernel
    from rowgate.ops.contract import Operator as ContractOperator
    from rowgate.rows.row import Row

CASES = "cases.json"
TIMING = "timing.json"
CUBIN = "cubin.json"


class OperatorGate(GateSpec):
    kind: Literal["operator"]
    operator: str = ""
    """The `[operators.NAME]` of the subject's kernels.toml; empty: the only one."""
    candidate: str = ""
    """Which of the operator's candidate patterns; empty: the only one."""
    baseline: str = ""
    """Ignored: the operator's declaration names its baseline. Accepted so that rows
    sealed by earlier rowgates (which named variants here) still load."""
    build: str = ""
    """The build gate whose cubins are measured; empty: the row's one build gate."""
    batches: list[Annotated[int, Field(gt=0)]] = [1, 4, 8, 12, 16]
    layouts: list[Literal["uniform", "ragged"]] = ["uniform", "ragged"]
    contexts: list[Annotated[str, Field(pattern=r"^(page[+-]1|page|[0-9]+(\.[0-9]+)?K?)$")]] = [
        "1", "page-1", "page", "page+1", "1024", "16384", "17.8K"]
    page_sizes: list[Annotated[int, Field(gt=0)]] = [16, 64]
    kv_dtypes: list[Literal["bf16", "e5m2"]] = ["bf16", "e5m2"]
    heads: list[Annotated[list[int], Field(min_length=2, max_length=2)]] = [[32, 8], [8, 1]]
    head_dims: list[Annotated[int, Field(ge=16, le=256, multiple_of=16)]] = [128, 64]
    seeds: list[int] = [0, 1]
    tolerance: Tolerance = Tolerance()
    timing_repeats: Annotated[int, Field(ge=9)] = 9


def declared(manifest: KernelManifest, spec: OperatorGate
             ) -> tuple[ContractOperator, str, set[str]]:
    """(contract Operator, its kernel, the entry points the cases launch) from a
    kernels.toml: the operator declared, every case of the spec expressible by it.
    Raises GateError (one line). What `--plan` checks against the subject."""
    try:
        from rowgate.ops import operator_ab
    except ImportError as exc:  # torch installed but unusable (a missing libcudnn, say)
        raise GateError(f"operator gate: torch does not import here ({exc})") from None

    try:
        name, decl = manifest.operator(spec.operator)
        op = decl.to_contract(name)
        made = cases.cases(spec)
        operator_ab.check_expressible(op, made)
        wanted = {n for c in made
                  for e in op.entries(c.kv, c.dim, c.hq // c.hkv, spec.candidate).values()
                  for n in op.launchable(e)}
    except (Error, ValueError) as exc:
        text = exc.diagnostics() if isinstance(exc, Error) else str(exc)
        raise GateError(f"operator gate: {text}") from exc
    return op, decl.kernel, wanted


def resolve(row: Row, spec: OperatorGate, artifacts_root: Path, arch: str
            ) -> tuple[ContractOperator, BuiltKernel, str]:
    """(contract Operator, BuiltKernel, the build gate's id) for this gate on `arch`, with
    every case expressible and every entry point built. Raises GateError (one line)."""
    build_id = build_gate_id(row, spec, spec.build)
    build_dir = artifacts_root / build_id
    op, kernel, wanted = declared(declarations(build_dir), spec)
    built = built_cubin(build_dir, kernel, arch)
    missing_entries(built, wanted, f"operator {op.name}")
    return op, built, build_id


HARNESS_COPY = "harness.py"


def _seal_harness(ctx: GateContext, op: ContractOperator, record: dict[str, Any]) -> Path | None:
    """A harness operator's file (confined in the subject, as kernels.toml named it),
    copied into the gate's artifacts and its digest recorded; its path in the subject."""
    if not op.is_harness:
        return None
    from rowgate.cuda import kernels

    try:
        manifest = kernels.load(ctx.repo)
        path = kernels.harness_file(ctx.repo, manifest, op.name)
    except Error as exc:
        raise GateError(f"operator gate: {exc.diagnostics()}") from exc
    data = path.read_bytes()
    (ctx.artifact_dir / HARNESS_COPY).write_bytes(data)
    record.update(harness=op.harness, harness_sha256=hashlib.sha256(data).hexdigest(),
                  harness_copy=HARNESS_COPY)
    return path


class Operator(Gate[OperatorGate]):
    kind = "operator"
    spec_model = OperatorGate
    needs_device = True
    subject_steps = True
    reads_kernels = True
    options = TOOLCHAIN_KEYS

    def requirements(self, row: Row, spec: OperatorGate, ctx: GateContext) -> str | None:
        return launch.why_unavailable()

    def arch(self, row: Row, spec: OperatorGate, ctx: GateContext) -> tuple[str, bool]:
        return gate_arch(row, ctx.gpu)

    def check_declarations(self, row: Row, spec: OperatorGate,
                           manifest: KernelManifest) -> list[str]:
        op, kernel, wanted = declared(manifest, spec)
        how = (f"its harness {op.harness} launches the build's cubin" if op.is_harness else
               f"{len(wanted)} entry point(s) for {spec.id}'s cases")
        return [f"operator {op.name} ({op.contract}) of kernel {kernel}: {how}"]

    def estimate(self, row: Row, spec: OperatorGate) -> list[str]:
        lines = [f"work: {len(cases.cases(spec))} randomized-page case(s), each launched on "
                 f"baseline and candidate, then {spec.timing_repeats} timed launches a side per "
                 f"timing shape"]
        unused = cases.unused(spec)
        if unused:
            lines.append(f"makes no case of {', '.join(unused)}: a ragged layout needs two "
                         f"or more sequences")
        return lines

    # ------------------------------------------------------------------ measure

    def measure(self, row: Row, spec: OperatorGate, ctx: GateContext) -> None:
        import torch

        from rowgate.ops import operator_ab as run
        from rowgate.ops.sandboxed import ChildError, KernelChild

        gpu, _, why_not = ctx.gpu
        if gpu is None:
            raise GateError(f"operator gate: {why_not}")
        op, built, build_id = resolve(row, spec, ctx.artifact_dir.parent, gpu.arch)
        used = hashlib.sha256(built.cubin.read_bytes()).hexdigest()
        record = {"build_gate": build_id, "kernel": built.kernel, "arch": built.arch,
                  "cubin": built.rel, "sha256_recorded": built.sha256, "sha256_used": used,
                  "operator": op.name, "contract": op.contract}
        harness_path = _seal_harness(ctx, op, record)
        (ctx.artifact_dir / CUBIN).write_text(json.dumps(record, indent=1) + "\n")
        dev = torch.device(f"cuda:{gpu.index}")
        records = []
        all_cases = cases.cases(spec)
        # The subject's kernels (and a harness) run in a sandboxed child; the inputs, the
        # fp64 reference and every comparison stay in this process, out of their reach.
        try:
            with KernelChild(read_only=(ctx.repo,) if harness_path else ()) as child:
                harness = None if harness_path is None else {
                    "root": str(ctx.repo), "file": str(harness_path),
                    "function": op.harness_file()[1],
                    "cubins": {built.kernel: child.stage(built.cubin)}}
                with ctx.phase("cases"):
                    for i, case in enumerate(all_cases):
                        ctx.progress.update(f"operator: case {i + 1}/{len(all_cases)} "
                                            f"{case.name}")
                        records.append(run.run_case(case, spec, built.cubin, dev,
                                                    order_flip=bool(i % 2), operator=op,
                                                    candidate=spec.candidate, child=child,
                                                    harness=harness))
                ctx.progress.update("operator: interleaved timing")
                with ctx.phase("timing"):
                    timing = run.time_variants(spec, built.cubin, op, spec.candidate,
                                               child=child, harness=harness)
        except ChildError as exc:
            raise GateError(f"operator gate: {exc}") from exc
        run.write_records(ctx.artifact_dir, records, timing)

    # ------------------------------------------------------------------- derive

    def derive(self, row: Row, spec: OperatorGate, artifact_dir: Path) -> Derived:
        try:
            # cases.json.gz; a plain cases.json in a bundle sealed before it was gzipped
            records = read_json(compressed.either(artifact_dir / CASES))
            timing = read_json(artifact_dir / TIMING)
            cubin = read_json(artifact_dir / CUBIN)
        except GateError as exc:
            raise GateError(f"operator gate artifacts unreadable in {artifact_dir}: {exc}") from exc
        derived = derive_records(records, timing)
        problem = digest_problem(artifact_dir.parent, cubin) or _harness_problem(artifact_dir,
                                                                                  cubin)
        if problem:
            return Derived(Status.FAIL, problem, derived.metrics, derived.cells)
        return derived


def _harness_problem(artifact_dir: Path, cubin: dict[str, Any]) -> str | None:
    """A harness gate's sealed copy of its harness, hashed again."""
    if "harness_sha256" not in cubin:
        return None
    try:
        got = hashlib.sha256((artifact_dir / cubin["harness_copy"]).read_bytes()).hexdigest()
    except OSError as exc:
        return f"harness {cubin['harness']}: its sealed copy cannot be read ({exc.strerror})"
    if got != cubin["harness_sha256"]:
        return f"harness {cubin['harness']}: the sealed copy is not the one that ran"
    return None


def _max_abs_err(errs: list[float], records: list[dict[str, Any]]) -> MetricValue:
    """The largest error against the reference; never a finite number over outputs that
    were NaN or inf (those have no error to take a maximum of: said, with their count)."""
    nonfinite = sum(rec["nan"] + rec.get("inf", 0) for r in records
                    for rec in r["variants"].values())
    if nonfinite:
        return f"NaN ({nonfinite} non-finite outputs)"
    return max(errs) if errs else None


def _bad(rec: dict[str, Any]) -> bool:
    return bool(rec["failures"] or rec["unwritten"] or rec["nan"] or rec.get("guard_writes")
                or rec.get("counters_nonzero") or rec.get("inputs_written"))


def _cell(case: dict[str, Any]) -> str:
    return f"B{case['batch']}-{case['layout']}-{case['context']}"


def derive_records(records: list[dict[str, Any]], timing: dict[str, Any]) -> Derived:
    """Status and metrics from the raw case records; pure."""
    mismatches = sum(r["bitwise"]["mismatches"] for r in records)
    bad_pairs = [(r, v) for r in records for v, rec in r["variants"].items() if _bad(rec)]
    errs = [rec["max_abs_err"] for r in records for rec in r["variants"].values()
            if rec["max_abs_err"] is not None]
    metrics = {
        "cases": len(records),
        "bitwise_mismatches": mismatches,
        "bitwise_mismatch_cases": sum(1 for r in records if r["bitwise"]["mismatches"]),
        "reference_failures": len(bad_pairs),
        "unwritten_elements": sum(rec["unwritten"] for r in records
                                  for rec in r["variants"].values()),
        "nan_outputs": sum(rec["nan"] for r in records for rec in r["variants"].values()),
        "guard_writes": sum(rec.get("guard_writes", 0) for r in records
                            for rec in r["variants"].values()),
        "counters_left_set": sum(rec.get("counters_nonzero", 0) for r in records
                                 for rec in r["variants"].values()),
        "max_abs_err": _max_abs_err(errs, records),
        "seeds": " ".join(str(s) for s in sorted({r["case"]["seed"] for r in records})),
    }
    if any("inputs_written" in rec for r in records for rec in r["variants"].values()):
        # recorded since kernels run in the sandboxed child; older bundles re-derive as sealed
        metrics["inputs_written"] = sum(1 for r in records for rec in r["variants"].values()
                                        if rec.get("inputs_written"))
    metrics.update(_timing_metrics(timing))
    cells: dict[str, dict[str, Any]] = {}
    for r in records:
        c = cells.setdefault(_cell(r["case"]), {"cases": 0, "bitwise_mismatches": 0,
                                                "reference_failures": 0})
        c["cases"] += 1
        c["bitwise_mismatches"] += r["bitwise"]["mismatches"]
        c["reference_failures"] += sum(1 for rec in r["variants"].values() if _bad(rec))
    problems = []
    if not records:
        problems.append("no cases ran")
    first_mismatch = next((r for r in records if r["bitwise"]["mismatches"]), None)
    if first_mismatch:
        bw = first_mismatch["bitwise"]
        problems.append(f"candidate != baseline in {metrics['bitwise_mismatch_cases']} case(s); "
                        f"first {first_mismatch['case']['name']} element {bw['first_index']}: "
                        f"baseline {bw['a']['bits']} candidate {bw['b']['bits']}")
    if bad_pairs:
        r, v = bad_pairs[0]
        rec = r["variants"][v]
        problems.append(f"{len(bad_pairs)} case/variant(s) outside tolerance, unwritten, NaN or "
                        f"writing outside the output; first {r['case']['name']} {v}: failures "
                        f"{rec['failures']}, unwritten {rec['unwritten']}, NaN {rec['nan']}, "
                        f"guard {rec.get('guard_writes', 0)}, counters left set "
                        f"{rec.get('counters_nonzero', 0)}, inputs written "
                        f"{'yes' if rec.get('inputs_written') else 'no'}, first index "
                        f"{rec['first_index']}")
    if problems:
        return Derived(Status.FAIL, "; ".join(problems), metrics, cells)
    return Derived(Status.PASS, f"{len(records)} randomized-page case(s): candidate bitwise equal "
                                f"to baseline, both within tolerance of fp64, every element "
                                f"written and nothing outside", metrics, cells)


def _timing_metrics(timing: dict[str, Any]) -> dict[str, Any]:
    import statistics

    out = {}
    for shape, rec in timing.get("shapes", {}).items():
        medians = {v: statistics.median(s) for v, s in rec["samples_us"].items() if s}
        for v, m in medians.items():
            out[f"time_us_{shape}_{v}"] = round(m, 3)
        if len(medians) == 2:
            base, cand = (medians[k] for k in sorted(medians))
            out[f"time_ratio_{shape}"] = round(cand / base, 4) if base else None
    return out
