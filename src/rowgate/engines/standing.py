"""Standing engines: the pinned vLLM oracle loaded once on a machine, attached to by runs.

Loading vLLM costs a CPU runner 20-100 s, against a second or two of oracle tokens a
row's gates judge. `rowgate oracle serve ROW` starts the row's offline vLLM worker
once (`_vllm_worker CONFIG SOCKET`) and registers it here, under the cache dir's
`standing/KEY.json`, KEY a digest of everything that makes the engine (the pinned
version, the model's digest, dtype, seed, eager or not, max_num_seqs, context length,
the device). A run given `--option standing=1` attaches its vLLM arm to the registered
worker of the same KEY, if one is alive, instead of starting its own; the worker serves
one run at a time and keeps nothing between passes (prefix caching off, a seed per
request). The socket lives in a fresh directory of rowgate's, never shown to a subject
step; the entry names the worker's pid, and one whose worker is gone is removed.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from rowgate import dirs
from rowgate.storage import write_atomic


def key_of(identity: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def _entry(key: str) -> Path:
    return dirs.cache("standing") / f"{key}.json"


def register(key: str, doc: dict[str, Any]) -> Path:
    """Write the entry whole (a reader sees it complete or not at all)."""
    return write_atomic(_entry(key), json.dumps(doc, indent=1).encode())


def unregister(key: str, pid: int) -> None:
    """Remove the entry if it is still this worker's (a later one may have replaced it)."""
    found = _read(_entry(key))
    if found is not None and found.get("pid") == pid:
        _entry(key).unlink(missing_ok=True)


def find(key: str) -> dict[str, Any] | None:
    """The live standing worker for `key` (its entry), or None; a dead one's entry goes."""
    found = _read(_entry(key))
    if found is None:
        return None
    if _alive(int(found.get("pid", 0))) and Path(str(found.get("socket", ""))).exists():
        return found
    _entry(key).unlink(missing_ok=True)
    return None


def _read(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except OSError:  # gone, or someone else's process under a recycled pid
        return False
    return True
