"""Phase gate: exact-shape phase attribution of a subject operator's kernels, and the
row's hardware counters on that shape.

The subject's kernels.toml declares, per phase, the defines of a timing variant that
removes the phase or does it twice (`[operators.NAME.phases]`, common defines in
`phase_build`). measure: build the full kernel and each of the row's phases through the
build gate's recipe (warnings as errors, cached outside the subject), time every
variant of the baseline and the candidate (interleaved, L2 flushed) on the row's exact
shape, then, when the row names `counters`, profile one launch of each role's full
kernel with ncu and keep the raw CSV; write `phase.json`. derive: each phase's cost as
a difference of medians, the dominant phase, and every counter read back from the CSV.
PENDING on a stand-in arch (phase costs and counters belong to the arch: an H200
attribution is no evidence for an sm_70 row) and without ncu when counters are asked.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from rowgate.errors import Error
from rowgate.gates._built import build_gate_id, declarations
from rowgate.gates._phase_measure import build_variants, collect_counters, sha256
from rowgate.gates.artifacts import read_json
from rowgate.gates.interface import Derived, Gate, GateContext, GateError, gate_arch
from rowgate.ops import launch
from rowgate.records.status import Status
from rowgate.rows.options import TOOLCHAIN_KEYS
from rowgate.rows.spec import GateSpec

if TYPE_CHECKING:
    from rowgate.cuda.kernels import KernelManifest
    from rowgate.cuda.operators import OperatorDecl
    from rowgate.ops.cases import Case
    from rowgate.ops.contract import Operator
    from rowgate.rows.row import Row

PHASE = "phase.json"
REPEATS = 15


class PhaseGate(GateSpec):
    kind: Literal["phase"]
    phases: list[str]
    """Phase names the subject's operator declares (`[operators.NAME.phases]`)."""
    shape: str
    """Exact shape the attribution is measured on (e.g. `B16-ragged-17.8K-e5m2`)."""
    counters: list[str] = []
    """ncu metrics collected on that shape for each role's full kernel."""
    operator: str = ""
    """The `[operators.NAME]` of the subject's kernels.toml; empty: the only one."""
    candidate: str = ""
    build: str = ""
    """The build gate whose kernels.toml (the gated commit's) declares the phases."""


def _ncu_missing(spec: PhaseGate) -> str | None:
    from rowgate.ops import ncu

    if spec.counters and ncu.find() is None:
        return (f"ncu (Nsight Compute) is not on PATH: the row's counters "
                f"({', '.join(spec.counters)}) are collected with it")
    return None


def resolve(row: Row, spec: PhaseGate, artifacts_root: Path
            ) -> tuple[str, OperatorDecl, Operator, Case, dict[str, list[str]], dict[str, str]]:
    """(operator name, its declaration, the contract Operator, the case, {variant:
    defines}, {role: entry}) from the build gate's kernels.toml. GateError (one line)
    for an undeclared operator, phase or shape."""
    return declared(declarations(artifacts_root / build_gate_id(row, spec, spec.build)), spec)


