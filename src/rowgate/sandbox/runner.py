"""Run one subject step in bubblewrap: the profile, the limits, the result.

The profile is built from what the step declares (its argv, working directory, the
directories it may read and the ones it may write, whether it needs the GPU) on top of
one fixed base: system directories read-only, a fresh /proc, a minimal /dev, a private
/tmp with $HOME inside it, and every namespace of its own (`--unshare-all`: user, pid,
network with loopback only, IPC, UTS, cgroup). bwrap is the pid namespace's init
(`--die-with-parent`, a new session): when the step's process ends or is killed, every
process it started ends with it.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any

from rowgate.errors import Error, ExitCode
from rowgate.sandbox.env import allowed_env

BWRAP = "bwrap"
SYSTEM_RO = ("/usr", "/etc", "/opt")
"""System directories every step reads (toolchains under /usr/local and /opt included)."""
MERGED = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
"""Top-level directories that are symlinks into /usr on a merged-/usr system (Debian 12):
made the same links inside, or bound read-only where they are real directories."""
GPU_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
GPU_DIRS = ("/dev/nvidia-caps", "/dev/dri")
GIB = 1 << 30
KILLED = (signal.SIGHUP, signal.SIGINT, signal.SIGKILL, signal.SIGTERM)
"""Signals that end a step from outside (an interrupt, the OOM killer): reported as
subprocess does, a negative return code, not as the step's own failure."""


CONFINED: ContextVar[bool] = ContextVar("rowgate_sandbox_confined", default=True)
"""Whether subject steps run confined in the current gate: True unless the row turned
the sandbox off (with its reason); set around a gate's measure by `policy`. A context
variable, so the compile pool's threads carry it (they run in a copy of the context)."""


@contextmanager
def policy(confined: bool) -> Iterator[None]:
    token = CONFINED.set(confined)
    try:
        yield
    finally:
        CONFINED.reset(token)


class SandboxError(Error):
    """A subject step could not be run in the sandbox (not the step's own failure)."""


class SandboxUnavailable(SandboxError):
    """This host cannot confine subject steps: a configuration problem, said in one line."""

    exit_code = ExitCode.USAGE


@dataclass(frozen=True)
class Limits:
    """What a step may use; each limit it hits is named in its result."""

    wall_s: float = 1800.0
    memory_bytes: int | None = 32 * GIB
    """Address space (RLIMIT_AS); None for GPU steps, whose drivers map far more than
    they use."""
    processes: int | None = 4096
    """Processes and threads of the user (RLIMIT_NPROC). The kernel exempts root from it:
    run as root, a step's processes still all end with the step (its pid namespace),
    but their count is not capped."""
    file_bytes: int | None = 8 * GIB
    """The largest file a step may write (RLIMIT_FSIZE)."""


@dataclass(frozen=True)
class Step:
    """One subject step, as the caller declares it."""

    argv: Sequence[str]
    cwd: Path
    read_only: Sequence[Path] = ()
    """Directories (or files) the step reads: the subject, a toolchain outside /usr."""
    writable: Sequence[Path] = ()
    """Directories the step writes: its own scratch, never staging or the evidence."""
    env: Mapping[str, str] = field(default_factory=dict)
    path_dirs: Sequence[str] = ()
    """Prepended to PATH (a toolchain's bin)."""
    gpu: bool = False
    limits: Limits = Limits()


@dataclass(frozen=True)
class Result:
    returncode: int
    stdout: bytes
    stderr: bytes
    limit: str = ""
    """The limit the step hit (`wall time 1800 s`), or empty."""
    duration_s: float = 0.0


