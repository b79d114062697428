"""Phase gate: exact-shape phase attribution of the decode-attention kernels.

measure: build the `RG_PHASE` variants of split_kv.cu for the device's arch,
time them (both kernels, interleaved, L2 flushed) on the row's exact shape and
write `phase.json`; derive: each phase's cost = the difference of medians
against the full kernel, the dominant phase, per variant. A stand-in arch is
PENDING: phase costs and counters are properties of the arch, so an H200
attribution is no evidence for an sm_70 row (its figures live in docs/perf.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pipeline.gates.interface import Derived, Gate, GateContext, GateError, gate_arch
from pipeline.gates.registry import register
from pipeline.options import TOOLCHAIN_KEYS
from pipeline.records.status import Status
from pipeline.rowspec import GateSpec

if TYPE_CHECKING:
    from pipeline.rows import Row

PHASE = "phase.json"
REPEATS = 15


class PhaseGate(GateSpec):
    kind: Literal["phase"]
    phases: list[str]
    shape: str
    """Exact shape the attribution is measured on (e.g. `B16-ragged-17.8K-e5m2`)."""
    counters: list[str] = []


@register
class Phase(Gate[PhaseGate]):
    kind = "phase"
    spec_model = PhaseGate
    needs_device = True
    options = TOOLCHAIN_KEYS

    def requirements(self, row: Row, spec: PhaseGate, ctx: GateContext) -> str | None:
        from pipeline.ops.launch import why_unavailable

        missing = why_unavailable()
        if missing:
            return missing
        gpu, stand_in, _ = ctx.gpu
        if gpu is not None and stand_in:
            return (f"phase attribution must run on {row.target.arch}: this {gpu.name} is a "
                    f"{gpu.arch} stand-in, whose phase costs are not the target's "
                    f"(see docs/perf.md for the {gpu.arch} figures)")
        return None

    def arch(self, row: Row, spec, ctx: GateContext) -> tuple[str, bool]:
        return gate_arch(row, ctx.gpu)

    def measure(self, row: Row, spec: PhaseGate, ctx: GateContext) -> None:
        import torch

        from pipeline.build import toolchains
        from pipeline.ops import phase

        gpu, _, why_not = ctx.gpu
        if gpu is None:
            raise GateError(f"phase gate: {why_not}")
        try:
            case = phase.parse_shape(spec.shape)
        except ValueError as exc:
            raise GateError(f"phase gate {spec.id}: {exc}") from exc
        try:
            chain = toolchains.for_arch(gpu.arch, ctx.options.get("nvcc"))
        except toolchains.ToolchainError as exc:
            raise GateError(f"phase gate: no toolchain for {gpu.arch}: {exc.diagnostics()}") from exc
        ctx.progress.update(f"phase: building {len(phase.VARIANTS)} variants for {gpu.arch}")
        built = phase.build(chain.compiler.path, gpu.arch,
                            ctx.repo / "kernels" / "decode_attention" / "split_kv.cu",
                            ctx.repo / "kernels" / "include", ctx.artifact_dir)
        record = {"shape": spec.shape, "arch": gpu.arch, "toolchain": chain.describe(),
                  "builds": built["builds"]}
        if len(built["cubins"]) == len(phase.VARIANTS):
            ctx.progress.update(f"phase: timing on {spec.shape}")
            record.update(phase.time_variants(case, built["cubins"],
                                              torch.device(f"cuda:{gpu.index}"), REPEATS))
        (ctx.artifact_dir / PHASE).write_text(json.dumps(record, indent=1) + "\n")

    def derive(self, row: Row, spec: PhaseGate, artifact_dir: Path) -> Derived:
        from pipeline.ops import phase

        try:
            record = json.loads((artifact_dir / PHASE).read_text())
        except (OSError, ValueError) as exc:
            raise GateError(f"phase gate artifacts unreadable in {artifact_dir}: {exc}") from exc
        failed = [b for b in record.get("builds", []) if b["returncode"] != 0]
        if failed:
            return Derived(Status.FAIL, f"{len(failed)} phase variant(s) failed to build, first "
                                        f"{failed[0]['variant']!r} (exit {failed[0]['returncode']})")
        try:
            costs = phase.attribute(record["medians_us"], spec.phases)
        except KeyError as exc:
            raise GateError(f"phase gate {spec.id}: no measurement for {exc}") from exc
        metrics: dict = {}
        for role, per_phase in costs.items():
            for name, us in per_phase.items():
                metrics[f"{name}_us_{role}"] = round(us, 3)
            dominant = max(spec.phases, key=lambda p: per_phase[p])
            metrics[f"dominant_phase_{role}"] = dominant
        base = costs["baseline"]
        return Derived(Status.PASS, f"{spec.shape} on {record['arch']}: full kernel "
                                    f"{base['full']:.1f} µs, dominant phase "
                                    f"{metrics['dominant_phase_baseline']} "
                                    f"({base[metrics['dominant_phase_baseline']]:.1f} µs)", metrics)
