"""Headers of the CUDA libraries a kernel declares (`headers = ["cublas", "nvtx"]`), from
the wheels of the toolchain's release, each in an include directory of its own.

The pinned toolchains ship no library headers: a real project's host code includes
`cublas_v2.h` or `nvtx3/nvToolsExt.h`. NVIDIA publishes them in the libraries' wheels
(`rowgate[cuda13-libs]` for nvcc builds, `rowgate[cuda12-libs]` for the NVRTC path; a
whole toolkit, an sm_70 nvcc, has its own of its release, used as they are), but
the CUDA 13 wheels share one `nvidia/cu13/include` with cudart and CCCL: putting that
directory on the path would shadow an explicit nvcc's own runtime headers with another
release's. So each declared library's own files, as its wheel's RECORD lists them, are
copied into `CACHE/headers/PACKAGE-VERSION/include` (once; outside every subject), and
only that directory goes on the include path, bound read-only into the sandbox. The
package and its exact version are part of the build's cache key and its record.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from rowgate.cuda import cache
from rowgate.cuda.toolchains import Toolchain, ToolchainError

LIBRARIES = {
    "cublas": {"nvcc": "nvidia-cublas", "nvrtc": "nvidia-cublas-cu12"},
    "nvtx": {"nvcc": "nvidia-nvtx", "nvrtc": "nvidia-nvtx-cu12"},
    "cusparse": {"nvcc": "nvidia-cusparse", "nvrtc": "nvidia-cusparse-cu12"},
    "cusolver": {"nvcc": "nvidia-cusolver", "nvrtc": "nvidia-cusolver-cu12"},
    # header-only host libraries real projects include, from their PyPI repackaging
    "nlohmann-json": {"nvcc": "nlohmann-json", "nvrtc": "nlohmann-json"},
    # a torch extension's C++ API (torch/all.h, ATen, c10), from the installed torch
    "torch": {"nvcc": "torch", "nvrtc": "torch"},
}
"""A declared library -> its headers' wheel per toolchain kind."""
INSTALL = {"nvcc": "pip install 'rowgate[cuda13-libs]'",
           "nvrtc": "pip install 'rowgate[cuda12-libs]'"}
HOST_LIBRARIES = frozenset({"nlohmann-json", "torch"})
HOST_INSTALL = {"nlohmann-json": "pip install 'rowgate[host-libs]'",
                "torch": "install a CUDA build of torch"}
NEEDS = {"torch": ("cublas", "cusparse", "cusolver")}
"""Libraries whose headers a library's own include: torch's CUDA headers
(ATen/cuda/CUDAContextLight.h: cublas_v2.h, cublasLt.h, cusparse.h, cusolverDn.h). A CUDA
torch installs their wheels, the versions it was built against, so they come from there
rather than from rowgate's pins."""
TORCH_CUDA_MARK = ("c10", "cuda", "impl", "cuda_cmake_macros.h")
"""Generated only by a CUDA build of torch; a CPU build's c10/cuda headers include it."""
TREES = {"torch": ("torch", "include")}
"""Where a library's headers sit in its distribution, when not every `include/` is."""
SUBDIRS = {"torch": ("torch/csrc/api/include",)}
"""Further include directories inside a library's own (torch's C++ frontend)."""
NOT_HEADERS = frozenset({".py", ".pyc"})
"""A wheel's Python files under its include directory (a repackaging's __init__.py)."""
MARKER = ".complete"


@dataclass(frozen=True)
class LibraryHeaders:
    library: str
    package: str
    version: str
    include_dir: str
    """The private include directory (not part of the cache identity: it moves with
    the cache)."""
    lib_dir: str = ""
    """Unversioned link names (`libcublas.so`) of the wheel's shared libraries, so a
    project's own build links `-lcublas` as it would against a toolkit (its programs
    are built, never run); empty where the toolkit has its own (an sm_70 nvcc's stubs)."""

    def identity(self) -> dict[str, str]:
        return {"library": self.library, "package": self.package, "version": self.version}

    def include_dirs(self) -> list[str]:
        """The include directory and those inside it that the library's own headers
        expect on the path (torch's `torch/csrc/api/include`)."""
        return [self.include_dir, *(str(Path(self.include_dir) / d)
                                    for d in SUBDIRS.get(self.library, ()))]


Found = tuple[str, metadata.Distribution, list[metadata.PackagePath]]
"""A declared library's package, its installed distribution and its include files."""


def resolve(libraries: Sequence[str], toolchain: Toolchain) -> list[LibraryHeaders]:
    """The include directory of each declared library for `toolchain`, with those a
    declared library's headers include (torch's CUDA libraries) added once. Raises
    ToolchainError naming the library, its package and how to install it."""
    return [_publish_found(name, _found(name, toolchain), toolchain)
            for name in _with_needs(libraries)]


def check(libraries: Sequence[str], toolchain: Toolchain) -> None:
    """What `resolve` would refuse, without copying anything (a gate's plan)."""
    for name in _with_needs(libraries):
        _found(name, toolchain)