def declared(manifest: KernelManifest, spec: PhaseGate
             ) -> tuple[str, OperatorDecl, Operator, Case, dict[str, list[str]], dict[str, str]]:
    """`resolve` from a kernels.toml (what `--plan` checks against the subject)."""
    from rowgate.ops import phase

    try:
        name, decl = manifest.operator(spec.operator)
        op = decl.to_contract(name)
        if op.is_harness:
            raise ValueError(f"operator {name} is a {op.contract} operator: phase variants "
                             f"are timed through the fixed contract's entry points")
        case = phase.parse_shape(spec.shape)
        why = op.unsupported(case.kv, case.dim, case.hq // case.hkv, case.page)
        if why:
            raise ValueError(f"shape {spec.shape}: {why}")
        variants = phase.variants(decl.phase_build.defines, decl.phases, spec.phases)
        entries = op.entries(case.kv, case.dim, case.hq // case.hkv, spec.candidate)
    except (Error, ValueError, KeyError) as exc:
        text = exc.diagnostics() if isinstance(exc, Error) else str(exc).strip("'\"")
        raise GateError(f"phase gate: {text}") from exc
    return name, decl, op, case, variants, entries


def check_entries(builds: dict[str, dict[str, Any]], entries: dict[str, str], shape: str) -> None:
    """GateError (one line) for a clean variant build that lacks a role's entry point."""
    for variant, b in builds.items():
        missing = sorted(set(entries.values()) - set(b["entry_points"]))
        if missing:
            raise GateError(f"phase gate: variant {variant} ({' '.join(b['defines'])}) has "
                            f"no {', '.join(missing)}: its defines leave out shape {shape}")


class Phase(Gate[PhaseGate]):
    kind = "phase"
    spec_model = PhaseGate
    subject_steps = True
    reads_kernels = True
    needs_device = True
    options = TOOLCHAIN_KEYS

    def requirements(self, row: Row, spec: PhaseGate, ctx: GateContext) -> str | None:
        missing = launch.why_unavailable()
        if missing:
            return missing
        gpu, stand_in, _ = ctx.gpu
        if gpu is not None and stand_in:
            return (f"phase attribution must run on {row.target.arch}: this {gpu.name} is a "
                    f"{gpu.arch} stand-in, whose phase costs are not the target's "
                    f"(see docs/perf.md for the {gpu.arch} figures)")
        return _ncu_missing(spec)

    def arch(self, row: Row, spec: PhaseGate, ctx: GateContext) -> tuple[str, bool]:
        return gate_arch(row, ctx.gpu)

    def check_declarations(self, row: Row, spec: PhaseGate,
                           manifest: KernelManifest) -> list[str]:
        name, _, _, case, variants, _ = declared(manifest, spec)
        return [f"operator {name}: {len(variants)} phase variant(s) on {case.name}"]

    def measure(self, row: Row, spec: PhaseGate, ctx: GateContext) -> None:
        from rowgate.ops import ncu, phase
        from rowgate.ops.sandboxed import ChildError, KernelChild

        gpu, _, why_not = ctx.gpu
        if gpu is None:
            raise GateError(f"phase gate: {why_not}")
        name, decl, op, case, variants, entries = resolve(row, spec, ctx.artifact_dir.parent)
        with ctx.phase("compile"):
            builds = build_variants(ctx.repo, decl.kernel, gpu.arch, variants,
                                    ctx.options, ctx.artifact_dir, ctx.progress)
        record: dict[str, Any] = {"shape": spec.shape, "arch": gpu.arch, "operator": name,
                        "entries": entries, "builds": builds,
                        "effects": {p: decl.phases[p].effect for p in spec.phases}}
        clean = all(not b["problems"] for b in builds.values())
        if clean:
            check_entries(builds, entries, spec.shape)
            cubins = {v: str(ctx.artifact_dir / b["dir"] / b["cubin"]) for v, b in builds.items()}
            ctx.progress.update(f"phase: timing {len(cubins)} variant(s) on {spec.shape}")
            try:  # the subject's kernels run in a sandboxed child
                with KernelChild() as child, ctx.phase("timing"):
                    record.update(phase.time_variants(case, cubins, entries, op, REPEATS,
                                                      child=child))
            except ChildError as exc:
                raise GateError(f"phase gate: {exc}") from exc
            if spec.counters:
                table = decl.model_dump(exclude={"phase_build", "phases"})
                with ctx.phase("counters (ncu)"):
                    record["counters"] = {role: collect_counters(
                        ncu.find() or "ncu", spec.counters, Path(cubins[phase.FULL]), table,
                        name, entry, case.as_dict(), role, ctx.artifact_dir)
                        for role, entry in entries.items()}
        (ctx.artifact_dir / PHASE).write_text(json.dumps(record, indent=1) + "\n")

    def derive(self, row: Row, spec: PhaseGate, artifact_dir: Path) -> Derived:
        try:
            record = read_json(artifact_dir / PHASE)
        except GateError as exc:
            raise GateError(f"phase gate artifacts unreadable in {artifact_dir}: {exc}") from exc
        return derive_phase(record, spec, artifact_dir)


def derive_phase(record: dict[str, Any], spec: PhaseGate, artifact_dir: Path) -> Derived:
    """Status, costs and counters from phase.json and the raw ncu CSVs; pure."""
    from rowgate.ops import phase

    failed = [(v, b) for v, b in record["builds"].items() if b["problems"]]
    if failed:
        v, b = failed[0]
        return Derived(Status.FAIL, f"{len(failed)} phase variant(s) did not build clean; "
                                    f"first {v}: {b['problems'][0]}")
    for v, b in record["builds"].items():
        if b["cubin"] and sha256(artifact_dir / b["dir"] / b["cubin"]) != b["sha256"]:
            return Derived(Status.FAIL, f"phase variant {v}: its cubin is not the one built")
    try:
        costs = phase.attribute(record["medians_us"], record["effects"])
    except KeyError as exc:
        raise GateError(f"phase gate {spec.id}: no measurement for {exc}") from exc
    metrics: dict[str, Any] = {}
    for role, per_phase in costs.items():
        for name, us in per_phase.items():
            metrics[f"{name}_us_{role}"] = round(us, 3)
        metrics[f"dominant_phase_{role}"] = max(spec.phases, key=lambda p: per_phase[p])
    problems = _counters(record.get("counters", {}), spec.counters, artifact_dir, metrics)
    base = costs["baseline"]
    top = metrics["dominant_phase_baseline"]
    said = (f"{spec.shape} on {record['arch']}: full kernel {base['full']:.1f} µs, dominant "
            f"phase {top} ({base[top]:.1f} µs)")
    if problems:
        return Derived(Status.FAIL, f"{said}; counters: {'; '.join(problems[:3])}", metrics)
    if spec.counters:
        said += f"; {len(spec.counters)} counter(s) per role from ncu"
    return Derived(Status.PASS, said, metrics)


def _counters(runs: dict[str, Any], wanted: list[str], artifact_dir: Path,
              metrics: dict[str, Any]) -> list[str]:
    """Each wanted counter of each role from its ncu CSV into `metrics`
    (`counter_ROLE_NAME`; a base name ncu expands, e.g. `.ratio`, `.pct`, counts with
    every expansion); problems as lines quoting ncu."""
    from rowgate.ops import ncu

    if wanted and not runs:
        return ["ncu was not run"]
    problems = []
    for role, run in runs.items():
        text = (artifact_dir / run["csv"]).read_text()
        said = ncu.messages(text + "\n" + (artifact_dir / run["log"]).read_text())
        errors = [m for m in said if m.startswith("==ERROR==")]
        try:
            rows = [r for r in ncu.parse(text) if r["kernel"] == run["entry"]]
        except ValueError:
            rows = []
        if not rows:
            problems.append(f"{role}: no profiled launch of {run['entry']} (ncu exited "
                            f"{run['returncode']}{': ' + errors[0] if errors else ''})")
            continue
        values = rows[-1]["metrics"]
        for name in wanted:
            found = {k: v for k, v in values.items() if k == name or k.startswith(name + ".")}
            if not found:
                problems.append(f"{role}: {name} is not in ncu's output"
                                f"{' (' + errors[0] + ')' if errors else ''}")
            for key, value in found.items():
                metrics[f"counter_{role}_{key}"] = value
    return problems
