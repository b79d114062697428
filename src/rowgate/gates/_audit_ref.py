"""The audit's builds by reference: when the row's build gate ran before it in the same
run, the audit inspects that gate's sealed builds instead of sealing a second copy of
every object, fatbin and PTX (half a kernel bundle was that duplicate).

Each audit entry then names, under `build_ref`, the build gate's id, the build's directory
under `artifacts/GATE-ID/` and every file the audit read there (build.json, the tool
logs, the outputs as sealed) with the sha256 of its content (an output's is the one
build.json records). Derive reads them from the same bundle and hashes them again: a
referenced file missing or not the recorded bytes is a violation naming it (FAIL).
The reference is untrusted input (a bundle can say anything): the gate must be a build
gate of the row, and each path is relative, made of plain names (no `..`, nothing
absolute) and resolved without following a link, so it cannot leave the bundle.
"""

from __future__ import annotations

import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rowgate.cuda import cudabuild, kernels
from rowgate.cuda.resources import sha256_file
from rowgate.errors import Error
from rowgate.gates.build import INDEX, MANIFEST_COPY, Built, arch_toolchains, read_index, sealed_output
from rowgate.gates.interface import GateError
from rowgate.records.ids import GATE_ID

KEY = "build_ref"
_NAME = re.compile(r"^[A-Za-z0-9_+-][A-Za-z0-9._+-]*$")


@dataclass(frozen=True)
class Reference:
    """The build gate's builds the audit inspects, by (arch, kernel)."""

    gate: str
    root: Path
    builds: dict[tuple[str, str], Built]
    missing: dict[str, str]
    """Each arch the audit covers that has no toolchain here, and why: the audit
    inspects the rest and ERRORs naming these, as the build gate did."""


def find(build_root: Path | None, arches: list[str], names: list[str],
         options: dict[str, str]) -> Reference | None:
    """The build gate's sealed builds of every (arch, kernel) the audit could build
    here, or None when there is no such gate, it did not run, or it built fewer (then
    the audit builds and seals its own copy, as without a build gate). An arch without
    a toolchain here is one neither gate could build (an sm_70 row's sm_90 stand-in):
    it does not stop the reference, else the audit would seal a second copy of the
    arches that were built only to ERROR on the same missing toolchain."""
    if build_root is None or not (build_root / INDEX).is_file():
        return None
    try:
        manifest = kernels.parse((build_root / MANIFEST_COPY).read_text(), MANIFEST_COPY)
        index = {(e["arch"], e["kernel"]): e["dir"] for e, _ in read_index(build_root)}
    except (Error, GateError, OSError, KeyError, TypeError):
        return None
    chains, missing = arch_toolchains(arches, options)
    try:
        plan = [(arch, name) for arch in chains for name in manifest.select(names, arch)]
    except Error:
        return None
    if not plan or any(key not in index for key in plan):
        return None
    return Reference(build_root.name, build_root,
                     {(a, k): Built(a, k, build_root / index[(a, k)], chains[a]) for a, k in plan},
                     missing)


def record(ref: Reference, b: Built, build_record: dict[str, Any]) -> dict[str, Any]:
    """The entry's `build_ref`: gate, directory and {sealed file name: content sha256}."""
    files = {cudabuild.BUILD_RECORD: sha256_file(b.dir / cudabuild.BUILD_RECORD)}
    for step in build_record["steps"]:
        files[step["log"]] = sha256_file(b.dir / step["log"])
    for name, digest in build_record["outputs"].items():
        files[sealed_output(b.dir, name).name] = digest
    return {"gate": ref.gate, "dir": b.dir.relative_to(ref.root).as_posix(), "files": files}


# --------------------------------------------------------------------------- derive


def resolve(artifacts_root: Path, ref: Any, build_gates: frozenset[str]) -> tuple[Path, str]:
    """(the referenced build gate's artifact dir, the build's dir under it), the
    reference checked to stay inside the bundle. GateError (refused) otherwise."""
    if not isinstance(ref, dict) or not isinstance(ref.get("files"), dict):
        raise GateError(f"audit build reference malformed: {ref!r:.120}")
    gate, rel = ref.get("gate"), ref.get("dir")
    if not isinstance(gate, str) or not re.match(GATE_ID, gate) or gate not in build_gates:
        raise GateError(f"audit build reference refused: gate {gate!r:.60} is not a build "
                        f"gate of the row ({', '.join(sorted(build_gates)) or 'none'})")
    parts = _parts(rel)
    for name in ref["files"]:
        _parts(name, single=True)
    _no_links(artifacts_root, [gate, *parts])
    return artifacts_root / gate, "/".join(parts)


def _parts(rel: object, single: bool = False) -> list[str]:
    """The components of a relative path of plain names; GateError for `..`, an
    absolute path, a backslash, an empty component."""
    parts = rel.split("/") if isinstance(rel, str) else []
    if not parts or (single and len(parts) != 1) or not all(_NAME.match(p) for p in parts):
        raise GateError(f"audit build reference refused: path {rel!r:.120} is not a "
                        f"relative path of plain names inside the bundle")
    return parts


def _no_links(root: Path, parts: list[str]) -> None:
    """Each component below `root` that exists is a real directory, not a link."""
    path = root
    for part in parts:
        path = path / part
        try:
            mode = path.lstat().st_mode
        except OSError:
            return  # missing: the digest check names the file
        if not stat.S_ISDIR(mode):
            raise GateError(f"audit build reference refused: {path.relative_to(root)} is "
                            f"a link or not a directory")


def file_problems(build_root: Path, rel: str, files: dict[str, Any]) -> list[str]:
    """Each referenced file, read where the bundle holds it (a link refused) and hashed
    against the digest the audit recorded: one line per file missing or altered; and
    build.json unpinned (derive reads it before anything else)."""
    out = []
    for name, want in sorted(files.items()):
        path = build_root / rel / name
        shown = f"{build_root.name}/{rel}/{name}"
        try:
            if not stat.S_ISREG(path.lstat().st_mode):
                out.append(f"referenced build file {shown} is a link or not a regular file")
                continue
            got = sha256_file(path)
        except (OSError, EOFError) as exc:
            out.append(f"referenced build file {shown} missing or unreadable "
                       f"({getattr(exc, 'strerror', None) or exc})")
            continue
        if got != want:
            out.append(f"referenced build file {shown} has sha256 {got[:16]}, not the "
                       f"{str(want)[:16]} the audit inspected")
    if cudabuild.BUILD_RECORD not in files:
        out.append(f"{build_root.name}/{rel}/{cudabuild.BUILD_RECORD} is not pinned")
    return out


def unpinned(rel: str, files: dict[str, Any], build_record: dict[str, Any]) -> list[str]:
    """Logs derive reads (each step's) that the reference does not pin."""
    wanted = [s["log"] for s in build_record["steps"]]
    return [f"{rel}/{name} is not pinned by the audit" for name in wanted if name not in files]


__all__ = ["KEY", "Reference", "file_problems", "find", "record", "resolve", "unpinned"]
