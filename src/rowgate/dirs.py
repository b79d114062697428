"""Where rowgate finds and keeps its files: package data, and the user's dirs.

An installed rowgate never looks at a checkout and never writes into its own package
or into a subject. What ships with it (schemas, the demo rows and their data) is package
data, read through `importlib.resources`; what it makes (models, kernel builds, engine
logs and caches) goes to the user cache dir: `ROWGATE_CACHE_DIR`, else
`$XDG_CACHE_HOME/rowgate`, else `~/.cache/rowgate`; what it installs for itself (a
toolchain `rowgate toolchain fetch` brought) to the user data dir.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

CACHE_ENV = "ROWGATE_CACHE_DIR"
DATA_ENV = "ROWGATE_DATA_DIR"


def cache_root() -> Path:
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "rowgate"


def cache(*parts: str) -> Path:
    """A directory under the cache root (not created)."""
    return cache_root().joinpath(*parts)


def data_root() -> Path:
    """What rowgate installs for itself and keeps (toolchains it fetched): not a cache,
    so a test or a `rm -rf` of the cache leaves it. `ROWGATE_DATA_DIR`, else
    `$XDG_DATA_HOME/rowgate`, else `~/.local/share/rowgate`."""
    explicit = os.environ.get(DATA_ENV)
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_DATA_HOME")
    return (Path(xdg) if xdg else Path.home() / ".local" / "share") / "rowgate"


def data(*parts: str) -> Path:
    """A directory under the data root (not created)."""
    return data_root().joinpath(*parts)


def package_data(*parts: str) -> Path:
    """A file or directory shipped inside the installed package. rowgate installs as
    files on disk (a wheel unpacked into site-packages), so the resource is a path;
    a zipped install is not supported and fails here, loudly."""
    ref = resources.files("rowgate").joinpath(*parts)
    if not isinstance(ref, Path):
        raise RuntimeError(f"rowgate's package data {'/'.join(parts)} is not on a filesystem "
                           f"({type(ref).__name__}): install rowgate unzipped")
    return ref


def schemas_dir() -> Path:
    return package_data("schemas")


def demos_dir() -> Path:
    return package_data("demos")
