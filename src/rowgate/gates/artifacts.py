"""Reading and writing a gate's raw artifacts; an unreadable one is a GateError
naming the file (the gate broke or the artifacts were tampered with: ERROR). A name
ending `.gz` is read decompressed (`rowgate.compressed`)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from rowgate import compressed
from rowgate.errors import VerificationError
from rowgate.gates.interface import GateError
from rowgate.records.canonical import strict_loads
from rowgate.records.gate_result import GateResult

T = TypeVar("T")


def write_json(path: Path, doc: object) -> None:
    """`doc` as indented JSON, gzipped when the name ends `.gz` (`rowgate.compressed`)."""
    compressed.write_text(path, json.dumps(doc, indent=2, sort_keys=True) + "\n")


def read_json(path: Path) -> Any:
    """A JSON artifact, read strictly (a key said twice is refused: the sealed bytes must
    mean one thing to every reader, the review's re-derivation included)."""
    try:
        return strict_loads(compressed.read_bytes(path), path.name)
    except (OSError, EOFError, VerificationError) as exc:
        raise GateError(f"artifact {path.name} unreadable in {path.parent}: {exc}") from exc


def read_jsonl(path: Path) -> list[Any]:
    """One JSON document per non-blank line, each read strictly."""
    try:
        return [strict_loads(line, path.name) for line in compressed.read_text(path).splitlines()
                if line.strip()]
    except (OSError, EOFError, ValueError, VerificationError) as exc:
        raise GateError(f"artifact {path.name} unreadable in {path.parent}: {exc}") from exc


def derive_known_layout(derive: Callable[[Path], T], artifact_dir: Path, what: str) -> T:
    """`derive(artifact_dir)`, with artifacts of another layout (an older rowgate, or
    edited by hand) an ERROR naming the missing piece instead of a traceback."""
    try:
        return derive(artifact_dir)
    except (KeyError, TypeError, IndexError) as exc:
        raise GateError(f"{what} artifacts in {artifact_dir} are not in this rowgate's "
                        f"format: missing or malformed {exc}") from exc


def admission_record(admitted_by: str, earlier: Mapping[str, GateResult]) -> dict[str, Any]:
    """The admitting gate's result as this bundle holds it (`ctx.earlier`: the runner's
    results of the gates before this one, in row order), for a gate a row admits only
    on an earlier gate's verdict."""
    if not admitted_by:
        return {"admitted_by": "", "found": False}
    result = earlier.get(admitted_by)
    if result is None:
        return {"admitted_by": admitted_by, "found": False}
    return {"admitted_by": admitted_by, "found": True,
            "result": json.loads(result.model_dump_json())}
