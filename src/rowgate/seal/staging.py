"""Staging directories under an evidence (or records) dir: owned by a lock, swept only
when provably dead, and the filesystem steps of a seal that never follow a link.

A staging directory is `.staging-HOST-RANDOM/` holding a `lock` file its owner keeps
`flock`ed for as long as it lives. The kernel releases the lock when the owner dies —
killed, in another PID namespace, or (through NFS lock emulation) on another host — so
"dead" means "its lock can be taken", never "its PID is gone". It is born as
`.born-…`, its lock file is locked before it takes the name `lock`, and the directory
is renamed once locked, so no sweeper ever sees it unlocked. A sweeper
claims a dead stage by renaming it to `.sweep-RANDOM` while holding its lock (only one
can), then removes it; a killed sweeper's claim is swept the same way.

Everything that moves files into a bundle or makes them read-only goes through open
directory descriptors with O_NOFOLLOW: a symbolic link or a file planted by the
subject's commands is refused, never followed; a file with other hard links is copied,
never made read-only in place.
"""

from __future__ import annotations

import fcntl
import os
import re
import secrets
import shutil
import socket
import stat
import tempfile
import time
from pathlib import Path

from rowgate.confine import kind_of
from rowgate.errors import EvidenceError

STAGING_PREFIX = ".staging-"
BORN_PREFIX = ".born-"
SWEEP_PREFIX = ".sweep-"
LOCK_FILE = "lock"
UNLOCKED_STALE_S = 3600
"""A `.born-` directory without a lock file (its creator died between mkdir and lock)
is swept once it is this old."""
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_LEGACY = re.compile(r"^\.staging-(\d+)-")
_LIVE: set[str] = set()
"""Staging dirs this process owns. flock is per open file, so a sweep in this process
could not take their locks either; skipping them spares the attempt."""


def host_id() -> str:
    """This host's name as it may appear in a file name (for people reading --out)."""
    return re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:32] or "host"


class Holder:
    """A staging directory this process owns (see the module docstring)."""

    def __init__(self, parent: Path):
        born = Path(tempfile.mkdtemp(prefix=f"{BORN_PREFIX}{host_id()}-", dir=parent))
        # Locked under another name, then renamed into place: a sweeper opens only
        # `lock`, so it never finds one created but not yet locked (it would take it,
        # and remove the stage being born).
        unlocked = born / f"{LOCK_FILE}.new"
        self._fd = os.open(unlocked, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)  # no sweeper opens it: never contended
        os.write(self._fd, f"{socket.gethostname()} {os.getpid()}\n".encode())
        os.rename(unlocked, born / LOCK_FILE)
        self.path = parent / f"{STAGING_PREFIX}{host_id()}-{secrets.token_hex(8)}"
        os.rename(born, self.path)
        _LIVE.add(str(self.path))

    def check(self) -> None:
        """Still ours: the lock file at our path is the one we hold locked."""
        try:
            here = os.stat(self.path / LOCK_FILE).st_ino
        except OSError:
            here = -1
        if here != os.fstat(self._fd).st_ino:
            raise EvidenceError(f"{self.path}: staging directory removed or replaced by "
                                f"another process while this run owned it")

    def close(self) -> None:
        """Remove the directory (while still holding its lock), then release the lock."""
        remove(self.path)
        _LIVE.discard(str(self.path))
        os.close(self._fd)


# ------------------------------------------------------------------ sweeping


def sweep(parent: Path) -> None:
    """Remove the staging directories under `parent` whose owner is provably dead."""
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return
    for entry in entries:
        if entry.name.startswith((STAGING_PREFIX, BORN_PREFIX, SWEEP_PREFIX)) and \
                entry.path not in _LIVE:
            _sweep_one(Path(entry.path))


def _sweep_one(path: Path) -> None:
    try:
        fd = os.open(path / LOCK_FILE, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        if _unlocked_and_dead(path):
            _claim_and_remove(path)
        return
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held: its owner is alive
        os.close(fd)
        return
    try:
        _claim_and_remove(path)
    finally:
        os.close(fd)


def _unlocked_and_dead(path: Path) -> bool:
    """A directory without a lock file: a claimed sweep whose sweeper removed the lock
    (removal is idempotent), a birth that died before locking (old enough), or a stage
    of a rowgate before locks (its PID rule)."""
    if path.name.startswith(SWEEP_PREFIX):
        return True
    legacy = _LEGACY.match(path.name)
    if legacy:
        try:
            os.kill(int(legacy.group(1)), 0)
        except ProcessLookupError:
            return True
        except OSError:
            return False
        return False
    try:
        return time.time() - path.lstat().st_mtime > UNLOCKED_STALE_S
    except OSError:
        return False


def _claim_and_remove(path: Path) -> None:
    claimed = path.with_name(f"{SWEEP_PREFIX}{secrets.token_hex(8)}")
    if not path.name.startswith(SWEEP_PREFIX):
        try:
            os.rename(path, claimed)  # atomic: exactly one sweeper claims it
        except OSError:
            return
        path = claimed
    remove(path)


def remove(path: Path) -> None:
    """Remove a staging tree, frozen or not, never following a link; the lock file goes
    last so a killed remover leaves a claim the next sweep can take."""
    thaw(path)
    try:
        entries = list(os.scandir(path))
    except OSError:
        return
    for entry in entries:
        if entry.name != LOCK_FILE:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)  # fd-based: never follows
            else:
                _unlink(entry.path)
    _unlink(str(path / LOCK_FILE))
    try:
        os.rmdir(path)
    except OSError:
        pass


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def thaw(root: Path) -> None:
    """Make a frozen tree removable again: directories only, each opened O_NOFOLLOW."""
    for dirpath, _, _ in os.walk(root):  # never descends into links
        try:
            fd = os.open(dirpath, _DIR_FLAGS)
        except OSError:
            continue
        try:
            os.fchmod(fd, 0o755)
        except OSError:
            pass
        finally:
            os.close(fd)


