"""rowgate.seal.staging on its own: ownership by lock, sweeping only the dead, moving files
into a bundle and freezing it without following a link (real files, real processes)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from rowgate.errors import EvidenceError
from rowgate.seal import staging

HOLD = """
import sys, time
from pathlib import Path
from rowgate.seal import staging
holder = staging.Holder(Path(sys.argv[1]))
print(holder.path, flush=True)
time.sleep(60)
"""


def _owner(parent: Path) -> tuple[subprocess.Popen[str], Path]:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(parent)], stdout=subprocess.PIPE,
                            text=True, env=dict(os.environ))
    assert proc.stdout is not None
    return proc, Path(proc.stdout.readline().strip())


def test_a_live_owners_stage_stays_and_a_dead_ones_goes(tmp_path):
    proc, path = _owner(tmp_path)
    try:
        assert path.name.startswith(staging.STAGING_PREFIX) and (path / staging.LOCK_FILE).is_file()
        staging.sweep(tmp_path)
        assert path.is_dir(), "a live stage was swept"
    finally:
        proc.kill()
        proc.communicate()
    staging.sweep(tmp_path)  # the kernel released the dead owner's lock
    assert list(tmp_path.iterdir()) == []


def test_this_processes_own_stage_is_never_swept_and_checks_itself(tmp_path):
    holder = staging.Holder(tmp_path)
    staging.sweep(tmp_path)
    holder.check()
    os.rename(holder.path, tmp_path / "moved")
    with pytest.raises(EvidenceError, match="removed or replaced by another process"):
        holder.check()


def test_a_birth_without_a_lock_is_left_alone_until_it_is_old(tmp_path):
    born = tmp_path / f"{staging.BORN_PREFIX}host-x"
    born.mkdir()
    staging.sweep(tmp_path)
    assert born.is_dir()
    old = 2 * staging.UNLOCKED_STALE_S
    os.utime(born, (os.stat(born).st_atime - old, os.stat(born).st_mtime - old))
    staging.sweep(tmp_path)
    assert not born.exists()


def test_take_moves_single_files_copies_linked_ones_and_refuses_links(tmp_path):
    src, dst, outside = tmp_path / "src", tmp_path / "dst", tmp_path / "outside.txt"
    (src / "sub").mkdir(parents=True)
    dst.mkdir()
    outside.write_text("outside\n")
    (src / "sub" / "own.txt").write_text("own\n")
    os.link(outside, src / "linked.txt")
    staging.take(src, dst, ["sub/own.txt", "linked.txt"])
    assert (dst / "sub" / "own.txt").read_text() == "own\n" and not (src / "sub" / "own.txt").exists()
    assert (dst / "linked.txt").stat().st_nlink == 1 and outside.stat().st_nlink == 2
    os.symlink(outside, src / "link.txt")
    with pytest.raises(EvidenceError, match="link.txt: a symbolic link after its gate ran"):
        staging.take(src, dst, ["link.txt"])
    os.symlink(tmp_path, src / "dirlink")
    with pytest.raises(EvidenceError, match="dirlink/x: cannot be sealed"):
        staging.take(src, dst, ["dirlink/x"])


def test_freeze_refuses_a_planted_hardlink_before_changing_its_mode(tmp_path):
    bundle, outside = tmp_path / "bundle", tmp_path / "outside.txt"
    bundle.mkdir()
    outside.write_text("outside\n")
    os.chmod(outside, 0o640)
    os.link(outside, bundle / "planted.txt")
    with pytest.raises(EvidenceError, match="planted.txt: 2 hard links while sealing"):
        staging.freeze(bundle)
    assert stat.S_IMODE(outside.stat().st_mode) == 0o640