@cache
def _bwrap() -> tuple[str, str]:
    """(path, version) of bubblewrap; SandboxUnavailable naming the fix when missing or
    when this host gives no user namespaces."""
    path = shutil.which(BWRAP)
    if path is None:
        raise SandboxUnavailable("sandbox: bubblewrap (bwrap) is not installed; install it "
                                 "(Debian/Ubuntu: apt-get install bubblewrap), or turn the "
                                 "sandbox off in the row with a reason ([sandbox] mode = \"off\")")
    version = subprocess.run([path, "--version"], capture_output=True, text=True, check=False)
    probe = subprocess.run([path, "--unshare-all", "--ro-bind", "/", "/", "true"],
                           capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        why = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        raise SandboxUnavailable(f"sandbox: bwrap cannot create namespaces here ({why}); "
                                 f"enable user namespaces, or turn the sandbox off in the row "
                                 f"with a reason ([sandbox] mode = \"off\")")
    return path, version.stdout.strip().removeprefix("bubblewrap ")


def check_available() -> None:
    _bwrap()


def _import_path() -> list[Path]:
    """Where rowgate itself was imported from when that is no Python prefix's `lib` (an
    install into a target directory on `PYTHONPATH`): that one directory, read-only
    inside, so a step's Python imports what rowgate does. Never the rest of
    `PYTHONPATH`: a checkout on it would show the step everything below it."""
    site = Path(__file__).resolve().parents[2]
    prefixes = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    if any(site.is_relative_to(prefix / "lib") for prefix in prefixes):
        return []
    return [site]


def _python_dirs() -> list[Path]:
    """The interpreter and its site-packages (toolchain wheels, rowgate read-only): each
    prefix's `bin`, `lib*` and `pyvenv.cfg` only, never the whole prefix (a venv's
    directory may hold other things: nox keeps its sessions' temporary files there)."""
    found: set[Path] = {Path(sys.executable).resolve().parent, *_import_path()}
    for prefix in {Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}:
        found.update(p for name in ("bin", "lib", "lib64", "pyvenv.cfg")
                     if (p := prefix / name).exists() and not (prefix / name).is_symlink())
        if (prefix / "lib64").is_symlink():  # a venv's lib64 -> lib: the same link inside
            found.add(prefix / "lib")
    return sorted(found)


def _base_args() -> list[str]:
    args = ["--unshare-all", "--die-with-parent", "--new-session", "--proc", "/proc",
            "--dev", "/dev"]
    for top in MERGED:
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    for d in SYSTEM_RO:
        if os.path.isdir(d):
            args += ["--ro-bind", d, d]
    args += ["--tmpfs", "/tmp", "--dir", "/tmp/home"]  # before any bind that may be under /tmp
    for py in _python_dirs():
        if not any(str(py).startswith(s + "/") for s in SYSTEM_RO):
            args += ["--ro-bind", str(py), str(py)]
    return args


def _gpu_args() -> list[str]:
    nodes = [str(p) for p in sorted(Path("/dev").glob("nvidia[0-9]*"))]
    args: list[str] = []
    for node in (*nodes, *GPU_NODES, *GPU_DIRS):
        if os.path.exists(node):
            args += ["--dev-bind", node, node]
    return args


def _path(step: Step) -> tuple[str, ...]:
    """PATH inside: the step's own directories, then rowgate's PATH entries the sandbox
    shows (its venv's bin first, so `python` is the interpreter rowgate runs on)."""
    shown = [Path(p) for p in SYSTEM_RO] + _python_dirs()
    mine = [d for d in os.environ.get("PATH", "").split(os.pathsep)
            if d and any(Path(d).resolve().is_relative_to(s) for s in shown)]
    return (*step.path_dirs, str(Path(sys.executable).parent), *mine)


def argv_for(step: Step) -> list[str]:
    """The bwrap command line of `step` (binds after /tmp: a subject under /tmp stays
    visible, and nothing else there is)."""
    path, _ = _bwrap()
    args = [path, *_base_args()]
    if step.gpu:
        args += _gpu_args()
    bound = [Path(p) for p in (*step.read_only, *step.writable)]
    if not any(Path(step.cwd).is_relative_to(p) for p in bound):
        args += ["--ro-bind", str(step.cwd), str(step.cwd)]  # the step's own directory
    for p in step.read_only:
        args += ["--ro-bind", str(p), str(p)]
    for p in step.writable:
        args += ["--bind", str(p), str(p)]
    env = _step_env(step)
    args += ["--clearenv"]
    for key, value in sorted(env.items()):
        args += ["--setenv", key, value]
    return [*args, "--chdir", str(step.cwd), "--", *step.argv]


def _step_env(step: Step) -> dict[str, str]:
    """The allowlisted environment, and where rowgate was imported from when that is on
    `PYTHONPATH` (a step's Python imports what rowgate does, confined or not)."""
    env = allowed_env(step.env, _path(step))
    if _import_path():
        env.setdefault("PYTHONPATH", os.pathsep.join(str(p) for p in _import_path()))
    return env


def describe(gpu: bool = False) -> dict[str, Any]:
    """What a bundle records of the sandbox: the tool, its version and a digest of the
    base profile (every flag and system bind; a step's own binds are its arguments)."""
    _, version = _bwrap()
    base = [*_base_args(), *(_gpu_args() if gpu else [])]
    digest = hashlib.sha256(json.dumps(base).encode()).hexdigest()
    return {"tool": "bubblewrap", "version": version, "profile_sha256": digest,
            "namespaces": "user pid net(loopback) ipc uts cgroup", "environment": "allowlist"}


def _limiter(limits: Limits) -> Callable[[], None]:
    def apply() -> None:  # in the child, before exec: inherited by the whole sandbox
        for kind, value in ((resource.RLIMIT_AS, limits.memory_bytes),
                            (resource.RLIMIT_NPROC, limits.processes),
                            (resource.RLIMIT_FSIZE, limits.file_bytes)):
            if value is not None:
                resource.setrlimit(kind, (value, value))
    return apply


def spawn(step: Step, *, confined: bool | None = None, stdin: int | None = None,
          stdout: Any = subprocess.PIPE, stderr: Any = subprocess.PIPE) -> subprocess.Popen[bytes]:
    """Start `step` (a server a row's arm runs); the caller stops it with `stop`.
    `confined=False` (a row's `sandbox = "off"`, with its reason) runs it unconfined: the
    same environment allowlist and limits, no namespaces, rowgate's whole view."""
    if CONFINED.get() if confined is None else confined:
        return subprocess.Popen(argv_for(step), stdin=stdin, stdout=stdout, stderr=stderr,
                                start_new_session=True, preexec_fn=_limiter(step.limits))
    return subprocess.Popen(list(step.argv), cwd=step.cwd, stdin=stdin, stdout=stdout,
                            stderr=stderr, env=_step_env(step),
                            start_new_session=True, preexec_fn=_limiter(step.limits))


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Kill the step's whole session: bwrap is its pid namespace's init, so everything
    inside goes with it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _which_limit(step: Step, rc: int, err: bytes) -> str:
    limits = step.limits
    if rc == 128 + signal.SIGXFSZ and limits.file_bytes is not None:
        return f"file size {limits.file_bytes} bytes"
    text = err.decode(errors="replace")
    if "Cannot allocate memory" in text and limits.memory_bytes is not None:
        return f"memory {limits.memory_bytes} bytes"
    if "Resource temporarily unavailable" in text and limits.processes is not None:
        return f"processes {limits.processes}"
    return ""


def run(step: Step, *, stdin: bytes | None = None, confined: bool | None = None,
        merged: bool = False) -> Result:
    """Run `step` to its end (or its wall-time limit) and return what it printed
    (`merged`: stderr into stdout, in the order written). `confined` defaults to the
    current gate's policy (`policy`)."""
    confined = CONFINED.get() if confined is None else confined
    start = time.monotonic()
    try:
        proc = spawn(step, confined=confined,
                     stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                     stderr=subprocess.STDOUT if merged else subprocess.PIPE)
    except OSError as exc:  # E2BIG (arguments past ARG_MAX); unconfined: no such command
        rc = 127 if isinstance(exc, FileNotFoundError) else 126
        said = f"cannot run {step.argv[0][:120]}: {exc.strerror}\n".encode()
        return Result(rc, said if merged else b"", b"" if merged else said)
    try:
        out, err = proc.communicate(stdin, timeout=step.limits.wall_s)
    except subprocess.TimeoutExpired:
        stop(proc)
        out, err = proc.communicate()
        return Result(124, out, err or b"", f"wall time {step.limits.wall_s:g} s",
                      time.monotonic() - start)
    err = err or b""
    rc = proc.returncode
    said = err if not merged else out
    if confined and rc == 1 and said.startswith(b"bwrap: execvp "):  # no such command
        rc = 127
    if confined and rc - 128 in KILLED:  # bwrap reports its child's death as 128 + signal
        rc = -(rc - 128)
    return Result(rc, out, err, _which_limit(step, rc, said), time.monotonic() - start)


SOCKET_NAME = "server.sock"
SOCKET_PATH_MAX = 107
"""The longest Unix socket path Linux binds (`sun_path` is 108 bytes with its NUL)."""


def socket_dir() -> Path:
    """A fresh directory for a server's own Unix socket (`{socket}`), outside the subject,
    the evidence and staging; `serve` binds it writable and removes it with the server."""
    scratch = Path(tempfile.mkdtemp(prefix="rowgate-serve-"))
    if len(str(scratch / SOCKET_NAME)) > SOCKET_PATH_MAX:
        shutil.rmtree(scratch, ignore_errors=True)
        raise SandboxUnavailable(f"sandbox: the server socket path {scratch / SOCKET_NAME} is "
                                 f"longer than {SOCKET_PATH_MAX} bytes; set TMPDIR to a "
                                 f"shorter directory")
    return scratch


@dataclass
class Served:
    """A subject's server, the Unix socket rowgate's client reaches it on, and the
    forwarder that gives other clients the host's loopback port."""

    proc: subprocess.Popen[bytes]
    forwarder: Any
    """`bridge.Forwarder`, or None where the server listens on the host's loopback."""
    scratch: Path | None
    confined: bool = True

    @property
    def socket_path(self) -> Path | None:
        """The Unix socket that reaches the server (None: the host's loopback)."""
        return None if self.forwarder is None else Path(self.forwarder.path)

    def close(self) -> None:
        """Stop forwarding (the caller stops `proc`, whose pid namespace ends with it)."""
        if self.forwarder is not None:
            self.forwarder.close()
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)


