"""CUDA toolchains from wheels in the running environment, pinned and described.

* sm_70/sm_72 (CUDA 13 dropped them), the first of:
  - an nvcc the operator names (gate option `nvcc_sm70=/path`: a CUDA 10-12 toolkit,
    as a V100 host has), host code through the system g++;
  - Debian 12's CUDA 11.8 toolkit that `rowgate toolchain fetch cuda-11.8` put in the
    data dir (`rowgate.cuda.debian_toolkit`), host code through g++-11;
  - CUDA 12.8 from wheels: NVRTC (`nvidia-cuda-nvrtc-cu12`) compiles to PTX, `ptxas`
    from `nvidia-cuda-nvcc-cu12` assembles. NVRTC compiles device code only: a
    translation unit with host code needs one of the nvccs above. No 12.x wheel ships
    cuobjdump/nvdisasm, and the 13.x ones refuse sm_70 SASS, so the SASS tools come
    from the pinned `triton` 3.4.0 wheel, which bundles CUDA 12.8's.
  `nvcc_sm70=nvrtc` asks for the wheels' NVRTC even where an nvcc is fetched.
* CUDA 13 for sm_75 and newer (sm_90, sm_90a, sm_110 = Thor): the complete
  `nvcc` of `nvidia-cuda-nvcc`, with cuobjdump/nvdisasm from their 13.x wheels.
  A device machine may name its own nvcc (gate option `nvcc=/path`); its version
  is then read from it and recorded.

The machine's /usr/local/cuda is never consulted. Exact versions (package and
`--version` of each binary) go into every build record: register counts move
between minor toolchain versions.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

from rowgate.cuda import debian_toolkit
from rowgate.errors import Error

NVRTC_ARCHES = ("sm_70", "sm_72")
CUDA12_INSTALL = "pip install 'rowgate[cuda12]' (nox -s build-sm70)"
CUDA13_INSTALL = "pip install 'rowgate[cuda13]' (nox -s build-sm90 / build-sm110)"
NVRTC = "nvrtc"
"""`nvcc_sm70=nvrtc`: sm_70 through the wheels' NVRTC whatever nvcc is here."""
CUDA12_HEADERS = (("nvidia-cuda-runtime-cu12", "nvidia/cuda_runtime/include"),
                  ("nvidia-cuda-cccl-cu12", "nvidia/cuda_cccl/include"))
"""cudart and CCCL headers of the 12.8 release, put on NVRTC's include path."""
EXPLICIT = "explicit path"
"""`Tool.package` of binaries given by path (gate option) rather than found in a wheel."""
_VERSION = re.compile(r"release (\d+\.\d+), V(\d+\.\d+\.\d+)")


class ToolchainError(Error):
    """A toolchain the arch needs is not installed or not usable."""


@dataclass(frozen=True)
class Tool:
    """One binary or library, where it came from and its exact version."""

    path: str
    version: str
    """`--version` of the binary (`12.8.93`), or NVRTC's own for the library."""
    package: str
    package_version: str


@dataclass(frozen=True)
class Toolchain:
    name: str
    """`cuda-12.8-nvrtc` or `cuda-13-nvcc`."""
    kind: str
    """`nvrtc` (NVRTC + ptxas) or `nvcc`."""
    compiler: Tool
    """libnvrtc for `nvrtc`, nvcc for `nvcc`."""
    ptxas: Tool | None
    """Standalone ptxas (the `nvrtc` kind; nvcc drives its own)."""
    cuobjdump: Tool | None
    nvdisasm: Tool | None
    host_compiler: Tool | None = None
    """The C++ compiler nvcc drives for host code (its warnings count too)."""
    headers: dict[str, str] = field(default_factory=dict)
    """Header/support wheels in use, package -> exact version (CCCL, crt, cudart, nvvm):
    a CCCL upgrade changes what compiles, so it is part of the cache identity."""
    include_dirs: tuple[str, ...] = ()
    """Extra -I for NVRTC (cudart and CCCL headers of the same release); nvcc finds
    its own through nvcc.profile."""
    ccbin: str = ""
    """The host compiler nvcc must be told to use (`-ccbin`: CUDA 11.8 accepts GCC up to
    11, the system's g++ is newer); empty: nvcc's default."""
    toolkit_flags: tuple[str, ...] = ()
    """What this toolchain itself needs on every nvcc call: CUDA 12's nvcc warns that
    sm_70 is deprecated, a notice about the toolkit rather than the code, which warnings
    as errors would otherwise fail (as NVRTC's same notice is ignored)."""
    own_headers: str = ""
    """A whole toolkit's include directory, which holds its libraries' headers (cuBLAS,
    NVTX): a kernel's declared `headers` come from there, not from wheels of another
    release (rowgate.cuda.library_headers)."""
    sass_missing: str = ""
    """Why the SASS tools cannot disassemble this toolchain's arches (empty: they can)."""
    binutils_missing: str = ""
    """Why cuobjdump/nvdisasm are not here (where they were looked for): a build needs
    neither, the audit refuses to run without them. Not part of the cache identity."""

    def describe(self) -> dict[str, Any]:
        return asdict(self)

    def digest(self) -> str:
        """Identity for the build cache: every tool's exact version (not its path,
        so two environments with the same pins share a cache)."""
        def strip(d: dict[str, Any]) -> dict[str, Any]:
            return {k: strip(v) if isinstance(v, dict) else v for k, v in d.items()
                    if k not in ("path", "include_dirs", "binutils_missing", "ccbin",
                                 "own_headers")}
        return hashlib.sha256(json.dumps(strip(self.describe()), sort_keys=True).encode()).hexdigest()

    def short(self) -> str:
        return f"{self.name} {self.compiler.version}"

    def roots(self) -> list[Path]:
        """What a sandboxed compile must read besides the system and rowgate's Python:
        each tool's install root (an nvcc given by path lives anywhere) and its headers."""
        tools = (self.compiler, self.ptxas, self.cuobjdump, self.nvdisasm, self.host_compiler)
        found = {Path(t.path).resolve().parent.parent for t in tools if t is not None and t.path}
        found.update(Path(d).resolve() for d in (*self.include_dirs, self.own_headers) if d)
        return sorted(p for p in found if p.exists() and p != Path("/"))


