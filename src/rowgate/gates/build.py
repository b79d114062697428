"""Build gate: every kernel of kernels.toml for every arch the row builds, warnings
as errors, with exact compiler versions and command lines; optionally, whether
the pinned Triton compiles ahead of time for each arch.

Raw artifacts (per arch and kernel, `ARCH/KERNEL/`): `build.json` (command lines,
return codes, toolchain with exact versions, output digests), each tool's log,
the PTX, cubin, fatbin and object (all but the cubin sealed gzipped: `NAME.ptx.gz`,
`NAME.o.gz`, `NAME.fatbin.gz`). `builds.json` indexes them. With `aot_reachability`,
`triton-aot/ARCH.json` holds Triton's answer per arch.
"""

from __future__ import annotations

import contextvars
import json
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field

from rowgate import compressed
from rowgate.cuda import cudabuild, kernels, toolchains
from rowgate.cuda.resources import sha256_file
from rowgate.errors import Error
from rowgate.gates.artifacts import derive_known_layout, read_json
from rowgate.gates.interface import Derived, Gate, GateContext, GateError, Progress
from rowgate.records.status import MetricValue, Status
from rowgate.rows.options import TOOLCHAIN_KEYS
from rowgate.rows.spec import ARCH_PATTERN, GateSpec

if TYPE_CHECKING:
    from rowgate.rows.row import Row

INDEX = "builds.json"
MANIFEST_COPY = "kernels.toml"
AOT_DIR = "triton-aot"
AOT_TIMEOUT_S = 600


class BuildGate(GateSpec):
    kind: Literal["build"]
    arches: list[Annotated[str, Field(pattern=ARCH_PATTERN)]] = []
    """Arches to build; empty means the row's `target.build_arches`."""
    kernels: list[str] = []
    """Kernel names from kernels/kernels.toml; empty means all."""
    aot_reachability: bool = False
    """Also record whether the pinned Triton compiles ahead of time per arch."""
    aot_arches: list[Annotated[str, Field(pattern=ARCH_PATTERN)]] = []
    """Arches the Triton AOT probe asks about (e.g. ones a release omits); empty
    means the arches built."""


@dataclass(frozen=True)
class Built:
    arch: str
    kernel: str
    dir: Path
    """The build's directory as copied under the artifact dir."""
    toolchain: toolchains.Toolchain


def gate_arches(row: Row, spec_arches: list[str]) -> list[str]:
    return list(spec_arches) or row.build_arches()


def build_into(repo: Path, arches: list[str], names: list[str], options: dict[str, str],
               out: Path, progress: Progress) -> list[Built]:
    """Build (or find cached) each kernel for each arch and copy each build to
    `out/ARCH/KERNEL/`; write the index. Raises GateError when a toolchain or
    kernels.toml is unusable (the gate broke, nothing was measured)."""
    try:
        manifest = kernels.load(repo)
        plan = [(arch, name) for arch in arches for name in manifest.select(names, arch)]
    except Error as exc:
        raise GateError(exc.diagnostics()) from exc
    if not plan:
        raise GateError(f"nothing to build: no kernel in kernels.toml targets "
                        f"{', '.join(arches)}")
    chains, missing = arch_toolchains(arches, options)
    plan = [(arch, name) for arch, name in plan if arch in chains]
    out.mkdir(parents=True, exist_ok=True)
    # The declarations in force (budgets, operators, Triton kernels) travel with the
    # builds: the audit judges by them and the operator, phase and AOT gates read them
    # from here, so everything comes from the gated commit.
    (out / MANIFEST_COPY).write_text(kernels.manifest_text(repo))  # confined
    built = []
    for (arch, name), b in zip(plan, _compile_all(repo, manifest, plan, chains, progress)):
        dest = out / arch / name
        seal_build(b, dest)
        built.append(Built(arch, name, dest, chains[arch]))
    (out / INDEX).write_text(json.dumps(
        [{"arch": b.arch, "kernel": b.kernel, "dir": f"{b.arch}/{b.kernel}"} for b in built],
        indent=2) + "\n")
    if missing:
        raise missing_toolchains(missing, list(chains), "built")
    return built


