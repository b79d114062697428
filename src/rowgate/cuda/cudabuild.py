"""Build one kernel of kernels.toml for one arch, warnings as errors, cached.

Each build is a directory holding everything the gates and a reviewer need: the
exact command lines (`build.json`), each tool's log, the PTX, the cubin, and for
nvcc builds the fatbin and the object that embeds it, with sha256 digests.
Directories live in rowgate's cache, outside the subject (`rowgate.cuda.cache`):
`kernels/NAME/ARCH/KEY/`, KEY = sha256 of the sources, the flags and the toolchain's
exact versions: an unchanged re-run finds its directory, checks every output against the
digest it was recorded with (one that does not match is built again) and compiles
nothing. Failed
builds are cached too (the same inputs fail the same way). Nothing is written into
the subject: compilers run in a work directory of the cache, reading its sources.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rowgate import sandbox, storage
from rowgate.cuda import (
    cache,
    debian_toolkit,
    library_headers,
    project_build,
    resources,
    toolchains,
)
from rowgate.cuda import kernels as kernels_toml
from rowgate.cuda.kernels import KERNELS_DIR, Kernel, KernelManifest
from rowgate.cuda.toolchains import Toolchain
from rowgate.errors import Error

BUILD_RECORD = "build.json"
COMPILE_TIMEOUT_S = 600
SPILL_WARNINGS = ("-warn-spills", "-warn-lmem-usage")
"""Left out when a kernel says `spill_warnings = "audit"`: ptxas still reports every
function's spills and local memory (`-v`), and the audit judges the declared entry points."""
HOST_WARNING_FLAGS = ["-Wall", "-Wextra", "-Werror"]
"""Passed to the host compiler with -Xcompiler unless the kernel says `host_warnings =
"off"`."""
CXX_STD = "c++17"
RECIPE = 3
"""Bump when the command lines below change: part of every cache key. 3: the NVRTC
driver moved to `rowgate.cuda._nvrtc` (a cached build would record the old module)."""
_SAYS = re.compile(r"\b(error|warning|fatal)\b", re.IGNORECASE)


class BuildFailed(Error):
    """A kernel did not build clean (a warning counts): names the kernel, arch and line."""


class BuildInterrupted(Error):
    """A compile died by a signal: no outcome of the kernel's, so none is cached."""


@dataclass(frozen=True)
class BuildDir:
    path: Path
    record: dict[str, Any]
    cached: bool


def sm_number(arch: str) -> str:
    """`sm_90a` -> `90a`."""
    return arch.removeprefix("sm_")


