"""Audit gate: registers, shared memory, stack, spills and local memory per kernel
entry point per arch (ptxas report and cuobjdump resource usage), SASS rules, and
the images embedded in each fatbin/object checked against what the build recorded.

measure builds (from the same cache as the build gate: instant when it already
ran), then writes under the artifact dir per `ARCH/KERNEL/`: the build (sealed as the
build gate seals it), the `cuobjdump --dump-resource-usage` text, the SASS dump
(`sass.txt.gz`: 10x the cubin's size as text) and `embedded/` with the ELF images
`cuobjdump -xelf` extracted (gzipped); `audit.json` indexes them with the exact
commands; `kernels.toml` is copied so that derive judges against the budgets
that were in force, reading nothing outside the artifacts. Derive reads what
audit.json names, so bundles sealed with a plain `sass.txt` read as before.
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field

from pipeline import compressed
from pipeline.build import kernels, resources
from pipeline.gates._artifacts import derive_known_layout, read_json
from pipeline.gates.build import Built, build_into, build_problems, gate_arches, read_index, sealed_output
from pipeline.gates.interface import Derived, Gate, GateContext, GateError, Progress
from pipeline.gates.registry import register
from pipeline.options import TOOLCHAIN_KEYS
from pipeline.records.status import MetricValue, Status
from pipeline.rowspec import ARCH_PATTERN, GateSpec

if TYPE_CHECKING:
    from pipeline.rows import Row

AUDIT_INDEX = "audit.json"
BUDGETS = "kernels.toml"
SASS = "sass.txt.gz"
TOOL_TIMEOUT_S = 300
_EXTRACTED = re.compile(r"\.(sm_\w+)\.cubin(\.gz)?$")


class AuditGate(GateSpec):
    kind: Literal["audit"]
    arches: list[Annotated[str, Field(pattern=ARCH_PATTERN)]] = []
    kernels: list[str] = []
    verify_embedded_images: bool = True


def measure_audit(repo: Path, arches: list[str], names: list[str], options: dict[str, str],
                  out: Path, progress: Progress, verify_embedded: bool = True) -> None:
    built = build_into(repo, arches, names, options, out, progress)  # copies kernels.toml
    entries = []
    for b in built:
        progress.update(f"audit {b.kernel} for {b.arch}")
        entries.append(_inspect(b, out, verify_embedded))
    (out / AUDIT_INDEX).write_text(json.dumps(entries, indent=2) + "\n")


def _tool(argv: list[str], log: Path, cwd: str | None = None, output: str | None = None) -> dict[str, Any]:
    """Run one binutil, keep its output in `log` (gzipped when it is named `.gz`); the
    record names it as `output`."""
    try:
        proc = subprocess.run(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=TOOL_TIMEOUT_S, check=False)
        rc, text = proc.returncode, proc.stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        rc, text = 127, f"{argv[0]}: {exc}\n".encode()
    compressed.write_bytes(log, text)
    return {"argv": argv, "returncode": rc, "output": output or log.name}


def _inspect(b: Built, out: Path, verify_embedded: bool) -> dict[str, Any]:
    record = read_json(b.dir / "build.json")
    entry: dict[str, Any] = {"arch": b.arch, "kernel": b.kernel, "dir": f"{b.arch}/{b.kernel}",
                             "commands": [], "resource_usage": None, "sass": None, "sass_pending": "",
                             "embedded": [], "embedded_checked": verify_embedded}
    cubin = record.get("cubin")
    tc = b.toolchain
    if not cubin:  # the build failed: derive reports that first
        return entry
    if tc.cuobjdump is None:
        entry["sass_pending"] = tc.sass_missing
        return entry
    entry["commands"].append(_tool([tc.cuobjdump.path, "--dump-resource-usage",
                                    str(b.dir / cubin)], b.dir / "resource-usage.txt"))
    entry["resource_usage"] = "resource-usage.txt"
    if tc.sass_missing:
        entry["sass_pending"] = tc.sass_missing
    else:
        entry["commands"].append(_tool([tc.cuobjdump.path, "-sass", str(b.dir / cubin)],
                                       b.dir / SASS))
        entry["sass"] = SASS
    if verify_embedded:
        for container in (record.get("fatbin"), record.get("object")):
            if container:
                entry["embedded"] += _extract(tc.cuobjdump.path, b.dir, container, entry)
    return entry


def _extract(cuobjdump: str, build_dir: Path, container: str, entry: dict[str, Any]
             ) -> list[dict[str, Any]]:
    """`cuobjdump -xelf all` into embedded/CONTAINER/ (each image gzipped); one record
    per image. The container is sealed gzipped: cuobjdump reads its bytes unpacked
    into a temporary directory (the argv names that copy), the images land in another."""
    dest = build_dir / "embedded" / container
    dest.mkdir(parents=True)
    with (tempfile.TemporaryDirectory(prefix="rowgate-xelf-in-") as tmp_in,
          tempfile.TemporaryDirectory(prefix="rowgate-xelf-") as tmp):
        unpacked = Path(tmp_in) / container
        unpacked.write_bytes(compressed.read_bytes(sealed_output(build_dir, container)))
        argv = [cuobjdump, "-xelf", "all", str(unpacked)]
        entry["commands"].append(_tool(argv, dest.parent / f"{container}.xelf.log", cwd=tmp,
                                       output=f"embedded/{container}.xelf.log"))
        images = []
        for f in sorted(Path(tmp).iterdir()):
            compressed.write_bytes(compressed.gzipped(dest / f.name), f.read_bytes())
            images.append({"container": container,
                           "file": f"embedded/{container}/{f.name}{compressed.SUFFIX}"})
    return images


# --------------------------------------------------------------------------- derive


@dataclass
class AuditFindings:
    violations: list[resources.Violation] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    cells: dict[str, dict[str, MetricValue]] = field(default_factory=dict)
    images_verified: int = 0


def derive_audit(artifact_dir: Path) -> Derived:
    try:
        manifest = kernels.parse((artifact_dir / BUDGETS).read_text(), BUDGETS)
        entries = read_json(artifact_dir / AUDIT_INDEX)
    except (OSError, GateError, ValueError) as exc:
        raise GateError(f"audit artifacts unreadable in {artifact_dir}: {exc}") from exc
    records = {(e["arch"], e["kernel"]): (e, r) for e, r in read_index(artifact_dir)}
    found = AuditFindings()
    for entry in entries:
        index_entry, record = records[(entry["arch"], entry["kernel"])]
        _judge(artifact_dir, manifest, entry, index_entry, record, found)
    metrics: dict[str, MetricValue] = {"entry_points": len(found.cells), "violations": len(found.violations),
                                       "embedded_images_verified": found.images_verified,
                                       "sass_pending": len(found.pending)}
    if found.violations:
        shown = "; ".join(str(v) for v in found.violations[:6])
        more = f" (+{len(found.violations) - 6} more)" if len(found.violations) > 6 else ""
        return Derived(Status.FAIL, f"{len(found.violations)} violation(s): {shown}{more}",
                       metrics, found.cells)
    if found.pending:
        return Derived(Status.PENDING, "budgets hold; SASS not checked: " + found.pending[0],
                       metrics, found.cells)
    bare = sum(1 for e in entries if e["embedded_checked"] and not e["embedded"])
    images = f"{found.images_verified} embedded image(s) match the build"
    if bare:
        images += f", {bare} NVRTC build(s) are bare cubins (no fatbin to unpack)"
    return Derived(Status.PASS, f"{len(found.cells)} entry point(s) within budget, SASS rules "
                                f"hold, {images}", metrics, found.cells)


def _read(path: Path) -> str:
    """A text artifact (gzipped when named `.gz`)."""
    try:
        return compressed.read_text(path, errors="replace")
    except (OSError, EOFError) as exc:
        raise GateError(f"{path}: unreadable: {exc}") from exc


def _judge(root: Path, manifest: kernels.KernelManifest, entry: dict[str, Any],
           index_entry: dict[str, Any], record: dict[str, Any], found: AuditFindings) -> None:
    name, arch = entry["kernel"], entry["arch"]
    kdir = root / entry["dir"]
    failed = build_problems(root, index_entry, record)
    if failed:
        found.violations.append(resources.Violation(name, "*", arch, "build", failed[0],
                                                    "a clean build"))
        return
    kernel = manifest.kernels[name]
    ptxas_log = next(s["log"] for s in record["steps"] if s["tool"] in ("ptxas", "nvcc"))
    report = resources.parse_ptxas(_read(kdir / ptxas_log))
    usage = (resources.parse_resource_usage(_read(kdir / entry["resource_usage"]))
             if entry["resource_usage"] else {})
    sass = resources.parse_sass(_read(kdir / entry["sass"])) if entry["sass"] else None
    if entry["sass_pending"]:
        found.pending.append(f"{name} {arch}: {entry['sass_pending']}")
    if sass is not None and sass.arches and set(sass.arches) != {arch}:
        found.violations.append(resources.Violation(name, "*", arch, "SASS arch",
                                                    ", ".join(sass.arches), arch))
    budget = kernel.budget(arch)
    for ep in kernel.entry_points:
        fn = report.get(ep)
        found.violations += resources.check_budget(name, ep, arch, budget, fn, usage.get(ep))
        if sass is not None:
            found.violations += resources.check_sass(name, kernel, ep, arch, sass.opcodes.get(ep))
        found.cells[f"{name}/{ep}@{arch}"] = _cell(fn, usage.get(ep, {}), budget, sass, ep)
    _check_images(root, entry, record, found)


def _cell(fn: resources.PtxasFunction | None, usage: dict[str, int], budget: kernels.Budget,
          sass: resources.Sass | None, ep: str) -> dict[str, MetricValue]:
    fn = fn or resources.PtxasFunction(ep, "")
    return {"registers": fn.registers, "max_registers": budget.max_registers,
            "spill_stores": fn.spill_stores, "spill_loads": fn.spill_loads,
            "stack_frame": fn.stack_frame, "local": max(fn.local, usage.get("LOCAL", 0)),
            "static_shared": fn.shared, "max_static_shared": budget.max_static_shared_bytes,
            "shared_with_reserved": usage.get("SHARED"), "cmem0": fn.cmem.get(0, usage.get("CONSTANT[0]")),
            "barriers": fn.barriers,
            "sass_instructions": sum(sass.opcodes.get(ep, {}).values()) if sass else None}


def _check_images(root: Path, entry: dict[str, Any], record: dict[str, Any],
                  found: AuditFindings) -> None:
    """Each container must embed exactly one ELF, for the build's arch, byte-identical
    to the cubin the build recorded."""
    if not entry["embedded_checked"]:
        return
    want = record["outputs"][record["cubin"]]
    arch, name = entry["arch"], entry["kernel"]
    by_container: dict[str, list[dict[str, Any]]] = {}
    for image in entry["embedded"]:
        by_container.setdefault(image["container"], []).append(image)
    for container in (record.get("fatbin"), record.get("object")):
        if not container:
            continue
        images = by_container.get(container, [])
        if len(images) != 1:
            found.violations.append(resources.Violation(
                name, "*", arch, f"{container} embedded ELF images",
                f"{len(images)} image(s)", "exactly 1"))
            continue
        m = _EXTRACTED.search(images[0]["file"])
        got_arch = m.group(1) if m else "unknown"
        try:
            digest = resources.sha256_file(root / entry["dir"] / images[0]["file"])
        except (OSError, EOFError) as exc:
            raise GateError(f"{entry['dir']}/{images[0]['file']}: unreadable: {exc}") from exc
        if got_arch != arch:
            found.violations.append(resources.Violation(
                name, "*", arch, f"{container} embedded image arch", got_arch, arch))
        elif digest != want:
            found.violations.append(resources.Violation(
                name, "*", arch, f"{container} embedded image sha256", digest[:16],
                f"{want[:16]} (the built cubin)"))
        else:
            found.images_verified += 1


@register
class Audit(Gate[AuditGate]):
    kind = "audit"
    spec_model = AuditGate
    report_view = "per_arch"
    options = TOOLCHAIN_KEYS

    def measure(self, row: Row, spec: AuditGate, ctx: GateContext) -> None:
        measure_audit(ctx.repo, gate_arches(row, spec.arches), spec.kernels, ctx.options,
                      ctx.artifact_dir, ctx.progress, spec.verify_embedded_images)

    def derive(self, row: Row, spec: AuditGate, artifact_dir: Path) -> Derived:
        return derive_known_layout(derive_audit, artifact_dir, "audit")

    def arch(self, row: Row, spec: AuditGate, ctx: GateContext) -> tuple[str, bool]:
        return row.target.arch, False
