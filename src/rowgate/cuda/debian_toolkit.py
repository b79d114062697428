"""Debian 12's CUDA 11.8 toolkit, fetched into rowgate's data dir: the sm_70 nvcc.

CUDA 13 dropped sm_70, and no CUDA 12 wheel ships `nvcc`: the wheels' NVRTC compiles
device code only, so a V100 translation unit with host code (`stdlib.h`, `<cmath>`, a
`main`, a project's own Make or CMake build) cannot build from wheels. Debian 12 packages
NVIDIA's CUDA 11.8 in its non-free component (`nvidia-cuda-toolkit`, `nvidia-cuda-dev`):
a complete nvcc with sm_70, cuBLAS/NVTX/cudart headers and the 11.8 cuobjdump/nvdisasm,
whose host compiler is g++ 11 (Debian's `g++-11`, in main).

`fetch` downloads the pinned packages with the machine's own apt, against the machine's
own Debian 12 sources with `contrib non-free` added (a private copy of the source list
and of apt's lists: the system's apt configuration is not changed, and rowgate names no
package index of its own), verifies them as apt does (the archive's signed Release and
each package's hash), and unpacks only what a build needs into
`DATA/toolchains/cuda-11.8/`, published whole or not at all (a temporary directory
renamed into place, the manifest last). Nothing here runs subject code: the sandbox is for
the compiles that use the toolkit (rowgate.cuda.cudabuild).

Why apt and dpkg-deb rather than a Python package: they are Debian's own verifying
downloader and unpacker; a hand-made .deb reader would re-implement both.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rowgate import dirs
from rowgate.errors import Error, UsageError

NAME = "cuda-11.8"
VERSION = "11.8.89~11.8.0-5~deb12u1"
CODENAME = "bookworm"
"""Debian 12: the release whose non-free component holds the pinned packages."""
MANIFEST = "toolkit.json"
NVCC = "usr/lib/nvidia-cuda-toolkit/bin/nvcc"
"""The real nvcc (Debian's /usr/bin/nvcc is a script that execs it)."""
HOST_COMPILER = "g++-11"
"""CUDA 11.8 supports GCC up to 11; Debian's own wrapper picks g++-11 first."""
COMPONENTS = "main contrib non-free"


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    members: tuple[str, ...]
    """What to unpack (tar patterns over the package's files); the rest is not needed to
    build and audit (nvidia-cuda-dev's 2.7 GB of libraries: only its headers and the
    static runtime are kept)."""


PACKAGES = (
    Package("nvidia-cuda-toolkit", VERSION, ("./usr/bin/*", "./usr/include/*",
                                             "./usr/lib/nvidia-cuda-toolkit/bin/*",
                                             "./usr/lib/nvidia-cuda-toolkit/libdevice/*")),
    Package("nvidia-cuda-dev", VERSION, ("./usr/include/*",
                                         "./usr/lib/x86_64-linux-gnu/libcudart_static.a",
                                         "./usr/lib/x86_64-linux-gnu/libcudadevrt.a",
                                         # link stubs: a project's programs link -lcublas
                                         "./usr/lib/x86_64-linux-gnu/stubs/*")),
    # CUB, Thrust and libcu++ headers the toolkit's headers and real projects include
    Package("libcub-dev", "1.17.2-2", ("./usr/include/*",)),
    Package("libthrust-dev", "1.17.2-2", ("./usr/include/*",)),
    Package("libcu++-dev", "1.8.1-2", ("./usr/include/*",)),
)
INSTALL = f"rowgate toolchain fetch {NAME}"

_PROFILE = """\
# rowgate: Debian's nvcc.profile names /usr; this toolkit lives wherever it was fetched.
TOP = $(_HERE_)/../../..
NVVMIR_LIBRARY_DIR = $(TOP)/lib/nvidia-cuda-toolkit/libdevice
PATH += $(_HERE_):$(TOP)/bin:
INCLUDES += "-I$(TOP)/include" $(_SPACE_)
LIBRARIES =+ $(_SPACE_) "-L$(TOP)/lib/x86_64-linux-gnu/stubs" "-L$(TOP)/lib/x86_64-linux-gnu"
"""
"""nvcc reads `nvcc.profile` beside itself; `_HERE_` is that directory."""


class NotHere(UsageError):
    """This machine cannot fetch the toolkit (not Debian 12, no apt): its configuration,
    exit 2."""


class FetchError(Error):
    """apt or the unpacking failed (the network, the archive, the disk): exit 1."""


def home() -> Path:
    return dirs.data("toolchains", NAME)


def nvcc() -> Path | None:
    """The fetched toolkit's nvcc, when a complete one is here (its manifest written
    last), else None."""
    root = home()
    return root / NVCC if (root / MANIFEST).is_file() and (root / NVCC).is_file() else None


def manifest() -> dict[str, object]:
    """What was fetched: each package's version and its .deb's sha256."""
    data: dict[str, object] = json.loads((home() / MANIFEST).read_text())
    return data


def fetch(say: Callable[[str], None], force: bool = False) -> Path:
    """Download, verify and unpack the pinned packages into `home()`; return the nvcc.
    Raises NotHere naming what this machine lacks, FetchError quoting what apt said."""
    found = nvcc()
    if found is not None and not force:
        say(f"{NAME} is already here: {home()}")
        return found
    _check_machine()
    root = home()
    root.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=root.parent) as tmp:
        work = Path(tmp)
        debs = _download(work, say)
        tree = work / "tree"
        for package in PACKAGES:
            say(f"unpacking {package.name} ({debs[package.name].stat().st_size >> 20} MiB)")
            _unpack(debs[package.name], package, tree)
        profile = tree / NVCC.rsplit("/", 1)[0] / "nvcc.profile"
        profile.unlink(missing_ok=True)  # Debian's is a link to /etc/nvcc.profile
        profile.write_text(_PROFILE)
        # CMake takes the toolkit root from nvcc's TOP and wants its nvvm/libdevice there
        # (Debian has it under /usr/lib/cuda; "Couldn't find CUDA library root" else)
        (tree / "usr" / "nvvm").mkdir()
        (tree / "usr" / "nvvm" / "libdevice").symlink_to("../lib/nvidia-cuda-toolkit/libdevice")
        _check(tree / NVCC)
        (tree / MANIFEST).write_text(json.dumps({
            "toolkit": NAME, "debian": CODENAME, "packages": {
                p.name: {"version": p.version, "sha256": _sha256(debs[p.name])}
                for p in PACKAGES}}, indent=2) + "\n")
        shutil.rmtree(root, ignore_errors=True)
        os.replace(tree, root)
    say(f"{NAME} fetched into {root}")
    return root / NVCC