def _with_needs(libraries: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(n for name in libraries for n in (name, *NEEDS.get(name, ()))))


def _found(library: str, toolchain: Toolchain) -> Found | None:
    """Where the library's headers are; None where the toolchain is a whole toolkit
    with the library's headers of its own release."""
    if library not in LIBRARIES:
        raise ToolchainError(f"headers: unknown library {library!r} (known: "
                             f"{', '.join(sorted(LIBRARIES))})")
    if toolchain.own_headers and library not in HOST_LIBRARIES:
        return None
    kind = toolchain.kind
    package = LIBRARIES[library][kind]
    try:
        dist = metadata.distribution(package)
    except metadata.PackageNotFoundError:
        hint = HOST_INSTALL.get(library) or INSTALL[kind]
        raise ToolchainError(f"headers: {library} needs {package}, which is not installed: "
                             f"{hint}") from None
    files = _include_files(library, dist)
    if not files:
        raise ToolchainError(f"headers: {package} {dist.version} lists no include files")
    if library in CHECKS:
        CHECKS[library](dist, files, toolchain)
    return package, dist, files


def _publish_found(library: str, found: Found | None, toolchain: Toolchain) -> LibraryHeaders:
    if found is None:
        # a whole toolkit (an sm_70 nvcc) ships its libraries' headers of its release
        return LibraryHeaders(library, toolchain.name, toolchain.compiler.version,
                              toolchain.own_headers)
    package, dist, files = found
    dest = cache.root() / "headers" / f"{package}-{dist.version}" / "include"
    if not (dest.parent / MARKER).is_file():
        _publish(dist, files, dest)
    return LibraryHeaders(library, package, dist.version, str(dest), _link_names(dist, dest.parent))


def _include_files(library: str, dist: metadata.Distribution) -> list[metadata.PackagePath]:
    tree = TREES.get(library)

    def inside(f: metadata.PackagePath) -> bool:
        if tree is None:
            return "include" in f.parts[:-1]
        return f.parts[:len(tree)] == tree and len(f.parts) > len(tree)

    return [f for f in dist.files or () if inside(f) and f.suffix not in NOT_HEADERS]


def _check_torch(dist: metadata.Distribution, files: list[metadata.PackagePath],
                 toolchain: Toolchain) -> None:
    """torch's headers compile in a host compiler's translation unit only, and its CUDA
    headers exist only in a CUDA build: each refusal says so before a compile would fail
    on a missing file."""
    if toolchain.kind != "nvcc":
        raise ToolchainError(f"headers: torch's C++ headers need a host compiler; "
                             f"{toolchain.name} compiles device code only (NVRTC)")
    if not any(f.parts[-len(TORCH_CUDA_MARK):] == TORCH_CUDA_MARK for f in files):
        raise ToolchainError(
            f"headers: torch {dist.version} is a CPU build (no "
            f"{'/'.join(TORCH_CUDA_MARK)}): its headers cannot compile CUDA code; "
            f"install a CUDA build of torch")


CHECKS = {"torch": _check_torch}
"""What a library's installed headers must be for the toolchain (refused in one line)."""


SHARED = re.compile(r"^(lib[\w+-]+\.so)\.\d+$")


def _link_names(dist: metadata.Distribution, root: Path) -> str:
    """`root/lib`: `libX.so` -> the wheel's `libX.so.N`, made once (a directory renamed
    into place); "" when the wheel has no shared library."""
    shared = [f for f in dist.files or () if SHARED.match(f.name) and "lib" in f.parts[:-1]]
    if not shared:
        return ""
    lib = root / "lib"
    if not lib.is_dir():
        tmp = Path(tempfile.mkdtemp(prefix=".lib-", dir=root))
        try:
            for f in shared:
                match = SHARED.match(f.name)
                assert match is not None
                (tmp / match.group(1)).symlink_to(Path(str(dist.locate_file(f))).resolve())
            if not lib.is_dir():
                os.replace(tmp, lib)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return str(lib)


def _publish(dist: metadata.Distribution, files: list[metadata.PackagePath],
             dest: Path) -> None:
    """Copy the wheel's include files under `dest` (their path after `include/`), whole
    or not at all: a temporary directory renamed into place, a marker naming each file's
    digest last."""
    dest.parent.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".headers-", dir=dest.parent.parent))
    try:
        lines = []
        for f in files:
            rel = Path(*f.parts[f.parts.index("include") + 1:])
            src = Path(str(dist.locate_file(f)))
            (tmp / "include" / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, tmp / "include" / rel)
            lines.append(f"{hashlib.sha256(src.read_bytes()).hexdigest()}  {rel}\n")
        (tmp / MARKER).write_text("".join(sorted(lines)))
        if (dest.parent / MARKER).is_file():  # another build published it meanwhile
            return
        shutil.rmtree(dest.parent, ignore_errors=True)  # a copy that never completed
        os.replace(tmp, dest.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
