"""A kernel built by the project's own build (Make, CMake, a script) with rowgate's arch
and warning policy injected, its device code taken from what the build left.

kernels.toml says how the project builds itself (`[kernels.NAME.build]`: `commands`, run
in order in a private writable copy of the subject, and `outputs`, the files holding the
kernel's device code). Every nvcc the build runs is rowgate's **nvcc wrapper**: first on
`PATH`, and in `NVCC` / `CUDACXX` (Make's and CMake's variables) and `{nvcc}` in a
command. The wrapper drops the project's own arch options, adds rowgate's (`-gencode`
for the arch being built, SASS plus PTX), its warnings-as-errors flags and the kernel's
`nvcc_flags`, runs the real nvcc, and records the exact command line and what it printed.
Afterwards cuobjdump extracts the arch's cubin from the outputs, and the audit judges it
like any other build. A build whose device code did not come through the wrapper (it
called an nvcc by path) is refused: nothing was recorded for it.

Everything runs in the sandbox (commands and cuobjdump alike), the subject's copy the
only writable place.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rowgate import sandbox
from rowgate.cuda import resources
from rowgate.cuda.kernels import Kernel
from rowgate.cuda.toolchains import Toolchain

WRAPPER_DIR = "nvcc-wrapper"
CALLS = "nvcc-calls.jsonl"
COMPILER_LOG = "nvcc.log"
PROBES_LOG = "nvcc-probes.log"
SOURCE_COPY = "src"
DROPPED = ("-gencode", "--generate-code", "-arch", "--gpu-architecture", "-code", "--gpu-code")
"""nvcc options that choose arches: the project's are dropped, rowgate's arch is built."""
INPUTS = (".cu", ".c", ".cc", ".cpp", ".cxx", ".ptx", ".o", ".obj", ".a", ".cubin", ".fatbin")
"""What an nvcc call compiles or links. A call naming none is a *probe* (`nvcc --version`,
CMake's `nvcc -v __cmake_determine_cuda`, which fails by design: CMake reads what it
prints): its return code is recorded, not judged. Every call that compiles or links is
judged by its return code, even one the project's build shrugged off (a `make -k` or
`|| true` must not hide a warning rowgate made an error)."""
VERBOSE = ("-v", "--verbose", "-Xcompiler=-v", "-dryrun", "--dryrun")
"""A call that asks nvcc or the host compiler to trace itself (CMake's compiler checks
do): what it prints is a trace, not diagnostics, so it goes to the probes' log; its
return code is still judged (warnings are errors, so a warning fails it)."""

_WRAPPER = '''#!{python}
"""rowgate's nvcc wrapper for one project build (written by rowgate.cuda.project_build)."""
import json
import subprocess
import sys

REAL, CALLS, LOG, PROBES = {real!r}, {calls!r}, {log!r}, {probes!r}
FLAGS = {flags!r}
DROPPED = {dropped!r}
INPUTS = {inputs!r}
VERBOSE = {verbose!r}
args, skip = [], False
for arg in sys.argv[1:]:
    if skip:
        skip = False
        continue
    head = arg.split("=", 1)[0]
    if head in DROPPED:
        skip = "=" not in arg
        continue
    if arg.startswith("-arch") and arg[5:6] in ("s", "c"):  # -archsm_80 style
        continue
    args.append(arg)
argv = [REAL, *args, *FLAGS]
done = subprocess.run(argv, capture_output=True)
sys.stdout.buffer.write(done.stdout)
sys.stderr.buffer.write(done.stderr)
probe = not any(a.endswith(INPUTS) for a in args if not a.startswith("-"))
verbose = any(a in VERBOSE or (a == "-v" and b == "-Xcompiler") for b, a in zip([""] + args, args))
with open(PROBES if probe or verbose else LOG, "ab") as f:
    f.write(done.stdout + done.stderr)
with open(CALLS, "a") as f:
    f.write(json.dumps({{"argv": argv, "returncode": done.returncode, "probe": probe,
                        "verbose": verbose}}) + "\\n")
