"""The one confinement rule for everything a subject names or its commands write.

A subject (the repository a row gates) is untrusted (docs/security.md). Every path it
names is resolved against the subject root with every symbolic link followed, must still
lie inside the root, and must be a regular file where a file is expected (a FIFO, socket
or device is refused, never opened); a name that becomes a path component matches a
strict pattern. What a gate's commands leave in its artifact directory is scanned the
same way before anything of it is sealed. Each refusal is one line naming the file and
the key (`SubjectError`) or, for artifacts, the entry.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Literal, NoReturn, overload

from rowgate.errors import SubjectError

KERNEL_NAME = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"
"""A kernel name: it becomes a directory of the build and of a bundle's artifacts."""
KERNEL_NAME_RULE = "letters, digits, '_' and '-', 1 to 64, starting with a letter or digit"
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_KINDS = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory"))


def shown(value: str) -> str:
    """A name as one printable line: a name that is not UTF-8 shows its bytes (`\\xff`),
    control and format characters their escapes; anything else as it is."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return repr(os.fsencode(value))[2:-1]
    return value if value.isprintable() else ascii(value)[1:-1]


def is_utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # os functions decode undecodable bytes as surrogates
        return False
    return True


def kind_of(mode: int) -> str:
    """`a FIFO`, `a socket`, … for what is not a regular file; "" for a regular file."""
    return next((what for test, what in _KINDS if test(mode)), "" if stat.S_ISREG(mode)
                else "not a file")


def _refuse(where: str, key: str, text: str) -> NoReturn:
    raise SubjectError(f"{where}: {key}: {text}" if key else f"{where}: {text}")


def name(value: str, where: str, key: str, pattern: str = KERNEL_NAME,
         what: str = "kernel name", rule: str = KERNEL_NAME_RULE) -> str:
    """`value` if it matches `pattern`; else one line naming the file and key."""
    if not re.fullmatch(pattern, value):
        _refuse(where, key, f"not a valid {what} ({rule})")
    return value


def distinct_by_case(names: Iterable[str], where: str, prefix: str) -> None:
    """Refuse two names that differ only by case: on a case-insensitive filesystem
    (macOS, Windows) they would share one directory."""
    seen: dict[str, str] = {}
    for n in names:
        other = seen.setdefault(n.casefold(), n)
        if other != n:
            _refuse(where, f"{prefix}{n}", f"differs from {prefix}{other} only by case (they "
                                           f"would share a directory on a case-insensitive "
                                           f"filesystem)")


@overload
def inside(root: Path, rel: str, where: str, key: str, *, base: Path | None = None,
           kind: Literal["file", "dir"] = "file", missing_ok: Literal[False] = False) -> Path: ...


@overload
def inside(root: Path, rel: str, where: str, key: str, *, base: Path | None = None,
           kind: Literal["file", "dir"] = "file", missing_ok: bool) -> Path | None: ...


def inside(root: Path, rel: str, where: str, key: str, *, base: Path | None = None,
           kind: Literal["file", "dir"] = "file", missing_ok: bool = False) -> Path | None:
    """The real path of `rel` (relative to `base`, default `root`), every symbolic link
    resolved, if it lies inside `root` and is a `kind`. None when it does not exist and
    `missing_ok`. Raises SubjectError naming `where` and `key` otherwise."""
    if _CONTROL.search(rel) or not is_utf8(rel):
        _refuse(where, key, f"{shown(rel)!r}: not a valid path (a NUL or control character, "
                            f"or not UTF-8)")
    real_root = Path(os.path.realpath(root))
    target = Path(os.path.realpath((base or root) / rel))
    if not target.is_relative_to(real_root):
        _refuse(where, key, f"{shown(rel)!r} resolves outside the subject {root} (to {target})")
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        if missing_ok:
            return None
        _refuse(where, key, f"{shown(rel)} does not exist")
    except OSError as exc:
        _refuse(where, key, f"{shown(rel)!r} cannot be resolved ({exc.strerror})")
    wanted = stat.S_ISREG if kind == "file" else stat.S_ISDIR
    if not wanted(mode):
        _refuse(where, key, f"{shown(rel)!r} is {kind_of(mode)}, not a "
                            f"{'regular file' if kind == 'file' else 'directory'}")
    return target


def files_under(directory: Path, root: Path, where: str, key: str,
                suffixes: tuple[str, ...] = (), skip: tuple[str, ...] = ()) -> list[Path]:
    """Every file a compiler may read through `directory` (an include dir; with
    `suffixes`, only the headers directly in it): each must have a UTF-8 name, resolve
    inside `root` and be a regular file. Symbolic links that stay inside are followed
    (each real directory once). Paths are returned as found (under `directory`), sorted."""
    found: list[Path] = []
    seen: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(directory, followlinks=True):
        dirnames[:] = [d for d in dirnames if d not in skip]  # `skip`: e.g. `.git`
        real = os.path.realpath(dirpath)
        if real in seen:
            dirnames[:] = []
            continue
        seen.add(real)
        for entry in sorted(dirnames + filenames):
            path = Path(dirpath) / entry
            rel = path.relative_to(directory).as_posix()
            if suffixes and path.suffix not in suffixes:
                continue
            if not is_utf8(entry):
                _refuse(where, key, f"{shown(str(path))}: file name is not UTF-8")
            if entry in dirnames:
                inside(root, rel, where, key, base=directory, kind="dir")
            else:
                inside(root, rel, where, key, base=directory)
                found.append(path)
        if suffixes:
            break
    return sorted(found)


# ----------------------------------------------------------- what commands wrote


def scan_artifacts(directory: Path, prefix: str) -> tuple[list[str], list[str]]:
    """(regular files as `prefix/REL`, problems) under a gate's artifact directory, links
    never followed. A problem is one line: a symbolic link, FIFO, socket or device, or a
    name that is not UTF-8 or holds a control character (a newline) — none of which is
    sealed."""
    files: list[str] = []
    problems: list[str] = []
    for dirpath, dirnames, filenames in os.walk(directory):  # never follows links
        for entry in sorted(dirnames + filenames):
            path = Path(dirpath) / entry
            rel = f"{prefix}/{path.relative_to(directory).as_posix()}"
            mode = path.lstat().st_mode
            if not is_utf8(entry) or not entry.isprintable():
                why = "is not UTF-8" if not is_utf8(entry) else "holds a control character"
                problems.append(f"{shown(rel)}: file name {why} (not sealed)")
                if entry in dirnames:
                    dirnames.remove(entry)
            elif stat.S_ISREG(mode):
                files.append(rel)
            elif not stat.S_ISDIR(mode):
                problems.append(f"{shown(rel)}: {kind_of(mode)}, not a regular file (not sealed)")
    return sorted(files), problems
