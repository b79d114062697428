"""Staging under concurrency, stale stages and other PID namespaces.

Real `rowgate gate` processes (python -m rowgate.cli.main) against one --out: runs killed with
SIGKILL leave stale stages; eight gates then start at once and sweep them; a gate started
in another PID namespace (standing in for a second host on shared storage, where PIDs say
nothing) must not sweep the stage of a gate that is still running.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rowgate.seal import staging
from tests.security._support import (
    cli,
    host_row,
    make_subject,
    own_key,
    proc_env,
    rowgate_argv,
    subject_state,
)

pytestmark = pytest.mark.slow
ROW = "TEST-STAGING"


def _hidden(out: Path) -> list[Path]:
    row_dir = out / ROW
    return sorted(p for p in row_dir.iterdir() if p.name.startswith(".")) if row_dir.is_dir() else []


def _bundles(out: Path) -> list[Path]:
    row_dir = out / ROW
    return sorted(p for p in row_dir.iterdir() if not p.name.startswith(".")) if row_dir.is_dir() else []


def _start(row: Path, subject: Path, out: Path) -> subprocess.Popen:
    return subprocess.Popen(rowgate_argv("-q", "gate", row, "--repo", subject, "--out", out),
                            env=proc_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)


def _wait_for_stage(out: Path, known: set[Path], timeout: float = 120) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        # a live run's stage (docs/security.md): not a sweeper's claim or a birth
        new = [p for p in _hidden(out) if p not in known and p.name.startswith(".staging-")]
        if new:
            return new[0]
        time.sleep(0.05)
    raise AssertionError("no staging directory appeared")


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.communicate(timeout=60)


def _stale_stages(tmp: Path, subject: Path, out: Path, n: int) -> list[Path]:
    """`n` real stages of killed runs (all started at once: a run sweeps the dead stages it
    finds, so they are killed together once each has its stage), each made heavy
    (thousands of files) so that sweeping one takes long enough to race."""
    script = tmp / "slow.py"
    script.write_text("import sys, time\nsys.stdout.write('x' * (4 << 20))\nsys.stdout.flush()\n"
                      "time.sleep(float(sys.argv[1]))\n")
    known = set(_hidden(out))
    procs = []
    for i in range(n):
        row = host_row(tmp / f"rows-slow-{i}", ROW, [sys.executable, str(script), "60"])
        procs.append(_start(row, subject, out))
    try:
        deadline = time.monotonic() + 180
        while len(set(_hidden(out)) - known) < n and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        for proc in procs:
            _kill(proc)
    stale = sorted(set(_hidden(out)) - known)
    assert len(stale) == n, stale
    for stage in stale:
        heavy = stage / "left-by-the-killed-run"
        heavy.mkdir(exist_ok=True)
        for j in range(1500):
            (heavy / f"f{j}").write_text("x")
    return stale


def test_a_stage_being_born_is_not_swept_before_it_is_locked(tmp_path, monkeypatch):
    """Before: a gate sweeping in the instant between another's creating its lock file
    and locking it took the lock and removed the stage being born (the other gate died
    on its rename: seen with eight gates on a loaded machine)."""
    lock = fcntl.flock
    swept: list[bool] = []

    def another_gate_sweeps_first(fd: int, op: int) -> None:
        if not swept:
            swept.append(True)
            staging.sweep(tmp_path)
        lock(fd, op)

    monkeypatch.setattr(staging.fcntl, "flock", another_gate_sweeps_first)
    holder = staging.Holder(tmp_path)
    assert swept
    holder.check()
    holder.close()
    assert list(tmp_path.iterdir()) == []


def test_eight_concurrent_gates_over_stale_stages(tmp_path):
    subject = make_subject(tmp_path / "subject")
    before = subject_state(subject)
    out = tmp_path / "evidence"
    stale = _stale_stages(tmp_path, subject, out, 4)
    row = host_row(tmp_path / "rows", ROW, [sys.executable, "-c", "import time; time.sleep(0.3)"])
    procs = [_start(row, subject, out) for _ in range(8)]
    try:
        results = [(p.wait(timeout=600), *p.communicate(timeout=60)) for p in procs]
    finally:
        for p in procs:
            _kill(p)
    for code, stdout, stderr in results:
        assert b"Traceback" not in stderr, stderr.decode()
        assert code == 0, (code, stdout.decode(), stderr.decode())
    printed = {Path(stdout.decode().strip().splitlines()[-1]) for _, stdout, _ in results}
    assert len(printed) == 8 and printed <= set(_bundles(out))
    for bundle in printed:
        assert subprocess.run(rowgate_argv("verify", bundle, *own_key()), env=proc_env(),
                              capture_output=True, timeout=120).returncode == 0
    assert not [p for p in stale if os.path.lexists(p)], "stale stages were not swept"
    assert _hidden(out) == [], "staging left behind"
    assert subject_state(subject) == before


def _unshare_works() -> bool:
    try:
        return subprocess.run(["unshare", "--pid", "--fork", "true"], capture_output=True,
                              timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def test_a_gate_in_another_pid_namespace_does_not_sweep_a_running_stage(tmp_path, capsys):
    """Before: the second gate saw the first's PID as dead (another namespace) and swept
    the running gate's staging directory away."""
    if not _unshare_works():
        pytest.skip("unshare --pid --fork is not permitted here")
    subject = make_subject(tmp_path / "subject")
    out = tmp_path / "evidence"
    # the command runs sandboxed, where only the subject is visible: its flag goes in
    # the subject's .git (seen read-only inside, never part of the committed tree)
    flag = subject / ".git" / "go"
    wait = (f"import os, time\nfor _ in range(1200):\n    if os.path.exists({str(flag)!r}): break\n"
            f"    time.sleep(0.05)\nelse:\n    raise SystemExit('no go flag in 60 s')\n")
    outer_row = host_row(tmp_path / "rows-outer", ROW, [sys.executable, "-c", wait])
    inner_row = host_row(tmp_path / "rows-inner", ROW, [sys.executable, "-c", "print('inner')"])
    outer = _start(outer_row, subject, out)
    try:
        _inner_then_outer(outer, out, subject, inner_row, flag, capsys)
    finally:
        _kill(outer)