sys.exit(done.returncode)
'''


def copy_subject(repo: Path, work: Path) -> Path:
    """The subject's files (not its .git) in `work/src`: the build writes there only."""
    dest = work / SOURCE_COPY
    shutil.copytree(repo, dest, symlinks=True, ignore=shutil.ignore_patterns(".git"))
    return dest


def write_wrapper(work: Path, tc: Toolchain, flags: list[str]) -> Path:
    """The wrapper script `work/nvcc-wrapper/nvcc`, its flags and paths written in (a
    step's environment carries nothing of rowgate's)."""
    wrapper = work / WRAPPER_DIR / "nvcc"
    wrapper.parent.mkdir()
    wrapper.write_text(_WRAPPER.format(python=sys.executable, real=tc.compiler.path,
                                       calls=str(work / CALLS), log=str(work / COMPILER_LOG),
                                       probes=str(work / PROBES_LOG), flags=flags,
                                       dropped=DROPPED, inputs=INPUTS, verbose=VERBOSE))
    wrapper.chmod(0o755)
    (work / COMPILER_LOG).write_bytes(b"")
    (work / PROBES_LOG).write_bytes(b"")
    (work / CALLS).write_text("")
    return wrapper


def steps(kernel: Kernel, arch: str, wrapper: Path, src: Path,
          header_dirs: Sequence[str] = (), lib_dirs: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The project's commands, `{nvcc}`, `{arch}` (sm_NN) and `{sm}` (NN) filled in, each
    with the wrapper first on PATH and in NVCC / CUDACXX, CMake's CUDAARCHS the arch, the
    declared library headers on CPATH (the host compiler's include path: a project's
    .cpp files include cublas_v2.h too) and their link names on LIBRARY_PATH (a link the
    host compiler does)."""
    assert kernel.build is not None
    sm = arch.removeprefix("sm_")
    env = {"NVCC": str(wrapper), "CUDACXX": str(wrapper), "CUDAARCHS": sm}
    if header_dirs:
        env["CPATH"] = os.pathsep.join(header_dirs)
    if lib_dirs:
        env["LIBRARY_PATH"] = os.pathsep.join(lib_dirs)
    fill = {"{nvcc}": str(wrapper), "{arch}": arch, "{sm}": sm}
    out = []
    for i, command in enumerate(kernel.build.commands):
        argv = []
        for arg in command:
            for key, value in fill.items():
                arg = arg.replace(key, value)
            argv.append(arg)
        out.append({"tool": "project", "argv": argv, "log": f"project-{i}.log",
                    "cwd": str(src), "env": env, "path_dirs": [str(wrapper.parent)]})
    return out


def calls(work: Path) -> list[dict[str, Any]]:
    """The nvcc command lines the build ran through the wrapper, in order."""
    text = (work / CALLS).read_text() if (work / CALLS).is_file() else ""
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def compiler_step(work: Path) -> dict[str, Any]:
    """The record of every nvcc call as one step: its command lines (`nvcc-calls.jsonl`),
    the worst return code of the calls that compiled or linked (a probe's is kept in the
    record, not judged), and what they printed (`nvcc.log`: the ptxas -v reports the
    audit reads, and any warning, which fails the build; probes' and verbose calls'
    output in `nvcc-probes.log`)."""
    ran = calls(work)
    worst = max((c["returncode"] for c in ran if not c.get("probe")), key=abs, default=0)
    return {"tool": "nvcc", "argv": [c["argv"] for c in ran], "returncode": worst,
            "log": COMPILER_LOG, "calls": CALLS, "probes_log": PROBES_LOG,
            "probes": sum(bool(c.get("probe")) for c in ran)}


def collect(name: str, arch: str, work: Path, record: dict[str, Any], kernel: Kernel,
            tc: Toolchain, timeout_s: float) -> None:
    """The arch's device code from the project build's outputs (cuobjdump -xelf, in the
    sandbox): exactly one cubin is the kernel's; what was found is recorded either way."""
    assert kernel.build is not None
    sm = arch.removeprefix("sm_")
    found: list[Path] = []
    missing: list[str] = []
    for i, rel in enumerate(kernel.build.outputs):
        output = work / SOURCE_COPY / rel
        if not output.is_file():
            missing.append(rel)
            continue
        if output.suffix == ".cubin":
            found.append(output)
            continue
        dest = work / "extract" / str(i)
        dest.mkdir(parents=True)
        if tc.cuobjdump is not None:
            sandbox.run(sandbox.Step([tc.cuobjdump.path, "-xelf", "all", str(output)],
                                     cwd=dest, writable=[dest], read_only=[output, *tc.roots()],
                                     limits=sandbox.Limits(wall_s=timeout_s)),
                        merged=True)
        found += sorted(dest.glob(f"*.sm_{sm}.cubin"))
    every = [p.relative_to(work).as_posix() for p in found]
    if len(found) > 1 and not kernel.build.unit and tc.cuobjdump is not None:
        # a linked program holds images with no function of the project's (the static
        # runtime's): they are nobody's translation unit
        found = [p for p in found if _functions(p, tc, timeout_s)]
    if kernel.build.unit:
        found = [p for p in found if p.name in (f"{kernel.build.unit}.sm_{sm}.cubin",
                                                f"{kernel.build.unit}.cubin")]
    record["project"] = {"outputs": list(kernel.build.outputs), "missing": missing,
                         "unit": kernel.build.unit, "every_cubin": every,
                         "cubins": [p.relative_to(work).as_posix() for p in found],
                         "nvcc_calls": len(calls(work)),
                         "binutils": tc.binutils_missing}
    if len(found) == 1:
        shutil.copyfile(found[0], work / f"{name}.{arch}.cubin")
    for out in (f"{name}.{arch}.cubin", CALLS):
        if (work / out).is_file():
            record["outputs"][out] = hashlib.sha256((work / out).read_bytes()).hexdigest()
    shutil.rmtree(work / SOURCE_COPY, ignore_errors=True)  # the copy, built
    shutil.rmtree(work / "extract", ignore_errors=True)
    record["cubin"] = f"{name}.{arch}.cubin" if f"{name}.{arch}.cubin" in record["outputs"] else None
    record["fatbin"] = record["object"] = None


def _functions(cubin: Path, tc: Toolchain, timeout_s: float) -> list[str]:
    """The functions a cubin defines (cuobjdump's resource usage, in the sandbox)."""
    assert tc.cuobjdump is not None
    done = sandbox.run(sandbox.Step([tc.cuobjdump.path, "--dump-resource-usage", str(cubin)],
                                    cwd=cubin.parent, read_only=[cubin, *tc.roots()],
                                    limits=sandbox.Limits(wall_s=timeout_s)), merged=True)
    return list(resources.parse_resource_usage(done.stdout.decode(errors="replace")))


def problems(record: dict[str, Any]) -> list[str]:
    """What a project build's outputs lack: device code through rowgate's wrapper, one
    cubin for the arch."""
    p = record.get("project")
    if not p:
        return []
    who = f"{record['kernel']} {record['arch']}"
    if p["missing"]:
        return [f"{who}: the build left no {', '.join(p['missing'])}"]
    if not p["nvcc_calls"]:
        return [f"{who}: the build ran no nvcc through rowgate's wrapper (an nvcc called by "
                f"path gets neither the arch nor the warning flags): use nvcc, $NVCC, "
                f"$CUDACXX or {{nvcc}}"]
    if p.get("unit") and len(p["cubins"]) != 1:
        return [f"{who}: unit {p['unit']!r} is not among the {record['arch']} cubins in the "
                f"outputs ({', '.join(p.get('every_cubin', [])) or 'none'}"
                f"{'; ' + p['binutils'] if p['binutils'] else ''})"]
    if len(p["cubins"]) != 1:
        return [f"{who}: {len(p['cubins'])} {record['arch']} cubins in the outputs "
                f"({', '.join(p['cubins']) or 'none'}"
                f"{'; ' + p['binutils'] if p['binutils'] else ''}): declare the output that "
                f"holds this kernel's translation unit, or its unit (`unit = \"NAME\"`)"]
    return []