def uses_nvrtc(arch: str) -> bool:
    return arch in NVRTC_ARCHES


def for_arch(arch: str, nvcc: str | None = None, nvcc_sm70: str | None = None) -> Toolchain:
    """The toolchain that builds `arch`: `nvcc` (an explicit CUDA 13 nvcc) for sm_75 and
    newer, `nvcc_sm70` for sm_70/sm_72 (module docstring). Raises ToolchainError when
    absent."""
    if uses_nvrtc(arch):
        if nvcc_sm70 == NVRTC:
            return _cuda12()
        if nvcc_sm70:
            return _legacy_nvcc(Path(nvcc_sm70), explicit=True)
        fetched = debian_toolkit.nvcc()
        return _legacy_nvcc(fetched, explicit=False) if fetched else _cuda12()
    return _cuda13(nvcc)


def for_options(arch: str, options: Mapping[str, str]) -> Toolchain:
    """`for_arch` with the gate options that choose a toolchain (`nvcc`, `nvcc_sm70`)."""
    return for_arch(arch, options.get("nvcc"), options.get("nvcc_sm70"))


def _legacy_nvcc(path: Path, explicit: bool) -> Toolchain:
    """A CUDA 10-12 nvcc for sm_70: an explicit one (option `nvcc_sm70`), or Debian's
    11.8 from `rowgate toolchain fetch`. Its own cuobjdump/nvdisasm (they disassemble
    sm_70), its own headers for the libraries a kernel declares."""
    if not path.is_file():
        raise ToolchainError(f"option nvcc_sm70={path}: no such file")
    version = binary_version(str(path))
    if not version.startswith(("10.", "11.", "12.")):
        raise ToolchainError(f"{path} is CUDA {version}: sm_70 needs CUDA 10 to 12 "
                             f"(CUDA 13 dropped it)")
    if explicit:
        compiler = Tool(str(path), version, EXPLICIT, "")
        host, ccbin = _host_compiler(), ""
        bindir, include = path.parent, path.parent.parent / "include"
    else:
        compiler = Tool(str(path), version, f"debian:{debian_toolkit.PACKAGES[0].name}",
                        debian_toolkit.VERSION)
        host = _host_compiler(debian_toolkit.HOST_COMPILER)
        ccbin = host.path
        top = path.parents[3]  # PREFIX/usr from PREFIX/usr/lib/nvidia-cuda-toolkit/bin/nvcc
        bindir, include = top / "bin", top / "include"
    tools, missing = {}, []
    for name in ("cuobjdump", "nvdisasm"):
        if (bindir / name).is_file():
            tools[name] = Tool(str(bindir / name), binary_version(str(bindir / name)),
                               compiler.package, compiler.package_version)
        else:
            missing.append(f"no {name} beside {path} ({bindir / name})")
    headers = {} if explicit else {
        p.name: p.version for p in debian_toolkit.PACKAGES[1:]}
    return Toolchain(name=f"cuda-{'.'.join(version.split('.')[:2])}-nvcc", kind="nvcc",
                     compiler=compiler, ptxas=None, cuobjdump=tools.get("cuobjdump"),
                     nvdisasm=tools.get("nvdisasm"), host_compiler=host, ccbin=ccbin,
                     headers=headers,
                     own_headers=str(include) if include.is_dir() else "",
                     binutils_missing="; ".join(missing))