def _inner_then_outer(outer, out, subject, inner_row, flag, capsys) -> None:
    stage = _wait_for_stage(out, set())
    inner = subprocess.run(["unshare", "--pid", "--fork",
                            *rowgate_argv("-q", "gate", inner_row, "--repo", subject, "--out", out)],
                           env=proc_env(), capture_output=True, timeout=300)
    assert inner.returncode == 0, inner.stderr.decode()
    assert stage.exists(), "the other namespace's gate swept a running gate's stage"
    flag.write_text("go\n")
    code = outer.wait(timeout=300)
    stdout, stderr = outer.communicate(timeout=60)
    assert b"Traceback" not in stderr, stderr.decode()
    assert code == 0, stderr.decode()
    bundle = Path(stdout.decode().strip().splitlines()[-1])
    assert cli(capsys, "verify", bundle, *own_key()).code == 0
    assert len(_bundles(out)) == 2 and _hidden(out) == []


def test_a_stage_left_by_a_killed_gate_is_swept_by_the_next(tmp_path):
    """The owner is gone (its lock released by the kernel): the next run removes it, and
    only it — a live run's stage in the same row directory stays."""
    subject = make_subject(tmp_path / "subject")
    out = tmp_path / "evidence"
    # the command runs sandboxed, where only the subject is visible: its flag goes in
    # the subject's .git (seen read-only inside, never part of the committed tree)
    flag = subject / ".git" / "go"
    wait = (f"import os, time\nfor _ in range(1200):\n    if os.path.exists({str(flag)!r}): break\n"
            f"    time.sleep(0.05)\nelse:\n    raise SystemExit('no go flag in 60 s')\n")
    live_row = host_row(tmp_path / "rows-live", ROW, [sys.executable, "-c", wait])
    dead = _stale_stages(tmp_path, subject, out, 1)[0]
    live = _start(live_row, subject, out)
    try:
        _quick_beside_live(live, out, subject, tmp_path, dead, flag)
    finally:
        _kill(live)


def _quick_beside_live(live, out, subject, tmp_path, dead, flag) -> None:
    live_stage = _wait_for_stage(out, {dead})
    quick = host_row(tmp_path / "rows-quick", ROW, [sys.executable, "-c", "print('quick')"])
    run = subprocess.run(rowgate_argv("-q", "gate", quick, "--repo", subject, "--out", out),
                         env=proc_env(), capture_output=True, timeout=300)
    assert run.returncode == 0, run.stderr.decode()
    assert not os.path.lexists(dead), "the dead run's stage is still there"
    assert live_stage.exists(), "the live run's stage was swept"
    flag.write_text("go\n")
    code = live.wait(timeout=300)
    _, stderr = live.communicate(timeout=60)
    assert code == 0, stderr.decode()
    assert _hidden(out) == []
