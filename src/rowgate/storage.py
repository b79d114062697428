"""Where rowgate writes, and how: the user's state dir for bundles (never the subject
tree; builds go to `rowgate.cuda.cache`), path arguments checked before any work
starts, atomic writes, and a filesystem that refuses a write (no space, quota,
read-only, I/O error) turned into one line with its own exit code (`StorageError`,
exit 4) instead of a traceback.

Reads of files a user names go through `read_regular`: a FIFO or device is refused
without blocking on it (opened non-blocking, checked with fstat before any read).
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rowgate.confine import is_utf8, kind_of, shown
from rowgate.errors import StorageError, UsageError

STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EFBIG})


# ------------------------------------------------------------------ the user's dirs


def _xdg(variable: str, default: str) -> Path:
    return Path(os.environ.get(variable) or Path.home() / default) / "rowgate"


def state_dir() -> Path:
    """`$XDG_STATE_HOME/rowgate` (`~/.local/state/rowgate`): bundles by default."""
    return _xdg("XDG_STATE_HOME", ".local/state")


def default_evidence() -> Path:
    """Where `rowgate gate` seals without `--out`: outside any subject tree, so gating
    twice from inside a subject finds it as the first run did."""
    return state_dir() / "evidence"


# ------------------------------------------------------------- storage errors


def is_storage(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in STORAGE_ERRNOS


@contextmanager
def writing(what: str, where: Path | None = None) -> Iterator[None]:
    """Turn a filesystem that refuses a write into StorageError: "PATH: No space left on
    device; WHAT" (PATH the file the system names, else `where`). Whatever was
    half-written is the caller's to undo (its `finally`)."""
    try:
        yield
    except OSError as exc:
        if not is_storage(exc):
            raise
        path = exc.filename if exc.filename is not None else where or "(a write)"
        raise StorageError(f"{path}: {exc.strerror}; {what}") from exc


@contextmanager
def one_builder(target: Path) -> Iterator[None]:
    """One process at a time builds `target` (a kernel build, a model): the others wait
    here, then find it built and reuse it, instead of making the same thing beside it
    (twice the CPU on a small machine) and replacing a copy another process may be
    reading. Other targets in the same directory (a kernel's phase variants) build side
    by side. The lock is a file beside the target (`.NAME.lock`), flocked (the kernel
    releases a dead holder's) and removed by its holder, so nothing is left behind (a
    build that fails on a full disk writes nothing). A waiter that wakes on a lock file
    its holder has already removed starts again on the current one: without that check
    two processes could each hold "the" lock on two different files."""
    target.parent.mkdir(parents=True, exist_ok=True)
    lock = target.parent / f".{target.name}.lock"
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            if os.stat(lock).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    try:
        yield
    finally:
        lock.unlink(missing_ok=True)
        os.close(fd)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes, mode: int = 0o644) -> Path:
    """Write `data` to a temporary file beside `path`, fsync it, rename it over `path`,
    fsync the directory. On any failure the temporary file is removed: readers see the
    old file or the new one, never a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(path.parent)
    return path


# ------------------------------------------------------------ path arguments


def _utf8(path: Path, label: str) -> None:
    if not is_utf8(str(path)):
        raise UsageError(f"{label} {shown(str(path))}: name is not UTF-8")


def _ancestor(path: Path) -> Path:
    """The nearest existing ancestor of `path` (itself when it exists)."""
    probe = path
    while not os.path.lexists(probe) and probe != probe.parent:
        probe = probe.parent
    return probe


def _probe_writable(directory: Path, label: str, path: Path) -> None:
    """Create and remove a temporary directory in `directory`: writable, or one line."""
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".rowgate-probe-", dir=directory))
    except OSError as exc:
        raise UsageError(f"{label} {path}: cannot write in {directory} ({exc.strerror})") from exc


def out_dir(path: Path, label: str = "--out") -> Path:
    """An absolute directory rowgate can create and write: checked, not created (nothing
    is written before the run is set up). Raises UsageError with one line."""
    path = path.absolute()
    _utf8(path, label)
    existing = _ancestor(path)
    if not existing.is_dir():
        what = kind_of(os.stat(existing).st_mode) if os.path.exists(existing) else "missing"
        where = "" if existing == path else f" ({existing} is {what or 'a file'})"
        raise UsageError(f"{label} {path}: not a directory{where}")
    _probe_writable(existing, label, path)
    return path


def output_file(path: Path, label: str) -> Path:
    """A regular file rowgate may (re)write, and a directory it can write it in."""
    path = path.absolute()
    _utf8(path, label)
    if os.path.lexists(path):
        mode = os.stat(path).st_mode if os.path.exists(path) else 0
        if stat.S_ISDIR(mode):
            raise UsageError(f"{label} {path}: is a directory")
        if not stat.S_ISREG(mode):
            raise UsageError(f"{label} {path}: {kind_of(mode) or 'dangling'}, not a regular file")
    if path.parent.exists():
        _probe_writable(path.parent, label, path)
    else:
        out_dir(path.parent, label)
    return path


def read_regular(path: Path, label: str) -> bytes:
    """The bytes of a regular file; one UsageError line (`LABEL: why`) for anything else.
    Opened non-blocking and checked with fstat before reading: a FIFO never blocks."""
    if not is_utf8(str(path)):
        raise UsageError(f"{label}: name is not UTF-8")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise UsageError(f"{label}: cannot read: {exc.strerror}") from exc
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise UsageError(f"{label}: {kind_of(mode)}, not a regular file")
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read()
    finally:
        os.close(fd)
