"""AOT gate: the subject's Triton kernels (kernels.toml `[triton.*]`) compiled ahead of
time for each arch the row lists, each image embedded with its PTX (the portable
fallback) and verified, and "enable AOT for arch X" decided by a trace gate's verdict.

measure, per arch: rowgate's representative probe (`_triton_aot`: can this Triton reach
the arch at all?) and each declared kernel (`_triton_subject`: only the file's
`@triton.jit` functions, in their own process with a private Triton cache); where a
kernel compiled, its cubin and PTX are packed into a fatbin with CUDA's `fatbinary`
and unpacked again with `cuobjdump -xelf all` / `-lptx`; the admitting trace gate's
result is copied (`admission.json`); `aot.json` indexes it all. derive (pure): per arch
reachable or why not; each embedded image byte-identical to its cubin, for its arch,
with the PTX beside it; a kernel that fails where the probe compiles is the subject's
failure, not a fact of Triton. An arch in `enable` is enabled only if the trace gate's
capacity verdict is `material`, Triton reaches it and its images verify; otherwise the
refusal is the result (and the portable PTX stays the path that runs there).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rowgate import sandbox
from rowgate.cuda import cache, kernels, toolchains
from rowgate.errors import Error
from rowgate.gates._built import build_gate_id, declarations
from rowgate.gates.aot.spec import ADMISSION, INDEX, AotGate
from rowgate.gates.artifacts import admission_record, read_json, write_json
from rowgate.gates.build import AOT_TIMEOUT_S, gate_arches
from rowgate.gates.interface import Derived, Gate, GateContext, GateError, Progress
from rowgate.rows.options import TOOLCHAIN_KEYS

if TYPE_CHECKING:
    from rowgate.rows.row import Row



def _run(argv: list[str], cwd: Path, env: dict[str, str] | None = None,
         reads: Sequence[Path] = (), writes: Sequence[Path] = ()) -> tuple[int, str, str]:
    """A subject step of the AOT gate (compiling the subject's Triton source, packing and
    unpacking what it produced) in the sandbox: it writes only `cwd` (and `writes`)."""
    tools = [Path(argv[0]).resolve().parent.parent] if os.path.isabs(argv[0]) else []
    done = sandbox.run(sandbox.Step(argv, cwd=cwd, read_only=[*reads, *tools],
                                    writable=[cwd, *writes], env=env or {},
                                    limits=sandbox.Limits(wall_s=AOT_TIMEOUT_S)))
    err = done.stderr.decode(errors="replace")
    if done.limit:
        err += f"\nstopped at its {done.limit} limit"
    return done.returncode, done.stdout.decode(errors="replace"), err


def _python(module: str, args: list[str], cwd: Path,
            reads: Sequence[Path] = ()) -> tuple[dict[str, Any] | None, int, str]:
    """One Triton subprocess with a private cache: (its JSON answer or None, rc, stderr)."""
    with tempfile.TemporaryDirectory(prefix="triton-", dir=cache.work("triton")) as tc:
        env = {"TRITON_CACHE_DIR": tc}
        rc, out, err = _run([sys.executable, "-m", module, *args], cwd, env, reads, [Path(tc)])
    try:
        return json.loads(out.strip().splitlines()[-1]), rc, err
    except (ValueError, IndexError):
        return None, rc, err  # it died (an LLVM abort): its stderr is the answer


def _embed(d: Path, answer: dict[str, Any], tc: toolchains.Toolchain) -> dict[str, Any]:
    """cubin + PTX into a fatbin, then unpacked again: what an AOT build would embed."""
    sm = (answer.get("ptx_target") or "").removeprefix("sm_")
    fatbin = f"{answer['name']}.{answer['arch']}.fatbin"
    fatbinary = str(Path(tc.compiler.path).parent / "fatbinary")
    steps = [[fatbinary, f"--create={fatbin}", "-64",
              f"--image3=kind=elf,sm={sm},file={answer['cubin']}",
              f"--image3=kind=ptx,sm={sm},file={answer['ptx']}"]]
    rc, out, err = _run(steps[0], d)
    rec: dict[str, Any] = {"fatbin": fatbin, "commands": [{"argv": steps[0], "returncode": rc}],
                 "images": [], "ptx_listed": []}
    if rc != 0 or tc.cuobjdump is None:
        rec["error"] = (out + err).strip() or "no cuobjdump"
        return rec
    (d / "embedded").mkdir(exist_ok=True)
    for argv in ([tc.cuobjdump.path, "-xelf", "all", f"../{fatbin}"],
                 [tc.cuobjdump.path, "-lptx", f"../{fatbin}"]):
        rc, out, err = _run(argv, d / "embedded", reads=[d / fatbin])
        rec["commands"].append({"argv": argv, "returncode": rc, "output": out + err})
    rec["images"] = sorted(p.name for p in (d / "embedded").glob("*.cubin"))
    rec["ptx_listed"] = [ln.split(":", 1)[1].strip() for ln in
                         rec["commands"][-1]["output"].splitlines() if ln.startswith("PTX file")]
    return rec


def measure_aot(sources: dict[str, Path], arches: list[str], decls: dict[str, Any], out: Path,
                tc: toolchains.Toolchain, progress: Progress) -> dict[str, Any]:
    """Probe and compile every kernel of `sources` ({name: confined source path}) for
    every arch; pack and unpack what compiled. Returns the index."""
    names = sorted(sources)
    index: dict[str, Any] = {"arches": {}, "kernels": sorted(names)}
    for arch in arches:
        d = out / arch
        d.mkdir(parents=True, exist_ok=True)
        progress.update(f"Triton AOT probe for {arch}")
        probe, rc, err = _python("rowgate.cuda._triton_aot", [arch], d)
        index["arches"][arch] = {"probe": probe or {"reachable": False, "error":
                                                    f"probe exited {rc}: {err.strip()[-2000:]}"},
                                 "kernels": {}}
        for name in names:
            progress.update(f"Triton AOT {name} for {arch}")
            kd = d / name
            kd.mkdir(exist_ok=True)
            decl = decls[name]
            req = {"source_path": str(sources[name]),
                   "source": decl.source, "name": name, "function": decl.function,
                   "signature": decl.signature, "constants": decl.constants,
                   "num_warps": decl.num_warps, "num_stages": decl.num_stages,
                   "arch": arch, "out": str(kd)}
            write_json(kd / "request.json", req)
            answer, rc, err = _python("rowgate.cuda._triton_subject", ["request.json"], kd,
                                      [sources[name].parent])
            (kd / "stderr.log").write_text(err)
            answer = answer or {"arch": arch, "name": name, "reachable": False,
                                "error": f"compiler exited {rc}: {err.strip()[-2000:]}"}
            if answer.get("reachable"):
                answer["embed"] = _embed(kd, answer, tc)
            index["arches"][arch]["kernels"][name] = answer
    return index


class Aot(Gate[AotGate]):
    kind = "aot"
    spec_model = AotGate
    subject_steps = True
    reads_kernels = True
    options = TOOLCHAIN_KEYS

    def check_declarations(self, row: Row, spec: AotGate,
                           manifest: kernels.KernelManifest) -> list[str]:
        unknown = [n for n in spec.kernels if n not in manifest.triton]
        if unknown:
            raise GateError(f"aot gate: {', '.join(unknown)} not in kernels.toml's [triton.*] "
                            f"(declared: {', '.join(sorted(manifest.triton)) or 'none'})")
        names = spec.kernels or sorted(manifest.triton)
        said = [f"Triton kernels: {', '.join(names) or 'none declared'}"]
        if spec.enable and not names:
            said.append(f"enable {', '.join(spec.enable)}: the subject declares no Triton "
                        f"kernel, so the gate can only refuse it once its admission is decided")
        return said

    def measure(self, row: Row, spec: AotGate, ctx: GateContext) -> None:
        manifest = declarations(ctx.artifact_dir.parent /
                                       build_gate_id(row, spec, spec.build))
        unknown = [n for n in spec.kernels if n not in manifest.triton]
        if unknown:
            raise GateError(f"aot gate: {', '.join(unknown)} not in kernels.toml's [triton.*] "
                            f"(declared: {', '.join(sorted(manifest.triton)) or 'none'})")
        names = spec.kernels or sorted(manifest.triton)
        # the abi gate's rule for its admitting gate, applied to this spec's admitted_by
        write_json(ctx.artifact_dir / ADMISSION,
                   admission_record(spec.admitted_by, ctx.earlier))
        try:
            subject = kernels.load(ctx.repo)  # the sources themselves, confined
            sources = {n: kernels.triton_source(ctx.repo, subject, n) for n in names}
            tc = toolchains.for_arch("sm_90", ctx.options.get("nvcc"))  # fatbinary, cuobjdump
            with ctx.phase("compile"):
                index = measure_aot(sources, gate_arches(row, spec.arches), manifest.triton,
                                    ctx.artifact_dir, tc, ctx.progress)
        except Error as exc:
            raise GateError(f"aot gate: {exc.diagnostics()}") from exc
        index["toolchain"] = tc.short()
        write_json(ctx.artifact_dir / INDEX, index)

    def derive(self, row: Row, spec: AotGate, artifact_dir: Path) -> Derived:
        from rowgate.gates.aot.derive import derive_aot

        return derive_aot(read_json(artifact_dir / INDEX), read_json(artifact_dir / ADMISSION),
                          spec, artifact_dir)


__all__ = ["ADMISSION", "INDEX", "Aot", "AotGate", "measure_aot"]
