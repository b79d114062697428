"""Every seed row's own session on a machine without its hardware (this CPU machine):
`rowgate gate ROW --repo lab`, as `nox -s gate-thor`, `gate-megakernel` and
`gate-xqa-sm70` run it, on a clean snapshot of this tree, ends PENDING with reasons
(exit 3): what runs here passes, what needs the hardware says so, nothing FAILs or
ERRORs by construction. The demo's session (`nox -s gate-demo`) runs end to end and is
tested by tests/test_installed.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rowgate.cli.main import main
from tests.subjects import snapshot_of

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
SESSIONS = {"gate-thor": "PERF-THOR-DECODE-PARITY",
            "gate-megakernel": "KERNEL-CUDA-DECODE-MEGAKERNEL",
            "gate-xqa-sm70": "SM70-XQA-E5M2-DECODE"}


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> Path:
    return snapshot_of(ROOT, tmp_path_factory.mktemp("seed") / "rowgate") / "lab"


def test_the_sessions_are_the_noxfiles():
    import ast

    tree = ast.parse((ROOT / "noxfile.py").read_text())
    found = next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                 and getattr(n.targets[0], "id", "") == "ROW_SESSIONS")
    assert {k: v for k, v in found.items() if k != "gate-demo"} == SESSIONS


@pytest.mark.parametrize("session,row_id", SESSIONS.items(), ids=list(SESSIONS))
def test_a_seed_session_off_its_hardware_ends_pending(session, row_id, lab, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["-q", "gate", row_id, "--rows", str(ROOT / "rows"), "--repo", str(lab),
              "--out", str(tmp_path / "evidence"), "--json"])
    doc = json.loads(capsys.readouterr().out)
    statuses = {g["gate_id"]: (g["status"], g["reason"]) for g in doc["gates"]}
    assert not [g for g, (s, _) in statuses.items() if s in ("FAIL", "ERROR")], statuses
    assert exc.value.code == 3 and doc["status"] == "PENDING"
    assert all(reason for _, reason in statuses.values())
    assert statuses["host"][0] == "PASS" and statuses["build"][0] == "PASS"
    arches = {g["gate_id"]: g["arch"] for g in doc["gates"]}
    if row_id == "SM70-XQA-E5M2-DECODE":  # built for the V100 and for its H200 stand-in
        assert arches["build"] == arches["audit"] == "sm_70, sm_90"
