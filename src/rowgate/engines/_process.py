"""Engine child processes: environment, start in their own process group, stop by PID."""

from __future__ import annotations

import getpass
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from rowgate import dirs
from rowgate.engines.interface import EngineError

VLLM_CACHE_ROOT = dirs.cache("vllm")
INDUCTOR_CACHE = dirs.cache("torchinductor")
INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
"""torch.compile's cache for rowgate's engines, in-process and subprocesses: in rowgate's
cache dir beside vLLM's, so `ROWGATE_CACHE_DIR` on a disk that outlives a runner's job
keeps the compiled graphs and max-autotune's choices for the next run, and two users
never share /tmp's."""
LOG_DIR = dirs.cache("engine-logs")


def compile_cache_dir() -> Path:
    """Where rowgate's engines compile to: a `TORCHINDUCTOR_CACHE_DIR` someone chose, else
    `INDUCTOR_CACHE`. torch's own default is no one's choice: importing torch._dynamo
    writes it into the environment."""
    given = os.environ.get(INDUCTOR_CACHE_ENV)
    return Path(given) if given and given != _torch_default_cache() else INDUCTOR_CACHE


def _torch_default_cache() -> str:
    # torch._inductor.runtime.cache_dir_utils.default_cache_dir, restated: importing it
    # imports torch (1.5-2 s), which a run whose engines are all subprocesses never pays.
    user = re.sub(r'[\\/:*?"<>|]', "_", getpass.getuser())
    return os.path.join(tempfile.gettempdir(), "torchinductor_" + user)


def use_compile_cache() -> Path:
    """Point torch.compile in this process at `compile_cache_dir()`, before an in-process
    engine is made (set, not defaulted: after torch._dynamo's import a default would
    keep torch's /tmp one)."""
    chosen = compile_cache_dir()
    os.environ[INDUCTOR_CACHE_ENV] = str(chosen)
    return chosen


def engine_env(device: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment of an engine subprocess: offline, caches in rowgate's cache dir, the device.

    Nothing may be downloaded: HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE make a
    missing local file an error instead of a fetch.
    """
    env = dict(os.environ)
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
                "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
                "VLLM_CACHE_ROOT": str(VLLM_CACHE_ROOT), "PYTHONUNBUFFERED": "1",
                INDUCTOR_CACHE_ENV: str(compile_cache_dir()),
                "TOKENIZERS_PARALLELISM": "false"})
    if device == "cpu":
        env["VLLM_TARGET_DEVICE"] = "cpu"
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; the tiny model needs little
        env["CUDA_VISIBLE_DEVICES"] = ""
    elif device.startswith("cuda"):
        env["CUDA_VISIBLE_DEVICES"] = device.partition(":")[2] or "0"
    env.update(extra or {})
    return env


def log_path(name: str) -> Path:
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    return LOG_DIR / f"{name}-{os.getpid()}-{time.monotonic_ns()}.log"


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return " | ".join(line.strip() for line in text[-lines:] if line.strip())


def spawn(argv: list[str], env: dict[str, str], log: Path, *,
          stdin: int | None = None, stdout: int | None = None,
          cwd: Path | None = None) -> subprocess.Popen[bytes]:
    """Start `argv` as the leader of a new process group, stderr to `log`, in `cwd`
    (a subject's checkout) or the engine-log dir."""
    try:
        with log.open("ab") as err:
            return subprocess.Popen(argv, env=env, stdin=stdin,
                                    stdout=stdout if stdout is not None else err, stderr=err,
                                    start_new_session=True, cwd=cwd or LOG_DIR)
    except OSError as exc:
        raise EngineError(f"cannot start {argv[0]}: {exc.strerror}") from exc


def stop_pid(proc: subprocess.Popen[bytes] | None, grace_s: float = 20.0) -> None:
    """Stop the process group led by `proc.pid`: SIGTERM, then SIGKILL. Never raises.

    The group takes the engine's own children (vLLM's EngineCore) with it.
    """
    if proc is None:
        return
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=wait_s)
            break
        except subprocess.TimeoutExpired:
            continue
    # Children that outlived their leader in the same group; wait until none
    # is alive (zombies are dead: whoever adopted them reaps them).
    deadline = time.monotonic() + 10.0
    while live_group_members(proc.pid) and time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            break
        time.sleep(0.1)


def live_group_members(pgid: int) -> list[int]:
    """PIDs in process group `pgid` that are not zombies (Linux /proc)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # Fields after the parenthesised command: state, ppid, pgrp, ...
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def free_port() -> int:
    """A free loopback TCP port (the server binds it right after; a race is reported)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]  # (host, port) of an AF_INET socket
        return port
