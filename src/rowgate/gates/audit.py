"""Audit gate: registers, shared memory, stack, spills and local memory per kernel
entry point per arch (ptxas report and cuobjdump resource usage), SASS rules, and
the images embedded in each fatbin/object checked against what the build recorded.

measure builds (from the same cache as the build gate: instant when it already
ran), then writes under the artifact dir per `ARCH/KERNEL/`: the build (sealed as the
build gate seals it), the `cuobjdump --dump-resource-usage` text, the SASS dump
(`sass.txt.gz`: 10x the cubin's size as text) and `embedded/` with the ELF images
`cuobjdump -xelf` extracted (gzipped; an image the object embeds byte for byte as the
fatbin does is sealed once, both records naming it); `audit.json` indexes them with the exact
commands; `kernels.toml` is copied so that derive judges against the budgets
that were in force, reading nothing outside the artifacts. Derive reads what
audit.json names, so bundles sealed with a plain `sass.txt` read as before.

In a row whose build gate ran before it, the audit seals no second copy of the
builds: it inspects the build gate's (`_audit_ref`), each entry naming the files it
read there with their digests, and keeps only its own tool outputs under
`ARCH/KERNEL/`. Bundles whose audit holds its own copy derive as they always did.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field

from rowgate import compressed, sandbox
from rowgate.cuda import cudabuild, kernels, resources, symbols, toolchains
from rowgate.errors import Error
from rowgate.gates import _audit_ref
from rowgate.gates._built import build_gate_id
from rowgate.gates.artifacts import derive_known_layout, read_json
from rowgate.gates.build import (
    MANIFEST_COPY,
    Built,
    build_into,
    build_problems,
    gate_arches,
    missing_toolchains,
    read_index,
    sealed_output,
)
from rowgate.gates.clock import Phases
from rowgate.gates.interface import Derived, Gate, GateContext, GateError, Progress
from rowgate.records.status import MetricValue, Status
from rowgate.rows.options import TOOLCHAIN_KEYS
from rowgate.rows.spec import ARCH_PATTERN, GateSpec

if TYPE_CHECKING:
    from rowgate.rows.row import Row

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
                  out: Path, progress: Progress, verify_embedded: bool = True,
                  build_root: Path | None = None, phase: Phases | None = None) -> None:
    """Audit each build. With `build_root` (the row's build gate's artifacts, sealed
    earlier in this run) holding every build the audit covers, inspect those by
    reference (`_audit_ref`); otherwise build (the same cache) and seal a copy."""
    for arch in arches:  # before anything is built: the audit cannot read binaries
        try:
            missing = toolchains.for_options(arch, options).binutils_missing
        except Error:
            continue  # no toolchain at all: the build step says so for the arch
        if missing:
            raise GateError(f"audit gate: {arch}: {missing}")
    ref = _audit_ref.find(build_root, arches, names, options)
    out.mkdir(parents=True, exist_ok=True)
    phase = phase or Phases()
    if ref is None:
        with phase("compile"):
            built = build_into(repo, arches, names, options, out, progress)  # + kernels.toml
    else:
        shutil.copyfile(ref.root / MANIFEST_COPY, out / BUDGETS)  # the declarations built
        built = list(ref.builds.values())
    entries = []
    with phase("binutils"):
        for b in built:
            progress.update(f"audit {b.kernel} for {b.arch}")
            dest = b.dir if ref is None else out / b.arch / b.kernel
            entries.append(_inspect(b, dest, verify_embedded, ref))
    (out / AUDIT_INDEX).write_text(json.dumps(entries, indent=2) + "\n")
    if ref is not None and ref.missing:
        raise missing_toolchains(ref.missing, list(dict.fromkeys(b.arch for b in built)),
                                 "audited")


def _tool(argv: list[str], log: Path, reads: Path, cwd: str | None = None,
          output: str | None = None) -> dict[str, Any]:
    """Run one binutil on a subject's binary (`reads`: the one file or directory it may
    read) in the sandbox; keep its output in `log` (gzipped when it is named `.gz`); the
    record names it as `output`. A binary is the subject's code's output: a crafted one
    meets a binutil that sees nothing else."""
    work = Path(cwd) if cwd else reads if reads.is_dir() else reads.parent
    tool = Path(argv[0]).resolve().parent.parent
    done = sandbox.run(sandbox.Step(argv, cwd=work, read_only=[reads, tool],
                                    writable=[work] if cwd else [],
                                    limits=sandbox.Limits(wall_s=TOOL_TIMEOUT_S)), merged=True)
    text = done.stdout + (f"\nstopped at its {done.limit} limit\n".encode() if done.limit else b"")
    compressed.write_bytes(log, text)
    return {"argv": argv, "returncode": done.returncode, "output": output or log.name}


def _inspect(b: Built, dest: Path, verify_embedded: bool,
             ref: _audit_ref.Reference | None) -> dict[str, Any]:
    """Run the binutils on the build in `b.dir`; their output goes to `dest` (the same
    directory for a copied build, the audit's own `ARCH/KERNEL/` for a referenced one)."""
    record = read_json(b.dir / "build.json")
    dest.mkdir(parents=True, exist_ok=True)
    entry: dict[str, Any] = {"arch": b.arch, "kernel": b.kernel, "dir": f"{b.arch}/{b.kernel}",
                             "commands": [], "resource_usage": None, "sass": None, "sass_pending": "",
                             "embedded": [], "embedded_checked": verify_embedded}
    if ref is not None:
        entry[_audit_ref.KEY] = _audit_ref.record(ref, b, record)
    if record.get("project"):  # its device code came out of the project's own outputs
        entry["project_build"] = True
    cubin = record.get("cubin")
    tc = b.toolchain
    if not cubin:  # the build failed: derive reports that first
        return entry
    if tc.cuobjdump is None:
        entry["sass_pending"] = tc.sass_missing
        return entry
    entry["commands"].append(_tool([tc.cuobjdump.path, "--dump-resource-usage",
                                    str(b.dir / cubin)], dest / "resource-usage.txt",
                                   b.dir / cubin))
    entry["resource_usage"] = "resource-usage.txt"
    if tc.sass_missing:
        entry["sass_pending"] = tc.sass_missing
    else:
        entry["commands"].append(_tool([tc.cuobjdump.path, "-sass", str(b.dir / cubin)],
                                       dest / SASS, b.dir / cubin))
        entry["sass"] = SASS
    if verify_embedded:
        sealed: dict[bytes, str] = {}  # one copy of each distinct image this kernel embeds
        for container in (record.get("fatbin"), record.get("object")):
            if container:
                entry["embedded"] += _extract(tc.cuobjdump.path, b.dir, dest, container, entry,
                                              sealed)
    return entry


def _extract(cuobjdump: str, build_dir: Path, out_dir: Path, container: str,
             entry: dict[str, Any], sealed: dict[bytes, str]) -> list[dict[str, Any]]:
    """`cuobjdump -xelf all` into embedded/CONTAINER/ (each image gzipped); one record
    per image. The container is sealed gzipped: cuobjdump reads its bytes unpacked
    into a temporary directory (the argv names that copy), the images land in another.
    An image byte for byte one an earlier container of this kernel embedded (the object
    holds the fatbin, so both hold the cubin) is recorded against that sealed file
    (`sealed`: its bytes -> its path), not sealed twice: derive hashes the same bytes."""
    dest = out_dir / "embedded" / container
    dest.mkdir(parents=True)
    with (tempfile.TemporaryDirectory(prefix="rowgate-xelf-in-") as tmp_in,
          tempfile.TemporaryDirectory(prefix="rowgate-xelf-") as tmp):
        unpacked = Path(tmp_in) / container
        unpacked.write_bytes(compressed.read_bytes(sealed_output(build_dir, container)))
        argv = [cuobjdump, "-xelf", "all", str(unpacked)]
        entry["commands"].append(_tool(argv, dest.parent / f"{container}.xelf.log", unpacked,
                                       cwd=tmp, output=f"embedded/{container}.xelf.log"))
        images = []
        for f in sorted(Path(tmp).iterdir()):
            data = f.read_bytes()
            if data not in sealed:
                compressed.write_bytes(compressed.gzipped(dest / f.name), data)
                sealed[data] = f"embedded/{container}/{f.name}{compressed.SUFFIX}"
            images.append({"container": container, "file": sealed[data]})
    return images


# --------------------------------------------------------------------------- derive


@dataclass
class AuditFindings:
    violations: list[resources.Violation] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    cells: dict[str, dict[str, MetricValue]] = field(default_factory=dict)
    images_verified: int = 0


SHOWN = 6
"""Violations a reason names (the rest are counted; all are in the cells)."""


def _violations_reason(violations: list[resources.Violation]) -> str:
    """One line: builds that failed counted and the first named once (the build gate
    reports each), then the first budget or SASS violations."""
    failed = [v for v in violations if v.what == "build"]
    others = [v for v in violations if v.what != "build"]
    parts = []
    if failed:
        first = failed[0]
        line = str(first.measured).strip().splitlines()[0] if str(first.measured).strip() else ""
        parts.append(f"{len(failed)} kernel build(s) not clean (first {first.kernel} "
                     f"{first.arch}: {line})")
    if others:
        more = f" (+{len(others) - SHOWN} more)" if len(others) > SHOWN else ""
        parts.append("; ".join(str(v).splitlines()[0] for v in others[:SHOWN]) + more)
    return f"{len(violations)} violation(s): " + "; ".join(parts)


def derive_audit(artifact_dir: Path, build_gates: frozenset[str] = frozenset()) -> Derived:
    """`build_gates`: the row's build gate ids, the only gates an entry may reference
    (an entry with `build_ref` reads its build from `artifacts/GATE-ID/` beside this)."""
    try:
        manifest = kernels.parse((artifact_dir / BUDGETS).read_text(), BUDGETS)
        entries = read_json(artifact_dir / AUDIT_INDEX)
    except (OSError, GateError, ValueError) as exc:
        raise GateError(f"audit artifacts unreadable in {artifact_dir}: {exc}") from exc
    copied = any(_audit_ref.KEY not in e for e in entries)
    records = {(e["arch"], e["kernel"]): (e, r) for e, r in read_index(artifact_dir)} if copied else {}
    found = AuditFindings()
    for entry in entries:
        build_root, index_entry, record = _source(artifact_dir, entry, records, build_gates, found)
        if record is not None:
            _judge(artifact_dir, build_root, manifest, entry, index_entry, record, found)
    metrics: dict[str, MetricValue] = {"entry_points": len(found.cells), "violations": len(found.violations),
                                       "embedded_images_verified": found.images_verified,
                                       "sass_pending": len(found.pending)}
    if found.violations:
        return Derived(Status.FAIL, _violations_reason(found.violations), metrics, found.cells)
    if found.pending:
        return Derived(Status.PENDING, "budgets hold; SASS not checked: " + found.pending[0],
                       metrics, found.cells)
    project = sum(1 for e in entries if e.get("project_build"))
    bare = sum(1 for e in entries if e["embedded_checked"] and not e["embedded"]
               and not e.get("project_build"))
    images = f"{found.images_verified} embedded image(s) match the build"
    if bare:
        images += f", {bare} NVRTC build(s) are bare cubins (no fatbin to unpack)"
    if project:
        images += (f", {project} build(s) by the project's own build (the device code "
                   f"extracted from its outputs)")
    return Derived(Status.PASS, f"{len(found.cells)} entry point(s) within budget, SASS rules "
                                f"hold, {images}", metrics, found.cells)


def _read(path: Path) -> str:
    """A text artifact (gzipped when named `.gz`)."""
    try:
        return compressed.read_text(path, errors="replace")
    except (OSError, EOFError) as exc:
        raise GateError(f"{path}: unreadable: {exc}") from exc


def _source(root: Path, entry: dict[str, Any], copied: dict[tuple[str, str], Any],
            build_gates: frozenset[str], found: AuditFindings
            ) -> tuple[Path, dict[str, Any], dict[str, Any] | None]:
    """(the artifacts dir holding the entry's build, its index entry, its build.json):
    the audit's own copy, or the build gate's files it references, each checked
    against the digest the audit recorded (a mismatch is a violation, record None)."""
    ref = entry.get(_audit_ref.KEY)
    if ref is None:
        index_entry, record = copied[(entry["arch"], entry["kernel"])]
        return root, index_entry, record
    build_root, rel = _audit_ref.resolve(root.parent, ref, build_gates)
    problems = _audit_ref.file_problems(build_root, rel, ref["files"])
    record = None if problems else read_json(build_root / rel / cudabuild.BUILD_RECORD)
    if record is not None:
        problems = _audit_ref.unpinned(rel, ref["files"], record)
        if (record["arch"], record["kernel"]) != (entry["arch"], entry["kernel"]):
            problems.append(f"{build_root.name}/{rel} is the build of {record['kernel']} "
                            f"for {record['arch']}")
    for problem in problems:
        found.violations.append(resources.Violation(entry["kernel"], "*", entry["arch"],
                                                    "referenced build", problem,
                                                    "the bytes the audit inspected"))
    return build_root, {"dir": rel}, None if problems else record


def _judge(root: Path, build_root: Path, manifest: kernels.KernelManifest, entry: dict[str, Any],
           index_entry: dict[str, Any], record: dict[str, Any], found: AuditFindings) -> None:
    """One entry judged: its build read from `build_root` (the audit's own artifacts
    for a copied build), the audit's tool outputs from `root`."""
    name, arch = entry["kernel"], entry["arch"]
    kdir = root / entry["dir"]
    failed = build_problems(build_root, index_entry, record)
    if failed:
        found.violations.append(resources.Violation(name, "*", arch, "build", failed[0],
                                                    "a clean build"))
        return
    kernel = manifest.kernels[name]
    ptxas_log = next(s["log"] for s in record["steps"] if s["tool"] in ("ptxas", "nvcc"))
    report = resources.parse_ptxas(_read(build_root / index_entry["dir"] / ptxas_log))
    usage = (resources.parse_resource_usage(_read(kdir / entry["resource_usage"]))
             if entry["resource_usage"] else {})
    sass = resources.parse_sass(_read(kdir / entry["sass"])) if entry["sass"] else None
    if entry["sass_pending"]:
        found.pending.append(f"{name} {arch}: {entry['sass_pending']}")
    if sass is not None and sass.arches and set(sass.arches) != {arch}:
        found.violations.append(resources.Violation(name, "*", arch, "SASS arch",
                                                    ", ".join(sass.arches), arch))
    budget = kernel.budget(arch)
    for ep in _entries(name, arch, kernel, report, found):
        fn = report.get(ep.symbol)
        found.violations += resources.check_budget(name, ep.shown, arch, budget, fn,
                                                   usage.get(ep.symbol))
        if sass is not None:
            found.violations += resources.check_sass(name, kernel, ep.symbol, arch,
                                                     sass.opcodes.get(ep.symbol), ep.shown)
        cell = _cell(fn, usage.get(ep.symbol, {}), budget, sass, ep.symbol)
        if ep.symbol != ep.shown:
            cell["symbol"] = ep.symbol  # the mangled name the build has
        found.cells[f"{name}/{ep.shown}@{arch}"] = cell
    _check_images(root, entry, record, found)


def _entries(name: str, arch: str, kernel: kernels.Kernel,
             report: dict[str, resources.PtxasFunction],
             found: AuditFindings) -> list[symbols.Entry]:
    """The declared entry points resolved against what the build compiled (C++ patterns
    by demangled name); each declaration nothing matches is a violation naming what the
    build does have."""
    patterns = any(symbols.is_pattern(d) for d in kernel.entry_points)
    mangled = any(s.startswith("_Z") for s in report)
    demangled = symbols.demangle(report) if patterns or mangled else {}
    entries, missing = symbols.resolve(kernel.entry_points, report, demangled)
    for decl in missing:
        why = symbols.demangler_missing() if symbols.is_pattern(decl) else None
        found.violations.append(resources.Violation(
            name, decl, arch, "entry point", f"missing: the build has "
            f"{symbols.what_it_has(report, demangled)}" + (f" ({why})" if why else ""),
            "every declared entry point is compiled"))
    return entries


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


def _build_root(row: Row, spec: AuditGate, artifacts_root: Path) -> Path | None:
    """The artifacts of the row's one build gate before the audit, or None (none, or
    several: the audit then seals its own copy)."""
    try:
        return artifacts_root / build_gate_id(row, spec, "")
    except GateError:
        return None


class Audit(Gate[AuditGate]):
    kind = "audit"
    spec_model = AuditGate
    subject_steps = True
    reads_kernels = True
    report_view = "per_arch"
    options = TOOLCHAIN_KEYS

    def measure(self, row: Row, spec: AuditGate, ctx: GateContext) -> None:
        measure_audit(ctx.repo, gate_arches(row, spec.arches), spec.kernels, ctx.options,
                      ctx.artifact_dir, ctx.progress, spec.verify_embedded_images,
                      _build_root(row, spec, ctx.artifact_dir.parent), ctx.phase)

    def derive(self, row: Row, spec: AuditGate, artifact_dir: Path) -> Derived:
        # Without a row (a bare artifact directory) no reference is honoured.
        build_gates = frozenset(g.id for g in getattr(row, "gates", [])
                                if getattr(g, "kind", "") == "build")
        return derive_known_layout(lambda d: derive_audit(d, build_gates), artifact_dir, "audit")

    def arch(self, row: Row, spec: AuditGate, ctx: GateContext) -> tuple[str, bool]:
        return ", ".join(gate_arches(row, spec.arches)), False  # every arch it audits