# ---------------------------------------------------- moving files into a bundle


def _open_dir(parent_fd: int, parts: list[str], create: bool) -> int:
    """The directory `parts` below `parent_fd`, every component opened O_NOFOLLOW."""
    fd = os.dup(parent_fd)
    for part in parts:
        if create:
            try:
                os.mkdir(part, 0o755, dir_fd=fd)
            except FileExistsError:
                pass
        try:
            nfd = os.open(part, _DIR_FLAGS, dir_fd=fd)
        finally:
            os.close(fd)
        fd = nfd
    return fd


def take(src: Path, dst: Path, rels: list[str]) -> None:
    """Move each regular file `rels` (relative paths) from `src` to the same path under
    `dst`, links never followed. A file with other hard links is copied instead: it may
    be someone else's file, and the bundle's copy is made read-only. Raises EvidenceError
    naming the file when it is no longer a regular file (changed after its gate ran)."""
    sroot, droot = os.open(src, _DIR_FLAGS), os.open(dst, _DIR_FLAGS)
    try:
        for rel in rels:
            _take_one(sroot, droot, rel)
    finally:
        os.close(sroot)
        os.close(droot)


def _take_one(sroot: int, droot: int, rel: str) -> None:
    *dirs, name = rel.split("/")
    try:
        sfd = _open_dir(sroot, dirs, create=False)
    except OSError as exc:
        raise EvidenceError(f"{rel}: cannot be sealed ({exc.strerror}: a directory on its "
                            f"path changed after its gate ran)") from exc
    dfd = _open_dir(droot, dirs, create=True)
    try:
        try:
            st = os.stat(name, dir_fd=sfd, follow_symlinks=False)
        except OSError as exc:
            raise EvidenceError(f"{rel}: cannot be sealed ({exc.strerror})") from exc
        if not stat.S_ISREG(st.st_mode):
            raise EvidenceError(f"{rel}: {kind_of(st.st_mode)} after its gate ran: not sealed")
        if st.st_nlink == 1:
            os.rename(name, name, src_dir_fd=sfd, dst_dir_fd=dfd)
            moved = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            if (moved.st_ino, moved.st_dev) == (st.st_ino, st.st_dev):
                return
            raise EvidenceError(f"{rel}: replaced while being sealed: not sealed")
        _copy(sfd, dfd, name, rel)
    finally:
        os.close(sfd)
        os.close(dfd)


def _copy(sfd: int, dfd: int, name: str, rel: str) -> None:
    src = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=sfd)
    try:
        if not stat.S_ISREG(os.fstat(src).st_mode):
            raise EvidenceError(f"{rel}: replaced while being sealed: not sealed")
        dst = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                      0o644, dir_fd=dfd)
        try:
            with open(src, "rb", closefd=False) as fin, open(dst, "wb", closefd=False) as fout:
                shutil.copyfileobj(fin, fout, 1 << 20)
        finally:
            os.close(dst)
    finally:
        os.close(src)


# ------------------------------------------------------------ freezing, publishing


def freeze(root: Path) -> None:
    """fsync every file and directory of a bundle being sealed, then make it read-only,
    each opened O_NOFOLLOW: a link or a hard-linked file planted while sealing is refused
    (EvidenceError) before anything is changed through it."""
    for dirpath, dirnames, filenames in os.walk(root, topdown=False):
        dfd = os.open(dirpath, _DIR_FLAGS)
        try:
            for name in filenames + [d for d in dirnames if os.path.islink(Path(dirpath) / d)]:
                _freeze_file(dfd, name, Path(dirpath) / name, root)
            os.fsync(dfd)
            os.fchmod(dfd, 0o555)
        finally:
            os.close(dfd)


def _freeze_file(dfd: int, name: str, path: Path, root: Path) -> None:
    rel = path.relative_to(root).as_posix()
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    except OSError as exc:
        raise EvidenceError(f"{rel}: not a regular file while sealing ({exc.strerror})") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            why = kind_of(st.st_mode) or f"{st.st_nlink} hard links"
            raise EvidenceError(f"{rel}: {why} while sealing: not sealed")
        os.fsync(fd)
        os.fchmod(fd, 0o444)
    finally:
        os.close(fd)


def publish(named: Path, final: Path, what: str) -> Path:
    """Move a frozen, verified directory to `final` in one rename on the same filesystem:
    readers see it whole or not at all (bundles, oracle records)."""
    try:
        os.rename(named, final)
    except OSError as exc:
        raise EvidenceError(f"cannot publish {what} {final}: {exc.strerror}") from exc
    fd = os.open(final.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return final