def cache_key(source_digest: str, kernel: dict[str, Any], arch: str, toolchain: Toolchain) -> str:
    blob = json.dumps({"recipe": RECIPE, "source": source_digest, "kernel": kernel, "arch": arch,
                       "toolchain": toolchain.digest()}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def build(repo: Path, manifest: KernelManifest, name: str, arch: str, toolchain: Toolchain,
          cache_root: Path | None = None) -> BuildDir:
    """Build kernel `name` for `arch` (or find the cached build). Never raises for a
    compile failure: that is recorded (return codes, logs) for the gates to judge."""
    kernel = manifest.kernels[name]
    digest = kernels_toml.source_digest(repo, manifest, name)
    libs = library_headers.resolve(kernel.headers, toolchain)
    key = cache_key(digest, {**kernel.model_dump(mode="json"),
                             "headers": [h.identity() for h in libs]}, arch, toolchain)
    final = (cache_root or cache.kernels()) / name / arch / key[:24]
    reused = _verified(final)
    if reused is not None:
        return BuildDir(final, reused, cached=True)
    with storage.one_builder(final):
        # another process (two gates, two runs) may have built it while this one waited
        reused = _verified(final)
        if reused is not None:
            return BuildDir(final, reused, cached=True)
        return _build(repo, manifest, name, arch, toolchain, kernel, digest, libs, key, final)


def _build(repo: Path, manifest: KernelManifest, name: str, arch: str, toolchain: Toolchain,
           kernel: Kernel, digest: str, libs: list[library_headers.LibraryHeaders], key: str,
           final: Path) -> BuildDir:
    work = Path(tempfile.mkdtemp(prefix=f".{key[:12]}-", dir=final.parent))
    try:
        root = repo / KERNELS_DIR
        src = root / kernel.source
        includes = [str(root / inc) for inc in manifest.include_dirs]
        includes += [d for h in libs for d in h.include_dirs()]  # after the subject's own
        defines = [f"-D{d}" for d in kernel.defines]
        if kernel.build is not None:
            steps = _project_steps(repo, arch, toolchain, kernel, work, libs)
        elif toolchain.kind == "nvrtc":
            steps = _nvrtc_steps(name, arch, toolchain, src, includes, defines, kernel)
        else:
            steps = _nvcc_steps(name, arch, toolchain, src, includes, defines, kernel)
        record: dict[str, Any] = {
            "kernel": name, "arch": arch,
            "source": f"{KERNELS_DIR}/{kernel.source}" if kernel.source else "(its own build)",
            "source_digest": digest, "cache_key": key, "recipe": RECIPE,
            "toolchain": toolchain.describe(), "steps": [], "outputs": {},
            "headers": [h.identity() for h in libs]}
        reads = [repo.resolve(), *toolchain.roots(), *(Path(h.include_dir) for h in libs),
                 *_link_targets(libs)]
        for step in steps:
            done = _run(step, work, reads)
            record["steps"].append(done)
            if done["returncode"] < 0:
                # Killed by a signal (an interrupt reaching the compile, the OOM killer):
                # the machine's doing, not the inputs', so it must not be cached as this
                # kernel's failure. Builds run side by side (gates/build.py), and Ctrl-C
                # reaches every compile of the process group at once.
                raise BuildInterrupted(f"{done['tool']} building {name} for {arch} was "
                                       f"killed by signal {-done['returncode']}; nothing "
                                       f"was cached, build again")
            if done["returncode"] != 0:
                break
        if kernel.build is not None:
            record["steps"].append(project_build.compiler_step(work))
            project_build.collect(name, arch, work, record, kernel, toolchain,
                                  COMPILE_TIMEOUT_S)
        else:
            _collect(name, arch, work, record)
        (work / BUILD_RECORD).write_text(json.dumps(record, indent=2) + "\n")
        if final.exists():  # a concurrent build got there first: identical inputs
            shutil.rmtree(work)
        else:
            os.replace(work, final)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return BuildDir(final, record, cached=False)


def _verified(final: Path) -> dict[str, Any] | None:
    """The cached build's record if every output it names still has the digest it was
    recorded with; else None, and a build that does not hold (a truncated cubin, a file
    edited in the cache, a record cut short) is removed so it is built again."""
    if not final.exists():
        return None  # never built
    try:
        record: dict[str, Any] = json.loads((final / BUILD_RECORD).read_text())
        if all(hashlib.sha256((final / out).read_bytes()).hexdigest() == digest
               for out, digest in record["outputs"].items()):
            return record
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass  # a missing or unreadable file, a record of the wrong shape: not intact
    shutil.rmtree(final, ignore_errors=True)
    return None


def _nvrtc_steps(name: str, arch: str, tc: Toolchain, src: Path, includes: list[str],
                 defines: list[str], kernel: Kernel) -> list[dict[str, Any]]:
    sm = sm_number(arch)
    nvrtc = [sys.executable, "-m", "rowgate.cuda._nvrtc", tc.compiler.path, str(src), f"{name}.ptx",
             f"--gpu-architecture=compute_{sm}", f"--std={CXX_STD}",
             *[f"-I{i}" for i in [*includes, *tc.include_dirs]], *defines]
    if tc.ptxas is None:
        raise toolchains.ToolchainError(f"{tc.name}: NVRTC builds need a standalone ptxas")
    ptxas = [tc.ptxas.path, f"-arch=sm_{sm}", "-Werror", *_spill_warnings(kernel), "-v", "-o",
             f"{name}.{arch}.cubin", f"{name}.ptx"]
    return [{"tool": "nvrtc", "argv": nvrtc, "log": "nvrtc.log"},
            {"tool": "ptxas", "argv": ptxas, "log": "ptxas.log"}]


def _nvcc_steps(name: str, arch: str, tc: Toolchain, src: Path, includes: list[str],
                defines: list[str], kernel: Kernel) -> list[dict[str, Any]]:
    # --keep leaves the exact cubin and fatbin nvcc embedded in the object
    argv = [tc.compiler.path, "-c", str(src), "-o", f"{name}.o", f"-std={CXX_STD}",
            *[f"-I{i}" for i in includes], *defines, *kernel.nvcc_flags,
            *_recipe_flags(kernel, arch), *toolkit_flags(tc), "--keep", "--keep-dir", "keep"]
    return [{"tool": "nvcc", "argv": argv, "log": "nvcc.log", "mkdir": "keep"}]


def toolkit_flags(tc: Toolchain) -> list[str]:
    """What the toolchain needs on every nvcc call: its host compiler where nvcc's
    default is too new (CUDA 11.8 and g++-11), its own notices silenced."""
    return [*(["-ccbin", tc.ccbin] if tc.ccbin else []), *tc.toolkit_flags]


def _recipe_flags(kernel: Kernel, arch: str) -> list[str]:
    """What rowgate adds to every nvcc call of a kernel, after the kernel's own options
    (so its warning flags come last): SASS for the arch plus its PTX (the portable JIT
    fallback) in one fatbin, warnings as errors for device code and ptxas, and the host
    compiler's warnings and flags."""
    sm = sm_number(arch)
    host = [*(HOST_WARNING_FLAGS if kernel.host_warnings == "errors" else []),
            *kernel.host_flags]
    return ["-gencode", f"arch=compute_{sm},code=[sm_{sm},compute_{sm}]",
            "-Werror", "all-warnings", "-Xptxas", ",".join(["-v", *_spill_warnings(kernel)]),
            *(["-Xcompiler", ",".join(host)] if host else [])]


def _spill_warnings(kernel: Kernel) -> tuple[str, ...]:
    """ptxas' spill and local-memory warnings (errors under -Werror), unless the kernel
    leaves spills to the audit; `-v`, the report the audit reads, is always on."""
    return SPILL_WARNINGS if kernel.spill_warnings == "errors" else ()


def _link_targets(libs: list[library_headers.LibraryHeaders]) -> list[Path]:
    """The link-name directories and the directories their links point into."""
    out: list[Path] = []
    for h in libs:
        if h.lib_dir:
            out.append(Path(h.lib_dir))
            out += sorted({p.resolve().parent for p in Path(h.lib_dir).iterdir()})
    return out


def _project_steps(repo: Path, arch: str, tc: Toolchain, kernel: Kernel, work: Path,
                   libs: list[library_headers.LibraryHeaders]) -> list[dict[str, Any]]:
    """The project's own build, in a copy of the subject, through rowgate's nvcc wrapper
    (`rowgate.cuda.project_build`), with the flags rowgate's recipe would use."""
    if tc.kind != "nvcc":
        raise toolchains.ToolchainError(
            f"{tc.name}: a project's own build needs nvcc ({arch} builds through NVRTC "
            f"here): {debian_toolkit.INSTALL}, or --option nvcc_sm70=PATH")
    header_dirs = [d for h in libs for d in h.include_dirs()]
    lib_dirs = [h.lib_dir for h in libs if h.lib_dir]
    flags = [*kernel.nvcc_flags, *[f"-I{d}" for d in header_dirs],
             *[f"-L{d}" for d in lib_dirs], *_recipe_flags(kernel, arch), *toolkit_flags(tc)]
    src = project_build.copy_subject(repo, work)
    wrapper = project_build.write_wrapper(work, tc, flags)
    return project_build.steps(kernel, arch, wrapper, src, header_dirs, lib_dirs)


def _run(step: dict[str, Any], work: Path, reads: list[Path]) -> dict[str, Any]:
    """One compile step: the subject's code compiled in the sandbox, its sources, the
    toolchain and the declared library headers read-only (an `#include` of anything
    else finds nothing), only `work` writable (a project's own build runs in its copy
    there, `cwd`, with rowgate's nvcc wrapper)."""
    if "mkdir" in step:
        (work / step["mkdir"]).mkdir()
    done = sandbox.run(sandbox.Step(step["argv"], cwd=Path(step.get("cwd", work)),
                                    writable=[work], read_only=reads,
                                    env=step.get("env", {}),
                                    path_dirs=step.get("path_dirs", ()),
                                    limits=sandbox.Limits(wall_s=COMPILE_TIMEOUT_S)),
                       merged=True)
    out = done.stdout
    if done.limit:
        out += f"\nstopped at its {done.limit} limit\n".encode()
    if done.returncode == 127:
        out += f"{step['argv'][0]}: cannot run: not found\n".encode()
    (work / step["log"]).write_bytes(out)
    return {"tool": step["tool"], "argv": step["argv"], "returncode": done.returncode,
            "log": step["log"]}


def _collect(name: str, arch: str, work: Path, record: dict[str, Any]) -> None:
    """Keep the outputs that matter (cubin, PTX, fatbin, object) and digest them."""
    keep = work / "keep"
    if keep.is_dir():
        stem = record["source"].rsplit("/", 1)[-1].removesuffix(".cu")
        for src, dst in ((f"{stem}.{arch}.cubin", f"{name}.{arch}.cubin"),
                         (f"{stem}.fatbin", f"{name}.fatbin"), (f"{stem}.ptx", f"{name}.ptx")):
            if (keep / src).is_file():
                os.replace(keep / src, work / dst)
        shutil.rmtree(keep)
    for out in (f"{name}.ptx", f"{name}.{arch}.cubin", f"{name}.fatbin", f"{name}.o"):
        if (work / out).is_file():
            record["outputs"][out] = hashlib.sha256((work / out).read_bytes()).hexdigest()
    record["cubin"] = f"{name}.{arch}.cubin" if f"{name}.{arch}.cubin" in record["outputs"] else None
    record["fatbin"] = f"{name}.fatbin" if f"{name}.fatbin" in record["outputs"] else None
    record["object"] = f"{name}.o" if f"{name}.o" in record["outputs"] else None


def problems(build_dir: Path, record: dict[str, Any]) -> list[str]:
    """Why a build failed (return codes, warning/error lines quoted), or [] when clean.
    Reads the logs in `build_dir`; raises OSError when one is missing."""
    out = []
    for step in record["steps"]:
        log = (build_dir / step["log"]).read_text(errors="replace")
        # a project's own build tool prints what it likes; its compilers' output is the
        # `nvcc` step's log (every call through rowgate's wrapper), judged line by line.
        # Only a failed build tool is quoted: its lines that say error, and what follows
        # the first (CMake's reason comes on the next line).
        project = step["tool"] == "project"
        diags = (_tool_said(log) if step["returncode"] != 0 else []) if project \
            else resources.diagnostics(log, step["tool"])
        if step["returncode"] != 0 or diags:
            # The warning/error lines themselves, not the "In function …" context.
            said = (diags if project else [d.strip() for d in diags if _SAYS.search(d)]) \
                or diags[:1] or ["(no output)"]
            text = " | ".join(said[:3]) + (f" (+{len(said) - 3} more)" if len(said) > 3 else "")
            out.append(f"{record['kernel']} {record['arch']}: {step['tool']} exited "
                       f"{step['returncode']}: {text}{_nvrtc_hint(step['tool'], log)}")
    out += project_build.problems(record) if not out else []
    if not out and not record.get("cubin"):
        out.append(f"{record['kernel']} {record['arch']}: no cubin was produced")
    return out


NVRTC_NO_HOST = "cannot open source file"


def _nvrtc_hint(tool: str, log: str) -> str:
    """NVRTC has no host compiler, so no libc/libstdc++ headers: say which toolchain has."""
    if tool != "nvrtc" or NVRTC_NO_HOST not in log:
        return ""
    return (f" (NVRTC compiles device code only, without the host's headers: build sm_70 "
            f"with an nvcc, `{debian_toolkit.INSTALL}` or --option nvcc_sm70=PATH)")


def _tool_said(log: str) -> list[str]:
    """A failed build tool's first error line and the line after it (CMake: `CMake Error
    at …` then the reason), or its last line."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    first = next((i for i, line in enumerate(lines) if _SAYS.search(line)), None)
    if first is None:
        return lines[-1:]
    return lines[first:first + 2]


def cubin(repo: Path, name: str, arch: str, nvcc: str | None = None) -> Path:
    """The cubin of kernel `name` for `arch`, built (or found in the cache) exactly as
    the build gate builds it. For loaders (src/rowgate/ops). Raises KernelsError,
    ToolchainError, BuildFailed quoting the first problem, or BuildInterrupted."""
    manifest = kernels_toml.load(repo)
    manifest.select([name], arch)
    built = build(repo, manifest, name, arch, toolchains.for_arch(arch, nvcc))
    failed = problems(built.path, built.record)
    if failed:
        raise BuildFailed(f"{failed[0]} (logs: {built.path})")
    cubin_name: str = built.record["cubin"]
    return built.path / cubin_name
