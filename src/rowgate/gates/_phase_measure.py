"""The phase gate's measure steps: build a subject operator's phase variants through the
build gate's recipe, and collect the row's counters with ncu on one exact shape.

Builds use the build gate's `build_kernel` (`cudabuild.build`) with the kernel's
kernels.toml entry and the variant's defines added (so each variant has its own cache key,
and the same flags, warnings as errors, as the build gate); their directories are sealed
under `builds/VARIANT/` as the build gate seals its own (`seal_build`).
Counters: ncu profiles `python -m rowgate.ops.profile_launch` (one entry point of the
full variant on the shape), once per role; its raw CSV is kept as it wrote it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rowgate import sandbox
from rowgate.cuda import cudabuild, kernels, resources, toolchains
from rowgate.errors import Error
from rowgate.gates.build import build_kernel, seal_build
from rowgate.gates.interface import GateError, Progress

NCU_TIMEOUT_S = 600
WARMUP = 2


def build_variants(repo: Path, kernel: str, arch: str, variants: dict[str, list[str]],
                   options: Mapping[str, str] | None, out: Path,
                   progress: Progress) -> dict[str, dict[str, Any]]:
    """{variant: {defines, dir, cubin, sha256, problems, entry_points}}; builds copied
    under `out/builds/VARIANT/`. Raises GateError when kernels.toml or the toolchain is
    unusable."""
    try:
        manifest = kernels.load(repo)
        manifest.select([kernel], arch)
        chain = toolchains.for_options(arch, options or {})
    except Error as exc:
        raise GateError(f"phase gate: {exc.diagnostics()}") from exc
    base = manifest.kernels[kernel]
    records = {}
    for variant, defines in variants.items():
        progress.update(f"phase: build {kernel} {variant} for {arch}")
        entry = base.model_copy(update={"defines": [*base.defines, *defines]})
        patched = manifest.model_copy(update={"kernels": {**manifest.kernels, kernel: entry}})
        built = build_kernel(repo, patched, kernel, arch, chain)
        dest = out / "builds" / variant
        seal_build(built, dest)  # the cubin plain (timed and hashed), the rest gzipped
        rec = built.record
        problems = cudabuild.problems(dest, rec)
        cubin = rec.get("cubin")
        entries: list[str] = []
        if cubin and not problems:
            log = next(s["log"] for s in rec["steps"] if s["tool"] in ("ptxas", "nvcc"))
            entries = sorted(resources.parse_ptxas((dest / log).read_text(errors="replace")))
        records[variant] = {"defines": defines, "dir": f"builds/{variant}", "cubin": cubin,
                            "sha256": rec["outputs"].get(cubin or "", ""), "problems": problems,
                            "entry_points": entries, "toolchain": chain.short()}
    return records


def collect_counters(ncu_path: str, metrics: list[str], cubin: Path, operator_table: dict[str, Any],
                     operator: str, entry: str, case: dict[str, Any], role: str, out: Path) -> dict[str, Any]:
    """ncu on one launch of `entry` (after WARMUP unprofiled ones): raw CSV and log."""
    from rowgate.ops import ncu

    # The subject's kernel runs here: in the sandbox with the GPU, reading copies of its
    # cubin and the request in a scratch directory (never the gate's staging area),
    # writing nothing but ncu's own scratch in the private /tmp.
    with tempfile.TemporaryDirectory(prefix="rowgate-ncu-") as tmp:
        scratch = Path(tmp)
        shutil.copyfile(cubin, scratch / cubin.name)
        request = scratch / f"ncu-{role}.request.json"
        request.write_text(json.dumps({"cubin": str(scratch / cubin.name), "operator": operator,
                                       "table": operator_table, "entry": entry, "case": case,
                                       "warmup": WARMUP, "launches": 1}, indent=1) + "\n")
        shutil.copyfile(request, out / request.name)
        argv = ncu.command(ncu_path, metrics, entry, WARMUP, 1,
                           [sys.executable, "-m", "rowgate.ops.profile_launch", str(request)])
        tool = Path(ncu_path).resolve().parent
        done = sandbox.run(sandbox.Step(argv, cwd=scratch, read_only=[scratch, tool], gpu=True,
                                        limits=sandbox.Limits(wall_s=NCU_TIMEOUT_S,
                                                              memory_bytes=None)))
    rc = done.returncode
    stdout, stderr = done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace")
    if done.limit:
        stderr += f"\nncu stopped at its {done.limit} limit"
    (out / f"ncu-{role}.csv").write_text(stdout)
    (out / f"ncu-{role}.log").write_text(stderr)
    return {"argv": argv, "returncode": rc, "csv": f"ncu-{role}.csv", "log": f"ncu-{role}.log",
            "entry": entry, "version": ncu_version(ncu_path)}


def ncu_version(path: str) -> str:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60,
                             check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""
    lines = [line.strip() for line in out.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