def build_jobs(n: int) -> int:
    """How many compiles run at once: one per CPU this process may use (a compile is one
    single-threaded cicc/ptxas chain), never more than there are builds."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(n, cpus or 1))


def build_kernel(repo: Path, manifest: kernels.KernelManifest, name: str, arch: str,
                 chain: toolchains.Toolchain) -> cudabuild.BuildDir:
    """`cudabuild.build` for a gate (this one's builds, the phase gate's variants): a
    compile killed by a signal cached nothing and measured nothing, so the gate ERRORs."""
    try:
        return cudabuild.build(repo, manifest, name, arch, chain)
    except cudabuild.BuildInterrupted as exc:
        raise GateError(exc.diagnostics()) from exc


def _compile_all(repo: Path, manifest: kernels.KernelManifest, plan: list[tuple[str, str]],
                 chains: dict[str, toolchains.Toolchain],
                 progress: Progress) -> list[cudabuild.BuildDir]:
    """Each (arch, kernel) of `plan` built (or found cached), in plan order. The compiles
    are independent subprocesses, so they run side by side: a row's kernels for three
    arches take the time of the slowest few, not of all of them in a row."""
    jobs = build_jobs(len(plan))
    tools = ", ".join(sorted({chains[arch].short() for arch, _ in plan}))
    if plan:  # nothing to build (no arch has a toolchain): the gate's ERROR says why
        progress.update(f"build {len(plan)} kernel(s) with {tools}, {jobs} at a time")
    with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="build") as pool:
        # each compile in a copy of this context: the row's sandbox policy goes with it
        futures = {pool.submit(contextvars.copy_context().run, build_kernel, repo, manifest,
                               name, arch, chains[arch]): (arch, name) for arch, name in plan}
        try:
            for k, done in enumerate(as_completed(futures), 1):
                arch, name = futures[done]
                progress.update(f"built {name} for {arch} ({k}/{len(plan)})")
        except BaseException:  # an interrupt: start nothing more (running compiles end)
            pool.shutdown(cancel_futures=True)
            raise
        return [f.result() for f in futures]  # submission order is plan order


def missing_toolchains(missing: dict[str, str], done: list[str], verb: str) -> GateError:
    """The ERROR of a gate that could do its work for `done` only: each arch without a
    toolchain and why, then what was done (`verb`: built, audited)."""
    after = f" ({verb} for {', '.join(done)})" if done else ""
    return GateError("; ".join(f"{arch}: {why}" for arch, why in missing.items()) + after)


def arch_toolchains(arches: list[str], options: dict[str, str]
                ) -> tuple[dict[str, toolchains.Toolchain], dict[str, str]]:
    """The toolchain of each arch, and why each arch without one has none. Why not stop
    at the first missing one: a stand-in's gates (an sm_70 row's operator A/B on an
    sm_90 GPU) measure the build gate's outputs for the arch at hand, so the arches that
    can be built are built and sealed, and the gate still ERRORs naming what is missing."""
    chains, missing = {}, {}
    for arch in arches:
        try:
            chains[arch] = toolchains.for_options(arch, options)
        except Error as exc:
            missing[arch] = exc.diagnostics()
    return chains, missing


def seal_build(b: cudabuild.BuildDir, dest: Path) -> None:
    """Copy a cached build to `dest` as gates seal it: logs and build.json as written,
    the cubin plain, every other output (PTX, object, fatbin) gzipped.

    Why gzip rather than leave them out of gates that only repeat the build gate's
    copy (the audit, the phase gate's full variant): each gate's artifacts then stand
    alone, every byte its derive or a reviewer needs is in them under the manifest,
    and `rowgate build` (no build gate) seals the same layout. Gzip takes these
    3-6x down; the cubin stays plain because later gates load it and tools read it as
    is (operator, phase, AOT; `cuobjdump -sass`). Their digests in build.json are of
    the content, checked at derive (`output_problems`)."""
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(b.path, dest)
    for name in b.record["outputs"]:
        if name != b.record.get("cubin") and (dest / name).is_file():
            compressed.compress_in_place(dest / name)


def sealed_output(build_dir: Path, name: str) -> Path:
    """Where output `name` of a sealed build lies: `NAME.gz`, or `NAME` in a bundle
    sealed before outputs were compressed (and always for the cubin)."""
    return compressed.either(build_dir / name)


def output_problems(build_dir: Path, record: dict[str, Any]) -> list[str]:
    """Each output the build recorded, read back (decompressed) from the sealed copy
    and hashed against the digest build.json names: one line per one missing or not
    the bytes built."""
    out = []
    for name, digest in record["outputs"].items():
        path = sealed_output(build_dir, name)
        try:
            actual = sha256_file(path)
        except (OSError, EOFError) as exc:
            out.append(f"{record['kernel']} {record['arch']}: output {path.name} unreadable: {exc}")
            continue
        if actual != digest:
            out.append(f"{record['kernel']} {record['arch']}: output {path.name} has sha256 "
                       f"{actual[:16]}, not the {digest[:16]} its build recorded")
    return out


def read_index(artifact_dir: Path) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """[(index entry, build.json)] from a build's artifacts; GateError if unreadable."""
    try:
        index = read_json(artifact_dir / INDEX)
        return [(e, read_json(artifact_dir / e["dir"] / cudabuild.BUILD_RECORD)) for e in index]
    except (GateError, KeyError, TypeError) as exc:
        raise GateError(f"build artifacts unreadable in {artifact_dir}: {exc}") from exc


def build_problems(artifact_dir: Path, entry: dict[str, Any], record: dict[str, Any]) -> list[str]:
    """Why one build (copied under `artifact_dir/entry["dir"]`) failed or is not the
    build recorded, or []."""
    build_dir = artifact_dir / entry["dir"]
    try:
        return cudabuild.problems(build_dir, record) + output_problems(build_dir, record)
    except OSError as exc:
        raise GateError(f"{entry['dir']}: build log unreadable: {exc}") from exc


def derive_builds(artifact_dir: Path) -> Derived:
    builds = read_index(artifact_dir)
    problems: list[str] = []
    cells: dict[str, dict[str, MetricValue]] = {}
    metrics: dict[str, MetricValue] = {"builds": len(builds)}
    for entry, record in builds:
        failed = build_problems(artifact_dir, entry, record)
        problems += failed
        tc = record["toolchain"]
        metrics[f"toolchain_{record['arch']}"] = _toolchain_line(tc)
        cells[f"{record['kernel']}@{record['arch']}"] = {
            "status": "FAIL" if failed else "PASS",
            "cubin_sha256": record["outputs"].get(record.get("cubin") or "", ""),
            "toolchain": _toolchain_line(tc)}
    metrics["failed_builds"] = sum(1 for c in cells.values() if c["status"] == "FAIL")
    aot = _derive_aot(artifact_dir, metrics, cells)
    if problems:
        return Derived(Status.FAIL, "; ".join(problems) + aot, metrics, cells)
    arches = sorted({r["arch"] for _, r in builds})
    return Derived(Status.PASS, f"{len(builds)} build(s) clean with warnings as errors "
                                f"({', '.join(arches)})" + aot, metrics, cells)


def _toolchain_line(tc: dict[str, Any]) -> str:
    parts = [f"{tc['name']} {tc['compiler']['version']}"]
    if tc.get("ptxas"):
        parts.append(f"ptxas {tc['ptxas']['version']}")
    if tc.get("host_compiler"):
        parts.append(f"g++ {tc['host_compiler']['version']}")
    return " + ".join(parts)


# ------------------------------------------------------------ Triton AOT reachability


def measure_aot(arches: list[str], out: Path, progress: Progress) -> None:
    """Ask the installed (pinned) Triton to compile a representative kernel ahead of
    time for each arch, in a subprocess with a private cache: the answer is a fact."""
    (out / AOT_DIR).mkdir(parents=True, exist_ok=True)
    for arch in arches:
        progress.update(f"Triton AOT for {arch}")
        with tempfile.TemporaryDirectory(prefix="rowgate-triton-") as cache:
            env = dict(os.environ, TRITON_CACHE_DIR=cache)
            argv = [sys.executable, "-m", "rowgate.cuda._triton_aot", arch]
            try:
                proc = subprocess.run(argv, capture_output=True, text=True, env=env,
                                      timeout=AOT_TIMEOUT_S, check=False)
                stdout, stderr, rc = proc.stdout, proc.stderr, proc.returncode
            except subprocess.TimeoutExpired:
                stdout, stderr, rc = "", f"timed out after {AOT_TIMEOUT_S}s", 124
        try:
            answer = json.loads(stdout)
        except ValueError:
            # The probe died (LLVM aborts on an arch it cannot select for): its
            # stderr is the answer; the version comes from the installed metadata.
            answer = {"arch": arch, "reachable": False, "triton": _installed("triton"),
                      "error": f"probe exited {rc}: {stderr.strip()[-2000:]}"}
        answer["argv"] = argv
        (out / AOT_DIR / f"{arch}.json").write_text(json.dumps(answer, indent=2) + "\n")
        (out / AOT_DIR / f"{arch}.stderr.log").write_text(stderr)


def _installed(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _derive_aot(artifact_dir: Path, metrics: dict[str, MetricValue],
                cells: dict[str, dict[str, MetricValue]]) -> str:
    files = sorted((artifact_dir / AOT_DIR).glob("sm_*.json"))
    said = []
    for f in files:
        a = read_json(f)
        metrics[f"triton_aot_{a['arch']}"] = "yes" if a["reachable"] else "no"
        cells[f"triton-aot@{a['arch']}"] = {"reachable": a["reachable"], "triton": a["triton"],
                                            "error": a.get("error") or ""}
        said.append(f"{a['arch']} {'yes' if a['reachable'] else 'no: ' + _first(a['error'])}")
    if not files:
        return ""
    version = read_json(files[0]).get("triton") or "not installed"
    return f"; Triton {version} AOT: " + ", ".join(said)


def _first(text: str | None) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    fatal = [ln for ln in lines if "fatal" in ln or "error" in ln.lower()]
    return (fatal[-1] if fatal else lines[0] if lines else "unknown")[:200]


class Build(Gate[BuildGate]):
    kind = "build"
    spec_model = BuildGate
    subject_steps = True
    reads_kernels = True
    report_view = "per_arch"
    options = TOOLCHAIN_KEYS

    def measure(self, row: Row, spec: BuildGate, ctx: GateContext) -> None:
        arches = gate_arches(row, spec.arches)
        with ctx.phase("compile"):
            build_into(ctx.repo, arches, spec.kernels, ctx.options, ctx.artifact_dir,
                       ctx.progress)
        if spec.aot_reachability:
            with ctx.phase("AOT reachability"):
                measure_aot(spec.aot_arches or arches, ctx.artifact_dir, ctx.progress)

    def derive(self, row: Row, spec: BuildGate, artifact_dir: Path) -> Derived:
        return derive_known_layout(derive_builds, artifact_dir, "build")

    def arch(self, row: Row, spec: BuildGate, ctx: GateContext) -> tuple[str, bool]:
        return ", ".join(gate_arches(row, spec.arches)), False  # every arch it builds