def _check_machine() -> None:
    """FetchError unless this is Debian 12 with apt and dpkg-deb."""
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        raise NotHere(f"{NAME} comes from Debian 12's packages: this machine has no "
                         f"apt-get/dpkg-deb; give an sm_70 nvcc with --option nvcc_sm70=PATH")
    codename = _os_release().get("VERSION_CODENAME", "")
    if codename != CODENAME:
        raise NotHere(f"{NAME} is Debian 12's ({CODENAME}) package; this machine is "
                         f"{codename or 'not Debian'}: give an sm_70 nvcc (CUDA 10-12) "
                         f"with --option nvcc_sm70=PATH")


def _download(work: Path, say: Callable[[str], None]) -> dict[str, Path]:
    """The pinned .debs in `work`, through apt with a private source list (the machine's
    Debian 12 sources, non-free added) and private lists and caches."""
    state = work / "apt"
    for sub in ("lists/partial", "cache/archives/partial", "parts"):
        (state / sub).mkdir(parents=True)
    (state / "parts" / "debian.sources").write_text(_sources())
    opts = ["-o", "Dir::Etc::sourcelist=/dev/null", "-o", f"Dir::Etc::sourceparts={state / 'parts'}",
            "-o", f"Dir::State::Lists={state / 'lists'}", "-o", f"Dir::Cache={state / 'cache'}",
            "-q"]
    say("reading Debian 12's package lists (main contrib non-free)")
    _apt_get([*opts, "update"], work)
    pins = [f"{p.name}={p.version}" for p in PACKAGES]
    say(f"downloading {', '.join(pins)} (about 870 MB)")
    _apt_get([*opts, "download", *pins], work)
    debs = {}
    for p in PACKAGES:
        got = sorted(work.glob(f"{p.name}_*.deb"))
        if len(got) != 1:
            raise FetchError(f"apt-get download left {len(got)} {p.name} packages in {work}")
        debs[p.name] = got[0]
    return debs


