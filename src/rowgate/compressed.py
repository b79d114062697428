"""Artifacts sealed gzipped: written byte-stable, read transparently.

The bulk of a kernel bundle is text and binaries that compress 3-13x: SASS dumps
(6 MB for a 500 KB cubin), PTX, objects and fatbins, per-case JSON, Chrome traces.
Gates seal those as `NAME.gz`. The rule readers rely on is the name alone: a name
ending `.gz` is gzip, any other name is the bytes as written, so a bundle sealed
before this (plain `sass.txt`, `cases.json`) reads exactly as it always did.

Written with mtime 0 and no file name in the header (gzip.compress writes none), at
level 9: the same content gives the same sealed bytes on every run with the same zlib,
and no time or temp path leaks into the bundle. The manifest digests the compressed
bytes; where a record names the digest of the content (a build's outputs), readers
hash what `read_bytes` returns.
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

SUFFIX = ".gz"


def pack(data: bytes) -> bytes:
    """`data` gzipped, byte-stable (mtime 0, no name, level 9)."""
    return gzip.compress(data, compresslevel=9, mtime=0)


def is_gzip_name(path: Path | str) -> bool:
    return str(path).endswith(SUFFIX)


def write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path`, gzipped when the name ends `.gz`."""
    path.write_bytes(pack(data) if is_gzip_name(path) else data)


def write_text(path: Path, text: str) -> None:
    write_bytes(path, text.encode())


INFLATE_LIMIT = 512 << 20
"""The most a `.gz` artifact may inflate to when its reader sets no limit of its own: 23x
the largest one rowgate seals (a 22 MB SASS dump, 2026-12). A bundle or record is
untrusted input and a few kilobytes of deflate can inflate to gigabytes: past this the
read stops and says so (OSError, which every artifact reader turns into one line)."""


def read_bytes(path: Path, limit: int | None = None) -> bytes:
    """The content of `path`, decompressed when the name ends `.gz`. With `limit`, at
    most limit + 1 bytes (a caller that refuses large artifacts sees it is over
    without inflating a gzip bomb); without, a `.gz` that inflates past
    `INFLATE_LIMIT` is refused. OSError (gzip.BadGzipFile is one) or EOFError
    for a file that is unreadable or not the gzip its name says."""
    if not is_gzip_name(path):
        if limit is None:
            return path.read_bytes()
        with open(path, "rb") as f:
            return f.read(limit + 1)
    try:
        with gzip.open(path, "rb") as f:
            data = f.read((INFLATE_LIMIT if limit is None else limit) + 1)
    except zlib.error as exc:  # a corrupt deflate stream is not an OSError
        raise OSError(f"{path.name}: not valid gzip: {exc}") from exc
    if limit is None and len(data) > INFLATE_LIMIT:
        raise OSError(f"{path.name}: inflates past {INFLATE_LIMIT} bytes, the most a sealed "
                      f"artifact may hold (a gzip bomb?); not read further")
    return data


def read_text(path: Path, errors: str = "strict") -> str:
    return read_bytes(path).decode(errors=errors)


def gzipped(path: Path) -> Path:
    """`path` with `.gz` appended (`sass.txt` -> `sass.txt.gz`)."""
    return path.with_name(path.name + SUFFIX)


def either(path: Path) -> Path:
    """The sealed form of an artifact whose name changed to `.gz`: `path.gz` when it
    exists, else `path` (a bundle sealed before the change)."""
    packed = gzipped(path)
    return packed if packed.exists() else path


def compress_in_place(path: Path) -> Path:
    """Replace `path` by `path.gz` holding its bytes; the new path."""
    packed = gzipped(path)
    packed.write_bytes(pack(path.read_bytes()))
    path.unlink()
    return packed
