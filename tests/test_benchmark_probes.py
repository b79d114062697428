"""benchmarks/probes/paged_read.cu, the deep candidate's read ceilings (docs/perf.md, runs
39-53): built as benchmarks/deep_ceiling.py builds it on the device, with the project's
nvcc, warnings as errors, both entry points present and neither spilling; the same flags
refuse a planted warning, so the check can fail."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from pipeline.build import resources, toolchains

pytestmark = pytest.mark.slow

PROBE = Path(__file__).resolve().parents[1] / "benchmarks" / "probes" / "paged_read.cu"
FLAGS = ["-cubin", "-arch=sm_90", "-O3", "-std=c++17", "-Werror", "all-warnings",
         "-Xptxas", "-warn-spills,-warn-lmem-usage"]


def _nvcc(src: Path, out: Path) -> subprocess.CompletedProcess[str]:
    tc = toolchains.for_arch("sm_90")
    return subprocess.run([tc.compiler.path, *FLAGS, "-o", str(out), str(src)],
                          capture_output=True, text=True, timeout=300)


def test_the_probes_build_clean_with_both_entry_points_and_no_spills(tmp_path: Path) -> None:
    out = tmp_path / "paged_read.cubin"
    built = _nvcc(PROBE, out)
    assert built.returncode == 0, built.stderr
    tc = toolchains.for_arch("sm_90")
    assert tc.cuobjdump is not None
    usage = subprocess.run([tc.cuobjdump.path, "--dump-resource-usage", str(out)],
                           capture_output=True, text=True, timeout=60, check=True).stdout
    funcs = resources.parse_resource_usage(usage)
    assert set(funcs) == {"paged_read", "paged_bulk_read"}
    assert all(f.get("LOCAL", 0) == 0 and f.get("STACK", 0) == 0 for f in funcs.values())


def test_a_planted_warning_fails_the_same_build(tmp_path: Path) -> None:
    src = tmp_path / "paged_read.cu"
    src.write_text(PROBE.read_text().replace(
        "  const int b = blockIdx.z;", "  const int b = blockIdx.z;\n  int unused = 1;", 1))
    built = _nvcc(src, tmp_path / "x.cubin")
    assert built.returncode != 0 and "unused" in built.stderr