def _apt_get(args: list[str], cwd: Path) -> None:
    done = subprocess.run(["apt-get", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=1800, check=False)
    if done.returncode != 0:
        said = [ln for ln in done.stderr.splitlines() if ln.startswith(("E:", "Err:"))]
        raise FetchError(f"apt-get {args[-1] if args[-1] == 'update' else 'download'} failed "
                         f"(exit {done.returncode}): "
                         f"{' | '.join(said[:2]) or done.stderr.strip()[-300:]}")


def _sources() -> str:
    """The machine's own Debian 12 `deb` sources (deb822 and one-line forms), with the
    components the toolkit needs: which mirror, suite and keyring stay the machine's."""
    stanzas = []
    for path in sorted(Path("/etc/apt/sources.list.d").glob("*.sources")):
        stanzas += _deb822(path.read_text())
    legacy = Path("/etc/apt/sources.list")
    if legacy.is_file():
        stanzas += _one_line(legacy.read_text())
    out = []
    for fields in stanzas:
        suites = [s for s in fields.get("Suites", "").split() if s == CODENAME]
        if "deb" not in fields.get("Types", "").split() or not suites:
            continue
        keep = {"Types": "deb", "URIs": fields["URIs"], "Suites": CODENAME,
                "Components": COMPONENTS}
        if "Signed-By" in fields:
            keep["Signed-By"] = fields["Signed-By"]
        out.append("".join(f"{k}: {v}\n" for k, v in keep.items()))
    if not out:
        raise NotHere(f"apt lists no Debian {CODENAME} source on this machine "
                         f"(/etc/apt/sources.list.d/*.sources, /etc/apt/sources.list)")
    return "\n".join(out)


def _deb822(text: str) -> list[dict[str, str]]:
    stanzas: list[dict[str, str]] = []
    current: dict[str, str] = {}
    for line in [*text.splitlines(), ""]:
        if not line.strip():
            if current:
                stanzas.append(current)
            current = {}
        elif not line.startswith(("#", " ", "\t")) and ":" in line:
            key, _, value = line.partition(":")
            current[key.strip()] = value.strip()
    return stanzas


_ONE_LINE = re.compile(r"^deb\s+(?:\[(?P<opts>[^\]]*)\]\s+)?(?P<uri>\S+)\s+(?P<suite>\S+)")


def _one_line(text: str) -> list[dict[str, str]]:
    out = []
    for line in text.splitlines():
        m = _ONE_LINE.match(line.strip())
        if m:
            fields = {"Types": "deb", "URIs": m["uri"], "Suites": m["suite"]}
            signed = re.search(r"signed-by=(\S+)", m["opts"] or "")
            if signed:
                fields["Signed-By"] = signed.group(1)
            out.append(fields)
    return out


def _unpack(deb: Path, package: Package, tree: Path) -> None:
    """The package's wanted members into `tree` (dpkg-deb streams the data archive, tar
    keeps what matches)."""
    tree.mkdir(exist_ok=True)
    data = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE)
    tar = subprocess.run(["tar", "-x", "-C", str(tree), "--wildcards", *package.members],
                         stdin=data.stdout, capture_output=True, text=True, check=False)
    assert data.stdout is not None
    data.stdout.close()
    if data.wait() != 0 or tar.returncode != 0:
        raise FetchError(f"unpacking {deb.name} failed: {tar.stderr.strip()[-300:]}")


def _check(path: Path) -> None:
    done = subprocess.run([str(path), "--version"], capture_output=True, text=True,
                          timeout=60, check=False)
    if "release 11.8" not in done.stdout:
        raise FetchError(f"the unpacked nvcc does not run as CUDA 11.8: "
                         f"{(done.stdout + done.stderr).strip()[-200:]}")


def _os_release() -> dict[str, str]:
    try:
        text = Path("/etc/os-release").read_text()
    except OSError:
        return {}
    return {k: v.strip('"') for k, _, v in (ln.partition("=") for ln in text.splitlines()) if k}


def _sha256(path: Path) -> str:
    with path.open("rb") as f:  # streamed: nvidia-cuda-dev's .deb is 774 MB
        return hashlib.file_digest(f, "sha256").hexdigest()
