"""Operator gate: the candidate kernel against the baseline, bit for bit, on
randomized page tables, and both against the fp64 reference.

measure: build split_kv for the device's arch (or take `cubin=PATH` from the
gate options), run every case of the spec (seeds recorded, outputs poisoned
before each launch, variant order alternating per case), write the raw
per-case records (`cases.json`, `cases.csv`) and the interleaved timing samples
(`timing.json`). derive: pure arithmetic over those files.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import Field

from pipeline.errors import Error
from pipeline.gates.interface import Derived, Gate, GateContext, GateError, gate_arch
from pipeline.gates.registry import register
from pipeline.options import TOOLCHAIN_KEYS
from pipeline.records.status import Status
from pipeline.rowspec import GateSpec, Tolerance

if TYPE_CHECKING:
    from pipeline.rows import Row

CASES = "cases.json"
TIMING = "timing.json"
BUILD = "build.json"


class OperatorGate(GateSpec):
    kind: Literal["operator"]
    baseline: str
    candidate: str
    batches: list[Annotated[int, Field(gt=0)]] = [1, 4, 8, 12, 16]
    layouts: list[Literal["uniform", "ragged"]] = ["uniform", "ragged"]
    contexts: list[Annotated[str, Field(pattern=r"^(page[+-]1|page|[0-9]+(\.[0-9]+)?K?)$")]] = [
        "1", "page-1", "page", "page+1", "1024", "16384", "17.8K"]
    page_sizes: list[Annotated[int, Field(gt=0)]] = [16, 64]
    kv_dtypes: list[Literal["bf16", "e5m2"]] = ["bf16", "e5m2"]
    heads: list[Annotated[list[int], Field(min_length=2, max_length=2)]] = [[32, 8], [8, 1]]
    head_dims: list[Literal[64, 128]] = [128, 64]
    seeds: list[int] = [0, 1]
    tolerance: Tolerance = Tolerance()
    timing_repeats: Annotated[int, Field(ge=9)] = 9


@register
class Operator(Gate[OperatorGate]):
    kind = "operator"
    spec_model = OperatorGate
    needs_device = True
    options = (*TOOLCHAIN_KEYS, "cubin")

    def requirements(self, row: Row, spec: OperatorGate, ctx: GateContext) -> str | None:
        from pipeline.ops.launch import why_unavailable

        return why_unavailable()

    def arch(self, row: Row, spec, ctx: GateContext) -> tuple[str, bool]:
        return gate_arch(row, ctx.gpu)

    # ------------------------------------------------------------------ measure

    def measure(self, row: Row, spec: OperatorGate, ctx: GateContext) -> None:
        import torch

        from pipeline.ops import operator_ab as run

        gpu, _, why_not = ctx.gpu
        if gpu is None:
            raise GateError(f"operator gate: {why_not}")
        dev = torch.device(f"cuda:{gpu.index}")
        cubin = self._cubin(gpu.arch, ctx)
        records = []
        all_cases = run.cases(spec)
        for i, case in enumerate(all_cases):
            ctx.progress.update(f"operator: case {i + 1}/{len(all_cases)} {case.name}")
            records.append(run.run_case(case, spec, cubin, dev, order_flip=bool(i % 2)))
        ctx.progress.update("operator: interleaved timing")
        run.write_records(ctx.artifact_dir, records, run.time_variants(spec, cubin, dev))

    def _cubin(self, arch: str, ctx: GateContext) -> Path:
        """An explicit `cubin=PATH` option, or a fresh build with the arch's toolchain."""
        if "cubin" in ctx.options:
            path = Path(ctx.options["cubin"])
            if not path.is_file():
                raise GateError(f"operator gate: option cubin={path}: no such file")
            (ctx.artifact_dir / BUILD).write_text(json.dumps({"cubin": str(path)}) + "\n")
            return path
        # The binary the build and audit gates certify (same flags, warnings as errors,
        # same cache), not a build of its own.
        from pipeline.ops.decode_attention import build_cubin

        try:
            path = build_cubin(ctx.repo, arch, ctx.options.get("nvcc"))
        except Error as exc:  # KernelsError, ToolchainError, BuildFailed
            raise GateError(f"operator gate: building split_kv for {arch}: "
                            f"{exc.diagnostics()}") from exc
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        (ctx.artifact_dir / BUILD).write_text(json.dumps(
            {"cubin": str(path), "sha256": digest}, indent=1) + "\n")
        return path

    # ------------------------------------------------------------------- derive

    def derive(self, row: Row, spec: OperatorGate, artifact_dir: Path) -> Derived:
        try:
            records = json.loads((artifact_dir / CASES).read_text())
            timing = json.loads((artifact_dir / TIMING).read_text())
        except (OSError, ValueError) as exc:
            raise GateError(f"operator gate artifacts unreadable in {artifact_dir}: {exc}") from exc
        return derive_records(records, timing)


def _cell(case: dict) -> str:
    return f"B{case['batch']}-{case['layout']}-{case['context']}"


def derive_records(records: list[dict], timing: dict) -> Derived:
    """Status and metrics from the raw case records; pure."""
    mismatches = sum(r["bitwise"]["mismatches"] for r in records)
    bad_pairs = [(r, v) for r in records for v, rec in r["variants"].items()
                 if rec["failures"] or rec["unwritten"] or rec["nan"]]
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
        "max_abs_err": max(errs) if errs else None,
        "seeds": " ".join(str(s) for s in sorted({r["case"]["seed"] for r in records})),
    }
    metrics.update(_timing_metrics(timing))
    cells: dict[str, dict] = {}
    for r in records:
        c = cells.setdefault(_cell(r["case"]), {"cases": 0, "bitwise_mismatches": 0,
                                                "reference_failures": 0})
        c["cases"] += 1
        c["bitwise_mismatches"] += r["bitwise"]["mismatches"]
        c["reference_failures"] += sum(1 for rec in r["variants"].values()
                                       if rec["failures"] or rec["unwritten"] or rec["nan"])
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
        problems.append(f"{len(bad_pairs)} case/variant(s) outside tolerance, unwritten or NaN; "
                        f"first {r['case']['name']} {v}: failures {rec['failures']}, unwritten "
                        f"{rec['unwritten']}, NaN {rec['nan']}, first index {rec['first_index']}")
    if problems:
        return Derived(Status.FAIL, "; ".join(problems), metrics, cells)
    return Derived(Status.PASS, f"{len(records)} randomized-page case(s): candidate bitwise equal "
                                f"to baseline, both within tolerance of fp64, every element "
                                f"written", metrics, cells)


def _timing_metrics(timing: dict) -> dict:
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