def _file(dist: str, rel: str, install: str) -> Path:
    try:
        d = metadata.distribution(dist)
    except metadata.PackageNotFoundError:
        raise ToolchainError(f"{dist} is not installed: {install}") from None
    path = Path(str(d.locate_file(rel)))  # typeshed's SimplePath is no PathLike
    if not path.exists():
        raise ToolchainError(f"{dist} {d.version}: {rel} missing from the wheel: {install}")
    return path


@cache
def binary_version(path: str) -> str:
    """`V12.8.93` of a CUDA binary's `--version`, as `12.8.93`."""
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60,
                             check=False).stdout
    except OSError as exc:
        raise ToolchainError(f"{path}: cannot run: {exc.strerror}") from exc
    m = _VERSION.search(out)
    if not m:
        raise ToolchainError(f"{path} --version: no CUDA release line in {out.strip()[:120]!r}")
    return m.group(2)


def _tool(dist: str, rel: str, install: str) -> Tool:
    path = _file(dist, rel, install)
    return Tool(str(path), binary_version(str(path)), dist, metadata.version(dist))


@cache
def nvrtc_version(lib: str) -> str:
    """`major.minor` reported by the library itself (nvrtcVersion)."""
    try:
        handle = ctypes.CDLL(lib)
    except OSError as exc:
        raise ToolchainError(f"{lib}: cannot load: {exc}") from exc
    major, minor = ctypes.c_int(), ctypes.c_int()
    if handle.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)) != 0:
        raise ToolchainError(f"{lib}: nvrtcVersion failed")
    return f"{major.value}.{minor.value}"


def _cuda12() -> Toolchain:
    lib = _file("nvidia-cuda-nvrtc-cu12", "nvidia/cuda_nvrtc/lib/libnvrtc.so.12", CUDA12_INSTALL)
    pkg = metadata.version("nvidia-cuda-nvrtc-cu12")
    api = nvrtc_version(str(lib))
    if not pkg.startswith(api + "."):
        raise ToolchainError(f"libnvrtc reports {api} but the package is {pkg}")
    ptxas = _tool("nvidia-cuda-nvcc-cu12", "nvidia/cuda_nvcc/bin/ptxas", CUDA12_INSTALL)
    cuobjdump = nvdisasm = None
    missing = ""
    try:
        cuobjdump = _tool("triton", "triton/backends/nvidia/bin/cuobjdump", CUDA12_INSTALL)
        nvdisasm = _tool("triton", "triton/backends/nvidia/bin/nvdisasm", CUDA12_INSTALL)
        if not cuobjdump.version.startswith("12."):
            missing = (f"triton {cuobjdump.package_version} bundles cuobjdump "
                       f"{cuobjdump.version}, which refuses sm_70 SASS; pin triton==3.4.0 "
                       f"(CUDA 12.8 cuobjdump/nvdisasm): {CUDA12_INSTALL}")
    except ToolchainError as exc:
        missing = f"no CUDA 12.x cuobjdump/nvdisasm for sm_70 SASS ({exc.diagnostics()})"
    if missing:
        # A 13.x cuobjdump still reads sm_70 resource usage and unpacks images;
        # only its disassembly refuses sm_70.
        try:
            cuobjdump = _tool("nvidia-cuda-cuobjdump", "nvidia/cu13/bin/cuobjdump", CUDA13_INSTALL)
        except ToolchainError:
            pass  # keep the 13.x one a newer triton bundles, if any
        nvdisasm = None
    headers = _versions("nvidia-cuda-runtime-cu12", "nvidia-cuda-cccl-cu12")
    include_dirs = tuple(str(_file(dist, rel, CUDA12_INSTALL)) for dist, rel in CUDA12_HEADERS
                         if dist in headers)
    return Toolchain(name=f"cuda-{api}-nvrtc", kind="nvrtc", headers=headers,
                     include_dirs=include_dirs,
                     compiler=Tool(str(lib), pkg, "nvidia-cuda-nvrtc-cu12", pkg), ptxas=ptxas,
                     cuobjdump=cuobjdump, nvdisasm=nvdisasm, sass_missing=missing)


