"""The persistent kernel builds clean for sm_90 (warnings as errors) and passes the audit:
budgets, no spills, no local memory, the counter barriers present in the SASS -- the
default build and the tensor-core GEMV build (RG_MK_MMA=1 RG_MK_STREAM=1,
`persistent_decode_mma`, whose SASS must hold HMMA and LDSM). A real nvcc build through the
build gate's toolchain, on a copy of kernels/."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from rowgate.cli.progress import PlainProgress
from rowgate.gates import audit, build
from rowgate.records.status import Status

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
KERNELS = ("persistent_decode", "persistent_decode_mma")


@pytest.fixture(scope="module")
def audited(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("persistent-repo")
    shutil.copytree(REPO / "kernels", root / "kernels")
    out = tmp_path_factory.mktemp("audit")
    audit.measure_audit(root, ["sm_90"], list(KERNELS), {}, out,
                        PlainProgress(quiet=True))
    return out


def test_builds_clean_for_sm90(audited):
    d = build.derive_builds(audited)
    assert d.status is Status.PASS, d.reason


def test_audit_holds_budgets_and_sass_rules(audited):
    d = audit.derive_audit(audited)
    assert d.status is Status.PASS, d.reason
    cells = {k: v for k, v in d.cells.items() if k.split("/")[0] in KERNELS}
    assert set(cells) == {f"{k}/persistent_decode_{s}@sm_90" for k in KERNELS
                          for s in ("static", "dynamic")}
    for c in cells.values():
        assert c["spill_stores"] == 0 and c["spill_loads"] == 0 and c["local"] == 0
        assert c["stack_frame"] == 0
