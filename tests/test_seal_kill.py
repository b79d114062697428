"""A process killed at any moment while sealing leaves no bundle or a whole one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rowgate.errors import VerificationError
from rowgate.seal import signing
from rowgate.seal.bundle import Bundle, Stage

SEALER = textwrap.dedent('''
    import os, sys
    from pathlib import Path
    from rowgate.run import provenance
    from rowgate.rows import row as rows
    from rowgate.seal import signing
    from rowgate.seal.bundle import Stage
    from rowgate.records.gate_result import GateResult

    repo, row_path, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    loaded = rows.load_row(row_path)
    stage = Stage(out, loaded.row.id)
    d = stage.artifact_dir("host")
    d.mkdir(parents=True)
    for i in range(24):  # enough bytes that hashing and signing take a while
        (d / f"blob-{i}.bin").write_bytes(os.urandom(2 << 20))
    stage.add_result(GateResult(gate_id="host", kind="host", status="PASS", reason="staged",
                                artifacts=[f"artifacts/host/blob-{i}.bin" for i in range(24)]))
    print("staged", flush=True)
    stage.seal(row=loaded, row_file=str(row_path), subject=provenance.subject(repo),
               provenance=provenance.collect(), signer=signing.default_signer(), order=["host"])
    print("sealed", flush=True)
''')


def _start(git_repo, host_row, out: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", SEALER, git_repo.working_dir, str(host_row), str(out)],
                            stdout=subprocess.PIPE, text=True, env=os.environ.copy())


def _state(row_dir: Path, verifier) -> tuple[int, int]:
    """(whole bundles, staging dirs); fails on anything partial that looks like a bundle."""
    whole = staging = 0
    for entry in row_dir.iterdir():
        if entry.name.startswith("."):
            staging += 1
            continue
        Bundle.open(entry).verify(verifier)  # raises on a partial bundle
        whole += 1
    return whole, staging


@pytest.mark.slow
def test_kill_mid_seal_leaves_no_partial_bundle(tmp_path, git_repo, host_row):
    signer = signing.default_signer(announce=lambda m: None)  # create the key before racing
    out = tmp_path / "evidence"
    row_dir = out / "TEST-HOST"
    # one undisturbed run: how long does sealing take after staging?
    proc = _start(git_repo, host_row, out)
    assert proc.stdout.readline().strip() == "staged"
    t0 = time.monotonic()
    assert proc.stdout.readline().strip() == "sealed"
    seal_s = time.monotonic() - t0
    proc.wait()
    proc.stdout.close()
    assert _state(row_dir, signer.verifier()) == (1, 0)

    killed_mid_seal = 0
    for i in range(12):
        proc = _start(git_repo, host_row, out)
        assert proc.stdout.readline().strip() == "staged"
        time.sleep(seal_s * i / 12)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
        whole, staging = _state(row_dir, signer.verifier())
        killed_mid_seal += staging
        # the next stage sweeps what the dead process left
        Stage(out, "TEST-HOST").discard()
        assert not list(row_dir.glob(".*"))
    assert killed_mid_seal >= 6, "the kills should mostly land during sealing"


def test_stage_discard_leaves_nothing(tmp_path):
    stage = Stage(tmp_path, "ROW")
    (stage.artifact_dir("g")).mkdir(parents=True)
    (stage.artifact_dir("g") / "x").write_text("x")
    stage.discard()
    assert list((tmp_path / "ROW").iterdir()) == []


def test_open_refuses_non_bundle(tmp_path):
    (tmp_path / "ROW" / "abc").mkdir(parents=True)
    with pytest.raises(VerificationError, match="manifest.json: missing"):
        Bundle.open(tmp_path / "ROW" / "abc")