def _cuda13(nvcc: str | None) -> Toolchain:
    if nvcc:
        path = Path(nvcc)
        if not path.is_file():
            raise ToolchainError(f"option nvcc={nvcc}: no such file")
        compiler = Tool(str(path), binary_version(str(path)), EXPLICIT, "")
    else:
        compiler = _tool("nvidia-cuda-nvcc", "nvidia/cu13/bin/nvcc", CUDA13_INSTALL)
    if not compiler.version.startswith("13."):
        raise ToolchainError(f"{compiler.path} is CUDA {compiler.version}; sm_110 and this "
                             f"build need CUDA 13: {CUDA13_INSTALL}")
    # only the audit reads binaries: a build does not need these, so their absence is
    # said (where each was looked for) and left to the audit to refuse
    cuobjdump: Tool | None = None
    nvdisasm: Tool | None = None
    missing = []
    try:
        cuobjdump = _sibling_or_wheel(compiler, "cuobjdump", "nvidia-cuda-cuobjdump")
        nvdisasm = _sibling_or_wheel(compiler, "nvdisasm", "nvidia-cuda-nvdisasm")
    except ToolchainError as exc:
        missing.append(exc.diagnostics())
    headers = {} if compiler.package == EXPLICIT else _versions(
        "nvidia-cuda-cccl", "nvidia-cuda-crt", "nvidia-cuda-runtime", "nvidia-nvvm")
    return Toolchain(name="cuda-13-nvcc", kind="nvcc", compiler=compiler, ptxas=None,
                     cuobjdump=cuobjdump, nvdisasm=nvdisasm, host_compiler=_host_compiler(),
                     headers=headers, binutils_missing="; ".join(missing))


def _versions(*dists: str) -> dict[str, str]:
    out = {}
    for dist in dists:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return out


def _host_compiler(name: str = "") -> Tool:
    gcc = shutil.which(name) if name else shutil.which("g++") or shutil.which("gcc")
    if gcc is None:
        if name:
            raise ToolchainError(f"{debian_toolkit.NAME}'s nvcc needs its host compiler "
                                 f"{name} on PATH: apt-get install {name}")
        raise ToolchainError("nvcc needs a host C++ compiler: no g++ or gcc on PATH")
    out = subprocess.run([gcc, "-dumpfullversion"], capture_output=True, text=True, timeout=60,
                         check=False).stdout.strip()
    return Tool(gcc, out, "system", "")


def _sibling_or_wheel(compiler: Tool, name: str, dist: str) -> Tool:
    """An explicit nvcc's own cuobjdump/nvdisasm first: one toolkit, one version.
    ToolchainError naming every place it looked."""
    sibling = Path(compiler.path).parent / name
    if compiler.package == EXPLICIT and sibling.is_file():
        return Tool(str(sibling), binary_version(str(sibling)), EXPLICIT, "")
    try:
        return _tool(dist, f"nvidia/cu13/bin/{name}", CUDA13_INSTALL)
    except ToolchainError as exc:
        if compiler.package != EXPLICIT:
            raise
        raise ToolchainError(f"no {name} beside option nvcc={compiler.path} ({sibling}), and "
                             f"{exc.diagnostics()}") from None


LISTED_ARCHES = ("sm_70", "sm_90", "sm_110")


def by_arch(options: Mapping[str, str]) -> list[dict[str, str]]:
    """`rowgate toolchain list`: for each arch, the toolchain that would build it here
    and where each tool comes from, or why there is none. Never raises."""
    out = []
    for arch in LISTED_ARCHES:
        try:
            tc = for_options(arch, options)
        except Error as exc:
            out.append({"arch": arch, "toolchain": "none", "compiler": "",
                        "host": "", "sass": "", "note": exc.diagnostics()})
            continue
        out.append({"arch": arch, "toolchain": tc.name, "compiler": _origin(tc.compiler),
                    "host": _origin(tc.host_compiler), "sass": _origin(tc.nvdisasm),
                    "note": tc.sass_missing or tc.binutils_missing})
    return out


def _origin(tool: Tool | None) -> str:
    """`13.5.37 (nvidia-cuda-nvcc)` for a listing (the package's exact version: `installed()`)."""
    return "-" if tool is None else f"{tool.version} ({tool.package})"


def installed() -> dict[str, str]:
    """Provenance: each toolchain present here with its tools' exact versions.
    Never raises; a toolchain that is absent or broken says so in its value."""
    out = {}
    for arch in ("sm_70", "sm_90"):
        try:
            tc = for_arch(arch)
        except Error as exc:
            out["cuda-12.8-nvrtc" if uses_nvrtc(arch) else "cuda-13-nvcc"] = \
                f"unavailable: {exc.diagnostics()}"
            continue
        tools = [("ptxas", tc.ptxas), ("cuobjdump", tc.cuobjdump), ("nvdisasm", tc.nvdisasm),
                 ("g++", tc.host_compiler)]
        out[tc.name] = ", ".join([tc.compiler.version] + [
            f"{name} {tool.version} ({' '.join(filter(None, (tool.package, tool.package_version)))})"
            for name, tool in tools if tool is not None])
    return out
