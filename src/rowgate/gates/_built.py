"""What the operator, phase and AOT gates take from the build gate of the same run: the
kernels.toml that was built (the gated commit's declarations, copied by the build
gate) and the cubins it produced, each checked against the digest the build recorded.
Nothing here builds: a gate measures the subject's binaries, never a rebuild of its own.

In a stage and in a sealed bundle alike, a gate's artifacts are `artifacts/GATE-ID/`, so
the build gate's are the sibling directory named by its id.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rowgate.cuda import kernels, resources
from rowgate.errors import Error
from rowgate.gates.build import INDEX, MANIFEST_COPY, build_problems, read_index
from rowgate.gates.interface import GateError

if TYPE_CHECKING:
    from rowgate.rows.row import Row
    from rowgate.rows.spec import GateSpec


@dataclass(frozen=True)
class BuiltKernel:
    kernel: str
    arch: str
    cubin: Path
    rel: str
    """The cubin's path relative to the artifacts root (`build/sm_90/NAME/NAME.sm_90.cubin`)."""
    sha256: str
    """What the build recorded (and what the file hashes to now: checked)."""
    entry_points: frozenset[str]
    """Functions the build's ptxas report lists."""


def build_gate_id(row: Row, spec: GateSpec, named: str) -> str:
    """The build gate a gate reads: `named`, else the row's one build gate before it."""
    builds = [g.id for g in row.gates_before(spec.id) if getattr(g, "kind", "") == "build"]
    if named:
        if named not in builds:
            raise GateError(f"{spec.id}: build = {named!r} is not a build gate before it "
                            f"(build gates before it: {', '.join(builds) or 'none'})")
        return named
    if len(builds) != 1:
        raise GateError(f"{spec.id}: needs exactly one build gate before it to take the "
                        f"subject's cubins from, found {len(builds)} ({', '.join(builds) or 'none'}); "
                        f"name one with build = \"ID\"")
    return builds[0]


def declarations(build_dir: Path) -> kernels.KernelManifest:
    """The kernels.toml the build gate built from (its copy)."""
    try:
        text = (build_dir / MANIFEST_COPY).read_text()
    except OSError as exc:
        raise GateError(f"{build_dir.name} gate: no kernels.toml in its artifacts "
                        f"({exc.strerror}): did it run?") from exc
    try:
        return kernels.parse(text, f"{build_dir.name}/{MANIFEST_COPY}")
    except Error as exc:
        raise GateError(exc.diagnostics()) from exc


def built_cubin(build_dir: Path, kernel: str, arch: str) -> BuiltKernel:
    """The build gate's clean cubin of `kernel` for `arch`, its digest checked."""
    if not (build_dir / INDEX).is_file():
        raise GateError(f"{build_dir.name} gate: no builds in its artifacts (did it run?)")
    index = read_index(build_dir)
    found = [(e, r) for e, r in index if e["kernel"] == kernel and e["arch"] == arch]
    if not found:
        have = sorted({e["arch"] for e, _ in index if e["kernel"] == kernel})
        raise GateError(f"the {build_dir.name} gate built no {kernel} for {arch} (it built it "
                        f"for: {', '.join(have) or 'no arch'}); add {arch} to its arches")
    entry, record = found[0]
    failed = build_problems(build_dir, entry, record)
    if failed:
        raise GateError(f"the {build_dir.name} gate's {kernel} for {arch} did not build clean: "
                        f"{failed[0]}")
    rel_dir = f"{build_dir.name}/{entry['dir']}"
    path = build_dir / entry["dir"] / record["cubin"]
    recorded = record["outputs"][record["cubin"]]
    actual = hashlib.sha256(path.read_bytes()).hexdigest()
    if actual != recorded:
        raise GateError(f"{rel_dir}/{record['cubin']}: sha256 {actual[:16]} is not the "
                        f"{recorded[:16]} its build recorded")
    log = next(s["log"] for s in record["steps"] if s["tool"] in ("ptxas", "nvcc"))
    report = resources.parse_ptxas((build_dir / entry["dir"] / log).read_text(errors="replace"))
    return BuiltKernel(kernel, arch, path, f"{rel_dir}/{record['cubin']}", recorded,
                       frozenset(report))


def missing_entries(built: BuiltKernel, wanted: set[str], where: str) -> None:
    """One line naming entry points the operator declares but the build lacks."""
    missing = sorted(wanted - built.entry_points)
    if missing:
        more = f" (+{len(missing) - 3} more)" if len(missing) > 3 else ""
        raise GateError(f"{where}: entry point(s) {', '.join(missing[:3])}{more} are not in "
                        f"{built.rel}")


def digest_problem(artifacts_root: Path, record: dict[str, Any]) -> str | None:
    """At derive time: the cubin a gate used, hashed again where the bundle holds it,
    against what the build recorded and what the gate saw when it loaded it."""
    if record["sha256_used"] != record["sha256_recorded"]:
        return (f"cubin {record['cubin']}: loaded with sha256 {record['sha256_used'][:16]}, "
                f"the build recorded {record['sha256_recorded'][:16]}")
    path = artifacts_root / record["cubin"]
    if path.is_file():
        now = hashlib.sha256(path.read_bytes()).hexdigest()
        if now != record["sha256_recorded"]:
            return f"cubin {record['cubin']}: sha256 {now[:16]} is not the one used"
    return None


__all__ = ["BuiltKernel", "build_gate_id", "built_cubin", "declarations",
           "digest_problem", "missing_entries"]
