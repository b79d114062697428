"""`spill_warnings`: by default ptxas fails the build on any function's local memory;
with `spill_warnings = "audit"` a translation unit that compiles more than the table
declares builds, and the audit still judges every declared entry point (no local memory
unless its budget allows). Real compiles for sm_90."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from rowgate.cli.progress import PlainProgress
from rowgate.gates import audit, build
from rowgate.records.status import Status

pytestmark = pytest.mark.slow
QUIET = PlainProgress(quiet=True)

SOURCE = r"""
// `indexed` indexes an array by values it loads: local memory (a 1 KB stack frame).
extern "C" __global__ void indexed(float* out, const int* idx) {
  float a[256];
#pragma unroll 1
  for (int k = 0; k < 256; ++k) a[k] = out[k];
  float s = 0.0f;
#pragma unroll 1
  for (int k = 0; k < 256; ++k) s += a[idx[k] & 255];
  out[0] = s;
}
extern "C" __global__ void scale(float* out) { out[threadIdx.x] *= 2.0f; }
"""

def _subject(root: Path, entry_points: str, spill_warnings: str | None) -> Path:
    (root / "kernels").mkdir(parents=True)
    (root / "kernels" / "k.cu").write_text(SOURCE)
    policy = f'spill_warnings = "{spill_warnings}"' if spill_warnings else ""
    (root / "kernels" / "kernels.toml").write_text(textwrap.dedent(f'''
        version = 1
        [kernels.k]
        source = "k.cu"
        entry_points = {entry_points}
        arches = ["sm_90"]
        {policy}
    '''))
    return root


def _gates(tmp: Path, entry_points: str, spill_warnings: str | None):
    repo = _subject(tmp / "subject", entry_points, spill_warnings)
    audit.measure_audit(repo, ["sm_90"], [], {}, tmp / "out", QUIET)
    return build.derive_builds(tmp / "out"), audit.derive_audit(tmp / "out")


def test_by_default_any_functions_local_memory_fails_the_build(tmp_path):
    built, _ = _gates(tmp_path, '["scale"]', None)
    assert built.status is Status.FAIL
    assert "Local memory used for function 'indexed'" in built.reason


def test_audit_judges_only_the_declared_entry_points(tmp_path):
    built, audited = _gates(tmp_path, '["scale"]', "audit")
    assert built.status is Status.PASS, built.reason
    assert audited.status is Status.PASS, audited.reason
    assert set(audited.cells) == {"k/scale@sm_90"}
    record = next((tmp_path / "out").glob("sm_90/k/build.json")).read_text()
    assert "-warn-spills" not in record and "-warn-lmem-usage" not in record


def test_audit_still_fails_a_declared_entry_point_with_local_memory(tmp_path):
    built, audited = _gates(tmp_path, '["scale", "indexed"]', "audit")
    assert built.status is Status.PASS, built.reason
    assert audited.status is Status.FAIL
    assert "indexed" in audited.reason and audited.cells["k/indexed@sm_90"]["stack_frame"] == 1024
