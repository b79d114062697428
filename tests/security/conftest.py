"""Fixtures of the security suite (helpers in _support.py)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.security._support import Keys, Sentinel


@pytest.fixture(autouse=True)
def _user_dirs(tmp_path_factory, monkeypatch):
    """Each test has its own state and cache dirs: where rowgate's defaults put bundles and
    builds (docs/security.md), so a test sees exactly what rowgate wrote there."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))
    cache = tmp_path_factory.mktemp("cache")
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    monkeypatch.setenv("ROWGATE_CACHE_DIR", str(cache / "rowgate"))  # its own, to snapshot
    # the user's key exists already: its one-time "created signing key" notice is not
    # part of any refusal these tests assert line for line
    from rowgate.seal import signing

    signing.ensure_local_key(announce=lambda _msg: None)


@pytest.fixture
def sentinel(tmp_path) -> Sentinel:
    return Sentinel(tmp_path / "sentinel")


@pytest.fixture
def keys(tmp_path) -> Keys:
    return Keys(tmp_path / "keys")


def _can_mount() -> bool:
    if os.geteuid() != 0:
        return False
    probe = Path("/tmp") / f"rowgate-mount-probe-{os.getpid()}"
    probe.mkdir(exist_ok=True)
    ok = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(probe)],
                        capture_output=True, check=False).returncode == 0
    if ok:
        subprocess.run(["umount", str(probe)], check=True)
    probe.rmdir()
    return ok


@pytest.fixture
def tmpfs(tmp_path) -> Iterator[Callable[[str, int], Path]]:
    """Factory: a real, small tmpfs mounted at tmp_path/NAME (`size` bytes). A full disk
    is a real ENOSPC from the kernel, not a mock. Needs root (CI runs as root)."""
    if not _can_mount():
        pytest.skip("mounting a tmpfs needs root (CAP_SYS_ADMIN)")
    mounted: list[Path] = []

    def _mount(name: str, size: int) -> Path:
        path = tmp_path / name
        path.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs",
                        str(path)], check=True)
        mounted.append(path)
        return path

    yield _mount
    for path in reversed(mounted):
        subprocess.run(["umount", "-l", str(path)], check=False)