def serve(step: Step, port: int, *, stdout: Any, stderr: Any, confined: bool | None = None,
          listening: Path | None = None) -> Served:
    """Start a server `step`, reachable from rowgate's process on one Unix socket and, for
    any other client, at the host's 127.0.0.1:`port`, and from nowhere else.

    `listening`: the socket the server listens on itself (a command's `{socket}`, in a
    directory from `socket_dir()`): that directory is bound writable and nothing is
    relayed. Otherwise the server listens on 127.0.0.1:`port` inside its own network
    namespace and `rowgate.sandbox.bridge` relays the socket to it (a confined server),
    or on the host's loopback (an unconfined one)."""
    from rowgate.sandbox.bridge import Forwarder

    confined = CONFINED.get() if confined is None else confined
    if listening is not None:
        own = replace(step, writable=[*step.writable, listening.parent])
        return _served(own, confined, listening, stdout, stderr,
                       lambda: Forwarder(port, listening))
    if not confined:
        proc = spawn(step, confined=False, stdout=stdout, stderr=stderr)
        return Served(proc, None, None, confined=False)
    sock = socket_dir() / SOCKET_NAME
    relayed = replace(step, argv=[sys.executable, "-m", "rowgate.sandbox.bridge", str(sock),
                                  str(port), "--", *step.argv],
                      writable=[*step.writable, sock.parent])
    return _served(relayed, True, sock, stdout, stderr, lambda: Forwarder(port, sock))


def _served(step: Step, confined: bool, sock: Path, stdout: Any, stderr: Any,
            forwarder: Callable[[], Any]) -> Served:
    """Spawn `step` and the host-side forwarder to `sock`; the socket's directory goes
    with the server (and at once if either cannot start)."""
    proc: subprocess.Popen[bytes] | None = None
    try:
        proc = spawn(step, confined=confined, stdout=stdout, stderr=stderr)
        return Served(proc, forwarder(), sock.parent, confined=confined)
    except BaseException:
        if proc is not None:
            stop(proc)
        shutil.rmtree(sock.parent, ignore_errors=True)
        raise
