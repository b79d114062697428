"""Where rowgate keeps what it builds for a subject: outside every subject tree.

`ROWGATE_CACHE_DIR`, else `$XDG_CACHE_HOME/rowgate`, else `~/.cache/rowgate`. Kernel builds
live under `kernels/NAME/ARCH/KEY/`, KEY the sha256 of what makes the build (the kernel's
sources and every header it may include, its kernels.toml entry, the arch, the recipe
and the toolchain's exact versions: `cudabuild.cache_key`), so two checkouts or commits
with the same kernel sources share a build and a header edit never meets a stale one.
`rowgate build` writes its reports under `reports/SUBJECT/ARCHES/` (SUBJECT: a digest of
the subject's real path). The subject is read, never written.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from rowgate import dirs

ENV = dirs.CACHE_ENV


def root() -> Path:
    return dirs.cache_root()


def kernels() -> Path:
    return root() / "kernels"


def reports(repo: Path, arches: list[str]) -> Path:
    subject = hashlib.sha256(os.fsencode(os.path.realpath(repo))).hexdigest()[:16]
    return root() / "reports" / subject / "+".join(arches)


def work(kind: str) -> Path:
    """A parent for a gate's scratch directories (phase builds, Triton caches)."""
    path = root() / "work" / kind
    path.mkdir(parents=True, exist_ok=True)
    return path
